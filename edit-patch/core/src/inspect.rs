//! A human- and machine-readable summary of a patch: its kind, sizes, the
//! bytes spent on each section, and per rebuilt member how its content and
//! compressed bytes are made. With the base at hand, member names are shown.

use crate::delta::Middle;
use crate::error::Result;
use crate::format::{self, Body, Patch, Segment};
use crate::limits::Limits;
use serde::Serialize;

/// One rebuilt member.
#[derive(Debug, Clone, Serialize)]
pub struct MemberSummary {
    /// Base member index the delta refers to, if any.
    pub base_entry: Option<u64>,
    /// How the base content is read: "raw", "inflate", "png", "inflate-rows",
    /// "inflate-offsets", "inflate-guids" or "inflate-guid-set".
    pub content_mode: Option<&'static str>,
    /// Its name, when the base was given.
    pub name: Option<String>,
    /// Bytes kept from the front of the base content.
    pub kept_prefix: u64,
    /// Bytes of the base content replaced by the middle.
    pub replaced_base_bytes: u64,
    /// Length of the new middle.
    pub new_middle_len: u64,
    /// "literal" or "zstd".
    pub middle: &'static str,
    /// Bytes the middle takes in the patch.
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
    /// Hex of the base hash the header carries: the whole SHA-256, or its
    /// first 16 bytes (32 hex digits) in a version 2 patch with BASE_HASH_PREFIX.
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

/// Encoded length of a recipe, tag included; `last` follows the zlib
/// parameters as the encoder does (a repeat costs the tag alone).
fn recipe_len(r: &format::Recipe, last: &mut Option<crate::ZlibParams>) -> u64 {
    use format::Recipe::*;
    1 + match r {
        Stored => 0,
        Zlib(p) if *last == Some(*p) => 0,
        Zlib(p) => {
            *last = Some(*p);
            4
        }
        ZlibBlocks { block, params } => {
            *last = Some(*params);
            4 + varint_len(*block)
        }
        Preflate(b) | Raw(b) => varint_len(b.len() as u64) + b.len() as u64,
        Known(_) => 1,
        Png { frame, inner } => {
            let first = if frame.first_differs() { varint_len(frame.first_chunk) } else { 0 };
            varint_len(frame.head_len) + varint_len(frame.tail_len) + first + varint_len(frame.chunk_size) + 2 + recipe_len(inner, last)
        }
    }
}

/// Summarises `patch`; `base`, if given, supplies member names.
pub fn inspect(patch: &[u8], base: Option<&[u8]>, limits: &Limits) -> Result<Summary> {
    let p: Patch = format::decode(patch, limits)?;
    let names: Vec<String> = base
        .and_then(|b| crate::zip::scan(b).ok())
        .map(|l| l.entries.iter().map(|e| String::from_utf8_lossy(&e.name).into_owned()).collect())
        .unwrap_or_default();
    let fixed = 4 + 3 + varint_len(p.base_size) + p.base_hash.bytes().len() as u64 + varint_len(p.target_size) + 32;
    let mut s = Summary {
        version: patch[4],
        kind: ["identity", "zip", "binary"][p.body.kind() as usize],
        patch_bytes: patch.len() as u64,
        base_size: p.base_size,
        base_sha256: hex(p.base_hash.bytes()),
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
            let header = varint_len(z.base_entries)
                + varint_len(z.header_len)
                + varint_len(z.header_frame.len() as u64)
                + z.header_frame.len() as u64;
            s.sections.insert("header_stream", header);
            let mut member_bytes = 0;
            let mut last_params = None;
            // A member run's members are summed one by one (its recipe counted for each).
            for seg in z.segments.iter().cloned().flat_map(|s| s.expand(&[])) {
                match &seg {
                    Segment::CopyData { .. } => s.copied_members += 1,
                    Segment::EntryRun { count, .. } => s.copied_members += count,
                    Segment::Member(m) => {
                        // Modes 8 and 10: the map or the changes, then a delta whose kind and range are told.
                        let delta = match &m.delta.middle {
                            Middle::Renumbered(_, then) | Middle::MappedDelta(_, then) => &**then,
                            _ => &m.delta,
                        };
                        let middle = match (&m.delta.middle, &delta.middle) {
                            (Middle::Renumbered(..), Middle::Literal(_)) => "renumbered-literal",
                            (Middle::Renumbered(..), Middle::Zstd { .. }) => "renumbered-zstd",
                            (Middle::Renumbered(..), _) => "renumbered-hunks",
                            (Middle::MappedDelta(..), Middle::Literal(_)) => "mapped-literal",
                            (Middle::MappedDelta(..), Middle::Zstd { .. }) => "mapped-zstd",
                            (Middle::MappedDelta(..), _) => "mapped-hunks",
                            (Middle::Literal(_), _) => "literal",
                            (Middle::Zstd { .. }, _) => "zstd",
                            (Middle::Hunks { .. }, _) => "hunks",
                            (Middle::GuidSet(_), _) => "guid-set",
                            (Middle::Drift(_), _) => "drift",
                            (Middle::Mapped(_), _) => "mapped",
                        };
                        let middle_bytes = m.delta.middle.encoded_len();
                        let recipe_bytes = recipe_len(&m.recipe, &mut last_params);
                        member_bytes += middle_bytes + recipe_bytes;
                        *s.recipes.entry(m.recipe.name()).or_default() += 1;
                        s.rebuilt_members.push(MemberSummary {
                            base_entry: m.base.map(|b| b.0),
                            content_mode: m.base.map(|b| match b.1 {
                                format::ContentMode::Raw => "raw",
                                format::ContentMode::Inflate => "inflate",
                                format::ContentMode::Png => "png",
                                format::ContentMode::InflateRows => "inflate-rows",
                                format::ContentMode::InflateOffsets => "inflate-offsets",
                                format::ContentMode::InflateGuids => "inflate-guids",
                                format::ContentMode::InflateGuidSet => "inflate-guid-set",
                                format::ContentMode::InflateDrift => "inflate-drift",
                                format::ContentMode::InflateRenumbered => "inflate-renumbered",
                                format::ContentMode::InflateMapped => "inflate-mapped",
                                format::ContentMode::InflateMappedDelta => "inflate-mapped-delta",
                            }),
                            name: m.base.and_then(|b| names.get(b.0 as usize).cloned()),
                            kept_prefix: delta.prefix,
                            replaced_base_bytes: delta.base_mid,
                            new_middle_len: m.delta.middle.len(),
                            middle,
                            middle_bytes,
                            recipe: m.recipe.name(),
                            recipe_bytes,
                        });
                    }
                    _ => {}
                }
            }
            // With a compressed segment section, members and framing share one frame.
            if patch[6] & format::FLAG_SEGMENTS_COMPRESSED != 0 {
                s.sections.insert("segments_compressed", patch.len() as u64 - fixed - header);
            } else {
                s.sections.insert("members", member_bytes);
                s.sections.insert("segments", patch.len() as u64 - fixed - header - member_bytes);
            }
        }
    }
    Ok(s)
}
