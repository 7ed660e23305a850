//! Recipes 7 and 8 (edit-patch-v2.md §3) against the real writer they
//! reproduce: Rust's flate2 `write::DeflateEncoder`, with its default
//! backend (miniz_oxide) and with `zlib-rs`. flate2 can have one backend per
//! build, so the test builds the project's flate2 ZIP writer
//! (experiments/bench/rezip/rust, the one `byte_goals.py` uses) once per
//! backend, re-zips real documents of the shared corpus with it, and checks:
//! - every deflated member it wrote is what `ec_patch::deflaters` makes of
//!   the member's content (the crate call equals flate2's writer);
//! - a one-word edit of a document with 300 KB of text gives a version 2
//!   patch under 1,000 bytes that applies byte for byte; limited to version
//!   1, the same diff makes a version 1 patch (PREFLATE) that applies too.

use crate::common;

use common::{members, recipes, repo, synthetic, with_recipe};

use ec_patch::deflaters::{Deflater, KnownDeflate};
use ec_patch::{apply_to_vec, decode, diff, diff_verified, encode, DiffOptions, Limits, Recipe};
use std::path::{Path, PathBuf};
use std::process::Command;

/// Builds the flate2 re-zipper with `backend` ("miniz" or "zlib-rs") into
/// target/rezip/<backend>, as byte_goals.py does; returns the binary.
fn rezipper(backend: &str) -> PathBuf {
    let target = repo().join("target/rezip").join(backend);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let status = Command::new(cargo)
        .args(["build", "--quiet", "--release", "--manifest-path"])
        .arg(repo().join("experiments/bench/rezip/rust/Cargo.toml"))
        .arg("--target-dir")
        .arg(&target)
        .args(["--no-default-features", "--features", backend])
        .status()
        .expect("run cargo");
    assert!(status.success(), "building the flate2 re-zipper ({backend}) failed");
    target.join("release/rezip-flate2")
}

/// Writes `members` as a ZIP with the re-zipper `tool` (its deflated members
/// come from flate2 at `Compression::default()`).
fn rezip(tool: &Path, members: &[(String, bool, Vec<u8>)], work: &Path) -> Vec<u8> {
    let _ = std::fs::remove_dir_all(work);
    let dir = work.join("d");
    std::fs::create_dir_all(&dir).unwrap();
    let mut list = String::new();
    for (name, deflated, content) in members {
        list.push_str(&format!("{}\t1700000000\t{name}\n", if *deflated { 8 } else { 0 }));
        if !name.ends_with('/') {
            let p = dir.join(name);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
    }
    std::fs::write(work.join("list"), list).unwrap();
    let out = work.join("out.zip");
    let status = Command::new(tool).arg(work.join("list")).arg(&dir).arg(&out).status().unwrap();
    assert!(status.success());
    let zip = std::fs::read(&out).unwrap();
    std::fs::remove_dir_all(work).unwrap();
    zip
}

fn work_dir(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("ec-flate2-{}-{name}", std::process::id()))
}

const BACKENDS: [(&str, Deflater); 2] = [("miniz", Deflater::MinizOxide), ("zlib-rs", Deflater::ZlibRs)];

/// A real document with its word/document.xml (or content.xml) replaced by
/// `xml`.
fn with_text(doc: &[(String, bool, Vec<u8>)], part: &str, xml: &[u8]) -> Vec<(String, bool, Vec<u8>)> {
    let mut d = doc.to_vec();
    let m = d.iter_mut().find(|m| m.0 == part).expect("the text part");
    m.2 = xml.to_vec();
    d
}

#[test]
fn flate2s_writer_is_what_the_recipes_make_on_real_documents() {
    let corpus = common::corpus();
    let docs = ["docx/word2016-win_example.docx", "docx/python-docx_grid_offset_error.docx", "odt/odfdo_collection.odt", "xlsx", "pptx"];
    let mut paths: Vec<PathBuf> = Vec::new();
    for d in docs {
        let p = corpus.join(d);
        if p.is_dir() {
            let mut v: Vec<PathBuf> = std::fs::read_dir(&p).unwrap().flatten().map(|e| e.path()).collect();
            v.sort();
            paths.extend(v.into_iter().take(2));
        } else {
            paths.push(p);
        }
    }
    for (backend, deflater) in BACKENDS {
        let tool = rezipper(backend);
        let mut checked = 0;
        for p in &paths {
            let ms = members(&std::fs::read(p).unwrap());
            let zip = rezip(&tool, &ms, &work_dir(&format!("{backend}-members")));
            let l = ec_patch::zip::scan(&zip).unwrap();
            for (e, (name, deflated, content)) in l.entries.iter().zip(&ms) {
                if !deflated {
                    continue;
                }
                let data = &zip[e.data_offset as usize..(e.data_offset + e.data_len) as usize];
                let k = KnownDeflate { deflater, level: 6 };
                let made = ec_patch::deflaters::deflate(content, k, u64::MAX).unwrap();
                assert!(made == data, "{backend}: {} {name}: the recipe's bytes are not flate2's", p.display());
                assert!(ec_patch::deflaters::matches(content, k, data));
                // Another level is not it (a recipe search that stops at level 6 is right).
                if content.len() > 1000 {
                    assert!(!ec_patch::deflaters::matches(content, KnownDeflate { deflater, level: 1 }, data), "{name}");
                }
                checked += 1;
            }
        }
        assert!(checked > 30, "{backend}: {checked} members");
    }
}

#[test]
fn a_one_word_edit_of_300_kb_of_text_rezipped_by_flate2_costs_under_1000_bytes() {
    let corpus = common::corpus();
    let cases = [("docx/word2016-win_example.docx", "word/document.xml"), ("odt/odfdo_collection.odt", "content.xml")];
    for (backend, deflater) in BACKENDS {
        let tool = rezipper(backend);
        for (doc, part) in cases {
            let real = members(&std::fs::read(corpus.join(doc)).unwrap());
            let xml = common::document_xml(52_000, 11);
            assert!(xml.len() > 300_000, "{} bytes of text", xml.len());
            // One word changed in the middle: "xyzzy" for the five letters there.
            let mut edited = xml.clone();
            let mid = (xml.len() / 2..xml.len()).find(|&i| edited[i..i + 5].iter().all(u8::is_ascii_lowercase)).unwrap();
            edited[mid..mid + 5].copy_from_slice(b"xyzzy");
            assert_ne!(edited, xml);
            let base = rezip(&tool, &with_text(&real, part, &xml), &work_dir(&format!("{backend}-base")));
            let new = rezip(&tool, &with_text(&real, part, &edited), &work_dir(&format!("{backend}-new")));

            let patch = diff_verified(&base, &new, &DiffOptions::default()).unwrap();
            assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
            assert_eq!(patch[4], 2, "{backend} {doc}: a version 2 patch");
            let rs = recipes(&patch);
            assert!(rs.contains(&Recipe::Known(KnownDeflate { deflater, level: 6 })), "{backend} {doc}: {rs:?}");
            assert!(patch.len() < 1000, "{backend} {doc}: {} bytes", patch.len());
            eprintln!("{backend} {doc}: version 2 patch {} B", patch.len());

            // Limited to version 1: the patch version 1 makes (no recipe 7 or 8), which applies.
            let v1 = DiffOptions { max_version: Some(1), ..Default::default() };
            let old = diff_verified(&base, &new, &v1).unwrap();
            assert_eq!(old[4], 1, "{backend} {doc}");
            assert!(!recipes(&old).iter().any(|r| matches!(r, Recipe::Known(_))));
            assert_eq!(apply_to_vec(&base, &old, &Limits::default()).unwrap(), new);
            eprintln!("{backend} {doc}: version 1 patch {} B", old.len());
            assert!(old.len() > patch.len());

            // The same patch unverified is the same bytes.
            assert_eq!(encode(&diff(&base, &new, &DiffOptions::default()).unwrap()), patch);
        }
    }
}

#[test]
fn recipes_7_and_8_on_the_wire() {
    let miniz = KnownDeflate { deflater: Deflater::MinizOxide, level: 6 };
    let zrs = KnownDeflate { deflater: Deflater::ZlibRs, level: 6 };
    // (Some levels make zlib's very bytes on this text, miniz_oxide's 10 and zlib-rs's 9 among
    // them: then zlib's recipe, tried first, is the patch's. These do not.)
    for k in [miniz, zrs, KnownDeflate { deflater: Deflater::MinizOxide, level: 1 }, KnownDeflate { deflater: Deflater::ZlibRs, level: 2 }]
    {
        let (base, new) = synthetic(k);
        let p = diff(&base, &new, &DiffOptions::default()).unwrap();
        let bytes = encode(&p);
        assert_eq!(bytes[4], 2, "{k:?} {:?}", recipes(&bytes));
        assert_eq!(recipes(&bytes), vec![Recipe::Known(k)]);
        assert_eq!(apply_to_vec(&base, &bytes, &Limits::default()).unwrap(), new);
        assert_eq!(ec_patch::min_version(&p), 2);
        // The same patch with version byte 1: malformed (version 1 has no recipe 7 or 8).
        let mut v1 = bytes.clone();
        v1[4] = 1;
        let err = decode(&v1, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), "malformed", "{err}");
        assert_eq!(apply_to_vec(&base, &v1, &Limits::default()).unwrap_err().code(), "malformed");
        // Limited to version 1: PREFLATE, version byte 1.
        let old = encode(&diff(&base, &new, &DiffOptions { max_version: Some(1), ..Default::default() }).unwrap());
        assert_eq!(old[4], 1);
        assert!(matches!(recipes(&old)[..], [Recipe::Preflate(_)]), "{:?}", recipes(&old));
        assert_eq!(apply_to_vec(&base, &old, &Limits::default()).unwrap(), new);
    }

    let (base, new) = synthetic(miniz);
    let p = diff(&base, &new, &DiffOptions::default()).unwrap();
    let a = encode(&p);
    let b = encode(&with_recipe(&p, Recipe::Known(zrs)));
    // The two differ in the recipe tag alone: find it.
    let diffs: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    assert_eq!(a.len(), b.len());
    assert_eq!(diffs.len(), 1, "{diffs:?}");
    let at = diffs[0];
    assert_eq!((a[at], a[at + 1], b[at]), (7, 6, 8));
    let code = |bytes: &[u8]| apply_to_vec(&base, bytes, &Limits::default()).unwrap_err().code();
    // Levels out of range (recipe 9, Go's, takes level bytes 0 to 11; recipe
    // 10, Info-ZIP's, 1 to 9; recipe 12, 7-Zip's, 1 to 6) and the tags after
    // 12 (11 is a PNG recipe, v2 §3.7): malformed.
    for (tag, level) in [(7u8, 11u8), (7, 255), (8, 10), (8, 200), (9, 12), (10, 0), (10, 10), (12, 0), (12, 7)] {
        let mut v = a.clone();
        v[at] = tag;
        v[at + 1] = level;
        let err = decode(&v, &Limits::default()).unwrap_err();
        assert_eq!(err.code(), "malformed", "tag {tag} level {level}: {err}");
        assert!(err.to_string().contains("level"), "{err}");
    }
    for tag in [13u8, 255] {
        let mut v = a.clone();
        v[at] = tag;
        assert_eq!(code(&v), "malformed", "tag {tag}");
    }
    // Cut inside the level byte: truncated.
    assert_eq!(decode(&a[..at + 1], &Limits::default()).unwrap_err().code(), "truncated");
    // A valid level that is not the writer's: refused, as data past the
    // declared target (level 1's is longer) or as a rebuilt file that is not the target.
    assert_eq!(code(&encode(&with_recipe(&p, Recipe::Known(KnownDeflate { level: 1, ..miniz })))), "malformed");
    assert!(["malformed", "target_mismatch"].contains(&code(&b)));
    assert_eq!(code(&encode(&with_recipe(&p, Recipe::Known(KnownDeflate { level: 9, ..miniz })))), "target_mismatch");
    // A declared size the data does not fit: refused as the data is made (no panic, no allocation past it).
    for cut in [1, 100, 1000, new.len() as u64 / 2] {
        let mut q = p.clone();
        q.target_size = new.len() as u64 - cut;
        let e = apply_to_vec(&base, &encode(&q), &Limits::default()).unwrap_err();
        assert!(["malformed", "target_mismatch"].contains(&e.code()), "{e}");
    }
    // Not as a PNG's inner recipe.
    let frame = ec_patch::png::PngFrame { head_len: 0, tail_len: 0, chunk_size: 8192, first_chunk: 8192, zlib_header: [0x78, 0x9c] };
    let png = encode(&with_recipe(&p, Recipe::Png { frame, inner: Box::new(Recipe::Known(miniz)) }));
    let err = decode(&png, &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "malformed");
    assert!(err.to_string().contains("inner recipe"), "{err}");
}

#[test]
fn the_archives_last_deflater_is_tried_first_and_zlib_documents_never_see_the_new_recipes() {
    // Two members from zlib-rs at level 4: both get recipe 8 (the second from the first try).
    let k = KnownDeflate { deflater: Deflater::ZlibRs, level: 4 };
    let t1 = common::document_xml(5000, 1);
    let t2 = common::document_xml(5000, 2);
    let mk = |a: &[u8], b: &[u8]| {
        let d = |t: &[u8]| Some(ec_patch::deflaters::deflate(t, k, u64::MAX).unwrap());
        common::zip_with_data(&[common::Member::new(b"a.xml", a.to_vec()), common::Member::new(b"b.xml", b.to_vec())], &[d(a), d(b)])
    };
    let (mut e1, mut e2) = (t1.clone(), t2.clone());
    e1[100] = b'#';
    e2[200] = b'#';
    let (base, new) = (mk(&t1, &t2), mk(&e1, &e2));
    let patch = diff_verified(&base, &new, &DiffOptions::default()).unwrap();
    assert_eq!(recipes(&patch), vec![Recipe::Known(k), Recipe::Known(k)]);
    // zlib's own members: version 1 patch, zlib recipes, whatever max_version says.
    let z = |t: &[u8]| common::zip(&[common::Member::new(b"a.xml", t.to_vec())]);
    let p2 = diff_verified(&z(&t1), &z(&e1), &DiffOptions::default()).unwrap();
    let p1 = diff_verified(&z(&t1), &z(&e1), &DiffOptions { max_version: Some(1), ..Default::default() }).unwrap();
    assert_eq!(p1[4], 1);
    assert_eq!(p2, common::with_base_prefix(&p1), "the version 1 patch, its base named by a prefix");
}

#[test]
fn a_member_no_known_deflater_makes_rules_them_out_for_the_rest_of_the_archive() {
    // zlib's filtered strategy: no recipe of zlib's search, none of 7 or 8 (PREFLATE).
    let filtered = ec_patch::ZlibParams { strategy: 1, ..common::ZLIB6 };
    let k = KnownDeflate { deflater: Deflater::MinizOxide, level: 6 };
    let t1 = common::document_xml(5000, 3);
    let t2 = common::document_xml(5000, 4);
    let data = |t: &[u8], by_miniz: bool| {
        Some(if by_miniz {
            ec_patch::deflaters::deflate(t, k, u64::MAX).unwrap()
        } else {
            ec_patch::deflate::deflate(t, filtered).unwrap()
        })
    };
    let mk = |a: &[u8], b: &[u8], miniz_first: bool| {
        common::zip_with_data(
            &[common::Member::new(b"a.xml", a.to_vec()), common::Member::new(b"b.xml", b.to_vec())],
            &[data(a, miniz_first), data(b, !miniz_first)],
        )
    };
    let (mut e1, mut e2) = (t1.clone(), t2.clone());
    e1[100] = b'#';
    e2[200] = b'#';
    // miniz_oxide's member first: recipe 7, then the other writer's: PREFLATE.
    let p = diff_verified(&mk(&t1, &t2, true), &mk(&e1, &e2, true), &DiffOptions::default()).unwrap();
    assert!(matches!(recipes(&p)[..], [Recipe::Known(x), Recipe::Preflate(_)] if x == k), "{:?}", recipes(&p));
    // The other way round: the first member rules the known deflaters out, and the second gets PREFLATE too.
    let p = diff_verified(&mk(&t1, &t2, false), &mk(&e1, &e2, false), &DiffOptions::default()).unwrap();
    assert!(matches!(recipes(&p)[..], [Recipe::Preflate(_), Recipe::Preflate(_)]), "{:?}", recipes(&p));
}
