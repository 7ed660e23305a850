//! WebDAV `OC-Checksum` values, as ownCloud and Nextcloud servers and
//! clients exchange them: `<ALGORITHM>:<hex digest>` with the algorithm
//! `SHA1`, `MD5` or `ADLER32`. A client sends one in the `OC-Checksum`
//! request header of an upload; a server answers one on download.
//!
//! Parsing is lenient where real clients differ and strict elsewhere:
//! the algorithm name and the hex digits are case-insensitive, and an
//! `ADLER32` digest may have fewer than 8 hex digits (the ownCloud
//! desktop client writes the number without leading zeros, while servers
//! write 8 digits). Values are compared as digests, never as strings, and
//! are always written back upper-case name, lower-case hex, 8 digits for
//! `ADLER32`.

use std::fmt;
use std::str::FromStr;

use md5::Md5;
use sha1::{Digest, Sha1};

/// An `OC-Checksum` algorithm.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum OcAlgorithm {
    /// `SHA1`: 20 bytes.
    Sha1,
    /// `MD5`: 16 bytes.
    Md5,
    /// `ADLER32`: 4 bytes, big-endian as written in hex.
    Adler32,
}

impl OcAlgorithm {
    /// The name as written in `OC-Checksum` values.
    pub fn name(self) -> &'static str {
        match self {
            Self::Sha1 => "SHA1",
            Self::Md5 => "MD5",
            Self::Adler32 => "ADLER32",
        }
    }

    fn digest_len(self) -> usize {
        match self {
            Self::Sha1 => 20,
            Self::Md5 => 16,
            Self::Adler32 => 4,
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Sha1, Self::Md5, Self::Adler32].into_iter().find(|algorithm| algorithm.name().eq_ignore_ascii_case(name))
    }
}

impl fmt::Display for OcAlgorithm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Why an `OC-Checksum` value could not be read. The EPS treats such a
/// value as absent for its comparison (§6.7: provider hashes are
/// diagnostics) and forwards the header untouched.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OcChecksumError {
    /// The value has no `:` between algorithm and digest.
    #[error("OC-Checksum value {value:?} is not of the form ALGORITHM:hexdigest (for example SHA1:<40 hex digits>)")]
    MissingSeparator {
        /// The value as received.
        value: String,
    },
    /// The algorithm is not one of `SHA1`, `MD5`, `ADLER32`.
    #[error("OC-Checksum algorithm {algorithm:?} is not supported; supported are SHA1, MD5 and ADLER32")]
    UnsupportedAlgorithm {
        /// The algorithm name as received.
        algorithm: String,
    },
    /// The digest is not hex, or has the wrong length for its algorithm.
    #[error("OC-Checksum {algorithm} digest {digest:?} is not {expected}")]
    BadDigest {
        /// The algorithm the value names.
        algorithm: OcAlgorithm,
        /// The digest as received.
        digest: String,
        /// What a valid digest looks like.
        expected: &'static str,
    },
}

/// One `OC-Checksum` value: an algorithm and its digest.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct OcChecksum {
    algorithm: OcAlgorithm,
    digest: Vec<u8>,
}

impl OcChecksum {
    /// Parses a header value such as `SHA1:a9993e36...`; surrounding
    /// whitespace is ignored.
    pub fn parse(value: &str) -> Result<Self, OcChecksumError> {
        let value = value.trim();
        let (name, digest_hex) = value.split_once(':').ok_or_else(|| OcChecksumError::MissingSeparator { value: value.to_owned() })?;
        let algorithm =
            OcAlgorithm::from_name(name.trim()).ok_or_else(|| OcChecksumError::UnsupportedAlgorithm { algorithm: name.to_owned() })?;
        let digest_hex = digest_hex.trim();
        let bad = |expected| OcChecksumError::BadDigest { algorithm, digest: digest_hex.to_owned(), expected };
        let digest = match algorithm {
            OcAlgorithm::Adler32 => {
                if digest_hex.is_empty() || digest_hex.len() > 8 {
                    return Err(bad("1 to 8 hex digits"));
                }
                u32::from_str_radix(digest_hex, 16).map_err(|_| bad("1 to 8 hex digits"))?.to_be_bytes().to_vec()
            }
            OcAlgorithm::Sha1 | OcAlgorithm::Md5 => {
                let expected = if algorithm == OcAlgorithm::Sha1 { "40 hex digits" } else { "32 hex digits" };
                let bytes = hex::decode(digest_hex).map_err(|_| bad(expected))?;
                if bytes.len() != algorithm.digest_len() {
                    return Err(bad(expected));
                }
                bytes
            }
        };
        Ok(Self { algorithm, digest })
    }

    /// The value of `algorithm` over `data`.
    pub fn compute(algorithm: OcAlgorithm, data: &[u8]) -> Self {
        let mut hasher = OcHasher::new(algorithm);
        hasher.update(data);
        hasher.finalize()
    }

    /// The algorithm this value names.
    pub fn algorithm(&self) -> OcAlgorithm {
        self.algorithm
    }

    /// The digest bytes (big-endian for `ADLER32`).
    pub fn digest(&self) -> &[u8] {
        &self.digest
    }

    /// Whether `body` has this checksum, computed with the algorithm
    /// the value names.
    pub fn matches(&self, body: &[u8]) -> bool {
        Self::compute(self.algorithm, body) == *self
    }
}

impl FromStr for OcChecksum {
    type Err = OcChecksumError;

    fn from_str(value: &str) -> Result<Self, Self::Err> {
        Self::parse(value)
    }
}

impl fmt::Display for OcChecksum {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.algorithm, hex::encode(&self.digest))
    }
}

/// Streaming computation of one `OC-Checksum` algorithm.
#[derive(Debug, Clone)]
pub struct OcHasher(State);

#[derive(Clone)]
enum State {
    Sha1(Sha1),
    Md5(Md5),
    Adler32(adler32::RollingAdler32),
}

impl fmt::Debug for State {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let name = match self {
            Self::Sha1(_) => "Sha1",
            Self::Md5(_) => "Md5",
            Self::Adler32(_) => "Adler32",
        };
        f.write_str(name)
    }
}

impl OcHasher {
    /// A hasher for `algorithm` that has seen no bytes.
    pub fn new(algorithm: OcAlgorithm) -> Self {
        Self(match algorithm {
            OcAlgorithm::Sha1 => State::Sha1(Sha1::new()),
            OcAlgorithm::Md5 => State::Md5(Md5::new()),
            OcAlgorithm::Adler32 => State::Adler32(adler32::RollingAdler32::new()),
        })
    }

    /// Feeds the next bytes of the body.
    pub fn update(&mut self, data: &[u8]) {
        match &mut self.0 {
            State::Sha1(hasher) => hasher.update(data),
            State::Md5(hasher) => hasher.update(data),
            State::Adler32(hasher) => hasher.update_buffer(data),
        }
    }

    /// The checksum of everything fed.
    pub fn finalize(self) -> OcChecksum {
        let (algorithm, digest) = match self.0 {
            State::Sha1(hasher) => (OcAlgorithm::Sha1, hasher.finalize().to_vec()),
            State::Md5(hasher) => (OcAlgorithm::Md5, hasher.finalize().to_vec()),
            State::Adler32(hasher) => (OcAlgorithm::Adler32, hasher.hash().to_be_bytes().to_vec()),
        };
        OcChecksum { algorithm, digest }
    }
}
