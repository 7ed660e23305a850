//! Raw deflate (RFC 1951) through the reference zlib.
//!
//! Byte-exact rebuilding needs the very deflater many producers use
//! (LibreOffice, Java's `java.util.zip`, Python's `zipfile` all call zlib), so
//! this module binds zlib itself (through `libz-sys`, statically built)
//! rather than a reimplementation whose output differs. It offers:
//! - bounded inflation ([`inflate`], [`measure`]) that stops at a size limit;
//! - deflation with explicit zlib parameters ([`ZlibParams`]), either whole
//!   ([`deflate`]) or checked against expected bytes with early exit
//!   ([`deflate_matches`]), which is how recipes are found cheaply: a wrong
//!   parameter set usually diverges within the first block.

use libz_sys as z;
use std::os::raw::c_int;

/// zlib's deflate parameters, as passed to `deflateInit2`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ZlibParams {
    /// 0 to 9.
    pub level: u8,
    /// 1 to 9.
    pub mem_level: u8,
    /// Window size as a power of two, 9 to 15.
    pub window_bits: u8,
    /// 0 default, 1 filtered, 2 huffman-only, 3 rle, 4 fixed.
    pub strategy: u8,
}

impl ZlibParams {
    /// Whether zlib accepts these values.
    pub fn is_valid(&self) -> bool {
        self.level <= 9 && (1..=9).contains(&self.mem_level) && (9..=15).contains(&self.window_bits) && self.strategy <= 4
    }
}

/// The parameter sets tried when looking for a recipe, most common first:
/// zlib's default level 6 (LibreOffice, Java, Python), then the others.
pub fn candidate_params() -> impl Iterator<Item = ZlibParams> {
    const LEVELS: [u8; 9] = [6, 9, 1, 5, 8, 7, 4, 3, 2];
    [8u8, 9]
        .into_iter()
        .flat_map(|mem_level| LEVELS.into_iter().map(move |level| ZlibParams { level, mem_level, window_bits: 15, strategy: 0 }))
}

/// The candidates for a PNG's image data, likeliest first: those that give
/// its zlib header's FLEVEL (zlib writes 0 for levels below 2, 1 for 2-5, 2
/// for 6 and 3 for 7-9) before the others, and within each, memory level 9
/// before 8 (LibreOffice's PNG writer deflates through its ZCodec with
/// `MAX_MEM_LEVEL`; its thumbnails are level 9, memory level 9, which the
/// plain order reached at its eleventh trial).
///
/// `image_len`: the image data's length. Past [`PNG_ANY_LEVEL_MAX`] only
/// the candidates that give the header's FLEVEL are tried: zlib always
/// writes the FLEVEL of its level, and a writer that is not zlib (Microsoft
/// Office's, whose PNGs no candidate makes) would otherwise cost every
/// candidate's first block, up to a second per MB of pixels at levels 8
/// and 9, before PREFLATE (edit-patch-v2.md §3.7).
pub fn candidate_params_for_png(zlib_header: [u8; 2], image_len: usize) -> impl Iterator<Item = ZlibParams> {
    let flevel = zlib_header[1] >> 6;
    let fits = move |p: &ZlibParams| match flevel {
        0 => p.level < 2,
        1 => (2..6).contains(&p.level),
        2 => p.level == 6,
        _ => p.level > 6,
    };
    let others = image_len <= PNG_ANY_LEVEL_MAX;
    let by_memory = || candidate_params().filter(|p| p.mem_level == 9).chain(candidate_params().filter(|p| p.mem_level != 9));
    by_memory().filter(fits).chain(by_memory().filter(move |p| others && !fits(p)))
}

/// Image data up to this length (bytes) gets every zlib candidate tried,
/// those its header's FLEVEL does not give too ([`candidate_params_for_png`]).
pub const PNG_ANY_LEVEL_MAX: usize = 512 << 10;

unsafe extern "C" fn zalloc(_: z::voidpf, items: z::uInt, size: z::uInt) -> z::voidpf {
    // SAFETY: plain C allocation; zlib frees it through `zfree`.
    unsafe { libc::calloc(items as libc::size_t, size as libc::size_t) }
}
unsafe extern "C" fn zfree(_: z::voidpf, p: z::voidpf) {
    // SAFETY: `p` came from `zalloc` above.
    unsafe { libc::free(p) }
}

fn new_stream() -> Box<z::z_stream> {
    Box::new(z::z_stream {
        next_in: std::ptr::null_mut(),
        avail_in: 0,
        total_in: 0,
        next_out: std::ptr::null_mut(),
        avail_out: 0,
        total_out: 0,
        msg: std::ptr::null_mut(),
        state: std::ptr::null_mut(),
        zalloc,
        zfree,
        opaque: std::ptr::null_mut(),
        data_type: 0,
        adler: 0,
        reserved: 0,
    })
}

const CHUNK: usize = 64 << 10;
/// zlib counts in `uInt`; feed at most this much input per call.
const MAX_IN: usize = 1 << 30;

struct Deflater(Box<z::z_stream>);

impl Deflater {
    fn new(p: ZlibParams) -> Option<Self> {
        if !p.is_valid() {
            return None;
        }
        let mut s = new_stream();
        // SAFETY: `s` is a fresh, boxed z_stream; zlib keeps a pointer to it, so it must not move (it is boxed).
        let rc = unsafe {
            z::deflateInit2_(
                &mut *s,
                c_int::from(p.level),
                z::Z_DEFLATED,
                -c_int::from(p.window_bits),
                c_int::from(p.mem_level),
                c_int::from(p.strategy),
                z::zlibVersion(),
                std::mem::size_of::<z::z_stream>() as c_int,
            )
        };
        (rc == z::Z_OK).then_some(Deflater(s))
    }

    /// Presets the dictionary (raw deflate: before the first `deflate` call).
    fn set_dictionary(&mut self, dict: &[u8]) -> bool {
        // SAFETY: `dict` is valid for its length; zlib copies it into its window.
        unsafe { z::deflateSetDictionary(&mut *self.0, dict.as_ptr(), dict.len() as z::uInt) == z::Z_OK }
    }

    /// Compresses all of `input` ending with `last_flush` (Z_FINISH or
    /// Z_SYNC_FLUSH), handing each produced chunk to `sink`; `sink` returns
    /// false to stop early. Returns false if stopped or zlib failed.
    fn run(&mut self, input: &[u8], last_flush: c_int, sink: impl FnMut(&[u8]) -> bool) -> bool {
        self.run_chunked(input, last_flush, CHUNK, sink)
    }

    /// [`Deflater::run`] handing `sink` at most `chunk` bytes at a time.
    fn run_chunked(&mut self, input: &[u8], last_flush: c_int, chunk: usize, mut sink: impl FnMut(&[u8]) -> bool) -> bool {
        let mut out = vec![0u8; chunk];
        let mut rest = input;
        loop {
            let take = rest.len().min(MAX_IN);
            let flush = if take == rest.len() { last_flush } else { z::Z_NO_FLUSH };
            self.0.next_in = rest.as_ptr() as *mut u8;
            self.0.avail_in = take as z::uInt;
            loop {
                self.0.next_out = out.as_mut_ptr();
                self.0.avail_out = chunk as z::uInt;
                // SAFETY: in/out pointers are valid for the lengths given; the stream was initialised.
                let rc = unsafe { z::deflate(&mut *self.0, flush) };
                let produced = chunk - self.0.avail_out as usize;
                if produced > 0 && !sink(&out[..produced]) {
                    return false;
                }
                if rc == z::Z_STREAM_END {
                    return true;
                }
                if self.0.avail_out != 0 && self.0.avail_in == 0 && flush != z::Z_FINISH {
                    if flush == z::Z_SYNC_FLUSH {
                        return rc == z::Z_OK;
                    }
                    break;
                }
                if rc != z::Z_OK && rc != z::Z_BUF_ERROR {
                    return false;
                }
            }
            rest = &rest[take..];
        }
    }
}

impl Drop for Deflater {
    fn drop(&mut self) {
        // SAFETY: initialised by deflateInit2_.
        unsafe { z::deflateEnd(&mut *self.0) };
    }
}

/// Deflates `input` with `params`; `None` if zlib refuses the parameters.
pub fn deflate(input: &[u8], params: ZlibParams) -> Option<Vec<u8>> {
    let mut d = Deflater::new(params)?;
    let mut out = Vec::with_capacity(input.len() / 4 + 64);
    d.run(input, z::Z_FINISH, |c| {
        out.extend_from_slice(c);
        true
    })
    .then_some(out)
}

/// Output granularity of [`deflate_matches`]: a wrong guess is seen at most
/// this many bytes of output after it diverges. With 64 KiB, each of the 18
/// wrong candidates deflated about 560 kB of a spreadsheet's very
/// compressible XML before being refused (2 s for one cold `ecsync diff` of
/// a 5,000-row sheet under load, issue 13).
const MATCH_CHUNK: usize = 1024;

/// Whether deflating `input` with `params` gives exactly `expected`.
/// Stops at the first differing chunk, so a wrong guess costs little.
pub fn deflate_matches(input: &[u8], params: ZlibParams, expected: &[u8]) -> bool {
    deflate_refused_after(input, params, expected).is_none()
}

/// [`deflate_matches`], saying how much of `input` zlib had read when the
/// guess was refused (`None`: it matches).
fn deflate_refused_after(input: &[u8], params: ZlibParams, expected: &[u8]) -> Option<u64> {
    let Some(mut d) = Deflater::new(params) else { return Some(0) };
    let mut at = 0usize;
    let finished = d.run_chunked(input, z::Z_FINISH, MATCH_CHUNK, |c| {
        let ok = expected.len() - at >= c.len() && &expected[at..at + c.len()] == c;
        at += c.len();
        ok
    });
    // uLong is 32 bits on some platforms: the cast is for them.
    #[allow(clippy::unnecessary_cast)]
    let read = d.0.total_in as u64;
    (!(finished && at == expected.len())).then_some(read)
}

/// Block-parallel deflate as LibreOffice's ThreadedDeflater (and pigz) write
/// it: `input` cut into `block`-byte blocks, each compressed by a fresh raw
/// deflate stream preset with the 2^window_bits bytes before it, ended with
/// Z_SYNC_FLUSH (byte-aligned, so blocks concatenate) and the last with
/// Z_FINISH. `sink` gets the output and may stop early by returning false.
/// Sequential reference (with chunked output) for the parallel [`deflate_blocks`].
#[cfg(test)]
pub fn deflate_blocks_with(input: &[u8], params: ZlibParams, block: usize, mut sink: impl FnMut(&[u8]) -> bool) -> bool {
    let window = 1usize << params.window_bits;
    if block < window {
        return false;
    }
    let mut start = 0;
    loop {
        let end = (start + block).min(input.len());
        let last = end == input.len();
        let Some(mut d) = Deflater::new(params) else { return false };
        if start > 0 && !d.set_dictionary(&input[start.saturating_sub(window)..start]) {
            return false;
        }
        if !d.run(&input[start..end], if last { z::Z_FINISH } else { z::Z_SYNC_FLUSH }, &mut sink) {
            return false;
        }
        if last {
            return true;
        }
        start = end;
    }
}

/// Compresses block `i` of a block-parallel stream on its own, exactly as
/// LibreOffice's ThreadedDeflater does ([`deflate_one_call`], preset with
/// the window before the block, the last block ended with Z_FINISH).
fn deflate_one_block(input: &[u8], params: ZlibParams, block: usize, i: usize) -> Option<Vec<u8>> {
    let (from, start, end) = block_span(input.len(), params, block, i)?;
    deflate_one_call(&input[from..start], &input[start..end], params, end == input.len())
}

/// Block `k` of a block-parallel stream over `len` bytes of content: where
/// the window before it starts, where it starts and where it ends.
fn block_span(len: usize, params: ZlibParams, block: usize, k: usize) -> Option<(usize, usize, usize)> {
    let start = k.checked_mul(block)?;
    Some((start.saturating_sub(1usize << params.window_bits), start, start.saturating_add(block).min(len)))
}

/// zlib's raw deflate of `input` preset with `dict` (if not empty) as
/// LibreOffice's ThreadedDeflater makes a block: one `deflate` call with
/// all the input and an output buffer of `deflateBound(input) + 20` bytes
/// (zlib's output at a flush depends on the room it is given), ended with
/// Z_FINISH (`finish`) or Z_SYNC_FLUSH.
pub(crate) fn deflate_one_call(dict: &[u8], input: &[u8], params: ZlibParams, finish: bool) -> Option<Vec<u8>> {
    let mut d = Deflater::new(params)?;
    if !dict.is_empty() && !d.set_dictionary(dict) {
        return None;
    }
    let flush = if finish { z::Z_FINISH } else { z::Z_SYNC_FLUSH };
    let n = input.len();
    // SAFETY: the stream is initialised; deflateBound only reads its state.
    let cap = unsafe { z::deflateBound(&mut *d.0, n as z::uLong) } as usize + 20;
    if z::uInt::try_from(cap).is_err() || z::uInt::try_from(n).is_err() {
        return None; // blocks of 4 GiB or more: zlib counts in 32 bits
    }
    let mut out = vec![0u8; cap];
    d.0.next_in = input.as_ptr() as *mut u8;
    d.0.avail_in = n as z::uInt;
    d.0.next_out = out.as_mut_ptr();
    d.0.avail_out = cap as z::uInt;
    // SAFETY: pointers valid for the lengths given.
    let rc = unsafe { z::deflate(&mut *d.0, flush) };
    let ok = if finish { rc == z::Z_STREAM_END } else { rc == z::Z_OK };
    if !ok || d.0.avail_in != 0 {
        return None;
    }
    out.truncate(cap - d.0.avail_out as usize);
    Some(out)
}

/// Block `i` of `input` as [`deflate_one_block`] makes it (zlib's bytes),
/// made from the base's block `i` where the base has one made with the
/// same parameters: a character typed before a block shifts its input by
/// one byte, and [`crate::zport::deflate_shifted_stream`] then reuses the
/// base block's LZ77 parse, parsing again only around the change and at the
/// block's end (about 10x faster than zlib on LibreOffice's content at
/// level 6: `cargo run --profile release-test -p ec-patch --example
/// zport_shifted`). At levels 1-3 (zlib's `deflate_fast`), where that is no
/// faster, and where the base has no such block, zlib makes it.
///
/// The base block must be zlib's output for the base's content with these
/// parameters, as [`BlockBase::block_for`]'s copies must: its layout says
/// so (learnt by matching the base's data, or made by this module).
fn deflate_one_block_from(input: &[u8], params: ZlibParams, block: usize, i: usize, base: Option<BlockBase<'_>>) -> Option<Vec<u8>> {
    if let Some((old, old_data)) = base.filter(|_| params.level >= 4).and_then(|b| b.old_block(params, block, i)) {
        let (from, start, end) = block_span(input.len(), params, block, i)?;
        let new = crate::zport::Stream { bytes: &input[from..end], p0: start - from };
        if let Some((made, _)) = crate::zport::deflate_shifted_stream(old, old_data, new, params, end == input.len()) {
            BLOCKS_FROM_PARSE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            return Some(made);
        }
    }
    deflate_one_block(input, params, block, i)
}

/// Blocks [`deflate_one_block_from`] made from a base block's parse.
static BLOCKS_FROM_PARSE: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

/// How many compressed blocks this process has made from a base block's
/// LZ77 parse ([`crate::zport::deflate_shifted_stream`]) instead of
/// deflating them with zlib, in every rebuild, diff and check since it
/// started: a total that only grows, for metrics (the EPS's
/// `ec_eps_blocks_from_base_parse_total`) and for tests that the shifted
/// blocks take that path.
pub fn blocks_made_from_parse() -> u64 {
    BLOCKS_FROM_PARSE.load(std::sync::atomic::Ordering::Relaxed)
}

impl<'a> BlockBase<'a> {
    /// The base's block `k` as [`crate::zport::deflate_shifted_stream`]
    /// takes it (its window and input, and its compressed bytes), if the
    /// base's data was made in blocks of `block` bytes with `params`.
    fn old_block(self, params: ZlibParams, block: usize, k: usize) -> Option<(crate::zport::Stream<'a>, &'a [u8])> {
        if !self.made_with(params, block) {
            return None;
        }
        let (from, start, end) = block_span(self.content.len(), params, block, k)?;
        if start >= self.content.len() {
            return None;
        }
        Some((crate::zport::Stream { bytes: &self.content[from..end], p0: start - from }, self.data_of(k)?))
    }
}

/// Whether block `k` of `input`, deflated as [`deflate_blocks`] does, is `bytes`.
pub fn block_is(input: &[u8], params: ZlibParams, block: usize, k: usize, bytes: &[u8]) -> bool {
    deflate_one_block(input, params, block, k).is_some_and(|made| made == bytes)
}

/// Compresses the blocks numbered in `todo` in parallel (they are
/// independent by construction), on as many threads as the machine has;
/// returns their outputs in the order of `todo`.
fn deflate_blocks_parallel(
    input: &[u8],
    params: ZlibParams,
    block: usize,
    todo: &[usize],
    base: Option<BlockBase<'_>>,
) -> Option<Vec<Vec<u8>>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(todo.len()).max(1);
    if threads == 1 {
        return todo.iter().map(|&i| deflate_one_block_from(input, params, block, i, base)).collect();
    }
    let next = std::sync::atomic::AtomicUsize::new(0);
    let mut out: Vec<Option<Vec<u8>>> = vec![None; todo.len()];
    let results: Vec<Vec<(usize, Option<Vec<u8>>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let j = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if j >= todo.len() {
                            return mine;
                        }
                        mine.push((j, deflate_one_block_from(input, params, block, todo[j], base)));
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("deflate worker")).collect()
    });
    for (j, r) in results.into_iter().flatten() {
        out[j] = Some(r?);
    }
    Some(out.into_iter().map(|b| b.expect("every block done")).collect())
}

/// What is known of a member's compressed data once it has been made or
/// checked as a block-parallel zlib stream ([`deflate_blocks`]): its
/// parameters, block size, content length and where each block's output
/// ends. Learnt once per version (when a recipe is found for it on the
/// device, or when the receiver rebuilds it) and reused when that version
/// is the base of the next patch: a block whose input (the block and the
/// window before it) is the same in both contents compresses to the same
/// bytes, so it is copied instead of recomputed. See [`remember`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockLayout {
    pub params: ZlibParams,
    pub block: usize,
    pub content_len: usize,
    /// End offset in the compressed data of each block (the last one is the data's length).
    pub ends: Vec<usize>,
}

impl BlockLayout {
    fn from_blocks(params: ZlibParams, block: usize, content_len: usize, blocks: &[&[u8]]) -> Self {
        let mut at = 0;
        let ends = blocks
            .iter()
            .map(|b| {
                at += b.len();
                at
            })
            .collect();
        BlockLayout { params, block, content_len, ends }
    }

    /// Where block `k`'s output is in the data (None past the last block).
    pub fn data_range(&self, k: usize) -> Option<std::ops::Range<usize>> {
        let from = if k == 0 { 0 } else { *self.ends.get(k - 1)? };
        Some(from..*self.ends.get(k)?)
    }
}

/// A base version's member that a block-parallel stream may copy blocks from:
/// its content, its compressed data and the layout learnt for that data.
#[derive(Debug, Clone, Copy)]
pub struct BlockBase<'a> {
    pub content: &'a [u8],
    pub data: &'a [u8],
    pub layout: &'a BlockLayout,
}

impl<'a> BlockBase<'a> {
    /// The base's compressed bytes of block `k`, if deflating block `k` of
    /// `input` with `params` and `block` must give exactly them: same
    /// parameters, and the same input bytes from the window before the
    /// block to its end, which is the end of both contents or of neither
    /// (the last block ends with Z_FINISH, the others with Z_SYNC_FLUSH).
    fn block_for(self, input: &[u8], params: ZlibParams, block: usize, k: usize) -> Option<&'a [u8]> {
        if !self.made_with(params, block) {
            return None;
        }
        let (from, start, end) = block_span(input.len(), params, block, k)?;
        let base_end = block_span(self.content.len(), params, block, k)?.2;
        if start > input.len() || end != base_end || (end == input.len()) != (base_end == self.content.len()) {
            return None;
        }
        if input[from..end] != self.content[from..end] {
            return None;
        }
        self.data_of(k)
    }

    /// Whether this base's layout is of a stream made with `params` in
    /// blocks of `block` bytes, over this content and this data.
    fn made_with(self, params: ZlibParams, block: usize) -> bool {
        let l = self.layout;
        l.params == params && l.block == block && l.content_len == self.content.len() && l.ends.last() == Some(&self.data.len())
    }

    /// The base's compressed bytes of block `k`.
    fn data_of(self, k: usize) -> Option<&'a [u8]> {
        self.data.get(self.layout.data_range(k)?)
    }

    /// For each block of `input` (deflated with `params` in blocks of
    /// `block` bytes), where its compressed bytes are in this base's data if
    /// they can be copied from there ([`BlockBase::block_for`]'s rule).
    /// For a caller that keeps the base's data longer than its content: the
    /// ranges index the data alone ([`BlockJob::start`] takes the slices).
    pub fn reusable(self, input: &[u8], params: ZlibParams, block: usize) -> Vec<Option<std::ops::Range<usize>>> {
        let Some(count) = block_count(input.len(), params, block) else { return Vec::new() };
        let at = self.data.as_ptr() as usize;
        (0..count)
            .map(|k| self.block_for(input, params, block, k).map(|b| b.as_ptr() as usize - at..b.as_ptr() as usize - at + b.len()))
            .collect()
    }
}

/// How many blocks a block-parallel stream of `len` bytes of input has, if
/// `params` and `block` can make one (a block holds at least the window).
pub(crate) fn block_count(len: usize, params: ZlibParams, block: usize) -> Option<usize> {
    (block >= 1usize << params.window_bits && params.is_valid()).then(|| len.div_ceil(block).max(1))
}

/// [`deflate_blocks`] that copies from `base` every block whose input is
/// unchanged; also returns the layout of the result and how many blocks
/// were copied.
pub fn deflate_blocks_reusing(
    input: &[u8],
    params: ZlibParams,
    block: usize,
    base: Option<BlockBase<'_>>,
) -> Option<(Vec<u8>, BlockLayout, usize)> {
    if block < 1usize << params.window_bits || !params.is_valid() {
        return None;
    }
    let count = input.len().div_ceil(block).max(1);
    let copied: Vec<Option<&[u8]>> = (0..count).map(|k| base.and_then(|b| b.block_for(input, params, block, k))).collect();
    let todo: Vec<usize> = (0..count).filter(|&k| copied[k].is_none()).collect();
    let mut made = deflate_blocks_parallel(input, params, block, &todo, base)?.into_iter();
    let made: Vec<Vec<u8>> =
        (0..count).map(|k| if copied[k].is_none() { made.next().expect("one per block to make") } else { Vec::new() }).collect();
    let blocks: Vec<&[u8]> = (0..count).map(|k| copied[k].unwrap_or(&made[k])).collect();
    let layout = BlockLayout::from_blocks(params, block, input.len(), &blocks);
    Some((blocks.concat(), layout, count - todo.len()))
}

/// [`deflate_blocks_reusing`] that hands the member's data to `emit` block
/// by block, in order, as soon as each block is made (copied blocks at
/// once), instead of returning it whole: the blocks to make are compressed
/// on worker threads (as many as the machine has) while this thread hands
/// the finished ones on, so that what follows the member (hashing,
/// forwarding the file) runs while the later blocks are still being
/// deflated. `emit` returns false to stop (the workers then stop after
/// their current block). Returns the layout of the data, how many blocks
/// were copied, and the SHA-256 of the data (the key [`remember`] uses).
/// [`BlockJob`] does the same in two steps, for a caller that starts the
/// workers before it can take the data.
pub fn deflate_blocks_reusing_into(
    input: &[u8],
    params: ZlibParams,
    block: usize,
    base: Option<BlockBase<'_>>,
    emit: impl FnMut(&[u8]) -> bool,
) -> Option<(BlockLayout, usize, [u8; 32])> {
    let count = block_count(input.len(), params, block)?;
    let copied = (0..count).map(|k| base.and_then(|b| b.block_for(input, params, block, k))).collect();
    let from = base.map(|b| JobBase { content: b.content, data: b.data, layout: std::sync::Arc::new(b.layout.clone()) });
    std::thread::scope(|s| BlockJob::start(s, input, params, block, copied, from)?.hand_on(emit))
}

/// The base a [`BlockJob`]'s workers make shifted blocks from
/// ([`deflate_one_block_from`]): its content, held as long as they run,
/// and its compressed data with their layout.
#[derive(Debug, Clone)]
pub struct JobBase<'d, C> {
    pub content: C,
    pub data: &'d [u8],
    pub layout: std::sync::Arc<BlockLayout>,
}

/// What the workers of a [`BlockJob`] share with the thread that hands its
/// data on.
struct BlockShared {
    /// Slot j: the output of the j-th block to make once made (`Some(None)`: zlib refused).
    slots: std::sync::Mutex<Vec<Option<Option<Vec<u8>>>>>,
    ready: std::sync::Condvar,
    /// The next block to make (an index into the blocks to make).
    next: std::sync::atomic::AtomicUsize,
    stop: std::sync::atomic::AtomicBool,
}

/// A block-parallel stream being made in two steps: [`BlockJob::start`]
/// sets worker threads of the caller's thread scope compressing the blocks
/// that are not copied, and returns at once; [`BlockJob::hand_on`] hands
/// the data on block by block, in order, as each block is made. Between
/// the two the caller does other work (`apply` writes the members before
/// this one while its blocks are made): the blocks the workers finish
/// meanwhile wait in memory, at most the member's compressed data, until
/// `hand_on` takes them. Dropped without `hand_on`, the job stops its
/// workers after their current block (the scope joins them).
#[derive(Debug)]
pub struct BlockJob<'scope, 'd> {
    params: ZlibParams,
    block: usize,
    content_len: usize,
    /// Per block: its bytes when they are copied, `None` when it is made.
    copied: Vec<Option<&'d [u8]>>,
    shared: std::sync::Arc<BlockShared>,
    workers: Vec<std::thread::ScopedJoinHandle<'scope, ()>>,
}

impl std::fmt::Debug for BlockShared {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BlockShared").field("next", &self.next).field("stop", &self.stop).finish_non_exhaustive()
    }
}

impl<'scope, 'd> BlockJob<'scope, 'd> {
    /// Starts making the blocks of `input` (with `params`, in blocks of
    /// `block` bytes) that `copied` does not give: `copied` has one entry
    /// per block, the block's compressed bytes where they are known (copied
    /// from a base's data, [`BlockBase::reusable`]), `None` where the block
    /// is to be deflated. `None` if the parameters or the block size cannot
    /// make a block-parallel stream, or `copied` has not one entry per block.
    pub fn start<'env, I, C>(
        scope: &'scope std::thread::Scope<'scope, 'env>,
        input: I,
        params: ZlibParams,
        block: usize,
        copied: Vec<Option<&'d [u8]>>,
        base: Option<JobBase<'d, C>>,
    ) -> Option<Self>
    where
        I: std::ops::Deref<Target: AsRef<[u8]>> + Clone + Send + 'scope,
        C: std::ops::Deref<Target: AsRef<[u8]>> + Clone + Send + 'scope,
        'd: 'scope,
    {
        let content_len = (*input).as_ref().len();
        if block_count(content_len, params, block)? != copied.len() {
            return None;
        }
        let todo: std::sync::Arc<[usize]> = (0..copied.len()).filter(|&k| copied[k].is_none()).collect();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(todo.len());
        let shared = std::sync::Arc::new(BlockShared {
            slots: std::sync::Mutex::new(vec![None; todo.len()]),
            ready: std::sync::Condvar::new(),
            next: std::sync::atomic::AtomicUsize::new(0),
            stop: std::sync::atomic::AtomicBool::new(false),
        });
        let workers = (0..threads)
            .map(|_| {
                let (input, shared, todo, base) = (input.clone(), shared.clone(), todo.clone(), base.clone());
                scope.spawn(move || {
                    use std::sync::atomic::Ordering::Relaxed;
                    let input = (*input).as_ref();
                    let from = base.as_ref().map(|b| BlockBase { content: (*b.content).as_ref(), data: b.data, layout: &b.layout });
                    while !shared.stop.load(Relaxed) {
                        let j = shared.next.fetch_add(1, Relaxed);
                        if j >= todo.len() {
                            return;
                        }
                        // A panic counts as a refusal: the taker waits for every slot.
                        let made = std::panic::catch_unwind(|| deflate_one_block_from(input, params, block, todo[j], from)).ok().flatten();
                        shared.slots.lock().unwrap_or_else(|e| e.into_inner())[j] = Some(made);
                        shared.ready.notify_all();
                    }
                })
            })
            .collect();
        Some(BlockJob { params, block, content_len, copied, shared, workers })
    }

    /// Hands the data to `emit` block by block, in order, each block as soon
    /// as it is made (copied blocks at once); `emit` returns false to stop.
    /// Returns when every worker has ended: the layout of the data, how many
    /// blocks were copied, and the SHA-256 of the data (the key
    /// [`remember`] uses); `None` if zlib refused a block or `emit` stopped.
    pub fn hand_on(mut self, mut emit: impl FnMut(&[u8]) -> bool) -> Option<(BlockLayout, usize, [u8; 32])> {
        use sha2::Digest;
        let mut hasher = sha2::Sha256::new();
        let mut ends = Vec::with_capacity(self.copied.len());
        let (mut at, mut j, mut ok) = (0usize, 0usize, true);
        for copy in &self.copied {
            let made = match copy {
                Some(_) => None,
                None => {
                    let mut got = self.shared.slots.lock().unwrap_or_else(|e| e.into_inner());
                    let made = loop {
                        if let Some(made) = got[j].take() {
                            break made;
                        }
                        got = self.shared.ready.wait(got).unwrap_or_else(|e| e.into_inner());
                    };
                    j += 1;
                    match made {
                        Some(b) => Some(b),
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
            };
            let b = copy.or(made.as_deref()).expect("copied or made");
            hasher.update(b);
            at += b.len();
            if !emit(b) {
                ok = false;
                break;
            }
            ends.push(at);
        }
        self.shared.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for w in std::mem::take(&mut self.workers) {
            ok &= w.join().is_ok();
        }
        let copied = self.copied.iter().filter(|c| c.is_some()).count();
        ok.then(|| {
            (BlockLayout { params: self.params, block: self.block, content_len: self.content_len, ends }, copied, hasher.finalize().into())
        })
    }
}

impl Drop for BlockJob<'_, '_> {
    fn drop(&mut self) {
        self.shared.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// [`deflate_blocks`] into a new vector, blocks compressed in parallel.
pub fn deflate_blocks(input: &[u8], params: ZlibParams, block: usize) -> Option<Vec<u8>> {
    deflate_blocks_reusing(input, params, block, None).map(|(v, _, _)| v)
}

/// Whether [`deflate_blocks`] gives exactly `expected`. The first block is
/// checked alone (a wrong guess fails there, cheaply); the rest in parallel.
pub fn deflate_blocks_matches(input: &[u8], params: ZlibParams, block: usize, expected: &[u8]) -> bool {
    deflate_blocks_matches_reusing(input, params, block, expected, None).is_some()
}

/// [`deflate_blocks_matches`] that takes every block whose input is
/// unchanged from `base` instead of recomputing it (the first block to make
/// is still checked alone first); on a match, the layout of `expected`.
pub fn deflate_blocks_matches_reusing(
    input: &[u8],
    params: ZlibParams,
    block: usize,
    expected: &[u8],
    base: Option<BlockBase<'_>>,
) -> Option<BlockLayout> {
    if block < 1usize << params.window_bits || !params.is_valid() {
        return None;
    }
    let count = input.len().div_ceil(block).max(1);
    let copied: Vec<Option<&[u8]>> = (0..count).map(|k| base.and_then(|b| b.block_for(input, params, block, k))).collect();
    let todo: Vec<usize> = (0..count).filter(|&k| copied[k].is_none()).collect();
    let mut made: Vec<Vec<u8>> = Vec::with_capacity(todo.len());
    if let Some(&first) = todo.first() {
        made.push(deflate_one_block_from(input, params, block, first, base)?);
        // Where the first block to make must sit in `expected`, if the copied blocks before it match.
        let mut at = 0;
        for c in copied.iter().take(first) {
            let c = c.expect("copied before the first to make");
            if !expected[at.min(expected.len())..].starts_with(c) {
                return None;
            }
            at += c.len();
        }
        if !expected[at.min(expected.len())..].starts_with(&made[0]) {
            return None;
        }
        made.extend(deflate_blocks_parallel(input, params, block, &todo[1..], base)?);
    }
    let mut made = made.into_iter();
    let owned: Vec<Vec<u8>> =
        (0..count).map(|k| if copied[k].is_none() { made.next().expect("one per block to make") } else { Vec::new() }).collect();
    let mut at = 0;
    let mut blocks: Vec<&[u8]> = Vec::with_capacity(count);
    for k in 0..count {
        let b = copied[k].unwrap_or(&owned[k]);
        if expected.len() - at < b.len() || expected[at..at + b.len()] != *b {
            return None;
        }
        at += b.len();
        blocks.push(b);
    }
    (at == expected.len()).then(|| BlockLayout::from_blocks(params, block, input.len(), &blocks))
}

/// How many layouts [`remember`] keeps (least recently used dropped first).
const MEMO_ENTRIES: usize = 32;

/// [`remember_made`] keeps the contents of the most recently made members
/// in at most this many bytes by default (older contents dropped first,
/// their layouts kept): room for the 17.9 MB `word/document.xml` of a
/// .docx with 10 MB of text, whose inflating (about 45 ms) would otherwise
/// come before every rebuild of it ([`set_kept_content_bound`] changes it) ...
pub const MEMO_CONTENT_BYTES: usize = 32 << 20;
static MEMO_CONTENT_BOUND: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(MEMO_CONTENT_BYTES);
/// ... and only contents at least this large (inflating a smaller one costs little).
const MEMO_CONTENT_MIN: usize = 64 << 10;

/// A member's content that [`remember_made`] kept.
pub type KeptContent = std::sync::Arc<Vec<u8>>;

/// One memo entry: the key (SHA-256 of the data), the layout, whether
/// every block of it was compared with zlib's output (`false`: a claim of
/// [`deflate_blocks_spot_check`], made from a sample of its blocks), and
/// the content the data was made from, if this process made it and kept it.
type MemoEntry = ([u8; 32], std::sync::Arc<BlockLayout>, bool, Option<std::sync::Arc<Vec<u8>>>);

static MEMO: std::sync::Mutex<std::collections::VecDeque<MemoEntry>> = std::sync::Mutex::new(std::collections::VecDeque::new());

fn memo_key(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

/// [`remember`] (`checked`) or [`remember_claimed`].
pub fn remember_as(data: &[u8], layout: BlockLayout, checked: bool) {
    remember_keyed(memo_key(data), layout, checked, None);
}

fn remember_keyed(key: [u8; 32], layout: BlockLayout, checked: bool, content: Option<std::sync::Arc<Vec<u8>>>) {
    let mut m = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    let mut content = content;
    if let Some(i) = m.iter().position(|(k, _, _, _)| *k == key) {
        let was = m.remove(i).expect("found");
        if was.2 && !checked {
            // A claim never replaces what was checked.
            m.push_back(was);
            return;
        }
        content = content.or(was.3);
    }
    if m.len() >= MEMO_ENTRIES {
        m.pop_front();
    }
    m.push_back((key, std::sync::Arc::new(layout), checked, content));
    // Contents beyond the byte bound go, oldest first; their layouts stay.
    let bound = kept_content_bound();
    let mut kept = 0usize;
    for e in m.iter_mut().rev() {
        if let Some(c) = &e.3 {
            kept += c.len();
            if kept > bound {
                e.3 = None;
            }
        }
    }
}

/// Remembers what [`deflate_blocks_reusing_into`] made: the layout of the
/// data whose SHA-256 is `key`, and (if it is at least 64 KiB, within a
/// bound over all entries, [`set_kept_content_bound`]) the content it was made from, so that
/// when this data is the base of the next patch, applying it need not
/// inflate it again ([`recall_content`]).
pub fn remember_made(key: [u8; 32], layout: BlockLayout, content: impl Into<KeptContent>) {
    remember_made_as(key, layout, content.into(), true);
}

/// [`remember_made`], as a claim unless `checked` (data made from a base
/// whose layout was only claimed, [`claim_layout`], or a layout claimed by
/// a spot check): like [`remember_claimed`]'s, only the next spot check uses it.
pub fn remember_made_as(key: [u8; 32], layout: BlockLayout, content: KeptContent, checked: bool) {
    let keep = (MEMO_CONTENT_MIN..=kept_content_bound()).contains(&content.len());
    remember_keyed(key, layout, checked, keep.then_some(content));
}

fn kept_content_bound() -> usize {
    MEMO_CONTENT_BOUND.load(std::sync::atomic::Ordering::Relaxed)
}

/// Sets how many bytes of content [`remember_made`] may keep in all, for
/// this process (default [`MEMO_CONTENT_BYTES`]; 0 keeps none). Contents
/// already kept beyond a lower bound go at the next [`remember_made`].
pub fn set_kept_content_bound(bytes: usize) {
    MEMO_CONTENT_BOUND.store(bytes, std::sync::atomic::Ordering::Relaxed);
}

/// The bytes of content [`remember_made`] keeps now.
pub fn kept_content_bytes() -> usize {
    let m = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    m.iter().filter_map(|e| e.3.as_ref()).map(|c| c.len()).sum()
}

/// Drops every content [`remember_made`] kept, and returns how many bytes
/// that was. The layouts stay, so the next patch against one of these
/// members still copies its unchanged blocks; it only inflates the member
/// again (about 4 ms for 1.8 MB of XML). For a process that goes idle: a
/// long-running service holds the contents of its last saves otherwise.
/// A content that an apply is using right now is freed when it is done.
pub fn forget_kept_contents() -> usize {
    let mut m = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    m.iter_mut().filter_map(|e| e.3.take()).map(|c| c.len()).sum()
}

/// The checked layout remembered for `data`, with the content this process
/// made `data` from if it still keeps it (see [`remember_made`]).
pub fn recall_content(data: &[u8]) -> Option<(std::sync::Arc<BlockLayout>, Option<KeptContent>)> {
    recall_as(data, false).map(|(l, _, c)| (l, c))
}

/// Remembers, for this process, that `data` is the block-parallel stream
/// `layout` describes (keyed by the SHA-256 of `data`). Only what was made
/// by [`deflate_blocks_reusing`] or checked block by block by
/// [`deflate_blocks_matches_reusing`] is remembered this way.
pub fn remember(data: &[u8], layout: BlockLayout) {
    remember_as(data, layout, true);
}

/// Remembers a layout that [`deflate_blocks_spot_check`] claimed from a
/// sample of its blocks. A claim serves only the next spot check against
/// `data` ([`recall_claimed`]); [`recall`], which `apply` and the full
/// checks use, never returns it.
pub fn remember_claimed(data: &[u8], layout: BlockLayout) {
    remember_as(data, layout, false);
}

/// The memo entry for `data` (checked, or also claimed when `claims`), made
/// the most recently used: its layout, whether it was checked, its kept content.
fn recall_as(data: &[u8], claims: bool) -> Option<(std::sync::Arc<BlockLayout>, bool, Option<KeptContent>)> {
    let key = memo_key(data);
    let mut m = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    let i = m.iter().position(|(k, _, checked, _)| *k == key && (claims || *checked))?;
    let hit = m.remove(i)?;
    let found = (hit.1.clone(), hit.2, hit.3.clone());
    m.push_back(hit);
    Some(found)
}

/// The layout remembered for `data` whose every block was checked, if any.
pub fn recall(data: &[u8]) -> Option<std::sync::Arc<BlockLayout>> {
    recall_as(data, false).map(|(l, _, _)| l)
}

/// The layout remembered for `data`, checked or claimed (`true`: checked).
pub fn recall_claimed(data: &[u8]) -> Option<(std::sync::Arc<BlockLayout>, bool)> {
    recall_as(data, true).map(|(l, checked, _)| (l, checked))
}

/// The layout `data` has if it is the block-parallel stream of a content
/// of `content_len` bytes made with `params` in blocks of `block` bytes, as
/// far as its boundaries tell: every block but the last ends at a byte
/// boundary just after an empty stored block (zlib's `Z_SYNC_FLUSH` marker
/// `00 00 ff ff`), after `k * block` bytes of content. `marks` are those
/// positions as [`inflate_marking`] found them while inflating `data` with
/// `every` dividing `block`. None where a boundary is not where the recipe
/// puts one.
///
/// A claim, not a proof: that each block is zlib's output of its input with
/// `params` is not checked (see [`deflate_blocks_spot_check`], which checks
/// a sample, and [`crate::apply`]'s cold base layouts, whose output's
/// SHA-256 is checked).
pub fn claim_layout(data: &[u8], content_len: usize, marks: &[(u64, u64)], params: ZlibParams, block: usize) -> Option<BlockLayout> {
    let count = block_count(content_len, params, block)?;
    let mut ends = Vec::with_capacity(count);
    for k in 0..count - 1 {
        let out = ((k + 1) * block) as u64;
        let i = marks.partition_point(|m| m.1 <= out);
        let &(at, o) = marks.get(i.checked_sub(1)?)?;
        let at = at as usize;
        if o != out || at < 4 || at > data.len() || data[at - 4..at] != [0, 0, 0xff, 0xff] || ends.last().is_some_and(|&e| e >= at) {
            return None;
        }
        ends.push(at);
    }
    if ends.last().is_some_and(|&e| e >= data.len()) {
        return None;
    }
    ends.push(data.len());
    Some(BlockLayout { params, block, content_len, ends })
}

/// What [`deflate_blocks_spot_check`] concluded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SpotCheck {
    /// The stream is not this recipe's: a sampled or copied block differs,
    /// or a block boundary is not where the recipe puts one.
    Refuted,
    /// The sample cannot tell (no boundary marks for this block size): check every block.
    Unknown,
    /// Every block boundary is where the recipe puts one and every block
    /// compared matched; `unchecked` blocks were not compared (0: a full check).
    Claimed { layout: BlockLayout, unchecked: usize },
}

/// A spot check of the block-parallel recipe (`params`, `block`) for
/// `expected`, the member's data whose content `input` is: instead of
/// deflating every block whose input changed ([`deflate_blocks_matches_reusing`]),
/// it deflates and compares only the first of them and the last block;
/// compares every block `base` gives (as the full check does); and checks
/// that every block boundary is where the recipe puts one: after
/// `k * block` bytes of content, at a byte boundary just after an empty
/// stored block (zlib's `Z_SYNC_FLUSH` marker `00 00 ff ff`). `marks` are
/// those positions as [`inflate_marking`] found them while inflating
/// `expected` (with `every` dividing `block`).
///
/// A claim is not a proof: a writer that compressed a block between the two
/// sampled ones otherwise (another level, another deflater) is not seen.
/// For a sender whose receiver checks the rebuilt file's SHA-256 (the EPS
/// always does, and answers `patch_failed` / `target_mismatch`), a wrong
/// claim costs one whole-file resend, never a wrong file.
pub fn deflate_blocks_spot_check(
    input: &[u8],
    params: ZlibParams,
    block: usize,
    expected: &[u8],
    base: Option<BlockBase<'_>>,
    marks: &[(u64, u64)],
    every: usize,
) -> SpotCheck {
    if block < 1usize << params.window_bits || !params.is_valid() {
        return SpotCheck::Refuted;
    }
    if every == 0 || block % every != 0 {
        return SpotCheck::Unknown;
    }
    let count = input.len().div_ceil(block).max(1);
    let Some(layout) = claim_layout(expected, input.len(), marks, params, block) else { return SpotCheck::Refuted };
    let range = |k: usize| layout.data_range(k).expect("one end per block");
    let mut todo = Vec::new();
    for k in 0..count {
        match base.and_then(|b| b.block_for(input, params, block, k)) {
            Some(c) if expected[range(k)] != *c => return SpotCheck::Refuted,
            Some(_) => {}
            None => todo.push(k),
        }
    }
    let mut sample: Vec<usize> = todo.first().copied().into_iter().collect();
    if todo.last().is_some_and(|&l| l == count - 1 && sample != [l]) {
        sample.push(count - 1);
    }
    let Some(made) = deflate_blocks_parallel(input, params, block, &sample, base) else { return SpotCheck::Refuted };
    if sample.iter().zip(&made).any(|(&k, m)| expected[range(k)] != m[..]) {
        return SpotCheck::Refuted;
    }
    SpotCheck::Claimed { layout, unchecked: todo.len() - sample.len() }
}

/// Runs preflate-rs, turning a panic inside it into `None`. preflate-rs is
/// third-party code fed with hostile bytes (a patch's corrections, a file's
/// streams); the fuzzers found inputs that trip its internal assertions, and
/// a panic must never take the service down or lose a save.
fn contained<T>(f: impl FnOnce() -> Option<T>) -> Option<T> {
    std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)).ok().flatten()
}

/// preflate-rs corrections that recreate `data` from `content`, if they are
/// smaller than `data` (None when preflate cannot model the stream).
///
/// Unbounded: preflate's analysis holds every block of `data` (about 100
/// bytes each, empty ones too), so call it only on a stream whose blocks
/// were counted; [`preflate_analyse_within`] does.
pub fn preflate_analyse(data: &[u8], content: &[u8], max_part: u64) -> Option<Vec<u8>> {
    let config = preflate_rs::PreflateConfig { plain_text_limit: usize::try_from(max_part).unwrap_or(usize::MAX), ..Default::default() };
    contained(|| {
        let (r, plain) = preflate_rs::preflate_whole_deflate_stream(data, &config).ok()?;
        (plain.text() == content && r.compressed_size == data.len() && r.corrections.len() < data.len()).then_some(r.corrections)
    })
}

/// Why preflate was not run on a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreflateRefusal {
    /// The content is larger than `Limits::max_preflate_content`.
    ContentTooLarge,
    /// The stream has more deflate blocks than `Limits::preflate_max_blocks` allows.
    TooManyBlocks,
}

/// Whether preflate may work on the deflate stream `data` of `content`:
/// the content is within `max_preflate_content` and the stream has no more
/// blocks than [`Limits::preflate_max_blocks`] allows (counted with zlib,
/// which needs no memory per block, before preflate is called).
///
/// [`Limits::preflate_max_blocks`]: crate::Limits::preflate_max_blocks
pub fn preflate_admits(data: &[u8], content: &[u8], limits: &crate::Limits) -> Result<(), PreflateRefusal> {
    if content.len() as u64 > limits.max_preflate_content {
        return Err(PreflateRefusal::ContentTooLarge);
    }
    match count_blocks(data, limits.preflate_max_blocks(content.len() as u64)) {
        Some(_) => Ok(()),
        None => Err(PreflateRefusal::TooManyBlocks),
    }
}

/// [`preflate_analyse`] within the limits: `None` (no preflate recipe; the
/// caller sends the bytes raw, which is always correct) when
/// [`preflate_admits`] refuses the stream.
pub fn preflate_analyse_within(data: &[u8], content: &[u8], limits: &crate::Limits) -> Option<Vec<u8>> {
    preflate_admits(data, content, limits).ok()?;
    preflate_analyse(data, content, limits.max_part_size)
}

/// Recreates a deflate stream from `content` and preflate `corrections`,
/// within the limits: content of at most `max_preflate_content` bytes, at
/// most [`Limits::preflate_max_blocks`] deflate blocks and `max_out` bytes of
/// output (the room left in the target). The corrections are untrusted: a
/// few dozen bytes of them can describe millions of empty blocks, so the
/// bounds are checked by preflate-rs itself as it goes (the vendored copy's
/// `RecreateBudget`), and preflate keeps no memory per block.
///
/// [`Limits::preflate_max_blocks`]: crate::Limits::preflate_max_blocks
pub fn preflate_recreate(content: &[u8], corrections: &[u8], limits: &crate::Limits, max_out: u64) -> crate::Result<Vec<u8>> {
    crate::Limits::check("content of a preflate recipe", content.len() as u64, limits.max_preflate_content)?;
    let max_blocks = limits.preflate_max_blocks(content.len() as u64);
    let budget = preflate_rs::RecreateBudget { max_blocks, max_output: usize::try_from(max_out).unwrap_or(usize::MAX) };
    let mut failure: Option<preflate_rs::PreflateError> = None;
    let out = contained(|| match preflate_rs::recreate_whole_deflate_stream_bounded(content, corrections, budget) {
        Ok(v) => Some(v),
        Err(e) => {
            failure = Some(e);
            None
        }
    });
    match (out, failure) {
        (Some(v), _) => Ok(v),
        (None, Some(e)) if e.exit_code() == preflate_rs::ExitCode::BudgetExceeded => {
            if e.message().contains("blocks") {
                Err(crate::PatchError::LimitExceeded {
                    what: "deflate blocks of a preflate recipe",
                    value: max_blocks.saturating_add(1),
                    limit: max_blocks,
                })
            } else {
                Err(crate::PatchError::malformed(
                    "preflate recipe",
                    0,
                    format!("rebuilds more than the {max_out} bytes left of the declared target"),
                ))
            }
        }
        (None, Some(e)) => Err(crate::PatchError::codec("preflate recipe", e)),
        (None, None) => Err(crate::PatchError::codec("preflate recipe", "preflate-rs failed on these corrections")),
    }
}

/// Counts the blocks of the raw deflate stream at the start of `data`, with
/// zlib (`Z_BLOCK` stops at each block boundary; nothing is kept), giving
/// up as soon as there are more than `max`: `Some(count)` when the stream
/// ends within `max` blocks, `None` when it has more, or is corrupt or cut.
pub fn count_blocks(data: &[u8], max: u64) -> Option<u64> {
    let mut blocks = 0u64;
    let ended = drive_inflate(data, z::Z_BLOCK, |stream, rc, _| {
        // Bit 7 of data_type: stopped at a block boundary, after an end-of-block code.
        if rc == z::Z_OK && stream.data_type & 128 != 0 {
            blocks += 1;
            if blocks > max {
                return Err(());
            }
        }
        match rc {
            z::Z_STREAM_END => Ok(Some(())),
            z::Z_OK => Ok(None),
            z::Z_BUF_ERROR if stream.avail_in == 0 => Ok(None),
            _ => Err(()),
        }
    });
    match ended {
        Ok(Some(())) => Some(blocks),
        _ => None,
    }
}

/// The one inflate loop: feeds `input` to a raw-deflate inflater in slices
/// of at most `MAX_IN`, calls `step` after every `inflate(flush)` with the
/// stream, zlib's return code and the output just produced. `step` says
/// `Ok(Some(t))` to finish, `Ok(None)` to go on, `Err` to stop. `Ok(None)`
/// from the driver: the input ran out before `step` finished.
fn drive_inflate<T, E>(
    input: &[u8],
    flush: c_int,
    step: impl FnMut(&z::z_stream, c_int, &[u8]) -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    drive_inflater(Inflater::new(), input, flush, step)
}

/// [`drive_inflate`] with an inflater of the caller's (one given a window).
fn drive_inflater<T, E>(
    mut inf: Inflater,
    input: &[u8],
    flush: c_int,
    mut step: impl FnMut(&z::z_stream, c_int, &[u8]) -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    let mut out = vec![0u8; CHUNK];
    let mut rest = input;
    loop {
        let take = rest.len().min(MAX_IN);
        inf.0.next_in = rest.as_ptr() as *mut u8;
        inf.0.avail_in = take as z::uInt;
        loop {
            inf.0.next_out = out.as_mut_ptr();
            inf.0.avail_out = CHUNK as z::uInt;
            // SAFETY: valid pointers and lengths; stream initialised.
            let rc = unsafe { z::inflate(&mut *inf.0, flush) };
            let n = CHUNK - inf.0.avail_out as usize;
            if let Some(t) = step(&inf.0, rc, &out[..n])? {
                return Ok(Some(t));
            }
            // No progress without more input: the next slice, if any.
            if rc == z::Z_BUF_ERROR && inf.0.avail_in == 0 {
                break;
            }
        }
        rest = &rest[take..];
        if rest.is_empty() {
            return Ok(None);
        }
    }
}

/// Block size of LibreOffice's ThreadedDeflater (package/source/zipapi).
pub const LIBREOFFICE_BLOCK: usize = 128 * 1024;

struct Inflater(Box<z::z_stream>);

impl Inflater {
    fn new() -> Self {
        let mut s = new_stream();
        // SAFETY: fresh boxed stream, raw deflate (negative window bits).
        let rc = unsafe { z::inflateInit2_(&mut *s, -15, z::zlibVersion(), std::mem::size_of::<z::z_stream>() as c_int) };
        assert_eq!(rc, z::Z_OK, "zlib inflateInit2 failed (out of memory?)");
        Inflater(s)
    }
}

impl Drop for Inflater {
    fn drop(&mut self) {
        // SAFETY: initialised by inflateInit2_.
        unsafe { z::inflateEnd(&mut *self.0) };
    }
}

/// How inflation ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum InflateError {
    /// Output would exceed the limit given.
    TooLarge,
    /// The stream is corrupt or ends early.
    Corrupt(String),
}

/// Inflates one raw deflate stream from the start of `input`, handing the
/// output to `sink` in chunks. Returns (bytes consumed, bytes produced).
pub fn inflate_with(input: &[u8], max_out: u64, mut sink: impl FnMut(&[u8])) -> Result<(u64, u64), InflateError> {
    let mut produced = 0u64;
    let ended = drive_inflate(input, z::Z_NO_FLUSH, |stream, rc, chunk| {
        produced += chunk.len() as u64;
        if produced > max_out {
            return Err(InflateError::TooLarge);
        }
        sink(chunk);
        match rc {
            // uLong is 32 bits on some platforms: the cast is for them.
            #[allow(clippy::unnecessary_cast)]
            z::Z_STREAM_END => Ok(Some(stream.total_in as u64)),
            z::Z_OK => Ok(None),
            z::Z_BUF_ERROR if stream.avail_in == 0 => Ok(None),
            _ => {
                let msg = if stream.msg.is_null() {
                    format!("zlib error {rc}")
                } else {
                    // SAFETY: zlib sets msg to a static NUL-terminated string.
                    unsafe { std::ffi::CStr::from_ptr(stream.msg) }.to_string_lossy().into_owned()
                };
                Err(InflateError::Corrupt(msg))
            }
        }
    })?;
    match ended {
        Some(consumed) => Ok((consumed, produced)),
        None => Err(InflateError::Corrupt("deflate stream ends early".into())),
    }
}

/// Inflates a whole member: the stream must use every byte of `input`.
pub fn inflate(input: &[u8], max_out: u64) -> Result<Vec<u8>, InflateError> {
    let mut out = Vec::with_capacity((input.len() * 4).min(max_out as usize));
    let (consumed, _) = inflate_with(input, max_out, |c| out.extend_from_slice(c))?;
    if consumed != input.len() as u64 {
        return Err(InflateError::Corrupt(format!("{} bytes follow the end of the deflate stream", input.len() as u64 - consumed)));
    }
    Ok(out)
}

/// Where a deflate stream could be cut into independent blocks: (input
/// offset, output offset) pairs, as [`inflate_marking`] finds them.
pub type Marks = Vec<(u64, u64)>;

/// [`inflate`] that also marks where the stream could be cut into
/// independent blocks of a multiple of `every` bytes of content: (input
/// offset, output offset) of each point where the output is a non-zero
/// multiple of `every` and the input is at a byte boundary between two
/// deflate blocks (the last such point for each output offset). A
/// block-parallel stream ([`deflate_blocks`]) has one after each of its
/// blocks; [`deflate_blocks_spot_check`] reads them. At most one mark per
/// `every` bytes of output is kept.
pub fn inflate_marking(input: &[u8], max_out: u64, every: usize) -> Result<(Vec<u8>, Marks), InflateError> {
    let out = Vec::with_capacity((input.len() * 4).min(max_out as usize));
    inflate_marking_from(Inflater::new(), input, (0, 0), out, Vec::new(), max_out, every)
}

/// [`inflate_marking`] of a stream whose first `same` bytes are those of
/// another one, whose content (`known`) and marks (`known_marks`, made by
/// [`inflate_marking`] with the same `every`) are at hand: a new version of
/// a member of which the base's is known, where an edit left the blocks
/// before it as they were (LibreOffice's block-parallel streams). The
/// content up to the last mark within those bytes is `known`'s, and the
/// stream is inflated from that block boundary on, with the 32 KiB before
/// it as the window: the same content and marks as `inflate_marking(input,
/// max_out, every)`, for the inflation of the rest only. With no such mark,
/// or `known` shorter than its marks say, it is that call.
pub fn inflate_marking_resumed(
    input: &[u8],
    max_out: u64,
    every: usize,
    known: &[u8],
    known_marks: &[(u64, u64)],
    same: usize,
) -> Result<(Vec<u8>, Marks), InflateError> {
    let same = same.min(input.len()) as u64;
    let resume = known_marks.iter().take_while(|m| m.0 <= same).last().copied();
    let Some((read, made)) = resume.filter(|&(_, made)| made <= known.len() as u64 && made <= max_out) else {
        return inflate_marking(input, max_out, every);
    };
    let mut inf = Inflater::new();
    let window = &known[(made as usize).saturating_sub(WINDOW)..made as usize];
    // SAFETY: a raw inflater takes its dictionary right after inflateInit2; the slice outlives the call.
    let rc = unsafe { z::inflateSetDictionary(&mut *inf.0, window.as_ptr(), window.len() as z::uInt) };
    if rc != z::Z_OK {
        return inflate_marking(input, max_out, every);
    }
    let mut out = Vec::with_capacity((input.len() * 4).min(max_out as usize));
    out.extend_from_slice(&known[..made as usize]);
    let marks = known_marks.iter().take_while(|m| m.0 <= read).copied().collect();
    inflate_marking_from(inf, input, (read, made), out, marks, max_out, every)
}

/// The size of deflate's window: what an inflater resumed mid-stream needs of the content before.
const WINDOW: usize = 32 << 10;

/// [`inflate_marking`] from `start` (input offset, output offset: a byte
/// boundary between two blocks), `inf` holding the window before it, `out`
/// and `marks` what came before it.
fn inflate_marking_from(
    inf: Inflater,
    input: &[u8],
    start: (u64, u64),
    mut out: Vec<u8>,
    mut marks: Marks,
    max_out: u64,
    every: usize,
) -> Result<(Vec<u8>, Marks), InflateError> {
    let every = every.max(1) as u64;
    let ended = drive_inflater(inf, &input[start.0 as usize..], z::Z_BLOCK, |stream, rc, chunk| {
        if (out.len() + chunk.len()) as u64 > max_out {
            return Err(InflateError::TooLarge);
        }
        out.extend_from_slice(chunk);
        // uLong is 32 bits on some platforms: the casts are for them.
        #[allow(clippy::unnecessary_cast)]
        let (read, made) = (start.0 + stream.total_in as u64, start.1 + stream.total_out as u64);
        // Bit 7: stopped before a block header; bits 0-5: bits left over from the last byte read.
        if rc == z::Z_OK && stream.data_type & 128 != 0 && stream.data_type & 63 == 0 && made > 0 && made % every == 0 {
            match marks.last_mut() {
                Some(m) if m.1 == made => m.0 = read,
                _ => marks.push((read, made)),
            }
        }
        match rc {
            #[allow(clippy::unnecessary_cast)]
            z::Z_STREAM_END => Ok(Some(start.0 + stream.total_in as u64)),
            z::Z_OK => Ok(None),
            z::Z_BUF_ERROR if stream.avail_in == 0 => Ok(None),
            _ => Err(InflateError::Corrupt(format!("zlib error {rc}"))),
        }
    })?;
    match ended {
        Some(consumed) if consumed == input.len() as u64 => Ok((out, marks)),
        Some(consumed) => {
            Err(InflateError::Corrupt(format!("{} bytes follow the end of the deflate stream", input.len() as u64 - consumed)))
        }
        None => Err(InflateError::Corrupt("deflate stream ends early".into())),
    }
}

/// Measures the deflate stream at the start of `input`: (consumed, produced, CRC-32 of output).
pub fn measure(input: &[u8], max_out: u64) -> Option<(u64, u64, u32)> {
    let mut crc = crc32fast::Hasher::new();
    let (c, p) = inflate_with(input, max_out, |b| crc.update(b)).ok()?;
    Some((c, p, crc.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// No base for a [`BlockJob`]: every block it makes is zlib's.
    const NO_BASE: Option<JobBase<'static, &'static [u8]>> = None;

    #[test]
    fn png_candidates_follow_the_zlib_header_and_cover_every_candidate() {
        let all: std::collections::HashSet<_> = candidate_params().collect();
        for (header, levels) in [([0x78u8, 0x01], 0..2), ([0x78, 0x5e], 2..6), ([0x78, 0x9c], 6..7), ([0x78, 0xda], 7..10)] {
            let order: Vec<_> = candidate_params_for_png(header, PNG_ANY_LEVEL_MAX).collect();
            assert_eq!(order.len(), all.len(), "every candidate once");
            assert_eq!(order.iter().copied().collect::<std::collections::HashSet<_>>(), all);
            let first = order.iter().take_while(|p| levels.contains(&p.level)).count();
            assert!(first > 0 && order[first..].iter().all(|p| !levels.contains(&p.level)), "{header:?}: {order:?}");
            assert_eq!(order[0].mem_level, 9);
            // Larger image data: only those its FLEVEL gives.
            let large: Vec<_> = candidate_params_for_png(header, PNG_ANY_LEVEL_MAX + 1).collect();
            assert_eq!(large, order[..first]);
        }
        // LibreOffice's thumbnails: level 9, memory level 9, first.
        assert_eq!(
            candidate_params_for_png([0x78, 0xda], 1 << 20).next(),
            Some(ZlibParams { level: 9, mem_level: 9, window_bits: 15, strategy: 0 })
        );
    }

    #[test]
    fn round_trip_and_match() {
        let text: Vec<u8> = (0..200_000u32).flat_map(|i| format!("<w:t>{}</w:t>", i % 977).into_bytes()).collect();
        for p in candidate_params() {
            let c = deflate(&text, p).unwrap();
            assert_eq!(inflate(&c, 1 << 30).unwrap(), text);
            assert!(deflate_matches(&text, p, &c));
            let mut wrong = c.clone();
            let mid = wrong.len() / 2;
            wrong[mid] ^= 1;
            assert!(!deflate_matches(&text, p, &wrong));
            assert!(!deflate_matches(&text, p, &c[..c.len() - 1]));
        }
    }

    #[test]
    fn blocks_round_trip_and_match() {
        let text: Vec<u8> = (0..100_000u32).flat_map(|i| format!("<w:t>{}</w:t>", i % 977).into_bytes()).collect();
        let p = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        for len in [0, 1, LIBREOFFICE_BLOCK, LIBREOFFICE_BLOCK + 1, text.len()] {
            let c = deflate_blocks(&text[..len], p, LIBREOFFICE_BLOCK).unwrap();
            let mut sequential = Vec::new();
            assert!(deflate_blocks_with(&text[..len], p, LIBREOFFICE_BLOCK, |b| {
                sequential.extend_from_slice(b);
                true
            }));
            assert_eq!(c, sequential, "parallel and sequential block deflate agree");
            assert_eq!(inflate(&c, 1 << 30).unwrap(), &text[..len]);
            assert!(deflate_blocks_matches(&text[..len], p, LIBREOFFICE_BLOCK, &c));
        }
        assert!(deflate_blocks(&text, p, 1000).is_none(), "blocks smaller than the window are refused");
    }

    #[test]
    fn a_stream_resumed_after_the_blocks_it_shares_inflates_as_a_whole() {
        // A base and an edit of it in LibreOffice's block-parallel form: the
        // blocks before the edit are the same bytes, the later ones shifted.
        let base: Vec<u8> = (0..150_000u32).flat_map(|i| format!("<w:t>{}</w:t>", i % 977).into_bytes()).collect();
        let at = 3 * LIBREOFFICE_BLOCK + 777;
        let mut new = base.clone();
        new.insert(at, b'x');
        let p = candidate_params().next().expect("zlib's default");
        let (sb, sn) = (deflate_blocks(&base, p, LIBREOFFICE_BLOCK).unwrap(), deflate_blocks(&new, p, LIBREOFFICE_BLOCK).unwrap());
        let (known, marks) = inflate_marking(&sb, 1 << 30, LIBREOFFICE_BLOCK).unwrap();
        assert_eq!(known, base);
        let same = crate::delta::common_prefix(&sb, &sn);
        let whole = inflate_marking(&sn, 1 << 30, LIBREOFFICE_BLOCK).unwrap();
        assert_eq!(whole.0, new);
        let resumed = inflate_marking_resumed(&sn, 1 << 30, LIBREOFFICE_BLOCK, &known, &marks, same).unwrap();
        assert_eq!(resumed, whole, "the same content and marks");
        let (read, made) = *marks.iter().take_while(|m| m.0 as usize <= same).last().expect("a mark before the edit");
        assert_eq!(made as usize, 3 * LIBREOFFICE_BLOCK, "resumed at the edited block");
        assert!(read > 0 && same < sn.len() / 2);

        // What comes before that mark is the known content's, not inflated again:
        // a known content that differs there shows in the result.
        let mut other = known.clone();
        other[10] ^= 1;
        let (shown, _) = inflate_marking_resumed(&sn, 1 << 30, LIBREOFFICE_BLOCK, &other, &marks, same).unwrap();
        assert_eq!((shown[10], &shown[11..]), (other[10], &new[11..]));

        // No shared block (or no mark within it): the whole inflation.
        for same in [0, marks[0].0 as usize - 1] {
            assert_eq!(inflate_marking_resumed(&sn, 1 << 30, LIBREOFFICE_BLOCK, &known, &marks, same).unwrap(), whole);
        }
        // The bound and corruption after the resumed point are as a whole inflation's.
        let bound = new.len() as u64 - 1;
        assert_eq!(inflate_marking_resumed(&sn, bound, LIBREOFFICE_BLOCK, &known, &marks, same), Err(InflateError::TooLarge));
        let short = made - 1;
        assert_eq!(inflate_marking_resumed(&sn, short, LIBREOFFICE_BLOCK, &known, &marks, same), Err(InflateError::TooLarge));
        let mut broken = sn.clone();
        broken.truncate(sn.len() - 5);
        assert!(matches!(
            inflate_marking_resumed(&broken, 1 << 30, LIBREOFFICE_BLOCK, &known, &marks, same),
            Err(InflateError::Corrupt(_))
        ));
    }

    #[test]
    fn a_wrong_guess_is_refused_soon_after_it_diverges() {
        // A spreadsheet-like part: very compressible, so 64 KiB of output is
        // more than half a megabyte of input. Written by LibreOffice's block
        // deflater; the single-stream guesses of the recipe search must be
        // refused within a few kB of output after they diverge (the first
        // block boundary at the latest, plus what zlib buffers before it
        // emits its first block), not after 64 KiB of it.
        let text: Vec<u8> = (0..30_000u32)
            .flat_map(|i| {
                format!(
                    "<row r=\"{i}\" spans=\"1:4\"><c r=\"A{i}\" s=\"1\" t=\"s\"><v>{}</v></c><c r=\"B{i}\" s=\"2\"><v>{}</v></c></row>",
                    i % 7,
                    i % 13
                )
                .into_bytes()
            })
            .collect();
        assert!(text.len() > 3_000_000);
        let p6 = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let data = deflate_blocks(&text, p6, LIBREOFFICE_BLOCK).unwrap();
        assert!(data.len() * 8 < text.len(), "64 KiB of output is over 512 kB of input here");
        for p in candidate_params() {
            let read = deflate_refused_after(&text, p, &data).expect("a single stream is not the block stream");
            assert!(read <= 5 * LIBREOFFICE_BLOCK as u64, "{p:?}: {read} bytes of input deflated before the refusal");
        }
    }

    #[test]
    fn reused_blocks_give_the_same_bytes_as_recomputed_ones() {
        let p = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let base: Vec<u8> = (0..120_000u32).flat_map(|i| format!("<w:t>{}</w:t>", i % 1013).into_bytes()).collect();
        let (base_data, layout, none) = deflate_blocks_reusing(&base, p, LIBREOFFICE_BLOCK, None).unwrap();
        assert_eq!(none, 0);
        assert_eq!(base_data, deflate_blocks(&base, p, LIBREOFFICE_BLOCK).unwrap());
        let count = base.len().div_ceil(LIBREOFFICE_BLOCK);
        let b = BlockBase { content: &base, data: &base_data, layout: &layout };
        let mut edits: Vec<(Vec<u8>, Option<usize>)> = Vec::new();
        let mut end = base.clone();
        end.insert(base.len() - 10, b'x');
        edits.push((end, Some(count - 1)));
        let mut mid = base.clone();
        mid[5 * LIBREOFFICE_BLOCK + 100] ^= 1;
        edits.push((mid, Some(count - 1))); // a byte changed in place: only its block is made again
        let mut window = base.clone();
        window[3 * LIBREOFFICE_BLOCK - 10] ^= 1; // in block 2, and in the window of block 3
        edits.push((window, Some(count - 2))); // its block and the next one, whose window it is in
        edits.push((base[1..].to_vec(), Some(0)));
        edits.push((base[..base.len() - 1].to_vec(), Some(count - 1)));
        edits.push((base[..LIBREOFFICE_BLOCK * 2].to_vec(), Some(1))); // block 1 becomes the last one
        edits.push((base.clone(), Some(count)));
        edits.push((Vec::new(), Some(0)));
        for (input, copied) in edits {
            let (out, l, reused) = deflate_blocks_reusing(&input, p, LIBREOFFICE_BLOCK, Some(b)).unwrap();
            assert_eq!(out, deflate_blocks(&input, p, LIBREOFFICE_BLOCK).unwrap(), "len {}", input.len());
            assert_eq!(Some(reused), copied, "len {}", input.len());
            assert_eq!(l.ends.last().copied(), Some(out.len()));
            // Block by block: the same bytes, handed on in order, one piece per block.
            let mut pieces: Vec<Vec<u8>> = Vec::new();
            let (l2, reused2, key) = deflate_blocks_reusing_into(&input, p, LIBREOFFICE_BLOCK, Some(b), |piece| {
                pieces.push(piece.to_vec());
                true
            })
            .unwrap();
            assert_eq!((pieces.concat(), &l2, reused2, key), (out.clone(), &l, reused, memo_key(&out)), "len {}", input.len());
            assert_eq!(pieces.len(), l.ends.len());
            assert_eq!(deflate_blocks_matches_reusing(&input, p, LIBREOFFICE_BLOCK, &out, Some(b)), Some(l.clone()));
            // A wrong byte anywhere, in a copied block or a made one, is seen.
            for at in [0, out.len() / 2, out.len().saturating_sub(1)] {
                if out.is_empty() {
                    break;
                }
                let mut wrong = out.clone();
                wrong[at] ^= 0x40;
                assert_eq!(deflate_blocks_matches_reusing(&input, p, LIBREOFFICE_BLOCK, &wrong, Some(b)), None);
            }
            assert_eq!(deflate_blocks_matches_reusing(&input, p, LIBREOFFICE_BLOCK, &out[..out.len().saturating_sub(1)], Some(b)), None);
        }
        // Other parameters than the base's: nothing is copied.
        let p9 = ZlibParams { level: 9, ..p };
        let (out, _, reused) = deflate_blocks_reusing(&base, p9, LIBREOFFICE_BLOCK, Some(b)).unwrap();
        assert_eq!((out, reused), (deflate_blocks(&base, p9, LIBREOFFICE_BLOCK).unwrap(), 0));
    }

    #[test]
    fn a_block_stream_handed_on_stops_when_its_taker_does() {
        let p = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let input: Vec<u8> = (0..60_000u32).flat_map(|i| format!("<w:t>{}</w:t>", i % 977).into_bytes()).collect();
        assert!(input.len() > 4 * LIBREOFFICE_BLOCK);
        let mut taken = 0;
        let made = deflate_blocks_reusing_into(&input, p, LIBREOFFICE_BLOCK, None, |_| {
            taken += 1;
            taken < 2
        });
        assert_eq!((made, taken), (None, 2));
        // Parameters zlib refuses: nothing is handed on.
        let bad = ZlibParams { window_bits: 16, ..p };
        assert_eq!(deflate_blocks_reusing_into(&input, bad, LIBREOFFICE_BLOCK, None, |_| panic!("nothing to take")), None);
    }

    #[test]
    fn a_block_job_started_early_hands_on_the_same_blocks_and_a_dropped_one_ends() {
        let p = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let input: Vec<u8> = (0..60_000u32).flat_map(|i| format!("<w:t>{}</w:t>", i * 31 % 977).into_bytes()).collect();
        let count = input.len().div_ceil(LIBREOFFICE_BLOCK);
        let whole = deflate_blocks(&input, p, LIBREOFFICE_BLOCK).unwrap();
        let (_, l, _) = deflate_blocks_reusing(&input, p, LIBREOFFICE_BLOCK, None).unwrap();
        let shared = std::sync::Arc::new(input.clone());
        // Blocks 1 and 3 given (as copied from a base would be), the others made.
        let span = |k: usize| l.data_range(k).unwrap();
        let copied: Vec<Option<&[u8]>> = (0..count).map(|k| (k % 2 == 1).then(|| &whole[span(k)])).collect();
        std::thread::scope(|s| {
            let job = BlockJob::start(s, shared.clone(), p, LIBREOFFICE_BLOCK, copied.clone(), NO_BASE).unwrap();
            // The taker comes late: the workers have made every block meanwhile.
            std::thread::sleep(std::time::Duration::from_millis(50));
            let mut pieces = Vec::new();
            let (layout, reused, key) = job
                .hand_on(|b| {
                    pieces.push(b.to_vec());
                    true
                })
                .unwrap();
            assert_eq!((pieces.len(), pieces.concat(), key), (count, whole.clone(), memo_key(&whole)));
            assert_eq!((layout, reused), (l.clone(), count / 2));
            // Dropped without a taker: its workers stop, and the scope ends.
            let _ = BlockJob::start(s, shared.clone(), p, LIBREOFFICE_BLOCK, vec![None; count], NO_BASE).unwrap();
            // One entry per block or nothing.
            assert!(BlockJob::start(s, shared.clone(), p, LIBREOFFICE_BLOCK, vec![None; count + 1], NO_BASE).is_none());
            assert!(BlockJob::start(s, shared.clone(), p, 1 << 10, vec![None; input.len().div_ceil(1 << 10)], NO_BASE).is_none());
        });
        // Every worker has ended: the content is this test's alone again.
        assert_eq!(std::sync::Arc::strong_count(&shared), 1);
    }

    #[test]
    fn a_made_member_is_recalled_with_its_content() {
        let p = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let content: Vec<u8> = (0..20_000u32).flat_map(|i| format!("<w:p>{}</w:p>", i * 7919 % 10007).into_bytes()).collect();
        let mut data = Vec::new();
        let (layout, _, key) = deflate_blocks_reusing_into(&content, p, LIBREOFFICE_BLOCK, None, |b| {
            data.extend_from_slice(b);
            true
        })
        .unwrap();
        remember_made(key, layout.clone(), content.clone());
        let (l, c) = recall_content(&data).unwrap();
        assert_eq!((&*l, c.as_deref()), (&layout, Some(&content)));
        assert_eq!(recall(&data).as_deref(), Some(&layout));
        // A small content is not kept (inflating it costs little); its layout is.
        let small = b"<w:t>short</w:t>".repeat(100);
        let mut sdata = Vec::new();
        let (sl, _, skey) = deflate_blocks_reusing_into(&small, p, LIBREOFFICE_BLOCK, None, |b| {
            sdata.extend_from_slice(b);
            true
        })
        .unwrap();
        remember_made(skey, sl.clone(), small);
        let (l, c) = recall_content(&sdata).unwrap();
        assert_eq!((&*l, c), (&sl, None));
    }

    /// A block-parallel stream of `input` whose block `odd` is compressed with `other` instead of `p`.
    fn mixed_blocks(input: &[u8], p: ZlibParams, other: ZlibParams, odd: usize) -> Vec<u8> {
        let count = input.len().div_ceil(LIBREOFFICE_BLOCK);
        (0..count)
            .map(|k| deflate_one_block(input, if k == odd { other } else { p }, LIBREOFFICE_BLOCK, k).unwrap())
            .collect::<Vec<_>>()
            .concat()
    }

    #[test]
    fn inflate_marking_finds_every_block_boundary_of_a_block_stream() {
        let p = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let text: Vec<u8> = (0..150_000u32).flat_map(|i| format!("<w:t>{}</w:t>", i % 1009).into_bytes()).collect();
        for len in [100, LIBREOFFICE_BLOCK, 3 * LIBREOFFICE_BLOCK, text.len()] {
            let (data, layout, _) = deflate_blocks_reusing(&text[..len], p, LIBREOFFICE_BLOCK, None).unwrap();
            let (content, marks) = inflate_marking(&data, 1 << 30, LIBREOFFICE_BLOCK).unwrap();
            assert_eq!(content, &text[..len]);
            // One mark per block boundary (the end of the stream is no boundary between blocks).
            let inner: Vec<u64> = layout.ends[..layout.ends.len() - 1].iter().map(|&e| e as u64).collect();
            let found: Vec<u64> = marks.iter().filter(|m| (m.1 as usize) < len).map(|m| m.0).collect();
            assert_eq!(found, inner, "len {len}");
        }
        // One zlib stream has no boundary at a block's end: no marks there (a rare chance alignment aside).
        let single = deflate(&text, p).unwrap();
        let (content, marks) = inflate_marking(&single, 1 << 30, LIBREOFFICE_BLOCK).unwrap();
        assert_eq!(content, text);
        assert!(marks.len() < 2, "{marks:?}");
        assert_eq!(inflate_marking(&single, 1000, LIBREOFFICE_BLOCK).unwrap_err(), InflateError::TooLarge);
        assert!(matches!(inflate_marking(&single[..single.len() - 3], 1 << 30, LIBREOFFICE_BLOCK), Err(InflateError::Corrupt(_))));
    }

    #[test]
    fn a_spot_check_samples_the_first_changed_and_the_last_block() {
        let p = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let p1 = ZlibParams { level: 1, ..p };
        let base: Vec<u8> = (0..200_000u32).flat_map(|i| format!("<w:t>{}</w:t>", i % 1013).into_bytes()).collect();
        let count = base.len().div_ceil(LIBREOFFICE_BLOCK);
        assert!(count >= 8);
        let check = |input: &[u8], data: &[u8], b: Option<BlockBase<'_>>| {
            let (content, marks) = inflate_marking(data, 1 << 30, LIBREOFFICE_BLOCK).unwrap();
            assert_eq!(content, input);
            deflate_blocks_spot_check(input, p, LIBREOFFICE_BLOCK, data, b, &marks, LIBREOFFICE_BLOCK)
        };
        // Nothing known of a base: blocks 0 and the last are deflated, the others claimed.
        let (base_data, base_layout, _) = deflate_blocks_reusing(&base, p, LIBREOFFICE_BLOCK, None).unwrap();
        match check(&base, &base_data, None) {
            SpotCheck::Claimed { layout, unchecked } => assert_eq!((layout, unchecked), (base_layout.clone(), count - 2)),
            other => panic!("{other:?}"),
        }
        // A character typed in block 3 of a known base: 0-2 copied and compared, 3 and the last deflated.
        let b = BlockBase { content: &base, data: &base_data, layout: &base_layout };
        let mut new = base.clone();
        new.insert(3 * LIBREOFFICE_BLOCK + 500, b'x');
        let (new_data, new_layout, _) = deflate_blocks_reusing(&new, p, LIBREOFFICE_BLOCK, None).unwrap();
        match check(&new, &new_data, Some(b)) {
            SpotCheck::Claimed { layout, unchecked } => assert_eq!((layout, unchecked), (new_layout, count - 5)),
            other => panic!("{other:?}"),
        }
        // A byte changed in place near the end of block 5: all but blocks 5 and 6 (whose window
        // it is in) copied; 5 deflated, 6 claimed, the last copied.
        let mut same_len = base.clone();
        same_len[6 * LIBREOFFICE_BLOCK - 100] ^= 1;
        let (sl_data, sl_layout, _) = deflate_blocks_reusing(&same_len, p, LIBREOFFICE_BLOCK, None).unwrap();
        assert_eq!(check(&same_len, &sl_data, Some(b)), SpotCheck::Claimed { layout: sl_layout, unchecked: 1 });
        // A late block written at another level is not seen (the claim the receiver's hash check refutes) ...
        let odd = count - 3;
        let mixed = mixed_blocks(&new, p, p1, odd);
        assert_ne!(mixed, new_data);
        assert!(matches!(check(&new, &mixed, Some(b)), SpotCheck::Claimed { .. }));
        assert!(!deflate_blocks_matches(&new, p, LIBREOFFICE_BLOCK, &mixed), "the full check sees it");
        // ... but the block where the edit starts, the last block, or a copied one is.
        assert_eq!(check(&new, &mixed_blocks(&new, p, p1, 3), Some(b)), SpotCheck::Refuted);
        assert_eq!(check(&new, &mixed_blocks(&new, p, p1, count - 1), Some(b)), SpotCheck::Refuted);
        assert_eq!(check(&new, &mixed_blocks(&new, p, p1, 1), Some(b)), SpotCheck::Refuted);
        assert_eq!(check(&new, &mixed_blocks(&new, p, p1, 0), None), SpotCheck::Refuted);
        // One zlib stream is not a block stream: refuted without deflating anything.
        assert_eq!(check(&new, &deflate(&new, p).unwrap(), None), SpotCheck::Refuted);
        // Wrong parameters for the sampled blocks.
        let (content, marks) = inflate_marking(&new_data, 1 << 30, LIBREOFFICE_BLOCK).unwrap();
        assert_eq!(
            deflate_blocks_spot_check(&content, p1, LIBREOFFICE_BLOCK, &new_data, None, &marks, LIBREOFFICE_BLOCK),
            SpotCheck::Refuted
        );
        // Marks made for another block size cannot tell.
        assert_eq!(deflate_blocks_spot_check(&content, p, LIBREOFFICE_BLOCK, &new_data, None, &marks, 96 << 10), SpotCheck::Unknown);
        // A part of one block is checked whole.
        let small = &base[..1000];
        let small_data = deflate_blocks(small, p, LIBREOFFICE_BLOCK).unwrap();
        assert!(matches!(check(small, &small_data, None), SpotCheck::Claimed { unchecked: 0, .. }));
    }

    #[test]
    fn a_claim_is_recalled_only_by_spot_checks() {
        let p = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let l = BlockLayout { params: p, block: LIBREOFFICE_BLOCK, content_len: 3, ends: vec![9] };
        let claimed = b"claim test data one".to_vec();
        remember_claimed(&claimed, l.clone());
        assert!(recall(&claimed).is_none());
        assert_eq!(recall_claimed(&claimed).map(|(l, c)| ((*l).clone(), c)), Some((l.clone(), false)));
        remember(&claimed, l.clone());
        assert_eq!(recall(&claimed).as_deref(), Some(&l));
        // A claim never downgrades what was checked.
        remember_claimed(&claimed, l.clone());
        assert_eq!(recall_claimed(&claimed).map(|(_, c)| c), Some(true));
    }

    #[test]
    fn the_memo_recalls_what_it_was_told_and_forgets_the_oldest() {
        let p = ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
        let l = BlockLayout { params: p, block: LIBREOFFICE_BLOCK, content_len: 3, ends: vec![9] };
        let data = b"memo test data one".to_vec();
        remember(&data, l.clone());
        assert_eq!(recall(&data).as_deref(), Some(&l));
        assert!(recall(b"memo test data two").is_none());
        for i in 0..MEMO_ENTRIES {
            remember(format!("memo filler {i}").as_bytes(), l.clone());
        }
        assert!(recall(&data).is_none());
    }

    #[test]
    fn the_linked_zlib_is_the_reference_zlib() {
        // Recipes reproduce bytes written by zlib itself; zlib-ng or another
        // build linked in its place would silently stop matching.
        // SAFETY: returns a static NUL-terminated string.
        let v = unsafe { std::ffi::CStr::from_ptr(z::zlibVersion()) }.to_str().unwrap().to_owned();
        assert!(v.starts_with("1.") && !v.contains("ng"), "linked zlib {v}");
        let text: Vec<u8> = (0..50_000u32).flat_map(|i| format!("<c r=\"A{i}\"/>").into_bytes()).collect();
        let c = deflate(&text, ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 }).unwrap();
        // Golden: CRC-32 of the level-6 output of the system zlib (1.2.13, as
        // LibreOffice on Debian uses) for this input, computed with Python's zlib.
        const GOLDEN_CRC: u32 = 0x96e04beb;
        assert_eq!(crc32fast::hash(&c), GOLDEN_CRC, "zlib output changed (got {} bytes)", c.len());
    }

    #[test]
    fn inflate_is_bounded() {
        let zeros = vec![0u8; 10 << 20];
        let c = deflate(&zeros, ZlibParams { level: 9, mem_level: 8, window_bits: 15, strategy: 0 }).unwrap();
        assert_eq!(inflate(&c, 1 << 20), Err(InflateError::TooLarge));
        assert!(matches!(inflate(&c[..c.len() / 2], 1 << 30), Err(InflateError::Corrupt(_))));
    }
}
