//! Renumbered names (content mode 8, edit-patch-v2.md §4.8).
//!
//! Some producers number their own names anew on every save: LibreOffice's
//! .ods calls a cell's automatic style `ce38` and numbers those styles
//! afresh each time, so a save with no edit swaps `ce38` and `ce28` (and
//! fifty more) in thousands of places of `content.xml`. A content delta pays
//! for every place; what changed is one renumbering of the member. Mode 8 sends
//! the renumbering once, as a map from old numbers to new ones for each
//! **name** (the letters right before the digits), applies it to the base
//! content, and codes whatever else changed with the ordinary content delta.
//!
//! - A **named number** is a valid digit run (1 to 19 digits, no leading
//!   `0` unless it is `0` itself) right after 1 to [`MAX_NAME`] ASCII
//!   letters that no letter precedes: `ce38` is the name `ce` and 38.
//! - *N*(*X*, map) replaces the digits of each named number whose name and
//!   value the map holds by the new value's digits; every other byte stays.
//!
//! There is no inverse: the delta codes the new content against *N*(*X*),
//! and the target's hash checks the result.

/// Longest name, in letters.
pub const MAX_NAME: usize = 16;

use crate::guids::number_value;
/// Largest value a named number has, plus one: 19 digits, as a number
/// token of mode 7 (the same valid runs, v1 §4.2.5).
pub use crate::guids::NUMBER_END;

/// A renumbering: for each name (in increasing byte order), its pairs of old
/// and new numbers (old numbers in increasing order, each once, never
/// paired with themselves).
pub type Renumbering = Vec<(Vec<u8>, Vec<(u64, u64)>)>;

/// A named number of a content: where its digits are, its name and its value.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Named<'a> {
    pub name: &'a [u8],
    pub start: usize,
    pub end: usize,
    pub value: u64,
}

/// The named numbers of `x`, in order (§4.8.1).
pub fn named_numbers(x: &[u8]) -> impl Iterator<Item = Named<'_>> {
    let mut i = 0usize;
    std::iter::from_fn(move || {
        while i < x.len() {
            // The next digit right after a letter.
            let d = i + x[i..].windows(2).position(|w| w[0].is_ascii_alphabetic() && w[1].is_ascii_digit())? + 1;
            let end = d + x[d..].iter().position(|b| !b.is_ascii_digit()).unwrap_or(x.len() - d);
            let letters = x[..d].iter().rev().take_while(|b| b.is_ascii_alphabetic()).count();
            i = end;
            if letters > MAX_NAME {
                continue;
            }
            if let Some(value) = number_value(&x[d..end]) {
                return Some(Named { name: &x[d - letters..d], start: d, end, value });
            }
        }
        None
    })
}

/// *N*(`x`, `map`): `x` with each named number that `map` renumbers written
/// with its new number (§4.8.2). `None` as soon as the result would be
/// longer than `max_len`.
pub fn renumber(x: &[u8], map: &Renumbering, max_len: u64) -> Option<Vec<u8>> {
    let find = |name: &[u8], v: u64| -> Option<u64> {
        let (_, pairs) = &map[map.binary_search_by(|(n, _)| n.as_slice().cmp(name)).ok()?];
        pairs.binary_search_by_key(&v, |&(f, _)| f).ok().map(|k| pairs[k].1)
    };
    let mut out = Vec::with_capacity(x.len() + 64);
    let mut from = 0usize;
    for n in named_numbers(x) {
        let Some(to) = find(n.name, n.value) else { continue };
        out.extend_from_slice(&x[from..n.start]);
        out.extend_from_slice(to.to_string().as_bytes());
        from = n.end;
        if out.len() as u64 > max_len {
            return None;
        }
    }
    out.extend_from_slice(&x[from..]);
    (out.len() as u64 <= max_len).then_some(out)
}

/// The renumbering that turns the named numbers of `base` into those of
/// `new`, name by name, where one shows (§4.8.2's encoder paragraph): a name
/// both hold equally often is paired in order, the *i*-th number of the
/// base with the *i*-th of the new; an old number goes to the new number
/// most of its pairs have (more than half: the definitions of styles
/// written in the order of their new numbers pair wrongly, their uses
/// rightly), and numbers that stay or have no such majority are left out.
/// Empty when no name has a number that moves. At most `most_pairs` pairs
/// in all (names past it are left out).
pub fn find(base: &[u8], new: &[u8], most_pairs: u64) -> Renumbering {
    use std::collections::{BTreeMap, HashMap};
    fn values(x: &[u8]) -> HashMap<&[u8], Vec<u64>> {
        let mut m: HashMap<&[u8], Vec<u64>> = HashMap::new();
        for n in named_numbers(x) {
            m.entry(n.name).or_default().push(n.value);
        }
        m
    }
    let (vb, vn) = (values(base), values(new));
    let mut names: Vec<&[u8]> = vb.keys().copied().filter(|k| vn.get(k).is_some_and(|v| v.len() == vb[k].len())).collect();
    names.sort_unstable();
    let (mut out, mut pairs_left) = (Renumbering::new(), most_pairs);
    for name in names {
        // For each old number: how often it went to each new one.
        let mut went: BTreeMap<u64, HashMap<u64, u64>> = BTreeMap::new();
        for (&f, &t) in vb[name].iter().zip(&vn[name]) {
            *went.entry(f).or_default().entry(t).or_default() += 1;
        }
        let pairs: Vec<(u64, u64)> = went
            .into_iter()
            .filter_map(|(f, tos)| {
                let all: u64 = tos.values().sum();
                let (&t, &most) = tos.iter().max_by_key(|&(t, n)| (n, std::cmp::Reverse(*t)))?;
                (t != f && most * 2 > all).then_some((f, t))
            })
            .collect();
        if pairs.is_empty() || pairs.len() as u64 > pairs_left {
            continue;
        }
        pairs_left -= pairs.len() as u64;
        out.push((name.to_vec(), pairs));
    }
    out
}

/// Number of pairs of a renumbering.
pub fn pair_count(map: &Renumbering) -> u64 {
    map.iter().map(|(_, p)| p.len() as u64).sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(x: &[u8]) -> Vec<(String, u64)> {
        named_numbers(x).map(|n| (String::from_utf8(n.name.to_vec()).unwrap(), n.value)).collect()
    }

    #[test]
    fn a_named_number_is_letters_then_a_valid_run() {
        let x = b"<c s=\"ce38\" r=\"ro2\"/>=[.A1]+B12 9 ce038 x0 abcdefghijklmnopq7 abcdefghijklmnop8 _7 ce12345678901234567890 Ab3c4";
        assert_eq!(
            names(x),
            [("ce", 38), ("ro", 2), ("A", 1), ("B", 12), ("x", 0), ("abcdefghijklmnop", 8), ("Ab", 3), ("c", 4)]
                .map(|(n, v)| (n.to_string(), v))
        );
        assert_eq!(names(b"7ce"), []);
        assert_eq!(names(b"a1"), [("a".to_string(), 1)]);
        assert_eq!(names(b""), []);
    }

    #[test]
    fn a_renumbering_swaps_numbers_of_its_names_only() {
        let base = b"<s n=\"ce38\"/><s n=\"ce28\"/><c s=\"ce38\">38</c><c s=\"ce28\" f=\"A38\"/><c s=\"ce7\"/>";
        let new = b"<s n=\"ce28\"/><s n=\"ce38\"/><c s=\"ce28\">38</c><c s=\"ce38\" f=\"A38\"/><c s=\"ce7\"/>";
        let map = find(base, new, u64::MAX);
        assert_eq!(map, vec![(b"ce".to_vec(), vec![(28, 38), (38, 28)])]);
        assert_eq!(renumber(base, &map, u64::MAX).unwrap(), new);
        // A number that grows and one that shrinks; the limit is on the result.
        let map = vec![(b"ce".to_vec(), vec![(7, 1_000_000), (38, 1)])];
        let out = renumber(base, &map, u64::MAX).unwrap();
        assert!(out.ends_with(b"<c s=\"ce1000000\"/>") && out.starts_with(b"<s n=\"ce1\"/>"));
        assert_eq!(out.len(), base.len() + 4);
        assert_eq!(renumber(base, &map, out.len() as u64 - 1).map(|o| o.len()), None);
        assert_eq!(renumber(base, &map, out.len() as u64).unwrap(), out);
        assert_eq!(renumber(base, &Renumbering::new(), u64::MAX).unwrap(), base);
    }

    #[test]
    fn names_that_do_not_pair_are_left_out() {
        // `ce` as often in both but one old number going two ways, half and
        // half; `P` more often in the new; `T` unchanged; `ro` renumbered.
        let base = b"ce1 ce1 P1 T1 ro1 ro2";
        let new = b"ce2 ce3 P1 P2 T1 ro2 ro1";
        assert_eq!(find(base, new, u64::MAX), vec![(b"ro".to_vec(), vec![(1, 2), (2, 1)])]);
        assert_eq!(pair_count(&find(base, new, u64::MAX)), 2);
        assert_eq!(find(base, new, 1), Renumbering::new(), "past the pairs allowed");
        assert_eq!(find(base, base, u64::MAX), Renumbering::new());
        // Definitions in the order of their new numbers pair wrongly, the
        // uses rightly: each old number goes where most of its pairs go.
        let base = b"def ce1 ce2 ce3 use ce1 ce1 ce2 ce2 ce3 ce3 ce1";
        let new = b"def ce1 ce2 ce3 use ce3 ce3 ce1 ce1 ce2 ce2 ce3";
        assert_eq!(find(base, new, u64::MAX), vec![(b"ce".to_vec(), vec![(1, 3), (2, 1), (3, 2)])]);
    }
}
