//! diff_roundtrip: diff → encode → decode → apply_to_vec gives the new file back exactly.
//!
//! Input: first byte `sel`, then the rest.
//! - `sel & 1 == 0`: the rest drives a [`Case`] (arbitrary):
//!   - `Zip`: a ZIP built from fuzzer-chosen members (names, contents,
//!     stored / zlib / miniz deflate / odd methods, descriptors, extras,
//!     comments, ZIP64 records) as the base, and a mutated version as the
//!     new file (edited, replaced, added, removed, renamed, duplicated,
//!     reordered and recompressed members, changed timestamps, comment and
//!     trailing bytes; optionally damaged by pokes and truncation);
//!   - `Raw`: any bytes and an edited copy of them.
//! - `sel & 1 == 1`: the rest is `[u32 LE n][n bytes of base][new]` (seeds:
//!   pairs of versions of real documents).
//! - `sel & 2` (raw pairs) / the case's own flag: also with force_binary.
//!
//! Checks: diff succeeds (it may only refuse zip bombs / limits), decode
//! inverts encode, the patch applies and rebuilds the new file byte for byte.
//! An undamaged generated archive without stray signature bytes must scan
//! (diff itself may still choose the binary delta when it is smaller).
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use ec_patch_fuzz::checks::check_roundtrip;
use ec_patch_fuzz::split_framed;
use ec_patch_fuzz::zipgen::{apply_edits, count_signatures, Content, Edit, SmallVec, ZipCase};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
enum Case {
    Zip { case: ZipCase, force_binary: bool },
    Raw { base: Content, edits: SmallVec<Edit, 6>, force_binary: bool },
}

fuzz_target!(|data: &[u8]| {
    ec_patch_fuzz::init();
    let Some((&sel, rest)) = data.split_first() else { return };
    if sel & 1 == 1 {
        if let Some((base, new)) = split_framed(rest) {
            check_roundtrip(base, new, sel & 2 != 0);
        }
        return;
    }
    let Ok(case) = Case::arbitrary_take_rest(Unstructured::new(rest)) else { return };
    match case {
        Case::Zip { case, force_binary } => {
            let pair = case.build();
            let (b, n) = (&pair.base.bytes, &pair.new.bytes);
            check_roundtrip(b, n, force_binary);
            // diff may prefer the binary delta when it is smaller, but a
            // well-formed archive must always scan (else its edits are never
            // patched structurally).
            let clean = |built: &ec_patch_fuzz::zipgen::Built| count_signatures(&built.bytes) == built.signatures;
            if !pair.damaged {
                for (what, built) in [("base", &pair.base), ("new", &pair.new)] {
                    if clean(built) {
                        if let Err(e) = ec_patch_fuzz::scan(&built.bytes) {
                            panic!("a well-formed generated archive ({what}) does not scan: {e}");
                        }
                    }
                }
            }
        }
        Case::Raw { base, edits, force_binary } => {
            let base = base.render(256 << 10);
            let new = apply_edits(&base, &edits.0, 256 << 10);
            check_roundtrip(&base, &new, force_binary);
        }
    }
});
