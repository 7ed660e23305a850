//! Block-parallel members (LibreOffice's ThreadedDeflater): what is learnt
//! about a version's compressed blocks when a patch is made or applied is
//! reused when that version is the base of the next patch, and the result
//! stays byte-exact whatever the edit.

mod common;

use common::{document_xml, zip, Member};
use ec_patch::{apply, diff, encode, DiffOptions, Limits};

fn docx(body: &[u8], seed: u32) -> Vec<u8> {
    let mut big = Member::new(b"word/document.xml", body.to_vec());
    big.blocks = true;
    zip(&[
        Member::new(b"docProps/core.xml", format!("<cp:revision>{seed}</cp:revision>").into_bytes()),
        big,
        Member::new(b"word/styles.xml", &b"<w:styles/>"[..]),
    ])
}

/// Applies `patch` to `base`, checking the result is `new`; returns the blocks copied from the base.
fn applied(base: &[u8], new: &[u8]) -> u64 {
    let opts = DiffOptions::default();
    let patch = encode(&diff(base, new, &opts).unwrap());
    let mut out = Vec::new();
    let stats = apply(base, &patch, &mut out, &Limits::default()).unwrap();
    assert!(out == new, "rebuilt bytes differ");
    stats.reused_blocks
}

#[test]
fn a_chain_of_saves_copies_the_unchanged_blocks_and_stays_exact() {
    let body = document_xml(400_000, 7); // about 2.4 MB: 19 blocks of 128 KiB
    let blocks = body.len().div_ceil(128 << 10) as u64;
    assert!(blocks > 10);
    let v0 = docx(&body, 0);
    // v1: one character typed near the end.
    let mut b1 = body.clone();
    b1.insert(body.len() - 5000, b'x');
    let v1 = docx(&b1, 1);
    // The first patch against v0: nothing is known about v0's blocks yet.
    assert_eq!(applied(&v0, &v1), 0);
    // v2: one more character near the end of v1. v1's layout was learnt
    // when its recipe was found (and when it was rebuilt): all blocks but
    // the last are copied.
    let mut b2 = b1.clone();
    let at = b1.len() - 3000;
    b2.insert(at, b'y');
    let v2 = docx(&b2, 2);
    assert_eq!(applied(&v1, &v2), (at / (128 << 10)) as u64);
    assert!(at / (128 << 10) >= blocks as usize - 2);
    // v3: an edit in the middle of v2: the blocks before it are copied.
    let mut b3 = b2.clone();
    let at = b2.len() / 2;
    b3[at] = b'Z';
    let v3 = docx(&b3, 3);
    let middle = applied(&v2, &v3);
    assert!(middle > 0 && middle < blocks, "{middle} of {blocks}");
    // v4: a deletion at the start, then the length shrinks across a block
    // boundary, then it grows past one: every block recomputed or copied
    // where the input allows, the bytes always exact.
    let b4 = b3[10..].to_vec();
    let v4 = docx(&b4, 4);
    applied(&v3, &v4);
    let b5 = b4[..b4.len() - (b4.len() % (128 << 10)) - 7].to_vec();
    let v5 = docx(&b5, 5);
    applied(&v4, &v5);
    let mut b6 = b5.clone();
    b6.extend(document_xml(30_000, 9));
    let v6 = docx(&b6, 6);
    applied(&v5, &v6);
    let v7 = docx(&b6, 7); // content unchanged: a member copied whole
    applied(&v6, &v7);
}

#[test]
fn a_base_whose_blocks_differ_from_the_new_files_is_not_trusted() {
    // The same content written as one zlib stream (another writer): the new
    // file's unchanged blocks cannot be copied from it, and the patch is exact.
    let body = document_xml(200_000, 3);
    let mut single = Member::new(b"word/document.xml", body.clone());
    single.blocks = false;
    let v0 = zip(&[single]);
    let mut b1 = body.clone();
    b1.push(b' ');
    let mut big = Member::new(b"word/document.xml", b1.clone());
    big.blocks = true;
    let v1 = zip(&[big]);
    assert_eq!(applied(&v0, &v1), 0);
    // And back: v1's layout is known, but v2's member is a single stream again.
    let mut b2 = b1.clone();
    b2.push(b'!');
    let mut single2 = Member::new(b"word/document.xml", b2);
    single2.blocks = false;
    let v2 = zip(&[single2]);
    assert_eq!(applied(&v1, &v2), 0);
}
