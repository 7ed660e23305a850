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

/// Whether `n` (non-empty, starting with `<`) occurs in `h`. It jumps from
/// `<` to `<` rather than comparing at every position: a sheet part is
/// 1-5 MB, and an .ods holds no `<row r="` (searched to its end).
fn find(h: &[u8], n: &[u8]) -> bool {
    let mut i = 0;
    while let Some(p) = h[i..].iter().position(|&b| b == n[0]) {
        i += p;
        if h[i..].starts_with(n) {
            return true;
        }
        i += 1;
    }
    false
}

/// The bytes [`forward`] reads (`<` and digits); every other byte is copied.
const FORWARD_READS: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = b'0';
    while b <= b'9' {
        t[b as usize] = true;
        b += 1;
    }
    t[b'<' as usize] = true;
    t
};

/// The bytes [`inverse`] reads (`<` and [`MARK`]); every other byte is copied.
const INVERSE_READS: [bool; 256] = {
    let mut t = [false; 256];
    t[b'<' as usize] = true;
    t[MARK as usize] = true;
    t
};

/// Transforms `content`; `None` when it contains [`MARK`].
pub fn forward(content: &[u8]) -> Option<Vec<u8>> {
    if content.contains(&MARK) {
        return None;
    }
    let mut rows = Rows::default();
    let mut out = Vec::with_capacity(content.len());
    let mut i = 0;
    while i < content.len() {
        // Bytes no rule reads go out in one piece.
        let plain = content[i..].iter().position(|&b| FORWARD_READS[b as usize]).unwrap_or(content.len() - i);
        out.extend_from_slice(&content[i..i + plain]);
        i += plain;
        if i == content.len() {
            break;
        }
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
        let plain = t[i..].iter().position(|&b| INVERSE_READS[b as usize]).unwrap_or(t.len() - i);
        if plain > 0 {
            out.extend_from_slice(&t[i..i + plain]);
            i += plain;
            continue;
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

// ---------------------------------------------------------------------------
// The row-offset form (version 2, content mode 4, INFLATE_OFFSETS; spec v2 §4.1)
// ---------------------------------------------------------------------------

/// Offset form: a row reference at or below the current row (`+k`, digits of k
/// follow unless k = 0), or `<row r="` numbered the previous row + 1 + k.
pub const OFF_PLUS: u8 = 0x01;
/// Offset form: a row reference k ≥ 1 rows above the current row (digits of k follow).
pub const OFF_MINUS: u8 = 0x02;
/// Offset form: the next byte (0x01, 0x02 or 0x03) stands for itself.
pub const OFF_ESC: u8 = 0x03;

/// Row tracking of the offset form. Unlike [`Rows`], it reads only the
/// content already produced (the input going forward, the output going
/// back), so both directions see the same state at every position whatever
/// the bytes are: the inverse is exact for any input.
#[derive(Debug, Default)]
struct Track {
    current: u64,
    next_odf: u64,
    prev_row: u64,
    /// Where the last `<` not yet closed by a `>` is.
    open: Option<usize>,
}

impl Track {
    /// Called once `x[at]`, a `<` or `>`, is final (`x` holds the content up to it).
    fn angle(&mut self, x: &[u8], at: usize) {
        if x[at] == b'<' {
            self.open = Some(at);
            return;
        }
        let Some(start) = self.open.take() else { return };
        let tag = &x[start..=at];
        if tag.starts_with(ROW_ODF) && matches!(tag.get(ROW_ODF.len()), Some(b' ' | b'>' | b'/')) {
            let repeat = memfind(tag, REPEAT_ODF).and_then(|p| {
                let d = &tag[p + REPEAT_ODF.len()..];
                parse(&d[..digits_at(d, 0)])
            });
            self.current = self.next_odf.max(1);
            self.next_odf = self.current.saturating_add(repeat.unwrap_or(1).max(1));
        } else if tag.starts_with(TABLE_ODF) && matches!(tag.get(TABLE_ODF.len()), Some(b' ' | b'>')) {
            self.current = 0;
            self.next_odf = 1;
        }
    }
}

fn memfind(h: &[u8], n: &[u8]) -> Option<usize> {
    h.windows(n.len()).position(|w| w == n)
}

/// The offset a reference to row `v` from row `current` is written with, if
/// any: the current row is known and the offset is smaller than `v` (a
/// reference far above, such as a total's `B2`, stays absolute).
fn offset_of(v: u64, current: u64) -> Option<i128> {
    let d = v as i128 - current as i128;
    (current > 0 && d.abs() < v as i128).then_some(d)
}

fn push_dec(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(v.to_string().as_bytes());
}

/// The bytes the offset form's rules look at: digits, `<`, `>` and the markers.
const SPECIAL: [bool; 256] = {
    let mut t = [false; 256];
    let mut b = b'0';
    while b <= b'9' {
        t[b as usize] = true;
        b += 1;
    }
    t[b'<' as usize] = true;
    t[b'>' as usize] = true;
    t[OFF_PLUS as usize] = true;
    t[OFF_MINUS as usize] = true;
    t[OFF_ESC as usize] = true;
    t
};

/// The row-offset form of any bytes (mode 4): total, linear, and exactly
/// undone by [`offsets_inverse`].
pub fn offsets_forward(x: &[u8]) -> Vec<u8> {
    let mut t = Track::default();
    let mut out = Vec::with_capacity(x.len() + x.len() / 64);
    let mut i = 0;
    while i < x.len() {
        // Bytes no rule reads go out in one piece.
        let plain = x[i..].iter().position(|&b| SPECIAL[b as usize]).unwrap_or(x.len() - i);
        out.extend_from_slice(&x[i..i + plain]);
        i += plain;
        if i == x.len() {
            break;
        }
        let b = x[i];
        if b.is_ascii_digit() && i > 0 {
            let n = digits_at(x, i);
            let run = &x[i..i + n];
            let v = parse(run);
            if x[..i].ends_with(ROW_OOXML) {
                match v {
                    Some(v) if v > t.prev_row => {
                        out.push(OFF_PLUS);
                        if v - t.prev_row > 1 {
                            push_dec(&mut out, v - t.prev_row - 1);
                        }
                    }
                    _ => out.extend_from_slice(run),
                }
                if let Some(v) = v {
                    t.prev_row = v;
                    t.current = v;
                }
                i += n;
                continue;
            }
            if !x[i - 1].is_ascii_uppercase() {
                out.extend_from_slice(run);
                i += n;
                continue;
            }
            {
                match v.and_then(|v| offset_of(v, t.current)) {
                    Some(0) => out.push(OFF_PLUS),
                    Some(d) if d > 0 => {
                        out.push(OFF_PLUS);
                        push_dec(&mut out, d as u64);
                    }
                    Some(d) => {
                        out.push(OFF_MINUS);
                        push_dec(&mut out, d.unsigned_abs() as u64);
                    }
                    None => out.extend_from_slice(run),
                }
                i += n;
                continue;
            }
        }
        match b {
            OFF_PLUS | OFF_MINUS | OFF_ESC => out.extend_from_slice(&[OFF_ESC, b]),
            b'<' | b'>' => {
                out.push(b);
                t.angle(x, i);
            }
            _ => out.push(b),
        }
        i += 1;
    }
    out
}

/// Why [`offsets_inverse`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OffsetsError {
    /// The result would exceed the given length.
    TooLong,
    /// The bytes are not a row-offset form: (position, reason).
    Invalid(usize, &'static str),
}

/// Inverts [`offsets_forward`]: `offsets_inverse(&offsets_forward(x), _) == x`
/// for every `x` (within `max_len`). Fails on bytes [`offsets_forward`]
/// cannot produce, and as soon as the result would exceed `max_len` bytes.
pub fn offsets_inverse(t: &[u8], max_len: u64) -> Result<Vec<u8>, OffsetsError> {
    let mut tr = Track::default();
    let mut out: Vec<u8> = Vec::with_capacity(t.len().min(max_len as usize) + t.len().min(max_len as usize) / 8);
    let mut i = 0;
    // The valid run of digits right after a marker, or none (k = 0 for OFF_PLUS).
    let number = |at: usize| -> Result<(Option<u64>, usize), OffsetsError> {
        let n = digits_at(t, at);
        if n == 0 {
            return Ok((None, 0));
        }
        match parse(&t[at..at + n]) {
            Some(k) if k > 0 => Ok((Some(k), n)),
            _ => Err(OffsetsError::Invalid(at, "an offset is not a number from 1 to 10^19 - 1 without leading zeros")),
        }
    };
    while i < t.len() {
        if out.len() as u64 > max_len {
            return Err(OffsetsError::TooLong);
        }
        let plain = t[i..].iter().position(|&b| SPECIAL[b as usize]).unwrap_or(t.len() - i);
        if plain > 0 {
            out.extend_from_slice(&t[i..i + plain]);
            i += plain;
            continue;
        }
        let b = t[i];
        match b {
            OFF_ESC => match t.get(i + 1) {
                Some(&e @ (OFF_PLUS | OFF_MINUS | OFF_ESC)) => {
                    out.push(e);
                    i += 2;
                }
                _ => return Err(OffsetsError::Invalid(i, "an escape not followed by 0x01, 0x02 or 0x03")),
            },
            OFF_PLUS | OFF_MINUS if out.ends_with(ROW_OOXML) => {
                if b == OFF_MINUS {
                    return Err(OffsetsError::Invalid(i, "a row number above the previous row"));
                }
                let (k, n) = number(i + 1)?;
                let v = tr.prev_row.checked_add(1).and_then(|v| v.checked_add(k.unwrap_or(0)));
                let v = v.filter(|&v| v < 10_000_000_000_000_000_000).ok_or(OffsetsError::Invalid(i, "a row number past 10^19 - 1"))?;
                push_dec(&mut out, v);
                tr.prev_row = v;
                tr.current = v;
                i += 1 + n;
            }
            OFF_PLUS | OFF_MINUS if out.last().is_some_and(u8::is_ascii_uppercase) => {
                let (k, n) = number(i + 1)?;
                if b == OFF_MINUS && k.is_none() {
                    return Err(OffsetsError::Invalid(i, "an upward offset without digits"));
                }
                let d = if b == OFF_PLUS { k.unwrap_or(0) as i128 } else { -(k.unwrap_or(0) as i128) };
                let v = tr.current as i128 + d;
                if tr.current == 0 || !(1..10_000_000_000_000_000_000).contains(&v) || offset_of(v as u64, tr.current) != Some(d) {
                    return Err(OffsetsError::Invalid(i, "an offset the forward transform would not write here"));
                }
                push_dec(&mut out, v as u64);
                i += 1 + n;
            }
            OFF_PLUS | OFF_MINUS => {
                return Err(OffsetsError::Invalid(i, "an offset marker after neither `<row r=\"` nor a capital letter"))
            }
            _ if b.is_ascii_digit() && out.ends_with(ROW_OOXML) => {
                // A row number written out: the whole run, which updates the tracking.
                let n = digits_at(t, i);
                out.extend_from_slice(&t[i..i + n]);
                if let Some(v) = parse(&t[i..i + n]) {
                    tr.prev_row = v;
                    tr.current = v;
                }
                i += n;
            }
            b'<' | b'>' => {
                out.push(b);
                tr.angle(&out, out.len() - 1);
                i += 1;
            }
            _ => {
                out.push(b);
                i += 1;
            }
        }
    }
    if out.len() as u64 > max_len {
        return Err(OffsetsError::TooLong);
    }
    Ok(out)
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

    /// [`forward`] as first written, one byte at a time: the oracle of the
    /// faster one, which copies the bytes no rule reads in runs.
    fn forward_by_bytes(content: &[u8]) -> Option<Vec<u8>> {
        if content.contains(&MARK) {
            return None;
        }
        let mut rows = Rows::default();
        let mut out = Vec::new();
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

    /// [`inverse`] as first written, one byte at a time (no length limit).
    fn inverse_by_bytes(t: &[u8]) -> Vec<u8> {
        let mut rows = Rows::default();
        let mut out: Vec<u8> = Vec::new();
        let mut i = 0;
        let push_num = |out: &mut Vec<u8>, v: u64| out.extend_from_slice(v.to_string().as_bytes());
        while i < t.len() {
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
        out
    }

    /// Bytes around the row rules: tags, capitals, digits, the marker.
    fn near_rows() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(b"<row r=\"".to_vec()),
            Just(b"<table:table-row ".to_vec()),
            Just(b"<table:table>".to_vec()),
            Just(b"table:number-rows-repeated=\"".to_vec()),
            Just(b">".to_vec()),
            Just(vec![MARK]),
            proptest::collection::vec(
                prop_oneof![Just(b'A'), Just(b'F'), Just(b'0'), Just(b'1'), Just(b'2'), Just(b'9'), any::<u8>()],
                0..4
            ),
        ];
        proptest::collection::vec(piece, 0..60).prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn forward_and_inverse_agree_with_the_byte_at_a_time_ones(x in near_rows()) {
            prop_assert_eq!(forward(&x), forward_by_bytes(&x));
            prop_assert_eq!(inverse(&x, u64::MAX), Some(inverse_by_bytes(&x)));
            let n = inverse_by_bytes(&x).len() as u64;
            prop_assert_eq!(inverse(&x, n).map(|o| o.len() as u64), Some(n));
            if n > 0 {
                prop_assert_eq!(inverse(&x, n - 1), None);
            }
            let naive = |h: &[u8], n: &[u8]| h.windows(n.len()).any(|w| w == n);
            prop_assert_eq!(find(&x, ROW_OOXML), naive(&x, ROW_OOXML));
            prop_assert_eq!(find(&x, ROW_ODF), naive(&x, ROW_ODF));
        }
    }

    // ----- the row-offset form (mode 4) -----

    fn off_round_trip(x: &[u8]) -> Vec<u8> {
        let t = offsets_forward(x);
        assert_eq!(offsets_inverse(&t, u64::MAX).as_deref(), Ok(x), "inverse(forward(x)) != x for {:?}", String::from_utf8_lossy(x));
        t
    }

    /// A 5,000-row sheet like byte_goals.py's: references to the row itself,
    /// the rows above, a running window, and totals over the whole column.
    fn offsets_sheet(insert_at: Option<u64>) -> Vec<u8> {
        let mut s = String::from("<worksheet><dimension ref=\"A1:H5002\"/><sheetData><row r=\"1\"><c r=\"A1\" t=\"s\"><v>0</v></c></row>");
        let mut r: u64 = 2;
        for k in 2..=5001u64 {
            if insert_at == Some(k) {
                s.push_str(&format!("<row r=\"{r}\"><c r=\"A{r}\"><v>77</v></c></row>"));
                r += 1;
            }
            s.push_str(&format!(
                "<row r=\"{r}\" ht=\"12.8\"><c r=\"A{r}\"><v>{}</v></c><c r=\"B{r}\"><v>{}</v></c><c r=\"E{r}\"><f>B{r}*2</f><v>1</v></c><c r=\"F{r}\"><f>B{r}-B{}</f><v>2</v></c><c r=\"G{r}\"><f>SUM(B{}:B{r})+$B$1+Sheet2!C{r}</f><v>3</v></c></row>",
                k * 7 % 1000,
                k * 13 % 97,
                r - 1,
                r.saturating_sub(4).max(1)
            ));
            r += 1;
        }
        s.push_str(&format!("<row r=\"{r}\"><c r=\"B{r}\"><f>SUM(B2:B{})</f><v>5</v></c></row></sheetData></worksheet>", r - 1));
        s.into_bytes()
    }

    #[test]
    fn offsets_make_a_row_insert_local() {
        let (base, new) = (offsets_sheet(None), offsets_sheet(Some(2500)));
        let (tb, tn) = (off_round_trip(&base), off_round_trip(&new));
        let plain = crate::delta::diff(&base, &new).unwrap().middle.encoded_len();
        let rel = crate::delta::diff(&forward(&base).unwrap(), &forward(&new).unwrap()).unwrap().middle.encoded_len();
        let off = crate::delta::diff(&tb, &tn).unwrap().middle.encoded_len();
        // Only the inserted row, the dimension's and totals' numbers differ.
        assert!(off < 400, "offset form: {off} B (row-relative {rel} B, plain {plain} B)");
        assert!(rel > 5 * off, "the row-relative form should pay for B{{r-1}}: {rel} B vs {off} B");
    }

    #[test]
    fn offsets_spell_references_as_expected() {
        let x = b"<row r=\"7\"><c r=\"B7\"><f>B6+B9+A1+$B$7+B$7+$B7+B0+B007</f></c></row><row r=\"9\"><c r=\"C9\"/></row>";
        let t = off_round_trip(x);
        let want: &[u8] = b"<row r=\"\x016\"><c r=\"B\x01\"><f>B\x021+B\x012+A1+$B$7+B$7+$B\x01+B0+B007</f></c></row><row r=\"\x011\"><c r=\"C\x01\"/></row>";
        assert_eq!(t, want, "{:?}", String::from_utf8_lossy(&t));
        // Marker bytes in the input are escaped, and the escape itself too.
        assert_eq!(off_round_trip(b"A\x01\x02\x03<row r=\"\x01"), b"A\x03\x01\x03\x02\x03\x03<row r=\"\x03\x01");
    }

    #[test]
    fn offsets_count_odf_rows_as_they_are_read() {
        let ods = b"<table:table table:name=\"S\"><table:table-row><table:table-cell table:formula=\"of:=[.F1]*[.G2]\"/></table:table-row><table:table-row table:number-rows-repeated=\"3\"><table:table-cell/></table:table-row><table:table-row><table:table-cell table:formula=\"of:=[.F5]+[.A4]+[.A1]\"/></table:table-row></table:table>";
        let t = off_round_trip(ods);
        let s = String::from_utf8_lossy(&t);
        assert!(s.contains("[.F\u{1}]*[.G\u{1}1]"), "{s}");
        assert!(s.contains("[.F\u{1}]+[.A\u{2}1]+[.A1]"), "{s}");
    }

    #[test]
    fn offsets_inverse_rejects_what_forward_cannot_write() {
        for bad in
            [&b"\x01"[..], b"a\x01", b"A\x02", b"A\x010", b"\x03", b"\x03a", b"<row r=\"\x02", b"A\x0299999999999999999999", b"A\x011"]
        {
            assert!(matches!(offsets_inverse(bad, 1 << 20), Err(OffsetsError::Invalid(..))), "{bad:?}");
        }
        // Row 1: B0 is never written with an offset (|-1| < 0 fails), B2 is +1.
        assert_eq!(offsets_inverse(b"<row r=\"\x01\"><f>B\x011</f>", 1 << 20).unwrap(), b"<row r=\"1\"><f>B2</f>");
        assert!(matches!(offsets_inverse(b"<row r=\"\x01\"><f>B\x021</f>", 1 << 20), Err(OffsetsError::Invalid(..))));
        // Markers expand: the length limit holds during the inverse.
        let many: Vec<u8> = [&b"<row r=\"\x019999999999999999\">"[..], &b"A\x01".repeat(1000)].concat();
        assert_eq!(offsets_inverse(&many, 5000), Err(OffsetsError::TooLong));
    }

    fn near_miss() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop_oneof![
            Just(&b"<row r=\""[..]),
            Just(&b"<table:table-row"[..]),
            Just(&b"<table:table "[..]),
            Just(&b"<table:table>"[..]),
            Just(&b" table:number-rows-repeated=\""[..]),
            Just(&b"<"[..]),
            Just(&b">"[..]),
            Just(&b"/"[..]),
            Just(&b"\""[..]),
            Just(&b" "[..]),
            Just(&b"A"[..]),
            Just(&b"Z"[..]),
            Just(&b"$"[..]),
            Just(&b"0"[..]),
            Just(&b"1"[..]),
            Just(&b"7"[..]),
            Just(&b"9999999999999999999"[..]),
            Just(&b"18446744073709551615"[..]),
            Just(&b"99999999999999999999"[..]),
            Just(&b"\x01"[..]),
            Just(&b"\x02"[..]),
            Just(&b"\x03"[..]),
            Just(&b"-"[..]),
        ];
        proptest::collection::vec(piece, 0..120).prop_map(|v| v.concat())
    }

    proptest! {
        #[test]
        fn offsets_inverse_undoes_forward_on_any_bytes(x in proptest::collection::vec(any::<u8>(), 0..600)) {
            prop_assert_eq!(offsets_inverse(&offsets_forward(&x), u64::MAX), Ok(x));
        }

        #[test]
        fn offsets_inverse_undoes_forward_on_near_misses(x in near_miss(), y in near_miss()) {
            let x = [x, y].concat();
            let t = offsets_forward(&x);
            prop_assert_eq!(offsets_inverse(&t, u64::MAX), Ok(x.clone()));
            // The result's length is exact: a limit just below it fails.
            prop_assert_eq!(offsets_inverse(&t, x.len() as u64).map(|o| o.len()), Ok(x.len()));
            if !x.is_empty() {
                prop_assert_eq!(offsets_inverse(&t, x.len() as u64 - 1), Err(OffsetsError::TooLong));
            }
        }

        #[test]
        fn offsets_inverse_never_panics(t in near_miss()) {
            if let Ok(x) = offsets_inverse(&t, 1 << 16) {
                prop_assert!(x.len() <= 1 << 16);
            }
        }
    }
}
