//! Hostile and broken input: each case gets a typed error with a clear
//! message, and apply never hands back bytes other than the promised file.

use crate::common;

use common::{document_xml, zip, Member};
use ec_patch::{apply_to_vec, decode, diff, encode, Body, DiffOptions, Limits, PatchError, Segment};

fn pair() -> (Vec<u8>, Vec<u8>) {
    let doc = document_xml(5000, 1);
    let mut edited = doc.clone();
    edited.insert(doc.len() / 2, b'X');
    let base = zip(&[Member::new(b"[Content_Types].xml", &b"<Types/>"[..]), Member::new(b"word/document.xml", doc.clone())]);
    let new = zip(&[Member::new(b"[Content_Types].xml", &b"<Types/>"[..]), Member::new(b"word/document.xml", edited)]);
    (base, new)
}

fn patch_of(base: &[u8], new: &[u8]) -> Vec<u8> {
    encode(&diff(base, new, &DiffOptions::default()).unwrap())
}

fn patch_of_version(base: &[u8], new: &[u8], version: u8) -> Vec<u8> {
    encode(&diff(base, new, &DiffOptions { max_version: Some(version), ..Default::default() }).unwrap())
}

#[test]
fn wrong_base_is_refused_with_both_hashes() {
    let (base, new) = pair();
    let patch = patch_of(&base, &new);
    let err = apply_to_vec(&new, &patch, &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "wrong_base");
    let msg = err.to_string();
    assert!(msg.contains("wrong base") && msg.contains(&format!("{} bytes", base.len())), "{msg}");
}

#[test]
fn every_truncation_of_a_patch_is_an_error() {
    let (base, new) = pair();
    let patch = patch_of(&base, &new);
    for n in 0..patch.len() {
        let err = apply_to_vec(&base, &patch[..n], &Limits::default()).expect_err("a truncated patch must fail");
        assert!(["bad_magic", "truncated", "malformed", "codec"].contains(&err.code()), "cut at {n}: {err}");
    }
}

#[test]
fn no_single_byte_corruption_yields_a_wrong_file() {
    let (base, new) = pair();
    let patch = patch_of(&base, &new);
    for i in 0..patch.len() {
        for flip in [0x01u8, 0x80, 0xff] {
            let mut bad = patch.clone();
            bad[i] ^= flip;
            if let Ok(out) = apply_to_vec(&base, &bad, &Limits::default()) {
                assert!(out == new, "byte {i} ^ {flip:#x} produced a wrong file");
            }
        }
    }
}

#[test]
fn a_forged_target_hash_is_caught_and_nothing_returned() {
    let (base, new) = pair();
    let mut p = diff(&base, &new, &DiffOptions::default()).unwrap();
    p.target_sha256[0] ^= 1;
    let err = apply_to_vec(&base, &encode(&p), &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "target_mismatch");
    assert!(err.to_string().contains("discarded"));
}

#[test]
fn zip_bombs_are_refused_by_size_and_by_ratio() {
    let bomb = zip(&[Member::new(b"xl/worksheets/sheet1.xml", vec![0u8; 16 << 20])]);
    let small = zip(&[Member::new(b"xl/worksheets/sheet1.xml", &b"<x/>"[..])]);
    let size_limited = DiffOptions { limits: Limits { max_part_size: 8 << 20, ..Limits::default() }, ..Default::default() };
    let err = diff(&small, &bomb, &size_limited).unwrap_err();
    assert!(matches!(&err, PatchError::ZipBomb { member, .. } if member == "xl/worksheets/sheet1.xml"), "{err}");
    assert!(err.to_string().contains("zip bomb"));
    let ratio_limited = DiffOptions { limits: Limits { max_expansion_ratio: 100, ..Limits::default() }, ..Default::default() };
    assert_eq!(diff(&small, &bomb, &ratio_limited).unwrap_err().code(), "zip_bomb");
    // The same limits guard the base side.
    assert_eq!(diff(&bomb, &small, &ratio_limited).unwrap_err().code(), "zip_bomb");
}

#[test]
fn absurd_declared_sizes_are_refused_before_any_allocation() {
    let (base, new) = pair();
    let mut p = diff(&base, &new, &DiffOptions::default()).unwrap();
    let good = p.clone();
    p.target_size = 1 << 60;
    assert_eq!(decode(&encode(&p), &Limits::default()).unwrap_err().code(), "limit_exceeded");
    let mut p = good.clone();
    if let Body::Zip(z) = &mut p.body {
        for s in &mut z.segments {
            if let Segment::Member(m) = s {
                m.delta.middle = ec_patch::delta::Middle::Zstd { len: 1 << 40, frame: vec![0; 8] };
            }
        }
    }
    assert_eq!(decode(&encode(&p), &Limits::default()).unwrap_err().code(), "limit_exceeded");
    // A segment count larger than the bytes that follow.
    let mut bytes = encode(&good);
    bytes.truncate(bytes.len() - 1);
    assert!(decode(&bytes, &Limits::default()).is_err());
}

#[test]
fn path_traversal_names_are_just_bytes() {
    let names: [&[u8]; 5] = [b"../../etc/passwd", b"/abs/path.xml", b"C:\\Windows\\evil.xml", b"a/../../b.xml", b"nul\0byte.xml"];
    let base = zip(&names.iter().map(|n| Member::new(n, document_xml(300, 2))).collect::<Vec<_>>());
    let new = zip(&names.iter().map(|n| Member::new(n, document_xml(301, 2))).collect::<Vec<_>>());
    let patch = patch_of(&base, &new);
    assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
}

#[test]
fn garbage_is_a_bad_magic_or_a_version_error() {
    assert_eq!(decode(b"PK\x03\x04 this is a zip, not a patch", &Limits::default()).unwrap_err().code(), "bad_magic");
    assert_eq!(decode(b"", &Limits::default()).unwrap_err().code(), "bad_magic");
    let mut v3 = patch_of(b"a", b"b");
    v3[4] = 3;
    let err = decode(&v3, &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "unsupported_version");
    assert!(err.to_string().contains("upgrade"));
    // Version 2 reads version 1's patches under either version byte (edit-patch-v2.md §1.1).
    let mut v2 = patch_of_version(b"a", b"b", 1);
    assert_eq!(v2[4], 1, "limited to version 1, a version 1 patch");
    v2[4] = 2;
    assert_eq!(apply_to_vec(b"a", &v2, &Limits::default()).unwrap(), b"b");
    // Allowed version 2, the same patch with its base named by a hash prefix (v2 §2).
    assert_eq!(patch_of(b"a", b"b"), common::with_base_prefix(&patch_of_version(b"a", b"b", 1)));
}

#[test]
fn descriptors_stored_members_and_new_members_rebuild_exactly() {
    let mut a = Member::new(b"content.xml", document_xml(2000, 3));
    a.descriptor = true;
    let mut s = Member::new(b"mimetype", &b"application/vnd.oasis.opendocument.text"[..]);
    s.deflate = false;
    let base = zip(&[Member { descriptor: false, ..Member::new(b"mimetype", &b"application/vnd.oasis.opendocument.text"[..]) }, a]);
    let mut a2 = Member::new(b"content.xml", document_xml(2001, 3));
    a2.descriptor = true;
    a2.time += 7;
    let added = Member::new(b"Pictures/new.xml", document_xml(50, 9));
    let new = zip(&[s, a2, added]);
    let patch = patch_of(&base, &new);
    assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
}

#[test]
fn files_that_are_not_zips_get_a_binary_delta() {
    let base: Vec<u8> = (0..100_000u32).flat_map(|i| i.to_le_bytes()).collect();
    let mut new = base.clone();
    new[5000] = 9;
    let p = diff(&base, &new, &DiffOptions::default()).unwrap();
    assert!(matches!(p.body, Body::Binary { .. }));
    let bytes = encode(&p);
    assert!(bytes.len() < 200, "{} bytes", bytes.len());
    assert_eq!(apply_to_vec(&base, &bytes, &Limits::default()).unwrap(), new);
    // Empty files on either side.
    for (b, n) in [(&b""[..], &b"x"[..]), (&b"x"[..], &b""[..]), (&b""[..], &b""[..])] {
        assert_eq!(apply_to_vec(b, &patch_of(b, n), &Limits::default()).unwrap(), n);
    }
}

/// Reproducers found by fuzzing (edit-patch/fuzz/regressions/patch_apply,
/// in the fuzz target's input form: a selector byte, then either a patch for
/// one of the fixed fixture bases or `[u32 LE base length][base][patch]`):
/// each must give an error or exactly the promised file, never a panic.
#[test]
fn fuzz_reproducers_are_errors_not_crashes() {
    let fuzz = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fuzz");
    let mut fixtures: Vec<_> = std::fs::read_dir(fuzz.join("fixtures")).unwrap().flatten().map(|f| f.path()).collect();
    fixtures.sort();
    let mut n = 0;
    for f in std::fs::read_dir(fuzz.join("regressions/patch_apply")).unwrap().flatten().filter(|f| f.path().extension().is_none()) {
        let bytes = std::fs::read(f.path()).unwrap();
        let (sel, rest) = bytes.split_first().unwrap();
        let (base, mut patch) = match sel & 3 {
            1 => {
                let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
                let (b, p) = rest[4..].split_at(len.min(rest.len() - 4));
                (b.to_vec(), p.to_vec())
            }
            0 | 3 => (std::fs::read(&fixtures[(sel >> 3) as usize % fixtures.len()]).unwrap(), rest.to_vec()),
            _ => continue, // structured inputs depend on the current encoder
        };
        if sel & 4 != 0 && patch.len() > 8 {
            // The target renamed the base in the patch header: do the same.
            let n_len = patch[7..].iter().position(|b| b & 0x80 == 0).unwrap() + 1;
            let mut fixed = patch[..7].to_vec();
            let mut v = base.len() as u64;
            loop {
                let b = (v & 0x7f) as u8;
                v >>= 7;
                fixed.push(if v == 0 { b } else { b | 0x80 });
                if v == 0 {
                    break;
                }
            }
            fixed.extend_from_slice(&<sha2::Sha256 as sha2::Digest>::digest(&base));
            fixed.extend_from_slice(&patch[7 + n_len + 32..]);
            patch = fixed;
        }
        match apply_to_vec(&base, &patch, &Limits::default()) {
            Err(e) => assert!(
                ["codec", "malformed", "truncated", "wrong_base", "target_mismatch", "limit_exceeded", "bad_magic"].contains(&e.code()),
                "{}: {e}",
                f.path().display()
            ),
            Ok(out) => assert_eq!(out.len() as u64, decode(&patch, &Limits::default()).unwrap().target_size),
        }
        n += 1;
    }
    assert!(n >= 3, "only {n} reproducers replayed");
}
