//! The report of [`crate::Store::check`]: what a full read of the store
//! folder found that breaks the store's invariants. An empty problem
//! list is the "never torn" property the crash tests assert.

use std::path::PathBuf;

/// One broken invariant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Problem {
    /// A blob's content does not hash to its name.
    CorruptBlob {
        /// The blob file.
        path: PathBuf,
    },
    /// A pointer file that is not an intact record for its name.
    DamagedPointer {
        /// The pointer file.
        path: PathBuf,
    },
    /// A pointer names a blob the folder does not hold with that size.
    PointerToMissingBlob {
        /// The pointer file.
        path: PathBuf,
        /// The blob it names.
        sha256_hex: String,
    },
    /// A file that should not be there: a leftover temporary or a
    /// malformed name.
    StrayFile {
        /// The file.
        path: PathBuf,
    },
    /// The in-memory index and the folder disagree about this file
    /// (or, for the store root, about the number of files).
    IndexDisagrees {
        /// The file concerned.
        path: PathBuf,
    },
    /// The index's byte count differs from the sum of file sizes.
    TotalBytesDisagree {
        /// What the index counts.
        index: u64,
        /// What the folder holds.
        on_disk: u64,
    },
}

/// What [`crate::Store::check`] read and found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Blob files read and hashed.
    pub blobs_checked: u64,
    /// Pointer files decoded.
    pub documents_checked: u64,
    /// Bytes of blob and pointer files.
    pub bytes_on_disk: u64,
    /// Broken invariants; empty for a consistent store.
    pub problems: Vec<Problem>,
}

impl CheckReport {
    /// Whether the store is consistent.
    pub fn is_consistent(&self) -> bool {
        self.problems.is_empty()
    }
}
