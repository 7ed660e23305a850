//! # ec-patch: byte-exact edit patches for office documents
//!
//! Office files (.docx .xlsx .pptx .odt .ods .odp and their variants) are ZIP
//! archives of XML parts, so a one-character edit rewrites most of the
//! compressed file. This crate describes the new version of a file in terms
//! of the last-synced version so that the receiver rebuilds **exactly the
//! same bytes** (same SHA-256) from a patch of a few hundred bytes:
//!
//! - unchanged members and headers are copied by reference;
//! - a changed part is sent as an ec-diff delta of its uncompressed content
//!   (trim shared front and back, zstd-code the middle against the base's),
//!   plus a recipe that recreates its exact compressed bytes (stored; zlib
//!   parameters; in format version 2, the level of a known deflater other
//!   than zlib, [`deflaters`]; preflate-rs corrections; raw bytes as a last
//!   resort);
//! - ZIP headers go through a normalised header stream in which derivable
//!   fields cost nothing;
//! - files that are not ZIPs get a generic binary delta.
//!
//! The wire format is specified in `docs/spec/edit-patch-v1.md` and, for what
//! version 2 adds, `docs/spec/edit-patch-v2.md`.
//!
//! ```
//! use ec_patch::{diff, apply_to_vec, encode, DiffOptions, Limits};
//! let base = b"not a zip, any bytes at all".to_vec();
//! let new = b"not a zip, any bytes at all!".to_vec();
//! let patch = encode(&diff(&base, &new, &DiffOptions::default()).unwrap());
//! assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
//! ```

#![deny(missing_debug_implementations)]

mod apply;
pub mod deflate;
pub mod deflaters;
pub mod delta;
mod diff;
mod error;
mod format;
pub mod goflate;
pub mod guids;
mod headers;
pub mod infozip;
mod inspect;
mod limits;
pub mod png;
pub mod renumber;
pub mod rows;
pub mod sevenzip;
mod wire;
pub mod zip;
#[doc(hidden)]
pub mod zport;

pub use apply::{apply, apply_decoded, apply_to_vec, apply_with, expand_runs, verify, ApplyOptions, ApplyStats};
pub use deflate::ZlibParams;
pub use diff::{diff, learn, DiffOptions};
pub use error::{PatchError, Result};
pub use format::{
    decode, encode, encode_plain, min_version, section_len, BaseHash, Body, ContentMode, Member, Patch, Recipe, RunEntry, Segment, ZipBody,
    FLAG_BASE_HASH_PREFIX, FLAG_FRESH_TIMES, FLAG_GUIDS_APART, FLAG_LEARNT_AMOUNTS, FLAG_MEMBERS_RENUMBERED, FLAG_SEGMENTS_COMPRESSED,
    MAGIC, VERSION, VERSIONS,
};
pub use inspect::{inspect, Summary};
pub use limits::Limits;

/// Bytes of document content this process keeps so that its next diff or
/// apply against the same document need not inflate it again: the contents
/// spot-check diffs saw last (at most 64 MiB)
/// and the contents `apply` made last (at most 32 MiB, [`deflate::remember_made`]).
pub fn kept_bytes() -> usize {
    diff::kept_content_bytes() + deflate::kept_content_bytes()
}

/// Lets go of every content [`kept_bytes`] counts, and returns how many bytes
/// that was: for a long-running process that goes idle. What it knows about
/// the members' block layouts stays, so later patches still copy unchanged
/// blocks; they only inflate the members again.
pub fn forget_kept() -> usize {
    diff::forget_contents() + deflate::forget_kept_contents()
}

/// Makes the encoded patch from `base` to `new` and checks that it applies
/// back to exactly `new` before returning it.
///
/// With [`DiffOptions::spot_check`], a patch whose claim the check refutes
/// (`target_mismatch`) is made again with every block checked.
pub fn diff_verified(base: &[u8], new: &[u8], opts: &DiffOptions) -> Result<Vec<u8>> {
    let (patch, checked) = diff::diff_checked(base, new, opts)?;
    let bytes = encode(&patch);
    match apply::verify_checked(base, &bytes, new, &opts.limits, &checked) {
        Err(PatchError::TargetMismatch { .. }) if opts.spot_check => {
            let strict = DiffOptions { spot_check: false, ..opts.clone() };
            diff_verified(base, new, &strict)
        }
        Err(e) => Err(e),
        Ok(_) => Ok(bytes),
    }
}
