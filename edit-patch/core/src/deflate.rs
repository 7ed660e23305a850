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

    /// Compresses all of `input`, handing each produced chunk to `sink`;
    /// `sink` returns false to stop early. Returns false if stopped.
    fn run(&mut self, input: &[u8], mut sink: impl FnMut(&[u8]) -> bool) -> bool {
        let mut out = vec![0u8; CHUNK];
        let mut rest = input;
        loop {
            let take = rest.len().min(MAX_IN);
            let flush = if take == rest.len() { z::Z_FINISH } else { z::Z_NO_FLUSH };
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
    d.run(input, |c| {
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
    let finished = d.run(input, |c| {
        let ok = expected.len() - at >= c.len() && &expected[at..at + c.len()] == c;
        at += c.len();
        ok
    });
    finished && at == expected.len()
}

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
    let mut inf = Inflater::new();
    let mut out = vec![0u8; CHUNK];
    let mut rest = input;
    let mut produced = 0u64;
    loop {
        let take = rest.len().min(MAX_IN);
        inf.0.next_in = rest.as_ptr() as *mut u8;
        inf.0.avail_in = take as z::uInt;
        loop {
            inf.0.next_out = out.as_mut_ptr();
            inf.0.avail_out = CHUNK as z::uInt;
            // SAFETY: valid pointers and lengths; stream initialised.
            let rc = unsafe { z::inflate(&mut *inf.0, z::Z_NO_FLUSH) };
            let n = CHUNK - inf.0.avail_out as usize;
            produced += n as u64;
            if produced > max_out {
                return Err(InflateError::TooLarge);
            }
            sink(&out[..n]);
            match rc {
                z::Z_STREAM_END => return Ok((inf.0.total_in as u64, produced)),
                z::Z_OK => {}
                z::Z_BUF_ERROR if inf.0.avail_in == 0 => break,
                _ => {
                    let msg = if inf.0.msg.is_null() {
                        format!("zlib error {rc}")
                    } else {
                        // SAFETY: zlib sets msg to a static NUL-terminated string.
                        unsafe { std::ffi::CStr::from_ptr(inf.0.msg) }.to_string_lossy().into_owned()
                    };
                    return Err(InflateError::Corrupt(msg));
                }
            }
            if inf.0.avail_in == 0 && inf.0.avail_out != 0 {
                break;
            }
        }
        rest = &rest[take..];
        if rest.is_empty() {
            return Err(InflateError::Corrupt("deflate stream ends early".into()));
        }
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
    fn inflate_is_bounded() {
        let zeros = vec![0u8; 10 << 20];
        let c = deflate(&zeros, ZlibParams { level: 9, mem_level: 8, window_bits: 15, strategy: 0 }).unwrap();
        assert_eq!(inflate(&c, 1 << 20), Err(InflateError::TooLarge));
        assert!(matches!(inflate(&c[..c.len() / 2], 1 << 30), Err(InflateError::Corrupt(_))));
    }
}
