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
/// LibreOffice's ThreadedDeflater does: one `deflate` call with all the
/// block's input and an output buffer of `deflateBound(block) + 20` bytes
/// (zlib's output at a flush depends on the room it is given).
fn deflate_one_block(input: &[u8], params: ZlibParams, block: usize, i: usize) -> Option<Vec<u8>> {
    let window = 1usize << params.window_bits;
    let start = i * block;
    let end = (start + block).min(input.len());
    let mut d = Deflater::new(params)?;
    if start > 0 && !d.set_dictionary(&input[start - window..start]) {
        return None;
    }
    let flush = if end == input.len() { z::Z_FINISH } else { z::Z_SYNC_FLUSH };
    let n = end - start;
    // SAFETY: the stream is initialised; deflateBound only reads its state.
    let cap = unsafe { z::deflateBound(&mut *d.0, n as z::uLong) } as usize + 20;
    if z::uInt::try_from(cap).is_err() || z::uInt::try_from(n).is_err() {
        return None; // blocks of 4 GiB or more: zlib counts in 32 bits
    }
    let mut out = vec![0u8; cap];
    d.0.next_in = input[start..end].as_ptr() as *mut u8;
    d.0.avail_in = n as z::uInt;
    d.0.next_out = out.as_mut_ptr();
    d.0.avail_out = cap as z::uInt;
    // SAFETY: pointers valid for the lengths given.
    let rc = unsafe { z::deflate(&mut *d.0, flush) };
    let ok = if flush == z::Z_FINISH { rc == z::Z_STREAM_END } else { rc == z::Z_OK };
    if !ok || d.0.avail_in != 0 {
        return None;
    }
    out.truncate(cap - d.0.avail_out as usize);
    Some(out)
}

/// Compresses the blocks numbered in `todo` in parallel (they are
/// independent by construction), on as many threads as the machine has;
/// returns their outputs in the order of `todo`.
fn deflate_blocks_parallel(input: &[u8], params: ZlibParams, block: usize, todo: &[usize]) -> Option<Vec<Vec<u8>>> {
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(todo.len()).max(1);
    if threads == 1 {
        return todo.iter().map(|&i| deflate_one_block(input, params, block, i)).collect();
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
                        mine.push((j, deflate_one_block(input, params, block, todo[j])));
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
        let l = self.layout;
        if l.params != params
            || l.block != block
            || l.content_len != self.content.len()
            || k >= l.ends.len()
            || *l.ends.last()? != self.data.len()
        {
            return None;
        }
        let start = k.checked_mul(block)?;
        let (end, base_end) = ((start + block).min(input.len()), (start + block).min(self.content.len()));
        if start > input.len() || end != base_end || (end == input.len()) != (base_end == self.content.len()) {
            return None;
        }
        let from = start.saturating_sub(1usize << params.window_bits);
        if input[from..end] != self.content[from..end] {
            return None;
        }
        let cs = if k == 0 { 0 } else { l.ends[k - 1] };
        self.data.get(cs..l.ends[k])
    }
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
    let mut made = deflate_blocks_parallel(input, params, block, &todo)?.into_iter();
    let made: Vec<Vec<u8>> =
        (0..count).map(|k| if copied[k].is_none() { made.next().expect("one per block to make") } else { Vec::new() }).collect();
    let blocks: Vec<&[u8]> = (0..count).map(|k| copied[k].unwrap_or(&made[k])).collect();
    let layout = BlockLayout::from_blocks(params, block, input.len(), &blocks);
    Some((blocks.concat(), layout, count - todo.len()))
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
        made.push(deflate_one_block(input, params, block, first)?);
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
        made.extend(deflate_blocks_parallel(input, params, block, &todo[1..])?);
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

static MEMO: std::sync::Mutex<std::collections::VecDeque<([u8; 32], std::sync::Arc<BlockLayout>)>> =
    std::sync::Mutex::new(std::collections::VecDeque::new());

fn memo_key(data: &[u8]) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(data).into()
}

/// Remembers, for this process, that `data` is the block-parallel stream
/// `layout` describes (keyed by the SHA-256 of `data`). Only what was made
/// by [`deflate_blocks_reusing`] or checked by [`deflate_blocks_matches_reusing`]
/// is remembered.
pub fn remember(data: &[u8], layout: BlockLayout) {
    let key = memo_key(data);
    let mut m = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    m.retain(|(k, _)| *k != key);
    if m.len() >= MEMO_ENTRIES {
        m.pop_front();
    }
    m.push_back((key, std::sync::Arc::new(layout)));
}

/// The layout remembered for `data`, if any.
pub fn recall(data: &[u8]) -> Option<std::sync::Arc<BlockLayout>> {
    let key = memo_key(data);
    let mut m = MEMO.lock().unwrap_or_else(|e| e.into_inner());
    let i = m.iter().position(|(k, _)| *k == key)?;
    let hit = m.remove(i)?;
    let layout = hit.1.clone();
    m.push_back(hit);
    Some(layout)
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
    mut step: impl FnMut(&z::z_stream, c_int, &[u8]) -> Result<Option<T>, E>,
) -> Result<Option<T>, E> {
    let mut inf = Inflater::new();
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

/// Measures the deflate stream at the start of `input`: (consumed, produced, CRC-32 of output).
pub fn measure(input: &[u8], max_out: u64) -> Option<(u64, u64, u32)> {
    let mut crc = crc32fast::Hasher::new();
    let (c, p) = inflate_with(input, max_out, |b| crc.update(b)).ok()?;
    Some((c, p, crc.finalize()))
}

#[cfg(test)]
mod tests {
    use super::*;

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
