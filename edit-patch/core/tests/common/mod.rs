//! Test helpers: a minimal ZIP writer for synthetic archives (hostile names,
//! descriptors, bombs) and the path of the shared real-document corpus.
#![allow(dead_code)]

use ec_patch::deflate::{deflate, deflate_blocks, ZlibParams, LIBREOFFICE_BLOCK};
use ec_patch::deflaters::KnownDeflate;
use ec_patch::{apply_to_vec, decode, Body, Limits, Recipe, Segment};
use std::path::{Path, PathBuf};
use std::process::Command;

pub const ZLIB6: ZlibParams = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };

/// One member to write.
pub struct Member<'a> {
    pub name: &'a [u8],
    pub data: Vec<u8>,
    /// Deflate (zlib level 6) when true, stored otherwise.
    pub deflate: bool,
    /// Sizes in a data descriptor with signature (general-purpose bit 3).
    pub descriptor: bool,
    pub time: u32,
    /// Deflate block-parallel as LibreOffice's ThreadedDeflater does
    /// (zlib level 6, 128 KiB blocks) instead of one stream.
    pub blocks: bool,
}

impl<'a> Member<'a> {
    pub fn new(name: &'a [u8], data: impl Into<Vec<u8>>) -> Self {
        Member { name, data: data.into(), deflate: true, descriptor: false, time: 0x5a21_6000, blocks: false }
    }
}

/// Writes a ZIP the way common writers do: locals, central directory, end record.
pub fn zip(members: &[Member<'_>]) -> Vec<u8> {
    zip_with_data(members, &[])
}

/// `content` deflated as LibreOffice's block-parallel writer does (zlib
/// level 6, 128 KiB blocks), except block `odd` (when given), deflated at
/// level 1: a stream whose block boundaries are where the recipe puts them
/// but which is not the recipe's output.
pub fn blocks_with_odd(content: &[u8], odd: Option<usize>) -> Vec<u8> {
    use ec_patch::deflate::deflate_blocks_reusing;
    let one = ZlibParams { level: 1, ..ZLIB6 };
    let (d6, l6, _) = deflate_blocks_reusing(content, ZLIB6, LIBREOFFICE_BLOCK, None).unwrap();
    let (d1, l1, _) = deflate_blocks_reusing(content, one, LIBREOFFICE_BLOCK, None).unwrap();
    let block = |d: &[u8], l: &ec_patch::deflate::BlockLayout, k: usize| d[l.data_range(k).unwrap()].to_vec();
    (0..l6.ends.len()).flat_map(|k| if Some(k) == odd { block(&d1, &l1, k) } else { block(&d6, &l6, k) }).collect()
}

/// [`zip`] with the compressed data of some members given (`data[i]`, for a
/// deflated member `i`) instead of made.
pub fn zip_with_data(members: &[Member<'_>], data: &[Option<Vec<u8>>]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (i, m) in members.iter().enumerate() {
        let offset = out.len() as u32;
        let crc = crc32fast::hash(&m.data);
        let body = match (m.deflate, m.blocks, data.get(i).and_then(Option::as_ref)) {
            (true, _, Some(given)) => given.clone(),
            (true, false, None) => deflate(&m.data, ZLIB6).unwrap(),
            (true, true, None) => deflate_blocks(&m.data, ZLIB6, LIBREOFFICE_BLOCK).unwrap(),
            (false, _, _) => m.data.clone(),
        };
        let method: u16 = if m.deflate { 8 } else { 0 };
        let flags: u16 = if m.descriptor { 0x0808 } else { 0x0800 };
        let (lc, lcs, lus) = if m.descriptor { (0, 0, 0) } else { (crc, body.len() as u32, m.data.len() as u32) };
        out.extend(0x0403_4b50u32.to_le_bytes());
        out.extend(20u16.to_le_bytes());
        out.extend(flags.to_le_bytes());
        out.extend(method.to_le_bytes());
        out.extend(m.time.to_le_bytes());
        out.extend(lc.to_le_bytes());
        out.extend(lcs.to_le_bytes());
        out.extend(lus.to_le_bytes());
        out.extend((m.name.len() as u16).to_le_bytes());
        out.extend(0u16.to_le_bytes());
        out.extend(m.name);
        out.extend(&body);
        if m.descriptor {
            out.extend(0x0807_4b50u32.to_le_bytes());
            out.extend(crc.to_le_bytes());
            out.extend((body.len() as u32).to_le_bytes());
            out.extend((m.data.len() as u32).to_le_bytes());
        }
        central.extend(0x0201_4b50u32.to_le_bytes());
        central.extend(20u16.to_le_bytes());
        central.extend(20u16.to_le_bytes());
        central.extend(flags.to_le_bytes());
        central.extend(method.to_le_bytes());
        central.extend(m.time.to_le_bytes());
        central.extend(crc.to_le_bytes());
        central.extend((body.len() as u32).to_le_bytes());
        central.extend((m.data.len() as u32).to_le_bytes());
        central.extend((m.name.len() as u16).to_le_bytes());
        central.extend([0u8; 8]);
        central.extend(0u32.to_le_bytes());
        central.extend(offset.to_le_bytes());
        central.extend(m.name);
    }
    let cd_offset = out.len() as u32;
    out.extend(&central);
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0u8; 4]);
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(cd_offset.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

/// Pseudo-random words, deterministic, for XML-like text.
pub fn words(n: usize, seed: u64) -> String {
    const W: [&str; 12] = ["edge", "courier", "office", "patch", "sync", "cloud", "byte", "delta", "word", "sheet", "slide", "zip"];
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    (0..n)
        .map(|_| {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            W[(x >> 33) as usize % W.len()]
        })
        .collect::<Vec<_>>()
        .join(" ")
}

/// `n` pseudo-random bytes (xorshift64, one byte per step) from `seed`.
pub fn xorshift_bytes(n: usize, mut seed: u64) -> Vec<u8> {
    (0..n)
        .map(|_| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed as u8
        })
        .collect()
}

/// Inputs that exercise a deflater's edges, for the byte-exact ports'
/// comparisons with the real programs: "mixed" (text, random bytes, text
/// again, a long run, the text's end) and "sparse" (short, far matches:
/// many 3-byte matches past 4096).
pub fn deflater_edge_inputs(text: &[u8]) -> [(String, Vec<u8>); 2] {
    let mut mixed = text[..100_000].to_vec();
    mixed.extend(xorshift_bytes(50_000, 7));
    mixed.extend(&text[..200_000]);
    mixed.extend(vec![b'x'; 70_000]);
    mixed.extend(&text[text.len() - 200_000..]);
    let sparse: Vec<u8> = (0..300_000u32).map(|i| b"abcdefgh"[((i * i + i / 7) % 8) as usize]).collect();
    [("sparse".into(), sparse), ("mixed".into(), mixed)]
}

/// Writes the members `ms` (name, deflated, content) into `dir` as files
/// (a name ending in `/` as a folder) and returns their names in runs of
/// the same method, in order: how testbed/rezip.py hands a document to a
/// ZIP program (ODF's stored mimetype in a run of its own).
pub fn unpack_in_runs<'a>(ms: &'a [(String, bool, Vec<u8>)], dir: &Path) -> Vec<(bool, Vec<&'a str>)> {
    for (n, _, content) in ms {
        assert!(!n.contains(".."), "{n}");
        let p = dir.join(n);
        if n.ends_with('/') {
            std::fs::create_dir_all(&p).unwrap();
        } else {
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }
    }
    let mut runs: Vec<(bool, Vec<&str>)> = Vec::new();
    for (n, deflated, _) in ms {
        match runs.last_mut() {
            Some((d, names)) if d == deflated => names.push(n),
            _ => runs.push((*deflated, vec![n])),
        }
    }
    runs
}

/// A WordprocessingML-like body with `n` words in paragraphs.
pub fn document_xml(n: usize, seed: u64) -> Vec<u8> {
    let text = words(n, seed);
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\r\n<w:document><w:body>");
    for para in text.as_bytes().chunks(400) {
        s.push_str("<w:p><w:r><w:t>");
        s.push_str(std::str::from_utf8(para).unwrap_or(""));
        s.push_str("</w:t></w:r></w:p>");
    }
    s.push_str("</w:body></w:document>");
    s.into_bytes()
}

/// The real-document corpus: `<shared>/corpus/real`, where the shared folder
/// is `EC_SHARED` or `../shared` beside the repository (testbed/shared.py).
pub fn corpus() -> std::path::PathBuf {
    let shared = std::env::var_os("EC_SHARED")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    let p = shared.join("corpus/real");
    assert!(p.is_dir(), "the shared corpus is missing: {} (put ../shared beside the repository or set EC_SHARED)", p.display());
    p
}

/// Calls `each(label, content)` for every deflated part (that inflates) of
/// every corpus file in the format folders `dirs`, in name order; the label
/// names the file and the part. Each folder must hold files.
pub fn for_each_corpus_part(dirs: &[&str], mut each: impl FnMut(&str, &[u8])) {
    for dir in dirs {
        let mut files: Vec<_> = std::fs::read_dir(corpus().join(dir)).unwrap().flatten().map(|e| e.path()).collect();
        files.sort();
        assert!(!files.is_empty(), "no corpus files in {dir}");
        for f in files {
            let data = std::fs::read(&f).unwrap();
            let Ok(layout) = ec_patch::zip::scan(&data) else { continue };
            for e in layout.entries.iter().filter(|e| e.method == 8) {
                let raw = &data[e.data_offset as usize..(e.data_offset + e.data_len) as usize];
                let Ok(x) = ec_patch::deflate::inflate(raw, 1 << 28) else { continue };
                each(&format!("{} {}", f.display(), String::from_utf8_lossy(&e.name)), &x);
            }
        }
    }
}

/// A ZIP patch with its segment section in plain form (flag bit 0 clear,
/// spec §4.0), whether or not the encoder compressed it: corruptions then
/// reach the segments rather than the zstd frame around them (make_vectors,
/// the GUID tests).
pub fn plain_section(bytes: &[u8]) -> Vec<u8> {
    if bytes[6] & ec_patch::FLAG_SEGMENTS_COMPRESSED == 0 {
        return bytes.to_vec();
    }
    if bytes[6] & ec_patch::FLAG_GUIDS_APART != 0 {
        // The GUIDs back in the section where they stand.
        return ec_patch::encode_plain(&decode(bytes, &Limits::default()).unwrap());
    }
    let varint = |at: &mut usize| {
        let (mut v, mut shift) = (0u64, 0);
        loop {
            let b = bytes[*at];
            *at += 1;
            v |= u64::from(b & 0x7f) << shift;
            shift += 7;
            if b & 0x80 == 0 {
                return v;
            }
        }
    };
    let mut at = base_hash_at(bytes) + base_hash_len(bytes);
    varint(&mut at);
    at += 32;
    varint(&mut at);
    varint(&mut at);
    let header = varint(&mut at) as usize;
    at += header;
    let section_at = at;
    let len = varint(&mut at) as usize;
    let section = ec_patch::delta::zstd_decompress(&bytes[at..], &[], len, "section").unwrap();
    let mut out = [&bytes[..section_at], &section[..]].concat();
    out[6] &= !ec_patch::FLAG_SEGMENTS_COMPRESSED;
    out
}

// ---- shared by the known-deflater tests (flate2_recipes.rs, go_recipe.rs)

pub fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// The members of a ZIP: (name, deflated?, content).
pub fn members(zip: &[u8]) -> Vec<(String, bool, Vec<u8>)> {
    let l = ec_patch::zip::scan(zip).expect("a ZIP");
    l.entries
        .iter()
        .map(|e| {
            let data = &zip[e.data_offset as usize..(e.data_offset + e.data_len) as usize];
            let content = if e.method == 8 { ec_patch::deflate::inflate(data, 1 << 30).unwrap() } else { data.to_vec() };
            (String::from_utf8(e.name.clone()).unwrap(), e.method == 8, content)
        })
        .collect()
}

pub fn recipes(patch: &[u8]) -> Vec<Recipe> {
    match decode(patch, &Limits::default()).unwrap().body {
        Body::Zip(z) => z
            .segments
            .into_iter()
            .flat_map(|s| s.expand(&[]))
            .filter_map(|s| match s {
                Segment::Member(m) => Some(m.recipe),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

pub fn with_recipe(p: &ec_patch::Patch, r: Recipe) -> ec_patch::Patch {
    let mut p = p.clone();
    if let Body::Zip(z) = &mut p.body {
        for s in &mut z.segments {
            match s {
                Segment::Member(m) => m.recipe = r.clone(),
                Segment::MemberRun { recipe, .. } => *recipe = r.clone(),
                _ => {}
            }
        }
    }
    p
}

/// A synthetic pair: `word/document.xml` deflated by `k` in both, one word changed.
pub fn synthetic(k: KnownDeflate) -> (Vec<u8>, Vec<u8>) {
    let text = document_xml(6000, 5);
    let mut edited = text.clone();
    edited[text.len() / 2] = b'#';
    let zip_of = |t: &[u8]| {
        let data = ec_patch::deflaters::deflate(t, k, u64::MAX).unwrap();
        zip_with_data(&[Member::new(b"word/document.xml", t.to_vec())], &[Some(data)])
    };
    (zip_of(&text), zip_of(&edited))
}

/// The environment of a `go` command that needs no network and writes only under `work`.
pub fn go_env(cmd: &mut Command, work: &Path) {
    cmd.env("GOCACHE", work.join("gocache"))
        .env("GOPATH", work.join("gopath"))
        .env("GOFLAGS", "-mod=mod")
        .env("GO111MODULE", "on")
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("CGO_ENABLED", "0");
}

/// Builds a Go program (a directory with main.go and go.mod) into the target dir.
pub fn go_build(src: &Path, name: &str) -> PathBuf {
    let work = option_env!("CARGO_TARGET_TMPDIR").map(PathBuf::from).unwrap_or_else(std::env::temp_dir).join("ec-patch-go");
    std::fs::create_dir_all(&work).unwrap();
    let out = work.join(name);
    let mut cmd = Command::new("go");
    cmd.arg("build").arg("-o").arg(&out).arg(".").current_dir(src);
    go_env(&mut cmd, &work);
    let status = match cmd.status() {
        Ok(s) => s,
        Err(e) => panic!(
            "these tests need Go (the `go` command, e.g. apt-get install golang-go; \
             scripts/setup-system installs it) to build {}: {e}",
            src.display()
        ),
    };
    assert!(status.success(), "go build of {} failed", src.display());
    out
}

/// Where the header's base hash starts: after the magic, version, kind,
/// flags (offsets 0-6) and the base size's varint (spec §2).
pub fn base_hash_at(patch: &[u8]) -> usize {
    7 + patch[7..].iter().position(|&b| b & 0x80 == 0).expect("the base size's last byte") + 1
}

/// Bytes of the header's base hash: 16 with BASE_HASH_PREFIX (edit-patch-v2.md §2), else 32.
pub fn base_hash_len(patch: &[u8]) -> usize {
    if patch[6] & ec_patch::FLAG_BASE_HASH_PREFIX != 0 {
        ec_patch::BaseHash::PREFIX_LEN
    } else {
        32
    }
}

/// A version 1 patch as an encoder allowed version 2 writes it when it uses
/// nothing else of version 2 (edit-patch-v2.md §1.2, §2): version byte 2,
/// flag bit 1, and the base named by the first 16 bytes of its SHA-256.
pub fn with_base_prefix(v1: &[u8]) -> Vec<u8> {
    assert_eq!((v1[4], v1[6] & ec_patch::FLAG_BASE_HASH_PREFIX), (1, 0), "a version 1 patch");
    let hash_at = base_hash_at(v1);
    let mut out = [&v1[..hash_at + ec_patch::BaseHash::PREFIX_LEN], &v1[hash_at + 32..]].concat();
    out[4] = 2;
    out[6] |= ec_patch::FLAG_BASE_HASH_PREFIX;
    out
}

/// Each patch applies to `new`, and every cut and bit flip of it gives a
/// typed error or the very target, never a wrong file or a panic.
pub fn cuts_and_flips_fail_cleanly(base: &[u8], new: &[u8], patches: [&Vec<u8>; 2]) {
    for patch in patches {
        assert_eq!(apply_to_vec(base, patch, &Limits::default()).unwrap(), new);
        for n in 0..patch.len() {
            let err = apply_to_vec(base, &patch[..n], &Limits::default()).expect_err("a truncated patch must fail");
            assert!(["bad_magic", "truncated", "malformed", "codec"].contains(&err.code()), "cut at {n}: {err}");
        }
        for i in 0..patch.len() {
            for flip in [0x01u8, 0x04, 0x80, 0xff] {
                let mut bad = patch.clone();
                bad[i] ^= flip;
                if let Ok(out) = apply_to_vec(base, &bad, &Limits::default()) {
                    assert!(out == new, "byte {i} ^ {flip:#x} produced a wrong file");
                }
            }
        }
    }
}
