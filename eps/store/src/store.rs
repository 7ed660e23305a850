//! The store itself: an in-memory index over the folder of
//! [`crate::files`], guarded by one mutex, and the rules that keep the
//! two in step.
//!
//! Invariants, checked by [`Store::check`]:
//! - every blob file's content hashes to its name and has the size the
//!   index holds;
//! - every pointer names a blob that is present (eviction removes the
//!   pointer, syncs, and only then the blob; startup drops pointers whose
//!   blob is gone);
//! - `total_bytes` is the sum of blob sizes and pointer file sizes;
//! - there are at most [`MAX_DOCUMENTS`] pointers, and at most
//!   [`MAX_BLOBS`] blobs but for those pinned by saves in flight.
//!
//! Writes stage their temporary outside the lock and take the lock only
//! to rename, so one large save does not stall the others. Reads pin the
//! blob under the lock and read and verify it outside. Eviction walks
//! documents in least-recently-used order (O(n) per victim, fine for the
//! thousands of documents one user has).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use sha2::{Digest, Sha256};

use crate::check::{CheckReport, Problem};
use crate::error::{Action, Result, StoreError};
use crate::files::{self, Layout, PointerRecord, BLOB_WRITE, POINTER_WRITE};

/// The most document pointers a store holds: far more documents than one
/// user syncs, and what a start loads (about 3 MiB of index). Past it the
/// least recently used document is evicted, as past the byte bound; a
/// start that finds more pointer files in the folder (written by an EPS of
/// before this bound, or put there by anyone) keeps the most recently used
/// and removes the rest ([`Store::pointers_over_bound_at_open`]). Before, a
/// start indexed every pointer file it found, bounded only by
/// `max_total_bytes` (a pointer file is 121 bytes: 8.9 million pointers in
/// 1 GiB).
pub const MAX_DOCUMENTS: usize = 1 << 16;
/// The most blobs (file versions) a store holds: every version a pointer
/// names (at most [`MAX_DOCUMENTS`]) and as many older or unreferenced
/// ones again (a base another device may still patch against). Past it the
/// least recently used blob no pointer names and no save pins is deleted,
/// at run time and at start; a start that finds more blob files keeps those
/// the pointers name and the most recently used of the others
/// ([`Store::blobs_over_bound_at_open`]). Before, a start indexed every blob
/// file it found, bounded only by `max_total_bytes`, to which an empty file
/// adds nothing: a million zero-byte files were a million index entries.
pub const MAX_BLOBS: usize = 2 * MAX_DOCUMENTS;

/// Store configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    /// Upper bound of blob bytes plus pointer file bytes. The store
    /// evicts least-recently-used documents to stay under it; it can
    /// exceed it only while pinned blobs alone are larger.
    pub max_total_bytes: u64,
}

impl Default for StoreConfig {
    fn default() -> Self {
        Self { max_total_bytes: 1 << 30 }
    }
}

/// Counters and sizes, for `/metrics`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StoreStats {
    /// Blob bytes plus pointer file bytes.
    pub total_bytes: u64,
    /// The configured bound.
    pub max_total_bytes: u64,
    /// Document pointers.
    pub documents: u64,
    /// Blobs (file versions), referenced or not.
    pub blobs: u64,
    /// Blobs currently pinned by in-flight operations.
    pub pinned_blobs: u64,
    /// Documents evicted to stay under the bound since open.
    pub evictions: u64,
    /// Unreferenced blobs deleted since open.
    pub blobs_collected: u64,
    /// Blobs found corrupt on read and deleted since open.
    pub corrupt_blobs: u64,
}

/// A document's last-synced version, as [`Store::document`] returns it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DocumentPointer {
    /// SHA-256 of the last-synced version.
    pub sha256: [u8; 32],
    /// Its size.
    pub size: u64,
    /// The outcome record persisted with it, if the caller gave one.
    pub outcome: Option<Vec<u8>>,
    /// When the document was last read or set (this read included).
    pub last_used: SystemTime,
}

/// A verified file version read from the store, pinned while held.
#[derive(Debug)]
pub struct Blob {
    /// Keeps the blob from eviction while the caller uses it.
    pub pin: BlobPin,
    /// The file's bytes; their SHA-256 and size were checked.
    pub data: Vec<u8>,
}

#[derive(Debug)]
struct BlobEntry {
    size: u64,
    /// Pointers naming this blob.
    refs: u64,
    pins: u64,
    /// Distinguishes this entry from a later one with the same hash, so
    /// a pin taken before a corrupt blob was dropped cannot unpin its
    /// re-written successor.
    generation: u64,
    last_used: SystemTime,
}

#[derive(Debug)]
struct DocEntry {
    sha256: [u8; 32],
    size: u64,
    file_bytes: u64,
    last_used: SystemTime,
}

#[derive(Debug, Default)]
struct Index {
    blobs: HashMap<[u8; 32], BlobEntry>,
    docs: HashMap<[u8; 32], DocEntry>,
    total_bytes: u64,
    evictions: u64,
    blobs_collected: u64,
    corrupt_blobs: u64,
    next_generation: u64,
    last_time: Option<SystemTime>,
    /// Pointer files a start removed past [`MAX_DOCUMENTS`].
    pointers_over_bound_at_open: u64,
    /// Blob files a start removed past [`MAX_BLOBS`].
    blobs_over_bound_at_open: u64,
}

impl Index {
    /// A use time strictly after every earlier one, so that LRU order
    /// is total even when the clock does not advance between calls.
    fn now(&mut self) -> SystemTime {
        let mut now = SystemTime::now();
        if let Some(last) = self.last_time {
            if now <= last {
                now = last + Duration::from_micros(1);
            }
        }
        self.last_time = Some(now);
        now
    }

    fn observe_time(&mut self, time: SystemTime) {
        if self.last_time.is_none_or(|last| time > last) {
            self.last_time = Some(time);
        }
    }
}

#[derive(Debug)]
struct Shared {
    layout: Layout,
    config: StoreConfig,
    index: Mutex<Index>,
    /// Held open for its flock; released when the last handle drops.
    _lock: fs::File,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, Index> {
        // A panic while holding the lock happens only between an
        // on-disk step and its index update; the index stays usable
        // and `check` reports any drift, so poisoning is ignored.
        self.index.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

/// The per-user last-synced store. Cheap to share: `Send + Sync`, all
/// methods take `&self`; methods do blocking file I/O, so call them from
/// `spawn_blocking` in async code.
#[derive(Debug, Clone)]
pub struct Store {
    shared: Arc<Shared>,
}

/// Keeps one blob from eviction and garbage collection while held (a
/// base or target in use by a running save). Cloning adds a pin;
/// dropping removes one. A blob whose last pin drops and that no
/// document names is collected by the next write that needs room.
#[derive(Debug)]
pub struct BlobPin {
    shared: Arc<Shared>,
    sha256: [u8; 32],
    size: u64,
    generation: u64,
}

impl BlobPin {
    /// SHA-256 of the pinned blob.
    pub fn sha256(&self) -> &[u8; 32] {
        &self.sha256
    }

    /// Size of the pinned blob.
    pub fn size(&self) -> u64 {
        self.size
    }
}

impl Clone for BlobPin {
    fn clone(&self) -> Self {
        let mut index = self.shared.lock();
        if let Some(entry) = index.blobs.get_mut(&self.sha256) {
            if entry.generation == self.generation {
                entry.pins += 1;
            }
        }
        Self { shared: self.shared.clone(), sha256: self.sha256, size: self.size, generation: self.generation }
    }
}

impl Drop for BlobPin {
    fn drop(&mut self) {
        let mut index = self.shared.lock();
        if let Some(entry) = index.blobs.get_mut(&self.sha256) {
            if entry.generation == self.generation {
                entry.pins = entry.pins.saturating_sub(1);
            }
        }
    }
}

/// SHA-256 of a document key: the pointer's name. Keys are opaque bytes
/// and never become file names themselves (protocol spec §4.4.1).
pub fn document_key_digest(key: &[u8]) -> [u8; 32] {
    Sha256::digest(key).into()
}

fn io_err(action: Action, path: &Path) -> impl FnOnce(std::io::Error) -> StoreError {
    StoreError::io(action, path.to_path_buf())
}

impl Store {
    /// Opens (creating if needed) the store in `root` and recovers it:
    /// removes temporaries, indexes blobs and pointers, drops pointers
    /// that are damaged or whose blob is missing, and evicts down to the
    /// bound. Fails with [`StoreError::Locked`] if the folder is open
    /// elsewhere.
    pub fn open(root: impl Into<PathBuf>, config: StoreConfig) -> Result<Self> {
        let layout = Layout { root: root.into() };
        layout.create()?;
        let lock = lock_folder(&layout.root.join(files::LOCK_FILE))?;
        let shared = Arc::new(Shared { layout, config, index: Mutex::new(Index::default()), _lock: lock });
        let store = Self { shared };
        store.recover()?;
        Ok(store)
    }

    /// The state folder.
    pub fn root(&self) -> &Path {
        &self.shared.layout.root
    }

    /// The configuration the store was opened with.
    pub fn config(&self) -> &StoreConfig {
        &self.shared.config
    }

    fn recover(&self) -> Result<()> {
        let layout = &self.shared.layout;
        let tmp = layout.tmp_dir();
        for entry in read_dir(&tmp)? {
            let path = entry.path();
            remove_path(&path)?;
        }
        files::sync_dir(&tmp)?;

        let mut index = self.shared.lock();
        // The pointers first: the most recently used MAX_DOCUMENTS (by the
        // use time each file's mtime holds), found without holding more
        // than that many in memory, then read.
        let mut dropped_pointer = false;
        let mut newest: BinaryHeap<Reverse<(SystemTime, [u8; 32])>> = BinaryHeap::new();
        for_each_sharded(&layout.docs_dir(), |digest, path| {
            // Not following a link: anything but a regular file is damaged.
            let modified = fs::symlink_metadata(&path).ok().filter(|m| m.is_file()).map(|m| m.modified().unwrap_or(SystemTime::UNIX_EPOCH));
            let (Some(digest), Some(modified)) = (digest, modified) else {
                dropped_pointer = true;
                return remove_path(&path);
            };
            newest.push(Reverse((modified, digest)));
            if newest.len() > MAX_DOCUMENTS {
                let Reverse((_, oldest)) = newest.pop().expect("over the bound");
                index.pointers_over_bound_at_open += 1;
                dropped_pointer = true;
                remove_path(&layout.pointer_path(&oldest))?;
            }
            Ok(())
        })?;
        let mut pointers: Vec<(PointerRecord, u64, SystemTime)> = Vec::with_capacity(newest.len());
        for Reverse((_, digest)) in newest.into_vec() {
            let path = layout.pointer_path(&digest);
            let Some(record) = read_pointer(&path)?.filter(|record| record.key_digest == digest) else {
                remove_path(&path)?;
                dropped_pointer = true;
                continue;
            };
            let meta = fs::metadata(&path).map_err(io_err(Action::Reading, &path))?;
            pointers.push((record, meta.len(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH)));
        }
        // Then the blobs, as the folders are read: those a pointer names are
        // indexed, of the others the most recently used up to MAX_BLOBS in
        // all are kept (never more than that many held), the rest removed.
        // An empty file is a blob only under the SHA-256 of nothing, and
        // only a regular file is one: the rest is damage.
        let named: HashMap<[u8; 32], u64> = pointers.iter().map(|(record, _, _)| (record.sha256, record.size)).collect();
        let unnamed_bound = MAX_BLOBS - named.len().min(MAX_DOCUMENTS);
        let empty: [u8; 32] = Sha256::digest(b"").into();
        let mut unnamed: BinaryHeap<Reverse<(SystemTime, [u8; 32], u64)>> = BinaryHeap::new();
        let index_blob = |index: &mut Index, digest: [u8; 32], size: u64, last_used: SystemTime| {
            index.observe_time(last_used);
            let generation = index.next_generation;
            index.next_generation += 1;
            index.total_bytes += size;
            index.blobs.insert(digest, BlobEntry { size, refs: 0, pins: 0, generation, last_used });
        };
        for_each_sharded(&layout.blobs_dir(), |digest, path| {
            let meta = fs::symlink_metadata(&path).ok().filter(|m| m.is_file());
            let (Some(digest), Some(meta)) = (digest, meta) else {
                return remove_path(&path);
            };
            let (size, last_used) = (meta.len(), meta.modified().unwrap_or(SystemTime::UNIX_EPOCH));
            if size == 0 && digest != empty {
                return remove_path(&path);
            }
            if named.get(&digest) == Some(&size) {
                index_blob(&mut index, digest, size, last_used);
                return Ok(());
            }
            unnamed.push(Reverse((last_used, digest, size)));
            if unnamed.len() > unnamed_bound {
                let Reverse((_, oldest, _)) = unnamed.pop().expect("over the bound");
                index.blobs_over_bound_at_open += 1;
                remove_path(&layout.blob_path(&oldest))?;
            }
            Ok(())
        })?;
        for Reverse((last_used, digest, size)) in unnamed.into_vec() {
            index_blob(&mut index, digest, size, last_used);
        }
        drop(named);
        for (record, file_bytes, last_used) in pointers {
            if index.blobs.get(&record.sha256).is_none_or(|b| b.size != record.size) {
                remove_path(&layout.pointer_path(&record.key_digest))?;
                dropped_pointer = true;
                continue;
            }
            index.observe_time(last_used);
            index.blobs.get_mut(&record.sha256).expect("checked above").refs += 1;
            index.total_bytes += file_bytes;
            index.docs.insert(record.key_digest, DocEntry { sha256: record.sha256, size: record.size, file_bytes, last_used });
        }
        if dropped_pointer {
            // Sync every shard we may have touched: cheaper to reason
            // about than tracking which ones.
            for shard in 0..=255u8 {
                files::sync_dir(&layout.docs_dir().join(hex::encode([shard])))?;
            }
        }
        self.enforce_bound(&mut index)
    }

    /// Stores a file version (if not already present) and pins it.
    /// Computes the SHA-256 itself, so a blob's name always matches its
    /// content.
    pub fn put_blob(&self, data: &[u8]) -> Result<BlobPin> {
        let sha256: [u8; 32] = Sha256::digest(data).into();
        let size = data.len() as u64;
        if let Some(pin) = self.pin(&sha256, size) {
            return Ok(pin);
        }
        let staged = files::stage(&self.shared.layout, &[data], &BLOB_WRITE)?;
        let mut index = self.shared.lock();
        let now = index.now();
        // Someone may have written the same content meanwhile; the
        // staged copy is then dropped (its guard deletes it).
        let mut synced = Ok(());
        if !index.blobs.contains_key(&sha256) {
            let renamed = staged.commit(&self.shared.layout.blob_path(&sha256))?;
            let generation = index.next_generation;
            index.next_generation += 1;
            index.total_bytes += size;
            index.blobs.insert(sha256, BlobEntry { size, refs: 0, pins: 0, generation, last_used: now });
            synced = renamed.sync_folder();
        }
        index.blobs.get_mut(&sha256).expect("blob just indexed").last_used = now;
        let generation = Self::add_pin(&mut index, &sha256, size).expect("blob just indexed");
        let bounded = synced.and_then(|()| self.enforce_bound(&mut index));
        // The guard is built only after the lock is released: dropping a
        // BlobPin takes the lock, so one must never drop (on an error or
        // an unwinding panic) while this thread holds it.
        drop(index);
        let pin = self.pin_guard(sha256, size, generation);
        bounded?;
        Ok(pin)
    }

    /// Pins a blob the store holds, without reading it. `None` if there
    /// is no blob with this hash and size.
    pub fn pin(&self, sha256: &[u8; 32], size: u64) -> Option<BlobPin> {
        let generation = Self::add_pin(&mut self.shared.lock(), sha256, size)?;
        Some(self.pin_guard(*sha256, size, generation))
    }

    /// Counts a pin in the index; the caller turns it into a [`BlobPin`]
    /// with [`Self::pin_guard`] once it has released the lock.
    fn add_pin(index: &mut Index, sha256: &[u8; 32], size: u64) -> Option<u64> {
        let entry = index.blobs.get_mut(sha256).filter(|entry| entry.size == size)?;
        entry.pins += 1;
        Some(entry.generation)
    }

    fn pin_guard(&self, sha256: [u8; 32], size: u64, generation: u64) -> BlobPin {
        BlobPin { shared: self.shared.clone(), sha256, size, generation }
    }

    /// The whole SHA-256 of a blob of `size` bytes whose SHA-256 begins
    /// with `prefix` (a version 2 edit patch names its base by the first 16
    /// bytes: edit-patch-v2.md §2), if the store holds one. Of several
    /// (never seen: 128 bits would have to collide), the most recently used.
    /// Not verified: [`Self::get_blob`] checks the blob when reading it.
    pub fn find_blob(&self, prefix: &[u8], size: u64) -> Option<[u8; 32]> {
        let index = self.shared.lock();
        if let Ok(whole) = <&[u8; 32]>::try_from(prefix) {
            return index.blobs.get(whole).filter(|entry| entry.size == size).map(|_| *whole);
        }
        index
            .blobs
            .iter()
            .filter(|(sha, entry)| entry.size == size && sha.starts_with(prefix))
            .max_by_key(|(_, entry)| entry.last_used)
            .map(|(sha, _)| *sha)
    }

    /// The size of the blob with this hash, if the store holds one (not
    /// verified: [`Self::get_blob`] checks it when reading).
    pub fn blob_size(&self, sha256: &[u8; 32]) -> Option<u64> {
        self.shared.lock().blobs.get(sha256).map(|entry| entry.size)
    }

    /// Whether the store holds a blob with this hash and size (not verified).
    pub fn contains_blob(&self, sha256: &[u8; 32], size: u64) -> bool {
        self.shared.lock().blobs.get(sha256).is_some_and(|entry| entry.size == size)
    }

    /// Reads and verifies the blob with this hash and size, looked up
    /// across the whole store. `Ok(None)` if there is none, or if its
    /// content no longer hashes to its name: such a blob is deleted,
    /// with every pointer naming it (protocol spec §5.2).
    pub fn get_blob(&self, sha256: &[u8; 32], size: u64) -> Result<Option<Blob>> {
        let Some(pin) = self.pin(sha256, size) else { return Ok(None) };
        let path = self.shared.layout.blob_path(sha256);
        let data = match fs::File::open(&path) {
            Ok(mut file) => {
                let mut data = Vec::with_capacity(usize::try_from(size).unwrap_or(0));
                // Read one byte past the expected size to detect growth.
                file.by_ref().take(size.saturating_add(1)).read_to_end(&mut data).map_err(io_err(Action::Reading, &path))?;
                Some(data)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => return Err(io_err(Action::Reading, &path)(e)),
        };
        let intact = data.as_ref().is_some_and(|data| data.len() as u64 == size && Sha256::digest(data).as_slice() == sha256);
        if !intact {
            let mut index = self.shared.lock();
            self.drop_corrupt_blob(&mut index, sha256, pin.generation)?;
            return Ok(None);
        }
        let mut index = self.shared.lock();
        let now = index.now();
        if let Some(entry) = index.blobs.get_mut(sha256) {
            entry.last_used = now;
        }
        drop(index);
        Ok(Some(Blob { pin, data: data.expect("intact implies read") }))
    }

    fn drop_corrupt_blob(&self, index: &mut Index, sha256: &[u8; 32], generation: u64) -> Result<()> {
        if index.blobs.get(sha256).is_none_or(|entry| entry.generation != generation) {
            return Ok(());
        }
        let victims: Vec<[u8; 32]> = index.docs.iter().filter(|(_, doc)| doc.sha256 == *sha256).map(|(key, _)| *key).collect();
        for key in victims {
            self.remove_pointer_locked(index, &key)?;
        }
        let entry = index.blobs.remove(sha256).expect("checked above");
        index.total_bytes -= entry.size;
        index.corrupt_blobs += 1;
        let path = self.shared.layout.blob_path(sha256);
        remove_path(&path)?;
        files::sync_dir(path.parent().expect("sharded"))
    }

    /// Moves the document's pointer to the pinned blob, with an optional
    /// outcome record (protocol spec §5.4; the caller must not pass a
    /// record whose response carries `set-cookie`). Counts as a use.
    /// A record over [`files::MAX_OUTCOME_BYTES`] is not kept (the pointer
    /// moves without it): no pointer file is larger than a start reads.
    pub fn set_document(&self, key: &[u8], target: &BlobPin, outcome: Option<&[u8]>) -> Result<()> {
        let outcome = outcome.filter(|o| o.len() <= files::MAX_OUTCOME_BYTES);
        let key_digest = document_key_digest(key);
        let (head, check) = PointerRecord::encode(&key_digest, &target.sha256, target.size, outcome);
        let staged = files::stage(&self.shared.layout, &[&head, outcome.unwrap_or_default(), &check], &POINTER_WRITE)?;
        let file_bytes = PointerRecord::encoded_len(outcome);
        let mut index = self.shared.lock();
        if index.blobs.get(&target.sha256).is_none_or(|entry| entry.generation != target.generation) {
            return Err(StoreError::BlobMissing { sha256_hex: hex::encode(target.sha256), size: target.size });
        }
        let path = self.shared.layout.pointer_path(&key_digest);
        let renamed = staged.commit(&path)?;
        let now = index.now();
        if let Some(old) = index.docs.remove(&key_digest) {
            index.total_bytes -= old.file_bytes;
            if let Some(blob) = index.blobs.get_mut(&old.sha256) {
                blob.refs -= 1;
            }
        }
        index.blobs.get_mut(&target.sha256).expect("checked above").refs += 1;
        index.total_bytes += file_bytes;
        index.docs.insert(key_digest, DocEntry { sha256: target.sha256, size: target.size, file_bytes, last_used: now });
        renamed.sync_folder()?;
        // The use time is the file's mtime; a new file's own mtime is
        // close, but LRU order needs the index's exact, strictly
        // increasing value.
        set_mtime(&path, now)?;
        self.enforce_bound(&mut index)
    }

    /// Stores `data` and points the document at it, in that order: the
    /// shape of learning a base from a FULL item. A crash in between
    /// leaves the old pointer and an unreferenced blob.
    pub fn put_document(&self, key: &[u8], data: &[u8], outcome: Option<&[u8]>) -> Result<BlobPin> {
        let pin = self.put_blob(data)?;
        fail::fail_point!("store::between_blob_and_pointer");
        self.set_document(key, &pin, outcome)?;
        Ok(pin)
    }

    /// The document's last-synced version, if the store has one. Counts
    /// as a use (refreshes the pointer's last-used time). The blob is not
    /// pinned: pin or read it with [`Store::get_blob`].
    pub fn document(&self, key: &[u8]) -> Result<Option<DocumentPointer>> {
        let key_digest = document_key_digest(key);
        let mut index = self.shared.lock();
        if !index.docs.contains_key(&key_digest) {
            return Ok(None);
        }
        let path = self.shared.layout.pointer_path(&key_digest);
        let record = read_pointer(&path)?;
        let Some(record) = record.filter(|r| r.key_digest == key_digest) else {
            // Damaged after open: forget it rather than trust it.
            self.remove_pointer_locked(&mut index, &key_digest)?;
            return Ok(None);
        };
        let now = index.now();
        // The use time is metadata only; losing it in a crash only
        // makes LRU order slightly stale.
        set_mtime(&path, now)?;
        let entry = index.docs.get_mut(&key_digest).expect("checked above");
        entry.last_used = now;
        Ok(Some(DocumentPointer { sha256: record.sha256, size: record.size, outcome: record.outcome, last_used: now }))
    }

    /// Forgets the document's pointer (for example after a provider
    /// hash disagreement). Its blob stays until collected. Returns
    /// whether there was one.
    pub fn remove_document(&self, key: &[u8]) -> Result<bool> {
        let key_digest = document_key_digest(key);
        let mut index = self.shared.lock();
        if !index.docs.contains_key(&key_digest) {
            return Ok(false);
        }
        self.remove_pointer_locked(&mut index, &key_digest)?;
        Ok(true)
    }

    fn remove_pointer_locked(&self, index: &mut Index, key_digest: &[u8; 32]) -> Result<()> {
        let path = self.shared.layout.pointer_path(key_digest);
        remove_path(&path)?;
        // The pointer must be gone on disk before its blob can go, or a
        // crash could leave a pointer naming a deleted blob.
        files::sync_dir(path.parent().expect("sharded"))?;
        let doc = index.docs.remove(key_digest).expect("caller checked");
        index.total_bytes -= doc.file_bytes;
        if let Some(blob) = index.blobs.get_mut(&doc.sha256) {
            blob.refs -= 1;
        }
        Ok(())
    }

    fn delete_blob_locked(&self, index: &mut Index, sha256: &[u8; 32]) -> Result<()> {
        let path = self.shared.layout.blob_path(sha256);
        remove_path(&path)?;
        let entry = index.blobs.remove(sha256).expect("caller checked");
        index.total_bytes -= entry.size;
        index.blobs_collected += 1;
        Ok(())
    }

    /// Frees room until the store is under its bounds: for bytes or
    /// [`MAX_BLOBS`], first unreferenced, unpinned blobs (oldest first);
    /// then, for bytes or [`MAX_DOCUMENTS`], least-recently-used documents with their blob
    /// when no other document names it and it is not pinned.
    fn enforce_bound(&self, index: &mut Index) -> Result<()> {
        let max = self.shared.config.max_total_bytes;
        let over = |index: &Index| index.total_bytes > max || index.docs.len() > MAX_DOCUMENTS;
        let too_many_blobs = |index: &Index| index.blobs.len() > MAX_BLOBS;
        if !over(index) && !too_many_blobs(index) {
            return Ok(());
        }
        if index.total_bytes > max || too_many_blobs(index) {
            let mut orphans: Vec<([u8; 32], SystemTime)> =
                index.blobs.iter().filter(|(_, b)| b.refs == 0 && b.pins == 0).map(|(sha, b)| (*sha, b.last_used)).collect();
            orphans.sort_by_key(|(_, time)| *time);
            for (sha256, _) in orphans {
                if index.total_bytes <= max && !too_many_blobs(index) {
                    break;
                }
                self.delete_blob_locked(index, &sha256)?;
            }
        }
        while over(index) {
            let Some(victim) = index.docs.iter().min_by_key(|(_, doc)| doc.last_used).map(|(key, _)| *key) else {
                break;
            };
            let sha256 = index.docs[&victim].sha256;
            self.remove_pointer_locked(index, &victim)?;
            index.evictions += 1;
            fail::fail_point!("store::evict_after_pointer_removed");
            if index.blobs.get(&sha256).is_some_and(|b| b.refs == 0 && b.pins == 0) {
                self.delete_blob_locked(index, &sha256)?;
            }
        }
        Ok(())
    }

    /// Pointer files the start removed because the folder held more than
    /// [`MAX_DOCUMENTS`] (the least recently used; their documents' next
    /// saves go whole). Zero but for a folder this store did not write.
    pub fn pointers_over_bound_at_open(&self) -> u64 {
        self.shared.lock().pointers_over_bound_at_open
    }

    /// Blob files the start removed because the folder held more than
    /// [`MAX_BLOBS`] (the least recently used of those no pointer names).
    /// Zero but for a folder this store did not write. Empty files not named
    /// by the SHA-256 of nothing, and anything but a regular file, are
    /// damage, removed and not counted here.
    pub fn blobs_over_bound_at_open(&self) -> u64 {
        self.shared.lock().blobs_over_bound_at_open
    }

    /// Sizes and counters.
    pub fn stats(&self) -> StoreStats {
        let index = self.shared.lock();
        StoreStats {
            total_bytes: index.total_bytes,
            max_total_bytes: self.shared.config.max_total_bytes,
            documents: index.docs.len() as u64,
            blobs: index.blobs.len() as u64,
            pinned_blobs: index.blobs.values().filter(|b| b.pins > 0).count() as u64,
            evictions: index.evictions,
            blobs_collected: index.blobs_collected,
            corrupt_blobs: index.corrupt_blobs,
        }
    }

    /// Full consistency check of folder and index: hashes every blob,
    /// decodes every pointer, and compares both with the index. Holds
    /// the index lock throughout (it reads every byte of the store), so
    /// it is for tests and diagnostics, not the request path. Changes
    /// nothing.
    pub fn check(&self) -> Result<CheckReport> {
        let layout = &self.shared.layout;
        let index = self.shared.lock();
        let mut report = CheckReport::default();

        for entry in read_dir(&layout.tmp_dir())? {
            report.problems.push(Problem::StrayFile { path: entry.path() });
        }
        let mut seen_blobs: HashMap<[u8; 32], u64> = HashMap::new();
        for (digest, path) in list_sharded(&layout.blobs_dir())? {
            let Some(digest) = digest else {
                report.problems.push(Problem::StrayFile { path });
                continue;
            };
            report.blobs_checked += 1;
            let data = fs::read(&path).map_err(io_err(Action::Reading, &path))?;
            if Sha256::digest(&data).as_slice() != digest {
                report.problems.push(Problem::CorruptBlob { path: path.clone() });
            }
            seen_blobs.insert(digest, data.len() as u64);
            report.bytes_on_disk += data.len() as u64;
            match index.blobs.get(&digest) {
                Some(entry) if entry.size == data.len() as u64 => {}
                _ => report.problems.push(Problem::IndexDisagrees { path }),
            }
        }
        let mut refs: HashMap<[u8; 32], u64> = HashMap::new();
        let mut seen_docs = 0u64;
        for (digest, path) in list_sharded(&layout.docs_dir())? {
            let Some(digest) = digest else {
                report.problems.push(Problem::StrayFile { path });
                continue;
            };
            report.documents_checked += 1;
            seen_docs += 1;
            let len = fs::metadata(&path).map_err(io_err(Action::Reading, &path))?.len();
            report.bytes_on_disk += len;
            let Some(record) = read_pointer(&path)?.filter(|r| r.key_digest == digest) else {
                report.problems.push(Problem::DamagedPointer { path });
                continue;
            };
            if seen_blobs.get(&record.sha256) != Some(&record.size) {
                report.problems.push(Problem::PointerToMissingBlob { path: path.clone(), sha256_hex: hex::encode(record.sha256) });
            }
            *refs.entry(record.sha256).or_default() += 1;
            match index.docs.get(&digest) {
                Some(doc) if doc.sha256 == record.sha256 && doc.size == record.size && doc.file_bytes == len => {}
                _ => report.problems.push(Problem::IndexDisagrees { path }),
            }
        }
        if seen_blobs.len() != index.blobs.len() || seen_docs != index.docs.len() as u64 {
            report.problems.push(Problem::IndexDisagrees { path: layout.root.clone() });
        }
        for (sha256, entry) in &index.blobs {
            if entry.refs != refs.get(sha256).copied().unwrap_or(0) {
                report.problems.push(Problem::IndexDisagrees { path: layout.blob_path(sha256) });
            }
        }
        if report.bytes_on_disk != index.total_bytes {
            report.problems.push(Problem::TotalBytesDisagree { index: index.total_bytes, on_disk: report.bytes_on_disk });
        }
        Ok(report)
    }
}

/// How long `Store::open` waits for a folder another handle holds.
const LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(3);

fn lock_folder(path: &Path) -> Result<fs::File> {
    let file = fs::OpenOptions::new().create(true).truncate(false).write(true).open(path).map_err(io_err(Action::Locking, path))?;
    // A lock can outlive its holder by a moment: a process that forked just
    // before the holder closed the folder keeps a copy of the locked file
    // descriptor until it execs (flock locks belong to the open file, not to
    // the process), and an EPS being replaced may still be exiting. So wait
    // a little before calling the folder taken.
    let deadline = std::time::Instant::now() + LOCK_WAIT;
    loop {
        // SAFETY: flock on a file descriptor we own; no memory is involved.
        let rc = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
        if rc == 0 {
            return Ok(file);
        }
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(io_err(Action::Locking, path)(err));
        }
        if std::time::Instant::now() >= deadline {
            return Err(StoreError::Locked { path: path.to_owned() });
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

fn read_dir(dir: &Path) -> Result<Vec<fs::DirEntry>> {
    fs::read_dir(dir).and_then(|entries| entries.collect::<std::io::Result<Vec<_>>>()).map_err(io_err(Action::Listing, dir))
}

/// Every file under the 256 shards of `parent`, with its digest when the
/// name is a well-formed one for its shard.
fn list_sharded(parent: &Path) -> Result<Vec<(Option<[u8; 32]>, PathBuf)>> {
    let mut out = Vec::new();
    for_each_sharded(parent, |digest, path| {
        out.push((digest, path));
        Ok(())
    })?;
    Ok(out)
}

/// Calls `f` with every file under the 256 shards of `parent`, as the
/// folders are read (nothing is collected: a folder may hold any number of
/// files), with its digest when the name is a well-formed one for its shard.
fn for_each_sharded(parent: &Path, mut f: impl FnMut(Option<[u8; 32]>, PathBuf) -> Result<()>) -> Result<()> {
    let listing = |dir: &Path| fs::read_dir(dir).map_err(io_err(Action::Listing, dir));
    for shard_entry in listing(parent)? {
        let shard_entry = shard_entry.map_err(io_err(Action::Listing, parent))?;
        let shard_path = shard_entry.path();
        let shard = shard_entry.file_name().to_string_lossy().into_owned();
        let is_shard = shard.len() == 2 && shard.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
        if !is_shard || !shard_path.is_dir() {
            f(None, shard_path)?;
            continue;
        }
        for entry in listing(&shard_path)? {
            let entry = entry.map_err(io_err(Action::Listing, &shard_path))?;
            let name = entry.file_name().to_string_lossy().into_owned();
            f(files::parse_name(&shard, &name), entry.path())?;
        }
    }
    Ok(())
}

/// Reads a pointer file: `None` for anything but an intact record, without
/// reading more than [`files::MAX_POINTER_FILE`] bytes (a larger file, or
/// anything but a regular file, is damaged: a huge file, or a link to
/// `/dev/zero`, put in the folder must not exhaust the memory).
fn read_pointer(path: &Path) -> Result<Option<PointerRecord>> {
    use std::io::Read;
    let opened = fs::symlink_metadata(path).and_then(|m| {
        if !m.is_file() || m.len() > files::MAX_POINTER_FILE {
            return Ok(None);
        }
        let mut bytes = Vec::with_capacity(m.len() as usize);
        fs::File::open(path)?.take(files::MAX_POINTER_FILE + 1).read_to_end(&mut bytes)?;
        Ok(Some(bytes))
    });
    match opened {
        Ok(Some(bytes)) if bytes.len() as u64 <= files::MAX_POINTER_FILE => Ok(PointerRecord::decode(&bytes)),
        Ok(_) => Ok(None),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(io_err(Action::Reading, path)(e)),
    }
}

fn remove_path(path: &Path) -> Result<()> {
    let result = if path.is_dir() { fs::remove_dir_all(path) } else { fs::remove_file(path) };
    match result {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(io_err(Action::Removing, path)(e)),
    }
}

fn set_mtime(path: &Path, time: SystemTime) -> Result<()> {
    fs::File::options().write(true).open(path).and_then(|file| file.set_modified(time)).map_err(io_err(Action::Writing, path))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_start_loads_at_most_the_pointer_bound_and_keeps_the_most_recently_used() {
        // A folder holding more pointers than the bound (written by an EPS
        // of before the bound, or put there by anyone): a start keeps the
        // 65,536 most recently used and removes the rest. Before, it
        // indexed every pointer file it found, as many as the folder held.
        const BOUND: usize = 1 << 16;
        const OVER: usize = 8;
        let dir = tempfile::tempdir().unwrap();
        let key = |i: usize| (i as u64).to_le_bytes();
        let (sha256, size) = {
            let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
            let pin = store.put_blob(b"the version").unwrap();
            (*pin.sha256(), pin.size())
        };
        let layout = Layout { root: dir.path().to_path_buf() };
        let oldest = SystemTime::now() - Duration::from_secs(24 * 3600);
        for i in 0..BOUND + OVER {
            let digest = document_key_digest(&key(i));
            let (head, check) = PointerRecord::encode(&digest, &sha256, size, None);
            let mut file = fs::File::create(layout.pointer_path(&digest)).unwrap();
            std::io::Write::write_all(&mut file, &[&head[..], &check[..]].concat()).unwrap();
            file.set_modified(oldest + Duration::from_secs(i as u64)).unwrap();
        }
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(store.stats().documents, BOUND as u64);
        for i in 0..OVER {
            assert!(store.document(&key(i)).unwrap().is_none(), "pointer {i}, among the least recently used, is removed");
            assert!(!layout.pointer_path(&document_key_digest(&key(i))).exists());
        }
        for i in [OVER + 1, BOUND / 2, BOUND + OVER - 1] {
            assert_eq!(store.document(&key(i)).unwrap().map(|p| p.sha256), Some(sha256), "pointer {i} is kept");
        }
        assert_eq!(store.pointers_over_bound_at_open(), OVER as u64);
        // At the bound, a new document evicts the least recently used one.
        store.put_document(b"a new document", b"its version", None).unwrap();
        assert_eq!(store.stats().documents, BOUND as u64);
        assert!(store.document(&key(OVER)).unwrap().is_none(), "the least recently used document is evicted");
        assert!(store.document(b"a new document").unwrap().is_some());
        assert!(store.check().unwrap().is_consistent());
    }
}

#[cfg(test)]
mod blob_bound_tests {
    use super::*;

    fn write_blob_file(layout: &Layout, name: &[u8; 32], content: &[u8], modified: SystemTime) {
        let mut file = fs::File::create(layout.blob_path(name)).unwrap();
        std::io::Write::write_all(&mut file, content).unwrap();
        file.set_modified(modified).unwrap();
    }

    #[test]
    fn a_start_indexes_no_empty_blob_file_whose_name_is_not_the_empty_content() {
        // Zero-byte files under store/blobs add nothing to the byte bound:
        // before, a start indexed every one of them (as many as the folder
        // held) and kept them, since unreferenced blobs went only under byte
        // pressure. A zero-byte file is a blob only under the SHA-256 of
        // nothing; the others are damage, removed.
        const FILES: u64 = 200_000;
        let dir = tempfile::tempdir().unwrap();
        let (sha256, size) = {
            let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
            let pin = store.put_document(b"a document", b"its version", None).unwrap();
            (*pin.sha256(), pin.size())
        };
        let layout = Layout { root: dir.path().to_path_buf() };
        let now = SystemTime::now();
        for i in 0..FILES {
            let name: [u8; 32] = Sha256::digest(i.to_le_bytes()).into();
            write_blob_file(&layout, &name, b"", now);
        }
        let empty: [u8; 32] = Sha256::digest(b"").into();
        write_blob_file(&layout, &empty, b"", now);
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        let stats = store.stats();
        assert_eq!(stats.blobs, 2, "the document's version and the empty content, not {} blobs", stats.blobs);
        assert!(!layout.blob_path(&Sha256::digest(7u64.to_le_bytes()).into()).exists(), "a damaged blob file is removed");
        assert!(store.contains_blob(&empty, 0));
        assert_eq!(store.document(b"a document").unwrap().map(|p| (p.sha256, p.size)), Some((sha256, size)));
        assert!(store.check().unwrap().is_consistent());
    }

    #[test]
    fn a_start_loads_at_most_the_blob_bound_keeping_referenced_blobs_and_the_most_recently_used() {
        // More blob files than MAX_BLOBS (each one byte: far under the byte
        // bound): a start keeps every blob a pointer names, however old, and
        // the most recently used of the others up to the bound; the rest are
        // removed. Before, every one was indexed.
        const OVER: usize = 8;
        let dir = tempfile::tempdir().unwrap();
        let (sha256, size) = {
            let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
            let pin = store.put_document(b"a document", b"its version", None).unwrap();
            (*pin.sha256(), pin.size())
        };
        let layout = Layout { root: dir.path().to_path_buf() };
        let oldest = SystemTime::now() - Duration::from_secs(24 * 3600);
        // The document's version is the oldest blob of all.
        fs::File::options().write(true).open(layout.blob_path(&sha256)).unwrap().set_modified(oldest - Duration::from_secs(1)).unwrap();
        let name = |i: usize| -> [u8; 32] { Sha256::digest((i as u64).to_le_bytes()).into() };
        for i in 0..MAX_BLOBS + OVER {
            write_blob_file(&layout, &name(i), b"x", oldest + Duration::from_secs(i as u64));
        }
        let store = Store::open(dir.path(), StoreConfig::default()).unwrap();
        assert_eq!(store.stats().blobs, MAX_BLOBS as u64);
        assert_eq!(store.document(b"a document").unwrap().map(|p| (p.sha256, p.size)), Some((sha256, size)), "a referenced blob is kept");
        for i in 0..OVER + 1 {
            assert!(!store.contains_blob(&name(i), 1), "blob {i}, among the least recently used, is removed");
            assert!(!layout.blob_path(&name(i)).exists());
        }
        for i in [OVER + 1, MAX_BLOBS / 2, MAX_BLOBS + OVER - 1] {
            assert!(store.contains_blob(&name(i), 1), "blob {i} is kept");
        }
        assert_eq!(store.blobs_over_bound_at_open(), OVER as u64 + 1);
        // At run time too: a new blob past the bound lets the least recently
        // used unreferenced one go.
        drop(store.put_blob(b"a new version").unwrap());
        assert_eq!(store.stats().blobs, MAX_BLOBS as u64);
        assert!(!store.contains_blob(&name(OVER + 1), 1));
        assert!(store.contains_blob(&sha256, size));
    }
}
