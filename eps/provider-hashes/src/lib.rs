//! The content hashes cloud providers publish for a file, computed the
//! way each provider documents them, so the EPS can compare its own
//! value with the ones it sees in the app's request and the provider's
//! response (protocol spec §6.7). They are diagnostics only: the SHA-256
//! check of §5.3 is the one gate before anything is forwarded.
//!
//! | Provider | Value | Here |
//! |---|---|---|
//! | Dropbox | `content_hash`: SHA-256 over the SHA-256 of each 4 MiB block, hex | [`DropboxContentHasher`], [`dropbox_content_hash`] |
//! | Microsoft Graph / OneDrive | `quickXorHash`: 160-bit QuickXorHash, base64 | [`QuickXorHasher`], [`quick_xor_hash`] |
//! | Google Drive | `md5Checksum`: MD5, hex | [`Md5Hasher`], [`md5_hex`] |
//! | WebDAV (ownCloud / Nextcloud) | `OC-Checksum`: `SHA1:`, `MD5:` or `ADLER32:` + hex | [`OcChecksum`], [`OcHasher`] |
//!
//! Every hash has a streaming form (`new`, `update`, `finalize`) whose
//! result does not depend on how the input is split, and a one-shot
//! function. Test vectors come from rclone's `dbhash` and `quickxorhash`
//! tests, including the Dropbox 4 MiB block boundaries.
//!
//! ```
//! use ec_provider_hashes::{dropbox_content_hash, quick_xor_hash, md5_hex, OcChecksum};
//!
//! assert_eq!(
//!     dropbox_content_hash(b""),
//!     "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
//! );
//! assert_eq!(quick_xor_hash(b""), "AAAAAAAAAAAAAAAAAAAAAAAAAAA=");
//! assert_eq!(md5_hex(b""), "d41d8cd98f00b204e9800998ecf8427e");
//! let value: OcChecksum = "SHA1:a9993e364706816aba3e25717850c26c9cd0d89d".parse().unwrap();
//! assert!(value.matches(b"abc"));
//! ```

#![deny(missing_docs)]

mod dropbox;
mod md5;
mod oc_checksum;
mod quickxor;

pub use dropbox::{dropbox_content_hash, DropboxContentHasher, DROPBOX_BLOCK_SIZE};
pub use md5::{md5_hex, Md5Hasher};
pub use oc_checksum::{OcAlgorithm, OcChecksum, OcChecksumError, OcHasher};
pub use quickxor::{quick_xor_hash, QuickXorHasher};
