//! Block-parallel members (LibreOffice's ThreadedDeflater): what is learnt
//! about a version's compressed blocks when a patch is made or applied is
//! reused when that version is the base of the next patch, and the result
//! stays byte-exact whatever the edit.

use crate::common;

use common::{document_xml, zip, Member};
use ec_patch::{apply, decode, diff, diff_verified, encode, verify, DiffOptions, Limits, PatchError};
use sha2::{Digest, Sha256};

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

/// `docx` whose document.xml block `odd` is compressed at zlib level 1 (the
/// others at level 6, as LibreOffice writes them all).
fn docx_with_odd_block(body: &[u8], seed: u32, odd: usize) -> Vec<u8> {
    let data = common::blocks_with_odd(body, Some(odd));
    common::zip_with_data(
        &[
            Member::new(b"docProps/core.xml", format!("<cp:revision>{seed}</cp:revision>").into_bytes()),
            Member::new(b"word/document.xml", body.to_vec()),
            Member::new(b"word/styles.xml", &b"<w:styles/>"[..]),
        ],
        &[None, Some(data), None],
    )
}

fn spot() -> DiffOptions {
    DiffOptions { spot_check: true, ..Default::default() }
}

#[test]
fn spot_checked_patches_are_the_same_patches_for_a_block_writer() {
    // A chain of saves as LibreOffice writes them: the spot check makes the
    // very patches the full check makes, cold or warm, and they apply exactly.
    // From the second save on, the new version's inflation starts at the
    // block its edit is in (the base's content is kept): characters
    // inserted, one deleted at a block's end, one replaced at a block's start.
    let body = document_xml(300_000, 11);
    let mut versions = vec![docx(&body, 0)];
    let mut b = body.clone();
    for (i, at) in [b.len() / 2, 1000, b.len() - 200, b.len() / 3].into_iter().enumerate() {
        b.insert(at, b'q');
        versions.push(docx(&b, i as u32 + 1));
    }
    b.remove(2 * (128 << 10) - 1);
    versions.push(docx(&b, 5));
    b[3 * (128 << 10)] ^= 1;
    versions.push(docx(&b, 6));
    for w in versions.windows(2) {
        let strict = encode(&diff(&w[0], &w[1], &DiffOptions::default()).unwrap());
        let spotted = encode(&diff(&w[0], &w[1], &spot()).unwrap());
        assert_eq!(spotted, strict);
        let mut out = Vec::new();
        apply(&w[0], &spotted, &mut out, &Limits::default()).unwrap();
        assert!(out == w[1]);
    }
}

#[test]
fn a_wrong_claim_fails_the_receivers_hash_check_never_silently() {
    // The new file's document.xml has one late block written at level 1: the
    // spot check (first changed block, last block) does not see it, so the
    // patch claims level 6 throughout; apply rebuilds level 6 and refuses the
    // result (target_mismatch). The full check and diff_verified see it.
    let body = document_xml(300_000, 12);
    let count = body.len().div_ceil(128 << 10);
    let v0 = docx(&body, 0);
    let mut b1 = body.clone();
    b1.insert(2 * (128 << 10) + 77, b'x');
    let v1 = docx_with_odd_block(&b1, 1, count - 3);
    assert!(v1 != docx(&b1, 1));
    for base in [&v0, &v0] {
        // Twice: cold (nothing known of v0), then with v0's layout learnt.
        let claimed = encode(&diff(base, &v1, &spot()).unwrap());
        let err = apply(base, &claimed, &mut Vec::new(), &Limits::default()).unwrap_err();
        assert_eq!(err.code(), "target_mismatch");
        let _ = applied(&docx(&body[1..], 9), &v0); // teaches v0's layout (checked, as the new file of a patch)
    }
    let strict = encode(&diff(&v0, &v1, &DiffOptions::default()).unwrap());
    let mut out = Vec::new();
    apply(&v0, &strict, &mut out, &Limits::default()).unwrap();
    assert!(out == v1);
    let verified = ec_patch::diff_verified(&v0, &v1, &spot()).unwrap();
    let mut out = Vec::new();
    apply(&v0, &verified, &mut out, &Limits::default()).unwrap();
    assert!(out == v1);
    // The claim about v1 is not trusted by a full check or by apply: a patch
    // against v1 (as the base) made without the spot check is exact.
    let mut b2 = b1.clone();
    b2.insert(b1.len() - 100, b'y');
    let v2 = docx(&b2, 2);
    let _ = diff(&v0, &v1, &spot()).unwrap(); // the claim about v1's layout, remembered
    let mut out = Vec::new();
    apply(&v1, &encode(&diff(&v1, &v2, &DiffOptions::default()).unwrap()), &mut out, &Limits::default()).unwrap();
    assert!(out == v2);
}

/// The differ's self-check ([`verify`]) copies the blocks of the expected
/// file whose layout this process checked, where the rebuilt input is the
/// same: after an edit at the start, every block.
#[test]
fn verifying_copies_the_expected_files_checked_blocks() {
    let body = document_xml(300_000, 11);
    let blocks = body.len().div_ceil(128 << 10) as u64;
    let v0 = docx(&body, 0);
    let mut b1 = body.clone();
    b1.insert(100, b'x');
    let v1 = docx(&b1, 1);
    let patch = encode(&diff(&v0, &v1, &DiffOptions::default()).unwrap());
    let stats = verify(&v0, &patch, &v1, &Limits::default()).unwrap();
    assert_eq!(stats.reused_blocks, blocks, "every block of v1's document.xml copied");
    assert_eq!(stats.written, v1.len() as u64);
    assert_eq!(diff_verified(&v0, &v1, &DiffOptions::default()).unwrap(), patch);
}

/// Copying blocks from the expected file never makes a wrong patch pass: a
/// patch that rebuilds other bytes fails, even when it declares the expected
/// file's hash and all but one of its blocks can be copied.
#[test]
fn a_patch_that_rebuilds_other_bytes_fails_verification() {
    let body = document_xml(300_000, 12);
    let v0 = docx(&body, 0);
    let mut b1 = body.clone();
    b1.insert(100, b'x');
    let v1 = docx(&b1, 1);
    let mut b2 = b1.clone();
    let late = b2.len() - 20_000;
    b2[late] = if b2[late] == b'q' { b'r' } else { b'q' };
    let v2 = docx(&b2, 1);
    let limits = Limits::default();
    verify(&v0, &encode(&diff(&v0, &v1, &DiffOptions::default()).unwrap()), &v1, &limits).unwrap();
    let to_v2 = encode(&diff(&v0, &v2, &DiffOptions::default()).unwrap());
    // Declaring v2's hash: refused before any work.
    assert!(matches!(verify(&v0, &to_v2, &v1, &limits), Err(PatchError::TargetMismatch { .. })));
    // Declaring v1's size and hash: rebuilt, the one changed block deflated, and refused.
    let mut forged = decode(&to_v2, &limits).unwrap();
    forged.target_size = v1.len() as u64;
    forged.target_sha256 = Sha256::digest(&v1).into();
    let got = verify(&v0, &encode(&forged), &v1, &limits);
    // (Refused as a mismatch, or as bytes past the declared size: v2's member compresses to another length.)
    assert!(
        matches!(got, Err(PatchError::TargetMismatch { .. }))
            || matches!(&got, Err(PatchError::Malformed { detail, .. }) if detail.contains("more than the declared")),
        "{got:?}"
    );
}

/// LibreOffice's members carry data descriptors (their local headers do not
/// wait for the sizes): such a block-parallel member is written to the
/// output block by block as it is made, and a member this process made
/// keeps its content for the next patch against it. A chain of saves,
/// edits at the start, middle and end, some to the same version twice, stays
/// byte-exact, with the output taken in small writes.
#[test]
fn members_with_descriptors_are_rebuilt_block_by_block_and_stay_exact() {
    struct Trickle(Vec<u8>, usize);
    impl std::io::Write for Trickle {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.1 += 1;
            let n = b.len().min(4096);
            self.0.extend_from_slice(&b[..n]);
            Ok(n)
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let with_descriptors = |body: &[u8], seed: u32| {
        let mut big = Member::new(b"word/document.xml", body.to_vec());
        big.blocks = true;
        big.descriptor = true;
        let mut small = Member::new(b"docProps/core.xml", format!("<cp:revision>{seed}</cp:revision>").into_bytes());
        small.descriptor = true;
        zip(&[small, big, Member::new(b"word/styles.xml", &b"<w:styles/>"[..])])
    };
    let body = document_xml(300_000, 11);
    let mut versions = vec![with_descriptors(&body, 0)];
    let mut b = body.clone();
    for (i, at) in [b.len() / 2, 10, b.len() - 10, b.len() / 3].into_iter().enumerate() {
        b.insert(at, b'q');
        versions.push(with_descriptors(&b, i as u32 + 1));
    }
    let opts = DiffOptions::default();
    let mut reused = 0;
    // base -> new -> base -> new ...: each rebuilt version is the next base.
    for pair in versions.windows(2).chain(std::iter::once(&versions[3..5])) {
        let (base, new) = (&pair[0], &pair[1]);
        let patch = encode(&diff(base, new, &opts).unwrap());
        let mut out = Trickle(Vec::new(), 0);
        let stats = apply(base, &patch, &mut out, &Limits::default()).unwrap();
        assert!(out.0 == *new, "rebuilt bytes differ");
        assert!(out.1 > 2, "written in pieces");
        reused += stats.reused_blocks;
        let back = encode(&diff(new, base, &opts).unwrap());
        let mut again = Vec::new();
        apply(new, &back, &mut again, &Limits::default()).unwrap();
        assert!(again == *base, "rebuilt bytes differ");
    }
    assert!(reused > 0);
}

/// A process that knows nothing of the base's blocks (a cold `ecsync apply`)
/// claims the base member's layout from its block boundaries
/// ([`ApplyOptions::claim_layouts`]): it copies the unchanged blocks and makes
/// the shifted ones from the base's parse, and the file is exact.
#[test]
fn a_cold_apply_claims_the_base_layout_and_stays_exact() {
    use ec_patch::{apply_with, ApplyOptions};
    let body = document_xml(300_000, 14);
    let count = body.len().div_ceil(128 << 10) as u64;
    let v0 = docx(&body, 0);
    for at in [100, body.len() / 2, body.len() - 50] {
        let mut b1 = body.clone();
        b1.insert(at, b'x');
        let v1 = docx(&b1, 1);
        let patch = encode(&diff(&v0, &v1, &DiffOptions::default()).unwrap());
        let (mut plain, mut claimed) = (Vec::new(), Vec::new());
        let p = apply(&v0, &patch, &mut plain, &Limits::default()).unwrap();
        let c = apply_with(&v0, &patch, &mut claimed, &Limits::default(), ApplyOptions { claim_layouts: true }).unwrap();
        assert!(plain == v1 && claimed == v1, "edit at {at}");
        assert_eq!((p.claimed_layouts, p.reused_blocks), (0, 0), "edit at {at}: nothing known of v0 without claims");
        assert_eq!(c.claimed_layouts, 1, "edit at {at}");
        assert_eq!(c.reused_blocks, (at / (128 << 10)) as u64, "edit at {at}: the blocks before the edit copied");
        assert!(c.reused_blocks < count);
        assert_eq!(ec_patch::apply_to_vec(&v0, &patch, &Limits::default()).unwrap(), v1);
    }
}

/// A wrong claim (the base's block boundaries are where the recipe puts
/// them, but one block was written at another level) spoils the file, which
/// fails its SHA-256 check; `apply_to_vec` then makes it again from zlib
/// alone: the claim costs time, never bytes.
#[test]
fn a_wrong_claimed_base_layout_fails_the_hash_check_and_is_made_again() {
    use ec_patch::{apply_with, ApplyOptions};
    let body = document_xml(300_000, 15);
    let count = body.len().div_ceil(128 << 10);
    let v0 = docx_with_odd_block(&body, 0, count - 3);
    for at in [100, body.len() - 50] {
        let mut b1 = body.clone();
        b1.insert(at, b'x');
        let v1 = docx(&b1, 1);
        let patch = encode(&diff(&v0, &v1, &DiffOptions::default()).unwrap());
        let claims = ApplyOptions { claim_layouts: true };
        let err = apply_with(&v0, &patch, &mut Vec::new(), &Limits::default(), claims).unwrap_err();
        assert!(matches!(err.code(), "target_mismatch" | "malformed"), "edit at {at}: {err}");
        assert_eq!(ec_patch::apply_to_vec(&v0, &patch, &Limits::default()).unwrap(), v1, "edit at {at}");
        let mut out = Vec::new();
        apply(&v0, &patch, &mut out, &Limits::default()).unwrap();
        assert!(out == v1);
    }
}

/// `learn` on a version that was not diffed (a whole save, a download)
/// learns what the next patch against it needs: without it nothing is known
/// of that version's blocks (see the chain test above); with it, apply
/// copies the blocks before an edit, and the patches are the same.
#[test]
fn learning_a_version_ahead_makes_its_next_patch_warm_and_the_same() {
    let body = document_xml(300_000, 16);
    let count = body.len().div_ceil(128 << 10);
    let v0 = docx(&body, 0);
    let mut b1 = body.clone();
    let at = body.len() / 2;
    b1.insert(at, b'x');
    let v1 = docx(&b1, 1);
    assert_eq!(ec_patch::learn(&v0, &Limits::default(), false).unwrap(), 1);
    assert_eq!(ec_patch::learn(&v0, &Limits::default(), false).unwrap(), 0, "already known");
    let patch = encode(&diff(&v0, &v1, &DiffOptions::default()).unwrap());
    let mut out = Vec::new();
    let stats = apply(&v0, &patch, &mut out, &Limits::default()).unwrap();
    assert!(out == v1);
    assert_eq!(stats.reused_blocks, (at / (128 << 10)) as u64, "the blocks before the edit copied");
    // The spot-checked learning serves the spot-checked diff: the same patch as the full check's.
    let body2 = document_xml(300_000, 17);
    let w0 = docx(&body2, 0);
    let mut c1 = body2.clone();
    c1.insert(1000, b'y');
    let w1 = docx(&c1, 1);
    assert_eq!(ec_patch::learn(&w0, &Limits::default(), true).unwrap(), 1);
    assert_eq!(encode(&diff(&w0, &w1, &spot()).unwrap()), encode(&diff(&w0, &w1, &DiffOptions::default()).unwrap()));
    // Not a ZIP, or no block-parallel member: nothing learnt.
    assert_eq!(ec_patch::learn(b"plain text", &Limits::default(), false).unwrap(), 0);
    let small = docx(b"<w:document/>", 0);
    assert_eq!(ec_patch::learn(&small, &Limits::default(), false).unwrap(), 0);
    // A member with one block at another level: the full check learns nothing;
    // the spot check's claim (it samples the first and last blocks) is refuted by
    // the next diff, whose patch is still the full check's, and exact.
    let body3 = document_xml(300_000, 18);
    let odd = docx_with_odd_block(&body3, 0, count / 2);
    assert_eq!(ec_patch::learn(&odd, &Limits::default(), false).unwrap(), 0);
    assert_eq!(ec_patch::learn(&odd, &Limits::default(), true).unwrap(), 1);
    let mut d1 = body3.clone();
    d1.insert(50, b'z');
    let new = docx(&d1, 1);
    let spotted = encode(&diff(&odd, &new, &spot()).unwrap());
    assert_eq!(spotted, encode(&diff(&odd, &new, &DiffOptions::default()).unwrap()));
    let mut out = Vec::new();
    apply(&odd, &spotted, &mut out, &Limits::default()).unwrap();
    assert!(out == new);
}

/// `learn` runs on files a peer sent (the EPS on a FULL save): what it
/// inflates counts towards `max_total_inflated`, small members too, and a
/// file past it is refused before more is inflated.
#[test]
fn learning_is_bounded_by_the_total_inflated_size() {
    let members: Vec<Vec<u8>> = (0..20).map(|i| common::words(20_000, 100 + i).into_bytes()).collect();
    let names: Vec<String> = (0..20).map(|i| format!("part{i}.xml")).collect();
    let file = zip(&members.iter().zip(&names).map(|(m, n)| Member::new(n.as_bytes(), m.clone())).collect::<Vec<_>>());
    for m in &members {
        // Each one smaller than a block, yet worth inflating (not a tiny member).
        assert!(m.len() <= 128 << 10 && ec_patch::deflate::deflate(m, common::ZLIB6).unwrap().len() >= 8 << 10, "{}", m.len());
    }
    let total: u64 = members.iter().map(|m| m.len() as u64).sum();
    let tight = Limits { max_total_inflated: total / 2, ..Limits::default() };
    let err = ec_patch::learn(&file, &tight, false).unwrap_err();
    assert_eq!(err.code(), "limit_exceeded", "{err}");
    assert_eq!(ec_patch::learn(&file, &Limits::default(), false).unwrap(), 0, "no block-parallel member");
}
