//! Test helpers: a minimal ZIP writer for synthetic archives (hostile names,
//! descriptors, bombs) and the path of the shared real-document corpus.
#![allow(dead_code)]

use ec_patch::deflate::{deflate, deflate_blocks, ZlibParams, LIBREOFFICE_BLOCK};

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
