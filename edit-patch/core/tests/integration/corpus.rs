//! Exactness on real documents from many producers: every file of
//! ../shared/corpus/real is rebuilt byte for byte from a patch against another
//! file of the same format, and from its identity patch.

use crate::common;

use ec_patch::{apply_to_vec, decode, diff, encode, Body, DiffOptions, Limits};
use std::path::PathBuf;

fn files(dir: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(common::corpus().join(dir)).unwrap().flatten().map(|e| e.path()).collect();
    v.sort();
    v
}

fn round_trip(base: &[u8], new: &[u8], what: &str) -> Vec<u8> {
    let patch = encode(&diff(base, new, &DiffOptions::default()).unwrap_or_else(|e| panic!("{what}: diff failed: {e}")));
    let out = apply_to_vec(base, &patch, &Limits::default()).unwrap_or_else(|e| panic!("{what}: apply failed: {e}"));
    assert!(out == new, "{what}: rebuilt file differs");
    patch
}

#[test]
fn every_corpus_file_rebuilds_from_another_of_its_format() {
    let mut pairs = 0;
    for dir in ["docx", "xlsx", "pptx", "odt", "ods", "odp", "oddballs"] {
        let fs = files(dir);
        for (i, f) in fs.iter().enumerate() {
            let base_path = &fs[(i + fs.len() - 1) % fs.len()];
            let (base, new) = (std::fs::read(base_path).unwrap(), std::fs::read(f).unwrap());
            let patch = round_trip(&base, &new, &format!("{} -> {}", base_path.display(), f.display()));
            // A patch never costs much more than sending the file whole.
            assert!(patch.len() <= new.len() + 256, "{}: patch of {} bytes for a {}-byte file", f.display(), patch.len(), new.len());
            pairs += 1;
        }
    }
    assert!(pairs >= 79, "only {pairs} pairs");
}

#[test]
fn identity_patches_are_tiny_and_exact() {
    for dir in ["docx", "xlsx", "pptx", "odt", "ods", "odp", "oddballs"] {
        for f in files(dir) {
            let b = std::fs::read(&f).unwrap();
            let patch = round_trip(&b, &b, &f.display().to_string());
            assert!(patch.len() < 100, "{}: identity patch of {} bytes", f.display(), patch.len());
        }
    }
}

#[test]
fn odd_archives_take_the_expected_path() {
    let odd = common::corpus().join("oddballs");
    let read = |n: &str| std::fs::read(odd.join(n)).unwrap();
    // Encrypted OOXML is an OLE file, not a ZIP: generic binary delta.
    let enc = read("encrypted-agile_protected_agile.docx");
    let mut edited = enc.clone();
    edited[4000] ^= 0x55;
    let p = diff(&enc, &edited, &DiffOptions::default()).unwrap();
    assert!(matches!(p.body, Body::Binary { .. }));
    assert!(encode(&p).len() < 200);
    // A truncated download (no central directory) is still patched structurally.
    let trunc = read("truncated-no-central-dir_Divino_Revelado.pptx");
    let layout = ec_patch::zip::scan(&trunc).unwrap();
    assert!(layout.forward_scanned && layout.entries.len() > 10);
    let mut longer = trunc.clone();
    longer.extend_from_slice(b"more bytes of the download arrived");
    let p = round_trip(&trunc, &longer, "truncated download, extended");
    assert!(p.len() < 300, "patch of {} bytes", p.len());
    // Duplicate names, backslashes, ZIP64 extras, NTFS extras, no mimetype, two writers: exact self-edits.
    for n in [
        "duplicate-entry_duplicate-filename.xlsx",
        "backslash-paths_issue.3730.xlsx",
        "zip64-extra-fields_npoi_hybrid.xlsx",
        "content-first-ntfs-extra_test_rdfmeta.odt",
        "no-mimetype_nomimetype.ods",
        "mixed-writers_excelize_Book1.xlsx",
    ] {
        let b = read(n);
        let layout = ec_patch::zip::scan(&b).unwrap_or_else(|e| panic!("{n}: {e}"));
        assert!(!layout.entries.is_empty(), "{n}");
        let mut e = b.clone();
        let at = e.len() - 30;
        e[at] ^= 1; // an edit in the directory / end record
        round_trip(&b, &e, n);
    }
    let p = decode(&round_trip(&enc, &enc, "identity"), &Limits::default()).unwrap();
    assert_eq!(p.body, Body::Identity);
}
