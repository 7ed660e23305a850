//! ec_patch::sevenzip against the real 7-Zip (`7zz` or `7z`, Debian's 7zip
//! 26.02): the port's output is the member data of `7z a -tzip -mm=Deflate
//! -mx=5` (and -mx=6), byte for byte, on made inputs (empty, tiny,
//! incompressible, very repetitive, text, sizes around the 64 KiB block and
//! the 32 KiB window, several megabytes) and on the shared corpus's parts.
//!
//! 7-Zip is required: without it on PATH these tests fail.

use crate::common;

use std::path::{Path, PathBuf};
use std::process::Command;

/// A scratch folder of this test process.
fn work(name: &str) -> PathBuf {
    let w = std::env::temp_dir().join(format!("ec-sevenzip-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&w);
    std::fs::create_dir_all(&w).unwrap();
    w
}

fn tool() -> &'static str {
    for t in ["7zz", "7z", "7za"] {
        if Command::new(t).arg("i").output().map(|o| o.status.success()).unwrap_or(false) {
            return t;
        }
    }
    panic!("7-Zip (`7zz`, `7z` or `7za`) is not on PATH: install Debian's 7zip");
}

/// 7-Zip's member for `content` at `-mx=level`: (method, member data).
fn member(dir: &Path, content: &[u8], level: u8) -> (u16, Vec<u8>) {
    let file = dir.join("f");
    let out = dir.join("o.zip");
    std::fs::write(&file, content).unwrap();
    let _ = std::fs::remove_file(&out);
    let status = Command::new(tool())
        .args(["a", "-tzip", "-bso0", "-bsp0", "-mm=Deflate", &format!("-mx={level}"), "o.zip", "f"])
        .current_dir(dir)
        .status()
        .unwrap();
    assert!(status.success(), "7z -mx={level} failed");
    let z = std::fs::read(&out).unwrap();
    let l = ec_patch::zip::scan(&z).unwrap();
    let e = &l.entries[0];
    (e.method, z[e.data_offset as usize..(e.data_offset + e.data_len) as usize].to_vec())
}

/// Compares the port with 7-Zip at `level` on `content`; true when 7-Zip
/// deflated it (false: stored).
fn compare(dir: &Path, label: &str, content: &[u8], level: u8) -> bool {
    let (method, data) = member(dir, content, level);
    if method == 0 {
        assert_eq!(data, content, "{label} -mx={level}");
        return false;
    }
    assert_eq!(method, 8);
    let ours = ec_patch::sevenzip::deflate(content, level);
    if ours != data {
        let at = ours.iter().zip(&data).position(|(a, b)| a != b).unwrap_or(ours.len().min(data.len()));
        panic!("{label} ({} B) -mx={level}: 7z {} B, ours {} B, first difference at byte {at}", content.len(), data.len(), ours.len());
    }
    assert!(ec_patch::sevenzip::matches(content, level, &data), "{label} -mx={level}");
    true
}

fn xorshift(n: usize, mut x: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

#[test]
fn the_port_is_7zip_on_made_inputs() {
    let dir = work("made");
    let text = common::document_xml(40_000, 3);
    let mut mixed = text[..100_000].to_vec();
    mixed.extend(xorshift(50_000, 7));
    mixed.extend(&text[..200_000]);
    mixed.extend(vec![b'x'; 70_000]);
    mixed.extend(&text[text.len() - 200_000..]);
    let sparse: Vec<u8> = (0..300_000u32).map(|i| b"abcdefgh"[((i * i + i / 7) % 8) as usize]).collect();
    let mut inputs: Vec<(String, Vec<u8>)> = vec![
        ("empty".into(), Vec::new()),
        ("one byte".into(), b"a".to_vec()),
        ("abcabc".into(), b"abcabcabcabcabcabcabcabcabcabcabcabcabcabc".to_vec()),
        ("random 100".into(), xorshift(100, 1)),
        ("random 2 MB".into(), xorshift(2_000_000, 2)),
        ("zeros 300k".into(), vec![0; 300_000]),
        ("ab 2 MB".into(), b"ab".repeat(1_000_000)),
        ("sparse".into(), sparse),
        ("mixed".into(), mixed),
        ("text 100k".into(), text[..100_000].to_vec()),
        ("text 2 MB".into(), text.repeat(1 + 2_000_000 / text.len())),
        // Matches at the window's edge: 32768 back is in, 32769 is not.
        ("random 32767 twice".into(), xorshift(32_767, 3).repeat(2)),
        ("random 32768 twice".into(), xorshift(32_768, 4).repeat(3)),
        ("random 32769 twice".into(), xorshift(32_769, 5).repeat(2)),
        // Runs longer than 258 after literals; a 10 MB document.
        ("runs".into(), (0..400_000u32).map(|i| if (i / 1000) % 3 == 0 { (i % 7) as u8 } else { b'z' }).collect()),
        ("text 10 MB".into(), text.repeat(1 + 10_000_000 / text.len())),
    ];
    for n in [32_768usize, 32_769, 60_923, 60_924, 65_535, 65_536, 65_537, 131_072 + 5] {
        inputs.push((format!("text {n}"), text[..n].to_vec()));
    }
    let mut deflated = 0;
    for (label, content) in &inputs {
        deflated += usize::from(compare(&dir, label, content, 5));
    }
    assert!(compare(&dir, "text 100k", &text[..100_000], 6));
    assert!(deflated >= inputs.len() - 5, "{deflated}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_port_is_7zip_on_the_corpus_parts() {
    let dir = work("corpus");
    let (mut parts, mut deflated) = (0, 0);
    common::for_each_corpus_part(&["docx", "xlsx", "pptx", "odt", "ods", "odp"], |label, content| {
        // 7z takes about 20 ms a part: every fourth part.
        if parts % 4 == 0 {
            deflated += usize::from(compare(&dir, label, content, 5));
        }
        parts += 1;
    });
    assert!(parts > 200 && deflated > parts / 8, "{parts} parts, {deflated} deflated members compared");
    eprintln!("{parts} parts, {deflated} deflated members compared");
    std::fs::remove_dir_all(&dir).unwrap();
}
