//! A byte-exact port of Go's `compress/flate` compressor, from the source of
//! Go 1.19.8 (`/usr/lib/go/src/compress/flate`). Other Go versions are not
//! tested here; the compressor has changed little since Go 1.8, but check
//! before relying on output of much older or newer Go.
//!
//! [`deflate`] returns the raw DEFLATE stream that
//! `flate.NewWriter(w, level)` + `Write(data)` + `Close()` writes, byte for
//! byte, for every level Go accepts: -2 (HuffmanOnly), -1 (DefaultCompression,
//! i.e. 6), 0 (NoCompression, stored blocks of 65535 bytes), 1 (BestSpeed,
//! `deflatefast.go`) and 2-9 (the hash-chain compressor of `deflate.go`).
//! [`matches`] runs the same compressor but compares each byte it would write
//! with an expected stream and stops at the first one that differs.
//!
//! What is ported as is: the hash (`hash4`, multiplier 0x1e35a7bd, 17 bits), the
//! per-level good/lazy/nice/chain/fastSkipHashing table, lazy matching, the
//! 4-byte-match-only-within-4096 rule, the 16384-token block limit, the window
//! slide (and the stored-block candidate being lost after a slide), the hash
//! offset renormalisation past 16 MiB, the Huffman code construction
//! (`bitCounts`' package-merge variant, ties broken by symbol), the codegen
//! run-length encoding, the stored/fixed/dynamic choice of `writeBlock`, the
//! stored/dynamic choice of `writeBlockDynamic`/`writeBlockHuff` with its
//! 1/16 margin, the final empty stored block that `Close` writes, and the
//! 48-bit/248-byte bit-writer buffering (which only decides *when* bytes are
//! handed on, not which bytes; it matters to [`matches`] only through how soon
//! a difference is seen).
//!
//! ## Write chunking and `archive/zip`
//!
//! Go's output does not depend on how the input is split into `Write` calls,
//! as long as no `Flush` is called:
//! * levels 2-9: `Write` alternates `step` (compress while at least 262 bytes
//!   of lookahead are buffered) and `fill` (copy into the 64 KiB window,
//!   sliding it by 32 KiB first when the position has reached 65274). A
//!   position can only reach 65274 once the window is full, so every slide
//!   happens at the same state whatever the chunking, and every decision
//!   before it sees a full 258-byte lookahead either way.
//! * levels 0, 1, -2: input is cut into 65535-byte blocks whatever the chunking
//!   (the step acts only on a full 65535-byte window or at `Close`).
//!
//! The test `edit-patch/core/tests/integration/goflate.rs` checks this against Go with
//! 1-byte, 7-byte, 4096-byte, 32 KiB and 65536-byte writes. [`Writer`] offers
//! the chunked form anyway (it gives the same bytes as [`deflate`]).
//!
//! `archive/zip`'s default compressor (`register.go`) is **level 5**, not
//! DefaultCompression: `flate.NewWriter(w, 5)`, pooled in a `sync.Pool` and
//! `Reset` for the next member. `Reset` clears the hash chains, window
//! positions, tokens and the bit writer (the stale window bytes and Huffman
//! scratch are never read before being rewritten), so a pooled writer gives the
//! same bytes as a new one: a member written by `archive/zip` with its default
//! compressor (`zip.Writer.Create`, or `CreateHeader` with `zip.Deflate`)
//! equals `deflate(content, 5)`. excelize writes its parts that way
//! (`WriteToBuffer`: `zip.NewWriter`, `zw.Create(path)`, one `Write`), unless a
//! program registers another compressor. `zip.Writer.Flush` flushes the
//! archive's own buffer, never the flate writer, so no sync-flush blocks
//! appear. The tests check this on a zip of several corpus parts written by
//! Go's `archive/zip`, and on `experiments/bench/rezip/go`. (The shared corpus
//! has no document written by Go: `oddballs/mixed-writers_excelize_Book1.xlsx`
//! is zlib level 6, not Go, at every member.)
//!
//! Cost: besides the output, one call allocates fixed tables as Go does:
//! about 700 KiB at levels 2-9 (64 KiB window, 2^17 + 2^15 hash entries, 16 Ki
//! tokens), about 520 KiB at level 1, 64 KiB at levels 0 and -2. Speed is
//! about Go's (`cargo run --release -p ec-patch --example goflate_speed -- FILE`). [`matches`] compares the
//! output as the bit writer hands it on: in runs of at most 248 bytes, a stored
//! block's data at once; the first comparison comes when the first block is
//! written (after 16384 tokens at levels 2-9, 65535 input bytes at 0, 1, -2).
//!
//! Invalid levels (outside -2..=9; Go's `NewWriter` returns an error) give an
//! empty output from [`deflate`] and `false` from [`matches`].

const WINDOW_SIZE: i64 = 1 << 15;
const WINDOW_MASK: i64 = WINDOW_SIZE - 1;
const BASE_MATCH_LENGTH: i64 = 3;
const MIN_MATCH_LENGTH: i64 = 4;
const MAX_MATCH_LENGTH: i64 = 258;
const BASE_MATCH_OFFSET: i64 = 1;
const MAX_MATCH_OFFSET: i32 = 1 << 15;
const MAX_FLATE_BLOCK_TOKENS: usize = 1 << 14;
const MAX_STORE_BLOCK_SIZE: usize = 65535;
const HASH_BITS: u32 = 17;
const HASH_SIZE: usize = 1 << HASH_BITS;
const HASH_MASK: u32 = (1 << HASH_BITS) - 1;
const MAX_HASH_OFFSET: i64 = 1 << 24;
const SKIP_NEVER: i64 = i32::MAX as i64;
const HASHMUL: u32 = 0x1e35a7bd;

// token.go
const LENGTH_SHIFT: u32 = 22;
const OFFSET_MASK: u32 = (1 << LENGTH_SHIFT) - 1;
const MATCH_TYPE: u32 = 1 << 30;

// huffman_bit_writer.go
const MAX_NUM_LIT: usize = 286;
const OFFSET_CODE_COUNT: usize = 30;
const END_BLOCK_MARKER: usize = 256;
const LENGTH_CODES_START: usize = 257;
const CODEGEN_CODE_COUNT: usize = 19;
const BAD_CODE: u8 = 255;
const BUFFER_FLUSH_SIZE: usize = 240;
const BUFFER_SIZE: usize = BUFFER_FLUSH_SIZE + 8;

const LENGTH_EXTRA_BITS: [i8; 29] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
const LENGTH_BASE: [u32; 29] =
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 255];
const OFFSET_EXTRA_BITS: [i8; 30] = [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
const OFFSET_BASE: [u32; 30] = [
    0x000000, 0x000001, 0x000002, 0x000003, 0x000004, 0x000006, 0x000008, 0x00000c, 0x000010, 0x000018, 0x000020, 0x000030, 0x000040,
    0x000060, 0x000080, 0x0000c0, 0x000100, 0x000180, 0x000200, 0x000300, 0x000400, 0x000600, 0x000800, 0x000c00, 0x001000, 0x001800,
    0x002000, 0x003000, 0x004000, 0x006000,
];
const CODEGEN_ORDER: [usize; 19] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];

/// lengthCodes of token.go, computed: the length code (0-28) of a match
/// length minus 3.
const LENGTH_CODES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut code = 0;
    while code < 29 {
        let base = LENGTH_BASE[code] as usize;
        let n = 1usize << LENGTH_EXTRA_BITS[code];
        let mut j = 0;
        while j < n && base + j < 256 {
            t[base + j] = code as u8;
            j += 1;
        }
        code += 1;
    }
    t[255] = 28;
    t
};

/// offsetCodes of token.go (the first 256 distance codes).
const OFFSET_CODES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut code = 0;
    while code < 16 {
        let base = OFFSET_BASE[code] as usize;
        let n = 1usize << OFFSET_EXTRA_BITS[code];
        let mut j = 0;
        while j < n && base + j < 256 {
            t[base + j] = code as u8;
            j += 1;
        }
        code += 1;
    }
    t
};

fn length_code(len: u32) -> usize {
    LENGTH_CODES[(len & 255) as usize] as usize
}

fn offset_code(off: u32) -> usize {
    if off < 256 {
        OFFSET_CODES[off as usize] as usize
    } else if off >> 7 < 256 {
        OFFSET_CODES[(off >> 7) as usize] as usize + 14
    } else {
        OFFSET_CODES[((off >> 14) & 255) as usize] as usize + 28
    }
}

fn literal_token(lit: u8) -> u32 {
    lit as u32
}

fn match_token(xlength: u32, xoffset: u32) -> u32 {
    MATCH_TYPE + (xlength << LENGTH_SHIFT) + xoffset
}

// ---------------------------------------------------------------- output sinks

/// Where the bit writer hands its bytes (Go's `io.Writer`). `false` = error:
/// the compressor stops, as Go's does on a write error.
trait Sink {
    fn write(&mut self, b: &[u8]) -> bool;
}

impl Sink for Vec<u8> {
    fn write(&mut self, b: &[u8]) -> bool {
        self.extend_from_slice(b);
        true
    }
}

/// Hands the output to a closure ([`run`]).
struct FnSink<F>(F);

impl<F: FnMut(&[u8]) -> bool> Sink for FnSink<F> {
    fn write(&mut self, b: &[u8]) -> bool {
        (self.0)(b)
    }
}

/// Compares the output with an expected stream as it is written.
struct CompareSink<'a> {
    expected: &'a [u8],
    pos: usize,
}

impl Sink for CompareSink<'_> {
    fn write(&mut self, b: &[u8]) -> bool {
        let end = self.pos + b.len();
        match self.expected.get(self.pos..end) {
            Some(e) if e == b => {
                self.pos = end;
                true
            }
            _ => false,
        }
    }
}

// --------------------------------------------------------------- huffman_code.go

#[derive(Clone, Copy, Default)]
struct HCode {
    code: u16,
    len: u16,
}

#[derive(Clone, Copy, Default)]
struct LiteralNode {
    literal: u16,
    freq: i32,
}

#[derive(Clone, Copy, Default)]
struct LevelInfo {
    level: i32,
    last_freq: i32,
    next_char_freq: i32,
    next_pair_freq: i32,
    needed: i32,
}

fn reverse_bits(number: u16, bit_length: u16) -> u16 {
    ((u32::from(number) << (16 - u32::from(bit_length).min(16))) as u16).reverse_bits()
}

struct HuffmanEncoder {
    codes: Vec<HCode>,
    freqcache: Vec<LiteralNode>,
    bit_count: [i32; 17],
}

impl HuffmanEncoder {
    fn new(size: usize) -> Self {
        HuffmanEncoder { codes: vec![HCode::default(); size], freqcache: vec![LiteralNode::default(); MAX_NUM_LIT + 1], bit_count: [0; 17] }
    }

    fn fixed_literal() -> Self {
        let mut h = HuffmanEncoder::new(MAX_NUM_LIT);
        for ch in 0..MAX_NUM_LIT as u16 {
            let (bits, size) = match ch {
                0..=143 => (ch + 48, 8),
                144..=255 => (ch + 400 - 144, 9),
                256..=279 => (ch - 256, 7),
                _ => (ch + 192 - 280, 8),
            };
            h.codes[ch as usize] = HCode { code: reverse_bits(bits, size), len: size };
        }
        h
    }

    fn fixed_offset() -> Self {
        let mut h = HuffmanEncoder::new(OFFSET_CODE_COUNT);
        for ch in 0..OFFSET_CODE_COUNT {
            h.codes[ch] = HCode { code: reverse_bits(ch as u16, 5), len: 5 };
        }
        h
    }

    fn bit_length(&self, freq: &[i32]) -> i64 {
        let mut total = 0i64;
        for (f, c) in freq.iter().zip(&self.codes) {
            if *f != 0 {
                total += i64::from(*f) * i64::from(c.len);
            }
        }
        total
    }

    /// bitCounts: the first `n` entries of `freqcache`, sorted by frequency.
    /// Returns the length of the bit-count table (maxBits + 1).
    fn bit_counts(&mut self, n: usize, max_bits: i32) -> usize {
        let list = &mut self.freqcache;
        list[n] = LiteralNode { literal: u16::MAX, freq: i32::MAX };
        let ni = n as i32;
        let max_bits = max_bits.min(ni - 1).clamp(1, 15) as usize;
        let mut levels = [LevelInfo::default(); 17];
        let mut leaf_counts = [[0i32; 17]; 17];
        for level in 1..=max_bits {
            levels[level] = LevelInfo {
                level: level as i32,
                last_freq: list[1].freq,
                next_char_freq: list[2].freq,
                next_pair_freq: list[0].freq.wrapping_add(list[1].freq),
                needed: 0,
            };
            leaf_counts[level][level] = 2;
            if level == 1 {
                levels[level].next_pair_freq = i32::MAX;
            }
        }
        levels[max_bits].needed = 2 * ni - 4;
        let mut level = max_bits;
        loop {
            if level > 15 {
                break; // unreachable (Go would panic)
            }
            let l = levels[level];
            if l.next_pair_freq == i32::MAX && l.next_char_freq == i32::MAX {
                levels[level].needed = 0;
                levels[level + 1].next_pair_freq = i32::MAX;
                level += 1;
                continue;
            }
            let prev_freq = l.last_freq;
            if l.next_char_freq < l.next_pair_freq {
                let nn = leaf_counts[level][level] + 1;
                levels[level].last_freq = l.next_char_freq;
                leaf_counts[level][level] = nn;
                levels[level].next_char_freq = list.get(nn as usize).map_or(i32::MAX, |x| x.freq);
            } else {
                levels[level].last_freq = l.next_pair_freq;
                let (lo, hi) = leaf_counts.split_at_mut(level);
                hi[0][..level].copy_from_slice(&lo[level - 1][..level]);
                levels[(l.level - 1) as usize].needed = 2;
            }
            levels[level].needed -= 1;
            if levels[level].needed == 0 {
                if levels[level].level as usize == max_bits {
                    break;
                }
                levels[level + 1].next_pair_freq = prev_freq.wrapping_add(levels[level].last_freq);
                level += 1;
            } else {
                while level > 1 && levels[level - 1].needed > 0 {
                    level -= 1;
                }
            }
        }
        let counts = &leaf_counts[max_bits];
        for (bits, level) in (1..).zip((1..=max_bits).rev()) {
            self.bit_count[bits] = counts[level] - counts[level - 1];
        }
        max_bits + 1
    }

    fn assign_encoding_and_size(&mut self, bit_count_len: usize, count: usize) {
        let mut code: u16 = 0;
        let mut list_len = count;
        for n in 0..bit_count_len {
            code <<= 1;
            let bits = self.bit_count[n];
            if n == 0 || bits <= 0 {
                continue;
            }
            let start = list_len.saturating_sub(bits as usize);
            let chunk = &mut self.freqcache[start..list_len];
            chunk.sort_unstable_by_key(|x| x.literal);
            for node in chunk.iter() {
                if let Some(c) = self.codes.get_mut(node.literal as usize) {
                    *c = HCode { code: reverse_bits(code, n as u16), len: n as u16 };
                }
                code = code.wrapping_add(1);
            }
            list_len = start;
        }
    }

    fn generate(&mut self, freq: &[i32], max_bits: i32) {
        let mut count = 0;
        for (i, &f) in freq.iter().enumerate() {
            if f != 0 {
                self.freqcache[count] = LiteralNode { literal: i as u16, freq: f };
                count += 1;
            } else {
                self.codes[i].len = 0;
            }
        }
        if count <= 2 {
            for i in 0..count {
                let node = self.freqcache[i];
                self.codes[node.literal as usize] = HCode { code: i as u16, len: 1 };
            }
            return;
        }
        // Go's sort.Sort is not stable, but (freq, literal) is a total order.
        self.freqcache[..count].sort_unstable_by(|a, b| a.freq.cmp(&b.freq).then(a.literal.cmp(&b.literal)));
        let len = self.bit_counts(count, max_bits);
        self.assign_encoding_and_size(len, count);
    }
}

// --------------------------------------------------------- huffman_bit_writer.go

fn generate_codegen(
    codegen: &mut [u8; MAX_NUM_LIT + OFFSET_CODE_COUNT + 1],
    codegen_freq: &mut [i32; CODEGEN_CODE_COUNT],
    num_literals: usize,
    num_offsets: usize,
    lit: &[HCode],
    off: &[HCode],
) {
    codegen_freq.fill(0);
    for i in 0..num_literals {
        codegen[i] = lit[i].len as u8;
    }
    for i in 0..num_offsets {
        codegen[num_literals + i] = off[i].len as u8;
    }
    codegen[num_literals + num_offsets] = BAD_CODE;
    let mut size = codegen[0];
    let mut count: i32 = 1;
    let mut out = 0usize;
    let mut in_index = 1usize;
    while size != BAD_CODE {
        let next_size = codegen[in_index];
        in_index += 1;
        if next_size == size {
            count += 1;
            continue;
        }
        if size != 0 {
            codegen[out] = size;
            out += 1;
            codegen_freq[size as usize] += 1;
            count -= 1;
            while count >= 3 {
                let n = count.min(6);
                codegen[out] = 16;
                codegen[out + 1] = (n - 3) as u8;
                out += 2;
                codegen_freq[16] += 1;
                count -= n;
            }
        } else {
            while count >= 11 {
                let n = count.min(138);
                codegen[out] = 18;
                codegen[out + 1] = (n - 11) as u8;
                out += 2;
                codegen_freq[18] += 1;
                count -= n;
            }
            if count >= 3 {
                codegen[out] = 17;
                codegen[out + 1] = (count - 3) as u8;
                out += 2;
                codegen_freq[17] += 1;
                count = 0;
            }
        }
        count -= 1;
        while count >= 0 {
            codegen[out] = size;
            out += 1;
            codegen_freq[size as usize] += 1;
            count -= 1;
        }
        size = next_size;
        count = 1;
    }
    codegen[out] = BAD_CODE;
}

#[derive(Clone, Copy, PartialEq)]
enum Enc {
    Fixed,
    Dynamic,
}

struct BitWriter<S: Sink> {
    sink: S,
    bits: u64,
    nbits: u32,
    bytes: [u8; BUFFER_SIZE],
    nbytes: usize,
    codegen_freq: [i32; CODEGEN_CODE_COUNT],
    literal_freq: [i32; MAX_NUM_LIT],
    offset_freq: [i32; OFFSET_CODE_COUNT],
    codegen: [u8; MAX_NUM_LIT + OFFSET_CODE_COUNT + 1],
    literal_encoding: HuffmanEncoder,
    offset_encoding: HuffmanEncoder,
    codegen_encoding: HuffmanEncoder,
    fixed_literal: HuffmanEncoder,
    fixed_offset: HuffmanEncoder,
    huff_offset: HuffmanEncoder,
    err: bool,
}

impl<S: Sink> BitWriter<S> {
    fn new(sink: S) -> Self {
        let mut huff_offset = HuffmanEncoder::new(OFFSET_CODE_COUNT);
        let mut f = [0i32; OFFSET_CODE_COUNT];
        f[0] = 1;
        huff_offset.generate(&f, 15);
        BitWriter {
            sink,
            bits: 0,
            nbits: 0,
            bytes: [0; BUFFER_SIZE],
            nbytes: 0,
            codegen_freq: [0; CODEGEN_CODE_COUNT],
            literal_freq: [0; MAX_NUM_LIT],
            offset_freq: [0; OFFSET_CODE_COUNT],
            codegen: [0; MAX_NUM_LIT + OFFSET_CODE_COUNT + 1],
            literal_encoding: HuffmanEncoder::new(MAX_NUM_LIT),
            offset_encoding: HuffmanEncoder::new(OFFSET_CODE_COUNT),
            codegen_encoding: HuffmanEncoder::new(CODEGEN_CODE_COUNT),
            fixed_literal: HuffmanEncoder::fixed_literal(),
            fixed_offset: HuffmanEncoder::fixed_offset(),
            huff_offset,
            err: false,
        }
    }

    fn write(&mut self, n: usize) {
        if self.err {
            return;
        }
        if !self.sink.write(&self.bytes[..n]) {
            self.err = true;
        }
    }

    fn write_ext(&mut self, b: &[u8]) {
        if self.err {
            return;
        }
        if !self.sink.write(b) {
            self.err = true;
        }
    }

    fn flush(&mut self) {
        if self.err {
            self.nbits = 0;
            return;
        }
        let mut n = self.nbytes;
        while self.nbits != 0 {
            self.bytes[n] = self.bits as u8;
            self.bits >>= 8;
            self.nbits = self.nbits.saturating_sub(8);
            n += 1;
        }
        self.bits = 0;
        self.write(n);
        self.nbytes = 0;
    }

    #[inline]
    fn put_bits(&mut self, b: u64, nb: u32) {
        self.bits |= b << self.nbits;
        self.nbits += nb;
        if self.nbits >= 48 {
            let bits = self.bits;
            self.bits >>= 48;
            self.nbits -= 48;
            let n = self.nbytes;
            self.bytes[n..n + 6].copy_from_slice(&bits.to_le_bytes()[..6]);
            let n = n + 6;
            if n >= BUFFER_FLUSH_SIZE {
                self.write(n);
                self.nbytes = 0;
            } else {
                self.nbytes = n;
            }
        }
    }

    fn write_bits(&mut self, b: i32, nb: u32) {
        if self.err {
            return;
        }
        // Go: uint64(b) of an int32 (never negative here).
        self.put_bits(b as i64 as u64, nb);
    }

    #[inline]
    fn write_code(&mut self, c: HCode) {
        if self.err {
            return;
        }
        self.put_bits(u64::from(c.code), u32::from(c.len));
    }

    fn write_bytes(&mut self, bytes: &[u8]) {
        if self.err {
            return;
        }
        let mut n = self.nbytes;
        if self.nbits & 7 != 0 {
            self.err = true; // InternalError("writeBytes with unfinished bits")
            return;
        }
        while self.nbits != 0 {
            self.bytes[n] = self.bits as u8;
            self.bits >>= 8;
            self.nbits -= 8;
            n += 1;
        }
        if n != 0 {
            self.write(n);
        }
        self.nbytes = 0;
        self.write_ext(bytes);
    }

    fn dynamic_size(&self, lit: &HuffmanEncoder, off: &HuffmanEncoder, extra_bits: i64) -> (i64, usize) {
        let mut num_codegens = self.codegen_freq.len();
        while num_codegens > 4 && self.codegen_freq[CODEGEN_ORDER[num_codegens - 1]] == 0 {
            num_codegens -= 1;
        }
        let header = 3
            + 5
            + 5
            + 4
            + 3 * num_codegens as i64
            + self.codegen_encoding.bit_length(&self.codegen_freq)
            + i64::from(self.codegen_freq[16]) * 2
            + i64::from(self.codegen_freq[17]) * 3
            + i64::from(self.codegen_freq[18]) * 7;
        let size = header + lit.bit_length(&self.literal_freq) + off.bit_length(&self.offset_freq) + extra_bits;
        (size, num_codegens)
    }

    fn fixed_size(&self, extra_bits: i64) -> i64 {
        3 + self.fixed_literal.bit_length(&self.literal_freq) + self.fixed_offset.bit_length(&self.offset_freq) + extra_bits
    }

    fn stored_size(input: Option<&[u8]>) -> (i64, bool) {
        match input {
            Some(b) if b.len() <= MAX_STORE_BLOCK_SIZE => ((b.len() as i64 + 5) * 8, true),
            _ => (0, false),
        }
    }

    fn write_dynamic_header(&mut self, num_literals: usize, num_offsets: usize, num_codegens: usize, is_eof: bool) {
        if self.err {
            return;
        }
        self.write_bits(if is_eof { 5 } else { 4 }, 3);
        self.write_bits(num_literals as i32 - 257, 5);
        self.write_bits(num_offsets as i32 - 1, 5);
        self.write_bits(num_codegens as i32 - 4, 4);
        for &o in &CODEGEN_ORDER[..num_codegens] {
            let value = self.codegen_encoding.codes[o].len;
            self.write_bits(i32::from(value), 3);
        }
        let mut i = 0;
        loop {
            let code_word = self.codegen[i];
            i += 1;
            if code_word == BAD_CODE {
                break;
            }
            let c = self.codegen_encoding.codes[code_word as usize];
            self.write_code(c);
            let extra = match code_word {
                16 => 2,
                17 => 3,
                18 => 7,
                _ => 0,
            };
            if extra != 0 {
                self.write_bits(i32::from(self.codegen[i]), extra);
                i += 1;
            }
        }
    }

    fn write_stored_header(&mut self, length: usize, is_eof: bool) {
        if self.err {
            return;
        }
        self.write_bits(i32::from(is_eof), 3);
        self.flush();
        self.write_bits(length as i32 & 0xffff, 16);
        self.write_bits(i32::from(!(length as u16)), 16);
    }

    fn write_fixed_header(&mut self, is_eof: bool) {
        if self.err {
            return;
        }
        self.write_bits(if is_eof { 3 } else { 2 }, 3);
    }

    /// Counts the tokens plus the end-of-block marker Go appends to them.
    fn index_tokens(&mut self, tokens: &[u32]) -> (usize, usize) {
        self.literal_freq.fill(0);
        self.offset_freq.fill(0);
        for &t in tokens {
            if t < MATCH_TYPE {
                self.literal_freq[(t & 0xff) as usize] += 1;
                continue;
            }
            let length = (t - MATCH_TYPE) >> LENGTH_SHIFT;
            let offset = t & OFFSET_MASK;
            self.literal_freq[LENGTH_CODES_START + length_code(length)] += 1;
            self.offset_freq[offset_code(offset)] += 1;
        }
        self.literal_freq[END_BLOCK_MARKER] += 1;
        let mut num_literals = MAX_NUM_LIT;
        while self.literal_freq[num_literals - 1] == 0 {
            num_literals -= 1;
        }
        let mut num_offsets = OFFSET_CODE_COUNT;
        while num_offsets > 0 && self.offset_freq[num_offsets - 1] == 0 {
            num_offsets -= 1;
        }
        if num_offsets == 0 {
            self.offset_freq[0] = 1;
            num_offsets = 1;
        }
        self.literal_encoding.generate(&self.literal_freq, 15);
        self.offset_encoding.generate(&self.offset_freq, 15);
        (num_literals, num_offsets)
    }

    fn own_codegen(&mut self, num_literals: usize, num_offsets: usize, huff_offset: bool) {
        let off = if huff_offset { &self.huff_offset.codes } else { &self.offset_encoding.codes };
        generate_codegen(&mut self.codegen, &mut self.codegen_freq, num_literals, num_offsets, &self.literal_encoding.codes, off);
        self.codegen_encoding.generate(&self.codegen_freq, 7);
    }

    fn write_block(&mut self, tokens: &[u32], eof: bool, input: Option<&[u8]>) {
        if self.err {
            return;
        }
        let (num_literals, num_offsets) = self.index_tokens(tokens);
        let mut extra_bits = 0i64;
        let (stored_size, storable) = Self::stored_size(input);
        if storable {
            for lc in LENGTH_CODES_START + 8..num_literals {
                extra_bits += i64::from(self.literal_freq[lc]) * i64::from(LENGTH_EXTRA_BITS[lc - LENGTH_CODES_START]);
            }
            for (f, e) in self.offset_freq.iter().zip(OFFSET_EXTRA_BITS).take(num_offsets).skip(4) {
                extra_bits += i64::from(*f) * i64::from(e);
            }
        }
        let mut enc = Enc::Fixed;
        let mut size = self.fixed_size(extra_bits);
        self.own_codegen(num_literals, num_offsets, false);
        let (dynamic_size, num_codegens) = self.dynamic_size(&self.literal_encoding, &self.offset_encoding, extra_bits);
        if dynamic_size < size {
            size = dynamic_size;
            enc = Enc::Dynamic;
        }
        if let (true, Some(input)) = (storable && stored_size < size, input) {
            self.write_stored_header(input.len(), eof);
            self.write_bytes(input);
            return;
        }
        if enc == Enc::Fixed {
            self.write_fixed_header(eof);
        } else {
            self.write_dynamic_header(num_literals, num_offsets, num_codegens, eof);
        }
        self.write_tokens(tokens, enc);
    }

    fn write_block_dynamic(&mut self, tokens: &[u32], eof: bool, input: Option<&[u8]>) {
        if self.err {
            return;
        }
        let (num_literals, num_offsets) = self.index_tokens(tokens);
        self.own_codegen(num_literals, num_offsets, false);
        let (size, num_codegens) = self.dynamic_size(&self.literal_encoding, &self.offset_encoding, 0);
        let (ssize, storable) = Self::stored_size(input);
        if let (true, Some(input)) = (storable && ssize < size + (size >> 4), input) {
            self.write_stored_header(input.len(), eof);
            self.write_bytes(input);
            return;
        }
        self.write_dynamic_header(num_literals, num_offsets, num_codegens, eof);
        self.write_tokens(tokens, Enc::Dynamic);
    }

    fn write_tokens(&mut self, tokens: &[u32], enc: Enc) {
        if self.err {
            return;
        }
        for &t in tokens {
            let (le, oe) = match enc {
                Enc::Fixed => (&self.fixed_literal.codes, &self.fixed_offset.codes),
                Enc::Dynamic => (&self.literal_encoding.codes, &self.offset_encoding.codes),
            };
            if t < MATCH_TYPE {
                let c = le[(t & 0xff) as usize];
                self.write_code(c);
                continue;
            }
            let length = (t - MATCH_TYPE) >> LENGTH_SHIFT;
            let lc = length_code(length);
            let c = le[lc + LENGTH_CODES_START];
            let offset = t & OFFSET_MASK;
            let oc = offset_code(offset);
            let oc_code = oe[oc];
            self.write_code(c);
            let extra_length_bits = LENGTH_EXTRA_BITS[lc] as u32;
            if extra_length_bits > 0 {
                self.write_bits(length.wrapping_sub(LENGTH_BASE[lc]) as i32, extra_length_bits);
            }
            self.write_code(oc_code);
            let extra_offset_bits = OFFSET_EXTRA_BITS[oc] as u32;
            if extra_offset_bits > 0 {
                self.write_bits(offset.wrapping_sub(OFFSET_BASE[oc]) as i32, extra_offset_bits);
            }
        }
        let end = match enc {
            Enc::Fixed => self.fixed_literal.codes[END_BLOCK_MARKER],
            Enc::Dynamic => self.literal_encoding.codes[END_BLOCK_MARKER],
        };
        self.write_code(end);
    }

    fn write_block_huff(&mut self, eof: bool, input: &[u8]) {
        if self.err {
            return;
        }
        self.literal_freq.fill(0);
        for &b in input {
            self.literal_freq[b as usize] += 1;
        }
        self.literal_freq[END_BLOCK_MARKER] = 1;
        self.offset_freq[0] = 1;
        self.literal_encoding.generate(&self.literal_freq, 15);
        self.own_codegen(END_BLOCK_MARKER + 1, 1, true);
        let (size, num_codegens) = self.dynamic_size(&self.literal_encoding, &self.huff_offset, 0);
        let (ssize, storable) = Self::stored_size(Some(input));
        if storable && ssize < size + (size >> 4) {
            self.write_stored_header(input.len(), eof);
            self.write_bytes(input);
            return;
        }
        self.write_dynamic_header(END_BLOCK_MARKER + 1, 1, num_codegens, eof);
        for &b in input {
            let c = self.literal_encoding.codes[b as usize];
            self.write_code(c);
            if self.err {
                return;
            }
        }
        let c = self.literal_encoding.codes[END_BLOCK_MARKER];
        self.write_code(c);
    }
}

// ------------------------------------------------------------------ deflatefast.go

const TABLE_BITS: u32 = 14;
const TABLE_SIZE: usize = 1 << TABLE_BITS;
const TABLE_MASK: u32 = (TABLE_SIZE as u32) - 1;
const TABLE_SHIFT: u32 = 32 - TABLE_BITS;
const BUFFER_RESET: i32 = i32::MAX - (MAX_STORE_BLOCK_SIZE as i32) * 2;
const INPUT_MARGIN: usize = 16 - 1;
const MIN_NON_LITERAL_BLOCK_SIZE: usize = 1 + 1 + INPUT_MARGIN;

fn load32(b: &[u8], i: i32) -> u32 {
    let i = i as usize;
    u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]])
}

fn load64(b: &[u8], i: i32) -> u64 {
    let i = i as usize;
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[i..i + 8]);
    u64::from_le_bytes(a)
}

fn fast_hash(u: u32) -> u32 {
    u.wrapping_mul(HASHMUL) >> TABLE_SHIFT
}

#[derive(Clone, Copy, Default)]
struct TableEntry {
    val: u32,
    offset: i32,
}

struct DeflateFast {
    table: Vec<TableEntry>,
    prev: Vec<u8>,
    cur: i32,
}

impl DeflateFast {
    fn new() -> Self {
        DeflateFast {
            table: vec![TableEntry::default(); TABLE_SIZE],
            prev: Vec::with_capacity(MAX_STORE_BLOCK_SIZE),
            cur: MAX_STORE_BLOCK_SIZE as i32,
        }
    }

    fn encode(&mut self, dst: &mut Vec<u32>, src: &[u8]) {
        if self.cur >= BUFFER_RESET {
            self.shift_offsets();
        }
        if src.len() < MIN_NON_LITERAL_BLOCK_SIZE {
            self.cur += MAX_STORE_BLOCK_SIZE as i32;
            self.prev.clear();
            dst.extend(src.iter().map(|&b| literal_token(b)));
            return;
        }
        let s_limit = (src.len() - INPUT_MARGIN) as i32;
        let mut next_emit: i32 = 0;
        let mut s: i32 = 0;
        let mut cv = load32(src, s);
        let mut next_hash = fast_hash(cv);
        'outer: loop {
            let mut skip: i32 = 32;
            let mut next_s = s;
            let mut candidate;
            loop {
                s = next_s;
                let between = skip >> 5;
                next_s = s + between;
                skip += between;
                if next_s > s_limit {
                    break 'outer;
                }
                candidate = self.table[(next_hash & TABLE_MASK) as usize];
                let now = load32(src, next_s);
                self.table[(next_hash & TABLE_MASK) as usize] = TableEntry { offset: s + self.cur, val: cv };
                next_hash = fast_hash(now);
                let offset = s - (candidate.offset - self.cur);
                if offset > MAX_MATCH_OFFSET || cv != candidate.val {
                    cv = now;
                    continue;
                }
                break;
            }
            dst.extend(src[next_emit as usize..s as usize].iter().map(|&b| literal_token(b)));
            loop {
                s += 4;
                let t = candidate.offset - self.cur + 4;
                let l = self.match_len(s, t, src);
                dst.push(match_token(
                    (i64::from(l) + 4 - BASE_MATCH_LENGTH) as u32,
                    (i64::from(s) - i64::from(t) - BASE_MATCH_OFFSET) as u32,
                ));
                s += l;
                next_emit = s;
                if s >= s_limit {
                    break 'outer;
                }
                let mut x = load64(src, s - 1);
                let prev_hash = fast_hash(x as u32);
                self.table[(prev_hash & TABLE_MASK) as usize] = TableEntry { offset: self.cur + s - 1, val: x as u32 };
                x >>= 8;
                let curr_hash = fast_hash(x as u32);
                candidate = self.table[(curr_hash & TABLE_MASK) as usize];
                self.table[(curr_hash & TABLE_MASK) as usize] = TableEntry { offset: self.cur + s, val: x as u32 };
                let offset = s - (candidate.offset - self.cur);
                if offset > MAX_MATCH_OFFSET || x as u32 != candidate.val {
                    cv = (x >> 8) as u32;
                    next_hash = fast_hash(cv);
                    s += 1;
                    break;
                }
            }
        }
        if (next_emit as usize) < src.len() {
            dst.extend(src[next_emit as usize..].iter().map(|&b| literal_token(b)));
        }
        self.cur += src.len() as i32;
        self.prev.clear();
        self.prev.extend_from_slice(src);
    }

    fn match_len(&self, s: i32, t: i32, src: &[u8]) -> i32 {
        let s = s as usize;
        let s1 = (s + MAX_MATCH_LENGTH as usize - 4).min(src.len());
        if t >= 0 {
            let t = t as usize;
            let a = &src[s..s1];
            let b = &src[t..t + a.len()];
            return common_prefix(a, b) as i32;
        }
        let tp = self.prev.len() as i32 + t;
        if tp < 0 {
            return 0;
        }
        let a = &src[s..s1];
        let b = &self.prev[tp as usize..];
        let m = a.len().min(b.len());
        let n = common_prefix(&a[..m], &b[..m]);
        if n < m {
            return n as i32;
        }
        if s + n == s1 {
            return n as i32;
        }
        let a = &src[s + n..s1];
        let b = &src[..a.len()];
        (common_prefix(a, b) + n) as i32
    }

    fn reset(&mut self) {
        self.prev.clear();
        self.cur += MAX_MATCH_OFFSET;
        if self.cur >= BUFFER_RESET {
            self.shift_offsets();
        }
    }

    fn shift_offsets(&mut self) {
        if self.prev.is_empty() {
            self.table.fill(TableEntry::default());
            self.cur = MAX_MATCH_OFFSET + 1;
            return;
        }
        for e in self.table.iter_mut() {
            let v = e.offset - self.cur + MAX_MATCH_OFFSET + 1;
            e.offset = v.max(0);
        }
        self.cur = MAX_MATCH_OFFSET + 1;
    }
}

/// The length of the common prefix of two equally long slices.
#[inline]
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 8 <= n {
        let mut x = [0u8; 8];
        let mut y = [0u8; 8];
        x.copy_from_slice(&a[i..i + 8]);
        y.copy_from_slice(&b[i..i + 8]);
        let d = u64::from_le_bytes(x) ^ u64::from_le_bytes(y);
        if d != 0 {
            return i + (d.trailing_zeros() / 8) as usize;
        }
        i += 8;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

// ---------------------------------------------------------------------- deflate.go

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Store,
    Huff,
    Fast,
    Deflate,
}

fn hash4(b: &[u8]) -> u32 {
    let v = u32::from(b[3]) | u32::from(b[2]) << 8 | u32::from(b[1]) << 16 | u32::from(b[0]) << 24;
    v.wrapping_mul(HASHMUL) >> (32 - HASH_BITS)
}

struct Compressor<S: Sink> {
    mode: Mode,
    good: i64,
    lazy: i64,
    nice: i64,
    chain: i64,
    fast_skip_hashing: i64,
    w: BitWriter<S>,
    sync: bool,
    best_speed: Option<DeflateFast>,
    chain_head: i64,
    hash_head: Vec<u32>,
    hash_prev: Vec<u32>,
    hash_offset: i64,
    index: i64,
    window: Vec<u8>,
    window_end: i64,
    block_start: i64,
    byte_available: bool,
    tokens: Vec<u32>,
    length: i64,
    offset: i64,
    max_insert_index: i64,
    closed: bool,
}

impl<S: Sink> Compressor<S> {
    fn new(sink: S, level: i32) -> Option<Self> {
        // (level, good, lazy, nice, chain, fastSkipHashing)
        const LEVELS: [[i64; 5]; 10] = [
            [0, 0, 0, 0, 0],
            [0, 0, 0, 0, 0],
            [4, 0, 16, 8, 5],
            [4, 0, 32, 32, 6],
            [4, 4, 16, 16, SKIP_NEVER],
            [8, 16, 32, 32, SKIP_NEVER],
            [8, 16, 128, 128, SKIP_NEVER],
            [8, 32, 128, 256, SKIP_NEVER],
            [32, 128, 258, 1024, SKIP_NEVER],
            [32, 258, 258, 4096, SKIP_NEVER],
        ];
        let level = if level == -1 { 6 } else { level };
        let mode = match level {
            0 => Mode::Store,
            -2 => Mode::Huff,
            1 => Mode::Fast,
            2..=9 => Mode::Deflate,
            _ => return None,
        };
        let p = if mode == Mode::Deflate { LEVELS[level as usize] } else { [0; 5] };
        let deflating = mode == Mode::Deflate;
        Some(Compressor {
            mode,
            good: p[0],
            lazy: p[1],
            nice: p[2],
            chain: p[3],
            fast_skip_hashing: p[4],
            w: BitWriter::new(sink),
            sync: false,
            best_speed: if mode == Mode::Fast { Some(DeflateFast::new()) } else { None },
            chain_head: -1,
            hash_head: if deflating { vec![0; HASH_SIZE] } else { Vec::new() },
            hash_prev: if deflating { vec![0; WINDOW_SIZE as usize] } else { Vec::new() },
            hash_offset: 1,
            index: 0,
            window: vec![0; if deflating { 2 * WINDOW_SIZE as usize } else { MAX_STORE_BLOCK_SIZE }],
            window_end: 0,
            block_start: 0,
            byte_available: false,
            tokens: Vec::with_capacity(match mode {
                Mode::Deflate => MAX_FLATE_BLOCK_TOKENS + 1,
                Mode::Fast => MAX_STORE_BLOCK_SIZE,
                _ => 0,
            }),
            length: MIN_MATCH_LENGTH - 1,
            offset: 0,
            max_insert_index: 0,
            closed: false,
        })
    }

    fn step(&mut self) {
        match self.mode {
            Mode::Store => self.store(),
            Mode::Huff => self.store_huff(),
            Mode::Fast => self.enc_speed(),
            Mode::Deflate => self.deflate(),
        }
    }

    fn fill(&mut self, b: &[u8]) -> usize {
        if self.mode == Mode::Deflate {
            self.fill_deflate(b)
        } else {
            self.fill_store(b)
        }
    }

    fn write(&mut self, mut b: &[u8]) {
        if self.w.err || self.closed {
            return;
        }
        while !b.is_empty() {
            self.step();
            let n = self.fill(b);
            b = &b[n..];
            if self.w.err {
                return;
            }
        }
    }

    fn close(&mut self) {
        if self.w.err || self.closed {
            return;
        }
        self.sync = true;
        self.step();
        if self.w.err {
            return;
        }
        self.w.write_stored_header(0, true);
        self.w.flush();
        self.closed = true;
    }

    fn fill_store(&mut self, b: &[u8]) -> usize {
        let we = self.window_end as usize;
        let n = b.len().min(self.window.len() - we);
        self.window[we..we + n].copy_from_slice(&b[..n]);
        self.window_end += n as i64;
        n
    }

    fn store(&mut self) {
        if self.window_end > 0 && (self.window_end as usize == MAX_STORE_BLOCK_SIZE || self.sync) {
            let we = self.window_end as usize;
            self.w.write_stored_header(we, false);
            self.w.write_bytes(&self.window[..we]);
            self.window_end = 0;
        }
    }

    fn store_huff(&mut self) {
        if ((self.window_end as usize) < self.window.len() && !self.sync) || self.window_end == 0 {
            return;
        }
        let we = self.window_end as usize;
        self.w.write_block_huff(false, &self.window[..we]);
        self.window_end = 0;
    }

    fn enc_speed(&mut self) {
        let we = self.window_end as usize;
        let Some(fast) = self.best_speed.as_mut() else { return };
        if we < MAX_STORE_BLOCK_SIZE {
            if !self.sync {
                return;
            }
            if we < 128 {
                if we == 0 {
                    return;
                } else if we <= 16 {
                    self.w.write_stored_header(we, false);
                    self.w.write_bytes(&self.window[..we]);
                } else {
                    self.w.write_block_huff(false, &self.window[..we]);
                }
                self.window_end = 0;
                fast.reset();
                return;
            }
        }
        self.tokens.clear();
        fast.encode(&mut self.tokens, &self.window[..we]);
        if self.tokens.len() > we - (we >> 4) {
            self.w.write_block_huff(false, &self.window[..we]);
        } else {
            self.w.write_block_dynamic(&self.tokens, false, Some(&self.window[..we]));
        }
        self.window_end = 0;
    }

    fn fill_deflate(&mut self, b: &[u8]) -> usize {
        if self.index >= 2 * WINDOW_SIZE - (MIN_MATCH_LENGTH + MAX_MATCH_LENGTH) {
            let ws = WINDOW_SIZE as usize;
            self.window.copy_within(ws..2 * ws, 0);
            self.index -= WINDOW_SIZE;
            self.window_end -= WINDOW_SIZE;
            if self.block_start >= WINDOW_SIZE {
                self.block_start -= WINDOW_SIZE;
            } else {
                self.block_start = i64::from(i32::MAX);
            }
            self.hash_offset += WINDOW_SIZE;
            if self.hash_offset > MAX_HASH_OFFSET {
                let delta = self.hash_offset - 1;
                self.hash_offset -= delta;
                self.chain_head -= delta;
                for v in self.hash_prev.iter_mut().chain(self.hash_head.iter_mut()) {
                    *v = if i64::from(*v) > delta { (i64::from(*v) - delta) as u32 } else { 0 };
                }
            }
        }
        let we = self.window_end as usize;
        let n = b.len().min(self.window.len() - we);
        self.window[we..we + n].copy_from_slice(&b[..n]);
        self.window_end += n as i64;
        n
    }

    fn write_block(&mut self, index: i64) {
        if index > 0 {
            let window = if self.block_start <= index { Some(&self.window[self.block_start as usize..index as usize]) } else { None };
            self.block_start = index;
            self.w.write_block(&self.tokens, false, window);
        }
    }

    fn find_match(&self, pos: i64, prev_head: i64, prev_length: i64, lookahead: i64) -> Option<(i64, i64)> {
        let min_match_look = lookahead.min(MAX_MATCH_LENGTH);
        let win = &self.window[..(pos + min_match_look) as usize];
        let nice = min_match_look.min(self.nice);
        let mut tries = self.chain;
        let mut length = prev_length;
        if length >= self.good {
            tries >>= 2;
        }
        let p = pos as usize;
        let mut w_end = win[p + length as usize];
        let w_pos = &win[p..];
        let min_index = pos - WINDOW_SIZE;
        let mut found = None;
        let mut i = prev_head;
        while tries > 0 {
            let iu = i as usize;
            if w_end == win[iu + length as usize] {
                let mm = min_match_look as usize;
                let n = common_prefix(&win[iu..iu + mm], &w_pos[..mm]) as i64;
                if n > length && (n > MIN_MATCH_LENGTH || pos - i <= 4096) {
                    length = n;
                    found = Some((n, pos - i));
                    if n >= nice {
                        break;
                    }
                    w_end = win[p + n as usize];
                }
            }
            if i == min_index {
                break;
            }
            i = i64::from(self.hash_prev[(i & WINDOW_MASK) as usize]) - self.hash_offset;
            if i < min_index || i < 0 {
                break;
            }
            tries -= 1;
        }
        found
    }

    fn insert_hash(&mut self, index: i64) -> u32 {
        let i = index as usize;
        let h = (hash4(&self.window[i..i + 4]) & HASH_MASK) as usize;
        let old = self.hash_head[h];
        self.hash_prev[(index & WINDOW_MASK) as usize] = old;
        self.hash_head[h] = (index + self.hash_offset) as u32;
        old
    }

    fn deflate(&mut self) {
        if self.window_end - self.index < MIN_MATCH_LENGTH + MAX_MATCH_LENGTH && !self.sync {
            return;
        }
        self.max_insert_index = self.window_end - (MIN_MATCH_LENGTH - 1);
        let skip_never = self.fast_skip_hashing == SKIP_NEVER;
        loop {
            if self.index > self.window_end {
                return; // Go panics ("index > windowEnd"); unreachable
            }
            let lookahead = self.window_end - self.index;
            if lookahead < MIN_MATCH_LENGTH + MAX_MATCH_LENGTH {
                if !self.sync {
                    break;
                }
                if lookahead == 0 {
                    if self.byte_available {
                        let lit = self.window[(self.index - 1) as usize];
                        self.tokens.push(literal_token(lit));
                        self.byte_available = false;
                    }
                    if !self.tokens.is_empty() {
                        self.write_block(self.index);
                        if self.w.err {
                            return;
                        }
                        self.tokens.clear();
                    }
                    break;
                }
            }
            if self.index < self.max_insert_index {
                self.chain_head = i64::from(self.insert_hash(self.index));
            }
            let prev_length = self.length;
            let prev_offset = self.offset;
            self.length = MIN_MATCH_LENGTH - 1;
            self.offset = 0;
            let min_index = (self.index - WINDOW_SIZE).max(0);
            if self.chain_head - self.hash_offset >= min_index
                && (!skip_never && lookahead > MIN_MATCH_LENGTH - 1 || skip_never && lookahead > prev_length && prev_length < self.lazy)
            {
                if let Some((l, o)) = self.find_match(self.index, self.chain_head - self.hash_offset, MIN_MATCH_LENGTH - 1, lookahead) {
                    self.length = l;
                    self.offset = o;
                }
            }
            if !skip_never && self.length >= MIN_MATCH_LENGTH || skip_never && prev_length >= MIN_MATCH_LENGTH && self.length <= prev_length
            {
                let t = if !skip_never {
                    match_token((self.length - BASE_MATCH_LENGTH) as u32, (self.offset - BASE_MATCH_OFFSET) as u32)
                } else {
                    match_token((prev_length - BASE_MATCH_LENGTH) as u32, (prev_offset - BASE_MATCH_OFFSET) as u32)
                };
                self.tokens.push(t);
                if self.length <= self.fast_skip_hashing {
                    let new_index = if !skip_never { self.index + self.length } else { self.index + prev_length - 1 };
                    let mut index = self.index + 1;
                    while index < new_index {
                        if index < self.max_insert_index {
                            self.insert_hash(index);
                        }
                        index += 1;
                    }
                    self.index = index;
                    if skip_never {
                        self.byte_available = false;
                        self.length = MIN_MATCH_LENGTH - 1;
                    }
                } else {
                    self.index += self.length;
                }
                if self.tokens.len() == MAX_FLATE_BLOCK_TOKENS {
                    self.write_block(self.index);
                    if self.w.err {
                        return;
                    }
                    self.tokens.clear();
                }
            } else {
                if !skip_never || self.byte_available {
                    let i = if !skip_never { self.index } else { self.index - 1 };
                    self.tokens.push(literal_token(self.window[i as usize]));
                    if self.tokens.len() == MAX_FLATE_BLOCK_TOKENS {
                        self.write_block(i + 1);
                        if self.w.err {
                            return;
                        }
                        self.tokens.clear();
                    }
                }
                self.index += 1;
                if skip_never {
                    self.byte_available = true;
                }
            }
        }
    }
}

// ------------------------------------------------------------------------ API

/// The raw DEFLATE stream Go's `flate.NewWriter(w, level)` + `Write(data)` +
/// `Close()` writes. `level` -2..=9 (-1 = 6); any other level gives an empty
/// vector (Go's `NewWriter` returns an error).
pub fn deflate(data: &[u8], level: i32) -> Vec<u8> {
    let mut w = match Writer::new(level) {
        Some(w) => w,
        None => return Vec::new(),
    };
    w.write(data);
    w.finish()
}

/// Whether `deflate(data, level) == expected`, stopping at the first output
/// byte that differs (the bit writer hands on its bytes in runs of up to 240,
/// and a stored block's data at once, so a difference is seen within about
/// one such run of where Go's output would differ).
pub fn matches(data: &[u8], level: i32, expected: &[u8]) -> bool {
    let Some(mut c) = Compressor::new(CompareSink { expected, pos: 0 }, level) else {
        return false;
    };
    c.write(data);
    c.close();
    !c.w.err && c.closed && c.w.sink.pos == expected.len()
}

/// Runs [`deflate`] handing its output to `sink` as the bit writer writes it
/// (runs of up to 248 bytes, a stored block's data at once); `sink` returns
/// false to stop (the compressor stops there, as Go's does on a write
/// error). Returns true when the stream was closed with every run accepted;
/// false if stopped or if `level` is outside -2..=9.
pub fn run(data: &[u8], level: i32, sink: impl FnMut(&[u8]) -> bool) -> bool {
    let Some(mut c) = Compressor::new(FnSink(sink), level) else {
        return false;
    };
    c.write(data);
    c.close();
    !c.w.err && c.closed
}

/// Go's `flate.Writer`: [`Writer::write`] any number of times, then
/// [`Writer::finish`] (Go's `Close`). The output does not depend on how the
/// input is split (see the module documentation); this form is here to show it.
pub struct Writer {
    c: Compressor<Vec<u8>>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("goflate::Writer").field("output_len", &self.c.w.sink.len()).finish()
    }
}

impl Writer {
    /// `flate.NewWriter(w, level)`; `None` for a level outside -2..=9.
    pub fn new(level: i32) -> Option<Writer> {
        Compressor::new(Vec::new(), level).map(|c| Writer { c })
    }

    /// `Write(data)`.
    pub fn write(&mut self, data: &[u8]) {
        self.c.write(data);
    }

    /// `Close()`: the stream.
    pub fn finish(mut self) -> Vec<u8> {
        self.c.close();
        std::mem::take(&mut self.c.w.sink)
    }
}
