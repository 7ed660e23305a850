//! Invariants the targets check. Each panics (a crash for libFuzzer) with a
//! message that says which property broke.

use crate::{limits, sha256};
use ec_patch::zip::{RegionKind, ZipLayout, SIG_CENTRAL, SIG_EOCD, SIG_LOCAL};
use ec_patch::{apply, apply_to_vec, decode, encode, inspect, Body, DiffOptions, PatchError};

fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().unwrap())
}

/// A successful scan must tile the input exactly and agree with its entries.
pub fn check_layout(data: &[u8], l: &ZipLayout) {
    let len = data.len() as u64;
    let mut at = 0u64;
    let mut data_regions = 0usize;
    let mut eocds = 0usize;
    for (i, r) in l.regions.iter().enumerate() {
        assert_eq!(r.offset, at, "region {i} ({:?}) starts at {} but the previous one ended at {at}", r.kind, r.offset);
        at = at.checked_add(r.len).expect("region end overflows");
        assert!(at <= len, "region {i} ({:?}) ends at {at}, past the end of the {len}-byte input", r.kind);
        if !matches!(r.kind, RegionKind::Data { .. }) {
            assert!(r.len > 0, "empty region {i} of kind {:?}", r.kind);
        }
        let bytes = &data[r.offset as usize..at as usize];
        match r.kind {
            RegionKind::Local => {
                assert!(bytes.len() >= 30 && le32(bytes, 0) == SIG_LOCAL, "local region {i} is not a local header");
                assert_eq!(bytes.len(), 30 + le16(bytes, 26) as usize + le16(bytes, 28) as usize, "local region {i} length");
                match l.regions.get(i + 1).map(|r| r.kind) {
                    Some(RegionKind::Data { .. }) => {}
                    k => panic!("local region {i} is followed by {k:?}, not member data"),
                }
            }
            RegionKind::Data { entry } => {
                assert_eq!(entry, data_regions, "data region {i} names entry {entry}, expected {data_regions} (file order)");
                data_regions += 1;
                let e = l.entries.get(entry).unwrap_or_else(|| panic!("data region {i} names entry {entry} of {}", l.entries.len()));
                assert_eq!((e.data_offset, e.data_len), (r.offset, r.len), "entry {entry} data disagrees with region {i}");
                let prev = i.checked_sub(1).map(|p| l.regions[p]).expect("data region first");
                assert_eq!(prev.kind, RegionKind::Local, "data region {i} not preceded by its local header");
                assert_eq!(prev.offset, e.local_offset, "entry {entry} local offset");
                let h = &data[prev.offset as usize..];
                assert_eq!(e.name, &h[30..30 + le16(h, 26) as usize], "entry {entry} name differs from its local header");
                assert_eq!(e.flags, le16(h, 6), "entry {entry} flags differ from its local header");
                assert_eq!(e.method, le16(h, 8), "entry {entry} method differs from its local header");
            }
            RegionKind::Descriptor => {
                assert!(matches!(bytes.len(), 12 | 16 | 20 | 24), "descriptor region {i} of {} bytes", bytes.len());
                assert!(matches!(l.regions[i - 1].kind, RegionKind::Data { .. }), "descriptor region {i} does not follow member data");
            }
            RegionKind::Central => {
                assert!(!l.forward_scanned, "central region in a forward-scanned layout");
                assert!(bytes.len() >= 46 && le32(bytes, 0) == SIG_CENTRAL, "central region {i} is not a central record");
                assert_eq!(bytes.len(), 46 + le16(bytes, 28) as usize + le16(bytes, 30) as usize + le16(bytes, 32) as usize, "central region {i} length");
            }
            RegionKind::Eocd => {
                assert!(!l.forward_scanned, "end record in a forward-scanned layout");
                eocds += 1;
                assert!(bytes.len() >= 22 && le32(bytes, 0) == SIG_EOCD, "eocd region {i} is not an end record");
                assert_eq!(bytes.len(), 22 + le16(bytes, 20) as usize, "eocd region {i} length");
            }
            RegionKind::Raw => {}
        }
    }
    assert_eq!(at, len, "regions cover {at} of {len} bytes");
    assert_eq!(data_regions, l.entries.len(), "{} entries but {data_regions} data regions", l.entries.len());
    assert!(eocds <= 1, "{eocds} end records");
    if !l.forward_scanned {
        assert_eq!(eocds, 1, "directory layout without an end record");
    }
}

/// Applies `patch` to `base` both ways (streamed and to a vector). Neither
/// may panic; they must agree; success means the output is exactly what the
/// patch declares (size and SHA-256) and the base is the one it names.
pub fn check_apply(base: &[u8], patch: &[u8]) {
    crate::dump("base", base);
    crate::dump("patch", patch);
    let l = limits();
    let to_vec = apply_to_vec(base, patch, &l);
    let mut streamed = Vec::new();
    let stream = apply(base, patch, &mut streamed, &l);
    match (&to_vec, &stream) {
        (Ok(out), Ok(stats)) => {
            let p = decode(patch, &l).expect("an applied patch must decode");
            assert_eq!(out.len() as u64, p.target_size, "apply returned Ok with a size other than the declared one");
            assert!(sha256(out) == p.target_sha256, "apply returned Ok with output whose SHA-256 is not the declared one");
            assert!(base.len() as u64 == p.base_size && p.base_hash.names(&sha256(base)), "apply returned Ok on a base the patch does not name");
            assert!(&streamed == out, "apply and apply_to_vec produced different bytes");
            assert_eq!(stats.written, out.len() as u64, "ApplyStats.written");
        }
        (Err(a), Err(b)) => assert_eq!(a.code(), b.code(), "apply and apply_to_vec fail differently: {a} / {b}"),
        _ => panic!("apply and apply_to_vec disagree: {:?} vs {:?}", to_vec.as_ref().map(Vec::len), stream.as_ref().map(|s| s.written)),
    }
    // inspect must not panic either.
    let _ = inspect(patch, Some(base), &l);
    let _ = inspect(patch, None, &l);
}

/// What a diff may legitimately refuse: members that inflate past the limits.
fn acceptable_diff_error(e: &PatchError) -> bool {
    matches!(e, PatchError::ZipBomb { .. } | PatchError::LimitExceeded { .. })
}

/// diff → encode → decode → apply_to_vec must give back `new` exactly.
/// Returns the patch's body kind (0 identity, 1 zip, 2 binary) or None if diff refused.
pub fn check_roundtrip(base: &[u8], new: &[u8], force_binary: bool) -> Option<u8> {
    crate::dump("base", base);
    crate::dump("new", new);
    let l = limits();
    let opts = DiffOptions { force_binary, ..Default::default() };
    let p = match ec_patch::diff(base, new, &opts) {
        Ok(p) => p,
        Err(e) if acceptable_diff_error(&e) => return None,
        Err(e) => panic!("diff failed: {e} [{}]", e.code()),
    };
    assert_eq!(p.target_size, new.len() as u64);
    assert!(p.target_sha256 == sha256(new));
    if force_binary {
        assert!(!matches!(p.body, Body::Zip(_)), "force_binary gave a zip patch");
    }
    let bytes = encode(&p);
    let back = decode(&bytes, &l).unwrap_or_else(|e| panic!("decode(encode(diff)) failed: {e} [{}]", e.code()));
    assert!(back == p, "decode(encode(p)) != p");
    let out = apply_to_vec(base, &bytes, &l).unwrap_or_else(|e| panic!("a fresh patch does not apply: {e} [{}]", e.code()));
    assert!(out == new, "the rebuilt file differs from the new file");
    Some(p.body.kind())
}
