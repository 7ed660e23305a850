//! Shared code for the ec-patch fuzz targets (see docs/fuzzing.md):
//! input framing, the fixed bases embedded in `patch_apply`, a small ZIP
//! writer driven by `arbitrary` ([`zipgen`]), and the invariant checks the
//! targets share ([`checks`]).

pub mod checks;
pub mod zipgen;

use ec_patch::Limits;
use sha2::{Digest, Sha256};

/// Limits used by every target: the production defaults, so that what the
/// fuzzer finds is what a receiver running `ecsync` would hit.
pub fn limits() -> Limits {
    Limits::default()
}

pub fn sha256(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// Small real bases for `patch_apply` (made by `seed --write-fixtures`; the
/// seed script makes valid patches against exactly these bytes). Keep them
/// in file-name order: `unpack` and the core's replay of the reproducers
/// (`tests/integration/bad_input.rs`) index the sorted `fixtures/` the same way.
pub const FIXED_BASES: [&[u8]; 5] = [
    include_bytes!("../fixtures/base0.docx"),
    include_bytes!("../fixtures/base1.odt"),
    include_bytes!("../fixtures/base2.xlsx"),
    include_bytes!("../fixtures/base3.txt"),
    include_bytes!("../fixtures/base4.zip"),
];

/// Splits `[u32 LE length n][n bytes][rest]` into its two parts. Inputs whose
/// length field runs past the end are cut short rather than rejected, so that
/// every input means something.
pub fn split_framed(data: &[u8]) -> Option<(&[u8], &[u8])> {
    if data.len() < 4 {
        return None;
    }
    let n = u32::from_le_bytes(data[..4].try_into().unwrap()) as usize;
    let rest = &data[4..];
    let n = n.min(rest.len());
    Some(rest.split_at(n))
}

/// Frames two byte strings the way [`split_framed`] reads them.
pub fn frame(a: &[u8], b: &[u8]) -> Vec<u8> {
    let mut v = Vec::with_capacity(4 + a.len() + b.len());
    v.extend_from_slice(&(a.len() as u32).to_le_bytes());
    v.extend_from_slice(a);
    v.extend_from_slice(b);
    v
}

/// A LEB128 varint at the start of `b`: (value, bytes used).
pub fn read_varint(b: &[u8]) -> Option<(u64, usize)> {
    let mut v = 0u64;
    for (i, &byte) in b.iter().enumerate().take(10) {
        v |= u64::from(byte & 0x7f).checked_shl(7 * i as u32)?;
        if byte & 0x80 == 0 {
            return Some((v, i + 1));
        }
    }
    None
}

pub fn write_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// Rewrites the base size and base SHA-256 that a patch declares so that
/// they name `base`. Without this, any mutation of a base (or of the patch's
/// base hash) stops at the wrong-base check and never reaches the ZIP scan or
/// the rebuild. The target hash is left alone: checking it is what is tested.
/// Returns `None` when the patch is too short to have these fields.
pub fn fixup_base(patch: &[u8], base: &[u8]) -> Option<Vec<u8>> {
    // magic (4), version, kind, flags, varint base size, 32-byte base hash
    let head = 7;
    let (_, n) = read_varint(patch.get(head..)?)?;
    let hash_at = head + n;
    let rest = patch.get(hash_at + 32..)?;
    let mut out = Vec::with_capacity(patch.len() + 10);
    out.extend_from_slice(&patch[..head]);
    write_varint(&mut out, base.len() as u64);
    out.extend_from_slice(&sha256(base));
    out.extend_from_slice(rest);
    Some(out)
}

/// When the environment variable `EC_FUZZ_DUMP` names a directory, targets
/// write the files an input stands for there (base, new, patch, delta), so
/// that a finding from a structured (arbitrary-driven) input can be replayed
/// outside the fuzzer, e.g. with `ecsync`. Off (and free) during fuzzing.
pub fn dump(name: &str, bytes: &[u8]) {
    static DIR: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    if let Some(dir) = DIR.get_or_init(|| std::env::var_os("EC_FUZZ_DUMP").map(Into::into)) {
        let _ = std::fs::create_dir_all(dir);
        let path = dir.join(name);
        match std::fs::write(&path, bytes) {
            Ok(()) => eprintln!("EC_FUZZ_DUMP: {} ({} bytes)", path.display(), bytes.len()),
            Err(e) => eprintln!("EC_FUZZ_DUMP: {}: {e}", path.display()),
        }
    }
}

/// `ec_patch::zip::scan`, in one place: its signature has changed while the
/// core is being worked on (it used to take a `max_part` bound).
pub fn scan(data: &[u8]) -> Result<ec_patch::zip::ZipLayout, ec_patch::zip::ZipScanError> {
    ec_patch::zip::scan(data)
}

/// Installs (once) a panic hook that lets panics raised inside preflate-rs
/// unwind instead of aborting at once. ec-patch runs preflate-rs under
/// `catch_unwind` (`deflate::contained`): such a panic becomes a codec
/// error, which is the documented behaviour, not a crash. A preflate panic
/// that ec-patch does not contain still reaches libfuzzer-sys's own
/// `catch_unwind`, which aborts: that is still reported. Every other panic
/// goes to libfuzzer-sys's hook (abort). `EC_FUZZ_STRICT_PREFLATE=1` turns
/// the filter off, to study preflate-rs's panics themselves.
pub fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os("EC_FUZZ_STRICT_PREFLATE").is_some() {
            return;
        }
        let fuzzer_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let in_preflate = info.location().is_some_and(|l| l.file().contains("/preflate-rs-") || l.file().contains("vendor/preflate-rs/"));
            if !in_preflate {
                fuzzer_hook(info);
            }
        }));
    });
}
