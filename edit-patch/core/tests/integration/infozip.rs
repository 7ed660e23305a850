//! ec_patch::infozip and recipe 10, INFO_ZIP (edit-patch-v2.md §3.6),
//! against the real `zip` binary (Info-ZIP Zip 3.0, Debian's zip 3.0-13):
//! - the port's output is zip's member data, byte for byte, at every level
//!   zip deflates at (1 to 9), on made inputs (empty, tiny, incompressible,
//!   very repetitive, text, mixed, sizes around the 64 KiB window and its
//!   slides, several megabytes) and on the shared corpus's parts;
//! - documents re-zipped by `zip` (as testbed/rezip.py does) get recipe 10
//!   for every deflated member from the diff's search, and a one-word edit
//!   in 300 KB of text costs under 1,000 bytes;
//! - recipe 10 on the wire: levels 0 and 10 up, version byte 1, a PNG inner
//!   recipe, a declared size that does not fit are typed errors.
//!
//! `zip` is required: without it on PATH these tests fail (scripts/setup-system
//! installs it).

use crate::common;

use common::{members, recipes, with_recipe};

use ec_patch::deflaters::{Deflater, KnownDeflate};
use ec_patch::{apply_to_vec, decode, diff, diff_verified, encode, DiffOptions, Limits, Recipe};
use std::path::{Path, PathBuf};
use std::process::Command;

fn izip(level: u8) -> KnownDeflate {
    KnownDeflate { deflater: Deflater::InfoZip, level }
}

/// A scratch folder of this test process.
fn work(name: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ec-infozip-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).unwrap();
    w
}

fn zip_tool() -> &'static str {
    let ok = Command::new("zip").arg("-v").output().map(|o| o.status.success()).unwrap_or(false);
    assert!(ok, "`zip` (Info-ZIP) is not on PATH: scripts/setup-system installs it");
    "zip"
}

/// zip's member for `content` at `level`: (method, member data).
fn zip_member(dir: &Path, content: &[u8], level: u8) -> (u16, Vec<u8>) {
    let file = dir.join("f");
    let out = dir.join("o.zip");
    std::fs::write(&file, content).unwrap();
    let _ = std::fs::remove_file(&out);
    let status = Command::new(zip_tool()).args(["-q", "-X", "-j", &format!("-{level}")]).arg(&out).arg(&file).status().unwrap();
    assert!(status.success(), "zip -{level} failed");
    let z = std::fs::read(&out).unwrap();
    let l = ec_patch::zip::scan(&z).unwrap();
    let e = &l.entries[0];
    (e.method, z[e.data_offset as usize..(e.data_offset + e.data_len) as usize].to_vec())
}

/// Compares the port with zip at `levels` on `content`; returns how many
/// members zip deflated (the others it stored).
fn compare(dir: &Path, label: &str, content: &[u8], levels: impl IntoIterator<Item = u8>) -> usize {
    let mut deflated = 0;
    for level in levels {
        let (method, data) = zip_member(dir, content, level);
        if method == 0 {
            // zip stores what does not shrink (one block no longer stored).
            assert_eq!(data, content, "{label} -{level}");
            continue;
        }
        assert_eq!(method, 8);
        let ours = ec_patch::infozip::deflate(content, level);
        if ours != data {
            let at = ours.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(ours.len().min(data.len()));
            panic!("{label} ({} B) -{level}: zip {} B, ours {} B, first difference at {at}", content.len(), data.len(), ours.len());
        }
        assert!(ec_patch::infozip::matches(content, level, &data), "{label} -{level}");
        deflated += 1;
    }
    deflated
}

#[test]
fn the_port_is_zip_at_every_level_on_made_inputs() {
    let dir = work("made");
    let text = common::document_xml(40_000, 3);
    let mut inputs: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), Vec::new()),
        ("one byte".into(), b"a".to_vec()),
        ("abcabc".into(), b"abcabcabcabcabc".to_vec()),
        ("random 100".into(), common::xorshift_bytes(100, 1)),
        ("random 300k".into(), common::xorshift_bytes(300_000, 2)),
        ("zeros 300k".into(), vec![0; 300_000]),
        ("ab 200k".into(), b"ab".repeat(100_000)),
        ("text 2 MB".into(), text.repeat(1 + 2_000_000 / text.len())),
    ];
    inputs.extend(common::deflater_edge_inputs(&text));
    // Around the window (64 KiB), its slide (at 65274 with < 262 ahead) and
    // the first read.
    for n in [65_535usize, 65_536, 65_537, 65_274, 65_536 + 262, 98_304, 131_072 + 5] {
        inputs.push((format!("text {n}"), text[..n].to_vec()));
    }
    let mut deflated = 0;
    for (label, content) in &inputs {
        deflated += compare(&dir, label, content, 1..=9);
    }
    // All but the three tiny inputs (stored by zip at every level).
    assert!(deflated >= (inputs.len() - 4) * 9, "{deflated}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_port_is_zip_on_the_corpus_parts() {
    let dir = work("corpus");
    let (mut parts, mut deflated) = (0, 0);
    common::for_each_corpus_part(&["docx", "xlsx", "pptx", "odt", "ods", "odp"], |label, content| {
        // zip's default on every part, every level on every sixteenth (all
        // levels on all 2,400 parts: about 100 s).
        let levels: Vec<u8> = if parts % 16 == 0 { (1..=9).collect() } else { vec![6] };
        deflated += compare(&dir, label, content, levels);
        parts += 1;
    });
    assert!(parts > 200 && deflated > parts, "{parts} parts, {deflated} deflated members compared");
    eprintln!("{parts} parts, {deflated} deflated members compared");
    std::fs::remove_dir_all(&dir).unwrap();
}

/// Re-zips `ms` with zip as testbed/rezip.py does: names in order, the
/// stored members (ODF's mimetype) in runs of their own at -0, the rest at `-level`.
fn rezip(ms: &[(String, bool, Vec<u8>)], level: u8, name: &str) -> Vec<u8> {
    let w = work(name);
    let dir = w.join("d");
    let out = w.join("out.zip");
    for (deflated, names) in common::unpack_in_runs(ms, &dir) {
        let l = if deflated { format!("-{level}") } else { "-0".into() };
        let status = Command::new(zip_tool()).args(["-q", "-X", &l]).arg(&out).args(names).current_dir(&dir).status().unwrap();
        assert!(status.success(), "zip failed");
    }
    let z = std::fs::read(&out).unwrap();
    std::fs::remove_dir_all(&w).unwrap();
    z
}

/// Every deflated member of documents re-zipped by zip gets recipe 10 at
/// zip's level, or recipe 1 where zlib makes the same bytes (zip's small
/// members, whose block ends where zlib's does).
#[test]
fn documents_rezipped_by_zip_get_recipe_10_or_zlib() {
    let corpus = common::corpus();
    let mut known = 0;
    for (doc, level) in [
        ("odt/msword2013_BigTable.odt", 6u8),
        ("xlsx/flexcel_issue.3654c.xlsx", 9),
        ("docx/word2016-win_example.docx", 1),
        ("docx/word2010-win_bug59058.docx", 6),
        ("odt/odfdo_collection.odt", 6),
    ] {
        let original = std::fs::read(corpus.join(doc)).unwrap();
        let ms = members(&original);
        let zip = rezip(&ms, level, "doc");
        let patch = diff_verified(&original, &zip, &DiffOptions::default()).unwrap();
        assert_eq!(apply_to_vec(&original, &patch, &Limits::default()).unwrap(), zip);
        let l = ec_patch::zip::scan(&zip).unwrap();
        let deflated = l.entries.iter().filter(|e| e.method == 8).count();
        // (Members whose bytes did not change are copied, without a recipe.)
        let rs: Vec<Recipe> = recipes(&patch).into_iter().filter(|r| !matches!(r, Recipe::Stored)).collect();
        assert!(rs.len() <= deflated, "{doc}: {rs:?}");
        let ours = |r: &Recipe| match r {
            Recipe::Known(k) => *k == izip(level),
            Recipe::Zlib(p) => (p.window_bits, p.strategy) == (15, 0),
            _ => false,
        };
        assert!(rs.iter().all(ours), "{doc} -{level}: {rs:?}");
        known += rs.iter().filter(|r| matches!(r, Recipe::Known(_))).count();
    }
    // (A member of few symbols, such as msword2013_BigTable.odt's 250 kB
    // content.xml, is one block in both, and zlib's.)
    assert!(known >= 4, "{known} members needed recipe 10");
}

#[test]
fn a_one_word_edit_of_300_kb_of_text_rezipped_by_zip_costs_under_1000_bytes() {
    let corpus = common::corpus();
    for doc in ["docx/word2016-win_example.docx", "odt/odfdo_collection.odt"] {
        let part = if doc.ends_with(".docx") { "word/document.xml" } else { "content.xml" };
        let mut real = members(&std::fs::read(corpus.join(doc)).unwrap());
        let xml = common::document_xml(52_000, 11);
        assert!(xml.len() > 300_000, "{} bytes of text", xml.len());
        let mut edited = xml.clone();
        let mid = (xml.len() / 2..xml.len()).find(|&i| edited[i..i + 5].iter().all(u8::is_ascii_lowercase)).unwrap();
        edited[mid..mid + 5].copy_from_slice(b"xyzzy");
        real.iter_mut().find(|m| m.0 == part).expect("the text part").2 = xml;
        let base = rezip(&real, 6, "base");
        real.iter_mut().find(|m| m.0 == part).unwrap().2 = edited;
        let new = rezip(&real, 6, "new");
        let patch = diff_verified(&base, &new, &DiffOptions::default()).unwrap();
        assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
        assert_eq!(patch[4], 2, "{doc}: a version 2 patch");
        assert_eq!(recipes(&patch), vec![Recipe::Known(izip(6))], "{doc}");
        assert!(patch.len() < 1000, "{doc}: {} bytes", patch.len());
        eprintln!("{doc}: version 2 patch {} B", patch.len());
        // Limited to version 1: no recipe 10, and it applies.
        let v1 = DiffOptions { max_version: Some(1), ..Default::default() };
        let old = diff_verified(&base, &new, &v1).unwrap();
        assert_eq!(old[4], 1, "{doc}");
        assert!(!recipes(&old).iter().any(|r| matches!(r, Recipe::Known(_))));
        assert_eq!(apply_to_vec(&base, &old, &Limits::default()).unwrap(), new);
        eprintln!("{doc}: version 1 patch {} B", old.len());
        assert!(old.len() > patch.len());
    }
}

/// A pair of ZIPs of a small part (20 kB) and a large one (600 kB of
/// text, more symbols than one zlib block holds), both deflated by recipe
/// `k`, one byte of each changed.
fn pair(k: KnownDeflate) -> (Vec<u8>, Vec<u8>) {
    let texts = [common::document_xml(3000, 8), common::document_xml(100_000, 5)];
    let zip_of = |edit: bool| {
        let t: Vec<Vec<u8>> = texts
            .iter()
            .map(|x| {
                let mut x = x.clone();
                if edit {
                    let mid = x.len() / 2;
                    x[mid] = b'#';
                }
                x
            })
            .collect();
        let d = |x: &[u8]| Some(ec_patch::deflaters::deflate(x, k, u64::MAX).unwrap());
        let ms = [common::Member::new(b"word/styles.xml", t[0].clone()), common::Member::new(b"word/document.xml", t[1].clone())];
        common::zip_with_data(&ms, &[d(&t[0]), d(&t[1])])
    };
    (zip_of(false), zip_of(true))
}

#[test]
fn recipe_10_on_the_wire() {
    // Every level, on the large member as on the small one.
    for level in 1..=9 {
        let k = izip(level);
        let (base, new) = pair(k);
        let bytes = encode(&diff(&base, &new, &DiffOptions::default()).unwrap());
        let rs = recipes(&bytes);
        assert_eq!(rs.len(), 2);
        // zlib makes zip's bytes where their blocks end alike (memory level
        // 9: zlib's blocks of 32767 symbols, zip's at levels 1-2, and at 3-9
        // where ct_tally's estimate never ends one), at zip's level or at
        // one whose parameters act alike on the text (zip -8 as zlib -9).
        let zlib_or_zip = |r: &Recipe| matches!(r, Recipe::Known(x) if *x == k) || matches!(r, Recipe::Zlib(_));
        assert!(rs.iter().all(zlib_or_zip), "{k:?}: {rs:?}");
        if level == 6 {
            assert_eq!(rs[1], Recipe::Known(k), "{k:?}: {rs:?}");
        }
        assert!(bytes.len() < 400, "{k:?}: {} B", bytes.len());
        assert_eq!(apply_to_vec(&base, &bytes, &Limits::default()).unwrap(), new);
        if rs.iter().any(|r| matches!(r, Recipe::Known(_))) {
            assert_eq!(bytes[4], 2);
            let mut v1 = bytes.clone();
            v1[4] = 1;
            assert_eq!(decode(&v1, &Limits::default()).unwrap_err().code(), "malformed");
        } else {
            // Nothing of version 2 but the base hash prefix: the version 1 patch with it.
            let v1 = encode(&diff(&base, &new, &DiffOptions { max_version: Some(1), ..Default::default() }).unwrap());
            assert_eq!(bytes, common::with_base_prefix(&v1), "the lowest-version rule");
        }
    }

    let (base, new) = pair(izip(6));
    // Both members with recipe 10 (the first may have been found as zlib's).
    let p = with_recipe(&diff(&base, &new, &DiffOptions::default()).unwrap(), Recipe::Known(izip(6)));
    let a = encode(&p);
    assert_eq!(apply_to_vec(&base, &a, &Limits::default()).unwrap(), new);
    let b = encode(&with_recipe(&p, Recipe::Known(KnownDeflate { deflater: Deflater::MinizOxide, level: 6 })));
    let diffs: Vec<usize> = (0..a.len()).filter(|&i| a[i] != b[i]).collect();
    assert_eq!(diffs.len(), 2, "the two members' tags: {diffs:?}");
    let at = diffs[1];
    assert_eq!((a[at], a[at + 1]), (10, 6), "tag 10, level 6");
    let code = |bytes: &[u8]| apply_to_vec(&base, bytes, &Limits::default()).unwrap_err().code();
    for level in [0u8, 10, 11, 128, 255] {
        let mut v = a.clone();
        v[at + 1] = level;
        let err = decode(&v, &Limits::default()).unwrap_err();
        let msg = err.to_string();
        assert!(msg.contains("level") && msg.contains("1 to 9"), "{msg}");
        assert!(
            matches!(err, ec_patch::PatchError::Malformed { what: "deflater level", offset, .. } if offset == at + 1),
            "the level byte's offset ({}): {msg}",
            at + 1
        );
        assert_eq!(code(&v), "malformed");
    }
    assert_eq!(decode(&a[..at + 1], &Limits::default()).unwrap_err().code(), "truncated");
    for level in 1..=9u8 {
        let v = encode(&with_recipe(&p, Recipe::Known(izip(level))));
        assert!(decode(&v, &Limits::default()).is_ok());
        if ec_patch::infozip::deflate(&new_content(&new), level) != ec_patch::infozip::deflate(&new_content(&new), 6) {
            assert!(["malformed", "target_mismatch"].contains(&code(&v)), "level {level}");
        }
    }
    let mut q = p.clone();
    q.target_size = 200;
    assert_eq!(apply_to_vec(&base, &encode(&q), &Limits::default()).unwrap_err().code(), "malformed");
    let frame = ec_patch::png::PngFrame { head_len: 0, tail_len: 0, chunk_size: 8192, first_chunk: 8192, zlib_header: [0x78, 0x9c] };
    let png = encode(&with_recipe(&p, Recipe::Png { frame, inner: Box::new(Recipe::Known(izip(6))) }));
    let err = decode(&png, &Limits::default()).unwrap_err();
    assert_eq!(err.code(), "malformed");
    assert!(err.to_string().contains("inner recipe"), "{err}");
}

/// The large member's content of a [`pair`]'s file.
fn new_content(zip: &[u8]) -> Vec<u8> {
    members(zip).remove(1).2
}
