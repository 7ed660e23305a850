//! Writes the golden test vectors of the edit-patch format to
//! edit-patch/vectors/ (valid/, invalid/, manifest.json: version 1's suite)
//! and edit-patch/vectors/v2/ (the same layout: version 2's own vectors).
//!
//! Run: `cargo run --release -p ec-patch --example make_vectors` writes
//! version 2's vectors (v2/) only. Version 1's suite is frozen (its vectors
//! are never changed, only added to); the argument `v1` writes it again, for
//! adding a vector: check then that `git status` shows no existing file
//! changed (the vector `unsupported-version`, byte 2, no longer fails since
//! this crate reads version 2, and is kept as committed).
//! The vectors are committed; rerun only when the format changes (and then
//! bump the format version). Both the Rust tests (core/tests/integration/vectors.rs) and
//! the Python tests (python/tests/test_vectors.py) check every entry.

#[path = "../tests/common/mod.rs"]
mod common;

use common::{document_xml, zip, Member};
use ec_patch::{diff, encode, encode_plain, Body, DiffOptions, Patch, Recipe, Segment};
use sha2::{Digest, Sha256};
use std::path::{Path, PathBuf};

struct Out {
    dir: PathBuf,
    entries: Vec<serde_json::Value>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

impl Out {
    fn file(&self, rel: &str, bytes: &[u8]) -> String {
        let p = self.dir.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
        rel.to_string()
    }
    fn valid(&mut self, name: &str, what: &str, base: (&str, &[u8]), new: &[u8], patch: &[u8]) {
        assert_eq!(ec_patch::apply_to_vec(base.1, patch, &Default::default()).unwrap(), new, "{name} must apply");
        let entry = serde_json::json!({
            "name": name, "description": what,
            "base": self.file(base.0, base.1),
            "patch": self.file(&format!("valid/{name}.ecp"), patch),
            "target": self.file(&format!("valid/{name}.target"), new),
            "expect": {"sha256": hex(&Sha256::digest(new)), "size": new.len()},
        });
        self.entries.push(entry);
    }
    fn invalid(&mut self, name: &str, what: &str, base: (&str, &[u8]), patch: &[u8], code: &str) {
        let got = ec_patch::apply_to_vec(base.1, patch, &Default::default()).expect_err(name);
        assert_eq!(got.code(), code, "{name}: {got}");
        let entry = serde_json::json!({
            "name": name, "description": what,
            "base": self.file(base.0, base.1),
            "patch": self.file(&format!("invalid/{name}.ecp"), patch),
            "expect": {"error": code},
        });
        self.entries.push(entry);
    }
}

fn with_member(p: &Patch, f: impl Fn(&mut ec_patch::Member)) -> Patch {
    let mut p = p.clone();
    if let Body::Zip(z) = &mut p.body {
        let m = z.segments.iter_mut().find_map(|s| if let Segment::Member(m) = s { Some(m) } else { None }).expect("a rebuilt member");
        f(m);
    }
    p
}

fn with_segments(p: &Patch, f: impl Fn(&mut Vec<Segment>)) -> Patch {
    let mut p = p.clone();
    if let Body::Zip(z) = &mut p.body {
        f(&mut z.segments);
    }
    p
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors");
    if std::env::args().nth(1).as_deref() != Some("v1") {
        v2(&root.join("v2"));
        return;
    }
    for d in ["valid", "invalid", "bases"] {
        let _ = std::fs::remove_dir_all(root.join(d));
    }
    let mut out = Out { dir: root.clone(), entries: Vec::new() };
    let src = |n: &str| std::fs::read(root.join("sources").join(n)).unwrap();
    // Version 1's suite is made as version 1 makes patches (version 2 would
    // give the miniz member below recipe 7).
    let opts = DiffOptions { max_version: Some(1), ..Default::default() };

    // Real LibreOffice saves (made by experiments/traces/make_traces.py).
    let docx = ("sources/libreoffice-1k-base.docx", src("libreoffice-1k-base.docx"));
    let docx_new = src("libreoffice-1k-middle-edit.docx");
    let odt = ("sources/libreoffice-1k-base.odt", src("libreoffice-1k-base.odt"));
    let odt_new = src("libreoffice-1k-start-edit.odt");
    let docx_patch = diff(&docx.1, &docx_new, &opts).unwrap();
    let docx_bytes = encode(&docx_patch);
    out.valid(
        "zip-libreoffice-docx-one-char",
        "One character typed in the middle of a LibreOffice .docx: zlib recipes, entry runs, normalised headers",
        (docx.0, &docx.1),
        &docx_new,
        &docx_bytes,
    );
    let odt_patch = diff(&odt.1, &odt_new, &opts).unwrap();
    assert!(format!("{odt_patch:?}").contains("Png"), "the odt vector exercises the PNG recipe");
    out.valid(
        "zip-libreoffice-odt-thumbnail",
        "One character at the start of a LibreOffice .odt: the thumbnail PNG goes through the PNG recipe, descriptors throughout",
        (odt.0, &odt.1),
        &odt_new,
        &encode(&odt_patch),
    );
    out.valid(
        "identity",
        "A save with no change at all: identity patch",
        (docx.0, &docx.1),
        &docx.1,
        &encode(&diff(&docx.1, &docx.1, &opts).unwrap()),
    );

    // Synthetic archives for the other recipes and structures.
    let text = document_xml(60_000, 7);
    let mut text2 = text.clone();
    text2.insert(text.len() / 3, b'#');
    let blocks = |t: &[u8]| ec_patch::deflate::deflate_blocks(t, common::ZLIB6, ec_patch::deflate::LIBREOFFICE_BLOCK).unwrap();
    let blocks_zip = |t: &[u8]| zip_with_data(b"content.xml", t, &blocks(t));
    let (bb, bn) = (blocks_zip(&text), blocks_zip(&text2));
    let p = diff(&bb, &bn, &opts).unwrap();
    assert!(format!("{p:?}").contains("ZlibBlocks"), "blocks vector uses the zlib-blocks recipe");
    out.valid(
        "zip-zlib-blocks",
        "A 700 KB part written by LibreOffice's block-parallel deflater (128 KiB blocks, 32 KiB dictionary)",
        ("bases/blocks.zip", &bb),
        &bn,
        &encode(&p),
    );

    let other = |t: &[u8]| miniz_oxide_08::deflate::compress_to_vec(t, 10);
    let small = &text[..20_000];
    let mut small2 = small.to_vec();
    small2.insert(10_000, b'#');
    let (mb, mn) =
        (zip_with_data(b"word/document.xml", small, &other(small)), zip_with_data(b"word/document.xml", &small2, &other(&small2)));
    let p = diff(&mb, &mn, &opts).unwrap();
    assert!(format!("{p:?}").contains("Preflate"), "miniz vector uses preflate");
    out.valid(
        "zip-preflate",
        "A part from a non-zlib deflater (miniz level 10): preflate corrections",
        ("bases/miniz.zip", &mb),
        &mn,
        &encode(&p),
    );
    let raw = with_member(&p, |m| {
        m.recipe = Recipe::Raw(other(&small2));
    });
    out.valid(
        "zip-raw-recipe",
        "The same edit with the compressed bytes sent raw (the last-resort recipe)",
        ("bases/miniz.zip", &mb),
        &mn,
        &encode(&raw),
    );

    let mut d1 = Member::new(b"content.xml", document_xml(3000, 4));
    d1.descriptor = true;
    let mut stored = Member::new(b"mimetype", &b"application/vnd.oasis.opendocument.text"[..]);
    stored.deflate = false;
    let sb = zip(&[stored, d1]);
    let mut d2 = Member::new(b"content.xml", document_xml(3001, 4));
    d2.descriptor = true;
    d2.time = 0x5a21_7000;
    let mut stored2 = Member::new(b"mimetype", &b"application/vnd.oasis.opendocument.text"[..]);
    stored2.deflate = false;
    let sn = zip(&[stored2, d2, Member::new(b"Pictures/added.xml", document_xml(80, 5))]);
    out.valid(
        "zip-descriptors-new-member",
        "Data descriptors with signature, a stored member, new timestamps and a member added",
        ("bases/descriptors.zip", &sb),
        &sn,
        &encode(&diff(&sb, &sn, &opts).unwrap()),
    );

    // Many parts each with a fresh random GUID (as LibreOffice writes in every .pptx save).
    let guid = |i: u64, salt: u64| {
        format!(
            "{{{:016x}-{:016x}}}",
            (i + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ salt,
            (i + 7).wrapping_mul(0xc2b2_ae3d_27d4_eb4f) ^ salt
        )
    };
    let layouts = |salt: u64| -> Vec<Vec<u8>> {
        (0..13)
            .map(|i| {
                format!("<p:sldLayout><a:fld id=\"{}\" type=\"datetime\"/>{}</p:sldLayout>", guid(i, salt), common::words(200, i))
                    .into_bytes()
            })
            .collect()
    };
    let names: Vec<Vec<u8>> = (0..13).map(|i| format!("ppt/slideLayouts/slideLayout{}.xml", i + 1).into_bytes()).collect();
    let (lb, ln) = (layouts(1), layouts(2));
    let gb = zip(&names.iter().zip(&lb).map(|(n, d)| Member::new(n, d.clone())).collect::<Vec<_>>());
    let gn = zip(&names.iter().zip(&ln).map(|(n, d)| Member::new(n, d.clone())).collect::<Vec<_>>());
    let gp = encode(&diff(&gb, &gn, &opts).unwrap());
    assert_eq!(gp[6], ec_patch::FLAG_SEGMENTS_COMPRESSED, "the GUID vector compresses its segment section");
    out.valid(
        "zip-compressed-segments",
        "Thirteen parts each with a new random GUID: the segment section is zstd-compressed (flag bit 0)",
        ("bases/guids.zip", &gb),
        &gn,
        &gp,
    );

    // A spreadsheet with a row inserted in the middle: row-relative content mode.
    let sheet = |rows: &[u64]| -> Vec<u8> {
        let mut s = String::from("<worksheet><sheetData>");
        for (i, &id) in rows.iter().enumerate() {
            let r = i + 1;
            s.push_str(&format!(
                "<row r=\"{r}\"><c r=\"A{r}\" t=\"n\"><v>{id}</v></c><c r=\"B{r}\"><f>A{r}*2</f><v>{}</v></c></row>",
                id * 2
            ));
        }
        s.push_str("</sheetData></worksheet>");
        s.into_bytes()
    };
    let ids: Vec<u64> = (1000..1400).collect();
    let mut ids2 = ids.clone();
    ids2.insert(200, 9999);
    let (sb, sn) =
        (zip(&[Member::new(b"xl/worksheets/sheet1.xml", sheet(&ids))]), zip(&[Member::new(b"xl/worksheets/sheet1.xml", sheet(&ids2))]));
    let sp = diff(&sb, &sn, &opts).unwrap();
    assert!(format!("{sp:?}").contains("InflateRows"), "the sheet vector uses the row-relative mode");
    out.valid(
        "zip-row-relative-sheet",
        "A row inserted in the middle of a 400-row sheet: content mode 3 (row-relative) keeps later rows unchanged",
        ("bases/sheet.zip", &sb),
        &sn,
        &encode(&sp),
    );

    let (tb, tn) = (b"plain text, not a ZIP archive\n".repeat(50), b"plain text, not a ZIP archive!\n".repeat(50));
    out.valid(
        "binary-delta",
        "Two files that are not ZIPs: generic zstd delta against the whole base",
        ("bases/plain.txt", &tb),
        &tn,
        &encode(&diff(&tb, &tn, &opts).unwrap()),
    );

    // Invalid vectors, each a named rejection.
    let b = (docx.0, &docx.1[..]);
    let mut v = docx_bytes.clone();
    v[0] = b'P';
    out.invalid("bad-magic", "First byte changed", b, &v, "bad_magic");
    let mut v = docx_bytes.clone();
    v[4] = 2;
    out.invalid("unsupported-version", "Version byte 2", b, &v, "unsupported_version");
    let mut v = docx_bytes.clone();
    v[6] = 0x02;
    out.invalid("reserved-flags", "Reserved flag bit 1 set", b, &v, "malformed");
    let bin = encode(&diff(&docx.1, &docx_new, &DiffOptions { force_binary: true, ..opts.clone() }).unwrap());
    let mut v = bin.clone();
    v[6] = 0x01;
    out.invalid("flag-on-binary", "Flag bit 0 (compressed segments) on a binary patch", b, &v, "malformed");
    let mut v = docx_bytes.clone();
    v[5] = 9;
    out.invalid("unknown-kind", "Kind byte 9", b, &v, "malformed");
    out.invalid("truncated-hash", "Cut inside the base SHA-256", b, &docx_bytes[..20], "truncated");
    out.invalid("truncated-segments", "Last byte missing", b, &docx_bytes[..docx_bytes.len() - 1], "truncated");
    let mut v = docx_bytes.clone();
    v.push(0);
    out.invalid("trailing-bytes", "One byte after the last segment", b, &v, "malformed");
    let mut v = docx_bytes[..7].to_vec();
    v.extend([0x85, 0x80, 0x00]);
    out.invalid("overlong-varint", "Base size varint not in shortest form", b, &v, "malformed");
    out.invalid("wrong-base", "A valid patch applied to a different base", (odt.0, &odt.1), &docx_bytes, "wrong_base");
    let mut p = docx_patch.clone();
    p.target_sha256[31] ^= 0xff;
    out.invalid(
        "target-hash-mismatch",
        "Target SHA-256 altered: rebuilt bytes do not match, output discarded",
        b,
        &encode(&p),
        "target_mismatch",
    );
    let mut p = docx_patch.clone();
    p.target_size = 1 << 50;
    out.invalid("absurd-target-size", "Declares a 1 PiB target", b, &encode(&p), "limit_exceeded");
    out.invalid(
        "absurd-part-size",
        "A member's zstd middle declares 1 TiB",
        b,
        &encode(&with_member(&docx_patch, |m| m.delta.middle = ec_patch::delta::Middle::Zstd { len: 1 << 40, frame: vec![0; 8] })),
        "limit_exceeded",
    );
    out.invalid(
        "keeps-more-than-base",
        "Kept prefix beyond the end of the base part",
        b,
        &encode(&with_member(&docx_patch, |m| m.delta.prefix = 1 << 30)),
        "malformed",
    );
    out.invalid(
        "replaces-more-than-base",
        "Replaced base range beyond the end of the base part",
        b,
        &encode(&with_member(&docx_patch, |m| m.delta.base_mid = 1 << 30)),
        "malformed",
    );
    out.invalid(
        "zstd-middle-wrong-length",
        "A zstd middle that decodes to fewer bytes than declared",
        b,
        &encode(&with_member(&docx_patch, |m| {
            let frame = ec_patch::delta::zstd_compress(b"twelve bytes", b"").unwrap();
            m.delta.middle = ec_patch::delta::Middle::Zstd { len: 13, frame };
        })),
        "codec",
    );
    out.invalid(
        "repeat-without-params",
        "Recipe 6 (repeat zlib parameters) in a patch with none before it",
        b,
        &{
            let p = with_member(&docx_patch, |m| m.recipe = Recipe::Stored);
            let mut bytes = encode(&p);
            let at = find_stored_recipe(&p, &bytes);
            bytes[at] = 6;
            bytes
        },
        "malformed",
    );
    out.invalid(
        "base-member-out-of-range",
        "Copies base member 9999",
        b,
        &encode(&with_segments(&docx_patch, |s| s.insert(0, Segment::CopyData { base_entry: 9999 }))),
        "malformed",
    );
    out.invalid(
        "bad-descriptor-length",
        "Descriptor of 13 bytes",
        b,
        &encode(&with_segments(&docx_patch, |s| s.insert(0, Segment::Descriptor { len: 13 }))),
        "malformed",
    );
    let mut v = encode(&with_segments(&docx_patch, |s| s.push(Segment::Eocd)));
    let tag_at = v.len() - 1;
    v[tag_at] = 99;
    out.invalid("unknown-segment-tag", "Segment tag 99", b, &v, "malformed");
    out.invalid(
        "extra-segment",
        "One end record more than the header stream holds",
        b,
        &encode(&with_segments(&docx_patch, |s| s.push(Segment::Eocd))),
        "malformed",
    );
    let mut p = docx_patch.clone();
    if let Body::Zip(z) = &mut p.body {
        let n = z.header_frame.len();
        z.header_frame[n / 2] ^= 0x5a;
        z.header_frame[n - 1] ^= 0xa5;
    }
    out.invalid("corrupt-header-frame", "Bytes of the header stream's zstd frame changed", b, &encode(&p), "codec");
    let mut p = docx_patch.clone();
    if let Body::Zip(z) = &mut p.body {
        z.header_len += 1;
    }
    out.invalid("header-length-mismatch", "Header stream declared one byte longer than it decodes", b, &encode(&p), "codec");
    out.invalid(
        "block-size-below-window",
        "zlib-blocks recipe with 1 KiB blocks and a 32 KiB window",
        b,
        &encode(&with_member(&docx_patch, |m| m.recipe = Recipe::ZlibBlocks { params: common::ZLIB6, block: 1024 })),
        "malformed",
    );
    out.invalid(
        "bad-zlib-params",
        "zlib level 12",
        b,
        &encode(&with_member(&docx_patch, |m| m.recipe = Recipe::Zlib(ec_patch::ZlibParams { level: 12, ..common::ZLIB6 }))),
        "malformed",
    );
    out.invalid(
        "nested-png-recipe",
        "A PNG recipe whose inner recipe is another PNG recipe",
        b,
        &encode(&with_member(&docx_patch, |m| {
            let frame =
                ec_patch::png::PngFrame { head_len: 0, tail_len: 0, chunk_size: 8192, first_chunk: 8192, zlib_header: [0x78, 0xda] };
            m.recipe = Recipe::Png { frame, inner: Box::new(Recipe::Png { frame, inner: Box::new(Recipe::Stored) }) };
        })),
        "malformed",
    );
    let mut v = encode(&sp);
    let mode_at = find_mode(&sp, &v);
    v[mode_at] = 4;
    out.invalid("unknown-content-mode", "Content mode 4", ("bases/sheet.zip", &sb), &v, "malformed");
    let mut p = docx_patch.clone();
    p.body = Body::Identity;
    out.invalid("identity-with-different-hashes", "Kind 0 while base and target differ", b, &encode(&p), "malformed");

    let manifest = serde_json::json!({
        "format": "EdgeCourier edit patch",
        "format_version": 1,
        "how_to_check": "For each vector apply `patch` to `base`: valid ones give exactly `expect.size` bytes with SHA-256 `expect.sha256` (also in `target`); invalid ones fail with the error code `expect.error`. Paths are relative to this folder.",
        "vectors": out.entries,
    });
    std::fs::write(root.join("manifest.json"), serde_json::to_string_pretty(&manifest).unwrap() + "\n").unwrap();
    println!("wrote {} vectors to {}", manifest["vectors"].as_array().unwrap().len(), root.display());
}

/// Offset of the first member's recipe byte in `bytes` (which encodes `p`,
/// whose first member has the Stored recipe): re-encode with a marker recipe and compare.
fn find_stored_recipe(p: &Patch, bytes: &[u8]) -> usize {
    let marked = encode(&with_member(p, |m| m.recipe = Recipe::Raw(vec![0xEE; 3])));
    (0..bytes.len()).find(|&i| bytes[i] != marked[i]).expect("recipes differ")
}

/// Offset of the first member's content-mode byte in `bytes` (which encodes `p`).
fn find_mode(p: &Patch, bytes: &[u8]) -> usize {
    let marked = encode(&with_member(p, |m| m.base = m.base.map(|(e, _)| (e, ec_patch::ContentMode::Png))));
    (0..bytes.len()).find(|&i| bytes[i] != marked[i]).expect("modes differ")
}

/// A one-member ZIP whose member data is `data` (already deflated) for content `plain`.
fn zip_with_data(name: &[u8], plain: &[u8], data: &[u8]) -> Vec<u8> {
    let crc = crc32fast::hash(plain);
    let mut out = Vec::new();
    out.extend(0x0403_4b50u32.to_le_bytes());
    out.extend([20, 0, 0, 8, 8, 0]);
    out.extend(0x5a21_6000u32.to_le_bytes());
    out.extend(crc.to_le_bytes());
    out.extend((data.len() as u32).to_le_bytes());
    out.extend((plain.len() as u32).to_le_bytes());
    out.extend((name.len() as u16).to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out.extend(name);
    out.extend(data);
    let cd = out.len() as u32;
    out.extend(0x0201_4b50u32.to_le_bytes());
    out.extend([20, 0, 20, 0, 0, 8, 8, 0]);
    out.extend(0x5a21_6000u32.to_le_bytes());
    out.extend(crc.to_le_bytes());
    out.extend((data.len() as u32).to_le_bytes());
    out.extend((plain.len() as u32).to_le_bytes());
    out.extend((name.len() as u16).to_le_bytes());
    out.extend([0u8; 12]);
    out.extend(0u32.to_le_bytes());
    out.extend(name);
    let cd_len = out.len() as u32 - cd;
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0, 0, 0, 0, 1, 0, 1, 0]);
    out.extend(cd_len.to_le_bytes());
    out.extend(cd.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

/// A slide layout with the slide-number field LibreOffice gives a new GUID on every save.
fn layout_with_guid(guid: &str) -> Vec<u8> {
    let shapes: String = (0..4)
        .map(|k| format!("<p:sp><p:nvSpPr><p:cNvPr id=\"{}\" name=\"PlaceHolder {k}\"/></p:nvSpPr><p:spPr><a:xfrm><a:off x=\"{}\" y=\"1600200\"/><a:ext cx=\"8229240\" cy=\"{}\"/></a:xfrm></p:spPr><p:txBody><a:bodyPr/><a:p><a:r><a:t>Click to edit the outline text format</a:t></a:r></a:p></p:txBody></p:sp>", k + 2, 457_200 + k, 3_977_280 + k))
        .collect();
    format!("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<p:sldLayout><p:cSld><p:spTree>{shapes}<p:sp><p:txBody><a:p><a:fld id=\"{guid}\" type=\"slidenum\"><a:t>&lt;number&gt;</a:t></a:fld></a:p></p:txBody></p:sp></p:spTree></p:cSld></p:sldLayout>").into_bytes()
}

/// Content modes 5, INFLATE_GUIDS, and 6, INFLATE_GUID_SET (edit-patch-v2.md
/// §4.3, §4.4): valid and invalid vectors.
/// Flag bit 1, BASE_HASH_PREFIX (edit-patch-v2.md §2, draft.8): the base
/// named by the first 16 bytes of its SHA-256, in each kind.
/// A PNG of `image` (zlib level 6) whose first IDAT chunk holds `first`
/// bytes of the zlib stream and the others `chunk`, as Microsoft Office cuts them.
fn png_cut(image: &[u8], first: usize, chunk: usize) -> Vec<u8> {
    let crc = |kind: &[u8], data: &[u8]| {
        let mut h = crc32fast::Hasher::new();
        h.update(kind);
        h.update(data);
        h.finalize()
    };
    let mut z = vec![0x78, 0x9c];
    z.extend(ec_patch::deflate::deflate(image, common::ZLIB6).unwrap());
    z.extend(ec_patch::png::adler32(image).to_be_bytes());
    let mut out = vec![0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];
    let mut ihdr = Vec::new();
    ihdr.extend(100u32.to_be_bytes()); // 100 x 100 pixels, 8-bit RGB, each row a filter byte and 300 bytes
    ihdr.extend(100u32.to_be_bytes());
    ihdr.extend([8, 2, 0, 0, 0]);
    let chunks = std::iter::once(&z[..first]).chain(z[first..].chunks(chunk));
    for (kind, data) in
        std::iter::once((&b"IHDR"[..], &ihdr[..])).chain(chunks.map(|c| (&b"IDAT"[..], c))).chain(std::iter::once((&b"IEND"[..], &[][..])))
    {
        out.extend((data.len() as u32).to_be_bytes());
        out.extend(kind);
        out.extend(data);
        out.extend(crc(kind, data).to_be_bytes());
    }
    out
}

/// Recipe 11 (v2 §3.7): a stored PNG whose first IDAT chunk has a size of its own.
fn png_first_chunk_vectors(out: &mut Out, opts: &DiffOptions) {
    // 100 rows of 300 bytes of a gradient with some noise, each after its filter byte 0.
    let mut x = 0x9e37_79b9u32;
    let image: Vec<u8> = (0..100 * 301)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            if i % 301 == 0 {
                0
            } else {
                ((i % 301) as u8).wrapping_add((x >> 29) as u8)
            }
        })
        .collect();
    let png = png_cut(&image, 1000, 4096);
    let types = || Member::new(b"[Content_Types].xml", b"<Types/>".to_vec());
    let b = zip(&[types()]);
    let mut picture = Member::new(b"word/media/image1.png", png.clone());
    picture.deflate = false;
    let n = zip(&[types(), picture]);
    let base = ("bases/png-first-chunk-base.docx", &b[..]);
    let p = diff(&b, &n, opts).unwrap();
    let bytes = encode(&p);
    assert_eq!(bytes[4], 2, "recipe 11 is version 2");
    assert!(format!("{p:?}").contains("first_chunk: 1000"), "the picture goes through recipe 11: {p:?}");
    out.valid(
        "png-first-chunk",
        "A stored PNG added, its first IDAT chunk 1,000 bytes and the others 4,096 (Microsoft Office's writer cuts 65,445 and 65,524): recipe 11",
        base,
        &n,
        &bytes,
    );
    // The base named by its whole hash, so that recipe 11 is all that version 1 lacks.
    let full = Patch { base_hash: ec_patch::BaseHash::Full(Sha256::digest(&b).into()), ..p.clone() };
    let mut v = encode(&full);
    assert_eq!((v[4], v[6] & 0x02), (2, 0), "version 2 for recipe 11 alone");
    v[4] = 1;
    out.invalid(
        "png-first-chunk-in-version-1",
        "A recipe 11 patch (the base named by its whole SHA-256) with version byte 1: version 1 has no recipe 11",
        base,
        &v,
        "malformed",
    );
}

fn prefix_vectors(out: &mut Out, opts: &DiffOptions) {
    use ec_patch::BaseHash;
    let text = document_xml(3000, 7);
    let mut text2 = text.clone();
    text2[text.len() / 2..text.len() / 2 + 4].copy_from_slice(b"EDIT");
    let b = zip(&[Member::new(b"[Content_Types].xml", b"<Types/>".to_vec()), Member::new(b"word/document.xml", text)]);
    let n = zip(&[Member::new(b"[Content_Types].xml", b"<Types/>".to_vec()), Member::new(b"word/document.xml", text2)]);
    let base = ("bases/prefix-base.docx", &b[..]);
    let p = diff(&b, &n, opts).unwrap();
    assert!(matches!(p.base_hash, BaseHash::Prefix(_)), "allowed version 2, the differ names the base by its prefix");
    let bytes = encode(&p);
    assert_eq!((bytes[4], bytes[6] & 0x02), (2, 0x02));
    out.valid(
        "zip-base-hash-prefix",
        "A word changed in a zlib part: nothing else of version 2 is used, the base is named by the first 16 bytes of its SHA-256 (flag bit 1)",
        base,
        &n,
        &bytes,
    );
    let binary = diff(&b, &n, &DiffOptions { force_binary: true, ..opts.clone() }).unwrap();
    out.valid(
        "binary-base-hash-prefix",
        "Kind 2 (a zstd delta of the whole file) with the base named by its prefix",
        base,
        &n,
        &encode(&binary),
    );
    let same = diff(&b, &b, opts).unwrap();
    let same_bytes = encode(&same);
    assert_eq!(same_bytes[5], 0, "kind 0");
    out.valid("identity-base-hash-prefix", "Kind 0 (no change) with the base named by its prefix", base, &b, &same_bytes);
    let hash_at = common::base_hash_at(&same_bytes);
    let mut v = same_bytes.clone();
    v[hash_at + 15] ^= 1;
    out.invalid(
        "identity-base-hash-prefix-differs",
        "Kind 0 whose 16 bytes are not the first 16 of the target's SHA-256",
        base,
        &v,
        "malformed",
    );
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "base-hash-prefix-in-version-1",
        "The valid zip-base-hash-prefix with version byte 1 (bit 1 of the flags is reserved in version 1)",
        base,
        &v,
        "malformed",
    );
    let mut v = bytes.clone();
    v[6] |= 0x04;
    out.invalid(
        "flags-bit-2",
        "The valid zip-base-hash-prefix (a plain segment section) with flag bit 2 set (GUIDS_APART needs bit 0)",
        base,
        &v,
        "malformed",
    );
    let mut v = bytes.clone();
    v[6] |= 0x40;
    out.invalid("flags-bit-6", "The valid zip-base-hash-prefix with flag bit 6 set (reserved)", base, &v, "malformed");
    out.invalid(
        "base-hash-prefix-cut",
        "A patch with BASE_HASH_PREFIX that ends inside its 16 bytes",
        base,
        &bytes[..hash_at + 10],
        "truncated",
    );
    let mut v = bytes.clone();
    v[hash_at] ^= 0x80;
    out.invalid(
        "base-hash-prefix-wrong-base",
        "The valid zip-base-hash-prefix with the first byte of its 16 changed: the base given does not begin with them",
        base,
        &v,
        "wrong_base",
    );
    // The whole hash where the prefix is expected: 16 bytes too many read as
    // the target's size and hash, and the rest of the patch as body.
    let mut whole = p.clone();
    whole.base_hash = BaseHash::Full(Sha256::digest(&b).into());
    let mut v = encode(&whole);
    v[4] = 2;
    v[6] |= 0x02;
    let got = ec_patch::apply_to_vec(&b, &v, &Default::default()).expect_err("a 32-byte hash under BASE_HASH_PREFIX");
    out.invalid(
        "base-hash-prefix-whole-hash",
        "BASE_HASH_PREFIX set over a header that carries the whole 32-byte hash: the 16 bytes after the prefix are read as the target's size and hash",
        base,
        &v,
        got.code(),
    );
}

fn guid_vectors(out: &mut Out, opts: &DiffOptions) {
    use ec_patch::delta::{ContentDelta, Middle};
    use ec_patch::ContentMode;
    let deck_of = |layout1: Vec<u8>| {
        zip(&[
            Member::new(b"[Content_Types].xml", b"<Types/>".to_vec()),
            Member::new(b"ppt/slideLayouts/slideLayout1.xml", layout1),
            Member::new(b"ppt/slideLayouts/slideLayout2.xml", layout_with_guid("{00000000-1111-2222-3333-444444444444}")),
        ])
    };
    let deck = |guid: &str, lower: bool| deck_of(layout_with_guid(&if lower { guid.to_lowercase() } else { guid.to_string() }));
    // The GUID form of member 1 of a deck.
    let form = |z: &[u8]| {
        let layout = ec_patch::zip::scan(z).unwrap();
        let e = &layout.entries[1];
        ec_patch::guids::forward(
            &ec_patch::deflate::inflate(&z[e.data_offset as usize..(e.data_offset + e.data_len) as usize], 1 << 24).unwrap(),
        )
    };
    // The patch with member 1 in mode 5: the encoder names a GUID that is the
    // only change (mode 6); mode 5 is what it sends when other bytes change too.
    let as_mode5 = |p: &Patch, b: &[u8], n: &[u8]| {
        let d = ec_patch::delta::diff_version(&form(b), &form(n), 2).unwrap();
        with_member(p, |m| {
            m.base = Some((1, ContentMode::InflateGuids));
            m.delta = d.clone();
        })
    };
    let (old, new) = ("{5C2A8F1E-0B3D-4E6F-9A1B-2C3D4E5F6A7B}", "{E8D41B07-C3A2-4F95-8E6D-71B0A9C4D2F3}");
    let mut first = None;
    for (name, what, lower) in [
        (
            "zip-guids",
            "A slide layout whose slide-number field got a new uppercase GUID (LibreOffice's .pptx, saved again): content mode 5",
            false,
        ),
        ("zip-guids-lowercase", "The same with lowercase GUIDs: content mode 5, marker 0x02", true),
    ] {
        let (b, n) = (deck(old, lower), deck(new, lower));
        let p = as_mode5(&diff(&b, &n, opts).unwrap(), &b, &n);
        let bytes = encode(&p);
        assert_eq!(bytes[4], 2, "{name}");
        let base = format!("bases/{name}.zip");
        out.valid(name, what, (&base, &b), &n, &bytes);
        first.get_or_insert((base, b, p, bytes));
    }
    let (base, b, p, bytes) = first.expect("made");
    let bref = (base.as_str(), &b[..]);
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "guids-mode-in-version-1",
        "A valid content mode 5 patch with version byte 1 (version 1 has no mode 5)",
        bref,
        &v,
        "malformed",
    );
    // The GUID form of the base member, to put bytes after its very end.
    let end = form(&b).len() as u64;
    for (name, what, tail) in [
        ("guids-marker-cut", "Mode 5: the GUID form ends with a GUID_UPPER marker and 3 of its 16 bytes", &[1u8, 0xAA, 0xBB, 0xCC][..]),
        ("guids-lower-marker-alone", "Mode 5: the GUID form ends with a GUID_LOWER marker and none of its bytes", &[2u8][..]),
        ("guids-bad-escape", "Mode 5: an escape (0x03) followed by `x`, not by 0x01, 0x02 or 0x03", &[3u8, b'x'][..]),
        ("guids-escape-at-end", "Mode 5: the GUID form ends with an escape byte", &[3u8][..]),
    ] {
        let bad = with_member(&p, |m| m.delta = ContentDelta { prefix: end, base_mid: 0, middle: Middle::Literal(tail.to_vec()) });
        out.invalid(name, what, bref, &encode(&bad), "malformed");
    }

    // Mode 6: the GUID is the only change, named.
    let (b, n) = (deck(old, false), deck(new, false));
    let p = diff(&b, &n, opts).unwrap();
    let bytes = encode(&p);
    assert!(format!("{p:?}").contains("InflateGuidSet"), "mode 6: {p:?}");
    out.valid(
        "zip-guid-set",
        "A slide layout whose only change is its slide-number field's GUID: content mode 6, one GUID",
        ("bases/zip-guid-set.zip", &b),
        &n,
        &bytes,
    );
    let four = |g: [&str; 4]| {
        let fields: String = g.iter().map(|g| format!("<a:fld id=\"{g}\" type=\"slidenum\"><a:t>&lt;number&gt;</a:t></a:fld>")).collect();
        format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<p:sldLayout><p:cSld><p:spTree>{fields}</p:spTree></p:cSld></p:sldLayout>")
            .into_bytes()
    };
    let g =
        ["{11111111-2222-3333-4444-555555555555}", old, "{66666666-7777-8888-9999-AAAAAAAAAAAA}", "{bbbbbbbb-cccc-dddd-eeee-ffffffffffff}"];
    let g2 = [g[0], new, g[2], "{0a1b2c3d-4e5f-6a7b-8c9d-0e1f2a3b4c5d}"];
    let (b2, n2) = (deck_of(four(g)), deck_of(four(g2)));
    let p2 = diff(&b2, &n2, opts).unwrap();
    assert!(format!("{p2:?}").contains("GuidSet([(1, "), "mode 6 from the second GUID: {p2:?}");
    out.valid(
        "zip-guid-set-two",
        "Four GUIDs in one member (the last lowercase), the second and the fourth new: content mode 6, skips 1 and 1",
        ("bases/zip-guid-set-two.zip", &b2),
        &n2,
        &encode(&p2),
    );
    let bref = ("bases/zip-guid-set.zip", &b[..]);
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "guid-set-in-version-1",
        "A valid content mode 6 patch with version byte 1 (version 1 has no mode 6)",
        bref,
        &v,
        "malformed",
    );
    let set = |s: Vec<(u64, [u8; 16])>| {
        encode(&with_member(&p, |m| m.delta = ContentDelta { prefix: 0, base_mid: 0, middle: Middle::GuidSet(s.clone()) }))
    };
    out.invalid("guid-set-count-0", "Mode 6 with guid_count 0", bref, &set(vec![]), "malformed");
    out.invalid(
        "guid-set-past-last-guid",
        "Mode 6 naming marker 5 (skip 5) of a GUID form with one marker: malformed when applied",
        bref,
        &set(vec![(5, [0xAB; 16])]),
        "malformed",
    );
    // The segment section in plain form, so that bytes can be changed in place.
    let plain = common::plain_section(&bytes);
    let at = (0..plain.len() - 16).find(|&i| plain[i..i + 4] == [0xE8, 0xD4, 0x1B, 0x07]).expect("the new GUID's bytes");
    out.invalid(
        "guid-set-cut",
        "Mode 6: the patch (a plain segment section) ends inside the new GUID's 16 bytes: fewer than 17 bytes left for the GUID counted",
        bref,
        &plain[..at + 8],
        "malformed",
    );
    let marked = common::plain_section(&encode(&with_member(&p, |m| m.base = m.base.map(|(e, _)| (e, ContentMode::Png)))));
    // (From byte 5: the version byte differs, mode 2 being version 1's.)
    let at = (5..plain.len()).find(|&i| plain[i] != marked[i]).expect("modes differ");
    assert_eq!(plain[at], 6);
    let mut v = plain.clone();
    v[at] = 11;
    out.invalid("content-mode-11", "Content mode 11 (0-10 are defined)", bref, &v, "malformed");
}

/// A sheet's content.xml in LibreOffice's shape: two automatic cell styles
/// `ce{a}` and `ce{b}`, used by turns in `rows` cells; cell `edited` says
/// "edited" instead of its number.
fn sheet_with_styles(a: u64, b: u64, rows: u64, edited: Option<u64>) -> Vec<u8> {
    let mut x = format!("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<office:document-content><office:automatic-styles><style:style style:name=\"ce{a}\" style:family=\"table-cell\"><style:text-properties fo:font-weight=\"bold\"/></style:style><style:style style:name=\"ce{b}\" style:family=\"table-cell\"><style:table-cell-properties fo:background-color=\"#ffff00\"/></style:style></office:automatic-styles><office:body><office:spreadsheet><table:table table:name=\"Sheet1\">");
    for k in 1..=rows {
        let style = if k % 2 == 1 { a } else { b };
        let text = if edited == Some(k) { "edited".to_string() } else { (k * 37 % 1000).to_string() };
        x += &format!("<table:table-row table:style-name=\"ro1\"><table:table-cell table:style-name=\"ce{style}\" office:value-type=\"float\" office:value=\"{k}\" calcext:value-type=\"float\"><text:p>{text}</text:p></table:table-cell></table:table-row>");
    }
    x += "</table:table></office:spreadsheet></office:body></office:document-content>";
    x.into_bytes()
}

/// A name's pairs of old and new numbers (content mode 8).
type Pairs = Vec<(u64, u64)>;

/// Content mode 8 (edit-patch-v2.md §4.8, draft.14).
fn renumbered_vectors(out: &mut Out, opts: &DiffOptions) {
    use ec_patch::delta::{ContentDelta, Middle};
    let sheet = |content: Vec<u8>| {
        zip(&[Member::new(b"mimetype", b"application/vnd.oasis.opendocument.spreadsheet".to_vec()), Member::new(b"content.xml", content)])
    };
    // The styles ce1 and ce2 swap their numbers everywhere, and a cell's text changes.
    let (b, n) = (sheet(sheet_with_styles(1, 2, 300, None)), sheet(sheet_with_styles(2, 1, 300, Some(150))));
    let p = diff(&b, &n, opts).unwrap();
    assert!(format!("{p:?}").contains("InflateRenumbered"), "mode 8: {p:?}");
    let bytes = encode(&p);
    out.valid(
        "zip-renumbered",
        "A sheet whose automatic cell styles ce1 and ce2 swapped their numbers in every cell (LibreOffice numbers them anew on each save) and one of whose cells was edited: content mode 8, a map of one name and two pairs, then a content delta",
        ("bases/zip-renumbered.ods", &b),
        &n,
        &bytes,
    );
    let (b9, n9) = (sheet(sheet_with_styles(9, 3, 300, None)), sheet(sheet_with_styles(10, 3, 300, None)));
    let p9 = diff(&b9, &n9, opts).unwrap();
    assert!(format!("{p9:?}").contains("InflateRenumbered"), "mode 8: {p9:?}");
    out.valid(
        "zip-renumbered-grows",
        "A sheet whose cell style ce9 became ce10 in every cell: content mode 8, a renumbered number one digit longer",
        ("bases/zip-renumbered-grows.ods", &b9),
        &n9,
        &encode(&p9),
    );
    let bref = ("bases/zip-renumbered.ods", &b[..]);
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "renumbered-in-version-1",
        "A valid content mode 8 patch with version byte 1 (version 1 has no mode 8)",
        bref,
        &v,
        "malformed",
    );
    let with_map = |map: Vec<(&[u8], Pairs)>| {
        encode(&with_member(&p, |m| {
            let Middle::Renumbered(_, then) = &m.delta.middle else { panic!("mode 8") };
            let map = map.iter().map(|(n, p)| (n.to_vec(), p.clone())).collect();
            m.delta = ContentDelta { prefix: 0, base_mid: 0, middle: Middle::Renumbered(map, then.clone()) };
        }))
    };
    let swap = vec![(1, 2), (2, 1)];
    out.invalid("renumbered-name-count-0", "Mode 8 with name_count 0", bref, &with_map(vec![]), "malformed");
    out.invalid(
        "renumbered-name-length-17",
        "Mode 8 naming a name of 17 letters (at most 16)",
        bref,
        &with_map(vec![(b"abcdefghijklmnopq", swap.clone())]),
        "malformed",
    );
    out.invalid("renumbered-name-not-a-letter", "Mode 8 naming `c_`", bref, &with_map(vec![(b"c_", swap.clone())]), "malformed");
    out.invalid(
        "renumbered-names-out-of-order",
        "Mode 8 naming `ce`, then `ce` again (names are in increasing order, each once)",
        bref,
        &with_map(vec![(b"ce", swap.clone()), (b"ce", swap.clone())]),
        "malformed",
    );
    out.invalid("renumbered-pair-count-0", "Mode 8 naming `ce` with no pair", bref, &with_map(vec![(b"ce", vec![])]), "malformed");
    out.invalid("renumbered-move-0", "Mode 8 renaming ce1 to ce1 (a move of 0)", bref, &with_map(vec![(b"ce", vec![(1, 1)])]), "malformed");
    // The pair 1 -> 2 (gap 1, move 2) with its move byte made 3: 1 - 2 = -1.
    let plain = common::plain_section(&with_map(vec![(b"ce", vec![(1, 2)])]));
    let at = plain.windows(7).position(|w| w == [1, 2, b'c', b'e', 1, 1, 2]).expect("the map's bytes");
    let mut v = plain.clone();
    v[at + 6] = 3;
    out.invalid("renumbered-below-0", "Mode 8 renaming ce1 by -2, to below 0", bref, &v, "malformed");
    // A name of 8 letters, the patch cut after its fourth.
    let plain = common::plain_section(&with_map(vec![(b"abcdefgh", swap.clone())]));
    let at = plain.windows(4).position(|w| w == [1, 8, b'a', b'b']).expect("the map's bytes");
    out.invalid(
        "renumbered-map-cut",
        "A patch that ends inside mode 8's map, in the fifth letter of a name of 8",
        bref,
        &plain[..at + 6],
        "truncated",
    );
    let past = encode(&with_member(&p, |m| {
        let then = ContentDelta { prefix: 1 << 30, base_mid: 0, middle: Middle::Literal(Vec::new()) };
        m.delta = ContentDelta {
            prefix: 0,
            base_mid: 0,
            middle: Middle::Renumbered(vec![(b"ce".to_vec(), vec![(1, 2), (2, 1)])], Box::new(then)),
        };
    }));
    out.invalid(
        "renumbered-delta-past-base",
        "Mode 8 whose content delta keeps 2^30 bytes of a renumbered base that is shorter: malformed when applied",
        bref,
        &past,
        "malformed",
    );
}

/// A slide in LibreOffice's shape with two text shapes `shrink` EMU smaller than at first.
fn slide_with_sizes(k: u64, shrink: u64) -> Vec<u8> {
    let (cx, cy, cx2, cy2) = (9_070_920 - shrink, 934_920 - shrink, 8_229_240 - k - shrink, 3_977_280 - shrink);
    format!("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<p:sld><p:cSld><p:spTree><p:sp><p:spPr><a:xfrm><a:off x=\"504000\" y=\"301320\"/><a:ext cx=\"{cx}\" cy=\"{cy}\"/></a:xfrm></p:spPr><p:txBody><a:p><a:r><a:t>Slide {k}</a:t></a:r></a:p></p:txBody></p:sp><p:sp><p:spPr><a:xfrm><a:off x=\"504000\" y=\"1326600\"/><a:ext cx=\"{cx2}\" cy=\"{cy2}\"/></a:xfrm></p:spPr><p:txBody><a:p><a:r><a:t>{}</a:t></a:r></a:p></p:txBody></p:sp></p:spTree></p:cSld></p:sld>", common::words(60, k)).into_bytes()
}

/// Content mode 7 and member runs (edit-patch-v2.md §4.5, §4.6, draft.11).
fn drift_vectors(out: &mut Out, opts: &DiffOptions) {
    use ec_patch::delta::{ContentDelta, Middle};
    use ec_patch::guids::Change;
    use ec_patch::{ContentMode, RunEntry};
    let (old, new) = ("{5C2A8F1E-0B3D-4E6F-9A1B-2C3D4E5F6A7B}", "{E8D41B07-C3A2-4F95-8E6D-71B0A9C4D2F3}");
    let deck = |slides: &[u64], shrink: u64, guid: &str| {
        let names: Vec<String> = slides.iter().map(|k| format!("ppt/slides/slide{k}.xml")).collect();
        let mut m = vec![Member::new(b"[Content_Types].xml", b"<Types/>".to_vec())];
        for (&k, name) in slides.iter().zip(&names) {
            m.push(Member::new(name.as_bytes(), slide_with_sizes(k, shrink)));
        }
        m.push(Member::new(b"ppt/slideLayouts/slideLayout1.xml", layout_with_guid(guid)));
        zip(&m)
    };
    // One slide whose shapes shrank: mode 7, four numbers, the amount written once.
    let (b, n) = (deck(&[1], 0, old), deck(&[1], 360, old));
    let p = diff(&b, &n, opts).unwrap();
    assert!(format!("{p:?}").contains("InflateDrift"), "mode 7: {p:?}");
    let bytes = encode(&p);
    out.valid(
        "zip-drift",
        "A slide whose two text shapes are 360 EMU narrower and lower (LibreOffice rounds them on each save): content mode 7, four number changes, the amount -360 written once and then repeated (0)",
        ("bases/zip-drift.zip", &b),
        &n,
        &bytes,
    );
    let bref = ("bases/zip-drift.zip", &b[..]);
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid("drift-in-version-1", "A valid content mode 7 patch with version byte 1 (version 1 has no mode 7)", bref, &v, "malformed");
    let drift = |d: Vec<(u64, Change)>| {
        encode(&with_member(&p, |m| m.delta = ContentDelta { prefix: 0, base_mid: 0, middle: Middle::Drift(d.clone()) }))
    };
    out.invalid("drift-count-0", "Mode 7 with change_count 0", bref, &drift(vec![]), "malformed");
    out.invalid(
        "drift-past-last-token",
        "Mode 7 naming token 1000 (skip 1000) of a GUID form with fewer tokens: malformed when applied",
        bref,
        &drift(vec![(1000, Change::Number(1))]),
        "malformed",
    );
    out.invalid(
        "drift-guid-for-a-number",
        "Mode 7 giving token 0, the number 1 of `version=\"1.0\"`, new GUID bytes: malformed when applied",
        bref,
        &drift(vec![(0, Change::Guid([0xAB; 16]))]),
        "malformed",
    );
    out.invalid(
        "drift-number-below-0",
        "Mode 7 changing token 0, the number 1 of `version=\"1.0\"`, by -2: malformed when applied",
        bref,
        &drift(vec![(0, Change::Number(-2))]),
        "malformed",
    );
    // More changes than `max_segments` (4,000,000): 2 bytes each in an 8 MB
    // section that zstd codes in a few hundred; the target's declared size
    // raised so that the section's own bound (twice it) does not stop it first.
    let mut many = with_member(&p, |m| {
        let mut d = vec![(0, Change::Number(1)); 4_000_001];
        d[0] = (0, Change::Number(2));
        m.delta = ContentDelta { prefix: 0, base_mid: 0, middle: Middle::Drift(d) }
    });
    many.target_size = 1 << 23;
    out.invalid(
        "drift-over-max-segments",
        "Mode 7 with 4,000,001 changes (more than max_segments, 4,000,000, counted over the patch), the target's declared size 8 MiB",
        bref,
        &encode(&many),
        "limit_exceeded",
    );
    // The first amount written as 0 ("the last amount") before any other.
    let plain = common::plain_section(&bytes);
    // Mode 7, 4 changes, the first one's head (one byte), amount -360 (zigzag 719: CF 05).
    let at = plain.windows(5).position(|w| w[..2] == [7, 4] && w[2] < 0x80 && w[3..] == [0xCF, 0x05]).expect("the slide's changes");
    let mut v = plain[..at + 3].to_vec();
    v.push(0);
    v.extend_from_slice(&plain[at + 5..]);
    out.invalid(
        "drift-last-amount-first",
        "Mode 7 whose first number change has amount 0 (the last amount) while no amount came before it in the patch",
        bref,
        &v,
        "malformed",
    );

    // A GUID and numbers in one member.
    let master = |guid: &str, shrink: u64| {
        let mut x = layout_with_guid(guid);
        let ext = format!("<a:ext cx=\"{}\" cy=\"{}\"/>", 8_229_240 - shrink, 3_977_280 - shrink);
        x.splice(x.len() - "</p:sldLayout>".len()..x.len() - "</p:sldLayout>".len(), ext.into_bytes());
        zip(&[Member::new(b"[Content_Types].xml", b"<Types/>".to_vec()), Member::new(b"ppt/slideMasters/slideMaster1.xml", x)])
    };
    let (b, n) = (master(old, 0), master(new, 360));
    let p = diff(&b, &n, opts).unwrap();
    assert!(format!("{p:?}").contains("Drift([(") && format!("{p:?}").contains("Guid("), "mode 7 with a GUID: {p:?}");
    out.valid(
        "zip-drift-guid-and-numbers",
        "A slide master whose slide-number field got a new GUID and whose shape shrank 360 EMU: content mode 7, one GUID and two number changes",
        ("bases/zip-drift-guid.zip", &b),
        &n,
        &encode(&p),
    );

    // A member run: three slides and a layout, changed in base order.
    let (b, n) = (deck(&[1, 2, 3], 0, old), deck(&[1, 2, 3], 360, new));
    let p = diff(&b, &n, opts).unwrap();
    let Body::Zip(z) = &p.body else { panic!("a zip patch") };
    let run = z.segments.iter().position(|s| matches!(s, Segment::MemberRun { .. })).expect("a member run");
    out.valid(
        "zip-member-run",
        "Three slides whose shapes shrank and a layout with a new GUID, in base order: one member run (segment tag 9) of their four members, the recipe written once",
        ("bases/zip-member-run.zip", &b),
        &n,
        &encode(&p),
    );
    let bref = ("bases/zip-member-run.zip", &b[..]);
    let mut v = encode(&p);
    v[4] = 1;
    out.invalid(
        "member-run-in-version-1",
        "A valid member-run patch with version byte 1 (version 1 has no segment tag 9)",
        bref,
        &v,
        "malformed",
    );
    let with_run = |f: &dyn Fn(&mut u64, &mut Vec<RunEntry>)| {
        encode(&with_segments(&p, |segs| {
            if let Segment::MemberRun { base_start, entries, .. } = &mut segs[run] {
                f(base_start, entries);
            }
        }))
    };
    out.invalid("member-run-length-0", "A member run of no members", bref, &with_run(&|_, e| e.clear()), "malformed");
    out.invalid(
        "member-run-past-base",
        "A member run whose last member would be base member 5 of a base with 5 (0-4)",
        bref,
        &with_run(&|s, e| {
            *s = 4;
            e.truncate(2);
        }),
        "malformed",
    );
    let plain = common::plain_section(&with_run(&|s, e| {
        *s = 0;
        e.insert(0, RunEntry::Copy);
    }));
    let tag = plain.windows(3).position(|w| w == [9, 0, 5]).expect("tag 9 from base member 0, 5 members");
    let mut v = plain.clone();
    let entry = tag + 3 + 1; // after the recipe (tag 6: the last zlib parameters, or 1 + 4 bytes)
    assert!(v[tag + 3] == 6 || v[tag + 3] == 1, "the run's recipe: {}", v[tag + 3]);
    let entry = if v[tag + 3] == 1 { entry + 4 } else { entry };
    assert_eq!(v[entry], 0, "the copied first entry");
    v[entry] = 12;
    out.invalid("member-run-unknown-entry", "A member run entry 12 (0: copied; 1-11: content modes 0-10)", bref, &v, "malformed");
    let _ = ContentMode::InflateDrift;

    // Mode 9 (§4.9, draft.15): four slides whose shapes shrank alike; the
    // first teaches 9070920 -> 9070560 and the others, which shrank the same
    // numbers, need no change of their own.
    // Slide k's title holds k numbers, so that its shapes' numbers stand at
    // other places than the other slides' (mode 7's changes differ).
    let names: Vec<String> = (1..=4).map(|k| format!("ppt/slides/slide{k}.xml")).collect();
    let numbered = |shrink: u64| {
        let mut m = vec![Member::new(b"[Content_Types].xml", b"<Types/>".to_vec())];
        for (k, name) in (1..=4u64).zip(&names) {
            let title: Vec<String> = (1..=k).map(|i| i.to_string()).collect();
            let x = String::from_utf8(slide_with_sizes(k, shrink)).unwrap();
            let x = x.replace(&format!("<a:t>Slide {k}</a:t>"), &format!("<a:t>Slide {}</a:t>", title.join(" ")));
            m.push(Member::new(name.as_bytes(), x.into_bytes()));
        }
        zip(&m)
    };
    let (b, n) = (numbered(0), numbered(360));
    let p = diff(&b, &n, opts).unwrap();
    assert!(format!("{p:?}").contains("Mapped([(11, Number(-360))])"), "mode 9: {p:?}");
    let bytes = encode(&p);
    out.valid(
        "zip-mapped",
        "Four slides whose two text shapes are 360 EMU smaller (LibreOffice rounds them on each save), slide k's title holding k numbers, in one member run of content mode 9: the first slide's changes teach their values, the others' numbers take the learnt values, with changes for the one number that differs",
        ("bases/zip-mapped.zip", &b),
        &n,
        &bytes,
    );
    let bref = ("bases/zip-mapped.zip", &b[..]);
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid("mapped-in-version-1", "A valid content mode 9 patch with version byte 1 (version 1 has no mode 9)", bref, &v, "malformed");
    // On zip-drift's base: its one slide's member in mode 9.
    let (b1, n1) = (deck(&[1], 0, old), deck(&[1], 360, old));
    let p1 = diff(&b1, &n1, opts).unwrap();
    let mapped = encode(&with_member(&p1, |m| {
        m.base = m.base.map(|(e, _)| (e, ContentMode::InflateMapped));
        m.delta = ContentDelta { prefix: 0, base_mid: 0, middle: Middle::Mapped(vec![(1000, Change::Number(1))]) }
    }));
    out.invalid(
        "mapped-past-last-token",
        "Mode 9 naming token 1000 (skip 1000) of a GUID form with fewer tokens: malformed when applied",
        ("bases/zip-drift.zip", &b1[..]),
        &mapped,
        "malformed",
    );

    // Mode 9 teaching at once (§4.9.1, draft.16): two charts whose two axis
    // ids, each written three times, are new; a chart's first place of each
    // id takes a change, the two others the value it taught.
    let chart_names = ["ppt/charts/chart1.xml", "ppt/charts/chart2.xml"];
    let charts = |ids: [[u64; 2]; 2]| {
        let m: Vec<Member> = ids
            .iter()
            .enumerate()
            .map(|(k, [a, b])| {
                let x = format!("<c:chartSpace><c:barChart><c:idx val=\"0\"/><c:axId val=\"{a}\"/><c:axId val=\"{b}\"/></c:barChart><c:catAx><c:axId val=\"{a}\"/><c:crossAx val=\"{b}\"/></c:catAx><c:valAx><c:axId val=\"{b}\"/><c:crossAx val=\"{a}\"/></c:valAx></c:chartSpace>");
                Member::new(chart_names[k].as_bytes(), x.into_bytes())
            })
            .collect();
        zip(&m)
    };
    let (b, n) = (charts([[53332573, 92380426], [41587210, 60931744]]), charts([[47075606, 26678181], [80276133, 35110468]]));
    let p = diff(&b, &n, opts).unwrap();
    assert!(format!("{p:?}").contains("Mapped([(1, Number(-6256967)), (0, Number(-65702245))])"), "mode 9, two changes a chart: {p:?}");
    out.valid(
        "zip-mapped-at-once",
        "Two charts whose two axis ids, each written three times, are new, in content mode 9: each chart names the first place of each id, whose change teaches the new id at once, and the four other places take it",
        ("bases/zip-mapped-at-once.zip", &b),
        &n,
        &encode(&p),
    );

    // Learnt values, then a content delta (§4.10, mode 10, draft.18): three
    // charts whose two axis ids, each written three times, are new; the
    // third chart's value axis also flipped its orientation (minMax becomes
    // maxMin, as LibreOffice does now and then): its ids are mode 9's changes
    // and the word a content delta after them.
    let oriented_charts = |ids: [[u64; 2]; 3], flipped: bool| {
        let names: Vec<String> = (1..=3).map(|k| format!("ppt/charts/chart{k}.xml")).collect();
        let m: Vec<Member> = ids
            .iter()
            .zip(&names)
            .enumerate()
            .map(|(k, ([a, b], name))| {
                let orientation = if flipped && k == 2 { "maxMin" } else { "minMax" };
                let x = format!("<c:chartSpace><c:barChart><c:idx val=\"{k}\"/><c:axId val=\"{a}\"/><c:axId val=\"{b}\"/></c:barChart><c:catAx><c:axId val=\"{a}\"/><c:scaling><c:orientation val=\"minMax\"/></c:scaling><c:crossAx val=\"{b}\"/></c:catAx><c:valAx><c:axId val=\"{b}\"/><c:scaling><c:orientation val=\"{orientation}\"/></c:scaling><c:crossAx val=\"{a}\"/></c:valAx></c:chartSpace>");
                Member::new(name.as_bytes(), x.into_bytes())
            })
            .collect();
        zip(&m)
    };
    let (b, n) = (
        oriented_charts([[53332573, 92380426], [41587210, 60931744], [17620534, 88012377]], false),
        oriented_charts([[47075606, 26678181], [80276133, 35110468], [61402297, 29918803]], true),
    );
    let p = diff(&b, &n, opts).unwrap();
    assert!(format!("{p:?}").contains("InflateMappedDelta"), "mode 10 for the flipped chart: {p:?}");
    let bytes = encode(&p);
    out.valid(
        "zip-mapped-delta",
        "Three charts whose two axis ids, each written three times, are new; the third's value axis also flipped its orientation: its ids are content mode 10's changes (taught at once, as mode 9's) and the word a content delta after them",
        ("bases/zip-mapped-delta.zip", &b),
        &n,
        &bytes,
    );
    let bref = ("bases/zip-mapped-delta.zip", &b[..]);
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid("mapped-delta-in-version-1", "zip-mapped-delta with version byte 1 (version 1 has no mode 10)", bref, &v, "malformed");
    let expanded = ec_patch::decode(&bytes, &ec_patch::Limits::default()).unwrap();
    let mut past = expanded.clone();
    if let Body::Zip(z) = &mut past.body {
        *z = ec_patch::expand_runs(&b, z).unwrap();
        let m = z
            .segments
            .iter_mut()
            .find_map(|s| match s {
                Segment::Member(m) if matches!(m.base, Some((_, ContentMode::InflateMappedDelta))) => Some(m),
                _ => None,
            })
            .expect("the mode 10 member");
        if let Middle::MappedDelta(_, then) = &mut m.delta.middle {
            then.prefix = 1 << 20;
        }
    }
    out.invalid(
        "mapped-delta-past-base",
        "zip-mapped-delta whose mode 10 member's content delta keeps a prefix past the end of T: malformed when applied",
        bref,
        &encode(&past),
        "malformed",
    );

    // Fresh times (§2, flag bit 3, draft.17): forty parts saved again with no
    // change; each save stamped its members across a two-second boundary
    // (DOS time's seconds / 2 one more), the base from part 30 on, the new
    // file at its last part only.
    let part_names: Vec<String> = (1..=40).map(|k| format!("ppt/slides/slide{k}.xml")).collect();
    let stamped = |time: u32, later_from: usize| {
        let m: Vec<Member> = part_names
            .iter()
            .enumerate()
            .map(|(k, name)| Member {
                time: time + u32::from(k >= later_from),
                ..Member::new(name.as_bytes(), format!("<p:sld><a:t>Slide {}</a:t></p:sld>", k + 1).into_bytes())
            })
            .collect();
        zip(&m)
    };
    let (b, n) = (stamped(0x5a21_6000, 30), stamped(0x5a21_6010, 39));
    let bytes = encode(&diff(&b, &n, opts).unwrap());
    assert_eq!(bytes[6] & 0x08, 0x08, "fresh times: flags {:#x}", bytes[6]);
    out.valid(
        "zip-fresh-times",
        "Forty parts saved again with no change, whose members' times cross a two-second boundary at part 31 in the base and at part 40 in the new file: the header stream's times keyed fresh (flag bit 3)",
        ("bases/zip-fresh-times.zip", &b),
        &n,
        &bytes,
    );
    let bref = ("bases/zip-fresh-times.zip", &b[..]);
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "fresh-times-in-version-1",
        "zip-fresh-times with version byte 1 (flag bit 3 is reserved in version 1)",
        bref,
        &v,
        "malformed",
    );
    let mut v = encode(&diff(&b, &n, &DiffOptions { force_binary: true, ..opts.clone() }).unwrap());
    assert_eq!(v[5], 2, "kind 2");
    v[6] |= 0x08;
    out.invalid("fresh-times-on-binary", "A binary patch (kind 2) with flag bit 3 (fresh times) set", bref, &v, "malformed");

    // Members renumbered (§2, flag bit 4, draft.18): twenty charts saved
    // again with no change, numbered anew (chart1 ... chart20 become chart21
    // ... chart40, as LibreOffice numbers a deck's charts), and written in an
    // order of their own, not their numbers', two of them swapped in the new
    // file: the name map pairs the names in file order.
    let charts = |first: u64, order: &[u64]| {
        let names: Vec<String> = order.iter().map(|k| format!("ppt/charts/chart{}.xml", first + k)).collect();
        let m: Vec<Member> = order
            .iter()
            .zip(&names)
            .map(|(k, name)| {
                let body = format!("<c:chartSpace><c:title>Chart {k} of twenty</c:title><c:idx val=\"{k}\"/></c:chartSpace>");
                Member::new(name.as_bytes(), body.into_bytes())
            })
            .collect();
        zip(&m)
    };
    let order: Vec<u64> = [7, 8, 1, 2, 3, 4, 5, 6, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20].into();
    let mut swapped = order.clone();
    swapped.swap(4, 5);
    let (b, n) = (charts(0, &order), charts(20, &swapped));
    let p = diff(&b, &n, opts).unwrap();
    let bytes = encode(&p);
    assert_eq!(bytes[6] & 0x10, 0x10, "members renumbered: flags {:#x}", bytes[6]);
    out.valid(
        "zip-members-renumbered",
        "Twenty charts saved again with no change and numbered anew (chart1-20 become chart21-40), in an order of their own, two swapped in the new file: the name map (flag bit 4) renumbers the reference's names",
        ("bases/zip-members-renumbered.zip", &b),
        &n,
        &bytes,
    );
    let bref = ("bases/zip-members-renumbered.zip", &b[..]);
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "members-renumbered-in-version-1",
        "zip-members-renumbered with version byte 1 (flag bit 4 is reserved in version 1)",
        bref,
        &v,
        "malformed",
    );
    let mut v = encode(&diff(&b, &n, &DiffOptions { force_binary: true, ..opts.clone() }).unwrap());
    v[6] |= 0x10;
    out.invalid("members-renumbered-on-binary", "A binary patch (kind 2) with flag bit 4 (members renumbered) set", bref, &v, "malformed");
    let Body::Zip(z) = &p.body else { unreachable!("a zip patch") };
    let mut without = p.clone();
    if let Body::Zip(w) = &mut without.body {
        w.renamed.clear();
    }
    let limits = ec_patch::Limits::default();
    assert!(ec_patch::apply_to_vec(&b, &encode(&without), &limits).is_err(), "the map makes the reference");
    let plain = encode_plain(&p);
    let name_at = plain.windows(6).position(|w| w == b"\x05chart").expect("the map's name") - 1;
    let mut v = plain.clone();
    v[name_at] = 0;
    out.invalid(
        "members-renumbered-name-count-0",
        "zip-members-renumbered with a plain section whose name map says 0 names",
        bref,
        &v,
        "malformed",
    );
    assert_eq!(z.renamed[0].0, b"chart", "the map's one name");
    out.invalid(
        "members-renumbered-map-cut",
        "zip-members-renumbered with a plain section that ends inside its name map (in the name's letters)",
        bref,
        &plain[..name_at + 5],
        "truncated",
    );

    // Learnt amounts (§2 and §4.11, flag bit 5, draft.20): six slides whose
    // shapes, each of a size of its own, shrank 360 EMU, as LibreOffice's
    // saves shrink them, and a line on each whose width (360) and height (0)
    // stayed. The first slide's shape teaches its amounts to the bytes before
    // its numbers; the others' sizes take them with no change; the line's
    // width, which the amount would take to 0, is changed back once and held,
    // and its height stays (0 - 360 is below 0). Slide k's title holds k
    // numbers, so that mode 7's changes differ from slide to slide. Each
    // slide's group child extent (`<a:chExt cx="`), which kept its size,
    // has a key that differs from the shapes' (`ext cx="`) only in the first
    // of its 8 bytes: a decoder with shorter keys would move it.
    let slide_names: Vec<String> = (1..=6).map(|k| format!("ppt/slides/slide{k}.xml")).collect();
    let sized = |shrink: u64| {
        let m: Vec<Member> = (1..=6u64)
            .zip(&slide_names)
            .map(|(k, name)| {
                let (cx, cy) = (8_229_240 - k * 3_600 - shrink, 3_977_280 - k * 7_200 - shrink);
                let title: Vec<String> = (1..=k).map(|i| (i * 11).to_string()).collect();
                let body = format!(
                    "<p:sld><a:t>{}</a:t><p:grpSpPr><a:xfrm><a:chExt cx=\"{}\"/></a:xfrm></p:grpSpPr><p:sp><a:xfrm><a:off x=\"{}\" y=\"0\"/><a:ext cx=\"{cx}\" cy=\"{cy}\"/></a:xfrm></p:sp><p:cxnSp><a:xfrm><a:off x=\"0\" y=\"0\"/><a:ext cx=\"360\" cy=\"0\"/></a:xfrm></p:cxnSp></p:sld>",
                    title.join(" "),
                    5_000 + k,
                    457_200 + k
                );
                Member::new(name.as_bytes(), body.into_bytes())
            })
            .collect();
        zip(&m)
    };
    let (b, n) = (sized(0), sized(360));
    let p = diff(&b, &n, &DiffOptions { no_learnt_amounts: false, ..opts.clone() }).unwrap();
    let bytes = encode(&p);
    assert_eq!(bytes[6] & 0x20, 0x20, "learnt amounts: flags {:#x} {p:?}", bytes[6]);
    let Body::Zip(z) = &p.body else { unreachable!("a zip patch") };
    let changes: usize = z
        .segments
        .iter()
        .cloned()
        .flat_map(|s| s.expand(&[]))
        .filter_map(|s| match s {
            Segment::Member(m) => match m.delta.middle {
                ec_patch::delta::Middle::Mapped(d) => Some(d.len()),
                _ => None,
            },
            _ => None,
        })
        .sum();
    assert_eq!(changes, 3, "the first slide's width, height and line width; none on the other five");
    let mut without = p.clone();
    if let Body::Zip(w) = &mut without.body {
        w.learnt_amounts = false;
    }
    assert!(ec_patch::apply_to_vec(&b, &encode(&without), &ec_patch::Limits::default()).is_err(), "the amounts make the target");
    out.valid(
        "zip-learnt-amounts",
        "Six slides whose shapes, each of a size of its own, shrank 360 EMU, and a line on each that kept its size: mode 9 with learnt amounts (flag bit 5), three changes in all",
        ("bases/zip-learnt-amounts.zip", &b),
        &n,
        &bytes,
    );
    let bref = ("bases/zip-learnt-amounts.zip", &b[..]);
    // The same save as a version 1 patch (valid: the base named by its whole
    // hash, no mode 9), with flag bit 5 set: malformed for that bit alone.
    let mut v = encode(&diff(&b, &n, &DiffOptions { max_version: Some(1), ..opts.clone() }).unwrap());
    assert_eq!((v[4], v[6]), (1, 0x01), "a version 1 patch, its section compressed and nothing else flagged");
    v[6] |= 0x20;
    out.invalid(
        "learnt-amounts-in-version-1",
        "zip-learnt-amounts' save as a valid version 1 patch with flag bit 5 set (reserved in version 1)",
        bref,
        &v,
        "malformed",
    );
    let mut v = encode(&diff(&b, &n, &DiffOptions { force_binary: true, ..opts.clone() }).unwrap());
    v[6] |= 0x20;
    out.invalid("learnt-amounts-on-binary", "A binary patch (kind 2) with flag bit 5 (learnt amounts) set", bref, &v, "malformed");

    // GUIDs apart (§2, flag bit 2): six layouts with new GUIDs and three slides.
    let deck6 = |shrink: u64, guids: &[String]| {
        let names: Vec<String> = (1..=3)
            .map(|k| format!("ppt/slides/slide{k}.xml"))
            .chain((1..=6).map(|k| format!("ppt/slideLayouts/slideLayout{k}.xml")))
            .collect();
        let mut m = vec![Member::new(b"[Content_Types].xml", b"<Types/>".to_vec())];
        for (i, name) in names.iter().enumerate() {
            let data = if i < 3 { slide_with_sizes(i as u64 + 1, shrink) } else { layout_with_guid(&guids[i - 3]) };
            m.push(Member::new(name.as_bytes(), data));
        }
        zip(&m)
    };
    let guid_of = |k: u64, salt: u64| {
        let x = k.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ salt.wrapping_mul(0xD1B5_4A32_D192_ED03);
        format!(
            "{{{:08X}-{:04X}-4{:03X}-{:04X}-{:012X}}}",
            x >> 32,
            (x >> 16) & 0xFFFF,
            x & 0xFFF,
            0x8000 | (x >> 48 & 0x3FFF),
            x.rotate_left(17) & 0xFFFF_FFFF_FFFF
        )
    };
    let (g0, g1): (Vec<String>, Vec<String>) = ((1..=6).map(|k| guid_of(k, 1)).collect(), (1..=6).map(|k| guid_of(k, 2)).collect());
    let (b, n) = (deck6(0, &g0), deck6(360, &g1));
    let bytes = encode(&diff(&b, &n, opts).unwrap());
    assert_eq!(bytes[6] & 0x05, 0x05, "a compressed section with its GUIDs apart: flags {:#x}", bytes[6]);
    out.valid(
        "zip-guids-apart",
        "Three slides whose shapes shrank and six layouts with new GUIDs: a compressed segment section with the six GUIDs apart after it (flag bit 2)",
        ("bases/zip-guids-apart.zip", &b),
        &n,
        &bytes,
    );
    let bref = ("bases/zip-guids-apart.zip", &b[..]);
    let end = bytes.len();
    out.invalid(
        "guids-apart-tail-short",
        "zip-guids-apart without the last GUID of its tail (16 bytes): the last layout's guid_count is above the GUIDs left",
        bref,
        &bytes[..end - 16],
        "malformed",
    );
    out.invalid(
        "guids-apart-tail-cut",
        "zip-guids-apart without the last byte of its tail: not a multiple of 16",
        bref,
        &bytes[..end - 1],
        "malformed",
    );
    let mut v = bytes.clone();
    v.extend_from_slice(&[0xAB; 16]);
    out.invalid("guids-apart-tail-extra", "zip-guids-apart with 16 more bytes in its tail than the section names", bref, &v, "malformed");
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "guids-apart-in-version-1",
        "zip-guids-apart with version byte 1 (flag bit 2 is reserved in version 1)",
        bref,
        &v,
        "malformed",
    );
}

/// Version 2's own vectors (edit-patch-v2.md §6), in `dir` (vectors/v2).
fn v2(dir: &Path) {
    use ec_patch::deflaters::{Deflater, KnownDeflate};
    for d in ["valid", "invalid", "bases"] {
        let _ = std::fs::remove_dir_all(dir.join(d));
    }
    let mut out = Out { dir: dir.to_path_buf(), entries: Vec::new() };
    // The vectors of the drafts before draft.20 without its learnt amounts
    // (flag bit 5), which would otherwise code some of them: each keeps
    // testing what it was made for; zip-learnt-amounts tests the amounts.
    let opts = DiffOptions { no_learnt_amounts: true, ..Default::default() };
    let text = document_xml(8000, 21);
    let mut text2 = text.clone();
    text2[text.len() / 3..text.len() / 3 + 4].copy_from_slice(b"EDIT");
    let miniz = KnownDeflate { deflater: Deflater::MinizOxide, level: 6 };
    let zrs = KnownDeflate { deflater: Deflater::ZlibRs, level: 6 };
    // Go's level 5, + 2.
    let go5 = KnownDeflate { deflater: Deflater::GoFlate, level: 7 };
    // zip's default level, on a text of more symbols than one zlib block
    // holds (on fewer, zip's bytes are zlib's, which the search finds first).
    let zip6 = KnownDeflate { deflater: Deflater::InfoZip, level: 6 };
    // 7-Zip's -mx=5 (its one level byte).
    let seven = KnownDeflate { deflater: Deflater::SevenZip, level: 5 };
    let long = document_xml(20_000, 11);
    let mut long2 = long.clone();
    long2[long.len() / 3..long.len() / 3 + 4].copy_from_slice(b"EDIT");
    let pair = |k: KnownDeflate, t: &[u8], t2: &[u8]| {
        let zip_of = |t: &[u8]| {
            let data = ec_patch::deflaters::deflate(t, k, u64::MAX).unwrap();
            zip_with_data(b"word/document.xml", t, &data)
        };
        (zip_of(t), zip_of(t2))
    };
    let mut patches = Vec::new();
    for (k, name, what) in [
        (
            miniz,
            "zip-miniz-oxide",
            "A part deflated by miniz_oxide 0.9.1 at level 6 (Rust's flate2, default backend), a word changed: recipe 7",
        ),
        (zrs, "zip-zlib-rs", "A part deflated by zlib-rs 0.6.8 at level 6 (Rust's flate2, zlib-rs backend), a word changed: recipe 8"),
        (
            KnownDeflate { deflater: Deflater::MinizOxide, level: 1 },
            "zip-miniz-oxide-level-1",
            "miniz_oxide at level 1 (flate2's Compression::fast()): recipe 7, level 1",
        ),
        (
            KnownDeflate { deflater: Deflater::ZlibRs, level: 0 },
            "zip-zlib-rs-level-0",
            "zlib-rs at level 0 (stored blocks): recipe 8, level 0",
        ),
        (
            go5,
            "zip-go-flate",
            "A part deflated by Go 1.19's compress/flate at level 5 (archive/zip's default compressor), a word changed: recipe 9, level byte 7",
        ),
        (
            KnownDeflate { deflater: Deflater::GoFlate, level: 11 },
            "zip-go-flate-level-9",
            "Go's compress/flate at level 9 (BestCompression): recipe 9, level byte 11",
        ),
        (
            KnownDeflate { deflater: Deflater::GoFlate, level: 0 },
            "zip-go-flate-huffman-only",
            "Go's compress/flate at level -2 (HuffmanOnly): recipe 9, level byte 0",
        ),
        (
            zip6,
            "zip-info-zip",
            "A part deflated by Info-ZIP's zip 3.0 at its default level 6 (zip -6), a word changed: recipe 10, level 6",
        ),
        (
            KnownDeflate { deflater: Deflater::InfoZip, level: 9 },
            "zip-info-zip-level-9",
            "Info-ZIP's zip 3.0 at level 9 (zip -9): recipe 10, level 9",
        ),
        (
            KnownDeflate { deflater: Deflater::InfoZip, level: 1 },
            "zip-info-zip-level-1",
            "Info-ZIP's zip 3.0 at level 1 (zip -1, its deflate_fast): recipe 10, level 1",
        ),
        (
            seven,
            "zip-seven-zip",
            "A part deflated by 7-Zip 26.02 as its zip writer does at -mx=5 (7z a -tzip -mm=Deflate -mx=5), a word changed: recipe 12, level 5",
        ),
        (
            KnownDeflate { deflater: Deflater::SevenZip, level: 1 },
            "zip-seven-zip-level-1",
            "7-Zip at -mx=1 (its fast mode, as -mx=2 to -mx=4): recipe 12, level 1",
        ),
    ] {
        let info_zip = k.deflater == Deflater::InfoZip;
        let (t, t2) = if info_zip { (&long[..], &long2[..]) } else { (&text[..], &text2[..]) };
        let (b, n) = pair(k, t, t2);
        let p = diff(&b, &n, &opts).unwrap();
        // Where zlib makes zip's bytes too (here, on 120 kB of text: zip's
        // deflater differs from zlib's mostly in where blocks end), the
        // search finds zlib's recipe first: recipe 10 is then set in the patch.
        let set = info_zip && !format!("{p:?}").contains(&format!("{k:?}"));
        let p = if set { with_member(&p, |m| m.recipe = Recipe::Known(k)) } else { p };
        let what = if set {
            format!("{what} (set in the patch: zlib at the same level makes the same bytes of this text, and the search finds that first)")
        } else {
            what.to_string()
        };
        let what = what.as_str();
        let bytes = encode(&p);
        assert_eq!(bytes[4], 2, "{name}");
        assert!(format!("{p:?}").contains(&format!("{k:?}")), "{name} uses {k:?}: {p:?}");
        let base = format!("bases/{name}.zip");
        out.valid(name, what, (&base, &b), &n, &bytes);
        patches.push((name, base, b, n, p, bytes));
    }
    let (_, base, b, n, p, bytes) = &patches[0];
    let b = (base.as_str(), &b[..]);
    // The recipe's tag and level bytes: where the patch with recipe 8 differs.
    let other = encode(&with_member(p, |m| m.recipe = Recipe::Known(zrs)));
    let at = (0..bytes.len()).find(|&i| bytes[i] != other[i]).expect("the tags differ");
    assert_eq!((bytes[at], bytes[at + 1]), (7, 6));
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "deflater-recipe-in-version-1",
        "A valid recipe 7 patch with version byte 1 (version 1 has no recipe 7)",
        b,
        &v,
        "malformed",
    );
    for (name, what, tag, level) in [
        ("miniz-oxide-level-11", "Recipe 7 with level 11 (0-10)", 7u8, 11u8),
        ("zlib-rs-level-10", "Recipe 8 with level 10 (0-9)", 8, 10),
        ("go-flate-level-12", "Recipe 9 with level byte 12 (0-11: Go's level -2 to 9, + 2)", 9, 12),
        ("info-zip-level-0", "Recipe 10 with level 0 (1-9: zip -0 stores, no deflate stream)", 10, 0),
        ("info-zip-level-10", "Recipe 10 with level 10 (1-9)", 10, 10),
        ("seven-zip-level-0", "Recipe 12 with level 0 (1-6: 7-Zip's -mx=0 stores, no deflate stream)", 12, 0),
        ("seven-zip-level-7", "Recipe 12 with level 7 (1-6: 7-Zip's multi-pass levels 7-9 are not defined)", 12, 7),
        ("unknown-recipe-13", "Recipe tag 13", 13, 6),
    ] {
        let mut v = bytes.clone();
        v[at] = tag;
        v[at + 1] = level;
        out.invalid(name, what, b, &v, "malformed");
    }
    out.invalid("deflater-level-missing", "Recipe 7 cut before its level byte", b, &bytes[..at + 1], "truncated");
    let frame = ec_patch::png::PngFrame { head_len: 0, tail_len: 0, chunk_size: 8192, first_chunk: 8192, zlib_header: [0x78, 0x9c] };
    out.invalid(
        "deflater-as-png-inner-recipe",
        "A PNG recipe whose inner recipe is recipe 7",
        b,
        &encode(&with_member(p, |m| m.recipe = Recipe::Png { frame, inner: Box::new(Recipe::Known(miniz)) })),
        "malformed",
    );
    out.invalid(
        "deflater-wrong-level",
        "Recipe 7 at level 9 for a part miniz_oxide wrote at level 6: the rebuilt file is not the target",
        b,
        &encode(&with_member(p, |m| m.recipe = Recipe::Known(KnownDeflate { level: 9, ..miniz }))),
        "target_mismatch",
    );
    let mut short = p.clone();
    short.target_size = n.len() as u64 - 100;
    out.invalid(
        "deflater-output-past-target",
        "Declared target 100 bytes shorter than the file: recipe 7's output passes it while it is made",
        b,
        &encode(&short),
        "malformed",
    );
    // Recipe 9's own invalid cases, from the Go vector.
    let (_, base, b, n, p, bytes) = &patches[4];
    let b = (base.as_str(), &b[..]);
    let other = encode(&with_member(p, |m| m.recipe = Recipe::Known(KnownDeflate { level: 7, ..miniz })));
    let at = (0..bytes.len()).find(|&i| bytes[i] != other[i]).expect("the tags differ");
    assert_eq!((bytes[at], bytes[at + 1]), (9, 7));
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "go-flate-recipe-in-version-1",
        "A valid recipe 9 patch with version byte 1 (version 1 has no recipe 9)",
        b,
        &v,
        "malformed",
    );
    let mut v = bytes.clone();
    v[at + 1] = 255;
    out.invalid(
        "go-flate-level-255",
        "Recipe 9 with level byte 255 (not a signed -1: the level byte is Go's level + 2)",
        b,
        &v,
        "malformed",
    );
    out.invalid("go-flate-level-missing", "Recipe 9 cut before its level byte", b, &bytes[..at + 1], "truncated");
    out.invalid(
        "go-flate-as-png-inner-recipe",
        "A PNG recipe whose inner recipe is recipe 9",
        b,
        &encode(&with_member(p, |m| m.recipe = Recipe::Png { frame, inner: Box::new(Recipe::Known(go5)) })),
        "malformed",
    );
    out.invalid(
        "go-flate-wrong-level",
        "Recipe 9 with level byte 8 (Go's 6) for a part Go wrote at level 5: the rebuilt file is not the target",
        b,
        &encode(&with_member(p, |m| m.recipe = Recipe::Known(KnownDeflate { level: 8, ..go5 }))),
        "target_mismatch",
    );
    let mut short = p.clone();
    short.target_size = n.len() as u64 - 100;
    out.invalid(
        "go-flate-output-past-target",
        "Declared target 100 bytes shorter than the file: recipe 9's output passes it while it is made",
        b,
        &encode(&short),
        "malformed",
    );
    // Recipe 10's own invalid cases, from the Info-ZIP vector.
    let (_, base, b, n, p, bytes) = &patches[7];
    let b = (base.as_str(), &b[..]);
    let other = encode(&with_member(p, |m| m.recipe = Recipe::Known(miniz)));
    let at = (0..bytes.len()).find(|&i| bytes[i] != other[i]).expect("the tags differ");
    assert_eq!((bytes[at], bytes[at + 1]), (10, 6));
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "info-zip-recipe-in-version-1",
        "A valid recipe 10 patch with version byte 1 (version 1 has no recipe 10)",
        b,
        &v,
        "malformed",
    );
    out.invalid("info-zip-level-missing", "Recipe 10 cut before its level byte", b, &bytes[..at + 1], "truncated");
    out.invalid(
        "info-zip-as-png-inner-recipe",
        "A PNG recipe whose inner recipe is recipe 10",
        b,
        &encode(&with_member(p, |m| m.recipe = Recipe::Png { frame, inner: Box::new(Recipe::Known(zip6)) })),
        "malformed",
    );
    out.invalid(
        "info-zip-wrong-level",
        "Recipe 10 at level 9 for a part zip wrote at level 6: the rebuilt file is not the target",
        b,
        &encode(&with_member(p, |m| m.recipe = Recipe::Known(KnownDeflate { level: 9, ..zip6 }))),
        "target_mismatch",
    );
    let mut short = p.clone();
    short.target_size = n.len() as u64 - 100;
    out.invalid(
        "info-zip-output-past-target",
        "Declared target 100 bytes shorter than the file: recipe 10's output passes it while it is made",
        b,
        &encode(&short),
        "malformed",
    );
    // Recipe 12's own invalid cases, from the 7-Zip vector.
    let (_, base, b, n, p, bytes) = &patches[10];
    let b = (base.as_str(), &b[..]);
    let other = encode(&with_member(p, |m| m.recipe = Recipe::Known(miniz)));
    let at = (0..bytes.len()).find(|&i| bytes[i] != other[i]).expect("the tags differ");
    assert_eq!((bytes[at], bytes[at + 1]), (12, 5));
    let mut v = bytes.clone();
    v[4] = 1;
    out.invalid(
        "seven-zip-recipe-in-version-1",
        "A valid recipe 12 patch with version byte 1 (version 1 has no recipe 12)",
        b,
        &v,
        "malformed",
    );
    out.invalid("seven-zip-level-missing", "Recipe 12 cut before its level byte", b, &bytes[..at + 1], "truncated");
    out.invalid(
        "seven-zip-as-png-inner-recipe",
        "A PNG recipe whose inner recipe is recipe 12",
        b,
        &encode(&with_member(p, |m| m.recipe = Recipe::Png { frame, inner: Box::new(Recipe::Known(seven)) })),
        "malformed",
    );
    let (_, base0, b0, _, p0, _) = &patches[0];
    out.invalid(
        "seven-zip-not-its-bytes",
        "Recipe 12 for a part miniz_oxide wrote at level 6: the rebuilt file is not the target",
        (base0.as_str(), &b0[..]),
        &encode(&with_member(p0, |m| m.recipe = Recipe::Known(seven))),
        "target_mismatch",
    );
    let mut short = p.clone();
    short.target_size = n.len() as u64 - 100;
    out.invalid(
        "seven-zip-output-past-target",
        "Declared target 100 bytes shorter than the file: recipe 12's output passes it while it is made",
        b,
        &encode(&short),
        "malformed",
    );
    guid_vectors(&mut out, &opts);
    drift_vectors(&mut out, &opts);
    renumbered_vectors(&mut out, &opts);
    prefix_vectors(&mut out, &opts);
    png_first_chunk_vectors(&mut out, &opts);
    let manifest = serde_json::json!({
        "format": "EdgeCourier edit patch",
        "format_version": 2,
        "how_to_check": "For each vector apply `patch` to `base`: valid ones give exactly `expect.size` bytes with SHA-256 `expect.sha256` (also in `target`); invalid ones fail with the error code `expect.error`. Paths are relative to this folder. Version 2's own vectors (edit-patch-v2.md §6); version 1's suite is the folder above.",
        "vectors": out.entries,
    });
    std::fs::write(dir.join("manifest.json"), serde_json::to_string_pretty(&manifest).unwrap() + "\n").unwrap();
    println!("wrote {} vectors to {}", manifest["vectors"].as_array().unwrap().len(), dir.display());
}
