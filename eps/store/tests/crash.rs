//! Crash tests: for every fail point of the store, a child process (this
//! test binary re-executed) performs a save and dies at that point; the
//! parent then reopens the store and checks that it holds exactly the
//! old or the new state and passes a full `check()`.
//!
//! Two ways to die: `panic` (the `fail` crate's action, set through the
//! `FAILPOINTS` environment variable; the panic unwinds, so destructors
//! run) and `exit` (a fail point callback calling `_exit`, so nothing
//! runs after the fail point: the closest a test gets to a killed
//! process). Run with `cargo test -p ec-store --features failpoints`.

#![cfg(feature = "failpoints")]

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ec_store::{Store, StoreConfig, FAIL_POINTS};
use sha2::{Digest, Sha256};

const CHILD_SCENARIO: &str = "EC_STORE_CRASH_SCENARIO";
const CHILD_DIR: &str = "EC_STORE_CRASH_DIR";
const CHILD_MODE: &str = "EC_STORE_CRASH_MODE";
const CHILD_POINT: &str = "EC_STORE_CRASH_POINT";
const EXIT_CODE: i32 = 77;
const COMPLETED: &str = "EC-STORE-CHILD-COMPLETED";

const KEY: &[u8] = b"\x01\x04acct\x0a/draft.docx";
const OTHER_KEY: &[u8] = b"\x01\x04acct\x0a/other.xlsx";
const OLD: &[u8] = b"old version of the document";
const NEW: &[u8] = b"new version of the document, longer";
const OLD_OUTCOME: &[u8] = b"outcome of the old save";
const NEW_OUTCOME: &[u8] = b"outcome of the new save";
const OTHER: &[u8] = b"another document, untouched";

/// Eviction scenario: three 1000-byte documents fill the bound.
const DOC_BYTES: usize = 1000;
const EVICT_BOUND: u64 = 3 * (1000 + 121);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    Old,
    New,
}

/// Which scenario reaches each fail point, and the state a crash there
/// must leave (no power loss is simulated, so a completed rename is
/// visible to the next open).
fn plan(point: &str) -> (&'static str, Expect) {
    match point {
        "store::blob_after_temp_write"
        | "store::blob_after_temp_fsync"
        | "store::blob_after_rename"
        | "store::blob_before_dir_fsync"
        | "store::between_blob_and_pointer"
        | "store::pointer_after_temp_write"
        | "store::pointer_after_temp_fsync" => ("save", Expect::Old),
        "store::pointer_after_rename" | "store::pointer_before_dir_fsync" => ("save", Expect::New),
        "store::evict_after_pointer_removed" => ("evict", Expect::Old),
        other => panic!("fail point {other} has no crash scenario: add one to tests/crash.rs"),
    }
}

fn sha(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

fn doc(tag: u8) -> Vec<u8> {
    vec![tag; DOC_BYTES]
}

fn prepare(scenario: &str, dir: &Path) {
    match scenario {
        "save" => {
            let store = Store::open(dir, StoreConfig::default()).unwrap();
            store.put_document(KEY, OLD, Some(OLD_OUTCOME)).unwrap();
            store.put_document(OTHER_KEY, OTHER, None).unwrap();
        }
        "evict" => {
            let store = Store::open(dir, StoreConfig { max_total_bytes: EVICT_BOUND }).unwrap();
            for tag in [b'a', b'b', b'c'] {
                store.put_document(&[tag], &doc(tag), None).unwrap();
            }
        }
        other => panic!("unknown scenario {other}"),
    }
}

/// What the child does; the crash interrupts it.
fn act(scenario: &str, dir: &Path) {
    match scenario {
        "save" => {
            let store = Store::open(dir, StoreConfig::default()).unwrap();
            store.put_document(KEY, NEW, Some(NEW_OUTCOME)).unwrap();
        }
        "evict" => {
            let store = Store::open(dir, StoreConfig { max_total_bytes: EVICT_BOUND }).unwrap();
            store.put_document(b"d", &doc(b'd'), None).unwrap();
        }
        other => panic!("unknown scenario {other}"),
    }
}

fn verify(scenario: &str, dir: &Path, expect: Expect) {
    let bound = if scenario == "evict" { EVICT_BOUND } else { StoreConfig::default().max_total_bytes };
    let store = Store::open(dir, StoreConfig { max_total_bytes: bound }).unwrap();
    let report = store.check().unwrap();
    assert!(report.is_consistent(), "{:#?}", report.problems);
    assert!(std::fs::read_dir(dir.join("tmp")).unwrap().next().is_none(), "temporaries survived reopening");

    let read = |key: &[u8]| {
        store.document(key).unwrap().map(|pointer| {
            let blob = store.get_blob(&pointer.sha256, pointer.size).unwrap().expect("pointer names a readable blob");
            (blob.data, pointer.outcome)
        })
    };
    match scenario {
        "save" => {
            let (content, outcome) = read(KEY).expect("the document keeps a version");
            match expect {
                Expect::Old => {
                    assert_eq!(content, OLD);
                    assert_eq!(outcome.as_deref(), Some(OLD_OUTCOME));
                }
                Expect::New => {
                    assert_eq!(content, NEW);
                    assert_eq!(outcome.as_deref(), Some(NEW_OUTCOME));
                }
            }
            assert_eq!(read(OTHER_KEY).unwrap().0, OTHER);
        }
        "evict" => {
            // a was the eviction victim: gone (its pointer removal was
            // synced before the crash); b and c untouched; d never pointed.
            assert!(read(b"a").is_none());
            assert_eq!(read(b"b").unwrap().0, doc(b'b'));
            assert_eq!(read(b"c").unwrap().0, doc(b'c'));
            assert!(read(b"d").is_none());
            assert!(store.stats().total_bytes <= EVICT_BOUND);
        }
        other => panic!("unknown scenario {other}"),
    }

    // The store keeps working: the interrupted save can be redone.
    match scenario {
        "save" => {
            store.put_document(KEY, NEW, Some(NEW_OUTCOME)).unwrap();
            assert_eq!(read(KEY).unwrap().0, NEW);
        }
        _ => {
            store.put_document(b"d", &doc(b'd'), None).unwrap();
            assert_eq!(read(b"d").unwrap().0, doc(b'd'));
        }
    }
    let report = store.check().unwrap();
    assert!(report.is_consistent(), "{:#?}", report.problems);
}

/// The child's entry point; a no-op in a normal test run.
#[test]
fn crash_child() {
    let Ok(scenario) = std::env::var(CHILD_SCENARIO) else { return };
    let dir = std::path::PathBuf::from(std::env::var(CHILD_DIR).unwrap());
    let mode = std::env::var(CHILD_MODE).unwrap_or_default();
    // `panic` comes from FAILPOINTS; `exit` is not a `fail` action, so
    // it is a callback.
    let scenario_guard = fail::FailScenario::setup();
    if let (true, Ok(point)) = (mode == "exit", std::env::var(CHILD_POINT)) {
        fail::cfg_callback(point, || {
            // SAFETY: _exit ends the process at once; nothing is shared.
            unsafe { libc::_exit(EXIT_CODE) }
        })
        .unwrap();
    }
    act(&scenario, &dir);
    println!("{COMPLETED}");
    scenario_guard.teardown();
}

fn run_child(scenario: &str, dir: &Path, point: Option<&str>, mode: &str) -> std::process::Output {
    let mut command = Command::new(std::env::current_exe().unwrap());
    command
        .args(["crash_child", "--exact", "--nocapture", "--test-threads=1"])
        .env(CHILD_SCENARIO, scenario)
        .env(CHILD_DIR, dir)
        .env(CHILD_MODE, mode)
        .env_remove("FAILPOINTS");
    if let Some(point) = point {
        command.env(CHILD_POINT, point);
        if mode == "panic" {
            command.env("FAILPOINTS", format!("{point}=panic"));
        }
    }
    // A child that hangs (a deadlock on the way down, say) must fail
    // the test, not stall it.
    let mut child = command.stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(120) {
            child.kill().unwrap();
            panic!("crash child for {point:?} ({mode}) hung for two minutes");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    child.wait_with_output().unwrap()
}

fn crash_at_every_point(mode: &str) {
    for &point in FAIL_POINTS {
        let (scenario, expect) = plan(point);
        let dir = tempfile::tempdir().unwrap();
        prepare(scenario, dir.path());
        let output = run_child(scenario, dir.path(), Some(point), mode);
        let stdout = String::from_utf8_lossy(&output.stdout);
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!stdout.contains(COMPLETED), "{point} ({mode}): the child never reached the fail point\n{stdout}");
        match mode {
            "exit" => assert_eq!(output.status.code(), Some(EXIT_CODE), "{point}: {stdout}\n{stderr}"),
            _ => assert!(
                !output.status.success() && (stdout.contains(point) || stderr.contains(point)),
                "{point} (panic): child did not panic at the fail point\n{stdout}\n{stderr}"
            ),
        }
        verify(scenario, dir.path(), expect);
    }
}

#[test]
fn every_fail_point_has_a_scenario() {
    for &point in FAIL_POINTS {
        plan(point);
    }
}

#[test]
fn a_child_without_fail_points_completes_with_the_new_state() {
    for scenario in ["save", "evict"] {
        let dir = tempfile::tempdir().unwrap();
        prepare(scenario, dir.path());
        let output = run_child(scenario, dir.path(), None, "exit");
        assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
        assert!(String::from_utf8_lossy(&output.stdout).contains(COMPLETED));
        let store = Store::open(dir.path(), StoreConfig { max_total_bytes: EVICT_BOUND.max(1 << 30) }).unwrap();
        assert!(store.check().unwrap().is_consistent());
        if scenario == "save" {
            let pointer = store.document(KEY).unwrap().unwrap();
            assert_eq!(pointer.sha256, sha(NEW));
        } else {
            assert_eq!(store.document(b"d").unwrap().unwrap().sha256, sha(&doc(b'd')));
        }
    }
}

#[test]
fn crash_by_exit_at_every_fail_point_leaves_old_or_new_state() {
    crash_at_every_point("exit");
}

#[test]
fn crash_by_panic_at_every_fail_point_leaves_old_or_new_state() {
    crash_at_every_point("panic");
}
