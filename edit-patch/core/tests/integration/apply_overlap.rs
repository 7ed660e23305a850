//! `apply` makes a member's single zlib stream on a thread of its own while
//! the next member is started beside it (an .odt's thumbnail before its
//! block-parallel `content.xml`): the output stays byte-exact and in archive
//! order, the block-parallel member started ahead is still written block by
//! block (what the EPS forwards and hashes while later blocks deflate), and
//! what a member started ahead inflates counts against the limits.

use crate::common;

use common::{document_xml, recipes, words, zip, Member};
use ec_patch::deflate::LIBREOFFICE_BLOCK;
use ec_patch::{apply, diff, encode, DiffOptions, Limits, PatchError, Recipe};

/// A writer that keeps every `write` call's offset and length.
#[derive(Default)]
struct Recorder {
    bytes: Vec<u8>,
    writes: Vec<(usize, usize)>,
}

impl std::io::Write for Recorder {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.writes.push((self.bytes.len(), buf.len()));
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An .odt as LibreOffice lays it out: small parts, a single-stream member
/// of `thumb` (the thumbnail's place), then `content.xml` block-parallel
/// with its sizes in a data descriptor (deferred), then a small part.
fn odt(thumb: &[u8], content: &[u8], seed: u32) -> Vec<u8> {
    let mut mimetype = Member::new(b"mimetype", &b"application/vnd.oasis.opendocument.text"[..]);
    mimetype.deflate = false;
    let mut meta = Member::new(b"meta.xml", format!("<meta:editing-cycles>{seed}</meta:editing-cycles>").into_bytes());
    meta.descriptor = true;
    let mut thumbnail = Member::new(b"Thumbnails/thumbnail.xml", thumb.to_vec());
    thumbnail.descriptor = true;
    let mut big = Member::new(b"content.xml", content.to_vec());
    big.blocks = true;
    big.descriptor = true;
    let mut manifest = Member::new(b"META-INF/manifest.xml", &b"<manifest:manifest/>"[..]);
    manifest.descriptor = true;
    zip(&[mimetype, meta, thumbnail, big, manifest])
}

/// A thumbnail-sized part (about 200 kB) that differs all along with `seed`.
fn thumb(seed: u64) -> Vec<u8> {
    words(30_000, seed).into_bytes()
}

/// `new`'s data of the member named `name`: (offset, length).
fn data_of(new: &[u8], name: &[u8]) -> (usize, usize) {
    let l = ec_patch::zip::scan(new).unwrap();
    let e = l.entries.iter().find(|e| e.name == name).unwrap();
    (e.data_offset as usize, e.data_len as usize)
}

#[test]
fn the_member_after_a_single_stream_is_made_beside_it_and_still_written_block_by_block() {
    let body = document_xml(220_000, 21); // about 1.3 MB: 10 blocks of 128 KiB
    let blocks = body.len().div_ceil(LIBREOFFICE_BLOCK);
    assert!(blocks >= 8, "{blocks} blocks");
    let v0 = odt(&thumb(1), &body, 0);
    // An edit at the start: every block of content.xml is deflated again,
    // and the thumbnail's stream is made again from changed content.
    let mut b1 = body.clone();
    b1.insert(200, b'x');
    let v1 = odt(&thumb(2), &b1, 1);
    let patch = encode(&diff(&v0, &v1, &DiffOptions::default()).unwrap());
    let kinds: Vec<&str> = recipes(&patch)
        .iter()
        .map(|r| match r {
            Recipe::Zlib(_) => "zlib",
            Recipe::ZlibBlocks { .. } => "blocks",
            _ => "other",
        })
        .collect();
    assert_eq!(kinds, ["zlib", "zlib", "blocks"], "meta.xml, the thumbnail, content.xml");
    for round in 0..3 {
        let mut out = Recorder::default();
        let stats = apply(&v0, &patch, &mut out, &Limits::default()).unwrap();
        assert!(out.bytes == v1, "round {round}: rebuilt bytes differ");
        assert_eq!((stats.rebuilt_members, stats.written), (3, v1.len() as u64));
        // content.xml's data, started while the thumbnail was deflated, is
        // handed on in one write per block, never held and written whole.
        let (at, len) = data_of(&v1, b"content.xml");
        let inside: Vec<usize> = out.writes.iter().filter(|&&(o, _)| o >= at && o < at + len).map(|&(_, n)| n).collect();
        assert_eq!(inside.len(), blocks, "round {round}: writes of content.xml's data: {inside:?}");
        assert_eq!(inside.iter().sum::<usize>(), len);
        // The thumbnail's data, made on its own thread, is written once, in its place.
        let (at, len) = data_of(&v1, b"Thumbnails/thumbnail.xml");
        assert!(out.writes.contains(&(at, len)), "round {round}");
    }
}

#[test]
fn a_chain_of_saves_with_members_made_ahead_copies_unchanged_blocks_and_stays_exact() {
    let body = document_xml(220_000, 22);
    let blocks = body.len().div_ceil(LIBREOFFICE_BLOCK) as u64;
    let mut versions = vec![odt(&thumb(10), &body, 0)];
    let mut b = body.clone();
    for (i, at) in [b.len() - 3000, b.len() / 2, 100, b.len() - 10].into_iter().enumerate() {
        b.insert(at, b'q');
        versions.push(odt(&thumb(11 + i as u64), &b, i as u32 + 1));
    }
    let mut reused = Vec::new();
    for w in versions.windows(2) {
        let patch = encode(&diff(&w[0], &w[1], &DiffOptions::default()).unwrap());
        let mut out = Vec::new();
        let stats = apply(&w[0], &patch, &mut out, &Limits::default()).unwrap();
        assert!(out == w[1], "rebuilt bytes differ");
        reused.push(stats.reused_blocks);
    }
    // Nothing is known of the first base's blocks; then each base's layout
    // is known (from the diff that made it the new file, or the apply
    // before): the blocks before each edit are copied, by the member
    // started ahead too.
    assert_eq!(reused[0], 0, "{reused:?}");
    assert!(reused[1] > 0 && reused[1] < blocks, "{reused:?} of {blocks}");
    assert_eq!(reused[2], 0, "{reused:?}");
    assert!(reused[3] >= blocks - 2, "{reused:?} of {blocks}");
}

#[test]
fn several_large_single_streams_in_a_row_are_exact() {
    // Each member's stream is made beside the next one's: a chain of threads.
    let parts: Vec<Vec<u8>> = (0..5).map(|i| words(6_000 + 4_000 * i, 30 + i as u64).into_bytes()).collect();
    let make = |edit: bool| {
        let members: Vec<Member<'_>> = parts
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let mut p = p.clone();
                if edit {
                    p.insert(p.len() / 3, b'0' + i as u8);
                }
                let name: &'static [u8] = [&b"a.xml"[..], b"b.xml", b"c.xml", b"d.xml", b"e.xml"][i];
                let mut m = Member::new(name, p);
                m.descriptor = i % 2 == 1;
                m
            })
            .collect();
        zip(&members)
    };
    let (v0, v1) = (make(false), make(true));
    let patch = encode(&diff(&v0, &v1, &DiffOptions::default()).unwrap());
    assert_eq!(recipes(&patch).iter().filter(|r| matches!(r, Recipe::Zlib(_))).count(), 5);
    let mut out = Vec::new();
    let stats = apply(&v0, &patch, &mut out, &Limits::default()).unwrap();
    assert!(out == v1, "rebuilt bytes differ");
    assert_eq!(stats.rebuilt_members, 5);
}

#[test]
fn what_a_member_started_ahead_inflates_counts_against_the_limit() {
    let body = document_xml(220_000, 23);
    let v0 = odt(&thumb(40), &body, 0);
    let mut b1 = body.clone();
    b1.insert(500, b'y');
    let v1 = odt(&thumb(41), &b1, 1);
    let patch = encode(&diff(&v0, &v1, &DiffOptions::default()).unwrap());
    // Room for the small parts and the thumbnail, not for content.xml too.
    let before = 1000 + thumb(40).len() as u64;
    let limits = Limits { max_total_inflated: before + body.len() as u64 / 2, ..Limits::default() };
    let mut out = Vec::new();
    match apply(&v0, &patch, &mut out, &limits) {
        Err(PatchError::LimitExceeded { what: "total inflated size", value, limit }) => {
            assert_eq!(limit, limits.max_total_inflated);
            assert!(value > limit && value <= before + body.len() as u64, "{value}");
        }
        other => panic!("{other:?}"),
    }
    // The bytes written before the refusal end before content.xml's data.
    assert!(out.len() <= data_of(&v1, b"content.xml").0, "{} bytes written", out.len());
    // With the default limits the same patch applies.
    let mut out = Vec::new();
    apply(&v0, &patch, &mut out, &Limits::default()).unwrap();
    assert!(out == v1);
}
