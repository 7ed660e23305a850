//! content_delta: the standalone ec-diff content delta (`ec_patch::delta`).
//!
//! Input: first byte `sel` (mod 3), then the rest.
//! - 0: `[u32 LE n][n bytes of base][delta bytes]`: `decode_and_apply` on
//!   hostile deltas never panics; on success the output is the base's
//!   declared prefix, a middle of the declared length, and the rest of the base.
//! - 1: the rest drives a base ([`Content`]) and [`Edit`]s that make the new
//!   version (inserts, deletes, overwrites, moved blocks, long repeated tails).
//! - 2: `[u32 LE n][n bytes of base][new]` (seeds: versions of real XML parts).
//!
//! Round trip (modes 1, 2): diff → apply gives new; diff → encode →
//! decode_and_apply gives new; the trims agree with a naive computation.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use ec_patch::delta;
use ec_patch_fuzz::zipgen::{apply_edits, Content, Edit, SmallVec};
use ec_patch_fuzz::{limits, read_varint, split_framed};
use libfuzzer_sys::fuzz_target;

const CAP: usize = 256 << 10;

#[derive(Arbitrary, Debug)]
struct Case {
    base: Content,
    edits: SmallVec<Edit, 6>,
}

/// Parses the wire form far enough to know what a successful apply must
/// have produced: (prefix, replaced base length, new middle length).
fn declared(bytes: &[u8]) -> (u64, u64, u64) {
    let (prefix, a) = read_varint(bytes).expect("decoded delta has a prefix");
    let (base_mid, b) = read_varint(&bytes[a..]).expect("decoded delta has a replaced length");
    let rest = &bytes[a + b..];
    let (mid_len, _) = read_varint(&rest[1..]).expect("decoded delta has a middle length");
    (prefix, base_mid, mid_len)
}

fn apply_hostile(base: &[u8], bytes: &[u8]) {
    ec_patch_fuzz::dump("base", base);
    ec_patch_fuzz::dump("delta", bytes);
    let Ok(out) = delta::decode_and_apply(base, bytes, &limits()) else { return };
    let (prefix, base_mid, mid_len) = declared(bytes);
    let (p, m) = (prefix as usize, base_mid as usize);
    assert!(p + m <= base.len(), "replaced bytes {p}+{m} past the end of a {}-byte base", base.len());
    let suffix = base.len() - p - m;
    assert_eq!(out.len(), p + mid_len as usize + suffix, "output length is not prefix + middle + suffix");
    assert!(out[..p] == base[..p], "kept prefix differs from the base's");
    assert!(out[out.len() - suffix..] == base[p + m..], "kept suffix differs from the base's");
}

fn roundtrip(base: &[u8], new: &[u8]) {
    ec_patch_fuzz::dump("base", base);
    ec_patch_fuzz::dump("new", new);
    let naive_p = base.iter().zip(new).take_while(|(a, b)| a == b).count();
    assert_eq!(delta::common_prefix(base, new), naive_p, "common_prefix");
    let naive_s = base.iter().rev().zip(new.iter().rev()).take_while(|(a, b)| a == b).count();
    assert_eq!(delta::common_suffix(base, new), naive_s, "common_suffix");
    let d = delta::diff(base, new).unwrap_or_else(|e| panic!("delta::diff failed: {e}"));
    assert!(d.prefix + d.base_mid <= base.len() as u64, "delta replaces bytes past the end of the base");
    let out = delta::apply(base, &d, &limits()).unwrap_or_else(|e| panic!("delta::apply of a fresh delta failed: {e}"));
    assert!(out == new, "delta::apply rebuilt other bytes");
    let bytes = delta::encode(&d);
    let out = delta::decode_and_apply(base, &bytes, &limits()).unwrap_or_else(|e| panic!("decode_and_apply of a fresh delta ({} bytes, base {} bytes, new {} bytes) failed: {e}", bytes.len(), base.len(), new.len()));
    assert!(out == new, "decode_and_apply rebuilt other bytes");
}

fuzz_target!(|data: &[u8]| {
    ec_patch_fuzz::init();
    let Some((&sel, rest)) = data.split_first() else { return };
    match sel % 3 {
        0 => {
            if let Some((base, bytes)) = split_framed(rest) {
                apply_hostile(base, bytes);
            }
        }
        1 => {
            let Ok(c) = Case::arbitrary_take_rest(Unstructured::new(rest)) else { return };
            let base = c.base.render(CAP);
            let new = apply_edits(&base, &c.edits.0, CAP);
            roundtrip(&base, &new);
        }
        _ => {
            if let Some((base, new)) = split_framed(rest) {
                roundtrip(base, new);
            }
        }
    }
});
