//! The edit-patch format, versions 1 and 2: in-memory structures and their
//! exact wire encoding. The normative description is docs/spec/edit-patch-v1.md
//! (section numbers below refer to it) and, for what version 2 adds,
//! docs/spec/edit-patch-v2.md. A patch is written with the lowest version
//! that can carry it ([`min_version`]), so a patch that uses nothing of
//! version 2 is a version 1 patch, byte for byte as before version 2. (The
//! differ, allowed version 2, names the base by a 16-byte hash prefix, which
//! is version 2's: [`BaseHash`].)
//!
//! Decoding is defensive: every length is checked against the bytes that are
//! left and against [`Limits`], reserved bits must be zero, unknown tags are
//! rejected, and no trailing bytes are allowed. Decoding allocates no more
//! than the patch's own size, except a compressed segment section, which is
//! bounded by the declared target size.

use crate::deflate::ZlibParams;
use crate::deflaters::{Deflater, KnownDeflate};
use crate::delta::ContentDelta;
use crate::error::{PatchError, Result};
use crate::limits::Limits;
use crate::wire::{Reader, Writer};

/// Magic bytes opening every patch (§2).
pub const MAGIC: [u8; 4] = [0x89, b'E', b'C', b'P'];
/// The newest format version this crate writes and reads.
pub const VERSION: u8 = 2;
/// Every format version this crate reads (and writes, when a patch needs no
/// more), newest first: the `patch_versions` a receiver lists (protocol §4).
pub const VERSIONS: [u8; 2] = [2, 1];

/// The lowest format version that can carry `p`: 1 unless it uses something
/// version 2 adds (docs/spec/edit-patch-v2.md §1).
pub fn min_version(p: &Patch) -> u8 {
    let header = match p.base_hash {
        BaseHash::Full(_) => 1,
        BaseHash::Prefix(_) => 2,
    };
    let Body::Zip(z) = &p.body else { return header };
    let header = if z.fresh_times || !z.renamed.is_empty() || z.learnt_amounts { 2 } else { header };
    z.segments
        .iter()
        .map(|s| match s {
            Segment::Member(m) => member_version(m),
            Segment::MemberRun { .. } => 2,
            _ => 1,
        })
        .max()
        .unwrap_or(1)
        .max(header)
}

/// The lowest format version that can carry a member segment.
fn member_version(m: &Member) -> u8 {
    let mode = match m.base {
        Some((
            _,
            ContentMode::InflateOffsets
            | ContentMode::InflateGuids
            | ContentMode::InflateGuidSet
            | ContentMode::InflateDrift
            | ContentMode::InflateRenumbered
            | ContentMode::InflateMapped
            | ContentMode::InflateMappedDelta,
        )) => 2,
        _ => 1,
    };
    m.recipe.min_version().max(mode).max(m.delta.middle.min_version())
}

/// How the header names the base (§2; version 2 §2): its whole SHA-256, or,
/// with flag bit 1 (BASE_HASH_PREFIX, version 2), the first
/// [`BaseHash::PREFIX_LEN`] bytes of it. The prefix only names the base: the
/// target's whole SHA-256 is what makes a rebuild exact, and a base that
/// shares the prefix but is not the patch's base rebuilds a file that fails it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BaseHash {
    Full([u8; 32]),
    Prefix([u8; BaseHash::PREFIX_LEN]),
}

impl BaseHash {
    /// Bytes of a prefix base hash.
    pub const PREFIX_LEN: usize = 16;

    /// The prefix form of a whole SHA-256.
    pub fn prefix_of(sha256: &[u8; 32]) -> Self {
        BaseHash::Prefix(sha256[..Self::PREFIX_LEN].try_into().expect("16 of 32"))
    }

    /// The bytes the header carries.
    pub fn bytes(&self) -> &[u8] {
        match self {
            BaseHash::Full(h) => h,
            BaseHash::Prefix(h) => h,
        }
    }

    /// Whether a file whose SHA-256 is `sha256` is the one this names.
    pub fn names(&self, sha256: &[u8; 32]) -> bool {
        sha256.starts_with(self.bytes())
    }
}

/// A decoded patch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Patch {
    pub base_size: u64,
    /// The base's SHA-256, or its prefix (version 2).
    pub base_hash: BaseHash,
    pub target_size: u64,
    pub target_sha256: [u8; 32],
    pub body: Body,
}

/// What the patch carries, by kind (§3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Body {
    /// Kind 0: the target is the base.
    Identity,
    /// Kind 1: a structured ZIP patch.
    Zip(ZipBody),
    /// Kind 2: a magicless zstd frame decoded with the whole base as reference prefix.
    Binary { frame: Vec<u8> },
}

impl Body {
    /// The kind byte of this body.
    pub fn kind(&self) -> u8 {
        match self {
            Body::Identity => 0,
            Body::Zip(_) => 1,
            Body::Binary { .. } => 2,
        }
    }
}

/// Kind 1 body (§4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ZipBody {
    /// Members the decoder's scan of the base must find (§5).
    pub base_entries: u64,
    /// Decoded length of the header stream.
    pub header_len: u64,
    /// The normalised header stream, as a magicless zstd frame against the base's (§6).
    pub header_frame: Vec<u8>,
    /// Version 2, flag bit 3 (FRESH_TIMES): the header stream and its
    /// reference key their times fresh (edit-patch-v2.md §2).
    pub fresh_times: bool,
    /// Version 2, flag bit 4 (MEMBERS_RENUMBERED) when not empty: the name
    /// map at the start of the segment section, by which the header frame's
    /// reference renumbers its file names (edit-patch-v2.md §2).
    pub renamed: crate::renumber::Renumbering,
    /// Version 2, flag bit 5 (LEARNT_AMOUNTS): modes 9 and 10 also learn
    /// amounts by the bytes before a number (edit-patch-v2.md §4.11).
    pub learnt_amounts: bool,
    pub segments: Vec<Segment>,
}

/// One step of rebuilding the target (§4.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    /// Tag 1: the next local header from the header stream.
    Local,
    /// Tag 2: the compressed data of a base member, copied.
    CopyData { base_entry: u64 },
    /// Tag 3: member data rebuilt from content and a recipe.
    Member(Member),
    /// Tag 4: a data descriptor of `len` bytes (12, 16, 20 or 24) from the header stream.
    Descriptor { len: u8 },
    /// Tag 5: `count` central-directory records from the header stream.
    Central { count: u64 },
    /// Tag 6: the end-of-central-directory record from the header stream.
    Eocd,
    /// Tag 7: `len` bytes verbatim from the header stream.
    Raw { len: u64 },
    /// Tag 8: for i in 0..count: Local, CopyData(base_start + i), and a
    /// Descriptor of the same length as the base member's, if it had one.
    EntryRun { base_start: u64, count: u64 },
    /// Tag 9 (version 2, edit-patch-v2.md §4.6): for each entry *i*, base
    /// member `base_start + i`'s place: Local, its data (copied, or rebuilt
    /// from that base member by the entry's content mode and delta with the
    /// run's `recipe`), and a Descriptor of the same length as the base
    /// member's, if it had one.
    MemberRun { base_start: u64, recipe: Recipe, entries: Vec<RunEntry> },
}

/// One member of a [`Segment::MemberRun`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RunEntry {
    /// The base member's data, copied.
    Copy,
    /// Rebuilt from the base member's content read in this mode, and this delta.
    Rebuild(ContentMode, ContentDelta),
}

impl Segment {
    /// The segments a [`Segment::MemberRun`] stands for, given the lengths
    /// of the base members' data descriptors (0: none); any other segment
    /// is itself.
    pub fn expand(self, descriptor_lens: &[u64]) -> Vec<Segment> {
        let Segment::MemberRun { base_start, recipe, entries } = self else { return vec![self] };
        let mut out = Vec::with_capacity(entries.len() * 3);
        for (i, entry) in entries.into_iter().enumerate() {
            let b = base_start + i as u64;
            out.push(Segment::Local);
            out.push(match entry {
                RunEntry::Copy => Segment::CopyData { base_entry: b },
                RunEntry::Rebuild(mode, delta) => Segment::Member(Member { base: Some((b, mode)), delta, recipe: recipe.clone() }),
            });
            match descriptor_lens.get(b as usize) {
                Some(&d) if d > 0 => out.push(Segment::Descriptor { len: d as u8 }),
                _ => {}
            }
        }
        out
    }
}

/// How the base content of a member is read (§4.2).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ContentMode {
    /// The member's stored bytes as they are.
    Raw,
    /// The member's bytes inflated as raw deflate.
    Inflate,
    /// The member's bytes are a PNG, in canonical form (§4.2.1).
    Png,
    /// Inflated, then made row-relative (§4.2.5): spreadsheet XML.
    InflateRows,
    /// Version 2: inflated, then put in the row-offset form (v2 §4.1): spreadsheet XML.
    InflateOffsets,
    /// Version 2: inflated, then put in the GUID form (v2 §4.3): parts whose
    /// GUIDs change on every save.
    InflateGuids,
    /// Version 2: the GUID form, with new 16 bytes for some of its GUIDs
    /// and no other change (v2 §4.4); the delta is a [`crate::delta::Middle::GuidSet`].
    InflateGuidSet,
    /// Version 2: the GUID form, with new 16 bytes for some of its GUIDs and
    /// new values for some of its numbers, and no other change (v2 §4.5);
    /// the delta is a [`crate::delta::Middle::Drift`].
    InflateDrift,
    /// Version 2: inflated, its named numbers renumbered by a map, then the
    /// content delta (v2 §4.8); the delta is a [`crate::delta::Middle::Renumbered`].
    InflateRenumbered,
    /// Version 2: the GUID form, its numbers set to the values the patch's
    /// earlier mode 9 members taught, then mode 7's changes, which teach
    /// theirs (v2 §4.9); the delta is a [`crate::delta::Middle::Mapped`].
    InflateMapped,
    /// Version 2: mode 9's changes on the GUID form with the learnt values,
    /// then the content delta (v2 §4.10); the delta is a
    /// [`crate::delta::Middle::MappedDelta`].
    InflateMappedDelta,
}

impl ContentMode {
    /// The mode's byte (§4.2; v2 §4).
    pub fn byte(self) -> u8 {
        match self {
            ContentMode::Raw => 0,
            ContentMode::Inflate => 1,
            ContentMode::Png => 2,
            ContentMode::InflateRows => 3,
            ContentMode::InflateOffsets => 4,
            ContentMode::InflateGuids => 5,
            ContentMode::InflateGuidSet => 6,
            ContentMode::InflateDrift => 7,
            ContentMode::InflateRenumbered => 8,
            ContentMode::InflateMapped => 9,
            ContentMode::InflateMappedDelta => 10,
        }
    }

    /// The mode of a byte, if it is one.
    pub fn of_byte(b: u8) -> Option<Self> {
        Some(match b {
            0 => ContentMode::Raw,
            1 => ContentMode::Inflate,
            2 => ContentMode::Png,
            3 => ContentMode::InflateRows,
            4 => ContentMode::InflateOffsets,
            5 => ContentMode::InflateGuids,
            6 => ContentMode::InflateGuidSet,
            7 => ContentMode::InflateDrift,
            8 => ContentMode::InflateRenumbered,
            9 => ContentMode::InflateMapped,
            10 => ContentMode::InflateMappedDelta,
            _ => return None,
        })
    }

    /// Whether the base content is the GUID form (modes 5, 6, 7, 9 and 10).
    pub fn is_guid_form(self) -> bool {
        matches!(
            self,
            ContentMode::InflateGuids
                | ContentMode::InflateGuidSet
                | ContentMode::InflateDrift
                | ContentMode::InflateMapped
                | ContentMode::InflateMappedDelta
        )
    }
}

/// A member rebuilt from content (§4.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    /// The base member whose content the delta refers to, and how to read it.
    pub base: Option<(u64, ContentMode)>,
    pub delta: ContentDelta,
    pub recipe: Recipe,
}

/// How member data is made from its content (§4.3), cheapest first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recipe {
    /// Data = content.
    Stored,
    /// Data = zlib raw deflate of content with these parameters.
    Zlib(ZlibParams),
    /// Data = block-parallel zlib deflate (LibreOffice's ThreadedDeflater) with blocks of `block` bytes.
    ZlibBlocks { params: ZlibParams, block: u64 },
    /// Data = preflate-rs reconstruction of content with these corrections.
    Preflate(Vec<u8>),
    /// Data = these bytes.
    Raw(Vec<u8>),
    /// Data = a PNG rebuilt from canonical content; `inner` recompresses its image data.
    Png { frame: crate::png::PngFrame, inner: Box<Recipe> },
    /// Version 2, tags 7 and up: data = raw deflate of content by a known
    /// deflater other than zlib, at this level (edit-patch-v2.md §3).
    Known(KnownDeflate),
}

impl Recipe {
    /// The lowest format version that defines this recipe.
    pub fn min_version(&self) -> u8 {
        match self {
            // A first IDAT chunk of its own size is recipe 11 (edit-patch-v2.md §3.7).
            Recipe::Png { frame, inner } => inner.min_version().max(if frame.first_differs() { 2 } else { 1 }),
            Recipe::Known(_) => 2,
            _ => 1,
        }
    }

    /// Short name used in summaries.
    pub fn name(&self) -> &'static str {
        match self {
            Recipe::Stored => "stored",
            Recipe::Zlib(_) => "zlib",
            Recipe::ZlibBlocks { .. } => "zlib-blocks",
            Recipe::Preflate(_) => "preflate",
            Recipe::Raw(_) => "raw",
            Recipe::Png { .. } => "png",
            Recipe::Known(k) => k.name(),
        }
    }
}

/// Flag bit 0: the segment section of a ZIP body is a magicless zstd frame (§4).
pub const FLAG_SEGMENTS_COMPRESSED: u8 = 0x01;
/// Flag bit 1 (version 2): the header's base hash is the first 16 bytes of the base's SHA-256.
pub const FLAG_BASE_HASH_PREFIX: u8 = 0x02;
/// Flag bit 2 (version 2, with bit 0): the new GUIDs of content modes 6, 7, 9 and 10
/// follow the compressed segment section, 16 bytes each, instead of
/// standing in it (edit-patch-v2.md §2).
pub const FLAG_GUIDS_APART: u8 = 0x04;
/// Flag bit 3 (version 2, kind 1): fresh times. A central record's time is
/// keyed with its local header's, and the header frame's reference keys
/// every local header's time after the first with itself, so 0 there
/// (edit-patch-v2.md §2).
pub const FLAG_FRESH_TIMES: u8 = 0x08;
/// Flag bit 4 (version 2, kind 1): members renumbered. The segment section
/// begins with a name map of mode 8's form, and the header frame's reference
/// has its file names renumbered by it (edit-patch-v2.md §2).
pub const FLAG_MEMBERS_RENUMBERED: u8 = 0x10;
/// Flag bit 5 (version 2, kind 1): learnt amounts. Content modes 9 and 10
/// also learn, from a number change, its amount for the bytes before the
/// number (edit-patch-v2.md §4.11).
pub const FLAG_LEARNT_AMOUNTS: u8 = 0x20;

/// Encodes a patch to bytes.
pub fn encode(p: &Patch) -> Vec<u8> {
    encode_with(p, true)
}

fn encode_with(p: &Patch, pack: bool) -> Vec<u8> {
    let mut body = Writer::default();
    let mut flags = 0;
    match &p.body {
        Body::Identity => {}
        Body::Binary { frame } => body.blob(frame),
        Body::Zip(z) => {
            body.varint(z.base_entries);
            body.varint(z.header_len);
            body.blob(&z.header_frame);
            let (section, section_flags) = match pack {
                true => encode_section(&z.renamed, &z.segments),
                false => (plain_section(&z.renamed, &z.segments, false).0, 0),
            };
            flags |= section_flags;
            if z.fresh_times {
                flags |= FLAG_FRESH_TIMES;
            }
            if !z.renamed.is_empty() {
                flags |= FLAG_MEMBERS_RENUMBERED;
            }
            if z.learnt_amounts {
                flags |= FLAG_LEARNT_AMOUNTS;
            }
            body.bytes(&section);
        }
    }
    if let BaseHash::Prefix(_) = p.base_hash {
        flags |= FLAG_BASE_HASH_PREFIX;
    }
    let mut w = Writer::default();
    w.bytes(&MAGIC);
    w.u8(min_version(p));
    w.u8(p.body.kind());
    w.u8(flags);
    w.varint(p.base_size);
    w.bytes(p.base_hash.bytes());
    w.varint(p.target_size);
    w.bytes(&p.target_sha256);
    w.bytes(&body.buf);
    w.buf
}

/// What a patch's segments carry from one to the next: the last zlib
/// parameters (recipe 6), the last amount of a number change (modes 7 and
/// 9), and, with flag bit 2 (GUIDS_APART, version 2), the GUID tail that the
/// GUIDs of modes 6, 7, 9 and 10 go to (encoding) or come from (decoding).
#[derive(Default)]
struct Last {
    params: Option<ZlibParams>,
    amount: Option<i64>,
    apart: Option<Vec<u8>>,
    tail: Option<crate::delta::GuidTail>,
    /// Decoding: the mode 7 changes read so far, and the most the patch may
    /// have (`max_segments`, §4.5.2).
    changes: u64,
    max_changes: u64,
}

/// A member's delta in its wire form: mode 6's and mode 7's own fields, or
/// the content delta (§4.2).
fn encode_delta(w: &mut Writer, mode: Option<ContentMode>, d: &ContentDelta, last: &mut Last) {
    match (&d.middle, mode) {
        (crate::delta::Middle::Drift(drift), Some(ContentMode::InflateDrift)) => {
            crate::delta::write_drift(w, drift, &mut last.amount, last.apart.as_mut())
        }
        (crate::delta::Middle::GuidSet(set), Some(ContentMode::InflateGuidSet)) => {
            crate::delta::write_guid_set(w, set, last.apart.as_mut())
        }
        (crate::delta::Middle::Mapped(drift), Some(ContentMode::InflateMapped)) => {
            crate::delta::write_drift(w, drift, &mut last.amount, last.apart.as_mut())
        }
        (crate::delta::Middle::MappedDelta(drift, then), Some(ContentMode::InflateMappedDelta)) => {
            crate::delta::write_drift(w, drift, &mut last.amount, last.apart.as_mut());
            crate::delta::write_wire(w, then)
        }
        _ => crate::delta::write_wire(w, d),
    }
}

fn decode_delta(r: &mut Reader<'_>, mode: Option<ContentMode>, max_mid: u64, last: &mut Last) -> Result<ContentDelta> {
    match mode {
        Some(ContentMode::InflateGuidSet) => crate::delta::read_guid_set(r, last.tail.as_mut()),
        Some(ContentMode::InflateDrift) => {
            crate::delta::read_drift(r, &mut last.amount, last.tail.as_mut(), &mut last.changes, last.max_changes, 1)
        }
        Some(ContentMode::InflateMapped) => {
            crate::delta::read_mapped(r, &mut last.amount, last.tail.as_mut(), &mut last.changes, last.max_changes)
        }
        Some(ContentMode::InflateMappedDelta) => {
            let mapped = crate::delta::read_mapped(r, &mut last.amount, last.tail.as_mut(), &mut last.changes, last.max_changes)?;
            let crate::delta::Middle::Mapped(drift) = mapped.middle else { unreachable!("read_mapped reads mode 9's changes") };
            let then = crate::delta::read_wire(r, max_mid)?;
            Ok(ContentDelta { prefix: 0, base_mid: 0, middle: crate::delta::Middle::MappedDelta(drift, Box::new(then)) })
        }
        Some(ContentMode::InflateRenumbered) => {
            let map = crate::delta::read_renumbering(r, &mut last.changes, last.max_changes)?;
            let then = crate::delta::read_wire(r, max_mid)?;
            Ok(ContentDelta { prefix: 0, base_mid: 0, middle: crate::delta::Middle::Renumbered(map, Box::new(then)) })
        }
        _ => crate::delta::read_wire(r, max_mid),
    }
}

/// Whether any segment carries GUIDs of modes 6, 7, 9 or 10 (what a GUID tail holds).
fn has_guids(segments: &[Segment]) -> bool {
    let guids = |mode: ContentMode, d: &ContentDelta| match (&d.middle, mode) {
        (crate::delta::Middle::GuidSet(_), ContentMode::InflateGuidSet) => true,
        (crate::delta::Middle::Drift(drift), ContentMode::InflateDrift)
        | (crate::delta::Middle::Mapped(drift), ContentMode::InflateMapped)
        | (crate::delta::Middle::MappedDelta(drift, _), ContentMode::InflateMappedDelta) => {
            drift.iter().any(|(_, c)| matches!(c, crate::guids::Change::Guid(_)))
        }
        _ => false,
    };
    segments.iter().any(|s| match s {
        Segment::Member(m) => m.base.is_some_and(|(_, mode)| guids(mode, &m.delta)),
        Segment::MemberRun { entries, .. } => entries.iter().any(|e| matches!(e, RunEntry::Rebuild(mode, d) if guids(*mode, d))),
        _ => false,
    })
}

/// The plain segment section of these segments, after the name map of
/// flag bit 4 when `renamed` is not empty, and the GUID tail when `apart`
/// (the GUIDs of modes 6, 7, 9 and 10 written there instead).
fn plain_section(renamed: &crate::renumber::Renumbering, segments: &[Segment], apart: bool) -> (Vec<u8>, Vec<u8>) {
    let mut seg = Writer::default();
    if !renamed.is_empty() {
        crate::delta::write_renumbering(&mut seg, renamed);
    }
    seg.varint(segments.len() as u64);
    let mut last = Last { apart: apart.then(Vec::new), ..Last::default() };
    for s in segments {
        encode_segment(&mut seg, s, &mut last);
    }
    (seg.buf, last.apart.unwrap_or_default())
}

/// The segment section of these segments as a patch carries it, and its
/// flags (§4.0; v2 §2): entropy-coded when that pays (random GUIDs, many
/// members), most patches keep it plain; and, in version 2, with the new
/// GUIDs of modes 6, 7, 9 and 10 apart from the compressed part when that is
/// shorter (random bytes cost zstd more than their length).
fn encode_section(renamed: &crate::renumber::Renumbering, segments: &[Segment]) -> (Vec<u8>, u8) {
    let (plain, _) = plain_section(renamed, segments, false);
    let mut best = (plain.clone(), 0u8);
    if let Ok(frame) = crate::delta::zstd_compress(&plain, &[]) {
        if frame.len() + 3 < plain.len() {
            let mut w = Writer::default();
            w.varint(plain.len() as u64);
            w.bytes(&frame);
            best = (w.buf, FLAG_SEGMENTS_COMPRESSED);
        }
    }
    if has_guids(segments) {
        let (rest, tail) = plain_section(renamed, segments, true);
        if let Ok(frame) = crate::delta::zstd_compress(&rest, &[]) {
            let mut w = Writer::default();
            w.varint(rest.len() as u64);
            w.blob(&frame);
            w.bytes(&tail);
            if w.buf.len() < best.0.len() {
                best = (w.buf, FLAG_SEGMENTS_COMPRESSED | FLAG_GUIDS_APART);
            }
        }
    }
    best
}

/// The patch with its segment section plain, GUIDs where they stand (for
/// tests and test vectors that change its bytes in place).
#[doc(hidden)]
pub fn encode_plain(p: &Patch) -> Vec<u8> {
    encode_with(p, false)
}

/// Bytes the segment section of these segments takes in a patch.
pub fn section_len(segments: &[Segment]) -> usize {
    section_len_with(&Vec::new(), segments)
}

/// Bytes the segment section takes in a patch with this name map (flag bit
/// 4; none when empty) before its segments.
pub fn section_len_with(renamed: &crate::renumber::Renumbering, segments: &[Segment]) -> usize {
    encode_section(renamed, segments).0.len()
}

fn encode_segment(w: &mut Writer, s: &Segment, last: &mut Last) {
    match s {
        Segment::Local => w.u8(1),
        Segment::CopyData { base_entry } => {
            w.u8(2);
            w.varint(*base_entry);
        }
        Segment::Member(m) => {
            w.u8(3);
            match m.base {
                None => w.varint(0),
                Some((e, mode)) => {
                    w.varint(e + 1);
                    w.u8(mode.byte());
                }
            }
            encode_delta(w, m.base.map(|b| b.1), &m.delta, last);
            encode_recipe(w, &m.recipe, &mut last.params);
        }
        Segment::Descriptor { len } => {
            w.u8(4);
            w.u8(*len);
        }
        Segment::Central { count } => {
            w.u8(5);
            w.varint(*count);
        }
        Segment::Eocd => w.u8(6),
        Segment::Raw { len } => {
            w.u8(7);
            w.varint(*len);
        }
        Segment::EntryRun { base_start, count } => {
            w.u8(8);
            w.varint(*base_start);
            w.varint(*count);
        }
        Segment::MemberRun { base_start, recipe, entries } => {
            w.u8(9);
            w.varint(*base_start);
            w.varint(entries.len() as u64);
            encode_recipe(w, recipe, &mut last.params);
            for e in entries {
                match e {
                    RunEntry::Copy => w.u8(0),
                    RunEntry::Rebuild(mode, d) => {
                        w.u8(1 + mode.byte());
                        encode_delta(w, Some(*mode), d, last);
                    }
                }
            }
        }
    }
}

/// Writes a recipe. zlib parameters equal to the last ones written in this
/// patch are written as tag 6 (one byte instead of five).
fn encode_recipe(w: &mut Writer, r: &Recipe, last: &mut Option<ZlibParams>) {
    let params = |w: &mut Writer, p: &ZlibParams| w.bytes(&[p.level, p.mem_level, p.window_bits, p.strategy]);
    match r {
        Recipe::Stored => w.u8(0),
        Recipe::Zlib(p) if *last == Some(*p) => w.u8(6),
        Recipe::Zlib(p) => {
            w.u8(1);
            params(w, p);
            *last = Some(*p);
        }
        Recipe::Preflate(c) => {
            w.u8(2);
            w.blob(c);
        }
        Recipe::Raw(b) => {
            w.u8(3);
            w.blob(b);
        }
        Recipe::ZlibBlocks { params: p, block } => {
            w.u8(4);
            params(w, p);
            w.varint(*block);
            *last = Some(*p);
        }
        Recipe::Png { frame, inner } => {
            // Recipe 11 (version 2) is recipe 5 with the first chunk's size before the others'.
            w.u8(if frame.first_differs() { 11 } else { 5 });
            w.varint(frame.head_len);
            w.varint(frame.tail_len);
            if frame.first_differs() {
                w.varint(frame.first_chunk);
            }
            w.varint(frame.chunk_size);
            w.bytes(&frame.zlib_header);
            encode_recipe(w, inner, last);
        }
        Recipe::Known(k) => {
            w.u8(k.deflater.tag());
            w.u8(k.level);
        }
    }
}

/// Decodes and validates the structure of a patch (not its hashes: see apply).
pub fn decode(bytes: &[u8], limits: &Limits) -> Result<Patch> {
    if bytes.len() < 4 || bytes[..4] != MAGIC {
        return Err(PatchError::BadMagic { found: bytes[..bytes.len().min(4)].to_vec() });
    }
    let mut r = Reader::new(bytes);
    r.take(4, "magic")?;
    let version = r.u8("version")?;
    if !VERSIONS.contains(&version) {
        return Err(PatchError::UnsupportedVersion(version));
    }
    let kind_at = r.pos();
    let kind = r.u8("kind")?;
    let flags_at = r.pos();
    let flags = r.u8("flags")?;
    let defined = match version {
        1 => FLAG_SEGMENTS_COMPRESSED,
        _ => {
            FLAG_SEGMENTS_COMPRESSED
                | FLAG_BASE_HASH_PREFIX
                | FLAG_GUIDS_APART
                | FLAG_FRESH_TIMES
                | FLAG_MEMBERS_RENUMBERED
                | FLAG_LEARNT_AMOUNTS
        }
    };
    if flags & !defined != 0 {
        let known = if version >= 2 { "bits 0 to 5 are" } else { "only bit 0 is" };
        return Err(PatchError::malformed(
            "flags",
            flags_at,
            format!("reserved bits set ({flags:#04x}); {known} defined in version {version}"),
        ));
    }
    // Bit 0 (a compressed section), bit 3 (fresh times), bit 4 (members
    // renumbered) and bit 5 (learnt amounts) describe a ZIP body.
    let zip_only = flags & (FLAG_SEGMENTS_COMPRESSED | FLAG_FRESH_TIMES | FLAG_MEMBERS_RENUMBERED | FLAG_LEARNT_AMOUNTS);
    if zip_only != 0 && kind != 1 {
        return Err(PatchError::malformed(
            "flags",
            flags_at,
            format!("flags {zip_only:#04x} are defined only for kind 1, not kind {kind}"),
        ));
    }
    if flags & FLAG_GUIDS_APART != 0 && flags & FLAG_SEGMENTS_COMPRESSED == 0 {
        return Err(PatchError::malformed("flags", flags_at, "flag bit 2 (GUIDs apart) is defined only with bit 0 (a compressed section)"));
    }
    let base_size = r.varint("base size")?;
    Limits::check("declared base size", base_size, limits.max_file_size)?;
    let base_hash = if flags & FLAG_BASE_HASH_PREFIX != 0 {
        BaseHash::Prefix(r.take(BaseHash::PREFIX_LEN, "base SHA-256 prefix")?.try_into().expect("16"))
    } else {
        BaseHash::Full(r.take(32, "base SHA-256")?.try_into().expect("32"))
    };
    let target_size = r.varint("target size")?;
    Limits::check("declared target size", target_size, limits.max_file_size)?;
    let target_sha256 = r.take(32, "target SHA-256")?.try_into().expect("32");
    let body = match kind {
        0 => {
            if base_size != target_size || !base_hash.names(&target_sha256) {
                return Err(PatchError::malformed("identity patch", kind_at, "base and target differ"));
            }
            Body::Identity
        }
        1 => Body::Zip(decode_zip(&mut r, target_size, limits, flags)?),
        2 => Body::Binary { frame: r.blob("binary delta frame")?.to_vec() },
        k => return Err(PatchError::malformed("kind", kind_at, format!("unknown patch kind {k} (known: 0 identity, 1 zip, 2 binary)"))),
    };
    if r.remaining() != 0 {
        return Err(PatchError::malformed("end of patch", r.pos(), format!("{} trailing bytes", r.remaining())));
    }
    let patch = Patch { base_size, base_hash, target_size, target_sha256, body };
    let needs = min_version(&patch);
    if needs > version {
        return Err(PatchError::malformed(
            "version",
            4,
            format!("the patch says version {version} but uses what version {needs} adds (edit-patch-v2.md)"),
        ));
    }
    Ok(patch)
}

fn decode_zip(r: &mut Reader<'_>, target_size: u64, limits: &Limits, flags: u8) -> Result<ZipBody> {
    let (compressed, apart) = (flags & FLAG_SEGMENTS_COMPRESSED != 0, flags & FLAG_GUIDS_APART != 0);
    let fresh_times = flags & FLAG_FRESH_TIMES != 0;
    let renumbered = flags & FLAG_MEMBERS_RENUMBERED != 0;
    let learnt_amounts = flags & FLAG_LEARNT_AMOUNTS != 0;
    let base_entries = r.varint("base entry count")?;
    let header_len = r.len_at_most("header stream length", target_size)? as u64;
    let header_frame = r.blob("header stream frame")?.to_vec();
    if compressed {
        // Raw recipes and literals hold at most the target's bytes, twice over at worst.
        let len = r.len_at_most("segment section length", target_size.saturating_mul(2).saturating_add(1 << 20))?;
        let frame = match apart {
            true => r.blob("segment section frame")?,
            false => r.take(r.remaining(), "segment section frame")?,
        };
        // With GUIDs apart, the rest of the patch is their tail: 16 bytes each.
        let tail_at = r.pos();
        let tail = apart.then(|| r.take(r.remaining(), "GUID tail").map(|t| t.to_vec())).transpose()?;
        if tail.as_ref().is_some_and(|t| t.is_empty() || t.len() % 16 != 0) {
            let n = tail.as_ref().map_or(0, Vec::len);
            return Err(PatchError::malformed("GUID tail", tail_at, format!("{n} bytes (16 a GUID, at least one)")));
        }
        let plain = crate::delta::zstd_decompress(frame, &[], len, "compressed segment section")?;
        let mut inner = Reader::new(&plain);
        let tail = tail.map(|bytes| crate::delta::GuidTail { bytes, at: 0 });
        let mut last = Last { tail, max_changes: limits.max_segments, ..Last::default() };
        let renamed = read_name_map(&mut inner, renumbered, &mut last)?;
        let segments = decode_segments(&mut inner, base_entries, target_size, limits, &mut last)?;
        if inner.remaining() != 0 {
            return Err(PatchError::malformed(
                "segment section",
                inner.pos(),
                format!("{} trailing bytes in the compressed segment section", inner.remaining()),
            ));
        }
        if let Some(t) = last.tail.filter(|t| t.at != t.bytes.len()) {
            return Err(PatchError::malformed("GUID tail", tail_at + t.at, format!("{} bytes no GUID uses", t.bytes.len() - t.at)));
        }
        return Ok(ZipBody { base_entries, header_len, header_frame, fresh_times, renamed, learnt_amounts, segments });
    }
    let mut last = Last { max_changes: limits.max_segments, ..Last::default() };
    let renamed = read_name_map(r, renumbered, &mut last)?;
    let segments = decode_segments(r, base_entries, target_size, limits, &mut last)?;
    Ok(ZipBody { base_entries, header_len, header_frame, fresh_times, renamed, learnt_amounts, segments })
}

/// The name map that opens the segment section with flag bit 4
/// (edit-patch-v2.md §2), read as mode 8's map; its pairs count towards
/// the patch's `max_segments` as mode 8's do. Empty without the flag.
fn read_name_map(r: &mut Reader<'_>, renumbered: bool, last: &mut Last) -> Result<crate::renumber::Renumbering> {
    match renumbered {
        true => crate::delta::read_renumbering(r, &mut last.changes, last.max_changes),
        false => Ok(Vec::new()),
    }
}

fn decode_segments(r: &mut Reader<'_>, base_entries: u64, target_size: u64, limits: &Limits, last: &mut Last) -> Result<Vec<Segment>> {
    let count_at = r.pos();
    let count = r.varint("segment count")?;
    Limits::check("segment count", count, limits.max_segments)?;
    // Every segment takes at least one byte: a count beyond the bytes left is a lie.
    if count > r.remaining() as u64 {
        return Err(PatchError::Truncated { what: "segments", offset: count_at });
    }
    let mut segments = Vec::with_capacity(count as usize);
    for _ in 0..count {
        segments.push(decode_segment(r, base_entries, target_size, limits, last)?);
    }
    Ok(segments)
}

fn decode_segment(r: &mut Reader<'_>, base_entries: u64, target_size: u64, limits: &Limits, last: &mut Last) -> Result<Segment> {
    let at = r.pos();
    let entry = |r: &mut Reader<'_>, what: &'static str| -> Result<u64> {
        let at = r.pos();
        let e = r.varint(what)?;
        if e >= base_entries {
            return Err(PatchError::malformed(what, at, format!("base member {e} does not exist (base has {base_entries})")));
        }
        Ok(e)
    };
    Ok(match r.u8("segment tag")? {
        1 => Segment::Local,
        2 => Segment::CopyData { base_entry: entry(r, "copied base member")? },
        3 => Segment::Member(decode_member(r, base_entries, target_size, limits, last)?),
        4 => {
            let len = r.u8("descriptor length")?;
            if ![12, 16, 20, 24].contains(&len) {
                return Err(PatchError::malformed("descriptor length", at + 1, format!("{len} (must be 12, 16, 20 or 24)")));
            }
            Segment::Descriptor { len }
        }
        5 => Segment::Central { count: r.len_at_most("central record count", target_size / 46 + 1)? as u64 },
        6 => Segment::Eocd,
        7 => Segment::Raw { len: r.len_at_most("raw length", target_size)? as u64 },
        8 => {
            let base_start = entry(r, "entry run start")?;
            let c_at = r.pos();
            let count = r.varint("entry run length")?;
            if count == 0 || base_start.checked_add(count).is_none_or(|end| end > base_entries) {
                return Err(PatchError::malformed(
                    "entry run length",
                    c_at,
                    format!("{count} members from {base_start} (base has {base_entries})"),
                ));
            }
            Segment::EntryRun { base_start, count }
        }
        9 => {
            let base_start = entry(r, "member run start")?;
            let c_at = r.pos();
            let count = r.varint("member run length")?;
            if count == 0 || count > r.remaining() as u64 || base_start.checked_add(count).is_none_or(|end| end > base_entries) {
                return Err(PatchError::malformed(
                    "member run length",
                    c_at,
                    format!("{count} members from {base_start} (base has {base_entries}; one byte each at least)"),
                ));
            }
            let recipe = decode_recipe(r, false, &mut last.params)?;
            let max_mid = crate::delta::max_middle(target_size, limits);
            let mut entries = Vec::with_capacity(count as usize);
            for _ in 0..count {
                let e_at = r.pos();
                entries.push(match r.u8("member run entry")? {
                    0 => RunEntry::Copy,
                    b => {
                        let mode = ContentMode::of_byte(b - 1)
                            .ok_or_else(|| PatchError::malformed("member run entry", e_at, format!("unknown entry {b}")))?;
                        RunEntry::Rebuild(mode, decode_delta(r, Some(mode), max_mid, last)?)
                    }
                });
            }
            Segment::MemberRun { base_start, recipe, entries }
        }
        t => return Err(PatchError::malformed("segment tag", at, format!("unknown tag {t}"))),
    })
}

/// A recipe; `nested` inside a PNG recipe, where only deflate recipes may
/// stand. `last` tracks the zlib parameters tag 6 repeats.
fn decode_recipe(r: &mut Reader<'_>, nested: bool, last: &mut Option<ZlibParams>) -> Result<Recipe> {
    let at = r.pos();
    let tag = r.u8("recipe")?;
    if nested && ![1, 2, 4, 6].contains(&tag) {
        return Err(PatchError::malformed(
            "inner recipe",
            at,
            format!("recipe {tag} cannot recompress PNG image data (allowed: 1, 2, 4, 6)"),
        ));
    }
    Ok(match tag {
        0 => Recipe::Stored,
        1 => {
            let p = zlib_params(r)?;
            *last = Some(p);
            Recipe::Zlib(p)
        }
        6 => {
            Recipe::Zlib(last.ok_or_else(|| PatchError::malformed("recipe", at, "recipe 6 repeats zlib parameters, but none came before"))?)
        }
        2 => Recipe::Preflate(r.blob("preflate corrections")?.to_vec()),
        3 => Recipe::Raw(r.blob("raw member data")?.to_vec()),
        4 => {
            let params = zlib_params(r)?;
            let at = r.pos();
            let block = r.varint("block size")?;
            if block < 1 << params.window_bits || block > u64::from(u32::MAX) {
                return Err(PatchError::malformed(
                    "block size",
                    at,
                    format!("{block} (must be at least the window, {}, and below 4 GiB)", 1u64 << params.window_bits),
                ));
            }
            *last = Some(params);
            Recipe::ZlibBlocks { params, block }
        }
        5 | 11 => {
            let head_len = r.varint("PNG head length")?;
            let tail_len = r.varint("PNG tail length")?;
            let size = |r: &mut Reader<'_>, what: &'static str| -> Result<u64> {
                let at = r.pos();
                let n = r.varint(what)?;
                if n == 0 || n > u64::from(u32::MAX >> 1) {
                    return Err(PatchError::malformed(what, at, format!("{n} (must be 1 to 2^31-1)")));
                }
                Ok(n)
            };
            let first = if tag == 11 { Some((r.pos(), size(r, "PNG first chunk size")?)) } else { None };
            let chunk_size = size(r, "PNG chunk size")?;
            if let Some((at, first)) = first.filter(|&(_, f)| f == chunk_size) {
                // One form per frame: recipe 5 says this one.
                return Err(PatchError::malformed(
                    "PNG first chunk size",
                    at,
                    format!("{first}, the chunk size (recipe 11 is for a first chunk of another size)"),
                ));
            }
            let first_chunk = first.map_or(chunk_size, |(_, f)| f);
            let h = r.take(2, "PNG zlib header")?;
            let frame = crate::png::PngFrame { head_len, tail_len, chunk_size, first_chunk, zlib_header: [h[0], h[1]] };
            Recipe::Png { frame, inner: Box::new(decode_recipe(r, true, last)?) }
        }
        t => match Deflater::from_tag(t) {
            Some(deflater) => {
                let level_at = r.pos();
                let k = KnownDeflate { deflater, level: r.u8("deflater level")? };
                if !k.is_valid() {
                    return Err(PatchError::malformed(
                        "deflater level",
                        level_at,
                        format!(
                            "{} for recipe {t} ({}): must be {} to {}{}",
                            k.level,
                            deflater.name(),
                            deflater.min_level(),
                            deflater.max_level(),
                            if deflater == Deflater::GoFlate { " (Go's level -2 to 9, + 2)" } else { "" }
                        ),
                    ));
                }
                Recipe::Known(k)
            }
            None => return Err(PatchError::malformed("recipe", at, format!("unknown recipe {t}"))),
        },
    })
}

fn zlib_params(r: &mut Reader<'_>) -> Result<ZlibParams> {
    let at = r.pos();
    let b = r.take(4, "zlib parameters")?;
    let p = ZlibParams { level: b[0], mem_level: b[1], window_bits: b[2], strategy: b[3] };
    if !p.is_valid() {
        return Err(PatchError::malformed("zlib parameters", at, format!("{p:?} out of range")));
    }
    Ok(p)
}

fn decode_member(r: &mut Reader<'_>, base_entries: u64, target_size: u64, limits: &Limits, last: &mut Last) -> Result<Member> {
    let ref_at = r.pos();
    let base_ref = r.varint("member base reference")?;
    let base = if base_ref == 0 {
        None
    } else {
        if base_ref > base_entries {
            return Err(PatchError::malformed(
                "member base reference",
                ref_at,
                format!("base member {} does not exist (base has {base_entries})", base_ref - 1),
            ));
        }
        let mode_at = r.pos();
        let m = r.u8("content mode")?;
        let mode = ContentMode::of_byte(m).ok_or_else(|| PatchError::malformed("content mode", mode_at, format!("unknown mode {m}")))?;
        Some((base_ref - 1, mode))
    };
    let delta = decode_delta(r, base.map(|b| b.1), crate::delta::max_middle(target_size, limits), last)?;
    if base.is_none() && (delta.prefix | delta.base_mid) != 0 {
        return Err(PatchError::malformed("kept prefix", ref_at, "a member without a base keeps nothing"));
    }
    let recipe = decode_recipe(r, false, &mut last.params)?;
    Ok(Member { base, delta, recipe })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Recipe 11 (v2 §3.7): recipe 5 with the first IDAT chunk's size before
    /// the others'; a first size equal to the chunk size, or 0, is malformed.
    #[test]
    fn png_first_chunk_recipe() {
        let params = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let decode = |bytes: &[u8]| decode_recipe(&mut Reader::new(bytes), false, &mut Some(params));
        // head 0, tail 0, first 1000 (e8 07), chunk 4096 (80 20), zlib header 78 9c, inner recipe 6.
        let r = decode(&[11, 0, 0, 0xe8, 0x07, 0x80, 0x20, 0x78, 0x9c, 6]).unwrap();
        let Recipe::Png { frame, inner } = &r else { panic!("{r:?}") };
        assert_eq!((frame.first_chunk, frame.chunk_size, frame.first_differs()), (1000, 4096, true));
        assert_eq!(**inner, Recipe::Zlib(params));
        assert_eq!(r.min_version(), 2);
        let mut w = Writer::default();
        encode_recipe(&mut w, &r, &mut Some(params));
        assert_eq!(w.buf, [11, 0, 0, 0xe8, 0x07, 0x80, 0x20, 0x78, 0x9c, 6]);
        // Chunks of one size are recipe 5, version 1.
        let one = Recipe::Png { frame: crate::png::PngFrame { first_chunk: 4096, ..*frame }, inner: inner.clone() };
        let mut w = Writer::default();
        encode_recipe(&mut w, &one, &mut Some(params));
        assert_eq!(w.buf, [5, 0, 0, 0x80, 0x20, 0x78, 0x9c, 6]);
        assert_eq!(one.min_version(), 1);
        for bad in [&[11u8, 0, 0, 0x80, 0x20, 0x80, 0x20, 0x78, 0x9c, 6][..], &[11, 0, 0, 0, 0x80, 0x20, 0x78, 0x9c, 6]] {
            let e = decode(bad).unwrap_err();
            assert_eq!(e.code(), "malformed", "{e}");
            assert!(e.to_string().contains("PNG first chunk size"), "{e}");
        }
    }
}
