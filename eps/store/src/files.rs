//! The on-disk layout and the one way the store writes a file.
//!
//! ```text
//! <state folder>/
//!   LOCK                  flock(2)ed while a Store has the folder open
//!   tmp/                  temporaries; emptied at every open
//!   blobs/ab/<sha256 hex> file versions, named by their content's SHA-256
//!   docs/cd/<sha256 hex>  document pointers, named by the SHA-256 of the key
//! ```
//!
//! Every file is written the same way: a new temporary in `tmp/` (same
//! filesystem, so the rename is atomic), write, `fsync`, rename over the
//! final name, `fsync` the final folder. A crash before the rename
//! leaves only a temporary; after it, the complete new file. A fail
//! point sits between each step so the crash tests can stop there.
//!
//! Pointer files are a small binary record closed by its own SHA-256, so
//! that a damaged pointer is recognised and dropped rather than trusted:
//!
//! | Field | Size | Meaning |
//! |---|---|---|
//! | magic | 8 | `ECSPTR01` |
//! | key digest | 32 | SHA-256 of the document key; equals the file name |
//! | sha256 | 32 | The last-synced version |
//! | size | u64 LE | Its size |
//! | has outcome | u8 | 0 or 1 |
//! | outcome length | u64 LE | 0 when absent |
//! | outcome | n | The caller's opaque outcome record |
//! | check | 32 | SHA-256 of all the above |
//!
//! The pointer's last-used time is the file's modification time, so a
//! read touches only metadata instead of rewriting the record.

use std::fs::{self, File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use sha2::{Digest, Sha256};

use crate::error::{Action, Result, StoreError};

pub(crate) const LOCK_FILE: &str = "LOCK";
pub(crate) const TMP_DIR: &str = "tmp";
pub(crate) const BLOBS_DIR: &str = "blobs";
pub(crate) const DOCS_DIR: &str = "docs";

/// Fail point names of one kind of write, in write order (read only
/// when the `failpoints` feature compiles the fail points in).
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub(crate) struct WriteFailPoints {
    pub after_temp_write: &'static str,
    pub after_temp_fsync: &'static str,
    pub after_rename: &'static str,
    pub before_dir_fsync: &'static str,
}

pub(crate) const BLOB_WRITE: WriteFailPoints = WriteFailPoints {
    after_temp_write: "store::blob_after_temp_write",
    after_temp_fsync: "store::blob_after_temp_fsync",
    after_rename: "store::blob_after_rename",
    before_dir_fsync: "store::blob_before_dir_fsync",
};

pub(crate) const POINTER_WRITE: WriteFailPoints = WriteFailPoints {
    after_temp_write: "store::pointer_after_temp_write",
    after_temp_fsync: "store::pointer_after_temp_fsync",
    after_rename: "store::pointer_after_rename",
    before_dir_fsync: "store::pointer_before_dir_fsync",
};

/// Paths of one store folder.
#[derive(Debug, Clone)]
pub(crate) struct Layout {
    pub root: PathBuf,
}

impl Layout {
    pub fn tmp_dir(&self) -> PathBuf {
        self.root.join(TMP_DIR)
    }

    pub fn blobs_dir(&self) -> PathBuf {
        self.root.join(BLOBS_DIR)
    }

    pub fn docs_dir(&self) -> PathBuf {
        self.root.join(DOCS_DIR)
    }

    pub fn blob_path(&self, sha256: &[u8; 32]) -> PathBuf {
        sharded(&self.blobs_dir(), sha256)
    }

    pub fn pointer_path(&self, key_digest: &[u8; 32]) -> PathBuf {
        sharded(&self.docs_dir(), key_digest)
    }

    /// Creates the folders, all 256 shards of each kind included, so that
    /// no write ever has to create (and sync) a folder on its way.
    pub fn create(&self) -> Result<()> {
        for dir in [self.root.clone(), self.tmp_dir(), self.blobs_dir(), self.docs_dir()] {
            create_dir(&dir)?;
        }
        for parent in [self.blobs_dir(), self.docs_dir()] {
            for shard in 0..=255u8 {
                create_dir(&parent.join(hex::encode([shard])))?;
            }
            sync_dir(&parent)?;
        }
        sync_dir(&self.root)
    }
}

fn sharded(parent: &Path, digest: &[u8; 32]) -> PathBuf {
    let name = hex::encode(digest);
    parent.join(&name[..2]).join(name)
}

fn create_dir(dir: &Path) -> Result<()> {
    match fs::create_dir(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(StoreError::io(Action::CreatingFolder, dir)(e)),
    }
}

/// Parses a shard-folder file name back into its digest.
pub(crate) fn parse_name(shard: &str, name: &str) -> Option<[u8; 32]> {
    if name.len() != 64 || !name.starts_with(shard) || name.bytes().any(|b| b.is_ascii_uppercase()) {
        return None;
    }
    let mut digest = [0u8; 32];
    hex::decode_to_slice(name, &mut digest).ok()?;
    Some(digest)
}

pub(crate) fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir).and_then(|handle| handle.sync_all()).map_err(StoreError::io(Action::Syncing, dir))
}

/// Deletes the temporary if the write did not reach its rename (an
/// error or an unwinding panic); a real crash leaves it for the next
/// open to remove.
struct TempGuard(Option<PathBuf>);

impl Drop for TempGuard {
    fn drop(&mut self) {
        if let Some(path) = self.0.take() {
            let _ = fs::remove_file(path);
        }
    }
}

fn temp_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{}-{}-{}.tmp", std::process::id(), nanos, COUNTER.fetch_add(1, Ordering::Relaxed))
}

/// A written and synced temporary, not yet in place.
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub(crate) struct StagedFile {
    guard: TempGuard,
    points: &'static WriteFailPoints,
}

/// Writes `parts` to a new temporary and syncs it (steps 1 and 2).
pub(crate) fn stage(layout: &Layout, parts: &[&[u8]], points: &'static WriteFailPoints) -> Result<StagedFile> {
    let path = layout.tmp_dir().join(temp_name());
    let mut file = OpenOptions::new().write(true).create_new(true).open(&path).map_err(StoreError::io(Action::Writing, &path))?;
    let guard = TempGuard(Some(path.clone()));
    for part in parts {
        file.write_all(part).map_err(StoreError::io(Action::Writing, &path))?;
    }
    fail::fail_point!(points.after_temp_write);
    file.sync_all().map_err(StoreError::io(Action::Syncing, &path))?;
    fail::fail_point!(points.after_temp_fsync);
    Ok(StagedFile { guard, points })
}

impl StagedFile {
    /// Renames the temporary over `target` (step 3). The caller holds the
    /// index lock, updates the index to match, and then syncs the folder
    /// with [`Renamed::sync_folder`].
    pub fn commit(mut self, target: &Path) -> Result<Renamed> {
        let temp = self.guard.0.take().expect("staged file has its temporary");
        if let Err(e) = fs::rename(&temp, target) {
            let _ = fs::remove_file(&temp);
            return Err(StoreError::io(Action::Renaming, target)(e));
        }
        fail::fail_point!(self.points.after_rename);
        Ok(Renamed { folder: target.parent().expect("store files live in a shard folder").to_owned(), points: self.points })
    }
}

/// A file renamed into place whose folder is not yet synced.
#[must_use = "the folder must be synced for the rename to be durable"]
#[cfg_attr(not(feature = "failpoints"), allow(dead_code))]
pub(crate) struct Renamed {
    folder: PathBuf,
    points: &'static WriteFailPoints,
}

impl Renamed {
    /// Syncs the folder (step 4). An error here means the new file is in
    /// place (the index already says so) but may not survive a power loss.
    pub fn sync_folder(self) -> Result<()> {
        fail::fail_point!(self.points.before_dir_fsync);
        sync_dir(&self.folder)
    }
}

const POINTER_MAGIC: &[u8; 8] = b"ECSPTR01";
const POINTER_FIXED: usize = 8 + 32 + 32 + 8 + 1 + 8;
/// The largest outcome record a pointer keeps: the EPS's records hold at most
/// a response head (`max_head`, 64 KiB) and body (`max_response_body`,
/// 16 MiB) and a few dozen bytes more. A larger record is not persisted.
pub const MAX_OUTCOME_BYTES: usize = 17 << 20;
/// The largest pointer file: anything larger is damaged, and is not read.
pub(crate) const MAX_POINTER_FILE: u64 = (POINTER_FIXED + MAX_OUTCOME_BYTES + 32) as u64;

/// A decoded pointer record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PointerRecord {
    pub key_digest: [u8; 32],
    pub sha256: [u8; 32],
    pub size: u64,
    pub outcome: Option<Vec<u8>>,
}

impl PointerRecord {
    /// The record's bytes without the trailing check, and the check.
    pub fn encode(key_digest: &[u8; 32], sha256: &[u8; 32], size: u64, outcome: Option<&[u8]>) -> (Vec<u8>, [u8; 32]) {
        let outcome_bytes = outcome.unwrap_or_default();
        let mut head = Vec::with_capacity(POINTER_FIXED);
        head.extend_from_slice(POINTER_MAGIC);
        head.extend_from_slice(key_digest);
        head.extend_from_slice(sha256);
        head.extend_from_slice(&size.to_le_bytes());
        head.push(u8::from(outcome.is_some()));
        head.extend_from_slice(&(outcome_bytes.len() as u64).to_le_bytes());
        let mut check = Sha256::new();
        check.update(&head);
        check.update(outcome_bytes);
        (head, check.finalize().into())
    }

    pub fn encoded_len(outcome: Option<&[u8]>) -> u64 {
        (POINTER_FIXED + outcome.map_or(0, <[u8]>::len) + 32) as u64
    }

    /// Decodes a pointer file; `None` for anything but an intact record.
    pub fn decode(bytes: &[u8]) -> Option<Self> {
        if bytes.len() < POINTER_FIXED + 32 {
            return None;
        }
        let (body, check) = bytes.split_at(bytes.len() - 32);
        if Sha256::digest(body).as_slice() != check || &body[..8] != POINTER_MAGIC {
            return None;
        }
        let key_digest: [u8; 32] = body[8..40].try_into().ok()?;
        let sha256: [u8; 32] = body[40..72].try_into().ok()?;
        let size = u64::from_le_bytes(body[72..80].try_into().ok()?);
        let has_outcome = body[80];
        let outcome_len = u64::from_le_bytes(body[81..89].try_into().ok()?);
        let outcome = &body[POINTER_FIXED..];
        if has_outcome > 1 || outcome.len() as u64 != outcome_len || (has_outcome == 0 && outcome_len != 0) {
            return None;
        }
        Some(Self { key_digest, sha256, size, outcome: (has_outcome == 1).then(|| outcome.to_vec()) })
    }
}
