//! zip_scan: the tolerant ZIP scanner on hostile input.
//!
//! Input: first byte selects the mode.
//! - even: the rest is the file to scan (raw bytes; seeds are real documents).
//! - odd: the rest drives [`ArchiveSpec`] (a ZIP built by the fuzz writer).
//!
//! Checks: `scan` never panics and is deterministic; on success the regions
//! tile the input exactly (contiguous, every byte covered once) and the
//! entries agree with their regions and local headers. For a generated
//! archive with no stray signature bytes, the scan must succeed through the
//! central directory and find exactly the members written, in file order.
#![no_main]

use arbitrary::{Arbitrary, Unstructured};
use ec_patch_fuzz::scan;
use ec_patch_fuzz::checks::check_layout;
use ec_patch_fuzz::zipgen::{count_signatures, ArchiveSpec};
use libfuzzer_sys::fuzz_target;

fn scan_checked(data: &[u8]) -> Option<ec_patch::zip::ZipLayout> {
    ec_patch_fuzz::dump("file", data);
    let first = scan(data);
    let again = scan(data);
    match (&first, &again) {
        (Ok(a), Ok(b)) => assert!(a.regions == b.regions && a.entries == b.entries && a.forward_scanned == b.forward_scanned, "scan is not deterministic"),
        (Err(a), Err(b)) => assert_eq!(a, b, "scan is not deterministic"),
        _ => panic!("scan is not deterministic"),
    }
    let layout = first.ok()?;
    check_layout(data, &layout);
    Some(layout)
}

fuzz_target!(|data: &[u8]| {
    ec_patch_fuzz::init();
    let Some((&sel, rest)) = data.split_first() else { return };
    if sel & 1 == 0 {
        scan_checked(rest);
        return;
    }
    let Ok(spec) = ArchiveSpec::arbitrary_take_rest(Unstructured::new(rest)) else { return };
    let built = spec.materialise().build();
    let layout = scan_checked(&built.bytes);
    if count_signatures(&built.bytes) == built.signatures {
        let layout = layout.unwrap_or_else(|| panic!("a well-formed generated archive does not scan: {:?}", scan(&built.bytes).err()));
        assert!(!layout.forward_scanned, "a well-formed archive was forward-scanned");
        // Members sharing a local header offset are visited once; ours never share.
        let found: Vec<_> = layout.entries.iter().map(|e| (e.name.clone(), e.local_offset, e.data_offset, e.data_len)).collect();
        assert_eq!(found, built.members, "scan found other members than were written");
    }
});
