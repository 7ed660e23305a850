//! The golden vectors of edit-patch/vectors/: each valid patch rebuilds its
//! target exactly; each invalid one fails with its named error code.

use sha2::{Digest, Sha256};
use std::path::Path;

/// Applies every vector of `manifest.json` in `root` but those named in
/// `skip`; returns (valid, invalid) counts.
fn check_manifest(root: &Path, version: u64, skip: &[&str]) -> (usize, usize) {
    let manifest: serde_json::Value = serde_json::from_slice(&std::fs::read(root.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["format_version"], version);
    let (mut valid, mut invalid) = (0, 0);
    for v in manifest["vectors"].as_array().unwrap() {
        let name = v["name"].as_str().unwrap();
        if skip.contains(&name) {
            continue;
        }
        let base = std::fs::read(root.join(v["base"].as_str().unwrap())).unwrap();
        let patch = std::fs::read(root.join(v["patch"].as_str().unwrap())).unwrap();
        let got = ec_patch::apply_to_vec(&base, &patch, &ec_patch::Limits::default());
        if let Some(code) = v["expect"]["error"].as_str() {
            let err = got.expect_err(name);
            assert_eq!(err.code(), code, "{name}: {err}");
            invalid += 1;
        } else {
            let out = got.unwrap_or_else(|e| panic!("{name}: {e}"));
            let sha: String = Sha256::digest(&out).iter().map(|b| format!("{b:02x}")).collect();
            assert_eq!(sha, v["expect"]["sha256"].as_str().unwrap(), "{name}");
            assert_eq!(out.len() as u64, v["expect"]["size"].as_u64().unwrap(), "{name}");
            assert_eq!(out, std::fs::read(root.join(v["target"].as_str().unwrap())).unwrap(), "{name}");
            assert_eq!(patch[4] as u64, version, "{name}: version 2's valid vectors need version 2");
            valid += 1;
        }
    }
    (valid, invalid)
}

#[test]
fn version_2_vectors() {
    let (valid, invalid) = check_manifest(&Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors/v2"), 2, &[]);
    assert!(valid >= 4 && invalid >= 9, "{valid} valid, {invalid} invalid vectors");
}

#[test]
fn golden_vectors() {
    // The committed vectors are version 1's conformance suite. This build
    // reads version 2 too, which carries everything version 1 does
    // (edit-patch-v2.md §6): "version byte 2" is no longer an error here but
    // a version 2 patch that uses nothing of version 2, and applies.
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors");
    let (valid, invalid) = check_manifest(&root, 1, &["unsupported-version"]);
    assert!(valid >= 8 && invalid >= 20, "{valid} valid, {invalid} invalid vectors");
    let base = std::fs::read(root.join("sources/libreoffice-1k-base.docx")).unwrap();
    let patch = std::fs::read(root.join("invalid/unsupported-version.ecp")).unwrap();
    assert_eq!(patch[4], 2);
    let out = ec_patch::apply_to_vec(&base, &patch, &ec_patch::Limits::default()).unwrap_or_else(|e| panic!("read as version 2: {e}"));
    let declared = ec_patch::decode(&patch, &ec_patch::Limits::default()).unwrap().target_sha256;
    assert_eq!(<[u8; 32]>::from(Sha256::digest(&out)), declared);
    let mut newer = patch.clone();
    newer[4] = 3;
    let err = ec_patch::apply_to_vec(&base, &newer, &ec_patch::Limits::default()).unwrap_err();
    assert_eq!(err.code(), "unsupported_version", "version byte 3: {err}");
}
