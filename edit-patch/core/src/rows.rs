//! The row-relative transform of spreadsheet XML (spec §4.2.5).
//!
//! Spreadsheets spell each cell's row number out in full: SpreadsheetML
//! writes `<row r="2501"><c r="A2501">…<f>F2501*G2501</f>`, OpenDocument
//! writes `table:formula="of:=[.F2501]*[.G2501]"`. Insert one row and every
//! later row number changes: thousands of edits for a one-row change. This
//! transform rewrites row numbers relative to the row they stand in, so that
//! unchanged rows are unchanged bytes wherever they move:
//!
//! - a maximal run of decimal digits immediately after an ASCII capital
//!   letter, equal to the current row number, becomes the byte [`MARK`];
//! - in SpreadsheetML, the number of `<row r="N"` becomes [`MARK`] when N is
//!   the previous row's number plus one.
//!
//! The current row is the last `<row r="N"` seen (SpreadsheetML), or the
//! running count of `<table:table-row` elements of the current
//! `<table:table`, `table:number-rows-repeated` honoured (OpenDocument).
//! Neither direction changes what the row tracking reads, so the inverse sees
//! the same rows. [`MARK`] (0x01) cannot occur in XML 1.0 text; content that
//! contains it is not transformed. Complexity: one linear pass each way.

/// The marker byte standing for "the current row number" (or "previous + 1").
pub const MARK: u8 = 0x01;

const ROW_OOXML: &[u8] = b"<row r=\"";
const ROW_ODF: &[u8] = b"<table:table-row";
const TABLE_ODF: &[u8] = b"<table:table";
const REPEAT_ODF: &[u8] = b"table:number-rows-repeated=\"";

/// Row tracking, identical in both directions.
#[derive(Debug, Default)]
struct Rows {
    /// The current row (0 before any).
    current: u64,
    /// The row the next `<table:table-row` starts (OpenDocument).
    next_odf: u64,
    /// The previous `<row r=` number (SpreadsheetML).
    prev_ooxml: u64,
}

fn digits_at(s: &[u8], at: usize) -> usize {
    s[at..].iter().take_while(|b| b.is_ascii_digit()).count()
}

fn parse(d: &[u8]) -> Option<u64> {
    if d.is_empty() || d.len() > 19 || (d[0] == b'0' && d.len() > 1) {
        return None;
    }
    std::str::from_utf8(d).ok()?.parse().ok()
}

impl Rows {
    /// Updates the tracking for an OpenDocument tag starting at `at`.
    fn odf_tag(&mut self, s: &[u8], at: usize) {
        let rest = &s[at..];
        if rest.starts_with(ROW_ODF) && matches!(rest.get(ROW_ODF.len()), Some(b' ' | b'>' | b'/')) {
            let end = rest.iter().position(|&b| b == b'>').unwrap_or(rest.len());
            let tag = &rest[..end];
            let repeat = tag.windows(REPEAT_ODF.len()).position(|w| w == REPEAT_ODF).and_then(|p| {
                let d = &tag[p + REPEAT_ODF.len()..];
                parse(&d[..digits_at(d, 0)])
            });
            self.current = self.next_odf.max(1);
            self.next_odf = self.current.saturating_add(repeat.unwrap_or(1).max(1));
        } else if rest.starts_with(TABLE_ODF) && matches!(rest.get(TABLE_ODF.len()), Some(b' ' | b'>')) {
            self.current = 0;
            self.next_odf = 1;
        }
    }
}

/// Whether `content` looks like spreadsheet XML worth transforming.
pub fn applies(content: &[u8]) -> bool {
    !content.contains(&MARK) && (find(content, ROW_OOXML) || find(content, ROW_ODF))
}

fn find(h: &[u8], n: &[u8]) -> bool {
    h.windows(n.len()).any(|w| w == n)
}

/// Transforms `content`; `None` when it contains [`MARK`].
pub fn forward(content: &[u8]) -> Option<Vec<u8>> {
    if content.contains(&MARK) {
        return None;
    }
    let mut rows = Rows::default();
    let mut out = Vec::with_capacity(content.len());
    let mut i = 0;
    while i < content.len() {
        let b = content[i];
        if b == b'<' {
            rows.odf_tag(content, i);
            if content[i..].starts_with(ROW_OOXML) {
                let at = i + ROW_OOXML.len();
                let n = digits_at(content, at);
                out.extend_from_slice(ROW_OOXML);
                i = at;
                if let Some(v) = parse(&content[at..at + n]) {
                    if v == rows.prev_ooxml + 1 {
                        out.push(MARK);
                        i += n;
                    }
                    rows.prev_ooxml = v;
                    rows.current = v;
                }
                continue;
            }
        }
        if b.is_ascii_digit() && i > 0 && content[i - 1].is_ascii_uppercase() {
            let n = digits_at(content, i);
            if rows.current > 0 && parse(&content[i..i + n]) == Some(rows.current) {
                out.push(MARK);
            } else {
                out.extend_from_slice(&content[i..i + n]);
            }
            i += n;
            continue;
        }
        out.push(b);
        i += 1;
    }
    Some(out)
}

/// Inverts [`forward`]; `None` if the result would exceed `max_len` bytes.
/// Any input gives some output: correctness rests on the patch's hashes.
pub fn inverse(t: &[u8], max_len: u64) -> Option<Vec<u8>> {
    let mut rows = Rows::default();
    let mut out: Vec<u8> = Vec::with_capacity(t.len() + t.len() / 8);
    let mut i = 0;
    let push_num = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(v.to_string().as_bytes());
    while i < t.len() {
        if out.len() as u64 > max_len {
            return None;
        }
        let b = t[i];
        if b == b'<' {
            rows.odf_tag(t, i);
            if t[i..].starts_with(ROW_OOXML) {
                let at = i + ROW_OOXML.len();
                out.extend_from_slice(ROW_OOXML);
                i = at;
                let v = if t.get(at) == Some(&MARK) {
                    i += 1;
                    let v = rows.prev_ooxml.saturating_add(1);
                    push_num(&mut out, v);
                    Some(v)
                } else {
                    let n = digits_at(t, at);
                    out.extend_from_slice(&t[at..at + n]);
                    i += n;
                    parse(&t[at..at + n])
                };
                if let Some(v) = v {
                    rows.prev_ooxml = v;
                    rows.current = v;
                }
                continue;
            }
        }
        if b == MARK && i > 0 && t[i - 1].is_ascii_uppercase() && rows.current > 0 {
            push_num(&mut out, rows.current);
            i += 1;
            continue;
        }
        out.push(b);
        i += 1;
    }
    (out.len() as u64 <= max_len).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sheet(rows: &[u64]) -> Vec<u8> {
        let mut s = String::from("<worksheet><dimension ref=\"A1:H9\"/><sheetData>");
        for &r in rows {
            s.push_str(&format!(
                "<row r=\"{r}\" ht=\"12.8\"><c r=\"A{r}\" t=\"n\"><v>{}</v></c><c r=\"H{r}\"><f>F{r}*G{r}+$B$2+A1{r}</f><v>7</v></c></row>",
                r * 3
            ));
        }
        s.push_str("</sheetData></worksheet>");
        s.into_bytes()
    }

    #[test]
    fn an_inserted_row_leaves_later_rows_unchanged() {
        let base: Vec<u64> = (1..=50).collect();
        let mut with_row: Vec<u64> = (1..=51).collect();
        with_row.truncate(51);
        let (tb, tn) = (forward(&sheet(&base)).unwrap(), forward(&sheet(&with_row)).unwrap());
        assert_eq!(inverse(&tb, 1 << 20).unwrap(), sheet(&base));
        assert_eq!(inverse(&tn, 1 << 20).unwrap(), sheet(&with_row));
        // Every row now reads the same: the transformed sheets differ by one row.
        assert!(tn.len() - tb.len() < 150, "{} vs {}", tn.len(), tb.len());
    }

    #[test]
    fn odf_rows_count_with_repeats() {
        let ods = b"<table:table table:name=\"S\"><table:table-row><table:table-cell table:formula=\"of:=[.F1]*[.G1]\"/></table:table-row><table:table-row table:number-rows-repeated=\"3\"><table:table-cell/></table:table-row><table:table-row><table:table-cell table:formula=\"of:=[.F5]+[.A4]\"/></table:table-row></table:table>";
        let t = forward(ods).unwrap();
        assert_eq!(t.iter().filter(|&&b| b == MARK).count(), 3, "F1, G1 and F5 are row-relative, A4 is not");
        assert_eq!(inverse(&t, 1 << 20).unwrap(), ods);
    }

    proptest! {
        #[test]
        fn inverse_undoes_forward_on_any_bytes(s in proptest::collection::vec(prop_oneof![Just(b'<'), Just(b'A'), Just(b'F'), Just(b'1'), Just(b'2'), Just(b'0'), Just(b'"'), Just(b' '), Just(b'>'), any::<u8>()], 0..400), rows in 0u64..4) {
            let mut text = Vec::new();
            for r in 1..=rows {
                text.extend_from_slice(format!("<row r=\"{r}\">").as_bytes());
                text.extend_from_slice(&s);
            }
            text.extend_from_slice(&s);
            match forward(&text) {
                Some(t) => prop_assert_eq!(inverse(&t, u64::MAX).unwrap(), text),
                None => prop_assert!(text.contains(&MARK)),
            }
        }
    }
}
