//! Recipe 9, GO_FLATE (edit-patch-v2.md §3), against the real writer it
//! reproduces: Go's `archive/zip` (default compressor, `flate.NewWriter(w,
//! 5)`), through the project's Go re-zipper (experiments/bench/rezip/go, the
//! one `byte_goals.py` uses), built here with the local `go`. The tests check:
//! - every deflated member of real corpus documents (.docx .xlsx .pptx .odt)
//!   re-zipped by Go is recipe 9 at Go level 5 (level byte 7), and the
//!   diff's search finds that recipe for each of them;
//! - a one-word edit of a document with 300 KB of text re-zipped by Go gives
//!   a version 2 patch under 1,000 bytes that applies byte for byte; limited
//!   to version 1, the same pair gives a version 1 patch that applies;
//! - recipe 9 on the wire: out-of-range level bytes, version byte 1, a PNG
//!   inner recipe, a declared size that does not fit are typed errors.
//!
//! Go is required: without `go` on PATH these tests fail (scripts/setup-system
//! installs golang-go).

use crate::common;

use common::{go_build, members, recipes, repo, synthetic, with_recipe};

use ec_patch::deflaters::{Deflater, KnownDeflate};
use ec_patch::{apply_to_vec, decode, diff, diff_verified, encode, DiffOptions, Limits, Recipe};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// Go's level 5 (archive/zip's), as recipe 9's level byte (level + 2).
const GO5: KnownDeflate = KnownDeflate { deflater: Deflater::GoFlate, level: 7 };

fn go(level_byte: u8) -> KnownDeflate {
    KnownDeflate { deflater: Deflater::GoFlate, level: level_byte }
}

/// Builds experiments/bench/rezip/go (once per test binary) under the cargo target dir.
fn rezipper() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| go_build(&repo().join("experiments/bench/rezip/go"), "rezip-go"))
}

/// Writes `members` as a ZIP with Go's archive/zip (names, order and which
/// members are stored kept; deflated ones at archive/zip's level 5).
fn rezip(members: &[(String, bool, Vec<u8>)], work: &str) -> Vec<u8> {
    let work = std::env::temp_dir().join(format!("ec-go-recipe-{}-{work}", std::process::id()));
    let _ = std::fs::remove_dir_all(&work);
    let dir = work.join("d");
    std::fs::create_dir_all(&dir).unwrap();
    let mut list = String::new();
    for (name, deflated, content) in members {
        assert!(!name.contains(".."), "{name}");
        list.push_str(&format!("{}\t1700000000\t{name}\n", if *deflated { 8 } else { 0 }));
        if !name.ends_with('/') {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
    }
    std::fs::write(work.join("list"), list).unwrap();
    let out = work.join("out.zip");
    let status = Command::new(rezipper()).arg(work.join("list")).arg(&dir).arg(&out).status().unwrap();
    assert!(status.success(), "rezip-go failed");
    let zip = std::fs::read(&out).unwrap();
    std::fs::remove_dir_all(&work).unwrap();
    zip
}

#[test]
fn go_archive_zip_members_of_real_documents_are_recipe_9_level_5() {
    let corpus = common::corpus();
    type Doc = (PathBuf, Vec<u8>, Vec<(String, bool, Vec<u8>)>);
    let mut docs: Vec<Doc> = Vec::new();
    for (dir, take) in [("docx", 3), ("xlsx", 3), ("pptx", 2), ("odt", 3)] {
        let mut v: Vec<PathBuf> = std::fs::read_dir(corpus.join(dir)).unwrap().flatten().map(|e| e.path()).collect();
        v.sort();
        let before = docs.len();
        for p in v {
            let original = std::fs::read(&p).unwrap();
            let ms = members(&original);
            // Not the multi-megabyte ones: the diff tries every candidate on a member.
            if ms.iter().map(|m| m.2.len()).sum::<usize>() > 2_000_000 || ms.iter().any(|m| m.0.contains("..")) {
                continue;
            }
            docs.push((p, original, ms));
            if docs.len() - before == take {
                break;
            }
        }
        assert_eq!(docs.len() - before, take, "{dir}: too few documents");
    }
    let mut checked = 0;
    for (p, original, ms) in &docs {
        let (original, ms) = (original.as_slice(), ms.as_slice());
        let zip = rezip(ms, "members");
        let l = ec_patch::zip::scan(&zip).unwrap();
        assert_eq!(l.entries.len(), ms.len());
        let mut deflated = 0;
        for (e, (name, is_deflated, content)) in l.entries.iter().zip(ms) {
            assert_eq!(e.name, name.as_bytes());
            if !is_deflated || name.ends_with('/') {
                continue;
            }
            let data = &zip[e.data_offset as usize..(e.data_offset + e.data_len) as usize];
            let made = ec_patch::deflaters::deflate(content, GO5, u64::MAX).unwrap();
            assert!(made == data, "{} {name}: recipe 9 level byte 7 is not Go's archive/zip", p.display());
            assert!(ec_patch::deflaters::matches(content, GO5, data));
            if content.len() > 5000 {
                assert!(!ec_patch::deflaters::matches(content, go(3), data), "{name}: Go's level 1 too");
            }
            deflated += 1;
        }
        // The diff's search: from the document as it was to Go's re-zip, every
        // deflated member is rebuilt, and each gets recipe 9 at level 5 (the
        // first candidate of recipe 9; zlib, miniz_oxide and zlib-rs refuted).
        let patch = diff_verified(original, &zip, &DiffOptions::default()).unwrap();
        assert_eq!(apply_to_vec(original, &patch, &Limits::default()).unwrap(), zip);
        let rs: Vec<Recipe> = recipes(&patch).into_iter().filter(|r| !matches!(r, Recipe::Stored)).collect();
        assert_eq!(rs.len(), deflated, "{}: {rs:?}", p.display());
        assert!(rs.iter().all(|r| *r == Recipe::Known(GO5)), "{}: {rs:?}", p.display());
        assert_eq!(patch[4], 2);
        checked += deflated;
    }
    assert!(checked > 60, "{checked} members");
}

#[test]
fn a_one_word_edit_of_300_kb_of_text_rezipped_by_go_costs_under_1000_bytes() {
    let corpus = common::corpus();
    let cases = [("docx/word2016-win_example.docx", "word/document.xml"), ("odt/odfdo_collection.odt", "content.xml")];
    for (doc, part) in cases {
        let mut real = members(&std::fs::read(corpus.join(doc)).unwrap());
        let xml = common::document_xml(52_000, 11);
        assert!(xml.len() > 300_000, "{} bytes of text", xml.len());
        // One word changed in the middle: "xyzzy" for the five letters there.
        let mut edited = xml.clone();
        let mid = (xml.len() / 2..xml.len()).find(|&i| edited[i..i + 5].iter().all(u8::is_ascii_lowercase)).unwrap();
        edited[mid..mid + 5].copy_from_slice(b"xyzzy");
        real.iter_mut().find(|m| m.0 == part).expect("the text part").2 = xml;
        let base = rezip(&real, "base");
        real.iter_mut().find(|m| m.0 == part).unwrap().2 = edited;
        let new = rezip(&real, "new");

        let patch = diff_verified(&base, &new, &DiffOptions::default()).unwrap();
        assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
        assert_eq!(patch[4], 2, "{doc}: a version 2 patch");
        assert_eq!(recipes(&patch), vec![Recipe::Known(GO5)], "{doc}");
        assert!(patch.len() < 1000, "{doc}: {} bytes", patch.len());
        eprintln!("{doc}: version 2 patch {} B", patch.len());

        // Limited to version 1: the patch version 1 makes (no recipe 9), which applies.
        let v1 = DiffOptions { max_version: Some(1), ..Default::default() };
        let old = diff_verified(&base, &new, &v1).unwrap();
        assert_eq!(old[4], 1, "{doc}");
        assert!(!recipes(&old).iter().any(|r| matches!(r, Recipe::Known(_))));
        assert_eq!(apply_to_vec(&base, &old, &Limits::default()).unwrap(), new);
        eprintln!("{doc}: version 1 patch {} B", old.len());
        assert!(old.len() > patch.len());

        assert_eq!(encode(&diff(&base, &new, &DiffOptions::default()).unwrap()), patch);
    }
}

#[test]
fn recipe_9_on_the_wire() {
    // Go's levels 5, 1, 9 and -2 (HuffmanOnly): each found as itself. (Not
    // level 0: its stored blocks are zlib-rs level 0's bytes on this text,
    // and recipe 8, tried before, is the patch's.)
    for k in [GO5, go(3), go(11), go(0)] {
        let (base, new) = synthetic(k);
        let p = diff(&base, &new, &DiffOptions::default()).unwrap();
        let bytes = encode(&p);
        assert_eq!(recipes(&bytes), vec![Recipe::Known(k)], "{k:?}");
        assert_eq!(bytes[4], 2);
        assert_eq!(apply_to_vec(&base, &bytes, &Limits::default()).unwrap(), new);
        // The same patch with version byte 1: malformed (version 1 has no recipe 9).
        let mut v1 = bytes.clone();
        v1[4] = 1;
        let err = decode(&v1, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), "malformed", "{err}");
        assert_eq!(apply_to_vec(&base, &v1, &Limits::default()).unwrap_err().code(), "malformed");
        // Limited to version 1: version byte 1, no recipe 9 (PREFLATE, or a
        // whole-file patch where that is smaller), which applies.
        let old = encode(&diff(&base, &new, &DiffOptions { max_version: Some(1), ..Default::default() }).unwrap());
        assert_eq!(old[4], 1);
        assert!(!recipes(&old).iter().any(|r| matches!(r, Recipe::Known(_))), "{k:?}: {:?}", recipes(&old));
        assert_eq!(apply_to_vec(&base, &old, &Limits::default()).unwrap(), new);
    }

    let (base, new) = synthetic(GO5);
    let p = diff(&base, &new, &DiffOptions::default()).unwrap();
    let a = encode(&p);
    // Where the recipe is: the only byte that differs from the same patch with recipe 7.
    let b = encode(&with_recipe(&p, Recipe::Known(KnownDeflate { deflater: Deflater::MinizOxide, level: 7 })));
    assert_eq!(a.len(), b.len());
    let diffs: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    let at = diffs[0];
    assert_eq!((a[at], a[at + 1]), (9, 7), "tag 9, level byte 7 (Go's 5)");
    let code = |bytes: &[u8]| apply_to_vec(&base, bytes, &Limits::default()).unwrap_err().code();
    // Level bytes past 11 (Go's 9): malformed, at the level byte's offset.
    for level in [12u8, 13, 128, 254, 255] {
        let mut v = a.clone();
        v[at + 1] = level;
        let err = decode(&v, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), "malformed", "level byte {level}: {err}");
        let msg = err.to_string();
        assert!(msg.contains("level") && msg.contains("0 to 11"), "{msg}");
        assert!(
            matches!(err, ec_patch::PatchError::Malformed { what: "deflater level", offset, .. } if offset == at + 1),
            "the level byte's offset ({}): {msg}",
            at + 1
        );
        assert_eq!(code(&v), "malformed");
    }
    // Tag 12 and up: still malformed (10 is Info-ZIP's, spec v2 §3.6; 11 a PNG recipe, §3.7).
    for tag in [12u8, 255] {
        let mut v = a.clone();
        v[at] = tag;
        assert_eq!(code(&v), "malformed", "tag {tag}");
    }
    // Cut inside the level byte: truncated.
    assert_eq!(decode(&a[..at + 1], &Limits::default()).unwrap_err().code(), "truncated");
    // Every valid level byte decodes; one that is not the writer's gives other
    // bytes: refused as data past the declared target or as a target mismatch.
    // (Level byte 1, Go's -1, is level 6's bytes; 8 is 6 itself.)
    for level in 0..=11u8 {
        let v = encode(&with_recipe(&p, Recipe::Known(go(level))));
        assert!(decode(&v, &Limits::default()).is_ok());
        if level != 7 {
            assert!(["malformed", "target_mismatch"].contains(&code(&v)), "level byte {level}");
        }
    }
    // A declared size the data does not fit: refused as the data is made (no panic).
    for cut in [1, 100, 1000, new.len() as u64 / 2] {
        let mut q = p.clone();
        q.target_size = new.len() as u64 - cut;
        let e = apply_to_vec(&base, &encode(&q), &Limits::default()).unwrap_err();
        assert!(["malformed", "target_mismatch"].contains(&e.code()), "{e}");
    }
    // A declared size far too small for Go's output: stopped as it is made.
    let mut q = p.clone();
    q.target_size = 200;
    let e = apply_to_vec(&base, &encode(&q), &Limits::default()).unwrap_err();
    assert_eq!(e.code(), "malformed", "{e}");
    // Not as a PNG's inner recipe.
    let frame = ec_patch::png::PngFrame { head_len: 0, tail_len: 0, chunk_size: 8192, first_chunk: 8192, zlib_header: [0x78, 0x9c] };
    let png = encode(&with_recipe(&p, Recipe::Png { frame, inner: Box::new(Recipe::Known(GO5)) }));
    let err = decode(&png, &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "malformed");
    assert!(err.to_string().contains("inner recipe"), "{err}");
}

#[test]
fn the_last_deflater_first_and_the_per_archive_rule_across_all_three() {
    let t: Vec<Vec<u8>> = (1..=3).map(|s| common::document_xml(5000, s)).collect();
    let e: Vec<Vec<u8>> = t
        .iter()
        .enumerate()
        .map(|(i, x)| {
            let mut y = x.clone();
            y[100 + 50 * i] = b'#';
            y
        })
        .collect();
    let filtered = ec_patch::ZlibParams { strategy: 1, ..common::ZLIB6 };
    let mk = |texts: &[Vec<u8>], by: &[Option<KnownDeflate>]| {
        let names: [&[u8]; 3] = [b"a.xml", b"b.xml", b"c.xml"];
        let ms: Vec<common::Member<'_>> = texts.iter().zip(names).map(|(x, n)| common::Member::new(n, x.clone())).collect();
        let data: Vec<Option<Vec<u8>>> = texts
            .iter()
            .zip(by)
            .map(|(x, k)| {
                Some(match k {
                    Some(k) => ec_patch::deflaters::deflate(x, *k, u64::MAX).unwrap(),
                    None => ec_patch::deflate::deflate(x, filtered).unwrap(),
                })
            })
            .collect();
        common::zip_with_data(&ms, &data)
    };
    let miniz = KnownDeflate { deflater: Deflater::MinizOxide, level: 6 };
    let zrs = KnownDeflate { deflater: Deflater::ZlibRs, level: 4 };
    // Members from miniz_oxide, Go (level 9), then zlib-rs: each is found.
    let by = [Some(miniz), Some(go(11)), Some(zrs)];
    let p = diff_verified(&mk(&t, &by), &mk(&e, &by), &DiffOptions::default()).unwrap();
    assert_eq!(recipes(&p), vec![Recipe::Known(miniz), Recipe::Known(go(11)), Recipe::Known(zrs)]);
    // Three Go members at Go's level 2: all recipe 9.
    let by = [Some(go(4)); 3];
    let p = diff_verified(&mk(&t, &by), &mk(&e, &by), &DiffOptions::default()).unwrap();
    assert_eq!(recipes(&p), vec![Recipe::Known(go(4)); 3]);
    // Go's level 9 on a large member (over 64 KiB: only Go's levels 5 and 6
    // are tried on those) is found when a small member before it matched
    // level 9; alone, it gets PREFLATE.
    let big: Vec<Vec<u8>> = vec![t[0].clone(), common::document_xml(20_000, 7), t[2].clone()];
    assert!(big[1].len() > 64 << 10);
    let mut big_e = big.clone();
    big_e[0][100] = b'#';
    big_e[1][70_000] = b'#';
    let by = [Some(go(11)), Some(go(11)), Some(GO5)];
    let p = diff_verified(&mk(&big, &by), &mk(&big_e, &by), &DiffOptions::default()).unwrap();
    assert_eq!(recipes(&p), vec![Recipe::Known(go(11)), Recipe::Known(go(11))]);
    let mut only_big = big.clone();
    only_big[1][70_000] = b'#';
    let p = diff_verified(&mk(&big, &by), &mk(&only_big, &by), &DiffOptions::default()).unwrap();
    assert!(matches!(recipes(&p)[..], [Recipe::Preflate(_)]), "{:?}", recipes(&p));
    // ... while Go's level 5 and 6 are found on a large member alone.
    for level in [7, 8] {
        let by = [Some(go(level)); 3];
        let p = diff_verified(&mk(&big, &by), &mk(&only_big, &by), &DiffOptions::default()).unwrap();
        assert_eq!(recipes(&p), vec![Recipe::Known(go(level))]);
    }
    // A first member no known deflater makes rules Go out for the rest of the archive too.
    let by = [None, Some(GO5), Some(GO5)];
    let p = diff_verified(&mk(&t, &by), &mk(&e, &by), &DiffOptions::default()).unwrap();
    assert!(recipes(&p).iter().all(|r| matches!(r, Recipe::Preflate(_))), "{:?}", recipes(&p));
    // With the Go member first: recipe 9; the other writer's member: PREFLATE
    // (and no known deflater tried after it but the archive's last recipe,
    // which the third member matches).
    let by = [Some(GO5), None, Some(GO5)];
    let p = diff_verified(&mk(&t, &by), &mk(&e, &by), &DiffOptions::default()).unwrap();
    assert!(matches!(recipes(&p)[..], [Recipe::Known(GO5), Recipe::Preflate(_), Recipe::Known(GO5)]), "{:?}", recipes(&p));
}
