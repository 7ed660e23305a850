//! Errors of the last-synced store. Each names the file or folder it
//! concerns and what the operator can do; none carries document keys,
//! outcome records or file contents, so they are safe to log (protocol
//! spec §8). Any error leaves the store in its previous state: a write
//! either completed (rename done) or left only a temporary, which the
//! next open removes.

use std::io;
use std::path::PathBuf;

/// What the store was doing when an I/O call failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action {
    /// Creating a folder of the store layout.
    CreatingFolder,
    /// Listing a folder (at open, in `check`).
    Listing,
    /// Writing a temporary file.
    Writing,
    /// `fsync` of a file or folder.
    Syncing,
    /// Renaming a temporary into place.
    Renaming,
    /// Reading a blob or pointer.
    Reading,
    /// Deleting a file.
    Removing,
    /// Locking the store folder.
    Locking,
}

impl std::fmt::Display for Action {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::CreatingFolder => "creating folder",
            Self::Listing => "listing",
            Self::Writing => "writing",
            Self::Syncing => "syncing",
            Self::Renaming => "renaming into",
            Self::Reading => "reading",
            Self::Removing => "removing",
            Self::Locking => "locking",
        })
    }
}

/// An error of the last-synced store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// An I/O call on a file or folder of the store failed.
    #[error(
        "store I/O failed while {action} {path}: {source}; the store kept its previous state. \
         Check free space and permissions of the state folder (it must be a local, writable filesystem)"
    )]
    Io {
        /// What the store was doing.
        action: Action,
        /// The file or folder concerned.
        path: PathBuf,
        /// The operating system's error.
        #[source]
        source: io::Error,
    },
    /// Another process (or another `Store` in this process) has the folder open.
    #[error(
        "the store folder {path} is already in use by another EPS process or Store instance; \
         run exactly one EPS per state folder, or stop the other one first"
    )]
    Locked {
        /// The lock file.
        path: PathBuf,
    },
    /// A pointer names a blob that the store does not hold (any more).
    #[error(
        "blob {sha256_hex} ({size} bytes) is not in the store (never written, evicted or found corrupt); \
         put the file again before pointing a document at it"
    )]
    BlobMissing {
        /// Hex SHA-256 of the blob.
        sha256_hex: String,
        /// Its size in bytes.
        size: u64,
    },
}

impl StoreError {
    pub(crate) fn io(action: Action, path: impl Into<PathBuf>) -> impl FnOnce(io::Error) -> Self {
        let path = path.into();
        move |source| Self::Io { action, path, source }
    }
}

/// Result alias of this crate.
pub type Result<T, E = StoreError> = std::result::Result<T, E>;
