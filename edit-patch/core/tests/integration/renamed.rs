//! Members renamed between two saves (docs/spec: a MEMBER names the base
//! member it is made from, whatever the two are called).
//!
//! LibreOffice numbers a deck's charts anew on every save: a no-edit save
//! of a .pptx with 33 charts turns `ppt/charts/chart102.xml` ... `chart134.xml`
//! into `chart135.xml` ... `chart167.xml`, with their `_rels`. Matched by
//! name only, each was coded from nothing: 33 kB for a save with no edit
//! (`byte_goals.py --goals a --corpus-decks`, the corpus's
//! `ppt2011-mac_cht-chart-type.pptx`; 987 B since).

use crate::common::{words, zip, Member};
use ec_patch::{apply_to_vec, decode, diff, encode, Body, DiffOptions, Limits, Segment};

/// A chart part of some kilobytes, its own words from `seed`, one number `v`.
fn chart(seed: u64, v: u32) -> Vec<u8> {
    format!("<c:chartSpace><c:v>{v}</c:v><c:t>{}</c:t></c:chartSpace>", words(900, seed)).into_bytes()
}

/// A deck whose charts are named `chart{n}.xml` for the numbers `names`, chart
/// `i` with words from seed `i` and the number `v`.
fn deck(names: &[u32], v: u32) -> Vec<u8> {
    let mut parts: Vec<(String, Vec<u8>)> = vec![("[Content_Types].xml".into(), b"<Types/>".to_vec())];
    for (i, n) in names.iter().enumerate() {
        parts.push((format!("ppt/charts/chart{n}.xml"), chart(i as u64, v)));
        parts.push((format!("ppt/charts/_rels/chart{n}.xml.rels"), format!("<Relationships n=\"{i}\"/>").into_bytes()));
    }
    let refs: String = names.iter().map(|n| format!("<r t=\"../charts/chart{n}.xml\"/>")).collect();
    parts.push(("ppt/slides/_rels/slide1.xml.rels".into(), refs.into_bytes()));
    zip(&parts.iter().map(|(n, d)| Member::new(n.as_bytes(), d.clone())).collect::<Vec<_>>())
}

/// The base member each rebuilt member of the patch is made from (None: from nothing).
fn bases(patch: &[u8], base: &[u8]) -> Vec<Option<u64>> {
    let p = decode(patch, &Limits::default()).unwrap();
    let Body::Zip(z) = &p.body else { panic!("a zip patch") };
    let z = ec_patch::expand_runs(base, z).unwrap();
    z.segments.iter().filter_map(|s| if let Segment::Member(m) = s { Some(m.base.map(|b| b.0)) } else { None }).collect()
}

#[test]
fn charts_numbered_anew_are_made_from_the_charts_they_were() {
    // Chart 8, 9, 10 become 11, 12, 13, in the order of their numbers (not of
    // their names: "chart10" sorts before "chart8"), each with a number changed.
    let (base, new) = (deck(&[8, 9, 10], 1), deck(&[11, 12, 13], 2));
    let patch = encode(&diff(&base, &new, &DiffOptions::default()).unwrap());
    assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
    let made = bases(&patch, &base);
    assert!(made.iter().filter(|b| b.is_some()).count() >= 3, "the charts have bases: {made:?}");
    // Three charts of 5 kB coded from nothing would be about 1 kB each.
    assert!(patch.len() < 400, "{} B", patch.len());
    // The same charts with numbers the wrong way round (each paired with
    // another chart's words) cost much more: the pairing follows the numbers.
    let swapped = deck(&[13, 12, 11], 2);
    let crossed = encode(&diff(&base, &swapped, &DiffOptions::default()).unwrap());
    assert_eq!(apply_to_vec(&base, &crossed, &Limits::default()).unwrap(), swapped);
    assert!(crossed.len() > patch.len() + 500, "{} B against {} B", crossed.len(), patch.len());
}

#[test]
fn members_that_come_and_go_unevenly_are_made_from_nothing_and_exactly() {
    // Three charts go, two come: no pairing is guessed; the patch is still exact.
    let (base, new) = (deck(&[1, 2, 3], 1), deck(&[4, 5], 1));
    for version in [1, 2] {
        let opts = DiffOptions { max_version: Some(version), ..DiffOptions::default() };
        let patch = encode(&diff(&base, &new, &opts).unwrap());
        assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
    }
    // Renamed and equal: copied, whatever the names.
    let (base, new) = (deck(&[1, 2], 1), deck(&[3, 4], 1));
    let patch = encode(&diff(&base, &new, &DiffOptions::default()).unwrap());
    assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
    assert!(patch.len() < 250, "{} B", patch.len());
}

/// Names no producer writes: numbers past 2^64 (they saturate, and tie),
/// names that are digits alone, and a name of a thousand numbers. The
/// pairing takes some pair or none; the patch is exact either way.
#[test]
fn hostile_names_pair_or_not_and_the_patch_is_exact() {
    let big = |k: u32| format!("ppt/charts/chart{}{k}.xml", "9".repeat(30));
    let many = |k: u32| (0..1000).map(|i| format!("p{}", i + k)).collect::<String>();
    let archive = |names: &[String], v: u32| {
        let mut parts = vec![Member::new(b"[Content_Types].xml", b"<Types/>".to_vec())];
        for (i, n) in names.iter().enumerate() {
            parts.push(Member::new(n.as_bytes(), chart(i as u64, v)));
        }
        zip(&parts)
    };
    let base_names = vec![big(1), big(2), big(3), "12345".to_string(), many(0)];
    let new_names = vec![big(4), big(5), big(6), "67890".to_string(), many(1)];
    let (base, new) = (archive(&base_names, 1), archive(&new_names, 2));
    for version in [1, 2] {
        let opts = DiffOptions { max_version: Some(version), ..DiffOptions::default() };
        let patch = encode(&diff(&base, &new, &opts).unwrap());
        assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new, "version {version}");
        // The tied charts still pair (in some order); each is made from a base.
        assert!(bases(&patch, &base).iter().filter(|b| b.is_some()).count() >= 3, "version {version}");
    }
}
