//! patch_apply: applying hostile patches (and patches to hostile bases).
//!
//! Input: first byte `sel`, then the rest.
//! - `sel & 3 == 0 or 3`: the rest is a patch for the fixed real base
//!   `FIXED_BASES[sel >> 3]` (small documents embedded from fixtures/; seeds
//!   are valid patches against them, made by ecsync).
//! - `sel & 3 == 1`: the rest is `[u32 LE n][n bytes of base][patch]`: any base.
//! - `sel & 3 == 2`: the rest drives a [`ZipCase`]; the real patch between
//!   its two archives is made with `diff`, then damaged by the fuzzer's
//!   `pokes` before it is applied (reaches deep into valid zstd frames,
//!   segment lists and recipes).
//! - `sel & 4`: rewrite the base size and SHA-256 the patch declares so they
//!   name the base given, so that a mutated base or base hash still gets past
//!   the wrong-base check (the target hash is never touched).
//!
//! Checks: apply and apply_to_vec never panic and agree; Ok only with output
//! of exactly the declared size and SHA-256, from the declared base;
//! inspect never panics.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use ec_patch_fuzz::checks::check_apply;
use ec_patch_fuzz::zipgen::{SmallVec, ZipCase};
use ec_patch_fuzz::{fixup_base, split_framed, FIXED_BASES};
use libfuzzer_sys::fuzz_target;

#[derive(Arbitrary, Debug)]
struct Damaged {
    case: ZipCase,
    /// (position, xor mask) applied to the encoded patch.
    pokes: SmallVec<(u16, u8), 4>,
    /// Bytes cut from the end of the patch.
    cut: u8,
}

fn run(base: &[u8], patch: &[u8], fixup: bool) {
    match fixup.then(|| fixup_base(patch, base)).flatten() {
        Some(p) => check_apply(base, &p),
        None => check_apply(base, patch),
    }
}

fuzz_target!(|data: &[u8]| {
    ec_patch_fuzz::init();
    let Some((&sel, rest)) = data.split_first() else { return };
    let fixup = sel & 4 != 0;
    match sel & 3 {
        1 => {
            if let Some((base, patch)) = split_framed(rest) {
                run(base, patch, fixup);
            }
        }
        2 => {
            let Ok(d) = Damaged::arbitrary_take_rest(Unstructured::new(rest)) else { return };
            let pair = d.case.build();
            let Ok(p) = ec_patch::diff(&pair.base.bytes, &pair.new.bytes, &Default::default()) else { return };
            let mut patch = ec_patch::encode(&p);
            for &(at, mask) in &d.pokes.0 {
                let i = at as usize % patch.len();
                patch[i] ^= mask;
            }
            patch.truncate(patch.len().saturating_sub(d.cut as usize % 4));
            run(&pair.base.bytes, &patch, true);
        }
        _ => run(FIXED_BASES[(sel >> 3) as usize % FIXED_BASES.len()], rest, fixup),
    }
});
