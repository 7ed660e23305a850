//! Runs every codec-level vector of protocol/vectors/ through the codec and
//! checks that the committed vectors are exactly what the generator
//! (`examples/make_protocol_vectors.rs`) makes today.

use crate::support;

use std::path::{Path, PathBuf};

use serde_json::{json, Value};
use support::gen;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors")
}

fn manifest() -> Value {
    serde_json::from_slice(&std::fs::read(root().join("manifest.json")).expect("protocol/vectors/manifest.json")).unwrap()
}

#[test]
fn every_vector_gives_its_expected_outcome() {
    let m = manifest();
    let files = |rel: &str| std::fs::read(root().join(rel)).unwrap_or_else(|e| panic!("{rel}: {e}"));
    let vectors = m["vectors"].as_array().unwrap();
    assert!(vectors.len() >= 80, "{} vectors", vectors.len());
    for v in vectors {
        let name = v["name"].as_str().unwrap();
        assert!(!v["description"].as_str().unwrap().is_empty(), "{name} has a description");
        let kind = v.get("path").unwrap_or(&v["message"]).as_str().unwrap();
        let bytes = files(v["file"].as_str().unwrap());
        let outcome = gen::check(kind, &bytes, &v["state"], &files);
        let expect = &v["expect"];
        match (outcome, expect.get("error")) {
            (Ok(mut got), None) => {
                got["ok"] = json!(true);
                assert_eq!(&got, expect, "{name}: decoded fields");
                assert_eq!(gen::reencode(kind, &bytes, &v["state"]), bytes, "{name}: re-encoding");
            }
            (Err(e), Some(code)) => {
                assert_eq!(e.code.name(), code.as_str().unwrap(), "{name}: {e}");
                assert_eq!(u64::from(e.code.http_status()), expect["http"].as_u64().unwrap(), "{name}");
                assert_eq!(json!(e.list), expect["list"], "{name}: list");
            }
            (got, want) => panic!("{name}: expected {want:?}, got {got:?}"),
        }
    }
}

#[test]
fn committed_vectors_equal_the_generator_output() {
    let generated = gen::generate();
    for (rel, bytes) in &generated {
        let on_disk = std::fs::read(root().join(rel))
            .unwrap_or_else(|e| panic!("{rel} is not committed ({e}); run the make_protocol_vectors example"));
        assert!(on_disk == *bytes, "{rel} differs from the generator's output; rerun `cargo run -p ec-protocol --example make_protocol_vectors` and review the diff");
    }
    for sub in ["valid", "invalid", "files"] {
        for e in std::fs::read_dir(root().join(sub)).unwrap() {
            let rel = format!("{sub}/{}", e.unwrap().file_name().to_string_lossy());
            assert!(generated.contains_key(&rel), "{rel} is not made by the generator (stale file)");
        }
    }
}

#[test]
fn the_marker_credential_appears_in_no_error() {
    let m = manifest();
    let marker = gen::MARKER;
    for v in m["vectors"].as_array().unwrap() {
        if let Some(e) = v["expect"].get("error") {
            assert!(!e.to_string().contains(marker));
        }
    }
    // Details of errors raised on vectors carrying the marker hold no message content.
    let files = |rel: &str| std::fs::read(root().join(rel)).unwrap();
    for v in m["vectors"].as_array().unwrap() {
        let kind = v.get("path").unwrap_or(&v["message"]).as_str().unwrap();
        if let Err(e) = gen::check(kind, &files(v["file"].as_str().unwrap()), &v["state"], &files) {
            assert!(!e.detail.contains("EC-TEST-CREDENTIAL"), "{}: {}", v["name"], e.detail);
        }
    }
}
