//! Content mode 8, INFLATE_RENUMBERED (edit-patch-v2.md §4.8): a sheet
//! whose automatic cell styles were numbered anew (LibreOffice's .ods, on
//! every save) costs its renumbering once, not every place that names a
//! style; a hostile map is a typed error, never a panic or a wrong file.
//!
//! The sheets are synthetic, in the shape of LibreOffice's `content.xml`:
//! `<style:style style:name="ceN">` definitions in the order of their
//! numbers, then rows whose cells name them, zipped with zlib at level 6.

use crate::common;

use common::{zip, Member};
use ec_patch::delta::{ContentDelta, Middle};
use ec_patch::renumber::{find, named_numbers, renumber, Renumbering};
use ec_patch::{apply_to_vec, decode, diff, encode, Body, ContentMode, DiffOptions, Limits, Member as PatchMember, PatchError, Segment};
use proptest::prelude::*;

fn opts(version: u8) -> DiffOptions {
    DiffOptions { max_version: Some(version), ..DiffOptions::default() }
}

/// A sheet of `rows` rows whose cells use `styles` automatic styles; style
/// `k` (0-based) is called `ce{number(k)}`, the definitions are written in
/// the order of those numbers, and cell `edited` says so.
fn sheet(rows: usize, styles: usize, number: impl Fn(usize) -> usize, edited: Option<usize>) -> Vec<u8> {
    let mut defs: Vec<(usize, usize)> = (0..styles).map(|k| (number(k), k)).collect();
    defs.sort();
    let mut x = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<office:document-content><office:automatic-styles>");
    for (n, k) in defs {
        x += &format!("<style:style style:name=\"ce{n}\" style:family=\"table-cell\" style:parent-style-name=\"Default\"><style:table-cell-properties fo:border=\"{}pt solid #000000\"/><style:text-properties fo:font-size=\"{}pt\"/></style:style>", k % 5, 8 + k);
    }
    x += "</office:automatic-styles><office:body><office:spreadsheet><table:table table:name=\"Sheet1\">";
    for r in 0..rows {
        x += "<table:table-row table:style-name=\"ro1\">";
        for c in 0..4 {
            let k = (r * 7 + c * 3) % styles;
            let text = if edited == Some(r * 4 + c) { "edited".to_string() } else { format!("{}", (r * 31 + c * 17) % 997) };
            x += &format!(
                "<table:table-cell table:style-name=\"ce{}\" office:value-type=\"float\" office:value=\"{text}\"><text:p>{text}</text:p></table:table-cell>",
                number(k)
            );
        }
        x += "</table:table-row>";
    }
    x += "</table:table></office:spreadsheet></office:body></office:document-content>";
    x.into_bytes()
}

fn ods(content: Vec<u8>) -> Vec<u8> {
    zip(&[
        Member::new(b"mimetype", b"application/vnd.oasis.opendocument.spreadsheet".to_vec()),
        Member::new(b"content.xml", content),
        Member::new(b"styles.xml", b"<office:document-styles/>".to_vec()),
    ])
}

/// The content modes of a patch's rebuilt members.
fn modes(patch: &[u8]) -> Vec<ContentMode> {
    let p = decode(patch, &Limits::default()).unwrap();
    let Body::Zip(z) = p.body else { panic!("a zip patch") };
    z.segments
        .into_iter()
        .flat_map(|s| s.expand(&[]))
        .filter_map(|s| if let Segment::Member(m) = s { m.base.map(|b| b.1) } else { None })
        .collect()
}

/// 60 styles numbered anew (each number moved by a few), in a sheet of
/// 2,000 rows: mode 8 and a few hundred bytes; version 1 pays for every
/// place (thousands of bytes). With a cell edited too, the content delta
/// after the map codes it.
#[test]
fn a_sheet_whose_styles_were_numbered_anew_costs_its_renumbering() {
    let old = |k: usize| k + 1;
    // LibreOffice's numbers after a save: neighbours swapped, a few moved further.
    let new = |k: usize| {
        if k % 7 == 3 {
            61 + k
        } else if k % 2 == 0 {
            k + 2
        } else {
            k
        }
    };
    let base = ods(sheet(2000, 60, old, None));
    for edited in [None, Some(4321)] {
        let target = ods(sheet(2000, 60, new, edited));
        let v2 = encode(&diff(&base, &target, &opts(2)).unwrap());
        let v1 = encode(&diff(&base, &target, &opts(1)).unwrap());
        assert_eq!(apply_to_vec(&base, &v2, &Limits::default()).unwrap(), target);
        assert_eq!(apply_to_vec(&base, &v1, &Limits::default()).unwrap(), target);
        assert_eq!(modes(&v2), [ContentMode::InflateRenumbered], "{edited:?}");
        assert!(v2.len() < 600 && v2.len() * 40 < v1.len(), "{edited:?}: {} B in version 2, {} B in version 1", v2.len(), v1.len());
    }
}

/// A sheet whose numbers did not move (a cell edited, or nothing) is the
/// patch it was: no map is tried where no name pairs differently.
#[test]
fn a_sheet_whose_styles_kept_their_numbers_takes_no_map() {
    let base = ods(sheet(500, 20, |k| k + 1, None));
    let target = ods(sheet(500, 20, |k| k + 1, Some(77)));
    let p = encode(&diff(&base, &target, &opts(2)).unwrap());
    assert!(!modes(&p).contains(&ContentMode::InflateRenumbered));
    assert_eq!(apply_to_vec(&base, &p, &Limits::default()).unwrap(), target);
}

/// The patch of a renumbered sheet, and its mode 8 member's map.
fn renumbered_patch() -> (Vec<u8>, Vec<u8>, ec_patch::Patch) {
    let base = ods(sheet(600, 30, |k| k + 1, None));
    let target = ods(sheet(600, 30, |k| if k % 2 == 0 { k + 2 } else { k }, None));
    let p = diff(&base, &target, &opts(2)).unwrap();
    assert_eq!(modes(&encode(&p)), [ContentMode::InflateRenumbered]);
    (base, target, p)
}

fn with_middle(p: &ec_patch::Patch, middle: Middle) -> Vec<u8> {
    let mut p = p.clone();
    let Body::Zip(z) = &mut p.body else { panic!() };
    for s in &mut z.segments {
        if let Segment::Member(m) = s {
            if m.base.is_some_and(|b| b.1 == ContentMode::InflateRenumbered) {
                m.delta = ContentDelta { prefix: 0, base_mid: 0, middle: middle.clone() };
            }
        }
    }
    encode(&p)
}

fn the_map(p: &ec_patch::Patch) -> (Renumbering, ContentDelta) {
    let Body::Zip(z) = &p.body else { panic!() };
    z.segments
        .iter()
        .find_map(|s| match s {
            Segment::Member(PatchMember { delta: ContentDelta { middle: Middle::Renumbered(map, then), .. }, .. }) => {
                Some((map.clone(), (**then).clone()))
            }
            _ => None,
        })
        .expect("a mode 8 member")
}

/// Bounds before the work they bound: the map's pairs count towards
/// `max_segments` with mode 7's changes (each is memory), and a map that
/// makes the base grow past `max_part_size` is stopped as it grows.
#[test]
fn a_map_is_bounded_before_it_is_held_or_applied() {
    let (base, target, p) = renumbered_patch();
    let packed = encode(&p);
    let (map, then) = the_map(&p);
    let pairs: u64 = map.iter().map(|(_, p)| p.len() as u64).sum();
    assert!(pairs >= 10, "{pairs} pairs");
    let tight = Limits { max_segments: pairs - 1, ..Limits::default() };
    let err = decode(&packed, &tight).unwrap_err();
    assert!(matches!(err, PatchError::LimitExceeded { value, limit, .. } if value > limit && limit == pairs - 1), "{err}");
    assert_eq!(apply_to_vec(&base, &packed, &Limits { max_segments: pairs, ..Limits::default() }).unwrap(), target);

    // Every ce number made 19 digits long: the renumbered base grows by
    // 17-18 bytes a place, past a bound that the base and target fit in.
    let huge: Renumbering = map.iter().map(|(n, _)| (n.clone(), (1..=40).map(|v| (v, 9_000_000_000_000_000_000 + v)).collect())).collect();
    let bad = with_middle(&p, Middle::Renumbered(huge, Box::new(then.clone())));
    let content = sheet(600, 30, |k| k + 1, None).len() as u64;
    let limits = Limits { max_part_size: content + 4096, ..Limits::default() };
    assert_eq!(apply_to_vec(&base, &packed, &limits).unwrap(), target, "the base and target fit the bound");
    let err = apply_to_vec(&base, &bad, &limits).unwrap_err();
    assert!(matches!(err, PatchError::LimitExceeded { what: "part size after the renumbering", .. }), "{err}");
}

/// Truncated or corrupted mode 8 patches, with the segment section plain
/// and compressed: a typed error or the very target, never a wrong file or
/// a panic.
#[test]
fn corrupt_renumbered_patches_are_errors_or_the_target() {
    let (base, target, p) = renumbered_patch();
    let packed = encode(&p);
    let plain = common::plain_section(&packed);
    common::cuts_and_flips_fail_cleanly(&base, &target, [&packed, &plain]);
}

/// Text made of named numbers, other letters and digits, and bytes between.
fn pieces() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        (prop::sample::select(vec!["ce", "P", "T", "ro", "A", "abcdefghijklmnopq", "x"]), 0u64..40)
            .prop_map(|(n, v)| format!("{n}{v}").into_bytes()),
        Just(b"0".to_vec()),
        Just(b"ce007".to_vec()),
        Just(b"\"/><c s=\"".to_vec()),
        proptest::collection::vec(any::<u8>(), 0..4),
    ];
    proptest::collection::vec(piece, 0..80).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Any bytes and any map: `renumber` changes named numbers of the
    /// map's names only, keeps every other byte, and keeps its bound.
    #[test]
    fn a_renumbering_changes_its_names_numbers_only(x in pieces(), moves in proptest::collection::vec((0u64..40, 0u64..100_000), 0..8), max in 0u64..2000) {
        let mut pairs: Vec<(u64, u64)> = moves.into_iter().filter(|(f, t)| f != t).collect();
        pairs.sort();
        pairs.dedup_by_key(|p| p.0);
        let map: Renumbering = if pairs.is_empty() { vec![] } else { vec![(b"ce".to_vec(), pairs.clone())] };
        match renumber(&x, &map, max) {
            None => prop_assert!(renumber(&x, &map, u64::MAX).unwrap().len() as u64 > max),
            Some(out) => {
                prop_assert!(out.len() as u64 <= max);
                let (a, b): (Vec<_>, Vec<_>) = (named_numbers(&x).collect(), named_numbers(&out).collect());
                prop_assert_eq!(a.len(), b.len());
                let mut from = (0usize, 0usize);
                for (s, t) in a.iter().zip(&b) {
                    prop_assert_eq!(&x[from.0..s.start], &out[from.1..t.start]);
                    let want = if s.name == b"ce" { pairs.iter().find(|p| p.0 == s.value).map_or(s.value, |p| p.1) } else { s.value };
                    prop_assert_eq!(t.value, want);
                    from = (s.end, t.end);
                }
                prop_assert_eq!(&x[from.0..], &out[from.1..]);
            }
        }
    }

    /// The map `find` makes turns the base's named numbers into the new
    /// ones wherever it keeps a name, and a patch of such contents rebuilds
    /// the new one exactly.
    #[test]
    fn renumbered_contents_rebuild(x in pieces(), shift in 1u64..5) {
        let moved: Vec<u8> = {
            let mut out = Vec::new();
            let mut from = 0;
            for n in named_numbers(&x).filter(|n| n.name == b"ce") {
                out.extend_from_slice(&x[from..n.start]);
                out.extend_from_slice(((n.value + shift) % 40).to_string().as_bytes());
                from = n.end;
            }
            out.extend_from_slice(&x[from..]);
            out
        };
        let map = find(&x, &moved, u64::MAX);
        if let Some((_, pairs)) = map.iter().find(|(n, _)| n == b"ce") {
            prop_assert!(pairs.iter().all(|(f, t)| (f + shift) % 40 == *t));
            prop_assert_eq!(renumber(&x, &map, u64::MAX).unwrap(), moved.clone());
        }
        let (base, new) = (ods(x), ods(moved));
        let patch = encode(&diff(&base, &new, &opts(2)).unwrap());
        prop_assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
    }
}

/// A member run's entry 9 is mode 8 (§4.6): two renumbered sheets in base
/// order written as one run, their recipe once, rebuild exactly; entry 10
/// is no mode.
#[test]
fn renumbered_members_stand_in_a_member_run() {
    let content = |k: usize, new: bool| sheet(300 + k * 50, 20, |s| if new && s % 2 == 0 { s + 2 } else { s + 1 }, None);
    let archive = |new: bool| {
        zip(&[
            Member::new(b"mimetype", b"application/vnd.oasis.opendocument.spreadsheet".to_vec()),
            Member::new(b"a/content.xml", content(0, new)),
            Member::new(b"b/content.xml", content(1, new)),
        ])
    };
    let (base, target) = (archive(false), archive(true));
    let mut p = diff(&base, &target, &opts(2)).unwrap();
    let Body::Zip(z) = &mut p.body else { panic!() };
    // The members as the encoder made them, expanded if it ran them already.
    let expanded: Vec<Segment> = ec_patch::expand_runs(&base, z).unwrap().segments;
    let rebuilt: Vec<&PatchMember> = expanded.iter().filter_map(|s| if let Segment::Member(m) = s { Some(m) } else { None }).collect();
    assert_eq!(rebuilt.len(), 2);
    assert!(rebuilt.iter().all(|m| m.base.map(|b| b.1) == Some(ContentMode::InflateRenumbered)));
    assert_eq!(rebuilt[0].recipe, rebuilt[1].recipe);
    let entries = rebuilt.iter().map(|m| ec_patch::RunEntry::Rebuild(ContentMode::InflateRenumbered, m.delta.clone())).collect();
    let run = Segment::MemberRun { base_start: 1, recipe: rebuilt[0].recipe.clone(), entries };
    // Keep what comes before the first rebuilt member's place (mimetype's,
    // copied), then the run for base members 1 and 2, then the directory.
    let first = expanded.iter().position(|s| matches!(s, Segment::Member(_))).unwrap();
    assert!(matches!(expanded[first - 1], Segment::Local));
    let tail_from = expanded.iter().position(|s| matches!(s, Segment::Central { .. })).unwrap();
    let mut segments = expanded[..first - 1].to_vec();
    segments.push(run);
    segments.extend_from_slice(&expanded[tail_from..]);
    z.segments = segments;
    let bytes = encode(&p);
    assert_eq!(apply_to_vec(&base, &bytes, &Limits::default()).unwrap(), target);
    // Entry 9 is mode 8 in the run; 10 is malformed.
    let plain = common::plain_section(&bytes);
    let tag = plain.windows(3).position(|w| w == [9, 1, 2]).expect("tag 9 from base member 1, 2 members");
    let entry = (tag + 3..plain.len()).find(|&i| plain[i] == 9).expect("entry 9");
    let mut bad = plain.clone();
    bad[entry] = 10;
    assert_eq!(apply_to_vec(&base, &bad, &Limits::default()).unwrap_err().code(), "malformed");
}
