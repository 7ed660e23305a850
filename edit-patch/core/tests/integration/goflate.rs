//! ec_patch::goflate against Go's compress/flate itself: the tests build the Go
//! program in tests/goflate/ (once per test binary, under the cargo target
//! dir) and compare outputs byte for byte. Go is required: without `go` on
//! PATH the tests fail (scripts/setup-system installs golang-go).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use crate::common;

use common::go_build;
use ec_patch::goflate::{deflate, matches, Writer};

const LEVELS: [i32; 12] = [-2, -1, 0, 1, 2, 3, 4, 5, 6, 7, 8, 9];

fn go_ref() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| go_build(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/goflate"), "goflate-ref"))
}

fn run_with_stdin(mut cmd: Command, input: &[u8]) -> Vec<u8> {
    let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).spawn().unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let feeder = std::thread::spawn(move || {
        stdin.write_all(&input).unwrap();
    });
    let out = child.wait_with_output().unwrap();
    feeder.join().unwrap();
    assert!(out.status.success(), "Go reference failed");
    out.stdout
}

/// Go's flate.NewWriter(level) + Write in `chunk`-byte calls (0 = one) + Close.
fn go_deflate(data: &[u8], level: i32, chunk: usize) -> Vec<u8> {
    let mut cmd = Command::new(go_ref());
    cmd.arg("deflate").arg(level.to_string()).arg(chunk.to_string());
    run_with_stdin(cmd, data)
}

fn shared() -> PathBuf {
    std::env::var_os("EC_SHARED").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"))
}

/// The uncompressed members of a ZIP: (name, content, method, compressed bytes).
fn members(zip: &[u8]) -> Vec<(String, Vec<u8>, u16, Vec<u8>)> {
    let layout = ec_patch::zip::scan(zip).expect("zip");
    let mut out = Vec::new();
    for e in &layout.entries {
        let raw = zip[e.data_offset as usize..(e.data_offset + e.data_len) as usize].to_vec();
        let content = match e.method {
            0 => raw.clone(),
            8 => miniz_oxide::inflate::decompress_to_vec(&raw).expect("inflate"),
            _ => continue,
        };
        out.push((String::from_utf8_lossy(&e.name).into_owned(), content, e.method, raw));
    }
    out
}

/// A member of a corpus document.
fn corpus_part(doc: &str, name: &str) -> Vec<u8> {
    let path = shared().join("corpus/real").join(doc);
    let zip = std::fs::read(&path).unwrap_or_else(|e| panic!("corpus file {}: {e}", path.display()));
    members(&zip).into_iter().find(|m| m.0 == name).unwrap_or_else(|| panic!("{name} not in {doc}")).1
}

/// Corpus parts from different producers, one over 1 MB.
const PARTS: [(&str, &str); 5] = [
    ("docx/word2010-win_bug59058.docx", "word/document.xml"),       // Word 2010, 1.35 MB
    ("xlsx/gnumeric_issue_174.xlsx", "xl/worksheets/sheet1.xml"),   // Gnumeric, 1.5 MB
    ("odt/msword2013_BigTable.odt", "content.xml"),                 // Word 2013 ODF, 250 KB
    ("xlsx/flexcel_issue.3654c.xlsx", "xl/worksheets/sheet1.xml"),  // FlexCel, 160 KB
    ("docx/libreoffice7.1-win_conversion.docx", "word/styles.xml"), // LibreOffice
];

fn xorshift(n: usize, mut seed: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(n);
    while v.len() < n {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.extend_from_slice(&seed.to_le_bytes());
    }
    v.truncate(n);
    v
}

/// XML-like text with many matches at all distances.
fn words(n: usize, seed: u64) -> Vec<u8> {
    const W: [&str; 16] = [
        "<w:r>",
        "<w:t>",
        "</w:t>",
        "</w:r>",
        "hello",
        " world",
        "<c r=\"A1\" s=\"3\">",
        "<v>",
        "</v>",
        "</c>",
        "\n",
        "  ",
        "lorem",
        "ipsum",
        "&amp;",
        "<row r=\"17\">",
    ];
    let r = xorshift(n, seed);
    let mut v = Vec::with_capacity(n + 32);
    let mut i = 0;
    while v.len() < n {
        let x = r[i % r.len()];
        i += 1;
        if x & 0xe0 == 0 {
            v.push(b'0' + x % 10);
        } else {
            v.extend_from_slice(W[(x & 15) as usize].as_bytes());
        }
    }
    v.truncate(n);
    v
}

fn check(label: &str, data: &[u8], level: i32) {
    let want = go_deflate(data, level, 0);
    let got = deflate(data, level);
    if got != want {
        let first = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!(
            "{label} ({} bytes) level {level}: {} bytes from Rust, {} from Go, first difference at byte {first}",
            data.len(),
            got.len(),
            want.len()
        );
    }
    assert!(matches(data, level, &want), "{label} level {level}: matches() false on Go's own output");
}

#[test]
fn small_and_degenerate_inputs_every_level() {
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("1 byte", vec![b'x']),
        ("16 bytes", b"0123456789abcdef".to_vec()),
        ("17 bytes", b"0123456789abcdefg".to_vec()),
        ("127 bytes", words(127, 1)),
        ("128 bytes", words(128, 2)),
        ("300 bytes", words(300, 3)),
        ("4 KiB of one byte", vec![b'a'; 4096]),
        ("5 MB of one byte", vec![0u8; 5 << 20]),
        ("random 300 KB (stored blocks)", xorshift(300_000, 7)),
        ("random then text", [xorshift(70_000, 9), words(70_000, 9)].concat()),
    ];
    for (label, data) in &inputs {
        for level in LEVELS {
            check(label, data, level);
        }
    }
}

#[test]
fn four_byte_matches_around_distance_4096() {
    // Go takes a 4-byte match only within 4096 bytes.
    for dist in [4095usize, 4096, 4097] {
        // 16 letters: Huffman-compressible (not a stored block), few chance matches.
        let mut data: Vec<u8> = xorshift(12_000, dist as u64).iter().map(|b| b'a' + (b & 15)).collect();
        for k in 0..20 {
            let from = 200 + k * 300;
            let (src, dst) = (from, from + dist);
            let copy: Vec<u8> = data[src..src + 4].to_vec();
            data[dst..dst + 4].copy_from_slice(&copy);
            data[dst + 4] = b'a' + ((data[src + 4] - b'a' + 1) & 15);
        }
        for level in LEVELS {
            check(&format!("4-byte repeats at distance {dist}"), &data, level);
        }
    }
}

#[test]
fn window_and_block_boundaries_every_level() {
    for n in [32767, 32768, 32769, 65273, 65274, 65535, 65536, 65537, 131072, (1 << 20) - 1, 1 << 20, (1 << 20) + 1] {
        let data = words(n, n as u64);
        for level in LEVELS {
            check(&format!("text of {n} bytes"), &data, level);
        }
    }
    // Stored-block sizes around the 65535-byte block of levels 0, 1 and -2.
    for n in [65535, 65536, 131070, 131071] {
        let data = xorshift(n, 3);
        for level in LEVELS {
            check(&format!("random {n} bytes"), &data, level);
        }
    }
}

#[test]
fn corpus_parts_every_level() {
    for (doc, name) in PARTS {
        let data = corpus_part(doc, name);
        for level in LEVELS {
            check(&format!("{doc}:{name}"), &data, level);
        }
    }
}

#[test]
fn past_16_mib_hash_offset_renormalisation() {
    // 28 MB: the hash offset passes 1 << 24 and is rebased.
    let data = corpus_part("ods/lotus-symphony3_spreadsheet1.ods", "content.xml");
    assert!(data.len() > 1 << 24);
    for level in [1, 5, 6] {
        check("lotus-symphony3 content.xml", &data, level);
    }
}

#[test]
fn output_does_not_depend_on_write_chunking() {
    let part = corpus_part(PARTS[2].0, PARTS[2].1);
    let inputs = [part, words(200_000, 11), xorshift(140_000, 5)];
    for data in &inputs {
        for level in LEVELS {
            let one = go_deflate(data, level, 0);
            for chunk in [1usize, 7, 4096, 32 * 1024, 65536] {
                if chunk == 1 && data.len() > 300_000 {
                    continue;
                }
                assert_eq!(go_deflate(data, level, chunk), one, "Go, level {level}, {chunk}-byte writes");
                let mut w = Writer::new(level).unwrap();
                for c in data.chunks(chunk) {
                    w.write(c);
                }
                assert_eq!(w.finish(), one, "Rust Writer, level {level}, {chunk}-byte writes");
            }
        }
    }
}

#[test]
fn archive_zip_members_are_level_5() {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("goflate-zip");
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    let mut contents = Vec::new();
    for (i, (doc, name)) in PARTS.iter().enumerate() {
        let data = corpus_part(doc, name);
        let f = dir.join(format!("part{i}.xml"));
        std::fs::write(&f, &data).unwrap();
        files.push(f);
        contents.push(data);
    }
    for (i, data) in [Vec::new(), b"x".to_vec(), vec![7u8; 100_000]].into_iter().enumerate() {
        let f = dir.join(format!("synthetic{i}.bin"));
        std::fs::write(&f, &data).unwrap();
        files.push(f);
        contents.push(data);
    }
    let out = dir.join("go.zip");
    let status = Command::new(go_ref()).arg("zip").arg(&out).args(&files).status().unwrap();
    assert!(status.success());
    let zip = std::fs::read(&out).unwrap();
    let ms = members(&zip);
    assert_eq!(ms.len(), contents.len());
    for ((name, content, method, raw), want) in ms.iter().zip(&contents) {
        assert_eq!(content, want, "{name}");
        assert_eq!(*method, 8, "{name}");
        assert!(deflate(content, 5) == *raw, "{name}: archive/zip member differs from deflate(content, 5)");
        assert!(matches(content, 5, raw), "{name}");
        if content.len() > 1000 {
            assert!(!matches(content, 6, raw) || deflate(content, 6) == *raw, "{name}");
        }
    }
}

#[test]
fn rezip_go_experiment_members_are_level_5() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let bin = go_build(&root.join("experiments/bench/rezip/go"), "rezip-go");
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("goflate-rezip");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(dir.join("doc")).unwrap();
    let mut list = String::new();
    let mut n = 0;
    for doc in ["docx/word2010-win_bug59058.docx", "xlsx/gnumeric_issue_174.xlsx"] {
        let zip = std::fs::read(shared().join("corpus/real").join(doc)).unwrap();
        for (name, content, _, _) in members(&zip) {
            if name.ends_with('/') || name.contains("..") {
                continue;
            }
            let name = format!("d{n}/{name}");
            let path = dir.join("doc").join(&name);
            std::fs::create_dir_all(path.parent().unwrap()).unwrap();
            std::fs::write(&path, &content).unwrap();
            list.push_str(&format!("8\t1600000000\t{name}\n"));
        }
        n += 1;
    }
    std::fs::write(dir.join("list"), &list).unwrap();
    let out = dir.join("out.zip");
    let status = Command::new(&bin).arg(dir.join("list")).arg(dir.join("doc")).arg(&out).status().unwrap();
    assert!(status.success(), "rezip-go failed");
    let zip = std::fs::read(&out).unwrap();
    let ms = members(&zip);
    assert!(ms.len() > 10);
    for (name, content, method, raw) in &ms {
        assert_eq!(*method, 8, "{name}");
        assert!(deflate(content, 5) == *raw, "{name}: rezip-go member differs from deflate(content, 5)");
    }
}

#[test]
fn matches_rejects_other_streams() {
    let data = words(100_000, 42);
    let want = deflate(&data, 6);
    assert!(matches(&data, 6, &want));
    assert!(matches(&data, -1, &want));
    assert!(!matches(&data, 5, &want) || deflate(&data, 5) == want);
    assert!(!matches(&data, 6, &want[..want.len() - 1]));
    assert!(!matches(&data, 6, &[want.as_slice(), &[0]].concat()));
    let mut bad = want.clone();
    bad[want.len() / 2] ^= 1;
    assert!(!matches(&data, 6, &bad));
    assert!(!matches(&data, 6, &[]));
    assert!(!matches(&data, 10, &want));
    assert!(deflate(&data, 10).is_empty());
    assert!(deflate(&data, -3).is_empty());
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(32))]
    /// Any input, any level, any chunking: no panic, the stream inflates back,
    /// and the chunked Writer gives the same bytes as deflate().
    #[test]
    fn any_input_round_trips(
        seed in proptest::prelude::any::<u64>(),
        len in 0usize..150_000,
        alphabet in 1u8..=255,
        chunk in 1usize..70_000,
    ) {
        let data: Vec<u8> = xorshift(len, seed | 1).iter().map(|b| b % alphabet).collect();
        for level in LEVELS {
            let out = deflate(&data, level);
            let back = miniz_oxide::inflate::decompress_to_vec(&out).expect("inflates");
            proptest::prop_assert_eq!(&back, &data);
            let mut w = Writer::new(level).unwrap();
            for c in data.chunks(chunk) {
                w.write(c);
            }
            proptest::prop_assert!(w.finish() == out);
            proptest::prop_assert!(matches(&data, level, &out));
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(16))]
    /// Random inputs of random size and entropy, every level, against Go.
    #[test]
    fn random_inputs_against_go(
        seed in proptest::prelude::any::<u64>(),
        len in 0usize..300_000,
        alphabet in 1u8..=255,
    ) {
        let data: Vec<u8> = xorshift(len, seed | 1).iter().map(|b| b % alphabet).collect();
        for level in LEVELS {
            check(&format!("random (alphabet {alphabet})"), &data, level);
        }
    }
}
