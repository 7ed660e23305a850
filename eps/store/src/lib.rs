//! The EPS's per-user last-synced store (the CAS of protocol spec §1.1
//! and §5.5): file versions kept by content, and one pointer per
//! document naming its last-synced version.
//!
//! - **Content-addressed blobs.** A version is stored once under its
//!   SHA-256, found by (SHA-256, size) across the whole store (bases are
//!   looked up by hash, not by document: spec §5.2), and verified on
//!   every read; a blob whose content no longer matches its name is
//!   deleted and reported missing, so the device is asked for the full
//!   file instead of getting a wrong rebuild.
//! - **Document pointers** are keyed by the SHA-256 of the caller's
//!   opaque document key, which is never used as a file name, never
//!   stored, and never logged. A pointer holds the version's hash and
//!   size and, optionally, the caller's outcome record (spec §5.4).
//! - **Atomic.** Every file is written to a temporary, synced, renamed
//!   and its folder synced; a crash at any point leaves the old or the
//!   new state. Opening the store recovers: it removes temporaries and
//!   drops pointers whose blob is missing. Fail points (`fail` crate,
//!   feature `failpoints`) sit between the steps; [`FAIL_POINTS`] lists
//!   them, and `tests/crash.rs` crashes a child process at each one.
//! - **Bounded.** Past [`StoreConfig::max_total_bytes`] the store drops
//!   unreferenced blobs, then least-recently-used documents (a read or a
//!   set is a use); past [`MAX_DOCUMENTS`] pointers, least-recently-used
//!   documents; past [`MAX_BLOBS`] blobs, the least recently used blobs no
//!   pointer names. A start loads no more than that many pointers and
//!   blobs (the pointers first, then the blobs as their folders are read).
//!   A blob pinned by an in-flight save ([`BlobPin`]) is
//!   never deleted, nor is a blob while a pointer names it.
//!
//! The store is synchronous `std::fs` code behind one mutex; share a
//! [`Store`] (it is `Clone`, `Send + Sync`) and call it from
//! `spawn_blocking`.
//!
//! ```
//! use ec_store::{Store, StoreConfig};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
//! let key = b"\x01 account \x00 /Documents/report.docx";
//! let pin = store.put_blob(b"version 1").unwrap();
//! store.set_document(key, &pin, Some(b"outcome record")).unwrap();
//! drop(pin);
//!
//! let pointer = store.document(key).unwrap().unwrap();
//! let base = store.get_blob(&pointer.sha256, pointer.size).unwrap().unwrap();
//! assert_eq!(base.data, b"version 1");
//! assert!(store.check().unwrap().is_consistent());
//! ```

#![deny(missing_docs)]

mod check;
mod error;
mod files;
mod store;

pub use check::{CheckReport, Problem};
pub use error::{Action, Result, StoreError};
pub use files::MAX_OUTCOME_BYTES;
pub use store::{document_key_digest, Blob, BlobPin, DocumentPointer, Store, StoreConfig, StoreStats, MAX_BLOBS, MAX_DOCUMENTS};

/// Every fail point of the store, in the order a save reaches them
/// (blob write, then pointer write, then eviction). Configure them with
/// `FAILPOINTS=<name>=panic` (or a `fail::cfg_callback`) in a build with
/// the `failpoints` feature.
pub const FAIL_POINTS: &[&str] = &[
    "store::blob_after_temp_write",
    "store::blob_after_temp_fsync",
    "store::blob_after_rename",
    "store::blob_before_dir_fsync",
    "store::between_blob_and_pointer",
    "store::pointer_after_temp_write",
    "store::pointer_after_temp_fsync",
    "store::pointer_after_rename",
    "store::pointer_before_dir_fsync",
    "store::evict_after_pointer_removed",
];
