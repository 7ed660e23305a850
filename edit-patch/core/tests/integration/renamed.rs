//! Members renamed between two saves (docs/spec: a MEMBER names the base
//! member it is made from, whatever the two are called).
//!
//! LibreOffice numbers a deck's charts anew on every save: a no-edit save
//! of a .pptx with 33 charts turns `ppt/charts/chart102.xml` ... `chart134.xml`
//! into `chart135.xml` ... `chart167.xml`, with their `_rels`. Matched by
//! name only, each was coded from nothing: 33 kB for a save with no edit
//! (`byte_goals.py --goals a --corpus-decks`, the corpus's
//! `ppt2011-mac_cht-chart-type.pptx`; 987 B since).
//!
//! The new names still cost the header frame a byte or two each, in the
//! local header and in the central record, until version 2's flag bit 4
//! (members renumbered, edit-patch-v2.md §2) says the renumbering once and
//! renumbers the reference's names by it.

use crate::common::{self, words, zip, Member};
use ec_patch::{apply_to_vec, decode, diff, encode, Body, DiffOptions, Limits, Segment, FLAG_MEMBERS_RENUMBERED};

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

/// A deck of `count` charts and their `_rels`, numbered from `first + 1`, in
/// the order `order` gives (as LibreOffice writes them: not their numbers').
fn shuffled_deck(first: u32, order: &[u32]) -> Vec<u8> {
    let mut parts: Vec<(String, Vec<u8>)> = vec![("[Content_Types].xml".into(), b"<Types/>".to_vec())];
    for &k in order {
        parts.push((format!("ppt/charts/chart{}.xml", first + k), chart(u64::from(k), 7)));
        parts.push((format!("ppt/charts/_rels/chart{}.xml.rels", first + k), format!("<Relationships n=\"{k}\"/>").into_bytes()));
    }
    zip(&parts.iter().map(|(n, d)| Member::new(n.as_bytes(), d.clone())).collect::<Vec<_>>())
}

/// Thirty charts, numbered 71-100 in the base, in an order of their own, and
/// 101-130 in the new file, two of them swapped in its order.
fn renumbered_pair() -> (Vec<u8>, Vec<u8>) {
    let order: Vec<u32> = (1..=30).map(|k| (k * 7) % 31).collect();
    let mut swapped = order.clone();
    swapped.swap(10, 11);
    (shuffled_deck(70, &order), shuffled_deck(100, &swapped))
}

fn header_frame_len(patch: &[u8]) -> usize {
    let Body::Zip(z) = decode(patch, &Limits::default()).unwrap().body else { panic!("a zip patch") };
    z.header_frame.len()
}

#[test]
fn charts_numbered_anew_say_their_renumbering_once() {
    let (base, new) = renumbered_pair();
    let patch = encode(&diff(&base, &new, &DiffOptions::default()).unwrap());
    assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
    assert_ne!(patch[6] & FLAG_MEMBERS_RENUMBERED, 0, "flags {:#x}", patch[6]);
    // Version 1 has no name map: its header frame pays at each of the 120 names.
    let v1 = encode(&diff(&base, &new, &DiffOptions { max_version: Some(1), ..DiffOptions::default() }).unwrap());
    assert_eq!(apply_to_vec(&base, &v1, &Limits::default()).unwrap(), new);
    let (frame, v1_frame) = (header_frame_len(&patch), header_frame_len(&v1));
    eprintln!("header frame: {frame} B with the name map, {v1_frame} B without; patches {} and {} B", patch.len(), v1.len());
    assert!(frame * 3 <= v1_frame, "{frame} B with the map, {v1_frame} B without");
    assert!(patch.len() + 40 <= v1.len(), "{} B with the map, {} B without", patch.len(), v1.len());
    // The map is what makes the reference: without it the frame decodes to
    // other bytes (or none), and the target's check refuses them.
    let mut p = decode(&patch, &Limits::default()).unwrap();
    let Body::Zip(z) = &mut p.body else { unreachable!() };
    z.renamed.clear();
    let err = apply_to_vec(&base, &encode(&p), &Limits::default()).expect_err("the reference without the map's names");
    assert!(["codec", "target_mismatch", "malformed"].contains(&err.code()), "{err}");
    common::cuts_and_flips_fail_cleanly(&base, &new, [&patch, &common::plain_section(&patch)]);
}

#[test]
fn members_that_keep_their_names_need_no_name_map() {
    let order: Vec<u32> = (1..=30).collect();
    let (base, new) = (shuffled_deck(0, &order), shuffled_deck(0, &order[..29]));
    let patch = encode(&diff(&base, &new, &DiffOptions::default()).unwrap());
    assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
    assert_eq!(patch[6] & FLAG_MEMBERS_RENUMBERED, 0, "flags {:#x}", patch[6]);
}

/// A name map whose new numbers are long makes every name of the reference
/// grow: a decoder bounds the growth by `max_part_size` before the work.
#[test]
fn names_grown_past_the_part_bound_are_refused() {
    let (base, new) = renumbered_pair();
    let mut p = decode(&encode(&diff(&base, &new, &DiffOptions::default()).unwrap()), &Limits::default()).unwrap();
    let Body::Zip(z) = &mut p.body else { unreachable!() };
    z.renamed = vec![(b"chart".to_vec(), (71..=100).map(|k| (k, 9_000_000_000_000_000_000)).collect())];
    let grown = encode(&p);
    // 60 names, each in two records, 17 digits longer: 2,040 bytes.
    let small = Limits { max_part_size: 2_000, ..Limits::default() };
    let err = apply_to_vec(&base, &grown, &small).expect_err("names grown by more than max_part_size");
    assert_eq!(err.code(), "limit_exceeded", "{err}");
    // Within the bound the map only makes another reference: the frame then
    // decodes to other bytes, which the target's check refuses, or to none.
    let err = apply_to_vec(&base, &grown, &Limits::default()).expect_err("a wrong reference");
    assert!(["codec", "target_mismatch", "malformed"].contains(&err.code()), "{err}");
}
