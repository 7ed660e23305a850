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
    [8u8, 9].into_iter().flat_map(|mem_level| {
        LEVELS.into_iter().map(move |level| ZlibParams { level, mem_level, window_bits: 15, strategy: 0 })
    })
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
            z::deflateInit2_(&mut *s, c_int::from(p.level), z::Z_DEFLATED, -c_int::from(p.window_bits), c_int::from(p.mem_level), c_int::from(p.strategy), z::zlibVersion(), std::mem::size_of::<z::z_stream>() as c_int)
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
    fn run(&mut self, input: &[u8], last_flush: c_int, mut sink: impl FnMut(&[u8]) -> bool) -> bool {
        let mut out = vec![0u8; CHUNK];
        let mut rest = input;
        loop {
            let take = rest.len().min(MAX_IN);
            let flush = if take == rest.len() { last_flush } else { z::Z_NO_FLUSH };
            self.0.next_in = rest.as_ptr() as *mut u8;
            self.0.avail_in = take as z::uInt;
            loop {
                self.0.next_out = out.as_mut_ptr();
                self.0.avail_out = CHUNK as z::uInt;
                // SAFETY: in/out pointers are valid for the lengths given; the stream was initialised.
                let rc = unsafe { z::deflate(&mut *self.0, flush) };
                let produced = CHUNK - self.0.avail_out as usize;
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

/// Whether deflating `input` with `params` gives exactly `expected`.
/// Stops at the first differing chunk, so a wrong guess costs little.
pub fn deflate_matches(input: &[u8], params: ZlibParams, expected: &[u8]) -> bool {
    let Some(mut d) = Deflater::new(params) else { return false };
    let mut at = 0usize;
    let finished = d.run(input, z::Z_FINISH, |c| {
        let ok = expected.len() - at >= c.len() && &expected[at..at + c.len()] == c;
        at += c.len();
        ok
    });
    finished && at == expected.len()
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

/// Compresses blocks `first..` in parallel (they are independent by
/// construction), on as many threads as the machine has.
fn deflate_blocks_parallel(input: &[u8], params: ZlibParams, block: usize, first: usize) -> Option<Vec<Vec<u8>>> {
    let count = input.len().div_ceil(block).max(1);
    let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(count.saturating_sub(first)).max(1);
    let next = std::sync::atomic::AtomicUsize::new(first);
    let mut out: Vec<Option<Vec<u8>>> = vec![None; count];
    let results: Vec<Vec<(usize, Option<Vec<u8>>)>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= count {
                            return mine;
                        }
                        mine.push((i, deflate_one_block(input, params, block, i)));
                    }
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("deflate worker")).collect()
    });
    for (i, r) in results.into_iter().flatten() {
        out[i] = Some(r?);
    }
    Some(out.into_iter().skip(first).map(|b| b.expect("every block done")).collect())
}

/// [`deflate_blocks_with`] into a new vector, blocks compressed in parallel.
pub fn deflate_blocks(input: &[u8], params: ZlibParams, block: usize) -> Option<Vec<u8>> {
    if block < 1usize << params.window_bits || !params.is_valid() {
        return None;
    }
    Some(deflate_blocks_parallel(input, params, block, 0)?.concat())
}

/// Whether [`deflate_blocks`] gives exactly `expected`. The first block is
/// checked alone (a wrong guess fails there, cheaply); the rest in parallel.
pub fn deflate_blocks_matches(input: &[u8], params: ZlibParams, block: usize, expected: &[u8]) -> bool {
    if block < 1usize << params.window_bits || !params.is_valid() {
        return false;
    }
    let Some(first) = deflate_one_block(input, params, block, 0) else { return false };
    if !expected.starts_with(&first) {
        return false;
    }
    if input.len() <= block {
        return first.len() == expected.len();
    }
    let Some(rest) = deflate_blocks_parallel(input, params, block, 1) else { return false };
    let mut at = first.len();
    for b in rest {
        if expected.len() - at < b.len() || expected[at..at + b.len()] != b[..] {
            return false;
        }
        at += b.len();
    }
    at == expected.len()
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
                Err(crate::PatchError::LimitExceeded { what: "deflate blocks of a preflate recipe", value: max_blocks.saturating_add(1), limit: max_blocks })
            } else {
                Err(crate::PatchError::malformed("preflate recipe", 0, format!("rebuilds more than the {max_out} bytes left of the declared target")))
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
fn drive_inflate<T, E>(input: &[u8], flush: c_int, mut step: impl FnMut(&z::z_stream, c_int, &[u8]) -> Result<Option<T>, E>) -> Result<Option<T>, E> {
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
