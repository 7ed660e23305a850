//! Content mode 5, INFLATE_GUIDS (edit-patch-v2.md §4.3): the GUID form is
//! exact for any bytes and on every part of the real corpus, and a .pptx
//! saved again by LibreOffice with no edit, whose layouts and masters each
//! get a fresh random slide-number field GUID, costs about the GUIDs' 16
//! bytes each.
//!
//! The decks are synthetic: the slide layouts and masters have the shape of
//! LibreOffice 7.4's (a few kB of DrawingML each, one `<a:fld
//! id="{GUID}" type="slidenum">` in the footer), zipped with zlib at level 6
//! as LibreOffice's small parts are.

use crate::common;

use common::{zip, Member};
use ec_patch::guids::{forward, inverse, GuidsError, GUID_LOWER, GUID_UPPER};
use ec_patch::{apply_to_vec, decode, diff, encode, Body, ContentMode, DiffOptions, Limits, PatchError, Segment};
use proptest::prelude::*;

fn opts(version: u8) -> DiffOptions {
    DiffOptions { max_version: Some(version), ..DiffOptions::default() }
}

/// A braced uppercase GUID from 16 bytes.
fn guid_text(b: &[u8; 16]) -> String {
    let h: String = b.iter().map(|x| format!("{x:02X}")).collect();
    format!("{{{}-{}-{}-{}-{}}}", &h[..8], &h[8..12], &h[12..16], &h[16..20], &h[20..])
}

/// A deterministic stream of "random" bytes (xorshift).
fn bytes16(seed: &mut u64) -> [u8; 16] {
    let mut out = [0u8; 16];
    for o in &mut out {
        *seed ^= *seed << 13;
        *seed ^= *seed >> 7;
        *seed ^= *seed << 17;
        *o = (*seed >> 24) as u8;
    }
    out
}

/// A slide layout or master in the shape LibreOffice writes, with its
/// slide-number field's GUID; its shapes, each of its own size, `shrink`
/// EMU smaller.
fn layout_xml(k: usize, guid: &str, shrink: usize) -> Vec<u8> {
    let mut s = format!("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<p:sldLayout xmlns:a=\"http://schemas.openxmlformats.org/drawingml/2006/main\" xmlns:r=\"http://schemas.openxmlformats.org/officeDocument/2006/relationships\" xmlns:p=\"http://schemas.openxmlformats.org/presentationml/2006/main\" type=\"obj\" preserve=\"1\"><p:cSld name=\"Layout {k}\"><p:spTree><p:nvGrpSpPr><p:cNvPr id=\"1\" name=\"\"/><p:cNvGrpSpPr/><p:nvPr/></p:nvGrpSpPr>");
    for shape in 0..(3 + k % 4) {
        s.push_str(&format!("<p:sp><p:nvSpPr><p:cNvPr id=\"{}\" name=\"PlaceHolder {shape}\"/><p:cNvSpPr><a:spLocks noGrp=\"1\"/></p:cNvSpPr><p:nvPr><p:ph type=\"body\" idx=\"{shape}\"/></p:nvPr></p:nvSpPr><p:spPr><a:xfrm><a:off x=\"{}\" y=\"{}\"/><a:ext cx=\"{}\" cy=\"{}\"/></a:xfrm></p:spPr><p:txBody><a:bodyPr lIns=\"0\" tIns=\"0\" rIns=\"0\" bIns=\"0\" anchor=\"t\"><a:noAutofit/></a:bodyPr><a:lstStyle/><a:p><a:r><a:rPr lang=\"en-US\"/><a:t>Click to edit the outline text format</a:t></a:r></a:p></p:txBody></p:sp>", shape + 2, 457_200 + shape * 1000 + k, 1_600_200 + shape * 37, 8_229_240 - k * 11 - shape * 7 - shrink, 3_977_280 + shape - shrink));
    }
    s.push_str(&format!("<p:sp><p:nvSpPr><p:cNvPr id=\"9\" name=\"PlaceHolder 9\"/><p:cNvSpPr><a:spLocks noGrp=\"1\"/></p:cNvSpPr><p:nvPr><p:ph type=\"sldNum\" idx=\"{k}\"/></p:nvPr></p:nvSpPr><p:spPr/><p:txBody><a:bodyPr/><a:lstStyle/><a:p><a:fld id=\"{guid}\" type=\"slidenum\"><a:rPr lang=\"en-US\"/><a:t>&lt;number&gt;</a:t></a:fld></a:p></p:txBody></p:sp></p:spTree></p:cSld><p:clrMapOvr><a:masterClrMapping/></p:clrMapOvr></p:sldLayout>"));
    s.into_bytes()
}

/// A deck of `masters` masters with 12 layouts each and `slides` slides, the
/// layouts' and masters' GUIDs drawn from `seed`.
fn deck(masters: usize, slides: usize, seed: u64) -> Vec<u8> {
    deck_saved(masters, slides, seed, 0)
}

/// [`deck`] after `saves` saves by LibreOffice: each save rounds the size
/// of every text shape of the slides and masters 360 EMU (0.01 mm) down.
fn deck_saved(masters: usize, slides: usize, seed: u64, saves: usize) -> Vec<u8> {
    deck_built(masters, slides, seed, saves, false)
}

fn deck_built(masters: usize, slides: usize, seed: u64, saves: usize, numbered: bool) -> Vec<u8> {
    let shrink = 360 * saves;
    let mut seed = seed | 1;
    let mut parts: Vec<(String, Vec<u8>)> =
        vec![("[Content_Types].xml".into(), b"<Types/>".to_vec()), ("ppt/presentation.xml".into(), b"<p:presentation/>".to_vec())];
    for s in 1..=slides {
        let (cx, cy) = (9_070_920 - shrink, 934_920 - shrink);
        let (mut cx2, cy2) = (8_229_240 - s - shrink, 3_977_280 - shrink);
        let mut title = s.to_string();
        if numbered {
            cx2 = 8_229_240 - shrink;
            title = (0..s % 7).map(|i| (2020 + i).to_string()).collect::<Vec<_>>().join(" ");
        }
        parts.push((
            format!("ppt/slides/slide{s}.xml"),
            format!("<p:sld><a:xfrm><a:ext cx=\"{cx}\" cy=\"{cy}\"/></a:xfrm><a:t>Slide {title}</a:t><a:xfrm><a:ext cx=\"{cx2}\" cy=\"{cy2}\"/></a:xfrm></p:sld>").into_bytes(),
        ));
    }
    for m in 0..masters {
        for l in 1..=12 {
            let k = m * 12 + l;
            parts.push((format!("ppt/slideLayouts/slideLayout{k}.xml"), layout_xml(k, &guid_text(&bytes16(&mut seed)), 0)));
        }
        parts.push((format!("ppt/slideMasters/slideMaster{}.xml", m + 1), layout_xml(100 + m, &guid_text(&bytes16(&mut seed)), shrink)));
    }
    let members: Vec<Member<'_>> = parts.iter().map(|(n, d)| Member::new(n.as_bytes(), d.clone())).collect();
    zip(&members)
}

/// The patch's rebuilt members, those of member runs included.
fn rebuilt(patch: &[u8]) -> Vec<ec_patch::Member> {
    let p = decode(patch, &Limits::default()).unwrap();
    let Body::Zip(z) = &p.body else { panic!("not a zip patch") };
    z.segments.iter().cloned().flat_map(|s| s.expand(&[])).filter_map(|s| if let Segment::Member(m) = s { Some(m) } else { None }).collect()
}

/// The content modes of the patch's rebuilt members, those of member runs included.
fn modes(patch: &[u8]) -> Vec<ContentMode> {
    rebuilt(patch).into_iter().filter_map(|m| m.base.map(|b| b.1)).collect()
}

/// The middles of the patch's rebuilt members, those of member runs included.
fn middles(patch: &[u8]) -> Vec<ec_patch::delta::Middle> {
    rebuilt(patch).into_iter().map(|m| m.delta.middle).collect()
}

/// The patch from `base` to `new` with its member runs spelled out as
/// member segments, for tests that change one member.
fn diff_flat(base: &[u8], new: &[u8]) -> ec_patch::Patch {
    let mut p = diff(base, new, &opts(2)).unwrap();
    if let Body::Zip(z) = &mut p.body {
        *z = ec_patch::expand_runs(base, z).unwrap();
    }
    p
}

#[test]
fn a_save_that_only_draws_new_guids_costs_about_the_guids() {
    for masters in [1, 2, 4] {
        let (base, new) = (deck(masters, 10, 7), deck(masters, 10, 1234));
        let guids = 13 * masters;
        let v1 = encode(&diff(&base, &new, &opts(1)).unwrap());
        let v2 = encode(&diff(&base, &new, &opts(2)).unwrap());
        for p in [&v1, &v2] {
            assert_eq!(apply_to_vec(&base, p, &Limits::default()).unwrap(), new);
        }
        eprintln!(
            "{masters} masters, {guids} new GUIDs: version 1 patch {} B, version 2 {} B (GUIDs alone: {} B)",
            v1.len(),
            v2.len(),
            16 * guids
        );
        assert_eq!(v1[4], 1);
        assert!(modes(&v1).iter().all(|&m| m == ContentMode::Inflate));
        assert_eq!(v2[4], 2);
        let m2 = modes(&v2);
        assert_eq!(m2.len(), guids);
        // Each member differs in its GUID only: named (mode 6).
        assert!(m2.iter().all(|&m| m == ContentMode::InflateGuidSet), "{m2:?}");
        // The fixed header (77 B), the header stream and per GUID its 16 bytes and a few more.
        assert!(v2.len() < 110 + 22 * guids, "{} B for {guids} GUIDs", v2.len());
        assert!(v2.len() + 4 * guids < v1.len(), "{} B vs {} B", v2.len(), v1.len());
        // Mode 6 is version 2's: the same bytes with version byte 1 are malformed.
        let mut as_v1 = v2.clone();
        as_v1[4] = 1;
        assert!(matches!(decode(&as_v1, &Limits::default()), Err(PatchError::Malformed { .. })));
    }
}

#[test]
fn a_patch_without_guids_is_the_version_1_patch() {
    let base = deck(1, 3, 7);
    let mut members = common::members(&base);
    let slide = members.iter_mut().find(|m| m.0 == "ppt/slides/slide2.xml").unwrap();
    slide.2 = b"<p:sld><a:t>Slide two</a:t></p:sld>".to_vec();
    let new = zip(&members.iter().map(|(n, _, d)| Member::new(n.as_bytes(), d.clone())).collect::<Vec<_>>());
    let (v1, v2) = (encode(&diff(&base, &new, &opts(1)).unwrap()), encode(&diff(&base, &new, &opts(2)).unwrap()));
    assert_eq!(v1[4], 1);
    assert_eq!(v2, common::with_base_prefix(&v1), "the version 1 patch, its base named by a prefix");
}

/// [`deck`] with a word of the first layout changed as well: that member
/// needs a content delta besides its GUID (mode 5).
fn deck_edited(masters: usize, slides: usize, seed: u64) -> Vec<u8> {
    let mut members = common::members(&deck(masters, slides, seed));
    let layout = members.iter_mut().find(|m| m.0 == "ppt/slideLayouts/slideLayout1.xml").unwrap();
    layout.2 = String::from_utf8(layout.2.clone()).unwrap().replacen("outline", "OUTLINE", 1).into_bytes();
    zip(&members.iter().map(|(n, _, d)| Member::new(n.as_bytes(), d.clone())).collect::<Vec<_>>())
}

#[test]
fn a_guid_and_other_bytes_changed_in_one_member_take_mode_5() {
    let (base, new) = (deck(1, 1, 7), deck_edited(1, 1, 99));
    let patch = encode(&diff(&base, &new, &opts(2)).unwrap());
    assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
    let m = modes(&patch);
    assert_eq!(m.iter().filter(|&&m| m == ContentMode::InflateGuids).count(), 1, "{m:?}");
    assert_eq!(m.iter().filter(|&&m| m == ContentMode::InflateGuidSet).count(), 12, "{m:?}");
}

#[test]
fn a_bad_guid_set_is_malformed() {
    let (base, new) = (deck(1, 1, 7), deck(1, 1, 99));
    for (set, why) in [
        (vec![], "no GUID"),
        (vec![(1, [0u8; 16])], "past the last GUID"),
        (vec![(0, [0u8; 16]), (0, [1u8; 16])], "a second GUID where there is one"),
        (vec![(0, [0u8; 16]), (u64::MAX, [1u8; 16])], "an index past 2^64"),
    ] {
        let mut p = diff_flat(&base, &new);
        let Body::Zip(z) = &mut p.body else { panic!() };
        for s in &mut z.segments {
            if let Segment::Member(m) = s {
                if matches!(m.base, Some((_, ContentMode::InflateGuidSet))) {
                    m.delta =
                        ec_patch::delta::ContentDelta { prefix: 0, base_mid: 0, middle: ec_patch::delta::Middle::GuidSet(set.clone()) };
                }
            }
        }
        let err = apply_to_vec(&base, &encode(&p), &Limits::default()).unwrap_err();
        assert!(matches!(err, PatchError::Malformed { .. }), "{why}: {err}");
    }
}

#[test]
fn a_corrupt_guid_form_is_malformed_when_applied() {
    let (base, new) = (deck(1, 1, 7), deck_edited(1, 1, 99));
    for (literal, why) in [
        (vec![GUID_UPPER, 0xAA], "a marker without its 16 bytes"),
        (vec![3, b'x'], "an escape of another byte"),
        (vec![3], "an escape at the end"),
    ] {
        let mut p = diff_flat(&base, &new);
        let Body::Zip(z) = &mut p.body else { panic!() };
        let m = z
            .segments
            .iter_mut()
            .find_map(|s| match s {
                Segment::Member(m) if matches!(m.base, Some((_, ContentMode::InflateGuids))) => Some(m),
                _ => None,
            })
            .expect("a mode 5 member");
        // Append the bytes at the very end of the GUID form.
        let layout = ec_patch::zip::scan(&base).unwrap();
        let e = &layout.entries[m.base.unwrap().0 as usize];
        let x = ec_patch::deflate::inflate(&base[e.data_offset as usize..(e.data_offset + e.data_len) as usize], 1 << 24).unwrap();
        let len = forward(&x).len() as u64;
        m.delta = ec_patch::delta::ContentDelta { prefix: len, base_mid: 0, middle: ec_patch::delta::Middle::Literal(literal) };
        let err = apply_to_vec(&base, &encode(&p), &Limits::default()).unwrap_err();
        assert!(matches!(err, PatchError::Malformed { .. }), "{why}: {err}");
    }
}

/// Truncated or corrupted mode 5 patches, with the segment section plain and
/// compressed: a typed error or the very target, never a wrong file or a panic.
#[test]
fn corrupt_guid_patches_are_errors_or_the_target() {
    let (base, new) = (deck(1, 1, 7), deck(1, 1, 99));
    let packed = encode(&diff(&base, &new, &opts(2)).unwrap());
    let plain = common::plain_section(&packed);
    assert_ne!(packed, plain, "the section is compressed");
    common::cuts_and_flips_fail_cleanly(&base, &new, [&packed, &plain]);
}

/// Every deflated part of every real office document: the inverse undoes the form.
#[test]
fn the_guid_form_is_exact_on_the_real_corpus() {
    let (mut parts, mut with_guids) = (0, 0);
    common::for_each_corpus_part(&["pptx", "docx", "xlsx", "odp", "odt", "ods"], |label, x| {
        let t = forward(x);
        assert_eq!(inverse(&t, u64::MAX).as_deref(), Ok(x), "{label}");
        assert_eq!(inverse(&t, x.len() as u64).map(|o| o.len()), Ok(x.len()));
        parts += 1;
        with_guids += usize::from(t.len() < x.len());
    });
    assert!(parts > 200 && with_guids > 10, "{parts} parts, {with_guids} with GUIDs");
}

/// Bytes made of GUID pieces, markers and text, so that GUIDs, near-GUIDs
/// and escapes all occur.
fn pieces() -> impl Strategy<Value = Vec<u8>> {
    let piece = prop_oneof![
        any::<[u8; 16]>().prop_map(|b| guid_text(&b).into_bytes()),
        any::<[u8; 16]>().prop_map(|b| guid_text(&b).to_lowercase().into_bytes()),
        (any::<[u8; 16]>(), 0usize..38, any::<u8>()).prop_map(|(b, at, v)| {
            let mut g = guid_text(&b).into_bytes();
            g[at] = v;
            g
        }),
        proptest::collection::vec(
            prop_oneof![Just(0u8), Just(1), Just(2), Just(3), Just(b'{'), Just(b'}'), Just(b'-'), Just(b'A'), Just(b'0')],
            0..6
        ),
        proptest::collection::vec(any::<u8>(), 0..8),
    ];
    proptest::collection::vec(piece, 0..12).prop_map(|v| v.concat())
}

proptest! {
    #[test]
    fn the_form_is_undone_exactly(x in pieces()) {
        let t = forward(&x);
        prop_assert!(t.len() <= 2 * x.len());
        prop_assert_eq!(inverse(&t, u64::MAX), Ok(x.clone()));
        prop_assert_eq!(inverse(&t, x.len() as u64), Ok(x.clone()));
        if !x.is_empty() {
            prop_assert_eq!(inverse(&t, x.len() as u64 - 1), Err(GuidsError::TooLong));
        }
    }

    #[test]
    fn any_bytes_invert_or_fail_cleanly(t in proptest::collection::vec(prop_oneof![Just(GUID_UPPER), Just(GUID_LOWER), Just(3u8), any::<u8>()], 0..200), max in 0u64..400) {
        match inverse(&t, max) {
            Ok(x) => {
                prop_assert!(x.len() as u64 <= max);
                prop_assert!(x.len() <= 38 * t.len() / 17 + 1);
            }
            Err(GuidsError::TooLong) => {}
            Err(GuidsError::Invalid(at, _)) => prop_assert!(at < t.len()),
        }
    }

    #[test]
    fn decks_with_new_guids_rebuild(seed in 1u64..u64::MAX, masters in 1usize..3, slides in 1usize..4, edited: bool, saves in 0usize..3) {
        let new = if edited { deck_edited(masters, slides, seed) } else { deck_saved(masters, slides, seed, saves) };
        let base = deck(masters, slides, 5);
        let patch = encode(&diff(&base, &new, &opts(2)).unwrap());
        prop_assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
    }

    #[test]
    fn a_guid_set_turns_the_base_form_into_the_new_one(x in pieces(), changes in proptest::collection::vec((any::<prop::sample::Index>(), any::<[u8; 16]>()), 0..4)) {
        let b = forward(&x);
        let at: Vec<usize> = (0..b.len()).filter(|&i| {
            // Marker positions, as the form reads.
            let mut j = 0;
            while j < i { j += match b[j] { GUID_UPPER | GUID_LOWER => 17, 3 => 2, _ => 1 }; }
            j == i && matches!(b[i], GUID_UPPER | GUID_LOWER)
        }).collect();
        let mut n = b.clone();
        if !at.is_empty() {
            for (k, bytes) in &changes {
                let p = at[k.index(at.len())];
                n[p + 1..p + 17].copy_from_slice(bytes);
            }
        }
        match ec_patch::guids::changed_payloads(&b, &n) {
            Some(set) => {
                let mut t = b.clone();
                ec_patch::guids::replace(&mut t, &set).unwrap();
                prop_assert_eq!(&t, &n);
                prop_assert_eq!(inverse(&t, u64::MAX).map(|c| c.len()), Ok(x.len()));
            }
            None => prop_assert_eq!(&b, &n),
        }
    }
}

/// Content mode 7 and member runs (edit-patch-v2.md §4.5, §4.6): a deck saved
/// again with no edit, whose layouts get new GUIDs and whose slides' and
/// masters' text shapes shrink by 360 EMU, costs the GUIDs and about two
/// bytes a changed number, the framing of its many members shared.
#[test]
fn a_save_that_rounds_sizes_costs_about_its_guids() {
    for (masters, slides) in [(1, 1), (2, 10), (2, 50)] {
        let (base, new) = (deck_saved(masters, slides, 7, 1), deck_saved(masters, slides, 1234, 2));
        let v2 = encode(&diff(&base, &new, &opts(2)).unwrap());
        let v1 = encode(&diff(&base, &new, &opts(1)).unwrap());
        for p in [&v1, &v2] {
            assert_eq!(apply_to_vec(&base, p, &Limits::default()).unwrap(), new);
        }
        let guids = 13 * masters;
        let m = modes(&v2);
        let count = |mode| m.iter().filter(|&&x| x == mode).count();
        eprintln!("{masters} masters, {slides} slides: version 1 {} B, version 2 {} B, modes {m:?}", v1.len(), v2.len());
        // Slides (numbers only) and masters (a GUID and numbers): mode 7, or
        // mode 9 where the values its first slide's changes teach pay; layouts: mode 6.
        assert_eq!(count(ContentMode::InflateDrift) + count(ContentMode::InflateMapped), slides + masters, "{m:?}");
        assert_eq!(count(ContentMode::InflateGuidSet), 12 * masters, "{m:?}");
        let p = decode(&v2, &Limits::default()).unwrap();
        let Body::Zip(z) = &p.body else { panic!() };
        assert!(z.segments.iter().any(|s| matches!(s, Segment::MemberRun { .. })), "the members share member runs");
        // The fixed header, the GUIDs, and a few bytes a changed member.
        assert!(v2.len() < 100 + 16 * guids + 4 * (slides + 13 * masters), "{} B", v2.len());
        // Mode 7 and member runs are version 2's.
        let mut as_v1 = v2.clone();
        as_v1[4] = 1;
        assert!(matches!(decode(&as_v1, &Limits::default()), Err(PatchError::Malformed { .. })));
    }
}

/// A mode 7 change is 1 or 2 bytes of the segment section and 32 in memory
/// once decoded: the patch's changes together are bounded by `max_segments`
/// (`limit_exceeded`), as its segments are (§4.5.2). Before, they were
/// bounded only by the section's length (twice the target's size), so a
/// small patch declaring a large target could make a decoder hold 16 to 32
/// times that. The encoder keeps within the same bound.
#[test]
fn a_patch_holds_at_most_max_segments_mode_7_changes() {
    use ec_patch::delta::Middle;
    // Slides whose four numbers each move by an amount of their own: neither
    // the learnt values nor the learnt amounts spare a change.
    let slides = |save: usize| {
        let parts: Vec<(String, Vec<u8>)> = (1..=10)
            .map(|s| {
                let n = |i: usize| 100_000 * i + 1_000 * s + save * (s * 4 + i);
                let xml = format!("<p:sld><a:off x=\"{}\" y=\"{}\"/><a:ext cx=\"{}\" cy=\"{}\"/></p:sld>", n(1), n(2), n(3), n(4));
                (format!("ppt/slides/slide{s}.xml"), xml.into_bytes())
            })
            .collect();
        zip(&parts.iter().map(|(n, d)| Member::new(n.as_bytes(), d.clone())).collect::<Vec<_>>())
    };
    let (base, new) = (slides(1), slides(2));
    let packed = encode(&diff(&base, &new, &opts(2)).unwrap());
    let changes: u64 = middles(&packed)
        .iter()
        .filter_map(|m| match m {
            Middle::Drift(d) | Middle::Mapped(d) => Some(d.len() as u64),
            _ => None,
        })
        .sum();
    assert!(changes >= 8, "{changes} changes");
    let tight = Limits { max_segments: changes - 1, ..Limits::default() };
    let err = decode(&packed, &tight).unwrap_err();
    assert!(
        matches!(err, PatchError::LimitExceeded { what: "mode 7 changes in the patch", value, limit } if value > limit && limit == changes - 1),
        "{err}"
    );
    assert_eq!(apply_to_vec(&base, &packed, &Limits { max_segments: changes, ..Limits::default() }).unwrap(), new);
    // The encoder under the tight bound: fewer members in mode 7, and its own decoder takes the patch.
    let fewer = encode(&diff(&base, &new, &DiffOptions { limits: tight, ..opts(2) }).unwrap());
    assert_eq!(apply_to_vec(&base, &fewer, &tight).unwrap(), new);
    let drift =
        |patch: &[u8]| modes(patch).iter().filter(|&&m| matches!(m, ContentMode::InflateDrift | ContentMode::InflateMapped)).count();
    assert!(drift(&fewer) < drift(&packed), "{} and {} members in mode 7", drift(&fewer), drift(&packed));
}

/// The segments of `p` with each member run, and each mode 7 delta, handed to `f`.
/// One slide and no master: one member in mode 7, which modes 9 and 10 (the
/// patch's learnt values and amounts, from two members on) leave as it is.
fn drift_patch(f: impl Fn(&mut ec_patch::delta::ContentDelta)) -> (Vec<u8>, Vec<u8>) {
    let (base, new) = (deck_saved(0, 1, 7, 1), deck_saved(0, 1, 99, 2));
    let mut p = diff_flat(&base, &new);
    let Body::Zip(z) = &mut p.body else { panic!() };
    for s in &mut z.segments {
        if let Segment::Member(m) = s {
            if matches!(m.base, Some((_, ContentMode::InflateDrift))) {
                f(&mut m.delta);
            }
        }
    }
    (base, encode(&p))
}

#[test]
fn a_bad_drift_is_malformed() {
    use ec_patch::delta::Middle;
    use ec_patch::guids::Change;
    let (base, good) = drift_patch(|_| {});
    let new = deck_saved(0, 1, 99, 2);
    assert_eq!(apply_to_vec(&base, &good, &Limits::default()).unwrap(), new);
    for (drift, why) in [
        (vec![(10_000, Change::Number(-360))], "past the last token"),
        (vec![(0, Change::Guid([0; 16]))], "a GUID where the first token is a number"),
        (vec![(0, Change::Number(-10_000_000))], "a number below 0"),
        (vec![(0, Change::Number(-360)), (u64::MAX, Change::Number(1))], "an index past 2^64"),
    ] {
        let (base, p) = drift_patch(|d| d.middle = Middle::Drift(drift.clone()));
        let err = apply_to_vec(&base, &p, &Limits::default()).unwrap_err();
        assert!(matches!(err, PatchError::Malformed { .. }), "{why}: {err}");
    }
    // The wire: no changes, and "the last amount" before any amount.
    let p = decode(&good, &Limits::default()).unwrap();
    let plain = common::plain_section(&good);
    let first_drift = {
        // The first slide: mode 7, 4 changes, the first at token 0 (head 0)
        // by -360 (zigzag 719: varint CF 05), written out: the patch's first amount.
        let Body::Zip(z) = &p.body else { panic!() };
        assert!(z.segments.iter().any(|s| matches!(s, Segment::Member(m) if matches!(m.base, Some((_, ContentMode::InflateDrift))))));
        plain.windows(5).position(|w| w == [7, 4, 0, 0xCF, 0x05]).expect("the first slide's changes")
    };
    let mut zero = plain.clone();
    zero[first_drift + 1] = 0;
    assert!(matches!(decode(&zero, &Limits::default()), Err(PatchError::Malformed { what: "change count", .. })), "a change count of 0");
    // The first change's amount (after its head) set to 0: no amount came before it.
    let mut repeat = plain.clone();
    repeat[first_drift + 3] = 0;
    repeat.remove(first_drift + 4);
    let err = decode(&repeat, &Limits::default()).unwrap_err();
    assert!(matches!(err, PatchError::Malformed { what: "amount", .. }), "the last amount before any: {err}");
}

/// Truncated or corrupted mode 7 and member-run patches: a typed error or
/// the very target, never a wrong file or a panic.
#[test]
fn corrupt_drift_patches_are_errors_or_the_target() {
    // A master alone in mode 7 (two members or more would take mode 9 or 10), its layouts' GUIDs apart.
    let (base, new) = (deck_saved(1, 0, 7, 1), deck_saved(1, 0, 99, 2));
    let packed = encode(&diff(&base, &new, &opts(2)).unwrap());
    let plain = common::plain_section(&packed);
    assert!(modes(&packed).contains(&ContentMode::InflateDrift));
    assert_ne!(packed[6] & ec_patch::FLAG_GUIDS_APART, 0, "the GUIDs apart from the compressed section");
    common::cuts_and_flips_fail_cleanly(&base, &new, [&packed, &plain]);
}

/// [`deck_saved`] whose slide `s` has `s % 7` numbers in its title, between
/// its two shapes, as a real deck's titles and text hold numbers: the
/// shapes' numbers stand at other token places from slide to slide.
fn deck_numbered(masters: usize, slides: usize, seed: u64, saves: usize) -> Vec<u8> {
    deck_built(masters, slides, seed, saves, true)
}

/// Content mode 9 (edit-patch-v2.md §4.9): where the slides' shrunk shapes
/// stand at other token places from slide to slide, mode 7 pays a byte or
/// two a slide for the places; in mode 9 the first slide's changes teach
/// the values, and the other slides need no change of their own. The patch
/// is exact, costs a fraction of a byte a slide, and no cut or flip of it
/// makes anything but an error or the very target.
#[test]
fn slides_that_shrank_alike_take_the_learnt_values() {
    use ec_patch::delta::Middle;
    let (base, new) = (deck_numbered(2, 200, 7, 1), deck_numbered(2, 200, 1234, 2));
    let packed = encode(&diff(&base, &new, &opts(2)).unwrap());
    assert_eq!(apply_to_vec(&base, &packed, &Limits::default()).unwrap(), new);
    let mapped: Vec<usize> = middles(&packed).iter().filter_map(|m| if let Middle::Mapped(d) = m { Some(d.len()) } else { None }).collect();
    assert!(mapped.len() >= 200, "{} members in mode 9", mapped.len());
    assert!(mapped.iter().filter(|&&n| n == 0).count() >= 190, "slides with no change of their own: {mapped:?}");
    eprintln!("200 slides, 2 masters: {} B", packed.len());
    // The fixed header, the 26 GUIDs, and a fraction of a byte a slide.
    assert!(packed.len() < 61 + 16 * 26 + 150, "{} B", packed.len());
    // Mode 9 is version 2's.
    let mut as_v1 = packed.clone();
    as_v1[4] = 1;
    assert!(matches!(decode(&as_v1, &Limits::default()), Err(PatchError::Malformed { .. })));
    let (small_base, small_new) = (deck_numbered(1, 4, 7, 1), deck_numbered(1, 4, 99, 2));
    let small = encode(&diff(&small_base, &small_new, &opts(2)).unwrap());
    assert!(modes(&small).contains(&ContentMode::InflateMapped), "{:?}", modes(&small));
    common::cuts_and_flips_fail_cleanly(&small_base, &small_new, [&small, &common::plain_section(&small)]);
}

/// A chart in the shape LibreOffice writes: its two axes' random ids, each
/// written three times (the series' axes, the axis's own id, the other
/// axis's crossing).
fn chart_xml(k: usize, seed: u64) -> Vec<u8> {
    let mut seed = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let id = |seed: &mut u64| 10_000_000 + u64::from_le_bytes(bytes16(seed)[..8].try_into().unwrap()) % 90_000_000;
    let (a, b) = (id(&mut seed), id(&mut seed));
    format!("<c:chartSpace><c:chart><c:title><a:t>Chart {k}</a:t></c:title><c:plotArea><c:barChart><c:ser><c:idx val=\"0\"/><c:val><c:numRef><c:f>Sheet1!$B$2:$B${}</c:f></c:numRef></c:val></c:ser><c:axId val=\"{a}\"/><c:axId val=\"{b}\"/></c:barChart><c:catAx><c:axId val=\"{a}\"/><c:crossAx val=\"{b}\"/></c:catAx><c:valAx><c:axId val=\"{b}\"/><c:crossAx val=\"{a}\"/></c:valAx></c:plotArea></c:chart></c:chartSpace>", 5 + k).into_bytes()
}

/// Mode 9's changes teach at once (edit-patch-v2.md §4.9.1, draft.16): the
/// charts of a deck saved again get new random axis ids, each written three
/// times in its chart. The first of each takes a change, and the two other
/// places take the learnt value, so a chart costs its two new ids, not six.
#[test]
fn a_number_written_again_takes_what_its_first_change_taught() {
    use ec_patch::delta::Middle;
    let charts = |seed: u64| {
        let parts: Vec<(String, Vec<u8>)> =
            (1..=12).map(|k| (format!("ppt/charts/chart{k}.xml"), chart_xml(k, seed + k as u64 * 1000))).collect();
        zip(&parts.iter().map(|(n, d)| Member::new(n.as_bytes(), d.clone())).collect::<Vec<_>>())
    };
    let (base, new) = (charts(1), charts(2));
    let packed = encode(&diff(&base, &new, &opts(2)).unwrap());
    assert_eq!(apply_to_vec(&base, &packed, &Limits::default()).unwrap(), new);
    let changes: Vec<usize> = middles(&packed).iter().map(|m| if let Middle::Mapped(d) = m { d.len() } else { usize::MAX }).collect();
    assert_eq!(changes, [2; 12], "each chart in mode 9 with one change per new id");
    eprintln!("12 charts with new axis ids: {} B", packed.len());
    // The fixed header and 24 random amounts of about 4 bytes.
    assert!(packed.len() < 61 + 12 * 2 * 6 + 40, "{} B", packed.len());
    common::cuts_and_flips_fail_cleanly(&base, &new, [&packed, &common::plain_section(&packed)]);
}

/// Learnt values, then a content delta (edit-patch-v2.md §4.10, mode 10):
/// LibreOffice now and then also flips a chart axis's orientation when it
/// saves a deck again (`minMax` becomes `maxMin`). Such a chart names its
/// new ids as mode 9 does and codes the word as a content delta after
/// them, instead of a content delta that spells out its new ids.
#[test]
fn a_chart_with_new_ids_and_a_changed_word_names_its_ids_and_codes_the_word() {
    use ec_patch::delta::Middle;
    let oriented = |k: usize, seed: u64, flipped: bool, more: bool| {
        let orientation = if flipped { "maxMin" } else { "minMax" };
        let extra = if more { "<c:idx val=\"1\"/>" } else { "" };
        String::from_utf8(chart_xml(k, seed))
            .unwrap()
            .replace("<c:valAx>", &format!("<c:valAx><c:scaling><c:orientation val=\"{orientation}\"/></c:scaling>{extra}"))
            .into_bytes()
    };
    // Chart 5 gains a number as well: its tokens no longer pair.
    let charts = |seed: u64, flipped: &[usize], more: Option<usize>| {
        let parts: Vec<(String, Vec<u8>)> = (1..=12)
            .map(|k| (format!("ppt/charts/chart{k}.xml"), oriented(k, seed + k as u64 * 1000, flipped.contains(&k), more == Some(k))))
            .collect();
        zip(&parts.iter().map(|(n, d)| Member::new(n.as_bytes(), d.clone())).collect::<Vec<_>>())
    };
    let base = charts(1, &[], None);
    let (new, unflipped) = (charts(2, &[3, 7, 11], Some(5)), charts(2, &[], Some(5)));
    let packed = encode(&diff(&base, &new, &opts(2)).unwrap());
    assert_eq!(apply_to_vec(&base, &packed, &Limits::default()).unwrap(), new);
    let members = rebuilt(&packed);
    let mode_10: Vec<&ec_patch::Member> = members.iter().filter(|m| matches!(m.base, Some((_, ContentMode::InflateMappedDelta)))).collect();
    assert_eq!(mode_10.len(), 3, "the three flipped charts: {:?}", modes(&packed));
    for m in mode_10 {
        let Middle::MappedDelta(changes, then) = &m.delta.middle else { panic!("mode 10's middle: {:?}", m.delta.middle) };
        assert_eq!(changes.len(), 2, "one change per new id");
        assert!(then.middle.encoded_len() <= 8, "the word: {:?}", then.middle);
    }
    // The flips cost their words, not their ids again (about 50 B a chart before mode 10).
    let without = encode(&diff(&base, &unflipped, &opts(2)).unwrap());
    eprintln!("12 charts with new ids: {} B; three of them flipped too: {} B", without.len(), packed.len());
    assert!(packed.len() <= without.len() + 3 * 16, "{} B against {} B", packed.len(), without.len());
    common::cuts_and_flips_fail_cleanly(&base, &new, [&packed, &common::plain_section(&packed)]);
    // Version 1 has no mode 10 (nor 7 or 9): the same save, exactly.
    let v1 = encode(&diff(&base, &new, &opts(1)).unwrap());
    assert_eq!(apply_to_vec(&base, &v1, &Limits::default()).unwrap(), new);
}

/// Mode 10 needs no mode 9 member beside it: a lone chart whose ids are new
/// and whose axis flipped names each new id once (its other places take
/// what the change taught), where a content delta spells all six out.
#[test]
fn a_lone_chart_with_new_ids_and_a_changed_word_takes_mode_10() {
    let chart = |seed: u64, orientation: &str| {
        let x = String::from_utf8(chart_xml(1, seed))
            .unwrap()
            .replace("<c:valAx>", &format!("<c:valAx><c:scaling><c:orientation val=\"{orientation}\"/></c:scaling>"));
        zip(&[Member::new(b"ppt/charts/chart1.xml", x.into_bytes())])
    };
    let (base, new) = (chart(1, "minMax"), chart(2, "maxMin"));
    let packed = encode(&diff(&base, &new, &opts(2)).unwrap());
    assert_eq!(apply_to_vec(&base, &packed, &Limits::default()).unwrap(), new);
    assert_eq!(modes(&packed), [ContentMode::InflateMappedDelta]);
    common::cuts_and_flips_fail_cleanly(&base, &new, [&packed, &common::plain_section(&packed)]);
}

/// Flag bit 5 (edit-patch-v2.md §4.11): LibreOffice shrinks every shape of a
/// deck 360 EMU on every save, whatever its size. With the learnt values
/// alone, a slide whose shape has a size of its own pays a change for it;
/// with the learnt amounts, the first slide teaches the amount to the bytes
/// before the number (`<a:ext cx="`), and the other slides' shapes of their
/// own sizes shrink with no change of their own.
#[test]
fn shapes_of_their_own_sizes_shrink_by_the_learnt_amount_with_no_change_of_their_own() {
    use ec_patch::delta::Middle;
    let (base, new) = (deck_saved(1, 40, 7, 1), deck_saved(1, 40, 99, 2));
    let packed = encode(&diff(&base, &new, &opts(2)).unwrap());
    let values_only = encode(&diff(&base, &new, &DiffOptions { no_learnt_amounts: true, ..opts(2) }).unwrap());
    assert_ne!(packed[6] & ec_patch::FLAG_LEARNT_AMOUNTS, 0, "flags {:#x}", packed[6]);
    assert_eq!(values_only[6] & ec_patch::FLAG_LEARNT_AMOUNTS, 0, "flags {:#x}", values_only[6]);
    let changes = |patch: &[u8]| -> usize {
        middles(patch)
            .iter()
            .map(|m| match m {
                Middle::Drift(d) | Middle::Mapped(d) => d.len(),
                _ => 0,
            })
            .sum()
    };
    // The first shape's width and height (its second shape and every other
    // slide's then shrink by the amounts they taught) and the master's GUID,
    // against a change a slide more.
    assert_eq!(changes(&packed), 3, "{:?}", middles(&packed));
    assert!(changes(&values_only) >= 40 + 5, "{}", changes(&values_only));
    assert!(packed.len() + 10 < values_only.len(), "{} against {} bytes", packed.len(), values_only.len());
    // A decoder that ignored the flag would not rebuild the target.
    let mut cleared = packed.clone();
    cleared[6] &= !ec_patch::FLAG_LEARNT_AMOUNTS;
    assert!(apply_to_vec(&base, &cleared, &Limits::default()).is_err());
    // Version 1 has no modes 9 and 10: the same save, exact, with neither.
    let v1 = encode(&diff(&base, &new, &opts(1)).unwrap());
    assert_eq!(v1[6] & ec_patch::FLAG_LEARNT_AMOUNTS, 0);
    assert_eq!(apply_to_vec(&base, &v1, &Limits::default()).unwrap(), new);
    common::cuts_and_flips_fail_cleanly(&base, &new, [&packed, &common::plain_section(&packed)]);
}
