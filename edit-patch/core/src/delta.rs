//! ec-diff: the content delta of one part.
//!
//! A part is usually one long line of XML, so line diffs are useless. The
//! delta first trims the bytes both versions share at the front and at the
//! back (word-at-a-time comparison, so this is memory-speed), then codes the
//! remaining middle of the new version against the middle of the base with
//! zstd, using the base middle as a *reference prefix* (zstd's
//! `--patch-from` mechanism): several distant edits, shifted row numbers and
//! moved blocks all become short matches into the base. A middle of a few
//! bytes is sent literally, since a zstd frame costs a dozen bytes.
//!
//! Frames are written magicless, with no checksum, dictionary id or content
//! size (the patch carries the lengths and the file's SHA-256 already).

use crate::error::{PatchError, Result};
use crate::limits::Limits;
use crate::wire::{Reader, Writer};
use zstd_safe::zstd_sys as zs;
use zstd_safe::{CCtx, CParameter, DCtx, DParameter, FrameFormat};

/// Largest zstd window this format uses (and a decoder accepts): 2^31 bytes.
pub const MAX_WINDOW_LOG: u32 = 31;

/// How the changed middle of a part is coded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Middle {
    /// The new middle, verbatim.
    Literal(Vec<u8>),
    /// A magicless zstd frame of `len` bytes, decoded with the base middle as reference prefix.
    Zstd { len: u64, frame: Vec<u8> },
    /// Version 2 (edit-patch-v2.md §4.2): several replaced ranges of the base
    /// middle, the bytes between them kept. `len` is the new middle's length
    /// (computed, not on the wire); `data` codes the hunks' new bytes, one
    /// after the other: literally, or as a zstd frame whose reference is the
    /// replaced base bytes, one after the other.
    Hunks { len: u64, hunks: Vec<Hunk>, data: Box<Middle> },
    /// Version 2, content mode 6 (edit-patch-v2.md §4.4): new 16 bytes for
    /// some GUID markers of the base's GUID form, which is otherwise kept
    /// (the delta's prefix and replaced length are 0). Its wire form is the
    /// mode's own: no prefix, replaced length or kind.
    GuidSet(crate::guids::GuidSet),
    /// Version 2, content mode 7 (edit-patch-v2.md §4.5): new 16 bytes for
    /// some GUID markers and new values for some numbers of the base's GUID
    /// form, which is otherwise kept (prefix and replaced length 0). Its
    /// wire form is the mode's own ([`write_drift`]).
    Drift(crate::guids::Drift),
    /// Version 2, content mode 8 (edit-patch-v2.md §4.8): the base's named
    /// numbers renumbered by the map, then the content delta. Its wire form is
    /// the map ([`write_renumbering`]), then the delta's own.
    Renumbered(crate::renumber::Renumbering, Box<ContentDelta>),
    /// Version 2, content mode 9 (edit-patch-v2.md §4.9): the numbers of the
    /// base's GUID form set to the values the patch's earlier mode 9 members
    /// taught, then mode 7's changes (which may be none), which teach theirs.
    /// Its wire form is mode 7's ([`write_drift`]). Applied by the patch's
    /// applier, which holds what was learnt, not by [`apply`].
    Mapped(crate::guids::Drift),
    /// Version 2, content mode 10 (edit-patch-v2.md §4.10): mode 9's
    /// changes on the base's GUID form with what the patch learnt, then the
    /// content delta. Its wire form is mode 7's ([`write_drift`]), then the
    /// delta's own. Applied by the patch's applier, as mode 9.
    MappedDelta(crate::guids::Drift, Box<ContentDelta>),
}

/// One replaced range of a [`Middle::Hunks`] middle.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hunk {
    /// Base bytes kept since the end of the previous hunk (or the prefix).
    pub gap: u64,
    /// Base bytes this hunk replaces.
    pub base_len: u64,
    /// New bytes this hunk writes.
    pub new_len: u64,
}

/// Most hunks a middle may have (edit-patch-v2.md §4.2).
pub const MAX_HUNKS: u64 = 1 << 16;

impl Middle {
    /// Length of the new middle.
    pub fn len(&self) -> u64 {
        match self {
            Middle::Literal(b) => b.len() as u64,
            Middle::Zstd { len, .. } | Middle::Hunks { len, .. } => *len,
            Middle::GuidSet(set) => 16 * set.len() as u64,
            Middle::Drift(d) | Middle::Mapped(d) => {
                d.iter().map(|(_, c)| if matches!(c, crate::guids::Change::Guid(_)) { 16 } else { 1 }).sum()
            }
            Middle::Renumbered(_, then) | Middle::MappedDelta(_, then) => then.middle.len(),
        }
    }
    /// Whether the new middle is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Bytes the middle occupies in the patch (its payload).
    pub fn encoded_len(&self) -> u64 {
        match self {
            Middle::Literal(b) => b.len() as u64,
            Middle::Zstd { frame, .. } => frame.len() as u64,
            Middle::Hunks { hunks, data, .. } => {
                let v = |x: u64| u64::from((64 - x.leading_zeros()).max(1).div_ceil(7));
                v(hunks.len() as u64) + hunks.iter().map(|h| v(h.gap) + v(h.base_len) + v(h.new_len)).sum::<u64>() + 1 + data.encoded_len()
            }
            Middle::GuidSet(set) => {
                let v = |x: u64| u64::from((64 - x.leading_zeros()).max(1).div_ceil(7));
                v(set.len() as u64) + set.iter().map(|(skip, _)| v(*skip) + 16).sum::<u64>()
            }
            Middle::Drift(d) | Middle::Mapped(d) => {
                let mut w = Writer::default();
                write_drift(&mut w, d, &mut None, None);
                w.buf.len() as u64
            }
            Middle::Renumbered(map, then) => {
                let mut w = Writer::default();
                write_renumbering(&mut w, map);
                w.buf.len() as u64 + then.middle.encoded_len()
            }
            Middle::MappedDelta(d, then) => {
                let mut w = Writer::default();
                write_drift(&mut w, d, &mut None, None);
                w.buf.len() as u64 + then.middle.encoded_len()
            }
        }
    }
    /// The lowest format version that defines this middle.
    pub fn min_version(&self) -> u8 {
        match self {
            Middle::Hunks { .. }
            | Middle::GuidSet(_)
            | Middle::Drift(_)
            | Middle::Renumbered(..)
            | Middle::Mapped(_)
            | Middle::MappedDelta(..) => 2,
            _ => 1,
        }
    }
}

/// The delta of one part: keep the first `prefix` bytes of the base, replace
/// the `base_mid` bytes after them by the middle, keep the rest of the base.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContentDelta {
    pub prefix: u64,
    pub base_mid: u64,
    pub middle: Middle,
}

/// Length of the common prefix of `a` and `b`.
pub fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let x = u64::from_le_bytes(a[i..i + 8].try_into().unwrap()) ^ u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        if x != 0 {
            return i + (x.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// Length of the common suffix of `a` and `b`.
pub fn common_suffix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let (a, b) = (&a[a.len() - n..], &b[b.len() - n..]);
    let mut i = 0;
    while i + 8 <= n {
        let (ea, eb) = (n - i - 8, n - i);
        let x = u64::from_le_bytes(a[ea..eb].try_into().unwrap()) ^ u64::from_le_bytes(b[ea..eb].try_into().unwrap());
        if x != 0 {
            return i + (x.leading_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[n - 1 - i] == b[n - 1 - i] {
        i += 1;
    }
    i
}

/// zstd level for a middle of `len` bytes: strong where it is cheap, fast where it is not.
fn level_for(len: usize) -> i32 {
    match len {
        0..=65_536 => 19,
        65_537..=1_048_576 => 9,
        _ => 3,
    }
}

fn window_log_for(total: usize) -> u32 {
    let bits = usize::BITS - total.max(1).leading_zeros();
    bits.clamp(10, MAX_WINDOW_LOG)
}

/// Compresses `src` as a magicless zstd frame, with `reference` as prefix (may be empty).
pub fn zstd_compress(src: &[u8], reference: &[u8]) -> Result<Vec<u8>> {
    let total = src.len() + reference.len();
    // The level follows the work: zstd indexes the reference as well as the input.
    compress(src, reference, level_for(total), None, total > (1 << 20))
}

/// Positions level 19's binary-tree match finder keeps (`chainLog` 24: a
/// cycle of 2^23): a reference longer than this needs long-distance matching.
const STRONG_REACH: usize = 1 << 23;

/// Level 19's `targetLength` is 256: the optimal parser stops looking for a
/// longer match once it has one that long. Against a whole file, whose
/// matches into the reference are long, 999 (level 22's value) saves up to
/// a few hundred bytes (250 on a 0.8 MB .docx of the corpus, with `zstd -19
/// --zstd=targetLength=999`) for little time.
const STRONG_TARGET_LENGTH: u32 = 999;

/// Memory [`zstd_compress_strong`] takes for `total` bytes of reference plus
/// input, in bytes: level 19's hash table and binary tree (2^22 and 2^24
/// entries of 4 bytes, fewer for a smaller window: at most 80 MiB), long
/// distance matching's table, and 4 MiB for the rest of the context (an
/// upper estimate: 52 MiB for 2.5 MB, where a whole `diff` peaks at 54 MiB).
pub fn zstd_strong_memory(total: usize) -> u64 {
    let b = window_log_for(total);
    let tables = 4 * ((1u64 << 22.min(b + 1)) + (1u64 << 24.min(b + 1)));
    let ldm = if total > STRONG_REACH { 8u64 << b.saturating_sub(7) } else { 0 };
    tables + ldm + (4 << 20)
}

/// [`zstd_compress`] at zstd's strongest everyday setting whatever the size:
/// level 19 with matches followed further ([`STRONG_TARGET_LENGTH`]), and
/// long-distance matching only when the reference is beyond level 19's reach
/// (below that it costs bytes). About as slow as `zstd -19`: 0.35 to 0.5 s
/// per MB of reference plus input on one core of a loaded Xeon, several
/// times slower than [`zstd_compress`] above 64 KiB. For the generic delta
/// of a whole file, when the structured patch is already large (see `diff`).
/// Memory: [`zstd_strong_memory`]; `ecsync diff` of a 10 MB file against
/// another peaks at 159 MiB with it (77 MiB without).
pub fn zstd_compress_strong(src: &[u8], reference: &[u8]) -> Result<Vec<u8>> {
    let total = src.len() + reference.len();
    compress(src, reference, 19, Some(STRONG_TARGET_LENGTH), total > STRONG_REACH)
}

/// New files at most this large, with at most
/// [`STRONG_ALTERNATIVES_MAX_TOTAL`] of base plus new file, get the
/// [`STRONG_ALTERNATIVES`] tried too: each costs another level-19 pass, about
/// 1 s for 1.6 MB in all on one loaded core. Every corpus pair they bring under
/// the bound has a new file under 1 MB and 2.2 MB in all; a 2 MB .odt
/// (against a 0.9 MB one) gained nothing in 1.6 s.
pub const STRONG_ALTERNATIVES_MAX_NEW: usize = 1 << 20;
/// See [`STRONG_ALTERNATIVES_MAX_NEW`].
pub const STRONG_ALTERNATIVES_MAX_TOTAL: usize = 3 << 20;

/// Other level-19 settings [`zstd_compress_strong_alternatives`] tries, each
/// over [`zstd_compress_strong`]'s. The linked libzstd (1.5.7) makes blocks
/// of mostly incompressible data (a .pptx's images) 10 to 30 bytes larger
/// than the 1.5.4 command line does (`zstd_bound.py` measures against it),
/// up to 200 bytes a file, and no one setting (the block splitters' levels
/// alone least of all) is smaller on every file. Of the 40 corpus pairs that
/// were over `zstd -19 --patch-from` + 64 bytes, one of these is smaller on
/// 21 (each on 6, 9 and 13), and 12 come under the bound
/// (docs/benchmarks.md, `zstd_bound.py`).
const STRONG_ALTERNATIVES: [&[(zs::ZSTD_cParameter, i32)]; 3] = [
    // Matches of 4 bytes and more: fewer literal-costly 3-byte matches in
    // image data (890 bytes less on a 982 kB .pptm).
    &[(zs::ZSTD_cParameter::ZSTD_c_minMatch, 4)],
    // Blocks split before the parser at level 2 of 6
    // (`ZSTD_c_blockSplitterLevel`, auto is 6 at level 19) and after it
    // (`ZSTD_c_splitAfterSequences` on).
    &[
        (zs::ZSTD_cParameter::ZSTD_c_experimentalParam20, 2),
        (zs::ZSTD_cParameter::ZSTD_c_experimentalParam13, zs::ZSTD_ParamSwitch_e::ZSTD_ps_enable as i32),
    ],
    // Literals left uncompressed (`ZSTD_c_literalCompressionMode`): their
    // Huffman tables cost more than they save in JPEG data.
    &[(zs::ZSTD_cParameter::ZSTD_c_experimentalParam5, zs::ZSTD_ParamSwitch_e::ZSTD_ps_disable as i32)],
];

/// Members at least this large (compressed bytes) get a block of their
/// own in [`zstd_compress_strong_alternatives`]'s last tries: image data
/// coded with its own literal tables, not mixed with the XML before it.
pub const OWN_BLOCK_MIN_MEMBER: u64 = 16 << 10;

/// The settings [`zstd_compress_strong_alternatives`] tries with a block
/// ended at each of the large members' bounds: the default, and matches of
/// 4 bytes and more (on a 955 kB .pptx of images and OLE objects, 222
/// bytes smaller than the default with the same blocks).
const OWN_BLOCK_ALTERNATIVES: [&[(zs::ZSTD_cParameter, i32)]; 2] = [&[], &[(zs::ZSTD_cParameter::ZSTD_c_minMatch, 4)]];

/// Where [`zstd_compress_strong_alternatives`]'s last tries end blocks: the
/// start and the end of the compressed data of each member of at least
/// [`OWN_BLOCK_MIN_MEMBER`] bytes, in `new`'s layout. Sorted, inside the file.
pub fn own_block_bounds(layout: &crate::zip::ZipLayout, len: usize) -> Vec<usize> {
    let mut at: Vec<usize> = layout
        .entries
        .iter()
        .filter(|e| e.data_len >= OWN_BLOCK_MIN_MEMBER)
        .flat_map(|e| [e.data_offset, e.data_offset.saturating_add(e.data_len)])
        .filter_map(|o| usize::try_from(o).ok())
        .filter(|&o| o > 0 && o < len)
        .collect();
    at.sort_unstable();
    at.dedup();
    at
}

/// [`zstd_compress_strong`]'s frame made with each of the
/// [`STRONG_ALTERNATIVES`], and with each of the [`OWN_BLOCK_ALTERNATIVES`]
/// and a block ended at each of `bounds` (see [`own_block_bounds`];
/// skipped when empty): the smallest,
/// if it is shorter than `than` bytes (the length of the frame made with
/// the default setting); `None` otherwise. Tried only beside a frame of at
/// least half of `src`, whose content is mostly incompressible (where the
/// alternatives gain: on an 829 kB .docx whose frame is 21 kB, 30-40 bytes
/// for 2 s more), and up to [`STRONG_ALTERNATIVES_MAX_NEW`]. Standard
/// magicless frames like the others: the decoder is the same. For a
/// generic delta that already beats the structured patch (`diff`).
///
/// The blocks at the members' bounds: zstd 1.5.7 splits a file into blocks
/// by its own estimate, and a block that holds the end of one JPEG and the
/// start of the next (or XML) codes both with one literal table. Ended at
/// the large members' bounds, the 526 kB .docx of five stored JPEGs that was
/// 92 bytes over `zstd -19 --patch-from` + 64 is 754 bytes smaller (662 under it now)
/// (docs/benchmarks.md, `zstd_bound.py`); on most files it is larger, and
/// the smallest frame is kept.
pub fn zstd_compress_strong_alternatives(src: &[u8], reference: &[u8], than: usize, bounds: &[usize]) -> Result<Option<Vec<u8>>> {
    let total = src.len() + reference.len();
    if src.len() > STRONG_ALTERNATIVES_MAX_NEW || total > STRONG_ALTERNATIVES_MAX_TOTAL || than < src.len() / 2 {
        return Ok(None);
    }
    let mut best: Option<Vec<u8>> = None;
    let at_bounds: &[&[(zs::ZSTD_cParameter, i32)]] = if bounds.is_empty() { &[] } else { &OWN_BLOCK_ALTERNATIVES };
    let tries = STRONG_ALTERNATIVES.iter().map(|extra| (*extra, &[][..])).chain(at_bounds.iter().map(|extra| (*extra, bounds)));
    for (extra, ends) in tries {
        let frame = compress_raw(src, reference, total, extra, ends)?;
        if frame.len() < best.as_ref().map_or(than, Vec::len) {
            best = Some(frame);
        }
    }
    Ok(best)
}

/// A zstd compression context straight from libzstd: zstd-safe's does not
/// take `ZSTD_c_blockSplitterLevel` (new in 1.5.7).
struct RawCCtx(std::ptr::NonNull<zs::ZSTD_CCtx>);

impl Drop for RawCCtx {
    fn drop(&mut self) {
        // SAFETY: the context came from ZSTD_createCCtx and is freed once.
        unsafe { zs::ZSTD_freeCCtx(self.0.as_ptr()) };
    }
}

/// [`zstd_compress_strong`]'s settings plus `extra`, through libzstd's API;
/// a block ends at each of `ends` (sorted offsets into `src`; flushed there).
fn compress_raw(src: &[u8], reference: &[u8], total: usize, extra: &[(zs::ZSTD_cParameter, i32)], ends: &[usize]) -> Result<Vec<u8>> {
    use zs::ZSTD_cParameter::*;
    let check = |c: usize| -> Result<usize> {
        // SAFETY: ZSTD_isError and ZSTD_getErrorName take any code.
        if unsafe { zs::ZSTD_isError(c) } != 0 {
            let name = unsafe { std::ffi::CStr::from_ptr(zs::ZSTD_getErrorName(c)) };
            return Err(PatchError::codec("zstd compression", name.to_string_lossy()));
        }
        Ok(c)
    };
    // SAFETY: a fresh context (null on allocation failure), owned by `cctx`.
    let raw = unsafe { zs::ZSTD_createCCtx() };
    let cctx = RawCCtx(std::ptr::NonNull::new(raw).ok_or_else(|| PatchError::codec("zstd compression", "no memory for a context"))?);
    let c = cctx.0.as_ptr();
    let params: [(zs::ZSTD_cParameter, i32); 8] = [
        (ZSTD_c_compressionLevel, 19),
        (ZSTD_c_windowLog, window_log_for(total) as i32),
        (ZSTD_c_targetLength, STRONG_TARGET_LENGTH as i32),
        (ZSTD_c_enableLongDistanceMatching, i32::from(total > STRONG_REACH)),
        (ZSTD_c_experimentalParam2, zs::ZSTD_format_e::ZSTD_f_zstd1_magicless as i32),
        (ZSTD_c_contentSizeFlag, 0),
        (ZSTD_c_checksumFlag, 0),
        (ZSTD_c_dictIDFlag, 0),
    ];
    for &(p, v) in params.iter().chain(extra) {
        // SAFETY: `c` is a live context; parameters are plain values.
        check(unsafe { zs::ZSTD_CCtx_setParameter(c, p, v) })?;
    }
    if !reference.is_empty() {
        // SAFETY: `reference` outlives the context, which is used only in this function.
        check(unsafe { zs::ZSTD_CCtx_refPrefix(c, reference.as_ptr().cast(), reference.len()) })?;
    }
    if ends.is_empty() {
        let mut out: Vec<u8> = Vec::with_capacity(zstd_safe::compress_bound(src.len()));
        // SAFETY: `out` has capacity for the bound; libzstd writes at most that
        // many bytes and returns how many it wrote.
        let n = check(unsafe { zs::ZSTD_compress2(c, out.as_mut_ptr().cast(), out.capacity(), src.as_ptr().cast(), src.len()) })?;
        // SAFETY: libzstd initialised the first `n` bytes.
        unsafe { out.set_len(n) };
        return Ok(out);
    }
    // Streamed with a flush at each end, from `src` and into `out` in place
    // (`ZSTD_c_stableInBuffer`, `ZSTD_c_stableOutBuffer`): no window or
    // block buffers beyond one-shot's, and the same tables (the pledged
    // size is the input's, as one-shot's is).
    for (p, v) in [(ZSTD_c_experimentalParam9, 1), (ZSTD_c_experimentalParam10, 1)] {
        // SAFETY: `c` is a live context; parameters are plain values.
        check(unsafe { zs::ZSTD_CCtx_setParameter(c, p, v) })?;
    }
    // SAFETY: as above.
    check(unsafe { zs::ZSTD_CCtx_setPledgedSrcSize(c, src.len() as u64) })?;
    // Each flush may end a block early: 3 bytes of block header more each.
    let mut out: Vec<u8> = Vec::with_capacity(zstd_safe::compress_bound(src.len()) + 3 * (ends.len() + 2));
    let mut output = zs::ZSTD_outBuffer { dst: out.as_mut_ptr().cast(), size: out.capacity(), pos: 0 };
    let mut input = zs::ZSTD_inBuffer { src: src.as_ptr().cast(), size: 0, pos: 0 };
    let stops = ends.iter().copied().filter(|&e| e > 0 && e < src.len()).chain([src.len()]);
    for to in stops {
        if to <= input.size {
            continue;
        }
        input.size = to; // the same buffer, only its size grown (stableInBuffer's condition)
        let directive = if to == src.len() { zs::ZSTD_EndDirective::ZSTD_e_end } else { zs::ZSTD_EndDirective::ZSTD_e_flush };
        loop {
            // SAFETY: `input` and `output` point into `src` and `out`'s
            // allocation, of the sizes given; libzstd advances `pos` within them.
            let left = check(unsafe { zs::ZSTD_compressStream2(c, &mut output, &mut input, directive) })?;
            if left == 0 && input.pos == input.size {
                break;
            }
            if output.pos == output.size {
                return Err(PatchError::codec("zstd compression", "the frame outgrew its bound"));
            }
        }
    }
    // SAFETY: libzstd initialised the first `output.pos` bytes.
    unsafe { out.set_len(output.pos) };
    Ok(out)
}

fn compress(src: &[u8], reference: &[u8], level: i32, target_length: Option<u32>, long: bool) -> Result<Vec<u8>> {
    let zerr = |c: usize| PatchError::codec("zstd compression", zstd_safe::get_error_name(c));
    let mut cctx = CCtx::create();
    let total = src.len() + reference.len();
    cctx.set_parameter(CParameter::CompressionLevel(level)).map_err(zerr)?;
    cctx.set_parameter(CParameter::WindowLog(window_log_for(total))).map_err(zerr)?;
    if let Some(t) = target_length {
        cctx.set_parameter(CParameter::TargetLength(t)).map_err(zerr)?;
    }
    if long {
        cctx.set_parameter(CParameter::EnableLongDistanceMatching(true)).map_err(zerr)?;
    }
    cctx.set_parameter(CParameter::Format(FrameFormat::Magicless)).map_err(zerr)?;
    cctx.set_parameter(CParameter::ContentSizeFlag(false)).map_err(zerr)?;
    cctx.set_parameter(CParameter::ChecksumFlag(false)).map_err(zerr)?;
    cctx.set_parameter(CParameter::DictIdFlag(false)).map_err(zerr)?;
    if !reference.is_empty() {
        cctx.ref_prefix(reference).map_err(zerr)?;
    }
    let mut out = Vec::with_capacity(zstd_safe::compress_bound(src.len()));
    cctx.compress2(&mut out, src).map_err(zerr)?;
    Ok(out)
}

/// Decodes a magicless frame that must produce exactly `len` bytes and use
/// every byte of `frame` (one frame, nothing after it). Memory grows with the
/// output actually produced, not with the declared `len`.
pub fn zstd_decompress(frame: &[u8], reference: &[u8], len: usize, what: &'static str) -> Result<Vec<u8>> {
    let zerr = |c: usize| PatchError::codec(what, format!("zstd: {}", zstd_safe::get_error_name(c)));
    let mut dctx = DCtx::create();
    dctx.set_parameter(DParameter::WindowLogMax(MAX_WINDOW_LOG)).map_err(zerr)?;
    dctx.set_parameter(DParameter::Format(FrameFormat::Magicless)).map_err(zerr)?;
    if !reference.is_empty() {
        dctx.ref_prefix(reference).map_err(zerr)?;
    }
    let mut input = zstd_safe::InBuffer::around(frame);
    let mut out: Vec<u8> = Vec::with_capacity(len.min(1 << 20) + 1);
    loop {
        if out.len() == out.capacity() {
            // Grow towards the declared length, one spare byte to catch overruns.
            let room = (out.capacity().max(1 << 16)).min(len + 1 - out.len().min(len));
            out.reserve(room.max(1));
        }
        let before = out.len();
        let mut output = zstd_safe::OutBuffer::around_pos(&mut out, before);
        let hint = dctx.decompress_stream(&mut output, &mut input).map_err(zerr)?;
        let produced = output.pos();
        if produced > len {
            return Err(PatchError::codec(what, format!("decodes to more than the {len} bytes the patch declares")));
        }
        if hint == 0 {
            if input.pos() != frame.len() {
                return Err(PatchError::codec(what, format!("{} bytes follow the end of the frame", frame.len() - input.pos())));
            }
            if produced != len {
                return Err(PatchError::codec(what, format!("decoded {produced} bytes where the patch declares {len}")));
            }
            return Ok(out);
        }
        if input.pos() == frame.len() && produced == before && produced < out.capacity() {
            return Err(PatchError::codec(what, "the frame ends early"));
        }
    }
}

/// Length of the new middle [`diff`] would code: what is left of `new` once
/// the bytes it shares with `base` at the front and back are trimmed. Cheap
/// (no compression).
pub fn middle_len(base: &[u8], new: &[u8]) -> usize {
    let prefix = common_prefix(base, new);
    new.len() - prefix - common_suffix(&base[prefix..], &new[prefix..])
}

/// Makes the delta that turns `base` into `new` (`base` may be empty).
pub fn diff(base: &[u8], new: &[u8]) -> Result<ContentDelta> {
    let prefix = common_prefix(base, new);
    let suffix = common_suffix(&base[prefix..], &new[prefix..]);
    let new_mid = &new[prefix..new.len() - suffix];
    let base_mid = &base[prefix..base.len() - suffix];
    let literal = || Middle::Literal(new_mid.to_vec());
    let middle = if new_mid.len() <= 24 {
        literal()
    } else {
        let frame = zstd_compress(new_mid, base_mid)?;
        if frame.len() < new_mid.len() {
            Middle::Zstd { len: new_mid.len() as u64, frame }
        } else {
            literal()
        }
    };
    Ok(ContentDelta { prefix: prefix as u64, base_mid: base_mid.len() as u64, middle })
}

/// A zstd middle coded at level 3 ([`level_for`]: past 1 MiB of base and
/// new middle) whose frame is at least this long is coded again by
/// [`strengthen`]: what it saves is then worth another pass.
pub const STRENGTHEN_MIN_FRAME: usize = 16 << 10;

/// The level [`strengthen`] codes `d`'s middle again at, if any, when
/// [`level_for`] codes it at level 3 (past 1 MiB of base and new middle):
/// 19 ([`zstd_compress_strong`]) for at most `strong_max` bytes whose
/// level-19 tables fit `max_memory`, else 12 where its tables fit
/// ([`zstd_level_memory`]: 26 MB for 2 MiB, 51 MB for 8 MiB), up to
/// `max_total`. Only a middle whose frame is at least
/// [`STRENGTHEN_MIN_FRAME`]. (A middle at level 9, 64 KiB to 1 MiB, is
/// left: level 19 saves 5-10 % of it for about 30 times the time, 2.4 s
/// for 21 kB on a .xlsx of 15 such pictures.)
fn strengthen_level(d: &ContentDelta, strong_max: usize, max_total: usize, max_memory: u64) -> Option<i32> {
    let Middle::Zstd { len, frame } = &d.middle else { return None };
    let total = d.base_mid as usize + *len as usize;
    if level_for(total) != 3 || frame.len() < STRENGTHEN_MIN_FRAME || total > max_total {
        None
    } else if total <= strong_max && zstd_strong_memory(total) <= max_memory {
        Some(19)
    } else {
        (zstd_level_memory(12, total) <= max_memory).then_some(12)
    }
}

/// Memory [`strengthen`] takes at `level` (other than 19) for `total` bytes
/// of reference plus input, with the window [`compress`] sets: libzstd's
/// own estimate of one-shot compression
/// (`ZSTD_estimateCCtxSize_usingCParams`), and long-distance matching's
/// table past [`STRONG_REACH`], where it is on.
pub fn zstd_level_memory(level: i32, total: usize) -> u64 {
    let b = window_log_for(total);
    // SAFETY: both take and return plain values.
    let own = unsafe {
        let mut cp = zs::ZSTD_getCParams(level, total as u64, 0);
        cp.windowLog = b;
        zs::ZSTD_estimateCCtxSize_usingCParams(cp) as u64
    };
    own + if total > STRONG_REACH { 8u64 << b.saturating_sub(7) } else { 0 }
}

/// Codes `d`'s zstd middle again at the level [`strengthen_level`] gives and
/// keeps that frame when it is shorter, for a sender that minimises bytes
/// rather than its time (`ecsync diff`'s default, a metered link); returns
/// the level it tried, if any. `base` and `new` are the contents `d` was
/// made from. What it saves, and costs (zstd 1.5 here, one core): an added
/// picture's 4.3 MB of pixels 520 kB at level 3, 475 kB at level 12 (80
/// ms), 431 kB at level 19 (0.6 s); a 7.5 MB `content.xml` 528 kB at level
/// 3, 383 kB at level 12 (0.11 s), 338 kB at level 19 (5 s).
pub fn strengthen(
    base: &[u8],
    new: &[u8],
    d: &mut ContentDelta,
    strong_max: usize,
    max_total: usize,
    max_memory: u64,
) -> Result<Option<i32>> {
    let Some(level) = strengthen_level(d, strong_max, max_total, max_memory) else { return Ok(None) };
    let Middle::Zstd { len, frame } = &mut d.middle else { return Ok(None) };
    let (p, q, n) = (d.prefix as usize, d.base_mid as usize, *len as usize);
    let (src, reference) = (&new[p..p + n], &base[p..p + q]);
    let again = match level {
        19 => zstd_compress_strong(src, reference)?,
        // Long-distance matching only past level 19's reach too: below it,
        // it cost 5 % here (a 7.5 MB `content.xml`: 420 against 399 kB at
        // level 9, 410 against 383 kB at level 12).
        _ => compress(src, reference, level, None, q + n > STRONG_REACH)?,
    };
    if again.len() < frame.len() {
        *frame = again;
    }
    Ok(Some(level))
}

/// [`diff`], and for `version` 2 or more also a delta whose middle is
/// several hunks ([`Middle::Hunks`]), kept when it is smaller.
pub fn diff_version(base: &[u8], new: &[u8], version: u8) -> Result<ContentDelta> {
    let d = diff(base, new)?;
    if version < 2 || d.middle.len() < HUNKS_MIN_MIDDLE {
        return Ok(d);
    }
    let (p, q) = (d.prefix as usize, d.base_mid as usize);
    let (base_mid, new_mid) = (&base[p..p + q], &new[p..p + d.middle.len() as usize]);
    let Some(found) = find_hunks(base_mid, new_mid) else { return Ok(d) };
    let (mut reference, mut data, mut hunks) = (Vec::new(), Vec::new(), Vec::with_capacity(found.len()));
    let (mut bp, mut np) = (0usize, 0usize);
    for &(gap, bl, nl) in &found {
        bp += gap;
        np += gap;
        reference.extend_from_slice(&base_mid[bp..bp + bl]);
        data.extend_from_slice(&new_mid[np..np + nl]);
        hunks.push(Hunk { gap: gap as u64, base_len: bl as u64, new_len: nl as u64 });
        bp += bl;
        np += nl;
    }
    let inner = if data.len() <= 24 {
        Middle::Literal(data)
    } else {
        let frame = zstd_compress(&data, &reference)?;
        if frame.len() < data.len() {
            Middle::Zstd { len: data.len() as u64, frame }
        } else {
            Middle::Literal(data)
        }
    };
    let middle = Middle::Hunks { len: d.middle.len(), hunks, data: Box::new(inner) };
    if middle.encoded_len() >= d.middle.encoded_len() {
        return Ok(d);
    }
    let hunked = ContentDelta { middle, ..d.clone() };
    // The patch compresses its segments together (spec §4.0): a one-range
    // frame may shrink there more than the hunks do. Compare what each would
    // cost compressed (the hunks data is small: this is quick).
    Ok(if d.middle.encoded_len() > 1 << 16 || packed_len(&hunked)? < packed_len(&d)? { hunked } else { d })
}

/// What a delta's wire form costs once compressed with zstd, as the segment
/// section of a patch is (spec §4.0), or plain when that is shorter: for
/// choosing between deltas of one member whose middles code to a few kB.
pub(crate) fn packed_len(d: &ContentDelta) -> Result<usize> {
    let mut w = Writer::default();
    write_wire(&mut w, d);
    Ok(zstd_compress(&w.buf, &[])?.len().min(w.buf.len()))
}

/// A middle shorter than this is coded whole: hunks would not pay.
const HUNKS_MIN_MIDDLE: u64 = 256;
/// Bytes that must agree for the hunk search to take base and new as back in step.
const HUNK_SYNC: usize = 32;
/// How far (in either) the hunk search looks for the next agreement.
const HUNK_WINDOW: usize = 4096;
/// Most hunks the encoder writes; more, and the whole middle is coded.
const HUNKS_MAX_FOUND: usize = 256;

/// Splits two middles that differ at both ends into hunks (gap, base length,
/// new length) that end exactly at both ends, or `None` when the changes are
/// not a few scattered ones. Greedy: from a difference, the nearest
/// [`HUNK_SYNC`] new bytes that occur within [`HUNK_WINDOW`] of the base
/// end the hunk ([`nearest_sync`]). Time: O(hunks × window).
fn find_hunks(b: &[u8], n: &[u8]) -> Option<Vec<(usize, usize, usize)>> {
    let (mut pb, mut pn, mut gap) = (0usize, 0usize, 0usize);
    let mut out = Vec::new();
    let mut grams = Grams::default();
    loop {
        if out.len() >= HUNKS_MAX_FOUND {
            return None;
        }
        let Some((sb, sn)) = nearest_sync(b, n, pb, pn, &mut grams) else {
            // The rest is one last hunk, if it is short.
            if b.len() - pb <= HUNK_WINDOW && n.len() - pn <= HUNK_WINDOW {
                out.push((gap, b.len() - pb, n.len() - pn));
                return Some(out);
            }
            return None;
        };
        out.push((gap, sb - pb, sn - pn));
        let e = common_prefix(&b[sb..], &n[sn..]);
        (pb, pn, gap) = (sb + e, sn + e, e);
        if pb == b.len() && pn == n.len() {
            return Some(out);
        }
    }
}

/// The agreement of [`find_hunks`] after a difference at `pb` in the base and
/// `pn` in the new middle: the positions (i, j), i within [`HUNK_WINDOW`] of
/// `pb` and j of `pn`, where [`HUNK_SYNC`] bytes agree, that replace the
/// fewest bytes in all (i - pb + j - pn; the first one found may sit rows
/// away in a repetitive part), the smallest j among equals.
///
/// Near agreements (a changed pixel or digit) are found by comparing along
/// the anti-diagonals of growing cost, up to [`DIAGONAL_MAX`]; farther ones
/// by the first occurrence of each base gram in the window, hashed
/// ([`nearest_sync_hashed`]). Both give the same answer.
fn nearest_sync<'b>(b: &'b [u8], n: &[u8], pb: usize, pn: usize, grams: &mut Grams<'b>) -> Option<(usize, usize)> {
    // Exclusive bounds of where an agreement may start.
    let bmax = (pb + HUNK_WINDOW).min(b.len()).saturating_sub(HUNK_SYNC - 1);
    let nmax = (pn + HUNK_WINDOW).min(n.len()).saturating_sub(HUNK_SYNC - 1);
    if bmax <= pb || nmax <= pn {
        return None;
    }
    for cost in 0..=DIAGONAL_MAX {
        for dj in cost.saturating_sub(bmax - pb - 1)..=cost.min(nmax - pn - 1) {
            let (i, j) = (pb + cost - dj, pn + dj);
            if b[i..i + HUNK_SYNC] == n[j..j + HUNK_SYNC] {
                return Some((i, j));
            }
        }
    }
    nearest_sync_hashed(b, n, pb, pn, grams)
}

/// Farthest cost [`nearest_sync`] looks along the diagonals: (257 × 258) / 2
/// comparisons at most, most of them ended by their first bytes, against
/// hashing the 4,065 grams of a window.
const DIAGONAL_MAX: usize = 256;

/// [`nearest_sync`] by a table of the first position of each base gram in the window.
fn nearest_sync_hashed<'b>(b: &'b [u8], n: &[u8], pb: usize, pn: usize, grams: &mut Grams<'b>) -> Option<(usize, usize)> {
    grams.clear();
    let bend = (pb + HUNK_WINDOW).min(b.len());
    let mut k = pb;
    while k + HUNK_SYNC <= bend {
        grams.entry(&b[k..k + HUNK_SYNC]).or_insert(k);
        k += 1;
    }
    let nend = (pn + HUNK_WINDOW).min(n.len());
    let mut sync: Option<(usize, usize)> = None;
    for j in pn..nend.saturating_sub(HUNK_SYNC - 1).max(pn) {
        if sync.is_some_and(|(i, jj)| j - pn >= i - pb + jj - pn) {
            break;
        }
        if let Some(&i) = grams.get(&n[j..j + HUNK_SYNC]) {
            if sync.is_none_or(|(bi, bj)| i - pb + j - pn < bi - pb + bj - pn) {
                sync = Some((i, j));
            }
        }
    }
    sync
}

/// Base grams ([`HUNK_SYNC`] bytes) to their first position in a window.
type Grams<'b> = std::collections::HashMap<&'b [u8], usize, std::hash::BuildHasherDefault<GramHasher>>;

/// A fast hash of a gram, a word at a time (the standard SipHash was a
/// tenth of a diff's time where the search ran over a thumbnail's pixels).
/// Only speed depends on it: the table compares the grams themselves.
#[derive(Default)]
struct GramHasher(u64);

impl std::hash::Hasher for GramHasher {
    fn write(&mut self, bytes: &[u8]) {
        for c in bytes.chunks(8) {
            let mut w = [0u8; 8];
            w[..c.len()].copy_from_slice(c);
            self.0 = (self.0.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
    }
    fn finish(&self) -> u64 {
        // murmur3's finaliser: every bit of the state reaches the low bits
        // (the table's index) and the high ones (its tags).
        let mut x = self.0;
        x ^= x >> 33;
        x = x.wrapping_mul(0xff51_afd7_ed55_8ccd);
        x ^= x >> 33;
        x = x.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
        x ^ (x >> 33)
    }
}

/// Rebuilds the new content from `base` and `delta`, within `limits`.
pub fn apply(base: &[u8], delta: &ContentDelta, limits: &Limits) -> Result<Vec<u8>> {
    apply_owned(base.to_vec(), delta, limits)
}

/// Writes a delta in its wire form (spec §4.2): kept prefix, replaced
/// base length, middle kind, then the literal bytes or the zstd middle's
/// length and frame.
pub(crate) fn write_wire(w: &mut Writer, d: &ContentDelta) {
    if let Middle::GuidSet(set) = &d.middle {
        // Content mode 6's own fields (v2 §4.4).
        write_guid_set(w, set, None);
        return;
    }
    if let Middle::Drift(drift) = &d.middle {
        // Content mode 7's own fields, an amount written out in full.
        write_drift(w, drift, &mut None, None);
        return;
    }
    if let Middle::Renumbered(map, then) = &d.middle {
        // Content mode 8's map, then the delta's fields.
        write_renumbering(w, map);
        write_wire(w, then);
        return;
    }
    if let Middle::MappedDelta(drift, then) = &d.middle {
        // Content mode 10's changes, an amount written out in full, then the delta's fields.
        write_drift(w, drift, &mut None, None);
        write_wire(w, then);
        return;
    }
    w.varint(d.prefix);
    w.varint(d.base_mid);
    match &d.middle {
        Middle::GuidSet(_) | Middle::Drift(_) | Middle::Renumbered(..) | Middle::Mapped(_) | Middle::MappedDelta(..) => {}
        Middle::Literal(b) => {
            w.u8(0);
            w.blob(b);
        }
        Middle::Zstd { len, frame } => {
            w.u8(1);
            w.varint(*len);
            w.blob(frame);
        }
        Middle::Hunks { hunks, data, .. } => {
            w.u8(2);
            w.varint(hunks.len() as u64);
            for h in hunks {
                w.varint(h.gap);
                w.varint(h.base_len);
                w.varint(h.new_len);
            }
            match &**data {
                Middle::Literal(b) => {
                    w.u8(0);
                    w.blob(b);
                }
                Middle::Zstd { frame, .. } => {
                    w.u8(1);
                    w.blob(frame);
                }
                Middle::Hunks { .. }
                | Middle::GuidSet(_)
                | Middle::Drift(_)
                | Middle::Renumbered(..)
                | Middle::Mapped(_)
                | Middle::MappedDelta(..) => {
                    unreachable!("hunks hold a literal or zstd middle")
                }
            }
        }
    }
}

/// Reads a delta in its wire form. A zstd middle may declare at most
/// `max_mid` bytes (the part-size limit, and the expansion bound of the file).
pub(crate) fn read_wire(r: &mut Reader<'_>, max_mid: u64) -> Result<ContentDelta> {
    let prefix = r.varint("kept prefix")?;
    let base_mid = r.varint("replaced base length")?;
    let mk_at = r.pos();
    let middle = match r.u8("middle kind")? {
        0 => Middle::Literal(r.blob("literal middle")?.to_vec()),
        1 => {
            let len = r.varint("zstd middle length")?;
            Limits::check("declared middle of a part", len, max_mid)?;
            Middle::Zstd { len, frame: r.blob("zstd middle")?.to_vec() }
        }
        2 => read_hunks(r, base_mid, max_mid)?,
        k => return Err(PatchError::malformed("middle kind", mk_at, format!("unknown kind {k}"))),
    };
    Ok(ContentDelta { prefix, base_mid, middle })
}

/// Reads content mode 6's fields (edit-patch-v2.md §4.4) as a delta, its
/// GUIDs from where `tail` says (with a tail, a GUID takes one byte of the
/// section at least, its skip, and 16 of the tail).
pub(crate) fn read_guid_set(r: &mut Reader<'_>, mut tail: Option<&mut GuidTail>) -> Result<ContentDelta> {
    let at = r.pos();
    let n = r.varint("GUID count")?;
    let most = match &tail {
        Some(t) => (r.remaining() as u64).min(t.left()),
        None => r.remaining() as u64 / 17,
    };
    if n == 0 || n > most {
        return Err(PatchError::malformed("GUID count", at, format!("{n} GUIDs (1 to {most}, from the {} bytes left)", r.remaining())));
    }
    let mut set = Vec::with_capacity(n as usize);
    let mut index: Option<u64> = None;
    for _ in 0..n {
        let skip_at = r.pos();
        let skip = r.varint("GUIDs skipped")?;
        index = crate::guids::next_index(index, skip);
        if index.is_none() {
            return Err(PatchError::malformed("GUIDs skipped", skip_at, "a GUID index of 2^64 or more"));
        }
        let guid = get_guid(r, tail.as_deref_mut())?;
        set.push((skip, guid));
    }
    Ok(ContentDelta { prefix: 0, base_mid: 0, middle: Middle::GuidSet(set) })
}

/// Where the new 16 bytes of the GUIDs of content modes 6, 7, 9 and 10 go: into
/// the segment section where they stand, or into the patch's GUID tail
/// (edit-patch-v2.md §2, flag bit 2, GUIDS_APART), one after the other.
#[derive(Debug, Default)]
pub(crate) struct GuidTail {
    pub bytes: Vec<u8>,
    pub at: usize,
}

impl GuidTail {
    /// The next 16 bytes of the tail.
    fn take(&mut self) -> Result<[u8; 16]> {
        let g = self.bytes.get(self.at..self.at + 16).ok_or(PatchError::Truncated { what: "GUID tail", offset: self.at })?;
        self.at += 16;
        Ok(g.try_into().expect("16 bytes"))
    }
    /// GUIDs left in the tail.
    fn left(&self) -> u64 {
        ((self.bytes.len() - self.at) / 16) as u64
    }
}

/// Writes a GUID's 16 bytes where `tail` says.
fn put_guid(w: &mut Writer, g: &[u8; 16], tail: Option<&mut Vec<u8>>) {
    match tail {
        Some(t) => t.extend_from_slice(g),
        None => w.bytes(g),
    }
}

/// Reads a GUID's 16 bytes from where `tail` says.
fn get_guid(r: &mut Reader<'_>, tail: Option<&mut GuidTail>) -> Result<[u8; 16]> {
    match tail {
        Some(t) => t.take(),
        None => Ok(r.take(16, "new GUID")?.try_into().expect("16 bytes")),
    }
}

/// Writes content mode 6's fields (edit-patch-v2.md §4.4), its GUIDs where `tail` says.
pub(crate) fn write_guid_set(w: &mut Writer, set: &crate::guids::GuidSet, mut tail: Option<&mut Vec<u8>>) {
    w.varint(set.len() as u64);
    for (skip, guid) in set {
        w.varint(*skip);
        put_guid(w, guid, tail.as_deref_mut());
    }
}

/// Zigzag form of a nonzero amount: 1, 2, 3, 4 for -1, 1, -2, 2.
fn zigzag(d: i64) -> u64 {
    ((d << 1) ^ (d >> 63)) as u64
}

/// The amount of a zigzag form: [`zigzag`] undone.
fn unzigzag(a: u64) -> i64 {
    ((a >> 1) as i64) ^ -((a & 1) as i64)
}

/// Writes content mode 7's fields (edit-patch-v2.md §4.5): the number of
/// changes, then each change's head (tokens skipped × 2, plus 1 for a
/// GUID) and its 16 bytes or its amount. An amount equal to `last`, the
/// amount of the patch's previous number change, is written as 0; `last`
/// is updated. GUIDs go where `tail` says.
pub(crate) fn write_drift(w: &mut Writer, drift: &crate::guids::Drift, last: &mut Option<i64>, mut tail: Option<&mut Vec<u8>>) {
    use crate::guids::Change;
    w.varint(drift.len() as u64);
    for (skip, change) in drift {
        match change {
            Change::Guid(g) => {
                w.varint(skip << 1 | 1);
                put_guid(w, g, tail.as_deref_mut());
            }
            Change::Number(d) => {
                w.varint(skip << 1);
                w.varint(if *last == Some(*d) { 0 } else { zigzag(*d) });
                *last = Some(*d);
            }
        }
    }
}

/// Reads content mode 7's fields as a delta (edit-patch-v2.md §4.5);
/// `last` is the amount of the patch's previous number change, and is
/// updated. GUIDs come from where `tail` says (with a tail, a GUID change
/// takes one byte of the section, its head).
///
/// `changes` counts the patch's mode 7 changes read so far, at most `max`
/// (`max_segments`): a change is 1-2 bytes of the section and 32 in memory.
/// `least` is the fewest changes the mode allows (1 for mode 7, 0 for mode 9's).
pub(crate) fn read_drift(
    r: &mut Reader<'_>,
    last: &mut Option<i64>,
    mut tail: Option<&mut GuidTail>,
    changes: &mut u64,
    max: u64,
    least: u64,
) -> Result<ContentDelta> {
    use crate::guids::Change;
    let at = r.pos();
    let n = r.varint("change count")?;
    let most = if tail.is_some() { r.remaining() as u64 } else { r.remaining() as u64 / 2 };
    if n < least || n > most {
        return Err(PatchError::malformed(
            "change count",
            at,
            format!("{n} changes ({least} to {most}, from the {} bytes left)", r.remaining()),
        ));
    }
    *changes = changes.saturating_add(n);
    Limits::check("mode 7 changes in the patch", *changes, max)?;
    let mut drift = Vec::with_capacity(n as usize);
    let mut index: Option<u64> = None;
    for _ in 0..n {
        let head_at = r.pos();
        let head = r.varint("change head")?;
        let skip = head >> 1;
        index = crate::guids::next_index(index, skip);
        if index.is_none() {
            return Err(PatchError::malformed("change head", head_at, "a token index of 2^64 or more"));
        }
        let change = if head & 1 == 1 {
            Change::Guid(get_guid(r, tail.as_deref_mut())?)
        } else {
            let a_at = r.pos();
            let d = match r.varint("amount")? {
                0 => last.ok_or_else(|| PatchError::malformed("amount", a_at, "the last amount, before any number change"))?,
                a => unzigzag(a),
            };
            *last = Some(d);
            Change::Number(d)
        };
        drift.push((skip, change));
    }
    Ok(ContentDelta { prefix: 0, base_mid: 0, middle: Middle::Drift(drift) })
}

/// Writes content mode 8's map (edit-patch-v2.md §4.8.2): the number of
/// names, then each name's length, letters and pairs (the gap since the
/// previous old number, and the zigzag move to the new one).
pub(crate) fn write_renumbering(w: &mut Writer, map: &crate::renumber::Renumbering) {
    w.varint(map.len() as u64);
    for (name, pairs) in map {
        w.u8(name.len() as u8);
        w.bytes(name);
        w.varint(pairs.len() as u64);
        write_pairs(w, pairs);
    }
}

/// Pairs of old and new numbers (mode 8's, §4.8.2):
/// the gap since the previous old number, and the zigzag move to the new one.
fn write_pairs(w: &mut Writer, pairs: &[(u64, u64)]) {
    let mut prev: Option<u64> = None;
    for &(from, to) in pairs {
        w.varint(prev.map_or(from, |p| from - p - 1));
        w.varint(zigzag((to as i128 - from as i128) as i64));
        prev = Some(from);
    }
}

/// Reads `p` pairs as [`write_pairs`] writes them (old numbers in
/// increasing order, below 10^19; moves not 0, to 0 to 10^19 - 1).
fn read_pairs(r: &mut Reader<'_>, p: u64) -> Result<Vec<(u64, u64)>> {
    use crate::renumber::NUMBER_END;
    let mut pairs = Vec::with_capacity(p as usize);
    let mut prev: Option<u64> = None;
    for _ in 0..p {
        let gap_at = r.pos();
        let gap = r.varint("old number gap")?;
        let from = crate::guids::next_index(prev, gap).filter(|&f| f < NUMBER_END);
        let Some(from) = from else {
            return Err(PatchError::malformed("old number gap", gap_at, "an old number of 10^19 or more"));
        };
        let move_at = r.pos();
        let mv = r.varint("number move")?;
        let d = unzigzag(mv);
        let to = i128::from(from) + i128::from(d);
        if mv == 0 || to < 0 || to >= i128::from(NUMBER_END) {
            return Err(PatchError::malformed("number move", move_at, "a move of 0, or to below 0 or to 10^19 or more"));
        }
        pairs.push((from, to as u64));
        prev = Some(from);
    }
    Ok(pairs)
}

/// Reads content mode 9's fields (edit-patch-v2.md §4.9.1): mode 7's
/// changes, which may be none, read as [`read_drift`] reads them.
pub(crate) fn read_mapped(
    r: &mut Reader<'_>,
    last: &mut Option<i64>,
    tail: Option<&mut GuidTail>,
    changes: &mut u64,
    max: u64,
) -> Result<ContentDelta> {
    let d = read_drift(r, last, tail, changes, max, 0)?;
    let Middle::Drift(drift) = d.middle else { unreachable!("read_drift reads a drift") };
    Ok(ContentDelta { prefix: 0, base_mid: 0, middle: Middle::Mapped(drift) })
}

/// Reads content mode 8's map (edit-patch-v2.md §4.8.2). `changes` counts
/// the pairs and mode 7 changes read so far in the patch, at most `max`
/// (`max_segments`).
pub(crate) fn read_renumbering(r: &mut Reader<'_>, changes: &mut u64, max: u64) -> Result<crate::renumber::Renumbering> {
    use crate::renumber::MAX_NAME;
    let at = r.pos();
    let m = r.varint("name count")?;
    if m == 0 || m > r.remaining() as u64 / 4 {
        return Err(PatchError::malformed(
            "name count",
            at,
            format!("{m} names (1 to {}, from the {} bytes left)", r.remaining() / 4, r.remaining()),
        ));
    }
    let mut map: crate::renumber::Renumbering = Vec::with_capacity(m as usize);
    for _ in 0..m {
        let len_at = r.pos();
        let len = r.u8("name length")?;
        if len == 0 || usize::from(len) > MAX_NAME {
            return Err(PatchError::malformed("name length", len_at, format!("{len} letters (1 to {MAX_NAME})")));
        }
        let name_at = r.pos();
        let name = r.take(usize::from(len), "name")?.to_vec();
        if !name.iter().all(u8::is_ascii_alphabetic) {
            return Err(PatchError::malformed("name", name_at, "a byte that is not an ASCII letter"));
        }
        if map.last().is_some_and(|(prev, _)| *prev >= name) {
            return Err(PatchError::malformed("name", name_at, "names not in increasing order"));
        }
        let p_at = r.pos();
        let p = r.varint("pair count")?;
        if p == 0 || p > r.remaining() as u64 / 2 {
            return Err(PatchError::malformed(
                "pair count",
                p_at,
                format!("{p} pairs (1 to {}, from the {} bytes left)", r.remaining() / 2, r.remaining()),
            ));
        }
        *changes = changes.saturating_add(p);
        Limits::check("mode 7 changes and mode 8 pairs in the patch", *changes, max)?;
        map.push((name, read_pairs(r, p)?));
    }
    Ok(map)
}

/// Reads a [`Middle::Hunks`] after its kind byte (edit-patch-v2.md §4.2).
fn read_hunks(r: &mut Reader<'_>, base_mid: u64, max_mid: u64) -> Result<Middle> {
    let at = r.pos();
    let count = r.varint("hunk count")?;
    if count == 0 || count > MAX_HUNKS || count > r.remaining() as u64 / 3 {
        return Err(PatchError::malformed("hunk count", at, format!("{count} hunks (1 to {MAX_HUNKS}, 3 bytes each at least)")));
    }
    let (mut spanned, mut new_total) = (0u64, 0u64);
    let mut hunks = Vec::with_capacity(count as usize);
    for _ in 0..count {
        let at = r.pos();
        let h = Hunk { gap: r.varint("hunk gap")?, base_len: r.varint("hunk base length")?, new_len: r.varint("hunk new length")? };
        spanned = spanned
            .checked_add(h.gap)
            .and_then(|x| x.checked_add(h.base_len))
            .filter(|&x| x <= base_mid)
            .ok_or_else(|| PatchError::malformed("hunk", at, format!("the hunks span more than the {base_mid} replaced base bytes")))?;
        new_total = new_total.saturating_add(h.new_len);
        Limits::check("declared middle of a part", new_total, max_mid)?;
        hunks.push(h);
    }
    let len = base_mid - hunks.iter().map(|h| h.base_len).sum::<u64>() + new_total;
    Limits::check("declared middle of a part", len, max_mid)?;
    let kind_at = r.pos();
    let data = match r.u8("hunk data kind")? {
        0 => {
            let b = r.blob("hunk data")?;
            if b.len() as u64 != new_total {
                return Err(PatchError::malformed("hunk data", kind_at, format!("{} bytes where the hunks write {new_total}", b.len())));
            }
            Middle::Literal(b.to_vec())
        }
        1 => Middle::Zstd { len: new_total, frame: r.blob("hunk data")?.to_vec() },
        k => return Err(PatchError::malformed("hunk data kind", kind_at, format!("unknown kind {k}"))),
    };
    Ok(Middle::Hunks { len, hunks, data: Box::new(data) })
}

/// The largest middle a patch for a `target_size`-byte file may declare.
pub(crate) fn max_middle(target_size: u64, limits: &Limits) -> u64 {
    limits.max_part_size.min(target_size.saturating_mul(limits.max_expansion_ratio).saturating_add(1 << 16))
}

/// [`apply`] on a base the caller gives up: the new middle is spliced into
/// the base's buffer in place, so a large part is held once, not twice.
pub fn apply_owned(mut base: Vec<u8>, delta: &ContentDelta, limits: &Limits) -> Result<Vec<u8>> {
    let kept = delta.prefix.checked_add(delta.base_mid).filter(|&k| k <= base.len() as u64);
    let Some(kept) = kept else {
        return Err(PatchError::malformed(
            "content delta",
            0,
            format!("replaces bytes {}..{}+{} of a {}-byte base part", delta.prefix, delta.prefix, delta.base_mid, base.len()),
        ));
    };
    if let Middle::GuidSet(set) = &delta.middle {
        // Content mode 6: the base is a GUID form, kept but for the payloads named.
        crate::guids::replace(&mut base, set).map_err(|e| match e {
            crate::guids::GuidsError::Invalid(at, why) => PatchError::malformed("GUID set", at, why),
            crate::guids::GuidsError::TooLong => PatchError::malformed("GUID set", 0, "longer than the base"),
        })?;
        return Ok(base);
    }
    if let Middle::Renumbered(map, then) = &delta.middle {
        // Content mode 8: the base renumbered, then the content delta.
        let renumbered = crate::renumber::renumber(&base, map, limits.max_part_size).ok_or(PatchError::LimitExceeded {
            what: "part size after the renumbering",
            value: limits.max_part_size + 1,
            limit: limits.max_part_size,
        })?;
        if matches!(
            then.middle,
            Middle::GuidSet(_) | Middle::Drift(_) | Middle::Renumbered(..) | Middle::Mapped(_) | Middle::MappedDelta(..)
        ) {
            return Err(PatchError::malformed("renumbered names", 0, "a renumbering's delta of another mode"));
        }
        return apply_owned(renumbered, then, limits);
    }
    let drift = match &delta.middle {
        Middle::Drift(drift) => drift,
        Middle::Mapped(_) | Middle::MappedDelta(..) => {
            return Err(PatchError::malformed("changed tokens", 0, "mode 9 or 10 outside a patch's applier"))
        }
        _ => return splice(base, delta, kept as usize, limits),
    };
    // Content mode 7: the base is a GUID form, kept but for the tokens named.
    let bound = limits.max_part_size.saturating_mul(2);
    crate::guids::apply_drift(&base, drift, bound).map_err(|e| changed_tokens_error(e, bound))
}

/// The error of a mode 7, 9 or 10 member whose changes do not fit its base
/// (`malformed`), or whose GUID form grows past `bound` (`limit_exceeded`).
pub(crate) fn changed_tokens_error(e: crate::guids::GuidsError, bound: u64) -> PatchError {
    match e {
        crate::guids::GuidsError::Invalid(at, why) => PatchError::malformed("changed tokens", at, why),
        crate::guids::GuidsError::TooLong => {
            PatchError::LimitExceeded { what: "GUID form after its changes", value: bound + 1, limit: bound }
        }
    }
}

/// The content delta of v1 §4.2.3 on `base`, in place: the `suffix_at` bytes
/// up to the middle's end kept around the new middle.
fn splice(mut base: Vec<u8>, delta: &ContentDelta, suffix_at: usize, limits: &Limits) -> Result<Vec<u8>> {
    let p = delta.prefix as usize;
    let new_len = delta.prefix + delta.middle.len() + (base.len() - suffix_at) as u64;
    Limits::check("part size", new_len, limits.max_part_size)?;
    let middle = match &delta.middle {
        Middle::Literal(b) => b.clone(),
        Middle::Zstd { len, frame } => zstd_decompress(frame, &base[p..suffix_at], *len as usize, "zstd middle of a part")?,
        Middle::Hunks { hunks, data, .. } => apply_hunks(&base[p..suffix_at], hunks, data)?,
        Middle::GuidSet(_) | Middle::Drift(_) | Middle::Renumbered(..) | Middle::Mapped(_) | Middle::MappedDelta(..) => {
            return Err(PatchError::malformed("GUID set", 0, "a GUID set with a kept prefix"))
        }
    };
    let (old_len, old_mid) = (base.len(), suffix_at - p);
    if middle.len() > old_mid {
        base.resize(old_len + middle.len() - old_mid, 0);
        base.copy_within(suffix_at..old_len, p + middle.len());
    } else {
        base.copy_within(suffix_at..old_len, p + middle.len());
        base.truncate(old_len - (old_mid - middle.len()));
    }
    base[p..p + middle.len()].copy_from_slice(&middle);
    Ok(base)
}

/// The new middle of a [`Middle::Hunks`] over the base middle `b`.
fn apply_hunks(b: &[u8], hunks: &[Hunk], data: &Middle) -> Result<Vec<u8>> {
    let bad = |why: String| PatchError::malformed("hunk", 0, why);
    // The replaced base bytes, one after the other: the zstd data's reference.
    let mut at = 0usize;
    let mut ranges = Vec::with_capacity(hunks.len());
    for h in hunks {
        let start = at.checked_add(h.gap as usize).filter(|&s| s <= b.len()).ok_or_else(|| bad("a hunk past the base middle".into()))?;
        let end =
            start.checked_add(h.base_len as usize).filter(|&e| e <= b.len()).ok_or_else(|| bad("a hunk past the base middle".into()))?;
        ranges.push((at, start, end));
        at = end;
    }
    let total: u64 = hunks.iter().map(|h| h.new_len).sum();
    let new_bytes = match data {
        Middle::Literal(x) if x.len() as u64 == total => x.clone(),
        Middle::Literal(x) => return Err(bad(format!("{} bytes of hunk data where the hunks write {total}", x.len()))),
        Middle::Zstd { frame, .. } => {
            let reference: Vec<u8> = ranges.iter().flat_map(|&(_, s, e)| b[s..e].iter().copied()).collect();
            zstd_decompress(frame, &reference, total as usize, "zstd hunks of a part")?
        }
        Middle::Hunks { .. }
        | Middle::GuidSet(_)
        | Middle::Drift(_)
        | Middle::Renumbered(..)
        | Middle::Mapped(_)
        | Middle::MappedDelta(..) => return Err(bad("hunks inside hunks".into())),
    };
    let mut out = Vec::with_capacity(b.len() - ranges.iter().map(|&(_, s, e)| e - s).sum::<usize>() + new_bytes.len());
    let mut np = 0usize;
    for (h, &(kept_from, s, e)) in hunks.iter().zip(&ranges) {
        out.extend_from_slice(&b[kept_from..s]);
        out.extend_from_slice(&new_bytes[np..np + h.new_len as usize]);
        np += h.new_len as usize;
        let _ = e;
    }
    out.extend_from_slice(&b[at..]);
    Ok(out)
}

/// A standalone content delta (ec-diff of one part), as bytes: its wire form.
pub fn encode(d: &ContentDelta) -> Vec<u8> {
    let mut w = Writer::default();
    write_wire(&mut w, d);
    w.buf
}

/// Decodes a standalone content delta and applies it to `base`.
pub fn decode_and_apply(base: &[u8], bytes: &[u8], limits: &Limits) -> Result<Vec<u8>> {
    let mut r = Reader::new(bytes);
    let d = read_wire(&mut r, limits.max_part_size)?;
    if r.remaining() != 0 {
        return Err(PatchError::malformed("end of delta", r.pos(), format!("{} trailing bytes", r.remaining())));
    }
    // The standalone ec-diff (protocol CB DELTA) is version 1's: no hunks.
    if d.middle.min_version() > 1 {
        return Err(PatchError::malformed("middle kind", 0, "hunks (kind 2) are edit-patch version 2's, not a standalone delta's"));
    }
    apply(base, &d, limits)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A middle past 1 MiB whose level-3 frame is 16 KiB or more: level 19
    /// within `strong_max` and the memory budget, else level 12 where its
    /// tables fit, else left at level 3; smaller middles and short frames
    /// are left as they are. `strengthen` keeps a frame only when shorter,
    /// and the delta still decodes to the new content.
    #[test]
    fn strengthen_picks_its_level_within_the_bounds() {
        let zstd = |len: usize, frame: usize| ContentDelta {
            prefix: 0,
            base_mid: 0,
            middle: Middle::Zstd { len: len as u64, frame: vec![0; frame] },
        };
        let (big, frame) = (2 << 20, STRENGTHEN_MIN_FRAME);
        let (strong, twelve) = (zstd_strong_memory(big), zstd_level_memory(12, big));
        assert!(twelve < strong, "level 12 takes {twelve} B, level 19 {strong} B");
        assert_eq!(strengthen_level(&zstd(big, frame), big, usize::MAX, strong), Some(19));
        assert_eq!(strengthen_level(&zstd(big, frame), big - 1, usize::MAX, strong), Some(12));
        assert_eq!(strengthen_level(&zstd(big, frame), big, usize::MAX, strong - 1), Some(12));
        assert_eq!(strengthen_level(&zstd(big, frame), big, usize::MAX, twelve - 1), None);
        assert_eq!(strengthen_level(&zstd(big, frame), big, big - 1, u64::MAX), None);
        assert_eq!(strengthen_level(&zstd(big, frame - 1), big, usize::MAX, u64::MAX), None);
        assert_eq!(strengthen_level(&zstd(1 << 20, frame), usize::MAX, usize::MAX, u64::MAX), None, "level 9's range");
        assert!(zstd_level_memory(12, 16 << 20) > zstd_level_memory(12, 8 << 20), "long-distance matching's table past 8 MiB");

        // Pixel-like content: level 3 leaves more than level 19 does.
        let mut x = 1u32;
        let new: Vec<u8> = (0..(1usize << 20) + 4096)
            .map(|i| {
                x = x.wrapping_mul(1_103_515_245).wrapping_add(12_345);
                ((i % 1024) as u8 / 4).wrapping_add((x >> 28) as u8)
            })
            .collect();
        let mut d = diff(&[], &new).unwrap();
        let before = d.middle.encoded_len();
        assert_eq!(strengthen(&[], &new, &mut d, usize::MAX, usize::MAX, u64::MAX).unwrap(), Some(19));
        assert!(d.middle.encoded_len() < before, "{} against {before} bytes", d.middle.encoded_len());
        let Middle::Zstd { frame, .. } = &d.middle else { panic!("a zstd middle") };
        assert_eq!(zstd_decompress(frame, &[], new.len(), "test").unwrap(), new);
    }

    fn naive_prefix(a: &[u8], b: &[u8]) -> usize {
        a.iter().zip(b).take_while(|(x, y)| x == y).count()
    }
    fn naive_suffix(a: &[u8], b: &[u8]) -> usize {
        a.iter().rev().zip(b.iter().rev()).take_while(|(x, y)| x == y).count()
    }

    proptest! {
        #[test]
        fn trims_agree_with_naive(a in proptest::collection::vec(0u8..3, 0..64), b in proptest::collection::vec(0u8..3, 0..64)) {
            prop_assert_eq!(common_prefix(&a, &b), naive_prefix(&a, &b));
            prop_assert_eq!(common_suffix(&a, &b), naive_suffix(&a, &b));
        }

        #[test]
        fn diff_apply_round_trips(base in proptest::collection::vec(any::<u8>(), 0..3000), edits in proptest::collection::vec((0usize..3000, any::<u8>()), 0..8)) {
            let mut new = base.clone();
            for (at, v) in edits {
                let at = at.min(new.len());
                new.insert(at, v);
            }
            let d = diff(&base, &new).unwrap();
            prop_assert_eq!(&apply(&base, &d, &Limits::default()).unwrap(), &new);
            prop_assert_eq!(&apply_owned(base.clone(), &d, &Limits::default()).unwrap(), &new);
            prop_assert_eq!(decode_and_apply(&base, &encode(&d), &Limits::default()).unwrap(), new);
        }
    }

    #[test]
    fn distant_edits_cost_little() {
        let base: Vec<u8> = (0..200_000u32).flat_map(|i| format!("<c r=\"A{i}\"><v>{}</v></c>", i * 7 % 1000).into_bytes()).collect();
        let mut new = base.clone();
        new.insert(100, b'x');
        let at = new.len() - 100;
        new.insert(at, b'y');
        let d = diff(&base, &new).unwrap();
        let Middle::Zstd { frame, .. } = &d.middle else { panic!("expected a zstd middle") };
        // Two single-byte edits 3.5 MB apart in a 5 MB part: zstd spends ~20 bytes
        // per 128 KiB block of middle, so the cost grows with the distance, not the part.
        assert!(frame.len() < 1024, "frame of {} bytes", frame.len());
        assert_eq!(apply(&base, &d, &Limits::default()).unwrap(), new);
    }

    #[test]
    fn frames_must_be_whole_single_and_exact() {
        let frame = zstd_compress(b"hello hello hello hello hello hello", b"").unwrap();
        assert_eq!(zstd_decompress(&frame, b"", 35, "t").unwrap(), b"hello hello hello hello hello hello");
        assert!(zstd_decompress(&frame, b"", 34, "t").is_err(), "longer than declared");
        assert!(zstd_decompress(&frame, b"", 36, "t").is_err(), "shorter than declared");
        let twice = [frame.clone(), frame.clone()].concat();
        assert!(zstd_decompress(&twice, b"", 70, "t").is_err(), "two frames");
        assert!(zstd_decompress(&frame[..frame.len() - 1], b"", 35, "t").is_err(), "cut short");
        assert!(zstd_decompress(b"", b"", 0, "t").is_err(), "no frame at all");
    }

    #[test]
    fn bad_lengths_are_errors() {
        let d = ContentDelta { prefix: 10, base_mid: 10, middle: Middle::Literal(vec![]) };
        assert!(matches!(apply(b"short", &d, &Limits::default()), Err(PatchError::Malformed { .. })));
        let d = ContentDelta { prefix: u64::MAX, base_mid: 1, middle: Middle::Literal(vec![]) };
        assert!(matches!(apply(b"", &d, &Limits::default()), Err(PatchError::Malformed { .. })));
        let d = ContentDelta { prefix: 0, base_mid: 0, middle: Middle::Zstd { len: 5, frame: vec![1, 2, 3] } };
        assert!(matches!(apply(b"", &d, &Limits::default()), Err(PatchError::Codec { .. })));
    }

    /// Reads a delta in the patch's wire form, hunks allowed, and applies it.
    fn apply_wire(base: &[u8], bytes: &[u8]) -> Result<Vec<u8>> {
        let mut r = Reader::new(bytes);
        let d = read_wire(&mut r, Limits::default().max_part_size)?;
        assert_eq!(r.remaining(), 0);
        apply(base, &d, &Limits::default())
    }

    fn rows_text(n: u32, f: impl Fn(u32) -> u32) -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                format!("<row r=\"{i}\"><c r=\"A{i}\" t=\"n\"><v>{}</v></c><c r=\"B{i}\"><f>A{i}*2</f></c></row>", f(i)).into_bytes()
            })
            .collect()
    }

    #[test]
    fn scattered_changes_cost_per_change_with_hunks() {
        let base = rows_text(20_000, |i| i * 7 % 1000);
        let new = rows_text(20_000, |i| if i % 3000 == 17 || i == 19_990 { 123_456 } else { i * 7 % 1000 });
        let one = diff(&base, &new).unwrap();
        let many = diff_version(&base, &new, 2).unwrap();
        assert!(matches!(many.middle, Middle::Hunks { .. }), "{:?}", many.middle.min_version());
        assert!(many.middle.encoded_len() * 2 < one.middle.encoded_len(), "{} vs {}", many.middle.encoded_len(), one.middle.encoded_len());
        assert_eq!(apply(&base, &many, &Limits::default()).unwrap(), new);
        assert_eq!(apply_wire(&base, &encode(&many)).unwrap(), new);
        // Version 1 never gets hunks.
        assert_eq!(diff_version(&base, &new, 1).unwrap(), one);
    }

    #[test]
    fn bad_hunks_are_malformed() {
        let base = vec![b'x'; 100];
        let wire = |tail: &[u8]| [&[0u8, 50, 2][..], tail].concat(); // prefix 0, base_mid 50, kind 2
        for (tail, why) in [
            (&[0u8][..], "no hunks"),
            (&[1, 40, 11, 0, 0, 0][..], "hunks past the replaced base bytes"),
            (&[1, 0, 1, 2, 0, 1, b'a'][..], "literal data shorter than the hunks write"),
            (&[1, 0, 1, 2, 7, 0][..], "unknown data kind"),
            (&[5, 0, 1, 2][..], "more hunks than bytes left"),
        ] {
            let got = apply_wire(&base, &wire(tail));
            assert!(matches!(got, Err(PatchError::Malformed { .. })), "{why}: {got:?}");
        }
        // A good one: keep 3, replace 2 by "ab", keep 45 more, then the 50 after the middle.
        let out = apply_wire(&base, &wire(&[1, 3, 2, 2, 0, 2, b'a', b'b'])).unwrap();
        assert!(
            matches!(
                decode_and_apply(&base, &wire(&[1, 3, 2, 2, 0, 2, b'a', b'b']), &Limits::default()),
                Err(PatchError::Malformed { .. })
            ),
            "no hunks in a standalone delta"
        );
        assert_eq!(out, [&b"xxxab"[..], &[b'x'; 95][..]].concat());
        let d = ContentDelta {
            prefix: 0,
            base_mid: 4,
            middle: Middle::Hunks {
                len: 4,
                hunks: vec![Hunk { gap: 0, base_len: 1, new_len: 1 }],
                data: Box::new(Middle::Zstd { len: 1, frame: vec![1, 2] }),
            },
        };
        assert!(matches!(apply(&base, &d, &Limits::default()), Err(PatchError::Codec { .. })));
    }

    /// [`find_hunks`] as first written: every sync from the hashed window
    /// (the oracle of the diagonal search).
    fn find_hunks_hashed(b: &[u8], n: &[u8]) -> Option<Vec<(usize, usize, usize)>> {
        let (mut pb, mut pn, mut gap) = (0usize, 0usize, 0usize);
        let mut out = Vec::new();
        let mut grams = Grams::default();
        loop {
            if out.len() >= HUNKS_MAX_FOUND {
                return None;
            }
            let Some((sb, sn)) = nearest_sync_hashed(b, n, pb, pn, &mut grams) else {
                if b.len() - pb <= HUNK_WINDOW && n.len() - pn <= HUNK_WINDOW {
                    out.push((gap, b.len() - pb, n.len() - pn));
                    return Some(out);
                }
                return None;
            };
            out.push((gap, sb - pb, sn - pn));
            let e = common_prefix(&b[sb..], &n[sn..]);
            (pb, pn, gap) = (sb + e, sn + e, e);
            if pb == b.len() && pn == n.len() {
                return Some(out);
            }
        }
    }

    proptest! {
        #[test]
        fn the_diagonal_search_finds_the_hashed_ones_hunks(
            seed in proptest::collection::vec((0usize..20_000, 0usize..400, proptest::collection::vec(0u8..4, 0..300)), 1..10),
            period in 1usize..40,
        ) {
            // Repetitive text (many equal grams), edits near and far apart.
            let unit = b"<c r=\"A1\"><v>12</v></c>";
            let base: Vec<u8> = (0..20_000).map(|i| unit[i % unit.len()] ^ u8::from(i % (period * 97) == 0)).collect();
            let mut new = base.clone();
            for (at, del, ins) in seed {
                let at = at.min(new.len());
                let del = del.min(new.len() - at);
                new.splice(at..at + del, ins);
            }
            let p = common_prefix(&base, &new);
            let q = common_suffix(&base[p..], &new[p..]);
            let (b, n) = (&base[p..base.len() - q], &new[p..new.len() - q]);
            prop_assert_eq!(find_hunks(b, n), find_hunks_hashed(b, n));
        }

        #[test]
        fn hunks_round_trip(seed in proptest::collection::vec((0usize..40_000, 0usize..6, proptest::collection::vec(any::<u8>(), 0..6)), 0..12)) {
            let base = rows_text(1500, |i| i * 7 % 1000);
            let mut new = base.clone();
            for (at, del, ins) in seed {
                let at = at.min(new.len());
                let del = del.min(new.len() - at);
                new.splice(at..at + del, ins);
            }
            let d = diff_version(&base, &new, 2).unwrap();
            prop_assert_eq!(&apply(&base, &d, &Limits::default()).unwrap(), &new);
            prop_assert_eq!(apply_wire(&base, &encode(&d)).unwrap(), new);
        }
    }
}
