//! A human- and machine-readable summary of a patch: its kind, sizes, the
//! bytes spent on each section, and per rebuilt member how its content and
//! compressed bytes are made. With the base at hand, member names are shown.

use crate::format::{self, Body, Patch, Segment};
use crate::delta::Middle;
use crate::error::Result;
use crate::limits::Limits;
use serde::Serialize;

/// One rebuilt member.
#[derive(Debug, Clone, Serialize)]
pub struct MemberSummary {
    /// Base member index the delta refers to, if any.
    pub base_entry: Option<u64>,
    /// Its name, when the base was given.
    pub name: Option<String>,
    pub content_len: u64,
    pub kept_prefix: u64,
    pub kept_suffix: u64,
    /// "literal" or "zstd".
    pub middle: &'static str,
    pub middle_bytes: u64,
    /// "stored", "zlib", "preflate" or "raw".
    pub recipe: &'static str,
    pub recipe_bytes: u64,
}

/// Summary of a patch.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub version: u8,
    /// "identity", "zip" or "binary".
    pub kind: &'static str,
    pub patch_bytes: u64,
    pub base_size: u64,
    pub base_sha256: String,
    pub target_size: u64,
    pub target_sha256: String,
    /// Bytes per section: "fixed", "header_stream", "segments", "members", "binary".
    pub sections: std::collections::BTreeMap<&'static str, u64>,
    pub copied_members: u64,
    pub rebuilt_members: Vec<MemberSummary>,
    /// Count of rebuilt members per recipe kind.
    pub recipes: std::collections::BTreeMap<&'static str, u64>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn varint_len(v: u64) -> u64 {
    (64 - v.max(1).leading_zeros() as u64).div_ceil(7)
}

/// Encoded length of a recipe, tag included.
fn recipe_len(r: &format::Recipe) -> u64 {
    use format::Recipe::*;
    1 + match r {
        Stored => 0,
        Zlib(_) => 4,
        ZlibBlocks { block, .. } => 4 + varint_len(*block),
        Preflate(b) | Raw(b) => varint_len(b.len() as u64) + b.len() as u64,
        Png { frame, inner } => varint_len(frame.head_len) + varint_len(frame.tail_len) + varint_len(frame.chunk_size) + 2 + recipe_len(inner),
    }
}

/// Summarises `patch`; `base`, if given, supplies member names.
pub fn inspect(patch: &[u8], base: Option<&[u8]>, limits: &Limits) -> Result<Summary> {
    let p: Patch = format::decode(patch, limits)?;
    let names: Vec<String> = base
        .and_then(|b| crate::zip::scan(b, limits.max_part_size).ok())
        .map(|l| l.entries.iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()).collect())
        .unwrap_or_default();
    let fixed = 4 + 3 + varint_len(p.base_size) + 32 + varint_len(p.target_size) + 32;
    let mut s = Summary {
        version: format::VERSION,
        kind: ["identity", "zip", "binary"][p.body.kind() as usize],
        patch_bytes: patch.len() as u64,
        base_size: p.base_size,
        base_sha256: hex(&p.base_sha256),
        target_size: p.target_size,
        target_sha256: hex(&p.target_sha256),
        sections: [("fixed", fixed)].into_iter().collect(),
        copied_members: 0,
        rebuilt_members: Vec::new(),
        recipes: Default::default(),
    };
    match &p.body {
        Body::Identity => {}
        Body::Binary { .. } => {
            s.sections.insert("binary", patch.len() as u64 - fixed);
        }
        Body::Zip(z) => {
            let header = varint_len(z.base_entries) + varint_len(z.header_len) + varint_len(z.header_frame.len() as u64) + z.header_frame.len() as u64;
            s.sections.insert("header_stream", header);
            let mut member_bytes = 0;
            for seg in &z.segments {
                match seg {
                    Segment::CopyData { .. } => s.copied_members += 1,
                    Segment::EntryRun { count, .. } => s.copied_members += count,
                    Segment::Member(m) => {
                        let (middle, middle_bytes) = match &m.delta.middle {
                            Middle::Literal(b) => ("literal", b.len() as u64),
                            Middle::ZstdRef(b) => ("zstd", b.len() as u64),
                        };
                        let recipe_bytes = recipe_len(&m.recipe);
                        member_bytes += middle_bytes + recipe_bytes;
                        *s.recipes.entry(m.recipe.name()).or_default() += 1;
                        s.rebuilt_members.push(MemberSummary {
                            base_entry: m.base.map(|b| b.0),
                            name: m.base.and_then(|b| names.get(b.0 as usize).cloned()),
                            content_len: m.content_len,
                            kept_prefix: m.delta.prefix,
                            kept_suffix: m.delta.suffix,
                            middle,
                            middle_bytes,
                            recipe: m.recipe.name(),
                            recipe_bytes,
                        });
                    }
                    _ => {}
                }
            }
            s.sections.insert("members", member_bytes);
            s.sections.insert("segments", patch.len() as u64 - fixed - header - member_bytes);
        }
    }
    Ok(s)
}
