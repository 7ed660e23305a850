//! Byte-exact edits of JSON text: replace a few member values and keep
//! every other byte (key order, spacing, raw UTF-8, escapes) as sent.
//!
//! Dropbox procedures must rewrite `cursor.session_id` and `cursor.offset`
//! in the app's `dropbox-api-arg` and `finish_batch_v2` body "with every
//! other field kept" (§6.2, §6.3). Re-serialising a parsed value would
//! change escapes and number spellings and, for a header holding raw
//! UTF-8, the bytes the provider hashes into nothing but may log or
//! compare; so we locate each value's byte span with serde_json's
//! `RawValue` (a borrowed slice of the input) and splice new text in.

use std::ops::Range;

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

/// An object's members in document order, each value as its raw text.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a JSON object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some((k, v)) = map.next_entry::<String, &'de RawValue>()? {
                    out.push((k, v));
                }
                Ok(Members(out))
            }
        }
        d.deserialize_map(V)
    }
}

fn span_in(outer: &str, inner: &str) -> Range<usize> {
    // `inner` is a sub-slice of `outer` (RawValue borrows from the input).
    let start = inner.as_ptr() as usize - outer.as_ptr() as usize;
    start..start + inner.len()
}

/// The members of the JSON object `json`: key and the byte span of its value.
pub(crate) fn members(json: &str) -> Result<Vec<(String, Range<usize>)>, String> {
    let parsed: Members<'_> = serde_json::from_str(json).map_err(|e| format!("not a JSON object: {e}"))?;
    Ok(parsed.0.into_iter().map(|(k, v)| (k, span_in(json, v.get()))).collect())
}

/// The elements of the JSON array `json`, as byte spans.
pub(crate) fn elements(json: &str) -> Result<Vec<Range<usize>>, String> {
    let parsed: Vec<&RawValue> = serde_json::from_str(json).map_err(|e| format!("not a JSON array: {e}"))?;
    Ok(parsed.into_iter().map(|v| span_in(json, v.get())).collect())
}

/// The span of the value of the only member named `key`; an error if the
/// key appears twice (ambiguous: which one would the provider read?).
pub(crate) fn member(json: &str, key: &str) -> Result<Option<Range<usize>>, String> {
    let mut found = None;
    for (k, span) in members(json)? {
        if k == key {
            if found.is_some() {
                return Err(format!("member {key:?} appears twice"));
            }
            found = Some(span);
        }
    }
    Ok(found)
}

/// Applies non-overlapping replacements (spans into `json`).
pub(crate) fn splice(json: &str, mut edits: Vec<(Range<usize>, String)>) -> String {
    edits.sort_by_key(|(r, _)| r.start);
    let mut out = String::with_capacity(json.len() + 32);
    let mut at = 0;
    for (range, text) in edits {
        out.push_str(&json[at..range.start]);
        out.push_str(&text);
        at = range.end;
    }
    out.push_str(&json[at..]);
    out
}

/// The JSON object `json` without its member `key` (if present once), every
/// other byte kept: the member goes with the comma that joins it to its
/// neighbour. An error if the key appears twice or `json` is not an object.
pub(crate) fn remove_member(json: &str, key: &str) -> Result<String, String> {
    let all = members(json)?;
    let hits: Vec<usize> = all.iter().enumerate().filter(|(_, (k, _))| k == key).map(|(i, _)| i).collect();
    let i = match hits.as_slice() {
        [] => return Ok(json.to_owned()),
        [i] => *i,
        _ => return Err(format!("member {key:?} appears twice")),
    };
    let value = &all[i].1;
    let cut = if i > 0 {
        // from the end of the previous value: `, "key": value`
        all[i - 1].1.end..value.end
    } else {
        // the first member: from after `{` up to and including the comma after it
        let open = json.find('{').ok_or("not a JSON object")? + 1;
        let rest = &json[value.end..];
        let comma = rest.find(|c: char| !c.is_ascii_whitespace()).filter(|&n| rest.as_bytes()[n] == b',');
        match comma {
            Some(n) => open..value.end + n + 1,
            None => open..value.end, // the only member
        }
    };
    Ok(splice(json, vec![(cut, String::new())]))
}

/// Offsets a span found inside a sub-slice starting at `base`.
pub(crate) fn shift(r: Range<usize>, base: usize) -> Range<usize> {
    r.start + base..r.end + base
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_exclude_whitespace_and_keep_escapes() {
        let json = r#"{ "a" : "x\u00e9" , "b":[1, 2] }"#;
        let m = members(json).unwrap();
        assert_eq!(m[0].0, "a");
        assert_eq!(&json[m[0].1.clone()], r#""x\u00e9""#);
        assert_eq!(&json[m[1].1.clone()], "[1, 2]");
        let e = elements(&json[m[1].1.clone()]).unwrap();
        assert_eq!(e.len(), 2);
    }

    #[test]
    fn splice_keeps_every_other_byte() {
        let json = "{\"cursor\": {\"session_id\": \"dev-1\", \"offset\": 0}, \"commit\": {\"path\": \"/Ünï.docx\"}}";
        let cursor = member(json, "cursor").unwrap().unwrap();
        let inner = &json[cursor.clone()];
        let sid = shift(member(inner, "session_id").unwrap().unwrap(), cursor.start);
        let off = shift(member(inner, "offset").unwrap().unwrap(), cursor.start);
        let out = splice(json, vec![(off, "12345".into()), (sid, "\"real\"".into())]);
        assert_eq!(out, "{\"cursor\": {\"session_id\": \"real\", \"offset\": 12345}, \"commit\": {\"path\": \"/Ünï.docx\"}}");
    }

    #[test]
    fn remove_member_keeps_every_other_byte() {
        let last = r#"{"cursor": {"session_id": "s", "offset": 3}, "commit": {"path": "/Ü.docx"}, "content_hash": "ab"}"#;
        assert_eq!(
            remove_member(last, "content_hash").unwrap(),
            r#"{"cursor": {"session_id": "s", "offset": 3}, "commit": {"path": "/Ü.docx"}}"#
        );
        let first = r#"{ "content_hash" : "ab" , "cursor": {"offset": 3}}"#;
        assert_eq!(remove_member(first, "content_hash").unwrap(), r#"{ "cursor": {"offset": 3}}"#);
        let middle = r#"{"a":1,"content_hash":"x","b":2}"#;
        assert_eq!(remove_member(middle, "content_hash").unwrap(), r#"{"a":1,"b":2}"#);
        assert_eq!(remove_member(r#"{"content_hash":"x"}"#, "content_hash").unwrap(), "{}");
        // nested members are not touched; absent keys change nothing
        let nested = r#"{"commit":{"content_hash":"x"}}"#;
        assert_eq!(remove_member(nested, "content_hash").unwrap(), nested);
        assert!(remove_member(r#"{"content_hash":1,"content_hash":2}"#, "content_hash").is_err());
        for s in [last, first, middle] {
            let v: serde_json::Value = serde_json::from_str(&remove_member(s, "content_hash").unwrap()).unwrap();
            assert!(v.get("content_hash").is_none());
        }
    }

    #[test]
    fn duplicate_keys_are_refused() {
        assert!(member(r#"{"a":1,"a":2}"#, "a").is_err());
        assert!(members("[1]").is_err());
    }
}
