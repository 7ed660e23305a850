//! The GUID form of XML parts (content mode 5, edit-patch-v2.md §4.3).
//!
//! Some producers write fresh random GUIDs on every save: LibreOffice's
//! .pptx gives the slide-number field of every slide layout and master a new
//! `id="{8-4-4-4-12}"` each time, so a save with no edit changes a dozen or
//! more parts by one GUID each. Written out, a GUID is 38 bytes of text
//! carrying 16 bytes of entropy; a content delta has to send the 32 changed
//! hex digits (and the dashes between them), and zstd codes hex text at a
//! little over 4 bits a digit plus its tables. The **GUID form** *G*(*X*)
//! writes each braced GUID of *X* as a marker byte and its 16 bytes, so that
//! a changed GUID costs its 16 bytes and nothing else.
//!
//! - `{` 8-4-4-4-12 uppercase hex digits `}` becomes [`GUID_UPPER`] and the
//!   16 bytes the hex digits spell, in text order; the same in lowercase
//!   becomes [`GUID_LOWER`] and its 16 bytes (a GUID of digits only is
//!   uppercase);
//! - an input byte equal to one of the three marker bytes is escaped with
//!   [`ESC`];
//! - every other byte is itself.
//!
//! The form is defined for any bytes and exactly undone by [`inverse`]:
//! `inverse(&forward(x), _) == x` for every `x`. Both directions are one
//! linear pass. *G*(*X*) is at most 2|*X*| bytes (every byte escaped), and
//! *G*⁻¹(*T*) at most 38/17 |*T*| + 1.

use std::collections::HashMap;

/// Marker: an uppercase braced GUID, followed by its 16 bytes.
pub const GUID_UPPER: u8 = 0x01;
/// Marker: a lowercase braced GUID, followed by its 16 bytes.
pub const GUID_LOWER: u8 = 0x02;
/// Marker: the next byte (0x01, 0x02 or 0x03) is itself.
pub const ESC: u8 = 0x03;

/// Length of a braced GUID written out: `{`, 32 hex digits, 4 dashes, `}`.
pub const GUID_TEXT: usize = 38;
/// Offsets of the dashes in a braced GUID.
const DASHES: [usize; 4] = [9, 14, 19, 24];

/// Value of a hex digit of the given case (digits are both), or `None`.
fn nibble(b: u8, upper: bool) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'A'..=b'F' if upper => Some(b - b'A' + 10),
        b'a'..=b'f' if !upper => Some(b - b'a' + 10),
        _ => None,
    }
}

/// The 16 bytes of the braced GUID of that case at the start of `x`, if there is one.
fn guid_at(x: &[u8], upper: bool) -> Option<[u8; 16]> {
    let g = x.get(..GUID_TEXT)?;
    if g[0] != b'{' || g[GUID_TEXT - 1] != b'}' || DASHES.iter().any(|&d| g[d] != b'-') {
        return None;
    }
    let mut digits = g[1..GUID_TEXT - 1].iter().filter(|&&b| b != b'-');
    let mut out = [0u8; 16];
    for o in &mut out {
        let hi = nibble(*digits.next()?, upper)?;
        let lo = nibble(*digits.next()?, upper)?;
        *o = hi << 4 | lo;
    }
    Some(out)
}

/// Writes a braced GUID of 16 bytes in that case.
fn push_guid(out: &mut Vec<u8>, bytes: &[u8], upper: bool) {
    let digits: &[u8; 16] = if upper { b"0123456789ABCDEF" } else { b"0123456789abcdef" };
    out.push(b'{');
    for (k, &b) in bytes.iter().enumerate() {
        if matches!(k, 4 | 6 | 8 | 10) {
            out.push(b'-');
        }
        out.push(digits[usize::from(b >> 4)]);
        out.push(digits[usize::from(b & 15)]);
    }
    out.push(b'}');
}

/// Whether `x` holds a braced GUID (of either case) anywhere.
pub fn has_guid(x: &[u8]) -> bool {
    (0..x.len()).filter(|&i| x[i] == b'{').any(|i| guid_at(&x[i..], true).is_some() || guid_at(&x[i..], false).is_some())
}

/// The GUID form of any bytes: total, linear, exactly undone by [`inverse`].
pub fn forward(x: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(x.len() + 16);
    let mut i = 0;
    while i < x.len() {
        // Bytes no rule reads go out in one piece.
        let plain = x[i..].iter().position(|&b| b == b'{' || (GUID_UPPER..=ESC).contains(&b)).unwrap_or(x.len() - i);
        out.extend_from_slice(&x[i..i + plain]);
        i += plain;
        let Some(&b) = x.get(i) else { break };
        if b != b'{' {
            out.extend_from_slice(&[ESC, b]);
            i += 1;
            continue;
        }
        let found = guid_at(&x[i..], true).map(|g| (GUID_UPPER, g)).or_else(|| guid_at(&x[i..], false).map(|g| (GUID_LOWER, g)));
        match found {
            Some((marker, g)) => {
                out.push(marker);
                out.extend_from_slice(&g);
                i += GUID_TEXT;
            }
            None => {
                out.push(b'{');
                i += 1;
            }
        }
    }
    out
}

/// Why [`inverse`] failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GuidsError {
    /// The result would exceed the given length.
    TooLong,
    /// The bytes are not a GUID form: (position, reason).
    Invalid(usize, &'static str),
}

/// Inverts [`forward`]: `inverse(&forward(x), _) == x` for every `x` (within
/// `max_len`). Fails on bytes [`forward`] cannot produce (a marker without
/// its 16 bytes, an escape of another byte), and as soon as the result would
/// exceed `max_len` bytes.
pub fn inverse(t: &[u8], max_len: u64) -> Result<Vec<u8>, GuidsError> {
    let mut out: Vec<u8> = Vec::with_capacity(t.len().min(max_len as usize).saturating_add(64));
    let mut i = 0;
    while i < t.len() {
        if out.len() as u64 > max_len {
            return Err(GuidsError::TooLong);
        }
        let plain = t[i..].iter().position(|&b| (GUID_UPPER..=ESC).contains(&b)).unwrap_or(t.len() - i);
        if plain > 0 {
            // At most a marker's worth past the limit before the check above.
            let take = plain.min((max_len as usize).saturating_sub(out.len()).saturating_add(1));
            out.extend_from_slice(&t[i..i + take]);
            i += take;
            continue;
        }
        match t[i] {
            ESC => match t.get(i + 1) {
                Some(&e @ GUID_UPPER..=ESC) => {
                    out.push(e);
                    i += 2;
                }
                _ => return Err(GuidsError::Invalid(i, "an escape not followed by 0x01, 0x02 or 0x03")),
            },
            m => {
                let bytes = t.get(i + 1..i + 17).ok_or(GuidsError::Invalid(i, "a GUID marker without its 16 bytes"))?;
                push_guid(&mut out, bytes, m == GUID_UPPER);
                i += 17;
            }
        }
    }
    if out.len() as u64 > max_len {
        return Err(GuidsError::TooLong);
    }
    Ok(out)
}

/// Where the tokens of a GUID form start: for each marker its position,
/// and whether the form reads to its end (§4.4.1's grammar).
fn markers(t: &[u8]) -> (Vec<usize>, bool) {
    let (mut at, mut i) = (Vec::new(), 0);
    while i < t.len() {
        match t[i] {
            GUID_UPPER | GUID_LOWER if i + 17 <= t.len() => {
                at.push(i);
                i += 17;
            }
            ESC if i + 1 < t.len() => i += 2,
            GUID_UPPER..=ESC => return (at, false),
            _ => i += 1,
        }
    }
    (at, true)
}

/// The index of the next named marker (mode 6) or token (mode 7): `skip`
/// past the one after `prev`, or `skip` itself for the first; `None` past
/// 2^64 - 1 (edit-patch-v2.md §4.4.1, §4.5.2).
pub(crate) fn next_index(prev: Option<u64>, skip: u64) -> Option<u64> {
    match prev {
        None => Some(skip),
        Some(j) => j.checked_add(1).and_then(|j| j.checked_add(skip)),
    }
}

/// A GUID replaced in mode 6 (edit-patch-v2.md §4.4): the markers passed
/// over since the previous replaced one, and its new 16 bytes.
pub type GuidSet = Vec<(u64, [u8; 16])>;

/// Mode 6: replaces, in the GUID form `t`, the payloads of the markers
/// `set` names. Fails when `t` has no such marker or does not read to its
/// end as a GUID form.
pub fn replace(t: &mut [u8], set: &[(u64, [u8; 16])]) -> Result<(), GuidsError> {
    let (at, whole) = markers(t);
    if !whole {
        return Err(GuidsError::Invalid(0, "the base's GUID form does not read to its end"));
    }
    let mut j: Option<u64> = None;
    for (skip, bytes) in set {
        let next = next_index(j, *skip);
        let k = next.filter(|&k| k < at.len() as u64).ok_or(GuidsError::Invalid(0, "a GUID past the base's last one"))?;
        let p = at[k as usize];
        t[p + 1..p + 17].copy_from_slice(bytes);
        j = Some(k);
    }
    Ok(())
}

/// The mode 6 set that turns the GUID form `b` into `n`, when they differ
/// only inside marker payloads at the same places (`None` otherwise, or
/// when they are the same).
pub fn changed_payloads(b: &[u8], n: &[u8]) -> Option<GuidSet> {
    if b.len() != n.len() || b == n {
        return None;
    }
    let ((mb, wb), (mn, wn)) = (markers(b), markers(n));
    if !wb || !wn || mb != mn {
        return None;
    }
    let (mut set, mut from, mut last) = (Vec::new(), 0usize, None::<usize>);
    for (k, &p) in mb.iter().enumerate() {
        if b[from..=p] != n[from..=p] {
            return None;
        }
        if b[p + 1..p + 17] != n[p + 1..p + 17] {
            let skip = k - last.map_or(0, |l| l + 1);
            set.push((skip as u64, n[p + 1..p + 17].try_into().expect("16 bytes")));
            last = Some(k);
        }
        from = p + 17;
    }
    (b[from..] == n[from..]).then_some(set)
}

/// A change of content mode 7 (edit-patch-v2.md §4.5): a GUID marker's new
/// 16 bytes, or the amount a number changes by (never 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    Guid([u8; 16]),
    Number(i64),
}

/// Mode 7's changes: for each, the tokens passed over since the previous
/// changed one (for the first, from the start), and the change.
pub type Drift = Vec<(u64, Change)>;

/// Largest value a number token has, plus one: 19 digits (also mode 8's, §4.8.1).
pub const NUMBER_END: u64 = 10_000_000_000_000_000_000;

/// A token of a GUID form (§4.5.1): a GUID marker at a position, or a
/// number (a valid digit run) from `start` to `end` with its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Token {
    Guid(usize),
    Number { start: usize, end: usize, value: u64 },
}

/// The value of a digit run that is a number: 1 to 19 digits, no leading
/// `0` unless it is the single digit `0`.
pub(crate) fn number_value(run: &[u8]) -> Option<u64> {
    if run.is_empty() || run.len() > 19 || (run.len() > 1 && run[0] == b'0') {
        return None;
    }
    Some(run.iter().fold(0u64, |v, &d| v * 10 + u64::from(d - b'0')))
}

/// The tokens of a GUID form, in order, or `None` when it does not read to
/// its end as one (§4.4.1's grammar).
fn tokens(t: &[u8]) -> Option<Vec<Token>> {
    let (mut out, mut i) = (Vec::new(), 0);
    while i < t.len() {
        match t[i] {
            GUID_UPPER | GUID_LOWER if i + 17 <= t.len() => {
                out.push(Token::Guid(i));
                i += 17;
            }
            ESC if i + 1 < t.len() => i += 2,
            GUID_UPPER..=ESC => return None,
            b'0'..=b'9' => {
                let end = i + t[i..].iter().position(|b| !b.is_ascii_digit()).unwrap_or(t.len() - i);
                if let Some(value) = number_value(&t[i..end]) {
                    out.push(Token::Number { start: i, end, value });
                }
                i = end;
            }
            _ => i += 1,
        }
    }
    Some(out)
}

/// Where a token's bytes start and end.
fn span(k: &Token) -> (usize, usize) {
    match *k {
        Token::Guid(p) => (p, p + 17),
        Token::Number { start, end, .. } => (start, end),
    }
}

/// Mode 7: the GUID form `t` with the changes of `drift` made (§4.5.2).
/// Fails when `t` does not read to its end, has no token where a change
/// names one, has a token of the other kind there, or a number would leave
/// 0 to 10^19 - 1; and when the result would be longer than `max_len`.
pub fn apply_drift(t: &[u8], drift: &[(u64, Change)], max_len: u64) -> Result<Vec<u8>, GuidsError> {
    // Mode 9's walk without learning: every number keeps its value but where a change names it.
    walk(t, drift, None, max_len)
}

/// The mode 7 changes that turn the GUID form `b` into `n`, when both read
/// as GUID forms with the same tokens, of the same kinds, and the same bytes
/// between them (`None` otherwise, or when they are the same).
pub fn changed_tokens(b: &[u8], n: &[u8]) -> Option<Drift> {
    if b == n {
        return None;
    }
    let (tb, tn) = (tokens(b)?, tokens(n)?);
    if tb.len() != tn.len() {
        return None;
    }
    let (mut drift, mut fb, mut fn_, mut last) = (Vec::new(), 0usize, 0usize, None::<usize>);
    for (k, (x, y)) in tb.iter().zip(&tn).enumerate() {
        let ((xs, xe), (ys, ye)) = (span(x), span(y));
        if b[fb..xs] != n[fn_..ys] {
            return None;
        }
        let change = match (*x, *y) {
            (Token::Guid(p), Token::Guid(q)) if b[p] == n[q] => {
                (b[p + 1..xe] != n[q + 1..ye]).then(|| Change::Guid(n[q + 1..ye].try_into().expect("16 bytes")))
            }
            (Token::Number { value: v, .. }, Token::Number { value: w, .. }) => match i64::try_from(i128::from(w) - i128::from(v)) {
                Ok(0) => None,
                Ok(d) => Some(Change::Number(d)),
                Err(_) => return None,
            },
            _ => return None,
        };
        if let Some(c) = change {
            drift.push(((k - last.map_or(0, |l| l + 1)) as u64, c));
            last = Some(k);
        }
        (fb, fn_) = (xe, ye);
    }
    (b[fb..] == n[fn_..] && !drift.is_empty()).then_some(drift)
}

/// Mode 9's learnt values (edit-patch-v2.md §4.9): what the number
/// changes of the patch's mode 9 members so far set each old value to.
pub type Learnt = HashMap<u64, u64>;

/// Most bytes of a number token's key (edit-patch-v2.md §4.11).
pub const KEY_LEN: usize = 8;

/// A number token's key (§4.11): the bytes between the token before it and
/// its first digit, the last [`KEY_LEN`] of them, and how many there are.
pub type Key = ([u8; KEY_LEN], u8);

/// The key of the token spanning `start..` in `t`, whose token before it
/// ends at `after` (0 for the first).
fn key_at(t: &[u8], after: usize, start: usize) -> Key {
    let bytes = &t[after.max(start.saturating_sub(KEY_LEN))..start];
    let mut key = [0u8; KEY_LEN];
    key[..bytes.len()].copy_from_slice(bytes);
    (key, bytes.len() as u8)
}

/// What the patch's mode 9 and 10 members have learnt so far (§4.9.1):
/// the learnt values, and with flag bit 5 (LEARNT_AMOUNTS) the learnt
/// amounts by key (§4.11).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Learning {
    pub values: Learnt,
    /// `None` without flag bit 5: no amounts, and a value set back to itself is forgotten.
    pub amounts: Option<HashMap<Key, i128>>,
}

impl Learning {
    /// Nothing learnt yet; `amounts`: flag bit 5.
    pub fn new(amounts: bool) -> Self {
        Learning { values: Learnt::new(), amounts: amounts.then(HashMap::new) }
    }

    /// The value a number token of value `v` and key `key` takes before any
    /// change of its own, and whether it is predicted (§4.11; without
    /// amounts, whether the learnt values hold `v`).
    fn predict(&self, v: u64, key: impl FnOnce() -> Key) -> (u64, bool) {
        if let Some(&m) = self.values.get(&v) {
            return (m, true);
        }
        match self.amounts.as_ref().and_then(|a| a.get(&key()).copied()) {
            Some(d) => {
                let m = i128::from(v) + d;
                // An amount that would take the number out of 0 to 10^19 - 1 leaves it as it is.
                (if (0..i128::from(NUMBER_END)).contains(&m) { m as u64 } else { v }, true)
            }
            None => (v, false),
        }
    }

    /// What a change that set a token of value `v` (key `key`, `predicted`
    /// as [`Learning::predict`] said) to `w` teaches (§4.9.1, §4.11); with
    /// `undo`, what it replaced is noted there.
    fn teach(&mut self, v: u64, w: u64, key: impl FnOnce() -> Key, predicted: bool, undo: Option<&mut Undo>) {
        let before = match self.amounts.is_none() && v == w {
            true => self.values.remove(&v),
            false => self.values.insert(v, w),
        };
        let taught = match &mut self.amounts {
            Some(amounts) if !predicted => {
                let key = key();
                Some((key, amounts.insert(key, i128::from(w) - i128::from(v))))
            }
            _ => None,
        };
        if let Some(undo) = undo {
            undo.values.push((v, before));
            undo.amounts.extend(taught);
        }
    }

    /// Takes back what [`learning_drift`] taught (`undo`, the last thing
    /// taught first).
    pub fn undo(&mut self, undo: Undo) {
        if let Some(amounts) = &mut self.amounts {
            for (key, before) in undo.amounts.into_iter().rev() {
                match before {
                    Some(d) => amounts.insert(key, d),
                    None => amounts.remove(&key),
                };
            }
        }
        for (v, before) in undo.values.into_iter().rev() {
            match before {
                Some(w) => self.values.insert(v, w),
                None => self.values.remove(&v),
            };
        }
    }
}

/// What [`learning_drift`] replaced in a [`Learning`], to take it back
/// ([`Learning::undo`]) when the member is not written in mode 9 or 10
/// after all.
#[derive(Debug, Default)]
pub struct Undo {
    values: Vec<(u64, Option<u64>)>,
    amounts: Vec<(Key, Option<i128>)>,
}

/// Mode 9: the GUID form `t` with its number tokens, in order, set to the
/// value the patch has learnt for theirs and changed by `drift`'s changes;
/// each changed number's old and new values are learnt at once, for the
/// tokens after it too (§4.9.1). Fails as [`apply_drift`] does.
pub fn apply_learning(t: &[u8], drift: &[(u64, Change)], learnt: &mut Learning, max_len: u64) -> Result<Vec<u8>, GuidsError> {
    walk(t, drift, Some(learnt), max_len)
}

/// The token walk of modes 7, 9 and 10: with `learnt`, mode 9's and 10's (numbers take
/// their learnt values, and changes teach); without, mode 7's.
fn walk(t: &[u8], drift: &[(u64, Change)], mut learnt: Option<&mut Learning>, max_len: u64) -> Result<Vec<u8>, GuidsError> {
    let tokens = tokens(t).ok_or(GuidsError::Invalid(0, "the base's GUID form does not read to its end"))?;
    let mut out = Vec::with_capacity(t.len() + 16);
    let mut from = 0usize;
    let mut changes = drift.iter().scan(None::<u64>, |j, (skip, c)| {
        *j = next_index(*j, *skip);
        Some(j.map(|k| (k, *c)))
    });
    let mut next = changes.next();
    // Where the token before ends (a number's key starts there, §4.11).
    let mut after = 0usize;
    for (k, token) in tokens.iter().enumerate() {
        let previous_end = std::mem::replace(&mut after, span(token).1);
        let change = match next {
            Some(Some((j, c))) if j == k as u64 => {
                next = changes.next();
                Some(c)
            }
            Some(None) => return Err(GuidsError::Invalid(0, "a change past the base's last token")),
            _ => None,
        };
        let (start, end) = span(token);
        let digits = match (*token, change) {
            (Token::Guid(_), None) => continue,
            (Token::Guid(p), Some(Change::Guid(bytes))) => {
                out.extend_from_slice(&t[from..start]);
                out.push(t[p]);
                out.extend_from_slice(&bytes);
                from = end;
                None
            }
            (Token::Number { value, .. }, change) => {
                let key = || key_at(t, previous_end, start);
                let (m, predicted) = match learnt.as_deref() {
                    Some(l) => l.predict(value, key),
                    None => (value, false),
                };
                let v = match change {
                    Some(Change::Number(d)) => i128::from(m) + i128::from(d),
                    Some(Change::Guid(_)) => return Err(GuidsError::Invalid(start, "a GUID change names a number")),
                    None => i128::from(m),
                };
                if v < 0 || v >= i128::from(NUMBER_END) {
                    return Err(GuidsError::Invalid(start, "a number changed to below 0 or past 19 digits"));
                }
                if let (Some(l), Some(_)) = (learnt.as_deref_mut(), change) {
                    l.teach(value, v as u64, key, predicted, None);
                }
                (v as u64 != value).then_some(v as u64)
            }
            (Token::Guid(_), Some(Change::Number(_))) => return Err(GuidsError::Invalid(start, "a number change names a GUID")),
        };
        if let Some(v) = digits {
            out.extend_from_slice(&t[from..start]);
            out.extend_from_slice(v.to_string().as_bytes());
            from = end;
        }
        if out.len() as u64 > max_len {
            return Err(GuidsError::TooLong);
        }
    }
    if next.is_some() {
        return Err(GuidsError::Invalid(0, "a change past the base's last token"));
    }
    out.extend_from_slice(&t[from..]);
    if out.len() as u64 > max_len {
        return Err(GuidsError::TooLong);
    }
    Ok(out)
}

/// A number token of two GUID forms paired: its index among all the
/// tokens, its value in the base's form and in the new one's.
pub type NumberPair = (u64, u64, u64);

/// The number tokens of two GUID forms that [`changed_tokens`] paired
/// (the caller has its changes), as [`paired_tokens`] gives them. `None`
/// when they do not read with as many tokens, of the same kinds.
pub fn number_pairs(b: &[u8], n: &[u8]) -> Option<Vec<NumberPair>> {
    paired_tokens(b, n).map(|(_, numbers)| numbers)
}

/// The tokens of two GUID forms paired in order, whatever else differs
/// between them (mode 10, edit-patch-v2.md §4.10): the GUID tokens whose
/// payloads differ as mode 7 changes, and every pair of number tokens (its
/// index, its value in `b` and in `n`). `None` when the forms do not read with as many tokens, of the same kinds
/// token by token.
pub fn paired_tokens(b: &[u8], n: &[u8]) -> Option<(Drift, Vec<NumberPair>)> {
    let (tb, tn) = (tokens(b)?, tokens(n)?);
    if tb.len() != tn.len() {
        return None;
    }
    let (mut guids, mut numbers, mut last) = (Drift::new(), Vec::new(), None::<usize>);
    for (k, pair) in tb.iter().zip(&tn).enumerate() {
        match (*pair.0, *pair.1) {
            (Token::Guid(p), Token::Guid(q)) => {
                if b[p + 1..p + 17] != n[q + 1..q + 17] {
                    guids.push(((k - last.map_or(0, |l| l + 1)) as u64, Change::Guid(n[q + 1..q + 17].try_into().expect("16 bytes"))));
                    last = Some(k);
                }
            }
            (Token::Number { value: v, .. }, Token::Number { value: w, .. }) => numbers.push((k as u64, v, w)),
            _ => return None,
        }
    }
    Some((guids, numbers))
}

/// The keys of the number tokens of the GUID form `b` (§4.11), in token
/// order, as [`paired_tokens`] lists the numbers; `None` when `b` does not
/// read to its end.
pub fn number_keys(b: &[u8]) -> Option<Vec<Key>> {
    let mut after = 0usize;
    let mut keys = Vec::new();
    for token in tokens(b)? {
        let (start, end) = span(&token);
        if let Token::Number { .. } = token {
            keys.push(key_at(b, after, start));
        }
        after = end;
    }
    Some(keys)
}

/// Mode 9's changes: those of the mode 7 `drift` with the numbers that the
/// learnt values (and amounts, §4.11) set to their new values left out, and
/// the others changed from their learnt value; `learning` is left as a
/// decoder leaves it after the member (its changes teach, in token order,
/// for the tokens after them too, §4.9.1), and what it replaced is
/// returned to take it back. `numbers` are the member's number tokens
/// ([`number_pairs`]) and `keys` their keys ([`number_keys`]; read only
/// with amounts). `None`, `learning` as it was, when an amount would not
/// fit an i64.
pub fn learning_drift(drift: &[(u64, Change)], numbers: &[NumberPair], keys: &[Key], learning: &mut Learning) -> Option<(Drift, Undo)> {
    let mut at = Vec::with_capacity(drift.len());
    let mut j: Option<u64> = None;
    for (skip, change) in drift {
        let k = next_index(j, *skip).expect("a drift's token indices fit u64");
        if let Change::Guid(_) = change {
            at.push((k, *change));
        }
        j = Some(k);
    }
    debug_assert!(learning.amounts.is_none() || keys.len() == numbers.len(), "a key for each number token");
    let key = |i: usize| move || keys.get(i).copied().unwrap_or(([0; KEY_LEN], 0));
    let mut undo = Undo::default();
    for (i, &(k, v, w)) in numbers.iter().enumerate() {
        let (m, predicted) = learning.predict(v, key(i));
        if m != w {
            let Ok(d) = i64::try_from(i128::from(w) - i128::from(m)) else {
                learning.undo(undo);
                return None;
            };
            at.push((k, Change::Number(d)));
            learning.teach(v, w, key(i), predicted, Some(&mut undo));
        }
    }
    at.sort_by_key(|&(k, _)| k);
    let mut last = None::<u64>;
    let changes = at
        .into_iter()
        .map(|(k, c)| {
            let skip = k - last.map_or(0, |l| l + 1);
            last = Some(k);
            (skip, c)
        })
        .collect();
    Some((changes, undo))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_guid_is_its_marker_and_sixteen_bytes() {
        let x = b"<a:fld id=\"{5C2A8F1E-0B3D-4E6F-9A1B-2C3D4E5F6A7B}\" type=\"slidenum\">";
        let g = forward(x);
        let want = [
            &b"<a:fld id=\""[..],
            &[GUID_UPPER, 0x5C, 0x2A, 0x8F, 0x1E, 0x0B, 0x3D, 0x4E, 0x6F, 0x9A, 0x1B, 0x2C, 0x3D, 0x4E, 0x5F, 0x6A, 0x7B],
            b"\" type=\"slidenum\">",
        ]
        .concat();
        assert_eq!(g, want);
        assert_eq!(inverse(&g, u64::MAX).unwrap(), x);
        let lower = b"{5c2a8f1e-0b3d-4e6f-9a1b-2c3d4e5f6a7b}";
        assert_eq!(forward(lower)[0], GUID_LOWER);
        assert_eq!(inverse(&forward(lower), u64::MAX).unwrap(), lower);
        // Mixed case, a dash out of place, no closing brace: left as they are.
        for x in [
            &b"{5C2A8F1E-0B3D-4E6F-9A1B-2C3D4E5f6A7B}"[..],
            b"{5C2A8F1E0-B3D-4E6F-9A1B-2C3D4E5F6A7B}",
            b"{5C2A8F1E-0B3D-4E6F-9A1B-2C3D4E5F6A7B",
        ] {
            assert_eq!(forward(x), x);
        }
        // Digits only: uppercase.
        assert_eq!(forward(b"{01234567-0123-0123-0123-012345678901}")[0], GUID_UPPER);
    }

    #[test]
    fn a_guid_set_names_the_changed_markers() {
        let g = |k: u8| format!("{{{:02X}000000-0000-0000-0000-000000000000}}", k);
        let text = |a: u8, b: u8, c: u8| format!("x{}\u{3}y{}\u{1}z{}", g(a), g(b), g(c)).into_bytes();
        let (b, n) = (forward(&text(1, 2, 3)), forward(&text(1, 9, 7)));
        let set = changed_payloads(&b, &n).unwrap();
        assert_eq!(set.iter().map(|s| (s.0, s.1[0])).collect::<Vec<_>>(), [(1, 9), (0, 7)]);
        let mut t = b.clone();
        replace(&mut t, &set).unwrap();
        assert_eq!(t, n);
        assert_eq!(changed_payloads(&b, &b), None);
        assert_eq!(changed_payloads(&b, &forward(&text(1, 2, 3)[1..])), None);
        let mut other = n.clone();
        other[0] = b'w';
        assert_eq!(changed_payloads(&b, &other), None, "a change outside the payloads");
        let mut t = b.clone();
        assert!(replace(&mut t, &[(3, [0; 16])]).is_err());
        assert!(replace(&mut t, &[(2, [0; 16]), (0, [0; 16])]).is_err());
        assert!(replace(&mut t, &[(0, [0; 16]), (u64::MAX, [0; 16])]).is_err());
        assert!(replace(&mut [GUID_UPPER, 1, 2], &[(0, [0; 16])]).is_err());
    }

    #[test]
    fn markers_are_escaped_and_bad_forms_refused() {
        let x = [1u8, 2, 3, b'{', 3, b'{'];
        assert_eq!(forward(&x), [ESC, 1, ESC, 2, ESC, 3, b'{', ESC, 3, b'{']);
        assert_eq!(inverse(&forward(&x), u64::MAX).unwrap(), x);
        assert!(matches!(inverse(&[ESC, b'a'], u64::MAX), Err(GuidsError::Invalid(0, _))));
        assert!(matches!(inverse(&[b'x', ESC], u64::MAX), Err(GuidsError::Invalid(1, _))));
        assert!(matches!(inverse(&[GUID_UPPER; 16], u64::MAX), Err(GuidsError::Invalid(0, _))));
        assert_eq!(inverse(&[GUID_LOWER; 17], u64::MAX).unwrap(), b"{02020202-0202-0202-0202-020202020202}");
        assert_eq!(inverse(&[GUID_UPPER; 17], 37), Err(GuidsError::TooLong));
        assert_eq!(inverse(&[GUID_UPPER; 17], 38).unwrap().len(), 38);
        assert_eq!(inverse(&[b'x'; 100], 99), Err(GuidsError::TooLong));
    }

    #[test]
    fn learnt_values_set_every_number_of_theirs_and_the_changes_teach_them() {
        let g = |k: u8| format!("{{{:02X}000000-0000-0000-0000-000000000000}}", k);
        let text = |a: u8, x: u64, cx: u64, cy: u64| {
            format!("<a:fld id=\"{}\"/><a:off x=\"{x}\"/><a:ext cx=\"{cx}\" cy=\"{cy}\"/> 007", g(a)).into_bytes()
        };
        // The first member: nothing learnt. Its first change teaches 9070920 -> 9070560 at
        // once, so the second 9070920 takes the learnt value with no change of its own.
        let (b, n) = (forward(&text(1, 9070920, 9070920, 934920)), forward(&text(2, 9070560, 9070560, 934920)));
        let drift = changed_tokens(&b, &n).unwrap();
        let numbers = number_pairs(&b, &n).unwrap();
        assert_eq!(numbers, [(1, 9070920, 9070560), (2, 9070920, 9070560), (3, 934920, 934920)]);
        let mut learnt = Learning::new(false);
        let mut after = learnt.clone();
        let first = learning_drift(&drift, &numbers, &[], &mut after).unwrap().0;
        assert_eq!(first, [drift[0], drift[1]]);
        assert_eq!(after.values, Learnt::from([(9070920, 9070560)]));
        assert_eq!(apply_learning(&b, &first, &mut learnt, u64::MAX).unwrap(), n);
        assert_eq!(learnt, after);
        // Mode 7 learns nothing: the same changes leave the second 9070920 as it was.
        assert_eq!(apply_drift(&b, &first, u64::MAX).unwrap(), forward(&text(2, 9070560, 9070920, 934920)));
        // A second member like it: no change left but its GUID, and nothing taught.
        let mut want_guid = [0u8; 16];
        want_guid[0] = 2;
        let mut after = learnt.clone();
        let second = learning_drift(&drift, &numbers, &[], &mut after).unwrap().0;
        assert_eq!((&second[..], &after), (&[(0, Change::Guid(want_guid))][..], &learnt));
        assert_eq!(apply_learning(&b, &second, &mut learnt, u64::MAX).unwrap(), n);
        // A member where the first 9070920 stays: changed back, and forgotten at once, so
        // the second takes the learnt value no more and is changed again, which teaches it.
        let n3 = forward(&text(1, 9070920, 9070560, 934920));
        let mut after = learnt.clone();
        let third = learning_drift(&changed_tokens(&b, &n3).unwrap(), &number_pairs(&b, &n3).unwrap(), &[], &mut after).unwrap().0;
        assert_eq!(third, [(1, Change::Number(360)), (0, Change::Number(-360))]);
        assert_eq!(apply_learning(&b, &third, &mut learnt, u64::MAX).unwrap(), n3);
        assert_eq!((&learnt, &learnt.values), (&after, &Learnt::from([(9070920, 9070560)])));
        // One where neither stays: forgotten at the first, and nothing taught again.
        let n4 = forward(&text(1, 9070920, 9070920, 934920));
        let mut after = learnt.clone();
        let fourth = learning_drift(&[], &number_pairs(&b, &n4).unwrap(), &[], &mut after).unwrap().0;
        assert_eq!(&fourth[..], &[(1, Change::Number(360))][..]);
        assert_eq!(apply_learning(&b, &fourth, &mut learnt, u64::MAX).unwrap(), n4);
        assert_eq!(learnt, after);
        assert!(learnt.values.is_empty());
        // Learnt values keep the other bytes ("007" is no number), grow a number by digits, and are bounded.
        let values = |v: Learnt| Learning { values: v, amounts: None };
        let mut seven = values(Learnt::from([(7, 1000)]));
        assert_eq!(apply_learning(b"7 007 7", &[], &mut seven, u64::MAX).unwrap(), b"1000 007 1000");
        assert_eq!(apply_learning(b"7 007 7", &[], &mut seven, 12), Err(GuidsError::TooLong));
        // Refused: past the last token, the other kind, out of range, not a GUID form.
        assert!(apply_learning(b"7 007 7", &[(2, Change::Number(1))], &mut seven, u64::MAX).is_err());
        assert!(apply_learning(&b, &[(1, Change::Guid([0; 16]))], &mut Learning::default(), u64::MAX).is_err());
        assert!(apply_learning(&b, &[(0, Change::Number(1))], &mut Learning::default(), u64::MAX).is_err());
        assert!(apply_learning(b"7", &[(0, Change::Number(-8))], &mut Learning::default(), u64::MAX).is_err());
        assert!(apply_learning(&[GUID_UPPER, 1], &[], &mut Learning::default(), u64::MAX).is_err());
        // An amount that would not fit an i64 leaves the member to mode 7.
        let mut far = values(Learnt::from([(1, 9_999_999_999_999_999_999), (3, 4)]));
        let before = far.clone();
        assert!(learning_drift(&[(0, Change::Number(1))], &[(0, 3, 5), (1, 1, 2)], &[], &mut far).is_none());
        assert_eq!(far, before, "what the member taught before the amount that did not fit is taken back");
    }

    #[test]
    fn learnt_amounts_move_the_numbers_after_the_same_bytes_and_hold_a_number_that_did_not_move() {
        let ext = |sizes: &[(u64, u64)]| {
            let shapes: String = sizes.iter().map(|(cx, cy)| format!("<a:ext cx=\"{cx}\" cy=\"{cy}\"/>")).collect();
            forward(format!("<a:off x=\"0\" y=\"0\"/>{shapes}<a:path w=\"5\"/>").as_bytes())
        };
        let key = |k: &[u8]| {
            let mut key = [0u8; KEY_LEN];
            key[..k.len()].copy_from_slice(k);
            (key, k.len() as u8)
        };
        // The keys: the bytes since the token before, the last eight.
        let (b1, n1) = (ext(&[(8607240, 1261800)]), ext(&[(8606880, 1261440)]));
        let keys = number_keys(&b1).unwrap();
        assert_eq!(keys, [key(b":off x=\""), key(b"\" y=\""), key(b"ext cx=\""), key(b"\" cy=\""), key(b"path w=\"")]);
        // A key ends at the token before it, a GUID's marker and 16 bytes included.
        let after_guid = forward(b"{5C2A8F1E-0B3D-4E6F-9A1B-2C3D4E5F6A7B} w=\"5\"");
        assert_eq!(number_keys(&after_guid).unwrap(), [key(b" w=\"")]);
        // The first shape teaches its values and, for the bytes before them, its amounts;
        // taken back, it leaves nothing.
        let mut learnt = Learning::new(true);
        let mut tried = learnt.clone();
        let (_, undo) = learning_drift(&[], &number_pairs(&b1, &n1).unwrap(), &keys, &mut tried).unwrap();
        assert_eq!(tried.amounts.as_ref().map(HashMap::len), Some(2));
        tried.undo(undo);
        assert_eq!(tried, learnt);
        let mut after = learnt.clone();
        let first = learning_drift(&[], &number_pairs(&b1, &n1).unwrap(), &keys, &mut after).unwrap().0;
        assert_eq!(first, [(2, Change::Number(-360)), (0, Change::Number(-360))]);
        assert_eq!(apply_learning(&b1, &first, &mut learnt, u64::MAX).unwrap(), n1);
        assert_eq!(learnt, after);
        assert_eq!(learnt.amounts, Some(HashMap::from([(key(b"ext cx=\""), -360), (key(b"\" cy=\""), -360)])));
        // A later member's shapes of their own sizes shrink with no change; a height of 0
        // stays (-360 would take it below 0); a width that kept its size (360, which the
        // amount would take to 0) is changed back once, and the learnt values hold it.
        let b2 = ext(&[(5713920, 0), (360, 3808800), (360, 3808800)]);
        let n2 = ext(&[(5713560, 0), (360, 3808440), (360, 3808440)]);
        let (numbers, keys) = (number_pairs(&b2, &n2).unwrap(), number_keys(&b2).unwrap());
        // What a member taught can be taken back (the encoder's, when it writes the member otherwise).
        let mut tried = learnt.clone();
        let (_, undo) = learning_drift(&[], &numbers, &keys, &mut tried).unwrap();
        assert_ne!(tried, learnt);
        tried.undo(undo);
        assert_eq!(tried, learnt);
        let mut after = learnt.clone();
        let second = learning_drift(&[], &numbers, &keys, &mut after).unwrap().0;
        assert_eq!(second, [(4, Change::Number(360))]);
        assert_eq!(apply_learning(&b2, &second, &mut learnt, u64::MAX).unwrap(), n2);
        assert_eq!((&learnt, learnt.values.get(&360)), (&after, Some(&360)));
        // The amounts of a changed token that was predicted stay as they were.
        assert_eq!(learnt.amounts.as_ref().unwrap().len(), 2);
        // Without amounts the same member pays for each size of its own (taught at once).
        let mut values_only = Learning { values: learnt.values.clone(), amounts: None };
        values_only.values.remove(&360);
        assert_eq!(learning_drift(&[], &numbers, &keys, &mut values_only).unwrap().0.len(), 2);
        // A change on a number the amount would take below 0 (predicted, and left as it
        // was) teaches its value only, not an amount for its key.
        let (b3, n3) = (ext(&[(5713920, 0)]), ext(&[(5713560, 5)]));
        let mut after = learnt.clone();
        let third = learning_drift(&[], &number_pairs(&b3, &n3).unwrap(), &number_keys(&b3).unwrap(), &mut after).unwrap().0;
        assert_eq!(third, [(3, Change::Number(5))]);
        assert_eq!(apply_learning(&b3, &third, &mut learnt, u64::MAX).unwrap(), n3);
        assert_eq!((&learnt, learnt.values.get(&0)), (&after, Some(&5)));
        assert_eq!(learnt.amounts.as_ref().unwrap()[&key(b"\" cy=\"")], -360);
        // The walk with no amounts learnt moves nothing, and refuses what it refuses without.
        assert_eq!(apply_learning(&b2, &[], &mut Learning::new(true), u64::MAX).unwrap(), b2);
        assert!(apply_learning(&b2, &[(3, Change::Number(-1))], &mut Learning::new(true), u64::MAX).is_err());
    }

    #[test]
    fn a_drift_names_the_changed_guids_and_numbers() {
        let g = |k: u8| format!("{{{:02X}000000-0000-0000-0000-000000000000}}", k);
        let text = |a: u8, cx: u64, cy: u64| format!("<a:fld id=\"{}\"/><a:ext cx=\"{cx}\" cy=\"{cy}\"/> 007 x", g(a)).into_bytes();
        let (b, n) = (forward(&text(1, 9070920, 934920)), forward(&text(2, 9070560, 934920)));
        let drift = changed_tokens(&b, &n).unwrap();
        let mut want_guid = [0u8; 16];
        want_guid[0] = 2;
        assert_eq!(drift, [(0, Change::Guid(want_guid)), (0, Change::Number(-360))]);
        assert_eq!(apply_drift(&b, &drift, u64::MAX).unwrap(), n);
        // A number that gains a digit; the run "007" is not a number and
        // `a:` has none: three tokens (GUID, cx, cy).
        let n2 = forward(&text(1, 9070920, 1_000_000));
        let drift = changed_tokens(&b, &n2).unwrap();
        assert_eq!(drift, [(2, Change::Number(65080))]);
        assert_eq!(apply_drift(&b, &drift, u64::MAX).unwrap(), n2);
        // Not a drift: the same, other bytes between tokens, "007" changed.
        assert_eq!(changed_tokens(&b, &b), None);
        assert_eq!(changed_tokens(&b, &forward(&text(1, 9070920, 934920)[1..])), None);
        assert_eq!(
            changed_tokens(&b, &forward(&String::from_utf8(text(1, 9070920, 934920)).unwrap().replace("007", "008").into_bytes())),
            None
        );
        // Refused: past the last token, a kind that is not there, out of range, too long.
        assert!(apply_drift(&b, &[(3, Change::Number(1))], u64::MAX).is_err());
        assert!(apply_drift(&b, &[(0, Change::Number(1))], u64::MAX).is_err());
        assert!(apply_drift(&b, &[(1, Change::Guid([0; 16]))], u64::MAX).is_err());
        assert!(apply_drift(&b, &[(1, Change::Number(-9070921))], u64::MAX).is_err());
        // The largest amount still leaves the number under 10^19 digits here.
        assert!(apply_drift(&b, &[(1, Change::Number(i64::MAX))], u64::MAX).is_ok());
        assert_eq!(apply_drift(&b, &[(1, Change::Number(1))], b.len() as u64 - 1), Err(GuidsError::TooLong));
        assert!(apply_drift(&[GUID_UPPER, 1], &[(0, Change::Number(1))], u64::MAX).is_err());
        // The largest number: 19 nines; 20 digits are no number.
        let nines = b"9999999999999999999 99999999999999999999".to_vec();
        assert!(apply_drift(&nines, &[(0, Change::Number(1))], u64::MAX).is_err());
        assert_eq!(apply_drift(&nines, &[(0, Change::Number(-9))], u64::MAX).unwrap(), b"9999999999999999990 99999999999999999999");
        assert!(apply_drift(&nines, &[(1, Change::Number(-1))], u64::MAX).is_err());
    }
}
