//! Content mode 4, INFLATE_OFFSETS (edit-patch-v2.md §4): the row-offset form
//! is exact on the real spreadsheets of ../shared/corpus/real, and makes a
//! row inserted into a 5,000-row sheet with formulas cost about one row.
//!
//! The 5,000-row sheets are generated here (not by LibreOffice, which takes
//! tens of seconds): the same shape as experiments/bench/byte_goals.py's
//! goal (c) documents, whose sheet XML LibreOffice writes (formulas on the
//! row itself, the row above and a running window of five rows, a totals
//! row over the whole column, shared strings), zipped with LibreOffice's
//! block-parallel deflate.

use crate::common;

use common::{zip, Member};
use ec_patch::rows::{offsets_forward, offsets_inverse};
use ec_patch::{apply_to_vec, decode, diff, encode, Body, ContentMode, DiffOptions, Limits, PatchError, Segment};

const ROWS: u64 = 5000;

fn opts(version: u8) -> DiffOptions {
    DiffOptions { max_version: Some(version), ..DiffOptions::default() }
}

/// The sheet XML of a .xlsx, with a row inserted before data row `insert` if given.
fn xlsx_sheet(insert: Option<u64>) -> Vec<u8> {
    xlsx_sheet_with(insert, None)
}

/// [`xlsx_sheet`], with data row `bump`'s B value changed as a user would: its
/// dependents' cached values (E, F of that row and the next, G of the next
/// five rows, the totals) change with it.
fn xlsx_sheet_with(insert: Option<u64>, bump: Option<u64>) -> Vec<u8> {
    let hit = |k: u64, from: u64, rows: u64| bump.is_some_and(|b| (b..b + rows).contains(&k) && k >= from) as u64 * 1000;
    let n = ROWS + 2 + u64::from(insert.is_some());
    let mut s = format!("<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\n<worksheet xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\"><dimension ref=\"A1:G{n}\"/><sheetData><row r=\"1\" ht=\"12.8\"><c r=\"A1\" s=\"1\" t=\"s\"><v>0</v></c><c r=\"B1\" s=\"1\" t=\"s\"><v>1</v></c></row>");
    let mut r: u64 = 2;
    for k in 0..ROWS {
        if insert == Some(k) {
            s.push_str(&format!(
                "<row r=\"{r}\" ht=\"12.8\"><c r=\"A{r}\" s=\"1\" t=\"n\"><v>9999</v></c><c r=\"B{r}\" s=\"1\" t=\"n\"><v>5</v></c></row>"
            ));
            r += 1;
        }
        s.push_str(&format!(
            "<row r=\"{r}\" customFormat=\"false\" ht=\"12.8\" hidden=\"false\"><c r=\"A{r}\" s=\"1\" t=\"n\"><v>{}</v></c><c r=\"B{r}\" s=\"1\" t=\"n\"><v>{}</v></c><c r=\"C{r}\" s=\"1\" t=\"s\"><v>{}</v></c><c r=\"E{r}\" s=\"1\" t=\"n\"><f aca=\"false\">B{r}*2</f><v>{}</v></c><c r=\"F{r}\" s=\"1\" t=\"n\"><f aca=\"false\">B{r}-B{}</f><v>{}</v></c><c r=\"G{r}\" s=\"1\" t=\"n\"><f aca=\"false\">SUM(B{}:B{r})</f><v>{}</v></c></row>",
            1000 + k,
            k * 37 % 101 + hit(k, 0, 1),
            2 + k * 7 % 20,
            k * 37 % 101 * 2 + 2 * hit(k, 0, 1),
            r - 1,
            k % 50 + hit(k, 0, 2),
            r.saturating_sub(4).max(2),
            k * 11 % 300 + hit(k, 0, 5)
        ));
        r += 1;
    }
    s.push_str(&format!("<row r=\"{r}\"><c r=\"B{r}\" s=\"1\" t=\"n\"><f aca=\"false\">SUM(B2:B{})</f><v>{}</v></c></row></sheetData><mergeCells count=\"1\"><mergeCell ref=\"A1:B1\"/></mergeCells></worksheet>", r - 1, 252068 + bump.map_or(0, |_| 1000)));
    s.into_bytes()
}

/// The content.xml of a .ods, with a row inserted before data row `insert` if given.
fn ods_content(insert: Option<u64>) -> Vec<u8> {
    ods_content_with(insert, None)
}

/// [`ods_content`], with data row `bump`'s B value changed and its dependents (see [`xlsx_sheet_with`]).
fn ods_content_with(insert: Option<u64>, bump: Option<u64>) -> Vec<u8> {
    let hit = |k: u64, from: u64, rows: u64| bump.is_some_and(|b| (b..b + rows).contains(&k) && k >= from) as u64 * 1000;
    let cell = |v: u64| {
        format!("<table:table-cell office:value-type=\"float\" office:value=\"{v}\" calcext:value-type=\"float\"><text:p>{v}</text:p></table:table-cell>")
    };
    let mut s = String::from("<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<office:document-content><office:body><office:spreadsheet><table:table table:name=\"Sheet1\" table:style-name=\"ta1\"><table:table-column table:number-columns-repeated=\"7\"/><table:table-row table:style-name=\"ro1\"><table:table-cell office:value-type=\"string\"><text:p>Id</text:p></table:table-cell></table:table-row>");
    let mut r: u64 = 2;
    for k in 0..ROWS {
        if insert == Some(k) {
            s.push_str(&format!(
                "<table:table-row table:style-name=\"ro1\">{}{}<table:table-cell table:number-columns-repeated=\"5\"/></table:table-row>",
                cell(9999),
                cell(5)
            ));
            r += 1;
        }
        s.push_str(&format!(
            "<table:table-row table:style-name=\"ro1\">{}{}<table:table-cell office:value-type=\"string\"><text:p>Region {}</text:p></table:table-cell><table:table-cell table:formula=\"of:=[.B{r}]*2\" office:value-type=\"float\" office:value=\"{}\"><text:p>x</text:p></table:table-cell><table:table-cell table:formula=\"of:=[.B{r}]-[.B{}]\" office:value-type=\"float\" office:value=\"{}\"><text:p>y</text:p></table:table-cell><table:table-cell table:formula=\"of:=SUM([.B{}:.B{r}])\" office:value-type=\"float\" office:value=\"{}\"><text:p>z</text:p></table:table-cell></table:table-row>",
            cell(1000 + k),
            cell(k * 37 % 101 + hit(k, 0, 1)),
            k % 7,
            k * 37 % 101 * 2 + 2 * hit(k, 0, 1),
            r - 1,
            k % 50 + hit(k, 0, 2),
            r.saturating_sub(4).max(2),
            k * 11 % 300 + hit(k, 0, 5)
        ));
        if k % 1000 == 999 {
            s.push_str("<table:table-row table:number-rows-repeated=\"2\"><table:table-cell table:number-columns-repeated=\"7\"/></table:table-row>");
            r += 2;
        }
        r += 1;
    }
    s.push_str(&format!("<table:table-row>{}<table:table-cell table:formula=\"of:=SUM([.B2:.B{}])\" office:value-type=\"float\" office:value=\"{}\"><text:p>1</text:p></table:table-cell></table:table-row></table:table></office:spreadsheet></office:body></office:document-content>", cell(5000), r - 1, 1 + bump.map_or(0, |_| 1000)));
    s.into_bytes()
}

fn archive(part: &[u8], xlsx: bool) -> Vec<u8> {
    let (name, other): (&[u8], &[u8]) =
        if xlsx { (b"xl/worksheets/sheet1.xml", b"xl/sharedStrings.xml") } else { (b"content.xml", b"styles.xml") };
    let mut m = Member::new(name, part.to_vec());
    m.blocks = true;
    zip(&[
        Member::new(b"[Content_Types].xml", b"<Types/>".to_vec()),
        m,
        Member::new(other, b"<sst count=\"3\"><si><t>a</t></si></sst>".to_vec()),
    ])
}

fn modes(patch: &[u8]) -> (u8, Vec<ContentMode>) {
    let p = decode(patch, &Limits::default()).unwrap();
    let Body::Zip(z) = &p.body else { panic!("not a zip patch") };
    let modes = z.segments.iter().filter_map(|s| if let Segment::Member(m) = s { m.base.map(|b| b.1) } else { None }).collect();
    (patch[4], modes)
}

/// Diffs, applies, and returns (version 1 patch, version 2 patch).
fn both(base: &[u8], new: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut out = Vec::new();
    for v in [1, 2] {
        let patch = encode(&diff(base, new, &opts(v)).unwrap());
        assert_eq!(apply_to_vec(base, &patch, &Limits::default()).unwrap(), new, "version {v} patch rebuilds");
        out.push(patch);
    }
    let v2 = out.pop().unwrap();
    (out.pop().unwrap(), v2)
}

#[test]
fn a_row_inserted_into_5000_rows_costs_about_one_row() {
    for xlsx in [true, false] {
        let part = if xlsx { xlsx_sheet } else { ods_content };
        let base = archive(&part(None), xlsx);
        let new = archive(&part(Some(2500)), xlsx);
        let (v1, v2) = both(&base, &new);
        let (ver1, modes1) = modes(&v1);
        let (ver2, modes2) = modes(&v2);
        eprintln!("{}: row inserted: version 1 patch {} B, version 2 patch {} B", if xlsx { "xlsx" } else { "ods" }, v1.len(), v2.len());
        assert_eq!(ver1, 1);
        assert!(!modes1.contains(&ContentMode::InflateOffsets));
        assert_eq!(ver2, 2, "the offset form needs version 2");
        assert!(modes2.contains(&ContentMode::InflateOffsets), "{modes2:?}");
        assert!(v2.len() < 1000, "version 2 patch of {} B", v2.len());
        assert!(v1.len() > 5 * v2.len(), "version 1 patch of {} B", v1.len());
        // A version 1 patch must not use mode 4: the same bytes with version byte 1 are malformed.
        let mut as_v1 = v2.clone();
        as_v1[4] = 1;
        assert!(matches!(decode(&as_v1, &Limits::default()), Err(PatchError::Malformed { .. })));
    }
}

#[test]
fn a_changed_cell_stays_small_and_without_version_2_when_it_does_not_pay() {
    let base_part = xlsx_sheet(None);
    let new_part = String::from_utf8(base_part.clone()).unwrap().replacen("<v>1000</v>", "<v>1001</v>", 1).into_bytes();
    let (v1, v2) = both(&archive(&base_part, true), &archive(&new_part, true));
    assert_eq!(v2, common::with_base_prefix(&v1), "nothing of version 2 pays: the version 1 patch, its base named by a prefix");
    assert!(v1.len() < 400, "{} B", v1.len());
}

#[test]
fn a_corrupt_offset_form_is_malformed_when_applied() {
    let (base, new) = (archive(&xlsx_sheet(None), true), archive(&xlsx_sheet(Some(10)), true));
    let mut p = diff(&base, &new, &opts(2)).unwrap();
    let Body::Zip(z) = &mut p.body else { panic!() };
    for s in &mut z.segments {
        if let Segment::Member(m) = s {
            if matches!(m.base, Some((_, ContentMode::InflateOffsets))) {
                // An escape byte followed by `<`: no forward transform writes that.
                m.delta = ec_patch::delta::ContentDelta { prefix: 0, base_mid: 0, middle: ec_patch::delta::Middle::Literal(vec![3]) };
            }
        }
    }
    let err = apply_to_vec(&base, &encode(&p), &Limits::default()).unwrap_err();
    assert!(matches!(err, PatchError::Malformed { .. }), "{err}");
}

/// Every deflated part of every real .xlsx and .ods: the inverse undoes the
/// transform, and the transform does write offsets in the sheets.
#[test]
fn the_offset_form_is_exact_on_real_spreadsheets() {
    let (mut parts, mut with_offsets) = (0, 0);
    common::for_each_corpus_part(&["xlsx", "ods"], |label, x| {
        let t = offsets_forward(x);
        assert_eq!(offsets_inverse(&t, u64::MAX).as_deref(), Ok(x), "{label}");
        assert_eq!(offsets_inverse(&t, x.len() as u64).map(|o| o.len()), Ok(x.len()));
        parts += 1;
        with_offsets += usize::from(t.len() != x.len() || t != x);
    });
    assert!(parts > 100 && with_offsets > 10, "{parts} parts, {with_offsets} with offsets");
}

/// Version 2 diffs of real spreadsheets against each other rebuild exactly.
#[test]
fn real_spreadsheets_rebuild_with_version_2() {
    for dir in ["xlsx", "ods"] {
        let mut files: Vec<_> = std::fs::read_dir(common::corpus().join(dir)).unwrap().flatten().map(|e| e.path()).collect();
        files.sort();
        for (i, f) in files.iter().enumerate() {
            let b = &files[(i + 1) % files.len()];
            let (base, new) = (std::fs::read(b).unwrap(), std::fs::read(f).unwrap());
            both(&base, &new);
            both(&new, &new);
        }
    }
}

/// A number changed in the middle of a 5,000-row sheet changes its dependents'
/// cached values down to the totals: version 2 codes the few changed places
/// as hunks (v2 §4.2) instead of one middle from the cell to the totals.
#[test]
fn a_changed_number_costs_per_change_with_hunks() {
    for xlsx in [true, false] {
        let (base, new) = if xlsx {
            (archive(&xlsx_sheet(None), true), archive(&xlsx_sheet_with(None, Some(2500)), true))
        } else {
            (archive(&ods_content(None), false), archive(&ods_content_with(None, Some(2500)), false))
        };
        let (v1, v2) = both(&base, &new);
        eprintln!("{}: number changed: version 1 patch {} B, version 2 patch {} B", if xlsx { "xlsx" } else { "ods" }, v1.len(), v2.len());
        let p = decode(&v2, &Limits::default()).unwrap();
        let Body::Zip(z) = &p.body else { panic!() };
        let hunks =
            z.segments.iter().any(|s| matches!(s, Segment::Member(m) if matches!(m.delta.middle, ec_patch::delta::Middle::Hunks { .. })));
        assert!(hunks && v2[4] == 2, "version 2 uses hunks");
        assert!(v2.len() < 400 && v2.len() < v1.len(), "{} B vs {} B", v2.len(), v1.len());
        let mut as_v1 = v2.clone();
        as_v1[4] = 1;
        assert!(matches!(decode(&as_v1, &Limits::default()), Err(PatchError::Malformed { .. })), "hunks in a version 1 patch");
    }
}
