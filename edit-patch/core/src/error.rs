//! Errors of the edit-patch core.
//!
//! One enum for the whole crate: every failure a caller can see, each with a
//! message that says what was wrong, where, and (where there is one) what to
//! do about it. [`PatchError::code`] gives a stable machine-readable name that
//! the Python binding and the test vectors use.

use thiserror::Error;

/// Everything that can go wrong while making, reading or applying a patch.
#[derive(Debug, Error)]
pub enum PatchError {
    /// The bytes do not start with the edit-patch magic.
    #[error("not an EdgeCourier edit patch (bad magic bytes {found:02x?}; expected 89 45 43 50)")]
    BadMagic {
        /// The first bytes found.
        found: Vec<u8>,
    },
    /// A format version this decoder does not know.
    #[error("edit-patch format version {0} is not supported (this build reads versions 1 and 2); upgrade ecsync")]
    UnsupportedVersion(u8),
    /// The patch ended before a field was complete.
    #[error("patch is truncated: it ends inside {what} at byte {offset}")]
    Truncated {
        /// The field being read.
        what: &'static str,
        /// Where in the patch.
        offset: usize,
    },
    /// A field holds a value the format does not allow.
    #[error("patch is malformed: {what} at byte {offset}: {detail}")]
    Malformed {
        /// The field or structure.
        what: &'static str,
        /// Where in the patch (or 0 when not tied to a place).
        offset: usize,
        /// What exactly is wrong.
        detail: String,
    },
    /// A size or count exceeds a configured limit (zip bombs, absurd sizes).
    #[error("{what} is {value} bytes, over the limit of {limit}; refusing (raise the limit only for trusted input)")]
    LimitExceeded {
        /// What was measured.
        what: &'static str,
        /// The value found or declared.
        value: u64,
        /// The limit in force.
        limit: u64,
    },
    /// A ZIP member inflates past the limits: a zip bomb, or a part larger than allowed.
    #[error("member {member:?} of {file} inflates to more than {limit} bytes (zip bomb or oversized part); refusing")]
    ZipBomb {
        /// The member's name as stored.
        member: String,
        /// Which file ("the base file", "the new file").
        file: &'static str,
        /// The bound in force.
        limit: u64,
    },
    /// The base handed to apply is not the one the patch was made against.
    #[error("wrong base: the patch was made against {expected_size} bytes with SHA-256 {expected}, but the base given is {actual_size} bytes with SHA-256 {actual}")]
    WrongBase {
        /// Hex SHA-256 the patch names (its first 16 bytes where the patch names a prefix).
        expected: String,
        /// Size the patch names.
        expected_size: u64,
        /// Hex SHA-256 of the base given.
        actual: String,
        /// Size of the base given.
        actual_size: u64,
    },
    /// The rebuilt file is not the file the patch promised; nothing is returned.
    #[error("rebuilt file does not match the patch: expected {expected_size} bytes with SHA-256 {expected}, got {actual_size} bytes with SHA-256 {actual}; the output was discarded")]
    TargetMismatch {
        /// Hex SHA-256 the patch promised.
        expected: String,
        /// Size the patch promised.
        expected_size: u64,
        /// Hex SHA-256 of what was built.
        actual: String,
        /// Size of what was built.
        actual_size: u64,
    },
    /// A deflate or zstd stream could not be decoded or encoded.
    #[error("{what}: {detail}")]
    Codec {
        /// Which stream.
        what: &'static str,
        /// The codec's own message.
        detail: String,
    },
    /// Reading or writing a file failed.
    #[error("{path}: {source}")]
    Io {
        /// The file concerned.
        path: String,
        /// The operating system's error.
        #[source]
        source: std::io::Error,
    },
}

impl PatchError {
    /// A stable, machine-readable name for the kind of error.
    pub fn code(&self) -> &'static str {
        match self {
            PatchError::BadMagic { .. } => "bad_magic",
            PatchError::UnsupportedVersion(_) => "unsupported_version",
            PatchError::Truncated { .. } => "truncated",
            PatchError::Malformed { .. } => "malformed",
            PatchError::LimitExceeded { .. } => "limit_exceeded",
            PatchError::ZipBomb { .. } => "zip_bomb",
            PatchError::WrongBase { .. } => "wrong_base",
            PatchError::TargetMismatch { .. } => "target_mismatch",
            PatchError::Codec { .. } => "codec",
            PatchError::Io { .. } => "io",
        }
    }

    pub(crate) fn malformed(what: &'static str, offset: usize, detail: impl Into<String>) -> Self {
        PatchError::Malformed { what, offset, detail: detail.into() }
    }

    pub(crate) fn codec(what: &'static str, detail: impl std::fmt::Display) -> Self {
        PatchError::Codec { what, detail: detail.to_string() }
    }
}

/// Result type of this crate.
pub type Result<T, E = PatchError> = std::result::Result<T, E>;
