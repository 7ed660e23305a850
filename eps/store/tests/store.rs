//! Behaviour of the store through its public API: round trips, restart,
//! LRU eviction, pinning, corruption, recovery and concurrent use. Every
//! test ends with a full `check()`.

use std::fs;
use std::path::Path;
use std::sync::Arc;

use ec_store::{document_key_digest, Problem, Store, StoreConfig, StoreError};
use sha2::{Digest, Sha256};

fn sha(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn open(dir: &Path, max_total_bytes: u64) -> Store {
    Store::open(dir, StoreConfig { max_total_bytes }).unwrap()
}

fn assert_consistent(store: &Store) {
    let report = store.check().unwrap();
    assert!(report.is_consistent(), "{:#?}", report.problems);
}

fn pointer_path(dir: &Path, key: &[u8]) -> std::path::PathBuf {
    let name = hex::encode(document_key_digest(key));
    dir.join("docs").join(&name[..2]).join(name)
}

fn blob_path(dir: &Path, data: &[u8]) -> std::path::PathBuf {
    let name = hex::encode(sha(data));
    dir.join("blobs").join(&name[..2]).join(name)
}

#[test]
fn store_is_send_sync_and_clone() {
    fn assert_traits<T: Send + Sync + Clone + 'static>() {}
    assert_traits::<Store>();
    fn assert_pin<T: Send + Sync + 'static>() {}
    assert_pin::<ec_store::BlobPin>();
}

#[test]
fn blobs_are_found_by_hash_and_size_across_the_store() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    let pin = store.put_blob(b"hello").unwrap();
    assert_eq!(pin.sha256(), &sha(b"hello"));
    assert_eq!(pin.size(), 5);
    assert!(blob_path(dir.path(), b"hello").is_file());

    let blob = store.get_blob(&sha(b"hello"), 5).unwrap().unwrap();
    assert_eq!(blob.data, b"hello");
    assert!(store.get_blob(&sha(b"hello"), 6).unwrap().is_none(), "size is part of the lookup");
    assert!(store.get_blob(&sha(b"other"), 5).unwrap().is_none());

    // Putting the same content again stores nothing new.
    let again = store.put_blob(b"hello").unwrap();
    assert_eq!(store.stats().blobs, 1);
    assert_eq!(store.stats().total_bytes, 5);
    drop((pin, again, blob));
    assert_consistent(&store);
}

#[test]
fn blobs_are_found_by_a_prefix_of_their_hash_and_their_size() {
    // A version 2 edit patch names its base by the first 16 bytes of its SHA-256.
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    let _pins = (store.put_blob(b"hello").unwrap(), store.put_blob(b"world").unwrap(), store.put_blob(b"hello!").unwrap());
    let hello = sha(b"hello");
    assert_eq!(store.find_blob(&hello[..16], 5), Some(hello));
    assert_eq!(store.find_blob(&hello, 5), Some(hello), "a whole hash is a prefix too");
    assert_eq!(store.find_blob(&hello[..16], 6), None, "size is part of the lookup");
    let mut other = hello;
    other[15] ^= 1;
    assert_eq!(store.find_blob(&other[..16], 5), None);
    assert_eq!(store.find_blob(&sha(b"world")[..16], 5), Some(sha(b"world")));
    let blob = store.get_blob(&store.find_blob(&hello[..16], 5).unwrap(), 5).unwrap().unwrap();
    assert_eq!(blob.data, b"hello");
}

#[test]
fn documents_keep_their_version_and_outcome_across_restarts() {
    let dir = tempfile::tempdir().unwrap();
    let key_a = b"\x01\x03acc\x0a/a/report.docx".as_slice();
    let key_b = b"\x02\x03acc\x06item-1".as_slice();
    {
        let store = open(dir.path(), 1 << 20);
        store.put_document(key_a, b"version 1 of a", Some(b"outcome a1")).unwrap();
        store.put_document(key_a, b"version 2 of a", Some(b"outcome a2")).unwrap();
        store.put_document(key_b, b"only version of b", None).unwrap();
        assert_consistent(&store);
    }
    let store = open(dir.path(), 1 << 20);
    let a = store.document(key_a).unwrap().unwrap();
    assert_eq!((a.sha256, a.size), (sha(b"version 2 of a"), 14));
    assert_eq!(a.outcome.as_deref(), Some(b"outcome a2".as_slice()));
    let b = store.document(key_b).unwrap().unwrap();
    assert_eq!(b.outcome, None);
    assert_eq!(store.get_blob(&b.sha256, b.size).unwrap().unwrap().data, b"only version of b");
    // The old version of a stays as an unreferenced blob until room is needed.
    assert!(store.get_blob(&sha(b"version 1 of a"), 14).unwrap().is_some());
    let stats = store.stats();
    assert_eq!((stats.documents, stats.blobs), (2, 3));
    assert!(store.document(b"never set").unwrap().is_none());
    assert_consistent(&store);
}

#[test]
fn document_keys_are_never_file_names() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    let key = b"../../etc/passwd\x00\xff".as_slice();
    store.put_document(key, b"content", None).unwrap();
    assert!(pointer_path(dir.path(), key).is_file());
    let names: Vec<String> = walk(dir.path()).iter().map(|p| p.to_string_lossy().into_owned()).collect();
    assert!(names.iter().all(|name| !name.contains("passwd")), "{names:?}");
    assert!(!fs::read(pointer_path(dir.path(), key)).unwrap().windows(6).any(|w| w == b"passwd"));
    assert_consistent(&store);
}

fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            out.extend(walk(&path));
        }
        out.push(path);
    }
    out
}

#[test]
fn a_second_store_on_the_same_folder_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    let err = Store::open(dir.path(), StoreConfig::default()).unwrap_err();
    assert!(matches!(err, StoreError::Locked { ref path } if path.starts_with(dir.path())), "{err}");
    assert!(err.to_string().contains("one EPS per state folder"), "{err}");
    drop(store);
    open(dir.path(), 1 << 20);
}

#[test]
fn errors_name_the_path_and_what_to_do() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-folder");
    fs::write(&file, b"x").unwrap();
    let err = Store::open(file.join("state"), StoreConfig::default()).unwrap_err();
    let text = err.to_string();
    assert!(matches!(err, StoreError::Io { .. }), "{text}");
    assert!(text.contains("not-a-folder"), "{text}");
    assert!(text.contains("permissions"), "{text}");
}

/// Each document here costs its blob (1000 bytes) plus a pointer file
/// (121 bytes without outcome); the bound fits three.
const DOC_BYTES: usize = 1000;
const ONE_DOC: u64 = 1000 + 121;
const THREE_DOCS: u64 = 3 * ONE_DOC;

fn doc_content(tag: u8) -> Vec<u8> {
    vec![tag; DOC_BYTES]
}

#[test]
fn least_recently_used_documents_are_evicted_first() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), THREE_DOCS);
    for tag in [b'a', b'b', b'c'] {
        store.put_document(&[tag], &doc_content(tag), None).unwrap();
    }
    assert_eq!(store.stats().total_bytes, THREE_DOCS);
    // Reading a counts as use: b is now the least recently used.
    store.document(b"a").unwrap().unwrap();
    store.put_document(b"d", &doc_content(b'd'), None).unwrap();
    assert!(store.document(b"b").unwrap().is_none());
    assert!(!blob_path(dir.path(), &doc_content(b'b')).exists());
    for tag in [b'a', b'c', b'd'] {
        assert!(store.document(&[tag]).unwrap().is_some(), "{}", tag as char);
    }
    let stats = store.stats();
    assert_eq!(stats.evictions, 1);
    assert!(stats.total_bytes <= THREE_DOCS);
    // Setting counts as use too: now c is oldest (order of the reads
    // above was a, c, d; then a is set again).
    store.put_document(b"a", &doc_content(b'A'), None).unwrap();
    store.put_document(b"e", &doc_content(b'e'), None).unwrap();
    assert!(store.document(b"c").unwrap().is_none());
    assert!(store.document(b"a").unwrap().is_some());
    assert_consistent(&store);
}

#[test]
fn lru_order_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), 1 << 20);
        for tag in [b'a', b'b', b'c'] {
            store.put_document(&[tag], &doc_content(tag), None).unwrap();
        }
        store.document(b"a").unwrap();
    }
    // Reopening with a bound for two documents evicts the least recent.
    let store = open(dir.path(), 2 * ONE_DOC);
    assert!(store.document(b"b").unwrap().is_none());
    assert!(store.document(b"a").unwrap().is_some());
    assert!(store.document(b"c").unwrap().is_some());
    assert_eq!(store.stats().evictions, 1);
    assert_consistent(&store);
}

#[test]
fn a_blob_shared_by_two_documents_outlives_one_of_them() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), THREE_DOCS);
    store.put_document(b"old", &doc_content(b's'), None).unwrap();
    store.put_document(b"new", &doc_content(b's'), None).unwrap();
    store.put_document(b"x", &doc_content(b'x'), None).unwrap();
    // Over the bound by one pointer: "old" goes, freeing only its
    // pointer file, because "new" still names the shared blob.
    store.put_document(b"y", &doc_content(b'y'), None).unwrap();
    assert!(store.document(b"old").unwrap().is_none());
    let pointer = store.document(b"new").unwrap().unwrap();
    assert!(store.get_blob(&pointer.sha256, pointer.size).unwrap().is_some());
    assert_eq!(store.stats().evictions, 1);
    assert_consistent(&store);
}

#[test]
fn pinned_blobs_are_not_deleted_until_released() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), THREE_DOCS);
    store.put_document(b"a", &doc_content(b'a'), None).unwrap();
    // A running save holds a's version as its base.
    let pointer = store.document(b"a").unwrap().unwrap();
    let base = store.get_blob(&pointer.sha256, pointer.size).unwrap().unwrap();
    for tag in [b'b', b'c', b'd', b'e'] {
        store.put_document(&[tag], &doc_content(tag), None).unwrap();
    }
    // a's pointer was evicted, but its blob is still there and readable.
    assert!(store.document(b"a").unwrap().is_none());
    assert_eq!(store.stats().pinned_blobs, 1);
    assert!(store.get_blob(&pointer.sha256, pointer.size).unwrap().is_some());
    assert!(blob_path(dir.path(), &doc_content(b'a')).is_file());
    assert_consistent(&store);

    // Released, it is collected by the next write that needs room.
    drop(base);
    assert_eq!(store.stats().pinned_blobs, 0);
    store.put_document(b"f", &doc_content(b'f'), None).unwrap();
    assert!(!blob_path(dir.path(), &doc_content(b'a')).exists());
    assert!(store.stats().blobs_collected >= 1);
    assert_consistent(&store);
}

#[test]
fn a_pin_clone_keeps_the_blob_after_the_original_drops() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1000);
    let pin = store.put_blob(&doc_content(b'p')).unwrap();
    let clone = pin.clone();
    drop(pin);
    store.put_blob(&doc_content(b'q')).unwrap();
    assert!(store.contains_blob(clone.sha256(), clone.size()), "still pinned by the clone");
    drop(clone);
    store.put_blob(&doc_content(b'r')).unwrap();
    assert!(!store.contains_blob(&sha(&doc_content(b'p')), 1000));
    assert_consistent(&store);
}

#[test]
fn a_target_larger_than_the_bound_is_kept_only_while_pinned() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 500);
    let pin = store.put_blob(&doc_content(b'g')).unwrap();
    store.set_document(b"big", &pin, None).unwrap();
    // The pointer could not be kept within the bound, the blob is pinned.
    assert!(store.document(b"big").unwrap().is_none());
    assert!(store.contains_blob(pin.sha256(), pin.size()));
    drop(pin);
    store.put_blob(b"small").unwrap();
    assert_eq!(store.stats().blobs, 1);
    assert_consistent(&store);
}

#[test]
fn a_corrupt_blob_is_deleted_with_its_pointers_and_reported_missing() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    store.put_document(b"doc", b"the real content", None).unwrap();
    store.put_document(b"twin", b"the real content", None).unwrap();
    let path = blob_path(dir.path(), b"the real content");
    fs::write(&path, b"the rEal content").unwrap();

    let report = store.check().unwrap();
    assert_eq!(report.problems, vec![Problem::CorruptBlob { path: path.clone() }]);

    let pointer = store.document(b"doc").unwrap().unwrap();
    assert!(store.get_blob(&pointer.sha256, pointer.size).unwrap().is_none());
    assert!(!path.exists());
    assert!(store.document(b"doc").unwrap().is_none());
    assert!(store.document(b"twin").unwrap().is_none());
    assert_eq!(store.stats().corrupt_blobs, 1);
    assert_consistent(&store);

    // A truncated blob is caught the same way.
    store.put_document(b"doc", b"second content", None).unwrap();
    fs::write(blob_path(dir.path(), b"second content"), b"second").unwrap();
    assert!(store.get_blob(&sha(b"second content"), 14).unwrap().is_none());
    assert_consistent(&store);
}

#[test]
fn a_stale_pin_cannot_point_a_document_at_a_deleted_blob() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    let pin = store.put_blob(b"soon corrupt").unwrap();
    fs::write(blob_path(dir.path(), b"soon corrupt"), b"corrupted!!!").unwrap();
    assert!(store.get_blob(pin.sha256(), pin.size()).unwrap().is_none());
    let err = store.set_document(b"doc", &pin, None).unwrap_err();
    assert!(matches!(err, StoreError::BlobMissing { size: 12, .. }), "{err}");
    assert!(store.document(b"doc").unwrap().is_none());
    // Writing the content again gives a fresh blob the old pin does not own.
    let fresh = store.put_blob(b"soon corrupt").unwrap();
    drop(pin);
    store.set_document(b"doc", &fresh, None).unwrap();
    assert_eq!(store.stats().pinned_blobs, 1);
    drop(fresh);
    assert_consistent(&store);
}

#[test]
fn opening_recovers_from_leftovers_and_missing_blobs() {
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), 1 << 20);
        store.put_document(b"kept", b"kept content", Some(b"o")).unwrap();
        store.put_document(b"lost", b"lost content", None).unwrap();
        store.put_document(b"damaged", b"damaged content", None).unwrap();
    }
    fs::write(dir.path().join("tmp").join("123-456-0.tmp"), b"half a blob").unwrap();
    fs::remove_file(blob_path(dir.path(), b"lost content")).unwrap();
    let damaged = pointer_path(dir.path(), b"damaged");
    let mut bytes = fs::read(&damaged).unwrap();
    bytes[50] ^= 1;
    fs::write(&damaged, bytes).unwrap();
    fs::write(dir.path().join("blobs").join("ab").join("not-a-digest"), b"?").unwrap();

    let store = open(dir.path(), 1 << 20);
    assert!(fs::read_dir(dir.path().join("tmp")).unwrap().next().is_none());
    assert!(store.document(b"lost").unwrap().is_none());
    assert!(!pointer_path(dir.path(), b"lost").exists());
    assert!(store.document(b"damaged").unwrap().is_none());
    assert!(!damaged.exists());
    assert_eq!(store.document(b"kept").unwrap().unwrap().outcome.as_deref(), Some(b"o".as_slice()));
    let stats = store.stats();
    assert_eq!((stats.documents, stats.blobs), (1, 2));
    assert_eq!(stats.total_bytes, store.check().unwrap().bytes_on_disk);
    assert_consistent(&store);
}

#[test]
fn check_reports_what_it_finds() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    store.put_document(b"doc", b"content", None).unwrap();
    let stray = dir.path().join("tmp").join("stray.tmp");
    fs::write(&stray, b"x").unwrap();
    fs::remove_file(blob_path(dir.path(), b"content")).unwrap();
    let report = store.check().unwrap();
    assert!(!report.is_consistent());
    assert!(report.problems.contains(&Problem::StrayFile { path: stray }));
    assert!(report
        .problems
        .iter()
        .any(|p| matches!(p, Problem::PointerToMissingBlob { sha256_hex, .. } if *sha256_hex == hex::encode(sha(b"content")))));
    assert!(report.problems.iter().any(|p| matches!(p, Problem::TotalBytesDisagree { .. })));
}

#[test]
fn removing_a_document_keeps_its_blob_until_room_is_needed() {
    let dir = tempfile::tempdir().unwrap();
    let store = open(dir.path(), 1 << 20);
    store.put_document(b"doc", b"content", None).unwrap();
    assert!(store.remove_document(b"doc").unwrap());
    assert!(!store.remove_document(b"doc").unwrap());
    assert!(store.document(b"doc").unwrap().is_none());
    assert!(store.contains_blob(&sha(b"content"), 7));
    assert_consistent(&store);
}

#[test]
fn concurrent_saves_and_reads_leave_a_consistent_store() {
    let dir = tempfile::tempdir().unwrap();
    // Room for about ten of the 40 documents, so eviction runs all along.
    let store = Arc::new(open(dir.path(), 10 * (2000 + 140)));
    let threads: Vec<_> = (0..6u8)
        .map(|thread| {
            let store = store.clone();
            std::thread::spawn(move || {
                for round in 0..60u32 {
                    let key = format!("doc-{}", (round * 7 + u32::from(thread)) % 40);
                    let content: Vec<u8> = format!("{key} from {thread} round {round} ").bytes().cycle().take(2000).collect();
                    let pin = store.put_document(key.as_bytes(), &content, Some(key.as_bytes())).unwrap();
                    assert_eq!(pin.sha256(), &sha(&content));
                    let other = format!("doc-{}", (round * 3 + u32::from(thread) * 11) % 40);
                    if let Some(pointer) = store.document(other.as_bytes()).unwrap() {
                        assert_eq!(pointer.outcome.as_deref(), Some(other.as_bytes()));
                        if let Some(blob) = store.get_blob(&pointer.sha256, pointer.size).unwrap() {
                            assert_eq!(sha(&blob.data), pointer.sha256);
                        }
                    }
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    let stats = store.stats();
    assert!(stats.total_bytes <= stats.max_total_bytes, "{stats:?}");
    assert!(stats.evictions > 0);
    assert_eq!(stats.pinned_blobs, 0);
    assert_consistent(&store);
    drop(store);
    let reopened = open(dir.path(), 10 * (2000 + 140));
    assert_eq!(reopened.stats().documents, stats.documents);
    assert_consistent(&reopened);
}

/// Opening again makes the shard folders that are missing: a folder lost by
/// hand comes back, the ones there keep what they hold, and a stray entry
/// is removed.
#[test]
fn opening_again_makes_the_missing_shards_and_keeps_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let data = b"kept across the reopen".to_vec();
    let shard = hex::encode(&sha(&data)[..1]);
    {
        let store = open(dir.path(), 1 << 20);
        drop(store.put_blob(&data).unwrap());
    }
    let other = if shard == "00" { "01" } else { "00" };
    fs::remove_dir(dir.path().join("blobs").join(other)).unwrap();
    fs::remove_dir(dir.path().join("docs").join("ff")).unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    std::os::unix::fs::symlink(elsewhere.path(), dir.path().join("docs").join("fe-link")).unwrap();
    let store = open(dir.path(), 1 << 20);
    for parent in ["blobs", "docs"] {
        let shards: Vec<_> = fs::read_dir(dir.path().join(parent)).unwrap().map(|e| e.unwrap()).collect();
        assert_eq!(shards.len(), 256, "{parent}: exactly the 256 shards, the stray link removed");
        assert!(shards.iter().all(|e| e.file_type().unwrap().is_dir()), "{parent}: all folders");
    }
    assert!(elsewhere.path().is_dir(), "removing a link never follows it");
    assert_eq!(store.get_blob(&sha(&data), data.len() as u64).unwrap().unwrap().data, data);
    assert_consistent(&store);
}

fn peak_memory() -> u64 {
    let status = fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
}

#[test]
fn a_huge_or_endless_pointer_file_is_dropped_unread() {
    // A pointer file is at most a record and an outcome record of 17 MiB.
    // One put in the folder that is far larger (sparse: no disk used), or a
    // link to /dev/zero, must not be read whole at start or on a lookup:
    // before, `fs::read` took the whole file into memory (2 GiB here; the
    // link, until the allocator gave up).
    let dir = tempfile::tempdir().unwrap();
    {
        let store = open(dir.path(), 1 << 20);
        store.put_document(b"doc-a", b"version a", Some(b"record a")).unwrap();
        store.put_document(b"doc-b", b"version b", None).unwrap();
        store.put_document(b"doc-c", b"version c", None).unwrap();
    }
    let huge = pointer_path(dir.path(), b"doc-b");
    fs::OpenOptions::new().write(true).open(&huge).unwrap().set_len(2 << 30).unwrap();
    let endless = pointer_path(dir.path(), b"doc-c");
    fs::remove_file(&endless).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &endless).unwrap();
    let store = open(dir.path(), 1 << 20);
    assert!(peak_memory() < 512 << 20, "the test process peaked at {} MiB", peak_memory() >> 20);
    assert!(store.document(b"doc-b").unwrap().is_none() && !huge.exists(), "dropped as damaged");
    assert!(store.document(b"doc-c").unwrap().is_none() && fs::symlink_metadata(&endless).is_err());
    let a = store.document(b"doc-a").unwrap().unwrap();
    assert_eq!(a.outcome.as_deref(), Some(&b"record a"[..]));
    // A record over the bound is not persisted; the pointer still moves.
    let big = vec![7u8; ec_store::MAX_OUTCOME_BYTES + 1];
    store.put_document(b"doc-a", b"version a2", Some(&big)).unwrap();
    let a = store.document(b"doc-a").unwrap().unwrap();
    assert_eq!((a.sha256, a.outcome), (sha(b"version a2"), None));
    assert_consistent(&store);
}
