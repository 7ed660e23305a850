//! Making a patch: (base file, new file) → [`Patch`].
//!
//! 1. Identical files give an identity patch.
//! 2. If both files scan as ZIPs, members whose compressed bytes are
//!    unchanged are copied by reference (runs of them in one segment);
//!    changed members are sent as a content delta against the base member of
//!    the same name plus a recipe that recreates their exact compressed bytes;
//!    every other byte goes through the normalised header stream.
//! 3. Anything else gets a generic binary delta (zstd against the whole base).

use crate::deflate;
use crate::deflaters;
use crate::delta;
use crate::error::{PatchError, Result};
use crate::format::{self, BaseHash, Body, ContentMode, Member, Patch, Recipe, RunEntry, Segment, ZipBody};
use crate::guids;
use crate::headers::{base_reference, declared, header_stream, times_differ, Computed};
use crate::limits::Limits;
use crate::png;
use crate::renumber::{self, Renumbering};
use crate::rows;
use crate::zip::{self, Entry, RegionKind, ZipLayout};
use sha2::{Digest, Sha256};
use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};

/// Options for [`diff`].
#[derive(Debug, Clone, Default)]
pub struct DiffOptions {
    pub limits: Limits,
    /// Never use the structured ZIP patch (for comparisons).
    pub force_binary: bool,
    /// Spend no extra time for bytes: when a structured patch is large, the
    /// generic delta it is checked against is made at zstd's everyday level
    /// (past a quarter of the file only), not at level 19. Patches may then
    /// be larger than `zstd -19 --patch-from` would make (up to a few times,
    /// on unrelated files); an edit save's patch is the same either way. For
    /// a device that minimises the user's wait rather than the bytes: level
    /// 19 costs up to about half a second per MB of base plus new file. Not
    /// quick, a member's middle over 1 MiB whose level-3 frame is long (an
    /// added picture's pixels, a rewritten part) is coded again at a stronger
    /// level too ([`delta::strengthen`]).
    pub quick: bool,
    /// Check a block-parallel member's recipe on a sample of its blocks, not
    /// on every one: where the edit starts, the last block, every block copied
    /// from the base and every block boundary (see
    /// [`deflate::deflate_blocks_spot_check`]). The patch is a valid patch in
    /// every case, but its recipe is then a claim that the blocks between the
    /// sampled ones were written the same way, which only the receiver's
    /// SHA-256 check of the rebuilt file confirms: a wrong claim makes
    /// `apply` fail with `target_mismatch` (the EPS answers `patch_failed`,
    /// and the device resends the whole file). For a sender that minimises
    /// the user's wait and whose receiver checks the target hash, as the
    /// device proxy's EPS always does. It also keeps the inflated content of
    /// the last few large members diffed (at most [`CONTENT_CACHE_BYTES`]) for
    /// the next diff against them. Ignored by [`crate::diff_verified`] when
    /// its check fails (it makes the patch again with every block checked).
    pub spot_check: bool,
    /// The newest edit-patch format version the receiver reads (its
    /// `patch_versions`, protocol §4); `None`: [`crate::VERSION`]. The patch
    /// uses only what that version defines; its version byte is the lowest
    /// that carries it ([`crate::min_version`]).
    pub max_version: Option<u8>,
    /// Never use flag bit 5's learnt amounts (edit-patch-v2.md §4.11): modes
    /// 9 and 10 then learn values only, as before draft.20. For comparisons,
    /// and for the vectors of the drafts before it.
    pub no_learnt_amounts: bool,
}

impl DiffOptions {
    /// The newest format version this diff may write.
    pub fn version(&self) -> u8 {
        self.max_version.unwrap_or(crate::VERSION).min(crate::VERSION)
    }
}

pub(crate) fn sha256(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}

/// Makes the patch that turns `base` into `new`.
pub fn diff(base: &[u8], new: &[u8], opts: &DiffOptions) -> Result<Patch> {
    diff_checked(base, new, opts).map(|(p, _)| p)
}

/// Single zlib streams that a diff's recipe search made and compared byte
/// for byte with the new file's (a recipe 2 member, a PNG's image data),
/// with what they were made of: for that diff's self-check
/// ([`crate::diff_verified`]), which then need not deflate them again (a
/// 170 kB thumbnail at level 9: 18 ms). Level 0 is left out: zlib's stored
/// blocks depend on the output room it is given, which the search and
/// `apply` do not give alike.
#[derive(Debug, Default)]
pub(crate) struct CheckedStreams(Vec<([u8; 32], deflate::ZlibParams, Vec<u8>)>);

/// None: what [`crate::apply`] and [`crate::verify`] use.
pub(crate) static NO_STREAMS: CheckedStreams = CheckedStreams(Vec::new());

/// Inputs shorter than this are not kept in [`CheckedStreams`]: they deflate in a millisecond or less.
const CHECKED_STREAM_MIN: usize = 64 << 10;

impl CheckedStreams {
    fn note(&mut self, input: &[u8], p: deflate::ZlibParams, stream: &[u8]) {
        if input.len() >= CHECKED_STREAM_MIN && p.level > 0 {
            self.0.push((sha256(input), p, stream.to_vec()));
        }
    }

    /// The stream `p` makes of `input`, if the search made and checked it.
    pub(crate) fn stream(&self, input: &[u8], p: deflate::ZlibParams) -> Option<&[u8]> {
        if self.0.is_empty() || input.len() < CHECKED_STREAM_MIN {
            return None;
        }
        let key = sha256(input);
        self.0.iter().find(|(k, q, _)| *k == key && *q == p).map(|(_, _, s)| &s[..])
    }
}

/// [`diff`], and the streams its search checked.
pub(crate) fn diff_checked(base: &[u8], new: &[u8], opts: &DiffOptions) -> Result<(Patch, CheckedStreams)> {
    let l = &opts.limits;
    Limits::check("base file size", base.len() as u64, l.max_file_size)?;
    Limits::check("new file size", new.len() as u64, l.max_file_size)?;
    let base_sha = sha256(base);
    // Allowed version 2, the base is named by its hash's prefix (16 bytes
    // fewer in every patch); the target's whole SHA-256 stays.
    let base_hash = if opts.version() >= 2 { BaseHash::prefix_of(&base_sha) } else { BaseHash::Full(base_sha) };
    let mut patch =
        Patch { base_size: base.len() as u64, base_hash, target_size: new.len() as u64, target_sha256: sha256(new), body: Body::Identity };
    let mut checked = CheckedStreams::default();
    if base == new {
        return Ok((patch, checked));
    }
    let layouts = if opts.force_binary { None } else { zip::scan(base).ok().zip(zip::scan(new).ok()) };
    patch.body = match &layouts {
        Some((bl, nl)) => {
            let mut d = ZipDiffer::new(base, bl, new, nl, l, opts);
            let body = d.run()?;
            checked = d.checked;
            Body::Zip(body)
        }
        None => Body::Binary { frame: delta::zstd_compress(new, base)? },
    };
    // A structured patch that saves little (unrelated files, re-zipped
    // archives, new members that zstd codes better in the whole file's
    // context) may lose to the generic delta: keep whichever is smaller. The
    // generic delta is made at zstd's strongest setting, so that no patch is
    // much larger than `zstd -19 --patch-from` would make; only for a
    // structured patch that is already large (an edit save's is a few
    // hundred bytes, and keeps its speed).
    if let Body::Zip(_) = patch.body {
        let zip_len = crate::format::encode(&patch).len();
        // Level 19's match tables (up to 80 MiB) must fit the budget the
        // members' inflated contents have (an EPS lowers it to its share of
        // memory per operation). Otherwise, as before: the everyday level, for
        // a structured patch over a quarter of the file only.
        let total = base.len() + new.len();
        let strong = !opts.quick && total <= STRONG_MAX_TOTAL && delta::zstd_strong_memory(total) <= l.max_total_inflated;
        let strong = strong && generic_may_win(zip_len, new.len());
        let frame = if strong {
            Some(delta::zstd_compress_strong(new, base)?)
        } else if zip_len > new.len() / 4 {
            Some(delta::zstd_compress(new, base)?)
        } else {
            None
        };
        if let Some(frame) = frame {
            let frame_len = frame.len();
            let zip_body = std::mem::replace(&mut patch.body, Body::Binary { frame });
            if crate::format::encode(&patch).len() >= zip_len {
                patch.body = zip_body;
            } else if strong {
                // The generic delta wins: other level-19 settings may make it smaller still.
                let bounds = layouts.as_ref().map(|(_, nl)| delta::own_block_bounds(nl, new.len())).unwrap_or_default();
                if let Some(frame) = delta::zstd_compress_strong_alternatives(new, base, frame_len, &bounds)? {
                    patch.body = Body::Binary { frame };
                }
            }
        }
    }
    Ok((patch, checked))
}

/// A structured patch at least this large (bytes) is checked against the generic delta.
const GENERIC_MIN_PATCH: usize = 4096;
/// ... when it is also at least 1/GENERIC_SHARE of the new file.
const GENERIC_SHARE: usize = 100;
/// Above this much base plus new file, the generic delta is made at the
/// everyday level (3, with long-distance matching) rather than level 19,
/// whose speed (7 s more for a 10 MB file against another, 20 MB in all;
/// about 25 s at this size, extrapolated) would take minutes on the largest
/// files.
const STRONG_MAX_TOTAL: usize = 64 << 20;

/// At most this much of a picture's pixels (PNG content) is coded again at
/// level 19 by [`delta::strengthen`] in one diff; past it, and for any other
/// content, a middle over 1 MiB is coded again at level 12 (up to
/// [`STRONG_MAX_TOTAL`]). Level 19 takes 0.15 to 0.45 s per MB of pixels
/// here, so that a metered save waits a second or two at most for it; a
/// 1920 x 1080 screenshot's 8.3 MB fit. On XML it takes 0.7 s per MB for
/// 12 % less than level 12 (a 7.5 MB `content.xml`: 5 s), which is not spent.
const STRENGTHEN_BUDGET: usize = 8 << 20;

/// The row-offset form (mode 4, version 2) replaces the plain or row-relative
/// delta only when its middle is this many bytes shorter: the segments of a
/// patch are compressed together, so a few bytes saved in one middle can cost
/// more there (a changed number cell in the 5,000-row .xlsx: 7 bytes less of
/// middle, 18 more of patch).
const OFFSETS_MARGIN: u64 = 32;

/// The row-offset delta is taken without coding the others when the plain
/// middle is this many times longer than its coded middle.
const OFFSETS_SHORTCUT: u64 = 100;
/// The row forms (content modes 1 and 4) are tried only for a spreadsheet
/// part whose plain middle is wider than this (bytes of the new content).
const ROW_FORMS_MIN_MIDDLE: usize = 2048;

/// The GUID form (content mode 5, version 2) is tried only on members of at
/// most this much content: a larger one is LibreOffice's block-parallel
/// stream, whose rebuild copies the unchanged blocks from the base only in
/// content mode 1 (and a GUID changed in a large part costs its 38 bytes of
/// text among the rest of the edit).
const GUIDS_MAX_CONTENT: usize = deflate::LIBREOFFICE_BLOCK;

/// ... and only where the plain delta's new middle is at most this long: a
/// save that changed GUIDs only (LibreOffice's master: 2.6 kB, with the
/// shapes' drift). Wider middles are edits, where a GUID or two save little
/// and the second delta costs the time of the first (up to a second on a
/// pair of unrelated 1 MB decks).
const GUIDS_MAX_MIDDLE: usize = 16 << 10;

/// Version 2: the renumbering of named numbers (content mode 8) is tried
/// for a member whose chosen delta codes its middle in at least this many
/// bytes (a map and a second delta of the whole member do not pay below).
const RENUMBER_MIN_MIDDLE: u64 = 64;

/// Whether a braced GUID of the new content overlaps the middle of `d`,
/// the plain delta to it.
fn guid_near_middle(new: &[u8], d: &delta::ContentDelta) -> bool {
    let p = d.prefix as usize;
    let from = p.saturating_sub(guids::GUID_TEXT - 1);
    let to = (p + d.middle.len() as usize + guids::GUID_TEXT - 1).min(new.len());
    !d.middle.is_empty() && guids::has_guid(&new[from..to])
}

/// A piece of the segments [`ZipDiffer::segments`] wrote: one target
/// member in its base member's place (its local header, its data, and a
/// data descriptor as long as the base member's), with the segments it
/// came from; or another segment.
enum Piece {
    Member { base: u64, entry: RunEntry, recipe: Option<Recipe>, from: Vec<Segment> },
    Other(Segment),
}

/// Fewest rebuilt members a member run holds: with one, the run saves at
/// most its descriptor's two bytes.
const RUN_MIN_REBUILT: usize = 2;

/// A stretch of this many copied members or more ends a member run: an
/// entry run codes it in fewer bytes.
const RUN_MAX_COPIES: usize = 8;

/// `segments` with stretches of members in base order whose rebuilt ones
/// share one recipe written as member runs (edit-patch-v2.md §4.6), each
/// where it is shorter than what it replaces. `desc`: the base members'
/// data descriptor lengths.
fn member_runs(segments: Vec<Segment>, desc: &[u64]) -> Vec<Segment> {
    let mut pieces = Vec::with_capacity(segments.len());
    let mut it = segments.into_iter().peekable();
    while let Some(s) = it.next() {
        match s {
            Segment::EntryRun { base_start, count } => pieces.extend((base_start..base_start + count).map(|b| Piece::Member {
                base: b,
                entry: RunEntry::Copy,
                recipe: None,
                from: vec![Segment::EntryRun { base_start: b, count: 1 }],
            })),
            Segment::Local => {
                let (b, entry, recipe) = match it.peek() {
                    Some(Segment::Member(Member { base: Some((b, mode)), delta, recipe })) => {
                        (*b, RunEntry::Rebuild(*mode, delta.clone()), Some(recipe.clone()))
                    }
                    Some(Segment::CopyData { base_entry }) => (*base_entry, RunEntry::Copy, None),
                    _ => {
                        pieces.push(Piece::Other(s));
                        continue;
                    }
                };
                let data = it.next().expect("peeked");
                let d = match it.peek() {
                    Some(Segment::Descriptor { len }) => u64::from(*len),
                    _ => 0,
                };
                if desc.get(b as usize) != Some(&d) {
                    pieces.push(Piece::Other(s));
                    pieces.push(Piece::Other(data));
                    continue;
                }
                let mut from = vec![s, data];
                if d > 0 {
                    from.push(it.next().expect("peeked"));
                }
                pieces.push(Piece::Member { base: b, entry, recipe, from });
            }
            other => pieces.push(Piece::Other(other)),
        }
    }
    // Groups of pieces that may form one run: members in base order, one recipe.
    let mut out: Vec<Segment> = Vec::new();
    let mut group: Vec<Piece> = Vec::new();
    let flush = |group: &mut Vec<Piece>, out: &mut Vec<Segment>| {
        // Long stretches of copies at the ends stay entry runs.
        let rebuilt = |p: &Piece| matches!(p, Piece::Member { entry: RunEntry::Rebuild(..), .. });
        let (first, last) = match (group.iter().position(rebuilt), group.iter().rposition(rebuilt)) {
            (Some(f), Some(l)) => (f, l),
            _ => (group.len(), group.len()),
        };
        let mut pieces: Vec<Piece> = std::mem::take(group);
        let tail: Vec<Piece> = if first < pieces.len() { pieces.split_off(last + 1) } else { Vec::new() };
        let middle: Vec<Piece> = pieces.split_off(first.min(pieces.len()));
        let put = |pieces: Vec<Piece>, out: &mut Vec<Segment>| {
            for p in pieces {
                match p {
                    Piece::Member { from, .. } => from.into_iter().for_each(|s| push_merged(out, s)),
                    Piece::Other(s) => push_merged(out, s),
                }
            }
        };
        put(pieces, out);
        // One rebuilt member gains little from a run: it stays a member segment.
        if middle.iter().filter(|p| rebuilt(p)).count() >= RUN_MIN_REBUILT {
            let base_start = match &middle[0] {
                Piece::Member { base, .. } => *base,
                Piece::Other(_) => unreachable!("groups hold members"),
            };
            let recipe = middle.iter().find_map(|p| match p {
                Piece::Member { recipe: Some(r), .. } => Some(r.clone()),
                _ => None,
            });
            let original: Vec<Segment> = middle
                .iter()
                .flat_map(|p| match p {
                    Piece::Member { from, .. } => from.clone(),
                    Piece::Other(s) => vec![s.clone()],
                })
                .collect();
            let entries: Vec<RunEntry> = middle
                .iter()
                .map(|p| match p {
                    Piece::Member { entry, .. } => entry.clone(),
                    Piece::Other(_) => unreachable!("groups hold members"),
                })
                .collect();
            let run = Segment::MemberRun { base_start, recipe: recipe.expect("a rebuilt member"), entries };
            if format::section_len(std::slice::from_ref(&run)) < format::section_len(&original) {
                out.push(run);
            } else {
                put(middle, out);
            }
        } else {
            put(middle, out);
        }
        put(tail, out);
    };
    for p in pieces {
        let joins = match (&p, group.last()) {
            (Piece::Member { base, recipe, .. }, Some(Piece::Member { base: prev, .. })) if *base == prev + 1 => {
                let run_recipe = group.iter().find_map(|g| match g {
                    Piece::Member { recipe: Some(r), .. } => Some(r),
                    _ => None,
                });
                let copies = group.iter().rev().take_while(|g| matches!(g, Piece::Member { entry: RunEntry::Copy, .. })).count();
                match recipe {
                    Some(r) => run_recipe.is_none_or(|rr| rr == r),
                    None => copies < RUN_MAX_COPIES,
                }
            }
            _ => false,
        };
        if !joins {
            flush(&mut group, &mut out);
        }
        match p {
            Piece::Member { .. } => group.push(p),
            Piece::Other(s) => {
                flush(&mut group, &mut out);
                push_merged(&mut out, s);
            }
        }
    }
    flush(&mut group, &mut out);
    out
}

/// A name with each run of digits taken out, and the runs' values:
/// `ppt/charts/chart102.xml` is `ppt/charts/chart#.xml` and [102].
fn name_shape(name: &[u8]) -> Option<(Vec<u8>, Vec<u64>)> {
    let (mut shape, mut numbers, mut i) = (Vec::with_capacity(name.len()), Vec::new(), 0);
    while i < name.len() {
        if name[i].is_ascii_digit() {
            let end = i + name[i..].iter().position(|b| !b.is_ascii_digit()).unwrap_or(name.len() - i);
            numbers.push(name[i..end].iter().fold(0u64, |v, &d| v.saturating_mul(10).saturating_add(u64::from(d - b'0'))));
            shape.push(b'#');
            i = end;
        } else {
            shape.push(name[i]);
            i += 1;
        }
    }
    (!numbers.is_empty()).then_some((shape, numbers))
}

/// New members whose name the base lacks, each paired with the base member
/// to take as its base: one whose name the new archive lacks and that is
/// named the same but for its numbers, in the order of those numbers, where
/// as many went as came. LibreOffice numbers a deck's charts anew on every
/// save (`chart102.xml` to `chart134.xml` become `chart135.xml` to
/// `chart167.xml`, with their `_rels`): without a base each would be coded
/// from nothing, a kilobyte or more a chart for a save with no edit. A
/// wrong pair costs only a larger delta: the patch says which base member
/// each member is made from. `base_names`: the base's members by name.
fn renamed_members(bl: &ZipLayout, nl: &ZipLayout, base_names: &HashMap<&[u8], Vec<usize>>) -> HashMap<usize, usize> {
    let new_names: HashSet<&[u8]> = nl.entries.iter().map(|e| &e.name[..]).collect();
    type Side = Vec<(Vec<u64>, usize)>;
    let mut groups: HashMap<Vec<u8>, (Side, Side)> = HashMap::new();
    for (i, e) in bl.entries.iter().enumerate().filter(|(_, e)| !new_names.contains(&e.name[..])) {
        if let Some((shape, numbers)) = name_shape(&e.name) {
            groups.entry(shape).or_default().0.push((numbers, i));
        }
    }
    for (t, e) in nl.entries.iter().enumerate().filter(|(_, e)| !base_names.contains_key(&e.name[..])) {
        if let Some((shape, numbers)) = name_shape(&e.name) {
            groups.entry(shape).or_default().1.push((numbers, t));
        }
    }
    let mut pairs = HashMap::new();
    for (_, (mut gone, mut came)) in groups {
        if gone.len() == came.len() {
            gone.sort_unstable();
            came.sort_unstable();
            pairs.extend(came.iter().zip(&gone).map(|((_, t), (_, b))| (*t, *b)));
        }
    }
    pairs
}

/// The name map of flag bit 4 (edit-patch-v2.md §2, its encoder paragraph)
/// for members renamed by number: the names of the base members that
/// `renamed` pairs, in the base's order, and those of the new members, in
/// the new archive's order, renumbered as mode 8 finds it (each old number
/// to the new one most of its places take), so that the reference's names,
/// renumbered, stand where the new file has them. At most `most_pairs` pairs.
fn renamed_names(bl: &ZipLayout, nl: &ZipLayout, renamed: &HashMap<usize, usize>, most_pairs: u64) -> Renumbering {
    let gone: HashSet<usize> = renamed.values().copied().collect();
    // Each name on a line of its own, in file order.
    let lines = |layout: &ZipLayout, keep: &dyn Fn(usize) -> bool| -> Vec<u8> {
        let kept = layout.entries.iter().enumerate().filter(|&(i, _)| keep(i));
        kept.flat_map(|(_, e)| e.name.iter().chain(b"\n")).copied().collect()
    };
    let (base, new) = (lines(bl, &|i| gone.contains(&i)), lines(nl, &|t| renamed.contains_key(&t)));
    renumber::find(&base, &new, most_pairs)
}

/// Most bytes of deltas and recipe data a patch may carry for member runs
/// to be tried: a run saves a few bytes a member, and trying it copies the
/// segments and compresses their section twice more (a picture's data
/// would be compressed again for nothing).
const RUNS_MAX_WEIGHT: u64 = 64 << 10;

/// A mode 7 member: its base member, its changes, its number tokens
/// ([`guids::number_pairs`]) and their keys ([`guids::number_keys`]), what
/// mode 9 is made from.
type DriftMember = (usize, guids::Drift, Vec<guids::NumberPair>, Vec<guids::Key>);

/// Most number tokens of mode 7 members kept for mode 9 in one diff (24
/// bytes each, and 9 of key): a deck's slides have a few dozen each.
const MAPPED_MAX_TOKENS: usize = 1 << 18;

/// A member that mode 10 may code (§4.10): its base member and the mode
/// its delta reads it in (1 or 5), the delta it has, its base's and its own
/// GUID forms (as mode 5 has them, as mode 1's plain content when there are
/// no GUIDs), and their paired tokens (the GUID
/// changes, and the number tokens, [`guids::paired_tokens`], with their
/// keys in the base's form).
struct MappedDeltaMember {
    base: usize,
    mode: ContentMode,
    delta: delta::ContentDelta,
    forms: (Vec<u8>, Vec<u8>),
    guids: guids::Drift,
    numbers: Vec<guids::NumberPair>,
    keys: Vec<guids::Key>,
}

/// Most bytes of GUID forms kept for mode 10 in one diff: a chart is some
/// kilobytes, and a member past [`GUIDS_MAX_CONTENT`] is never kept.
const MAPPED_DELTA_MAX_BYTES: usize = 8 << 20;

/// The segments with mode 7 members turned into mode 9 ones (edit-patch-v2.md
/// §4.9, its encoder paragraph; with `amounts`, every one of them, §4.11) and
/// members whose tokens pair into mode 10 ones where each is shorter so, or
/// `None` when there is none.
/// `drifts` are the mode 7 members' base members, changes and number
/// tokens; `changes` the patch's mode 7 changes and mode 8 pairs, at most
/// `max` with mode 9's changes. `amounts`: with flag bit 5's learnt
/// amounts (§4.11).
fn mapped_segments(
    segments: &[Segment],
    drifts: &[DriftMember],
    deltas: &[MappedDeltaMember],
    changes: u64,
    max: u64,
    amounts: bool,
) -> Option<Vec<Segment>> {
    let mut by_base: HashMap<u64, Vec<&DriftMember>> = HashMap::new();
    for d in drifts {
        by_base.entry(d.0 as u64).or_default().push(d);
    }
    let mut learnt = guids::Learning::new(amounts);
    let (mut out, mut any, mut total) = (Vec::with_capacity(segments.len()), false, changes);
    for s in segments {
        let mapped = match s {
            Segment::Member(m) => match (&m.base, &m.delta.middle) {
                (Some((b, ContentMode::InflateDrift)), delta::Middle::Drift(drift)) => by_base
                    .get(b)
                    .and_then(|ds| ds.iter().find(|(_, dd, _, _)| dd == drift))
                    // The same learning as the applier's (in segment order, which member runs keep).
                    .and_then(|(_, _, numbers, keys)| guids::learning_drift(drift, numbers, keys, &mut learnt))
                    .and_then(|(d, undo)| {
                        // With amounts, a member longer so may still teach the members after it
                        // what spares them their changes (the section as a whole decides, below).
                        let shorter = amounts || delta::Middle::Mapped(d.clone()).encoded_len() <= m.delta.middle.encoded_len();
                        shorter.then_some(d).or_else(|| {
                            learnt.undo(undo);
                            None
                        })
                    })
                    .map(|d| {
                        total = total + d.len() as u64 - drift.len() as u64;
                        any = true;
                        Segment::Member(Member {
                            base: Some((*b, ContentMode::InflateMapped)),
                            delta: delta::ContentDelta { prefix: 0, base_mid: 0, middle: delta::Middle::Mapped(d) },
                            recipe: m.recipe.clone(),
                        })
                    }),
                // Mode 10: a member whose tokens pair but whose other bytes changed too.
                (Some((b, mode @ (ContentMode::Inflate | ContentMode::InflateGuids))), _) => deltas
                    .iter()
                    .find(|d| d.base as u64 == *b && d.mode == *mode && d.delta == m.delta)
                    .and_then(|d| mapped_delta(d, &mut learnt, m))
                    .map(|md| {
                        if let delta::Middle::MappedDelta(drift, _) = &md.delta.middle {
                            total += drift.len() as u64;
                        }
                        any = true;
                        Segment::Member(md)
                    }),
                _ => None,
            },
            _ => None,
        };
        out.push(mapped.unwrap_or_else(|| s.clone()));
    }
    (any && total <= max).then_some(out)
}

/// Member `m` in mode 10 (§4.10) with what the patch learnt so far, when
/// that is shorter than its delta, also once compressed as the segment
/// section is; `learnt` is then left as its changes teach it.
fn mapped_delta(d: &MappedDeltaMember, learnt: &mut guids::Learning, m: &Member) -> Option<Member> {
    let mut before = learnt.clone();
    let (drift, undo) = guids::learning_drift(&d.guids, &d.numbers, &d.keys, learnt)?;
    let mut written = || -> Option<Member> {
        let t = guids::apply_learning(&d.forms.0, &drift, &mut before, u64::MAX).ok()?;
        let then = delta::diff_version(&t, &d.forms.1, 2).ok()?;
        let md = delta::ContentDelta { prefix: 0, base_mid: 0, middle: delta::Middle::MappedDelta(drift.clone(), Box::new(then)) };
        let shorter =
            md.middle.encoded_len() < m.delta.middle.encoded_len() && delta::packed_len(&md).ok()? < delta::packed_len(&m.delta).ok()?;
        shorter.then(|| Member { base: Some((d.base as u64, ContentMode::InflateMappedDelta)), delta: md, recipe: m.recipe.clone() })
    };
    let member = written();
    if member.is_none() {
        learnt.undo(undo);
    }
    member
}

/// Whether member runs are worth trying: two rebuilt members with a base
/// at least, and deltas and recipe data of at most [`RUNS_MAX_WEIGHT`].
fn runs_may_pay(segments: &[Segment]) -> bool {
    let (mut rebuilt, mut weight) = (0usize, 0u64);
    for s in segments {
        if let Segment::Member(m) = s {
            rebuilt += usize::from(m.base.is_some());
            weight += m.delta.middle.encoded_len()
                + match &m.recipe {
                    Recipe::Raw(b) | Recipe::Preflate(b) => b.len() as u64,
                    _ => 0,
                };
        }
    }
    rebuilt >= RUN_MIN_REBUILT && weight <= RUNS_MAX_WEIGHT
}

/// Appends a segment, joining an entry run to one that ends where it starts.
fn push_merged(out: &mut Vec<Segment>, s: Segment) {
    if let (Segment::EntryRun { base_start: b, count: c }, Some(Segment::EntryRun { base_start, count })) = (&s, out.last_mut()) {
        if *base_start + *count == *b {
            *count += c;
            return;
        }
    }
    out.push(s);
}

/// Whether the plain delta `d` from `base` to `new` replaces or writes a
/// digit: a changed number may be all it changes (mode 7).
fn digit_in_middle(base: &[u8], new: &[u8], d: &delta::ContentDelta) -> bool {
    let p = d.prefix as usize;
    let in_base = base.get(p..p + d.base_mid as usize).unwrap_or(&[]);
    let in_new = new.get(p..p + d.middle.len() as usize).unwrap_or(&[]);
    !d.middle.is_empty() && (in_base.iter().any(u8::is_ascii_digit) || in_new.iter().any(u8::is_ascii_digit))
}

/// Whether a structured patch of `zip_len` bytes for a `new_len`-byte file
/// is worth comparing with the strong generic delta: when it is a quarter of
/// the file (whatever its size), or several KB and a measurable share of it.
fn generic_may_win(zip_len: usize, new_len: usize) -> bool {
    zip_len > new_len / 4 || (zip_len >= GENERIC_MIN_PATCH && zip_len.saturating_mul(GENERIC_SHARE) >= new_len)
}

/// The content of a member, as the delta sees it.
struct Content {
    bytes: Arc<Vec<u8>>,
    mode: ContentMode,
    /// For PNG content: its frame and the deflate stream of its image data.
    png: Option<(png::PngFrame, Vec<u8>)>,
    /// For inflated content in spot-check mode: [`deflate::inflate_marking`]'s
    /// marks every [`deflate::LIBREOFFICE_BLOCK`] bytes (`None` otherwise).
    marks: Option<Arc<deflate::Marks>>,
}

impl Content {
    fn plain(bytes: Vec<u8>, mode: ContentMode, png: Option<(png::PngFrame, Vec<u8>)>) -> Self {
        Content { bytes: Arc::new(bytes), mode, png, marks: None }
    }
}

/// Spot-check mode keeps the inflated content of members at least this large ...
const CONTENT_CACHE_MIN: usize = 64 << 10;
/// ... in at most this many bytes (least recently used dropped first).
pub const CONTENT_CACHE_BYTES: usize = 64 << 20;

/// (SHA-256 of a member's compressed data, its content, its marks).
type CachedContent = ([u8; 32], Arc<Vec<u8>>, Arc<deflate::Marks>);

/// The inflated contents of the large members that spot-check diffs saw
/// last: the new version of one save is the base of the next, whose diff
/// then need not inflate it again.
static CONTENTS: Mutex<VecDeque<CachedContent>> = Mutex::new(VecDeque::new());

fn cached_content(key: &[u8; 32]) -> Option<(Arc<Vec<u8>>, Arc<deflate::Marks>)> {
    let mut m = CONTENTS.lock().unwrap_or_else(|e| e.into_inner());
    let i = m.iter().position(|(k, _, _)| k == key)?;
    let hit = m.remove(i)?;
    let found = (hit.1.clone(), hit.2.clone());
    m.push_back(hit);
    Some(found)
}

/// The bytes of content the spot-check diffs keep now.
pub(crate) fn kept_content_bytes() -> usize {
    CONTENTS.lock().unwrap_or_else(|e| e.into_inner()).iter().map(|(_, b, _)| b.len()).sum()
}

/// Drops every content the spot-check diffs keep; returns how many bytes that was.
pub(crate) fn forget_contents() -> usize {
    let mut m = CONTENTS.lock().unwrap_or_else(|e| e.into_inner());
    let bytes = m.iter().map(|(_, b, _)| b.len()).sum();
    m.clear();
    bytes
}

fn cache_content(key: [u8; 32], bytes: &Arc<Vec<u8>>, marks: &Arc<deflate::Marks>) {
    if bytes.len() < CONTENT_CACHE_MIN || bytes.len() > CONTENT_CACHE_BYTES / 2 {
        return;
    }
    let mut m = CONTENTS.lock().unwrap_or_else(|e| e.into_inner());
    m.retain(|(k, _, _)| *k != key);
    m.push_back((key, bytes.clone(), marks.clone()));
    while m.iter().map(|(_, b, _)| b.len()).sum::<usize>() > CONTENT_CACHE_BYTES {
        m.pop_front();
    }
}

/// Learns, ahead of the next patch against `file`, what that patch's diff
/// or apply would otherwise learn on its critical path: for each member
/// larger than one block that is LibreOffice's block-parallel zlib stream
/// (zlib's default parameters, 128 KiB blocks), its block layout and its
/// inflated content. A device calls it on a version that became the
/// document's base without being diffed (a whole save, a download); an EPS
/// on a file it received whole. Returns how many members were learnt.
///
/// With `spot_check` the layout is claimed as the spot check claims it
/// ([`deflate::deflate_blocks_spot_check`]: every block boundary, the first
/// and last blocks deflated and compared) and serves the next spot-checked
/// diff ([`DiffOptions::spot_check`]). Without it every block is deflated and
/// compared, and the layout serves apply and every diff. Not a ZIP: 0.
/// Bounded as a diff is: each member's inflated size by
/// [`Limits::inflate_bound`], their sum by `max_total_inflated`. A member
/// whose layout is known but whose content was let go of
/// ([`crate::forget_kept`]) is inflated and kept again, and counts.
pub fn learn(file: &[u8], limits: &Limits, spot_check: bool) -> Result<usize> {
    let Ok(layout) = zip::scan(file) else { return Ok(0) };
    let (params, block) = (deflate::candidate_params().next().expect("at least one candidate"), deflate::LIBREOFFICE_BLOCK);
    let (mut learnt, mut inflated) = (0, 0u64);
    for e in layout.entries.iter().filter(|e| e.method == 8) {
        let data = &file[e.data_offset as usize..(e.data_offset + e.data_len) as usize];
        let key = sha256(data);
        // Known: the layout, and the content (which an idle process may have let go of).
        let known = if spot_check {
            deflate::recall_claimed(data).is_some() && cached_content(&key).is_some()
        } else {
            deflate::recall_content(data).is_some_and(|(_, c)| c.is_some())
        };
        if known || data.len() < CONTENT_CACHE_MIN / 8 {
            continue;
        }
        let Ok((content, marks)) = deflate::inflate_marking(data, limits.inflate_bound(data.len() as u64), block) else { continue };
        inflated += content.len() as u64;
        Limits::check("total inflated size", inflated, limits.max_total_inflated)?;
        if content.len() <= block {
            continue;
        }
        let Some((layout, checked)) = check_blocks(&content, params, block, data, None, Some(&marks), spot_check) else { continue };
        if spot_check {
            // The spot-checked diff reads the content from its own cache.
            deflate::remember_as(data, layout, checked);
            cache_content(key, &Arc::new(content), &Arc::new(marks));
        } else {
            deflate::remember_made_as(key, layout, Arc::new(content), checked);
        }
        learnt += 1;
    }
    Ok(learnt)
}

/// Members up to this size try every level of recipe 9 (Go's
/// compress/flate); larger ones only Go's levels 5 and 6 (spec v2 §3.3).
const GO_ALL_LEVELS_MAX: usize = 64 << 10;

struct ZipDiffer<'a> {
    base: &'a [u8],
    bl: &'a ZipLayout,
    new: &'a [u8],
    nl: &'a ZipLayout,
    limits: &'a Limits,
    inflated_total: u64,
    /// The zlib recipe that last matched: most archives use one writer.
    last_recipe: Option<Recipe>,
    /// The same for PNG image data, whose writer is not the archive's.
    last_png_params: Option<deflate::ZlibParams>,
    /// The parameters the search for this archive's members last found (a
    /// PNG's are not among them).
    last_zip: Option<deflate::ZlibParams>,
    /// [`DiffOptions::spot_check`].
    spot_check: bool,
    /// Not [`DiffOptions::quick`]: wide middles are coded again at a stronger level ([`delta::strengthen`]).
    strong: bool,
    /// Bytes of pixels [`delta::strengthen`] may still code at level 19 ([`STRENGTHEN_BUDGET`]).
    strengthen_left: usize,
    /// The newest format version the patch may use ([`DiffOptions::version`]).
    version: u8,
    /// A member of this archive matched none of the known deflaters other
    /// than zlib: the archive's writer is none of them, and its later
    /// members do not try them (each costs its deflater's first block).
    known_refuted: bool,
    /// The single zlib streams the search made and compared.
    checked: CheckedStreams,
    /// Mode 7 changes and mode 8 pairs in the patch so far: at most
    /// `max_segments` (§4.5.2, §4.8.2).
    drift_changes: u64,
    /// The number tokens of each mode 7 member, by its base member and its
    /// changes ([`guids::number_pairs`]): what mode 9 is made from (§4.9).
    drift_numbers: Vec<DriftMember>,
    /// How many number tokens `drift_numbers` holds (at most [`MAPPED_MAX_TOKENS`]).
    drift_tokens: usize,
    /// Members whose GUID forms pair their tokens but differ elsewhere too:
    /// what mode 10 is made from (§4.10).
    mapped_deltas: Vec<MappedDeltaMember>,
    /// Bytes of GUID forms `mapped_deltas` holds (at most [`MAPPED_DELTA_MAX_BYTES`]).
    mapped_delta_bytes: usize,
    /// [`DiffOptions::no_learnt_amounts`].
    no_learnt_amounts: bool,
}

impl<'a> ZipDiffer<'a> {
    fn new(base: &'a [u8], bl: &'a ZipLayout, new: &'a [u8], nl: &'a ZipLayout, limits: &'a Limits, opts: &DiffOptions) -> Self {
        ZipDiffer {
            base,
            bl,
            new,
            nl,
            limits,
            inflated_total: 0,
            last_recipe: None,
            last_png_params: None,
            last_zip: None,
            spot_check: opts.spot_check,
            strong: !opts.quick,
            strengthen_left: STRENGTHEN_BUDGET,
            version: opts.version(),
            known_refuted: false,
            checked: CheckedStreams::default(),
            drift_changes: 0,
            drift_numbers: Vec::new(),
            drift_tokens: 0,
            mapped_deltas: Vec::new(),
            mapped_delta_bytes: 0,
            no_learnt_amounts: opts.no_learnt_amounts,
        }
    }

    fn data<'b>(file: &'b [u8], e: &Entry, len: u64) -> &'b [u8] {
        &file[e.data_offset as usize..(e.data_offset + len) as usize]
    }

    fn run(&mut self) -> Result<ZipBody> {
        let base_len: Vec<u64> = self.bl.entries.iter().map(|e| e.data_len).collect();
        let new_len: Vec<u64> = self.nl.entries.iter().map(|e| e.data_len).collect();
        let mut by_name: HashMap<&[u8], Vec<usize>> = HashMap::new();
        let mut by_data: HashMap<(u64, u32), Vec<usize>> = HashMap::new();
        for (i, e) in self.bl.entries.iter().enumerate() {
            by_name.entry(&e.name).or_default().push(i);
            by_data.entry((base_len[i], e.crc)).or_default().push(i);
        }
        let renamed = renamed_members(self.bl, self.nl, &by_name);
        let mut plans: Vec<Plan> = Vec::with_capacity(self.nl.entries.len());
        for (t, e) in self.nl.entries.iter().enumerate() {
            let data = Self::data(self.new, e, new_len[t]);
            let same_name = by_name.get(e.name.as_slice()).map(Vec::as_slice).unwrap_or(&[]);
            let same_data = by_data.get(&(new_len[t], e.crc)).map(Vec::as_slice).unwrap_or(&[]);
            let copy = same_name
                .iter()
                .chain(same_data)
                .copied()
                .find(|&b| base_len[b] == new_len[t] && Self::data(self.base, &self.bl.entries[b], base_len[b]) == data);
            plans.push(match copy {
                Some(b) => Plan::Copy(b),
                None => {
                    let base = same_name.first().copied().or_else(|| renamed.get(&t).copied());
                    let m = self.member(e, data, base, &base_len)?;
                    Plan::Rebuild(Box::new(m))
                }
            });
        }
        let computed = |e: usize| match &plans[e] {
            Plan::Rebuild(m) => Some(m.1),
            Plan::Copy(b) => Some(declared(&self.bl.entries[*b])),
        };
        let no_names = Renumbering::new();
        // None only for names renumbered past the decoder's bound (`max_part_size` of growth).
        let reference = |fresh: bool, names: &Renumbering| base_reference(self.base, self.bl, fresh, names, self.limits.max_part_size);
        let mut target_stream = header_stream(self.new, self.nl, computed, false);
        let mut header_frame = delta::zstd_compress(&target_stream, &reference(false, &no_names).expect("no names renumbered"))?;
        // Version 2: where the members' times change from run to run in
        // either file (a save that crossed a two-second boundary), fresh
        // times (flag bit 3) may code them in fewer bytes: the new file's
        // times, new on every save, need not follow the base's runs.
        let mut fresh_times = false;
        if self.version >= 2 && (times_differ(self.base, self.bl) || times_differ(self.new, self.nl)) {
            let target = header_stream(self.new, self.nl, computed, true);
            let fresh = delta::zstd_compress(&target, &reference(true, &no_names).expect("no names renumbered"))?;
            if fresh.len() < header_frame.len() {
                (header_frame, target_stream, fresh_times) = (fresh, target, true);
            }
        }
        // Version 2: members renamed by number (LibreOffice's charts), their
        // renumbering said once and the reference's names renumbered by it
        // (flag bit 4), when the patch is shorter so (below).
        let name_map = match self.version >= 2 && !renamed.is_empty() {
            true => renamed_names(self.bl, self.nl, &renamed, self.limits.max_segments.saturating_sub(self.drift_changes)),
            false => Renumbering::new(),
        };
        let map_pairs: u64 = name_map.iter().map(|(_, p)| p.len() as u64).sum();
        let renamed_frame = match (!name_map.is_empty()).then(|| reference(fresh_times, &name_map)).flatten() {
            Some(renamed) => Some(delta::zstd_compress(&target_stream, &renamed)?),
            None => None,
        };
        let segments = self.segments(plans);
        // Version 2: mode 7 members whose numbers take the values that the
        // members before them taught (mode 9), when the patch is shorter so.
        // Made twice: with the values learnt, and with the amounts too (flag bit 5, §4.11).
        let try_mapped = self.version >= 2 && (self.drift_numbers.len() >= 2 || !self.mapped_deltas.is_empty());
        let mapped = |amounts: bool| {
            let changes = self.drift_changes + map_pairs;
            try_mapped
                .then(|| mapped_segments(&segments, &self.drift_numbers, &self.mapped_deltas, changes, self.limits.max_segments, amounts))
                .flatten()
        };
        let amounts = (!self.no_learnt_amounts).then(|| (mapped(true), true));
        let mapped = [(mapped(false), false)].into_iter().chain(amounts);
        let desc = descriptor_lens(self.bl);
        // Version 2: members in base order as member runs, when that is
        // shorter; with the section's length where it was measured.
        let runs = |segments: Vec<Segment>| -> (Vec<Segment>, Option<usize>) {
            if self.version >= 2 && runs_may_pay(&segments) {
                let runs = member_runs(segments.clone(), &desc);
                if runs.len() < segments.len() {
                    let (with, without) = (format::section_len(&runs), format::section_len(&segments));
                    return if with < without { (runs, Some(with)) } else { (segments, Some(without)) };
                }
            }
            (segments, None)
        };
        let (mut segments, len) = runs(segments);
        let mut len = len.unwrap_or_else(|| format::section_len(&segments));
        let mut learnt_amounts = false;
        for (mapped, amounts) in mapped {
            if let Some((mapped, mapped_len)) = mapped.map(runs) {
                let mapped_len = mapped_len.unwrap_or_else(|| format::section_len(&mapped));
                if mapped_len < len {
                    (segments, len, learnt_amounts) = (mapped, mapped_len, amounts);
                }
            }
        }
        let mut names = Renumbering::new();
        if let Some(frame) = renamed_frame {
            // The map's bytes are in the segment section, which may be compressed.
            let with = frame.len() + format::section_len_with(&name_map, &segments);
            if with < header_frame.len() + format::section_len(&segments) {
                (header_frame, names) = (frame, name_map);
            }
        }
        let header_len = target_stream.len() as u64;
        Ok(ZipBody {
            base_entries: self.bl.entries.len() as u64,
            header_len,
            header_frame,
            fresh_times,
            renamed: names,
            learnt_amounts,
            segments,
        })
    }

    fn segments(&self, plans: Vec<Plan>) -> Vec<Segment> {
        let base_desc = descriptor_lens(self.bl);
        let regions = &self.nl.regions;
        let mut plans: Vec<Option<Plan>> = plans.into_iter().map(Some).collect();
        let mut out: Vec<Segment> = Vec::new();
        let mut i = 0;
        while i < regions.len() {
            let r = regions[i];
            match r.kind {
                RegionKind::Local => {
                    // Local + copied data (+ a descriptor like the base's) joins or starts a run.
                    if let Some(RegionKind::Data { entry }) = regions.get(i + 1).map(|r| r.kind) {
                        if let Some(Plan::Copy(b)) = plans[entry] {
                            let desc = match regions.get(i + 2) {
                                Some(d) if d.kind == RegionKind::Descriptor => d.len,
                                _ => 0,
                            };
                            if desc == base_desc[b] {
                                match out.last_mut() {
                                    Some(Segment::EntryRun { base_start, count }) if *base_start + *count == b as u64 => *count += 1,
                                    _ => out.push(Segment::EntryRun { base_start: b as u64, count: 1 }),
                                }
                                i += if desc > 0 { 3 } else { 2 };
                                continue;
                            }
                        }
                    }
                    out.push(Segment::Local);
                }
                RegionKind::Data { entry } => out.push(match plans[entry].take().expect("each member once") {
                    Plan::Copy(b) => Segment::CopyData { base_entry: b as u64 },
                    Plan::Rebuild(m) => Segment::Member(m.0),
                }),
                RegionKind::Descriptor => out.push(Segment::Descriptor { len: r.len as u8 }),
                RegionKind::Central => match out.last_mut() {
                    Some(Segment::Central { count }) => *count += 1,
                    _ => out.push(Segment::Central { count: 1 }),
                },
                RegionKind::Eocd => out.push(Segment::Eocd),
                RegionKind::Raw => out.push(Segment::Raw { len: r.len }),
            }
            i += 1;
        }
        out
    }

    /// Reads a member's content: inflated if it is a deflate stream that uses
    /// all its bytes, the raw bytes otherwise.
    /// In spot-check mode, the content of a large member comes from (and goes
    /// to) the cache of recent contents, and is marked for the spot check.
    /// `target`: a member of the new file (else of the base). `key`: the
    /// SHA-256 of `data` when the caller has it (the cache's key).
    ///
    /// `like`: for a member of the new file, the compressed data of the base's
    /// member it is compared with, and its SHA-256. When that one's content is
    /// kept (the spot-check cache: the base was the new version of the last
    /// save), the blocks the two streams share at their start are not inflated
    /// again ([`deflate::inflate_marking_resumed`]): an edit in a LibreOffice
    /// part leaves its blocks before the edit byte for byte.
    fn content(&mut self, e: &Entry, data: &[u8], target: bool, key: Option<[u8; 32]>, like: Option<(&[u8], [u8; 32])>) -> Result<Content> {
        let what = if target { "the new file" } else { "the base file" };
        // A target PNG may have a first IDAT chunk of its own size in version 2
        // (recipe 11); a base read as PNG (mode 2) has chunks of one size.
        let first_may_differ = self.version >= 2 && target;
        if e.method == 8 {
            let bound = self.limits.inflate_bound(data.len() as u64);
            let key = self.spot_check.then(|| key.unwrap_or_else(|| sha256(data)));
            let found = match key.as_ref().and_then(cached_content) {
                Some((bytes, marks)) if bytes.len() as u64 <= bound => Ok((bytes, Some(marks))),
                _ if self.spot_check => {
                    let every = deflate::LIBREOFFICE_BLOCK;
                    let known = like.and_then(|(b, k)| cached_content(&k).map(|found| (b, found)));
                    let made = match &known {
                        Some((b, (content, marks))) => {
                            deflate::inflate_marking_resumed(data, bound, every, content, marks, delta::common_prefix(data, b))
                        }
                        None => deflate::inflate_marking(data, bound, every),
                    };
                    made.map(|(b, m)| {
                        let (b, m) = (Arc::new(b), Arc::new(m));
                        cache_content(key.expect("spot check"), &b, &m);
                        (b, Some(m))
                    })
                }
                _ => deflate::inflate(data, bound).map(|b| (Arc::new(b), None)),
            };
            match found {
                Ok((bytes, marks)) => {
                    self.inflated_total += bytes.len() as u64;
                    Limits::check("total inflated size", self.inflated_total, self.limits.max_total_inflated)?;
                    return Ok(Content { bytes, mode: ContentMode::Inflate, png: None, marks });
                }
                Err(deflate::InflateError::TooLarge) => {
                    return Err(PatchError::ZipBomb { member: String::from_utf8_lossy(&e.name).into_owned(), file: what, limit: bound });
                }
                Err(deflate::InflateError::Corrupt(_)) => {}
            }
        }
        if e.method == 0 {
            if let Some(c) = png::canonicalize_with(data, self.limits.inflate_bound(data.len() as u64), first_may_differ) {
                return Ok(Content::plain(c.content, ContentMode::Png, Some((c.frame, c.deflate))));
            }
        }
        Ok(Content::plain(data.to_vec(), ContentMode::Raw, None))
    }

    fn member(&mut self, e: &Entry, data: &[u8], base_idx: Option<usize>, base_len: &[u64]) -> Result<(Member, Computed)> {
        // The base member's compressed data and its SHA-256 (the content
        // cache's key, which its own lookup below needs as well), when both
        // members are deflated: the new content's inflation may start where
        // the two streams part.
        let like = base_idx
            .filter(|_| self.spot_check && e.method == 8)
            .map(|b| (&self.bl.entries[b], b))
            .filter(|(be, _)| be.method == 8)
            .map(|(be, b)| Self::data(self.base, be, base_len[b]))
            .map(|bd| (bd, sha256(bd)));
        let mut new = self.content(e, data, true, None, like)?;
        let mut png_recipe = None;
        if let Some((frame, stream)) = &new.png {
            let image = png::image_of(&new.bytes, frame).expect("canonical frame fits");
            match self.png_recipe(image, stream, frame.zlib_header) {
                Some(inner) => png_recipe = Some(Recipe::Png { frame: *frame, inner: Box::new(inner) }),
                // A PNG whose stream we cannot recreate is just bytes.
                None => new = Content::plain(data.to_vec(), ContentMode::Raw, None),
            }
        }
        let base = match base_idx {
            Some(b) => {
                let be = &self.bl.entries[b];
                let bd = Self::data(self.base, be, base_len[b]);
                let c = self.content(be, bd, false, like.map(|(_, k)| k), None)?;
                // A PNG that only recipe 11 rebuilds, against a base PNG read as
                // bytes (mode 2 takes chunks of one size only): its pixels from
                // nothing, unless most of its bytes are the base's (an ancillary
                // chunk changed), where the delta of the bytes is the smaller.
                let own_first = new.png.as_ref().is_some_and(|(f, _)| f.first_differs());
                if own_first && c.mode == ContentMode::Raw && delta::middle_len(&c.bytes, data) < data.len() / 4 {
                    new = Content::plain(data.to_vec(), ContentMode::Raw, None);
                    png_recipe = None;
                }
                // The delta only pays between like contents.
                (c.mode == new.mode).then_some((b, c))
            }
            None => None,
        };
        // What trimming the common prefix and suffix leaves of the new
        // content. When it is narrow (a changed cell, an .ods row inserted
        // or deleted, where nothing numbers the rows), the row forms below
        // cannot code it much smaller: they pay where a change moves row
        // numbers or references far beyond it, which makes the middle wide.
        // Their transforms of the whole part (2-5 MB for a 5,000-row sheet)
        // are then most of the diff's time, and are skipped.
        let plain_middle = base.as_ref().map(|(_, b)| delta::middle_len(&b.bytes, &new.bytes));
        let wide = plain_middle.is_some_and(|m| m > ROW_FORMS_MIN_MIDDLE);
        // Whether the base and new contents are spreadsheet XML worth the row
        // forms: asked once (each look reads both parts to their end).
        let sheet = base.as_ref().is_some_and(|(_, b)| {
            wide && new.mode == ContentMode::Inflate
                && b.mode == ContentMode::Inflate
                && rows::applies(&new.bytes)
                && rows::applies(&b.bytes)
        });
        // Version 2, spreadsheet XML: the delta of the row-offset forms first.
        // When it is tiny beside the plain middle (a row inserted: 0.5 kB for
        // 2 MB), nothing else can win by much and the wide deltas are not
        // coded at all (they are most of the diff's time). Whether the form
        // gives the new content back is asked only where it is kept.
        let offsets_exact = |on: &[u8]| rows::offsets_inverse(on, u64::MAX).as_deref() == Ok(&new.bytes[..]);
        let mut off = None;
        if let Some((_, b)) = base.as_ref().filter(|_| self.version >= 2 && sheet) {
            let (ob, on) = both(|| rows::offsets_forward(&b.bytes), || rows::offsets_forward(&new.bytes));
            let d = delta::diff_version(&ob, &on, self.version)?;
            let tiny = d.middle.encoded_len() * OFFSETS_SHORTCUT <= plain_middle.unwrap_or_default() as u64;
            if !tiny || offsets_exact(&on) {
                off = Some((d, tiny, on));
            }
        }
        let shortcut = matches!(off, Some((_, true, _)));
        let (mut delta, mut base_mode) = match off.take() {
            Some((d, true, _)) => (d, Some(ContentMode::InflateOffsets)),
            other => {
                off = other;
                (
                    delta::diff_version(base.as_ref().map_or(&[][..], |(_, c)| &c.bytes), &new.bytes, self.version)?,
                    base.as_ref().map(|(_, c)| c.mode),
                )
            }
        };
        // Spreadsheet XML: try the delta of the row-relative forms too, keep the smaller.
        if let Some((_, b)) = base.as_ref().filter(|_| sheet) {
            if let (Some(tb), Some(tn)) = both(|| rows::forward(&b.bytes), || rows::forward(&new.bytes)) {
                // After the shortcut too (a wide middle can code small here:
                // LibreOffice's own row inserts), and kept unless the offsets
                // win by the margin, as when it is coded first.
                {
                    let rel = delta::diff_version(&tb, &tn, self.version)?;
                    let better = match shortcut {
                        true => delta.middle.encoded_len() + OFFSETS_MARGIN >= rel.middle.encoded_len(),
                        false => rel.middle.encoded_len() < delta.middle.encoded_len(),
                    };
                    if better && rows::inverse(&tn, u64::MAX).as_deref() == Some(&new.bytes[..]) {
                        delta = rel;
                        base_mode = Some(ContentMode::InflateRows);
                    }
                }
            }
            // Version 2: the row-offset form (references as offsets from their row).
            if let Some((off, _, on)) = off.take() {
                if off.middle.encoded_len() + OFFSETS_MARGIN < delta.middle.encoded_len() && offsets_exact(&on) {
                    delta = off;
                    base_mode = Some(ContentMode::InflateOffsets);
                }
            }
        }
        // Version 2: a changed GUID in the plain middle (LibreOffice's .pptx
        // draws a new one for every layout and master on each save): the
        // delta of the GUID forms, where a GUID is its 16 bytes, kept when
        // its middle is shorter.
        // The same forms name the changed GUIDs and numbers (mode 7) of a
        // member that changed nowhere else (LibreOffice rounds the sizes of
        // text shapes a little on each save).
        let mut mapped_delta = None;
        if let Some((_, b)) = base.as_ref().filter(|_| self.version >= 2 && base_mode == Some(ContentMode::Inflate)) {
            let narrow = plain_middle.is_some_and(|m| m <= GUIDS_MAX_MIDDLE);
            let guid = narrow && guid_near_middle(&new.bytes, &delta);
            let digits = narrow && digit_in_middle(&b.bytes, &new.bytes, &delta);
            if new.bytes.len() <= GUIDS_MAX_CONTENT && (guid || digits) {
                let (gb, gn) = (guids::forward(&b.bytes), guids::forward(&new.bytes));
                // Only GUIDs changed: name them (mode 6), no content delta;
                // GUIDs and numbers: name them (mode 7).
                let g = match guids::changed_payloads(&gb, &gn) {
                    Some(set) => Some((
                        delta::ContentDelta { prefix: 0, base_mid: 0, middle: delta::Middle::GuidSet(set) },
                        ContentMode::InflateGuidSet,
                    )),
                    None => match guids::changed_tokens(&gb, &gn) {
                        // A decoder refuses a patch of more than `max_segments` changes.
                        Some(drift) if self.drift_changes + drift.len() as u64 <= self.limits.max_segments => Some((
                            delta::ContentDelta { prefix: 0, base_mid: 0, middle: delta::Middle::Drift(drift) },
                            ContentMode::InflateDrift,
                        )),
                        _ if guid => Some((delta::diff_version(&gb, &gn, self.version)?, ContentMode::InflateGuids)),
                        _ => None,
                    },
                };
                if let Some((g, mode)) = g {
                    // Shorter, and shorter once compressed as the segment section
                    // is (a few GUIDs in a wide middle can code better as text there).
                    let shorter =
                        g.middle.encoded_len() < delta.middle.encoded_len() && delta::packed_len(&g)? < delta::packed_len(&delta)?;
                    if shorter && guids::inverse(&gn, u64::MAX).as_deref() == Ok(&new.bytes[..]) {
                        if let delta::Middle::Drift(drift) = &g.middle {
                            self.drift_changes += drift.len() as u64;
                            let numbers = guids::number_pairs(&gb, &gn).unwrap_or_default();
                            if let Some((b, _)) = base.as_ref().filter(|_| self.drift_tokens + numbers.len() <= MAPPED_MAX_TOKENS) {
                                self.drift_tokens += numbers.len();
                                let keys = guids::number_keys(&gb).unwrap_or_default();
                                self.drift_numbers.push((*b, drift.clone(), numbers, keys));
                            }
                        }
                        delta = g;
                        base_mode = Some(mode);
                    }
                }
                // Other bytes changed too, and the tokens pair: mode 10 may
                // name the numbers and GUIDs, with what the patch learnt, and
                // code the rest as a delta (decided with mode 9, §4.10).
                let kept = !matches!(base_mode, Some(ContentMode::InflateGuidSet | ContentMode::InflateDrift));
                if kept && self.mapped_delta_bytes + gb.len() + gn.len() <= MAPPED_DELTA_MAX_BYTES {
                    let paired = guids::paired_tokens(&gb, &gn).filter(|(_, numbers)| numbers.iter().any(|&(_, v, w)| v != w));
                    if let Some((guids, numbers)) = paired.filter(|_| guids::inverse(&gn, u64::MAX).as_deref() == Ok(&new.bytes[..])) {
                        self.mapped_delta_bytes += gb.len() + gn.len();
                        mapped_delta = Some(((gb, gn), guids, numbers));
                    }
                }
            }
        }
        // Version 2: names numbered anew (LibreOffice's .ods renumbers its
        // automatic cell styles, `ce38` becoming `ce28`, on every save): the
        // renumbering once, then the delta of what else changed (mode 8).
        // After the row forms too: a sheet's renumbered styles spread its
        // middle over the whole part, where the row forms do not help.
        let renumbering_may_pay = self.version >= 2
            && new.mode == ContentMode::Inflate
            && matches!(base_mode, Some(ContentMode::Inflate | ContentMode::InflateRows | ContentMode::InflateOffsets));
        if let Some((_, b)) = base.as_ref().filter(|_| renumbering_may_pay && delta.middle.encoded_len() >= RENUMBER_MIN_MIDDLE) {
            let map = renumber::find(&b.bytes, &new.bytes, self.limits.max_segments.saturating_sub(self.drift_changes));
            let renumbered = (!map.is_empty()).then(|| renumber::renumber(&b.bytes, &map, self.limits.max_part_size)).flatten();
            if let Some(renumbered) = renumbered {
                let pairs = renumber::pair_count(&map);
                let then = delta::diff_version(&renumbered, &new.bytes, self.version)?;
                let r = delta::ContentDelta { prefix: 0, base_mid: 0, middle: delta::Middle::Renumbered(map, Box::new(then)) };
                if r.middle.encoded_len() < delta.middle.encoded_len() && delta::packed_len(&r)? < delta::packed_len(&delta)? {
                    self.drift_changes += pairs;
                    delta = r;
                    base_mode = Some(ContentMode::InflateRenumbered);
                }
            }
        }
        // Not quick: a wide middle of the plain contents (an added picture's
        // pixels, a part rewritten) coded again at a stronger level.
        let plain_base = base.as_ref().map(|(_, c)| c.mode);
        if self.strong && base_mode == plain_base {
            let b = base.as_ref().map_or(&[][..], |(_, c)| &c.bytes[..]);
            let pixels = new.mode == ContentMode::Png;
            let (strong_max, memory) = (if pixels { self.strengthen_left } else { 0 }, self.limits.max_total_inflated);
            if delta::strengthen(b, &new.bytes, &mut delta, strong_max, STRONG_MAX_TOTAL, memory)? == Some(19) {
                self.strengthen_left -= (delta.base_mid + delta.middle.len()) as usize;
            }
        }
        let recipe = match new.mode {
            ContentMode::Raw => Recipe::Stored,
            ContentMode::Png => png_recipe.expect("set with the PNG content"),
            ContentMode::Inflate
            | ContentMode::InflateRows
            | ContentMode::InflateOffsets
            | ContentMode::InflateGuids
            | ContentMode::InflateGuidSet
            | ContentMode::InflateDrift
            | ContentMode::InflateRenumbered
            | ContentMode::InflateMapped
            | ContentMode::InflateMappedDelta => {
                // The base member's data and content, for the blocks a block-parallel stream shares with it.
                let base_member = base
                    .as_ref()
                    .filter(|(_, c)| c.mode == ContentMode::Inflate)
                    .map(|(b, c)| (Self::data(self.base, &self.bl.entries[*b], base_len[*b]), &c.bytes[..]));
                self.deflate_recipe(&new.bytes, data, base_member, new.marks.as_deref().map(Vec::as_slice))
                    .unwrap_or_else(|| Recipe::Raw(data.to_vec()))
            }
        };
        // The member's uncompressed bytes: the content, except for a stored PNG, whose bytes are the data.
        let plain = if new.mode == ContentMode::Png { data } else { &new.bytes };
        let computed = Computed { crc: crc32fast::hash(plain), csize: data.len() as u64, usize: plain.len() as u64 };
        if let (Some(((forms, guids, numbers), (b, _))), Some(mode @ (ContentMode::Inflate | ContentMode::InflateGuids))) =
            (mapped_delta.zip(base.as_ref()), base_mode)
        {
            let keys = guids::number_keys(&forms.0).unwrap_or_default();
            self.mapped_deltas.push(MappedDeltaMember { base: *b, mode, delta: delta.clone(), forms, guids, numbers, keys });
        }
        let member = Member { base: base.zip(base_mode).map(|((b, _), mode)| (b as u64, mode)), delta, recipe };
        Ok((member, computed))
    }

    /// The inner recipe of a PNG's image data. Its writer is the image
    /// library, not the archive's: it has its own last parameters, is never
    /// LibreOffice's block deflater (a thumbnail's 180 kB of pixels passed
    /// the size that makes [`Self::deflate_recipe`] try it), and its zlib
    /// header orders the candidates ([`deflate::candidate_params_for_png`]).
    fn png_recipe(&mut self, image: &[u8], stream: &[u8], zlib_header: [u8; 2]) -> Option<Recipe> {
        let last = self.last_png_params;
        for p in last.into_iter().chain(deflate::candidate_params_for_png(zlib_header, image.len()).filter(|p| Some(*p) != last)) {
            if deflate::deflate_matches(image, p, stream) {
                self.checked.note(image, p, stream);
                self.last_png_params = Some(p);
                // They are also the patch's last zlib parameters now (spec §4.3.6): a
                // member after it that they reproduce costs one byte (recipe 6).
                self.last_recipe = Some(Recipe::Zlib(p));
                return Some(Recipe::Zlib(p));
            }
        }
        deflate::preflate_analyse_within(stream, image, self.limits).map(Recipe::Preflate)
    }

    /// The cheapest deflate recipe that turns `content` into exactly `data`, if any.
    /// `base`: the base member's (data, content), when there is one; `marks`:
    /// the content's block marks (spot-check mode).
    fn deflate_recipe(
        &mut self,
        content: &[u8],
        data: &[u8],
        base: Option<(&[u8], &[u8])>,
        marks: Option<&[(u64, u64)]>,
    ) -> Option<Recipe> {
        // A base member known to be a block-parallel stream (this process made
        // or checked it): the same writer most likely wrote the new one, and
        // only the blocks whose input changed need deflating to check it.
        if let Some((base_data, base_content)) = base {
            let known = if self.spot_check { deflate::recall_claimed(base_data) } else { deflate::recall(base_data).map(|l| (l, true)) };
            if let Some((layout, checked)) = known {
                let b = deflate::BlockBase { content: base_content, data: base_data, layout: &layout };
                if self.blocks_match(content, layout.params, layout.block, data, Some((b, checked)), marks) {
                    return Some(Recipe::ZlibBlocks { params: layout.params, block: layout.block as u64 });
                }
            }
        }
        let large = content.len() > deflate::LIBREOFFICE_BLOCK;
        // Each recipe is tried once: the guesses below come back in the full
        // search after them, and a wrong block-parallel guess costs a block.
        let mut tried: Vec<Recipe> = Vec::new();
        let mut first_try = |r: &Recipe| {
            !tried.contains(r) && {
                tried.push(r.clone());
                true
            }
        };
        // A large part: LibreOffice's block deflater is the likeliest, with the
        // parameters this archive's members last needed (not a PNG's: its image
        // library chose those), else zlib's default; its first block alone tells.
        // Before any single stream: one that cannot match reads 100 to 220 kB of
        // XML before its first output shows it (zlib holds a block of symbols
        // back), 83 ms for the 18 candidates on a 1.26 MB content.xml.
        // Not in an archive whose last member came from a known deflater other than zlib.
        if large && !matches!(self.last_recipe, Some(Recipe::ZlibBlocks { .. } | Recipe::Known(_))) {
            let params = self.last_zip.unwrap_or_else(|| deflate::candidate_params().next().expect("at least one candidate"));
            let r = Recipe::ZlibBlocks { params, block: deflate::LIBREOFFICE_BLOCK as u64 };
            if first_try(&r) && self.recipe_matches(&r, content, data, marks) {
                if self.last_recipe.is_none() {
                    self.last_recipe = Some(r.clone());
                }
                return Some(r);
            }
        }
        if let Some(r) = self.last_recipe.clone().filter(|r| first_try(r) && self.recipe_matches(r, content, data, marks)) {
            return Some(r);
        }
        for p in deflate::candidate_params() {
            if first_try(&Recipe::Zlib(p)) && deflate::deflate_matches(content, p, data) {
                self.checked.note(content, p, data);
                self.last_recipe = Some(Recipe::Zlib(p));
                self.last_zip = Some(p);
                return Some(Recipe::Zlib(p));
            }
        }
        // Large parts from LibreOffice: its block-parallel deflater.
        if large {
            for params in deflate::candidate_params() {
                let r = Recipe::ZlibBlocks { params, block: deflate::LIBREOFFICE_BLOCK as u64 };
                if first_try(&r) && self.recipe_matches(&r, content, data, marks) {
                    self.last_recipe = Some(r.clone());
                    self.last_zip = Some(params);
                    return Some(r);
                }
            }
        }
        // Version 2: the known deflaters other than zlib (Rust's flate2 with
        // either backend, then Go's compress/flate from level 5, archive/zip's,
        // then Info-ZIP's zip from its default 6, then 7-Zip's -mx=5 and -mx=1), each
        // level compared as its output comes and
        // dropped at its first differing byte (a wrong guess costs the input
        // up to the deflater's first block). The last one that matched was
        // tried first, as the archive's last recipe. One member that none of
        // them makes rules them out for the rest of the archive (its writer
        // is another one): recipes 7 and 8's 21 candidates cost 80-140 ms on
        // the 300 kB content.xml of an .odt that Info-ZIP or 7-Zip re-zipped.
        if self.version >= 2 && !self.known_refuted {
            // Go's levels other than 5 (archive/zip's) and 6 (compress/flate's
            // default) only on a small member, where a refutation is cheap: on
            // a large one each costs Go's first block (16384 symbols), 17-37 ms
            // for the 11 levels on 1.3-5.6 MB of XML. A small member of the
            // archive that matches another level makes it the last recipe,
            // tried first on the large ones. zip's 9 levels are all tried:
            // each is refuted at the first symbol of zip's first block that
            // differs from the member's (0.1-0.4 ms for the 9 on 1.3-1.6 MB),
            // and 7-Zip's two likewise.
            let small = content.len() <= GO_ALL_LEVELS_MAX;
            for k in deflaters::candidates().filter(|k| k.deflater != deflaters::Deflater::GoFlate || small || matches!(k.level, 7 | 8)) {
                let r = Recipe::Known(k);
                if first_try(&r) && deflaters::matches(content, k, data) {
                    self.last_recipe = Some(r.clone());
                    return Some(r);
                }
            }
            self.known_refuted = true;
        }
        // Within the limits only: preflate's work and memory grow with the
        // number of deflate blocks, and a file may be made of millions of
        // empty ones (deflate::preflate_admits counts them first).
        if let Some(corrections) = deflate::preflate_analyse_within(data, content, self.limits) {
            return Some(Recipe::Preflate(corrections));
        }
        None
    }

    /// Whether recipe `r` turns `content` into `data`.
    fn recipe_matches(&mut self, r: &Recipe, content: &[u8], data: &[u8], marks: Option<&[(u64, u64)]>) -> bool {
        match r {
            Recipe::Zlib(p) => {
                let ok = deflate::deflate_matches(content, *p, data);
                if ok {
                    self.checked.note(content, *p, data);
                }
                ok
            }
            Recipe::ZlibBlocks { params, block } => self.blocks_match(content, *params, *block as usize, data, None, marks),
            Recipe::Known(k) => self.version >= 2 && deflaters::matches(content, *k, data),
            _ => false,
        }
    }

    /// Whether the block-parallel recipe (`params`, `block`) turns `content`
    /// into `data`, copying the blocks it can from `base` (with whether its
    /// layout was checked); a stream that does is remembered (its layout
    /// serves the next patch against it). Spot-check mode checks a sample of
    /// the blocks when `marks` tell where they end, and remembers the layout
    /// as a claim unless every block was compared against a checked base.
    fn blocks_match(
        &self,
        content: &[u8],
        params: deflate::ZlibParams,
        block: usize,
        data: &[u8],
        base: Option<(deflate::BlockBase<'_>, bool)>,
        marks: Option<&[(u64, u64)]>,
    ) -> bool {
        check_blocks(content, params, block, data, base, marks, self.spot_check)
            .map(|(layout, checked)| deflate::remember_as(data, layout, checked))
            .is_some()
    }
}

/// [`ZipDiffer::blocks_match`]'s check, without remembering: the layout of
/// `data` if the block-parallel recipe (`params`, `block`) turns `content`
/// into it, and whether every block was compared (false: a claim).
fn check_blocks(
    content: &[u8],
    params: deflate::ZlibParams,
    block: usize,
    data: &[u8],
    base: Option<(deflate::BlockBase<'_>, bool)>,
    marks: Option<&[(u64, u64)]>,
    spot_check: bool,
) -> Option<(deflate::BlockLayout, bool)> {
    if let (true, Some(marks)) = (spot_check, marks) {
        let every = deflate::LIBREOFFICE_BLOCK;
        match deflate::deflate_blocks_spot_check(content, params, block, data, base.map(|(b, _)| b), marks, every) {
            deflate::SpotCheck::Refuted => return None,
            deflate::SpotCheck::Claimed { layout, unchecked } => {
                return Some((layout, unchecked == 0 && base.is_none_or(|(_, checked)| checked)));
            }
            deflate::SpotCheck::Unknown => {}
        }
    }
    // Every block compared: only a checked base's blocks are copied.
    let base = base.filter(|(_, checked)| *checked).map(|(b, _)| b);
    deflate::deflate_blocks_matches_reusing(content, params, block, data, base).map(|layout| (layout, true))
}

/// Runs `f` and `g` at once, on two threads where the machine has two
/// cores (the transforms of a base and a new sheet part: 2-5 MB each).
fn both<T: Send>(f: impl FnOnce() -> T + Send, g: impl FnOnce() -> T + Send) -> (T, T) {
    if std::thread::available_parallelism().map_or(1, |n| n.get()) < 2 {
        return (f(), g());
    }
    std::thread::scope(|s| {
        let other = s.spawn(g);
        let first = f();
        (first, other.join().expect("the transform does not panic"))
    })
}

enum Plan {
    Copy(usize),
    Rebuild(Box<(Member, Computed)>),
}

/// Length of each member's data descriptor (0 when it has none).
pub(crate) fn descriptor_lens(l: &ZipLayout) -> Vec<u64> {
    let mut v = vec![0; l.entries.len()];
    for w in l.regions.windows(2) {
        if let (RegionKind::Data { entry }, RegionKind::Descriptor) = (w[0].kind, w[1].kind) {
            v[entry] = w[1].len;
        }
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_its_shape_and_its_numbers() {
        assert_eq!(name_shape(b"ppt/charts/chart102.xml"), Some((b"ppt/charts/chart#.xml".to_vec(), vec![102])));
        assert_eq!(name_shape(b"ppt/charts/_rels/chart7.xml.rels"), Some((b"ppt/charts/_rels/chart#.xml.rels".to_vec(), vec![7])));
        assert_eq!(name_shape(b"a1b22c"), Some((b"a#b#c".to_vec(), vec![1, 22])));
        assert_eq!(name_shape(b"content.xml"), None);
        assert_eq!(name_shape(b"x99999999999999999999999"), Some((b"x#".to_vec(), vec![u64::MAX])));
    }

    #[test]
    fn checked_streams_are_found_by_their_input_and_parameters_only() {
        let p6 = deflate::ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let p0 = deflate::ZlibParams { level: 0, ..p6 };
        let input: Vec<u8> = (0..CHECKED_STREAM_MIN as u32).map(|i| (i % 251) as u8).collect();
        let mut c = CheckedStreams::default();
        c.note(&input, p6, b"six");
        // Stored blocks depend on the output room: never kept.
        c.note(&input, p0, b"zero");
        // Small inputs are deflated again: not kept.
        c.note(&input[1..], p6, b"short");
        assert_eq!(c.stream(&input, p6), Some(&b"six"[..]));
        assert_eq!(c.stream(&input, p0), None);
        assert_eq!(c.stream(&input[1..], p6), None);
        let mut other = input.clone();
        other[7] ^= 1;
        assert_eq!(c.stream(&other, p6), None, "another input of the same length");
        assert_eq!(c.stream(&input, deflate::ZlibParams { mem_level: 9, ..p6 }), None);
        assert_eq!(NO_STREAMS.stream(&input, p6), None);
    }
}
