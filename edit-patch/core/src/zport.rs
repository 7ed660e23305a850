//! zlib's raw deflate, byte for byte, and the re-deflation of a shifted block
//! that reuses the old block's LZ77 parse.
//!
//! LibreOffice deflates a big part block-parallel: each 128 KiB block of the
//! content is compressed by its own zlib stream (raw, windowBits 15, memLevel
//! 8, default strategy), preset with the 32 KiB before it and ended with
//! Z_SYNC_FLUSH (the last one with Z_FINISH), in one `deflate` call with all
//! of the block's input and room for all of its output. A character typed
//! early in the content shifts the input of every later block by one byte,
//! and the receiver today deflates each of them again with zlib.
//!
//! This module is a port of what zlib (the 1.3.2 that `libz-sys` builds here,
//! whose deflate output is that of Debian's 1.2.13 too) does in that call:
//! `deflateSetDictionary`, `fill_window` with its window slides and
//! high-water zeroing, `longest_match`, `deflate_fast` (levels 1-3) and
//! `deflate_slow` (4-9), and trees.c (`build_tree`, `gen_bitlen`,
//! `gen_codes`, `send_tree`, `compress_block`, the stored / static / dynamic
//! choice of `_tr_flush_block`, the empty stored block of a sync flush). Only
//! the default strategy is ported, and level 0 (`deflate_stored`) is not.
//! It runs in two phases: the LZ77 parse makes zlib's symbol list ([`Sym`]),
//! then the symbols are cut into zlib's blocks (every `lit_bufsize - 1`
//! symbols) and coded. Where a block may be stored depends on whether its
//! first byte is still in zlib's window when it is flushed, which depends on
//! when the window slid; that is replayed from the symbols alone
//! ([`plan_blocks`]), so the coding phase needs no parse state.
//!
//! [`deflate_shifted`] re-deflates a block whose input is an old block's
//! input with an edit in it or before it (the later blocks of a member are
//! the old ones shifted by the edit's length). zlib's parse of a position
//! depends only on the bytes from MAX_DIST before it to 259 after it, the
//! hash chains over that span (every position is inserted at levels 4-9; at
//! 1-3 long matches skip insertions, which is compared) and the lazy-match
//! state, which is the same after every emitted match (levels 4-9) or every
//! symbol (1-3). Window slides change no parse decision away from the end of
//! the input (a slid-out position and one beyond MAX_DIST are refused alike,
//! and window index 0, zlib's NIL, is within MAX_DIST of the current
//! position only in a stream's first MAX_DIST bytes, where no shifted parse
//! is joined, or its last 262). So the old symbols (read back from
//! the old compressed bytes) are copied before the first changed byte, up to
//! a boundary 270 bytes before it; the parse restarts there and runs until
//! it emits a symbol ending where an old symbol ended, shifted, with that
//! state and the changed bytes more than a window behind; from there the old
//! symbols are copied again up to about 530 bytes before the end of the
//! input, where zlib's lookahead shrinks; the end is parsed again. A restart
//! rebuilds zlib's window (its slides and fills replayed from the symbols,
//! so the bytes zlib reads past the end of its data are the same) and its
//! hash chains. The Huffman coding of the whole block is then redone, which
//! is cheap. The result is zlib's output when the old block is zlib's own
//! output for the old input with the same parameters (which the caller
//! knows, e.g. from a recipe found or checked for it); otherwise it still
//! inflates to the new input (the old symbols are checked against the old
//! input, and copied only where both inputs agree) but may differ from
//! zlib's. Where the old block holds stored blocks (no symbols to read) the
//! block is parsed whole.

use crate::deflate::ZlibParams;

const MIN_MATCH: usize = 3;
const MAX_MATCH: usize = 258;
const MIN_LOOKAHEAD: usize = MAX_MATCH + MIN_MATCH + 1;
const TOO_FAR: usize = 4096;
const WIN_INIT: usize = MAX_MATCH;

/// zlib's `configuration_table` for levels 1 to 9 (index 0 unused).
const CONFIG: [(u16, u16, u16, u16); 10] = [
    (0, 0, 0, 0),
    (4, 4, 8, 4),
    (4, 5, 16, 8),
    (4, 6, 32, 32),
    (4, 4, 16, 16),
    (8, 16, 32, 32),
    (8, 16, 128, 128),
    (8, 32, 128, 256),
    (32, 128, 258, 1024),
    (32, 258, 258, 4096),
];

/// One LZ77 symbol as zlib's symbol buffer holds it: `dist == 0` is the
/// literal byte `lc`, otherwise a match of length `lc + 3` at distance `dist`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sym {
    pub dist: u16,
    pub lc: u8,
}

impl Sym {
    fn lit(c: u8) -> Sym {
        Sym { dist: 0, lc: c }
    }
    fn is_match(self) -> bool {
        self.dist != 0
    }
    /// Input bytes covered.
    fn span(self) -> usize {
        if self.dist == 0 {
            1
        } else {
            self.lc as usize + MIN_MATCH
        }
    }
}

/// The parameters this port supports: raw deflate, levels 1-9, windowBits
/// 9-15, any memLevel, default strategy.
fn supported(p: ZlibParams) -> bool {
    p.is_valid() && (1..=9).contains(&p.level) && p.window_bits >= 9 && p.strategy == 0
}

/// Where the ported deflate call starts: the stream is the dictionary's last
/// 2^window_bits bytes followed by the input.
fn stream_of(dict: &[u8], input: &[u8], w_size: usize) -> (Vec<u8>, usize) {
    let dict = &dict[dict.len().saturating_sub(w_size)..];
    let mut s = Vec::with_capacity(dict.len() + input.len());
    s.extend_from_slice(dict);
    s.extend_from_slice(input);
    (s, dict.len())
}

/// Raw deflate of `input` preset with `dict` (none if empty), ended with
/// Z_FINISH (`finish`) or Z_SYNC_FLUSH, as one zlib `deflate` call with all
/// the input and enough room writes it. None for unsupported parameters.
pub fn deflate(dict: &[u8], input: &[u8], params: ZlibParams, finish: bool) -> Option<Vec<u8>> {
    if !supported(params) {
        return None;
    }
    let (stream, p0) = stream_of(dict, input, 1 << params.window_bits);
    Some(deflate_stream(&stream, p0, params, finish))
}

/// [`deflate`] of `stream[p0..]` preset with `stream[..p0]` (at most a window).
fn deflate_stream(stream: &[u8], p0: usize, params: ZlibParams, finish: bool) -> Vec<u8> {
    let mut lz = Lz::new(stream, p0, params);
    lz.run(&mut |_, _| false);
    encode(&lz.syms, stream, p0, params, finish)
}

// ---------------------------------------------------------------------------
// LZ77: deflate.c

/// zlib's deflate state for the parse, in its window coordinates: window
/// index `i` holds stream byte `base + i`.
struct Lz<'a> {
    stream: &'a [u8],
    /// End of the input fill_window may read (the dictionary's end while it is set).
    avail_end: usize,
    /// Next stream byte to read into the window.
    next_in: usize,
    base: usize,
    w_size: usize,
    w_mask: usize,
    window: Vec<u8>,
    prev: Vec<u16>,
    head: Vec<u16>,
    ins_h: usize,
    hash_mask: usize,
    hash_shift: u32,
    strstart: usize,
    lookahead: usize,
    insert: usize,
    match_length: usize,
    match_start: usize,
    prev_length: usize,
    prev_match: usize,
    match_available: bool,
    high_water: usize,
    good: usize,
    lazy: usize,
    nice: usize,
    chain: usize,
    slow: bool,
    /// False while only the window is replayed (no hash upkeep).
    hash_on: bool,
    syms: Vec<Sym>,
    /// deflate_fast: the stream positions long matches left out of the hash.
    skips: Vec<(usize, usize)>,
    /// The stream positions of the loop tops where the window slid.
    slid_at: Vec<usize>,
}

impl<'a> Lz<'a> {
    /// deflateInit2 + deflateSetDictionary(stream[..p0]) when p0 > 0.
    fn new(stream: &'a [u8], p0: usize, p: ZlibParams) -> Self {
        let w_size = 1usize << p.window_bits;
        let hash_bits = u32::from(p.mem_level) + 7;
        let (good, lazy, nice, chain) = CONFIG[p.level as usize];
        let mut lz = Lz {
            stream,
            avail_end: p0,
            next_in: 0,
            base: 0,
            w_size,
            w_mask: w_size - 1,
            window: vec![0; 2 * w_size],
            prev: vec![0; w_size],
            head: vec![0; 1 << hash_bits],
            ins_h: 0,
            hash_mask: (1 << hash_bits) - 1,
            hash_shift: hash_bits.div_ceil(3),
            strstart: 0,
            lookahead: 0,
            insert: 0,
            match_length: MIN_MATCH - 1,
            match_start: 0,
            prev_length: MIN_MATCH - 1,
            prev_match: 0,
            match_available: false,
            high_water: 0,
            good: good.into(),
            lazy: lazy.into(),
            nice: nice.into(),
            chain: chain.into(),
            slow: p.level >= 4,
            hash_on: true,
            syms: Vec::new(),
            skips: Vec::new(),
            slid_at: Vec::new(),
        };
        if p0 > 0 {
            lz.set_dictionary();
        }
        lz.avail_end = stream.len();
        lz
    }

    fn max_dist(&self) -> usize {
        self.w_size - MIN_LOOKAHEAD
    }

    fn update_hash(&mut self, c: u8) {
        self.ins_h = ((self.ins_h << self.hash_shift) ^ c as usize) & self.hash_mask;
    }

    /// INSERT_STRING: returns the previous head of the chain.
    fn insert_string(&mut self, s: usize) -> usize {
        self.update_hash(self.window[s + 2]);
        let h = self.head[self.ins_h];
        self.prev[s & self.w_mask] = h;
        self.head[self.ins_h] = s as u16;
        h as usize
    }

    fn set_dictionary(&mut self) {
        self.fill_window();
        while self.lookahead >= MIN_MATCH {
            let mut s = self.strstart;
            for _ in 0..self.lookahead - (MIN_MATCH - 1) {
                self.insert_string(s);
                s += 1;
            }
            self.strstart = s;
            self.lookahead = MIN_MATCH - 1;
            self.fill_window();
        }
        self.strstart += self.lookahead;
        self.insert = self.lookahead;
        self.lookahead = 0;
        self.match_length = MIN_MATCH - 1;
        self.prev_length = MIN_MATCH - 1;
        self.match_available = false;
    }

    fn slide_hash(&mut self) {
        let w = self.w_size as u16;
        for m in self.head.iter_mut().chain(self.prev.iter_mut()) {
            *m = m.saturating_sub(w);
        }
    }

    fn fill_window(&mut self) {
        let wsize = self.w_size;
        let window_size = 2 * wsize;
        loop {
            let mut more = window_size - self.lookahead - self.strstart;
            if self.strstart >= wsize + self.max_dist() {
                self.slid_at.push(self.base + self.strstart);
                self.window.copy_within(wsize..2 * wsize - more, 0);
                self.match_start = self.match_start.wrapping_sub(wsize);
                self.strstart -= wsize;
                if self.insert > self.strstart {
                    self.insert = self.strstart;
                }
                if self.hash_on {
                    self.slide_hash();
                }
                self.base += wsize;
                more += wsize;
            }
            if self.next_in == self.avail_end {
                break;
            }
            let n = more.min(self.avail_end - self.next_in);
            let at = self.strstart + self.lookahead;
            self.window[at..at + n].copy_from_slice(&self.stream[self.next_in..self.next_in + n]);
            self.next_in += n;
            self.lookahead += n;
            if self.hash_on && self.lookahead + self.insert >= MIN_MATCH {
                let mut s = self.strstart - self.insert;
                self.ins_h = self.window[s] as usize;
                self.update_hash(self.window[s + 1]);
                while self.insert > 0 {
                    self.update_hash(self.window[s + MIN_MATCH - 1]);
                    self.prev[s & self.w_mask] = self.head[self.ins_h];
                    self.head[self.ins_h] = s as u16;
                    s += 1;
                    self.insert -= 1;
                    if self.lookahead + self.insert < MIN_MATCH {
                        break;
                    }
                }
            }
            if !(self.lookahead < MIN_LOOKAHEAD && self.next_in != self.avail_end) {
                break;
            }
        }
        if self.high_water < window_size {
            let curr = self.strstart + self.lookahead;
            if self.high_water < curr {
                let init = (window_size - curr).min(WIN_INIT);
                self.window[curr..curr + init].fill(0);
                self.high_water = curr + init;
            } else if self.high_water < curr + WIN_INIT {
                let init = (curr + WIN_INIT - self.high_water).min(window_size - self.high_water);
                self.window[self.high_water..self.high_water + init].fill(0);
                self.high_water += init;
            }
        }
    }

    /// Length of the common prefix of window[a..] and window[b..] from
    /// index 3 on (zlib skips index 2, equal by the hash), at most MAX_MATCH.
    fn match_len(&self, scan: usize, m: usize) -> usize {
        let w = &self.window;
        let mut len = 3;
        while len + 8 <= MAX_MATCH {
            let x = u64::from_le_bytes(w[scan + len..scan + len + 8].try_into().expect("8 bytes"));
            let y = u64::from_le_bytes(w[m + len..m + len + 8].try_into().expect("8 bytes"));
            if x != y {
                return len + ((x ^ y).trailing_zeros() / 8) as usize;
            }
            len += 8;
        }
        while len < MAX_MATCH && w[scan + len] == w[m + len] {
            len += 1;
        }
        len
    }

    fn longest_match(&mut self, mut cur_match: usize) -> usize {
        let mut chain_length = self.chain;
        let scan = self.strstart;
        let mut best_len = self.prev_length;
        let mut nice_match = self.nice;
        let limit = self.strstart.saturating_sub(self.max_dist());
        let mut scan_end1 = self.window[scan + best_len - 1];
        let mut scan_end = self.window[scan + best_len];
        if self.prev_length >= self.good {
            chain_length >>= 2;
        }
        if nice_match > self.lookahead {
            nice_match = self.lookahead;
        }
        loop {
            let m = cur_match;
            let w = &self.window;
            if w[m + best_len] == scan_end && w[m + best_len - 1] == scan_end1 && w[m] == w[scan] && w[m + 1] == w[scan + 1] {
                let len = self.match_len(scan, m);
                if len > best_len {
                    self.match_start = cur_match;
                    best_len = len;
                    if len >= nice_match {
                        break;
                    }
                    scan_end1 = self.window[scan + best_len - 1];
                    scan_end = self.window[scan + best_len];
                }
            }
            cur_match = self.prev[cur_match & self.w_mask] as usize;
            if cur_match <= limit {
                break;
            }
            chain_length -= 1;
            if chain_length == 0 {
                break;
            }
        }
        best_len.min(self.lookahead)
    }

    /// The stream position of strstart.
    fn pos(&self) -> usize {
        self.base + self.strstart
    }

    /// Parses to the end of the input, or until `stop` returns true at a
    /// point where the lazy state is the canonical one (after an emitted
    /// match at levels 4-9, after any symbol at 1-3); `stop` gets the stream
    /// position and this state. Returns whether the end was reached.
    fn run(&mut self, stop: &mut dyn FnMut(usize, &Self) -> bool) -> bool {
        if self.slow {
            self.run_slow(stop)
        } else {
            self.run_fast(stop)
        }
    }

    fn run_fast(&mut self, stop: &mut dyn FnMut(usize, &Self) -> bool) -> bool {
        loop {
            if self.lookahead < MIN_LOOKAHEAD {
                self.fill_window();
                if self.lookahead == 0 {
                    break;
                }
            }
            let mut hash_head = 0;
            if self.lookahead >= MIN_MATCH {
                hash_head = self.insert_string(self.strstart);
            }
            if hash_head != 0 && self.strstart - hash_head <= self.max_dist() {
                self.match_length = self.longest_match(hash_head);
            }
            if self.match_length >= MIN_MATCH {
                let dist = self.strstart.wrapping_sub(self.match_start);
                self.syms.push(Sym { dist: dist as u16, lc: (self.match_length - MIN_MATCH) as u8 });
                self.lookahead -= self.match_length;
                if self.match_length <= self.lazy && self.lookahead >= MIN_MATCH {
                    self.match_length -= 1;
                    loop {
                        self.strstart += 1;
                        self.insert_string(self.strstart);
                        self.match_length -= 1;
                        if self.match_length == 0 {
                            break;
                        }
                    }
                    self.strstart += 1;
                } else {
                    let q = self.pos();
                    self.skips.push((q + 1, q + self.match_length));
                    self.strstart += self.match_length;
                    self.match_length = 0;
                    self.ins_h = self.window[self.strstart] as usize;
                    self.update_hash(self.window[self.strstart + 1]);
                }
            } else {
                self.syms.push(Sym::lit(self.window[self.strstart]));
                self.lookahead -= 1;
                self.strstart += 1;
            }
            if stop(self.pos(), self) {
                return false;
            }
        }
        true
    }

    fn run_slow(&mut self, stop: &mut dyn FnMut(usize, &Self) -> bool) -> bool {
        loop {
            if self.lookahead < MIN_LOOKAHEAD {
                self.fill_window();
                if self.lookahead == 0 {
                    break;
                }
            }
            let mut hash_head = 0;
            if self.lookahead >= MIN_MATCH {
                hash_head = self.insert_string(self.strstart);
            }
            self.prev_length = self.match_length;
            self.prev_match = self.match_start;
            self.match_length = MIN_MATCH - 1;
            if hash_head != 0 && self.prev_length < self.lazy && self.strstart - hash_head <= self.max_dist() {
                self.match_length = self.longest_match(hash_head);
                if self.match_length == MIN_MATCH && self.strstart.wrapping_sub(self.match_start) > TOO_FAR {
                    self.match_length = MIN_MATCH - 1;
                }
            }
            if self.prev_length >= MIN_MATCH && self.match_length <= self.prev_length {
                let max_insert = self.strstart + self.lookahead - MIN_MATCH;
                let dist = (self.strstart - 1).wrapping_sub(self.prev_match);
                self.syms.push(Sym { dist: dist as u16, lc: (self.prev_length - MIN_MATCH) as u8 });
                self.lookahead -= self.prev_length - 1;
                self.prev_length -= 2;
                loop {
                    self.strstart += 1;
                    if self.strstart <= max_insert {
                        self.insert_string(self.strstart);
                    }
                    self.prev_length -= 1;
                    if self.prev_length == 0 {
                        break;
                    }
                }
                self.match_available = false;
                self.match_length = MIN_MATCH - 1;
                self.strstart += 1;
                if stop(self.pos(), self) {
                    return false;
                }
            } else if self.match_available {
                self.syms.push(Sym::lit(self.window[self.strstart - 1]));
                self.strstart += 1;
                self.lookahead -= 1;
            } else {
                self.match_available = true;
                self.strstart += 1;
                self.lookahead -= 1;
            }
        }
        if self.match_available {
            self.syms.push(Sym::lit(self.window[self.strstart - 1]));
            self.match_available = false;
        }
        true
    }
}

// ---------------------------------------------------------------------------
// Where zlib flushes its blocks, and whether each may be stored.

/// One block zlib flushes: its symbols, the stream bytes they cover, whether
/// those bytes were still in the window at the flush (else it cannot be
/// stored) and whether it is the last (Z_FINISH) block.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Block {
    syms: std::ops::Range<usize>,
    start: usize,
    len: usize,
    storable: bool,
    last: bool,
}

/// zlib's window bookkeeping replayed from the loop tops of the parse: the
/// stream position of window index 0 (`base`) and how far the input has
/// been read (`filled`).
struct Slides {
    w_size: usize,
    end: usize,
    base: usize,
    filled: usize,
    #[cfg(test)]
    slid_at: Vec<usize>,
}

impl Slides {
    fn new(w_size: usize, p0: usize, end: usize) -> Self {
        Slides {
            w_size,
            end,
            base: 0,
            filled: p0,
            #[cfg(test)]
            slid_at: Vec::new(),
        }
    }
    /// The top of deflate_fast's or deflate_slow's loop at stream position `x`.
    fn visit(&mut self, x: usize) {
        if self.filled - x >= MIN_LOOKAHEAD {
            return;
        }
        let w = self.w_size;
        loop {
            let mut more = 2 * w - (self.filled - self.base);
            if x - self.base >= w + w - MIN_LOOKAHEAD {
                #[cfg(test)]
                self.slid_at.push(x);
                self.base += w;
                more += w;
            }
            if self.filled == self.end {
                break;
            }
            self.filled += more.min(self.end - self.filled);
            if !(self.filled - x < MIN_LOOKAHEAD && self.filled < self.end) {
                break;
            }
        }
    }
}

/// Each symbol of a parse of `stream[p0..]` with its stream position.
fn positioned(syms: &[Sym], p0: usize) -> impl Iterator<Item = (usize, Sym)> + '_ {
    let mut at = p0;
    syms.iter().map(move |&s| {
        let q = at;
        at += s.span();
        (q, s)
    })
}

/// zlib's blocks for the parse `syms` of `stream[p0..]`.
fn plan_blocks(syms: &[Sym], stream_len: usize, p0: usize, params: ZlibParams, finish: bool) -> Vec<Block> {
    let w = 1usize << params.window_bits;
    let slow = params.level >= 4;
    let per_block = (1usize << (params.mem_level + 6)) - 1;
    let mut sl = Slides::new(w, p0, stream_len);
    let mut blocks = Vec::new();
    let (mut first_sym, mut start, mut count) = (0usize, p0, 0usize);
    // The loop tops of deflate_slow are every symbol's start and the
    // position after it (where the symbol is emitted); of deflate_fast, every
    // symbol's start (where it is emitted).
    for (i, (q, s)) in positioned(syms, p0).enumerate() {
        sl.visit(q);
        if slow {
            sl.visit(q + 1);
        }
        count += 1;
        let after_loop_literal = slow && i + 1 == syms.len() && !s.is_match();
        if count == per_block && !after_loop_literal {
            let end = q + s.span();
            blocks.push(Block { syms: first_sym..i + 1, start, len: end - start, storable: start >= sl.base, last: false });
            (first_sym, start, count) = (i + 1, end, 0);
        }
    }
    sl.visit(stream_len);
    if finish || count > 0 {
        blocks.push(Block { syms: first_sym..syms.len(), start, len: stream_len - start, storable: start >= sl.base, last: finish });
    }
    blocks
}

// ---------------------------------------------------------------------------
// Huffman coding: trees.c

const LITERALS: usize = 256;
const END_BLOCK: usize = 256;
const LENGTH_CODES: usize = 29;
const L_CODES: usize = LITERALS + 1 + LENGTH_CODES;
const D_CODES: usize = 30;
const BL_CODES: usize = 19;
const HEAP_SIZE: usize = 2 * L_CODES + 1;
const MAX_BITS: usize = 15;
const MAX_BL_BITS: usize = 7;
const REP_3_6: usize = 16;
const REPZ_3_10: usize = 17;
const REPZ_11_138: usize = 18;

const EXTRA_LBITS: [u8; LENGTH_CODES] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
const EXTRA_DBITS: [u8; D_CODES] = [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
const EXTRA_BLBITS: [u8; BL_CODES] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 3, 7];
const BL_ORDER: [usize; BL_CODES] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];

/// tr_static_init's tables.
struct Tables {
    length_code: [u8; 256],
    dist_code: [u8; 512],
    base_length: [u16; LENGTH_CODES],
    base_dist: [u16; D_CODES],
    static_lcode: [u16; L_CODES + 2],
    static_llen: [u16; L_CODES + 2],
    static_dcode: [u16; D_CODES],
    static_dlen: [u16; D_CODES],
}

fn bi_reverse(mut code: u32, len: usize) -> u16 {
    let mut res = 0u32;
    for _ in 0..len {
        res = (res << 1) | (code & 1);
        code >>= 1;
    }
    res as u16
}

fn gen_codes(len: &[u16], code: &mut [u16], max_code: usize, bl_count: &[u16; MAX_BITS + 1]) {
    let mut next_code = [0u16; MAX_BITS + 1];
    let mut c = 0u32;
    for bits in 1..=MAX_BITS {
        c = (c + u32::from(bl_count[bits - 1])) << 1;
        next_code[bits] = c as u16;
    }
    for n in 0..=max_code {
        let l = len[n] as usize;
        if l == 0 {
            continue;
        }
        code[n] = bi_reverse(u32::from(next_code[l]), l);
        next_code[l] = next_code[l].wrapping_add(1);
    }
}

#[allow(clippy::needless_range_loop)] // indices as in trees.c
fn tables() -> &'static Tables {
    static T: std::sync::OnceLock<Tables> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = Tables {
            length_code: [0; 256],
            dist_code: [0; 512],
            base_length: [0; LENGTH_CODES],
            base_dist: [0; D_CODES],
            static_lcode: [0; L_CODES + 2],
            static_llen: [0; L_CODES + 2],
            static_dcode: [0; D_CODES],
            static_dlen: [5; D_CODES],
        };
        let mut length = 0usize;
        let mut code = 0usize;
        while code < LENGTH_CODES - 1 {
            t.base_length[code] = length as u16;
            for _ in 0..1 << EXTRA_LBITS[code] {
                t.length_code[length] = code as u8;
                length += 1;
            }
            code += 1;
        }
        t.length_code[length - 1] = code as u8;
        let mut dist = 0usize;
        for code in 0..16 {
            t.base_dist[code] = dist as u16;
            for _ in 0..1 << EXTRA_DBITS[code] {
                t.dist_code[dist] = code as u8;
                dist += 1;
            }
        }
        dist >>= 7;
        for code in 16..D_CODES {
            t.base_dist[code] = (dist << 7) as u16;
            for _ in 0..1 << (EXTRA_DBITS[code] - 7) {
                t.dist_code[256 + dist] = code as u8;
                dist += 1;
            }
        }
        let mut bl_count = [0u16; MAX_BITS + 1];
        for (n, l) in t.static_llen.iter_mut().enumerate() {
            *l = match n {
                0..=143 => 8,
                144..=255 => 9,
                256..=279 => 7,
                _ => 8,
            };
            bl_count[*l as usize] += 1;
        }
        let lens = t.static_llen;
        gen_codes(&lens, &mut t.static_lcode, L_CODES + 1, &bl_count);
        for n in 0..D_CODES {
            t.static_dcode[n] = bi_reverse(n as u32, 5);
        }
        t
    })
}

fn d_code(t: &Tables, dist: usize) -> usize {
    if dist < 256 {
        t.dist_code[dist] as usize
    } else {
        t.dist_code[256 + (dist >> 7)] as usize
    }
}

/// A dynamic tree (ct_data: zlib overlays freq/code and dad/len; kept apart here).
struct Tree {
    freq: Vec<u16>,
    code: Vec<u16>,
    dad: Vec<u16>,
    len: Vec<u16>,
    max_code: usize,
}

impl Tree {
    fn new(n: usize) -> Self {
        Tree { freq: vec![0; n], code: vec![0; n], dad: vec![0; n], len: vec![0; n], max_code: 0 }
    }
}

/// The static part of a tree description (static_tree_desc).
struct Desc {
    stree: Option<&'static [u16]>,
    extra: &'static [u8],
    base: usize,
    elems: usize,
    max_length: usize,
}

struct Coder {
    ltree: Tree,
    dtree: Tree,
    bltree: Tree,
    heap: [usize; HEAP_SIZE],
    depth: [u8; HEAP_SIZE],
    bl_count: [u16; MAX_BITS + 1],
    opt_len: u64,
    static_len: u64,
    out: Bits,
}

/// LSB-first bit output (send_bits, bi_windup).
struct Bits {
    out: Vec<u8>,
    buf: u64,
    n: u32,
}

impl Bits {
    fn send(&mut self, value: u32, len: usize) {
        self.buf |= u64::from(value) << self.n;
        self.n += len as u32;
        if self.n >= 32 {
            self.out.extend_from_slice(&(self.buf as u32).to_le_bytes());
            self.buf >>= 32;
            self.n -= 32;
        }
    }
    fn windup(&mut self) {
        while self.n > 0 {
            self.out.push(self.buf as u8);
            self.buf >>= 8;
            self.n = self.n.saturating_sub(8);
        }
        self.buf = 0;
    }
}

fn smaller(tree: &Tree, depth: &[u8], n: usize, m: usize) -> bool {
    tree.freq[n] < tree.freq[m] || (tree.freq[n] == tree.freq[m] && depth[n] <= depth[m])
}

impl Coder {
    fn new(capacity: usize) -> Self {
        Coder {
            ltree: Tree::new(HEAP_SIZE),
            dtree: Tree::new(2 * D_CODES + 1),
            bltree: Tree::new(2 * BL_CODES + 1),
            heap: [0; HEAP_SIZE],
            depth: [0; HEAP_SIZE],
            bl_count: [0; MAX_BITS + 1],
            opt_len: 0,
            static_len: 0,
            out: Bits { out: Vec::with_capacity(capacity), buf: 0, n: 0 },
        }
    }

    fn pqdownheap(heap: &mut [usize; HEAP_SIZE], heap_len: usize, depth: &[u8], tree: &Tree, mut k: usize) {
        let v = heap[k];
        let mut j = k << 1;
        while j <= heap_len {
            if j < heap_len && smaller(tree, depth, heap[j + 1], heap[j]) {
                j += 1;
            }
            if smaller(tree, depth, v, heap[j]) {
                break;
            }
            heap[k] = heap[j];
            k = j;
            j <<= 1;
        }
        heap[k] = v;
    }

    #[allow(clippy::needless_range_loop)] // indices as in trees.c
    fn build_tree(&mut self, which: u8) {
        let t = tables();
        let desc = match which {
            0 => Desc { stree: Some(&t.static_llen[..]), extra: &EXTRA_LBITS, base: LITERALS + 1, elems: L_CODES, max_length: MAX_BITS },
            1 => Desc { stree: Some(&t.static_dlen[..]), extra: &EXTRA_DBITS, base: 0, elems: D_CODES, max_length: MAX_BITS },
            _ => Desc { stree: None, extra: &EXTRA_BLBITS, base: 0, elems: BL_CODES, max_length: MAX_BL_BITS },
        };
        let tree = match which {
            0 => &mut self.ltree,
            1 => &mut self.dtree,
            _ => &mut self.bltree,
        };
        let (heap, depth) = (&mut self.heap, &mut self.depth);
        let mut heap_len = 0usize;
        let mut heap_max = HEAP_SIZE;
        let mut max_code: isize = -1;
        for n in 0..desc.elems {
            if tree.freq[n] != 0 {
                heap_len += 1;
                heap[heap_len] = n;
                max_code = n as isize;
                depth[n] = 0;
            } else {
                tree.len[n] = 0;
            }
        }
        while heap_len < 2 {
            let node = if max_code < 2 {
                max_code += 1;
                max_code as usize
            } else {
                0
            };
            heap_len += 1;
            heap[heap_len] = node;
            tree.freq[node] = 1;
            depth[node] = 0;
            self.opt_len = self.opt_len.wrapping_sub(1);
            if let Some(st) = desc.stree {
                self.static_len = self.static_len.wrapping_sub(u64::from(st[node]));
            }
        }
        let max_code = max_code as usize;
        tree.max_code = max_code;
        for n in (1..=heap_len / 2).rev() {
            Self::pqdownheap(heap, heap_len, depth, tree, n);
        }
        let mut node = desc.elems;
        loop {
            let n = heap[1];
            heap[1] = heap[heap_len];
            heap_len -= 1;
            Self::pqdownheap(heap, heap_len, depth, tree, 1);
            let m = heap[1];
            heap_max -= 1;
            heap[heap_max] = n;
            heap_max -= 1;
            heap[heap_max] = m;
            tree.freq[node] = tree.freq[n].wrapping_add(tree.freq[m]);
            depth[node] = depth[n].max(depth[m]) + 1;
            tree.dad[n] = node as u16;
            tree.dad[m] = node as u16;
            heap[1] = node;
            node += 1;
            Self::pqdownheap(heap, heap_len, depth, tree, 1);
            if heap_len < 2 {
                break;
            }
        }
        heap_max -= 1;
        heap[heap_max] = heap[1];

        // gen_bitlen
        let bl_count = &mut self.bl_count;
        bl_count.fill(0);
        tree.len[heap[heap_max]] = 0;
        let mut overflow = 0i32;
        for &n in &heap[heap_max + 1..HEAP_SIZE] {
            let mut bits = tree.len[tree.dad[n] as usize] as usize + 1;
            if bits > desc.max_length {
                bits = desc.max_length;
                overflow += 1;
            }
            tree.len[n] = bits as u16;
            if n > max_code {
                continue;
            }
            bl_count[bits] += 1;
            let xbits = if n >= desc.base { desc.extra[n - desc.base] as usize } else { 0 };
            let f = u64::from(tree.freq[n]);
            self.opt_len = self.opt_len.wrapping_add(f * (bits + xbits) as u64);
            if let Some(st) = desc.stree {
                self.static_len = self.static_len.wrapping_add(f * (st[n] as usize + xbits) as u64);
            }
        }
        if overflow > 0 {
            loop {
                let mut bits = desc.max_length - 1;
                while bl_count[bits] == 0 {
                    bits -= 1;
                }
                bl_count[bits] -= 1;
                bl_count[bits + 1] += 2;
                bl_count[desc.max_length] -= 1;
                overflow -= 2;
                if overflow <= 0 {
                    break;
                }
            }
            let mut h = HEAP_SIZE;
            for bits in (1..=desc.max_length).rev() {
                let mut n = bl_count[bits];
                while n != 0 {
                    h -= 1;
                    let m = heap[h];
                    if m > max_code {
                        continue;
                    }
                    if tree.len[m] as usize != bits {
                        let delta = (bits as u64).wrapping_sub(u64::from(tree.len[m]));
                        self.opt_len = self.opt_len.wrapping_add(delta.wrapping_mul(u64::from(tree.freq[m])));
                        tree.len[m] = bits as u16;
                    }
                    n -= 1;
                }
            }
        }
        gen_codes(&tree.len, &mut tree.code, max_code, bl_count);
    }

    fn scan_tree(bl: &mut Tree, tree: &mut Tree, max_code: usize) {
        let mut prevlen: isize = -1;
        let mut nextlen = tree.len[0] as isize;
        let mut count = 0;
        let (mut max_count, mut min_count) = (7, 4);
        if nextlen == 0 {
            (max_count, min_count) = (138, 3);
        }
        tree.len[max_code + 1] = 0xffff;
        for n in 0..=max_code {
            let curlen = nextlen;
            nextlen = tree.len[n + 1] as isize;
            count += 1;
            if count < max_count && curlen == nextlen {
                continue;
            } else if count < min_count {
                bl.freq[curlen as usize] += count as u16;
            } else if curlen != 0 {
                if curlen != prevlen {
                    bl.freq[curlen as usize] += 1;
                }
                bl.freq[REP_3_6] += 1;
            } else if count <= 10 {
                bl.freq[REPZ_3_10] += 1;
            } else {
                bl.freq[REPZ_11_138] += 1;
            }
            count = 0;
            prevlen = curlen;
            (max_count, min_count) = if nextlen == 0 {
                (138, 3)
            } else if curlen == nextlen {
                (6, 3)
            } else {
                (7, 4)
            };
        }
    }

    fn send_code(out: &mut Bits, tree: &Tree, c: usize) {
        out.send(u32::from(tree.code[c]), tree.len[c] as usize);
    }

    fn send_tree(out: &mut Bits, bl: &Tree, tree: &Tree, max_code: usize) {
        let mut prevlen: isize = -1;
        let mut nextlen = tree.len[0] as isize;
        let mut count = 0;
        let (mut max_count, mut min_count) = (7, 4);
        if nextlen == 0 {
            (max_count, min_count) = (138, 3);
        }
        for n in 0..=max_code {
            let curlen = nextlen;
            nextlen = tree.len[n + 1] as isize;
            count += 1;
            if count < max_count && curlen == nextlen {
                continue;
            } else if count < min_count {
                while count != 0 {
                    Self::send_code(out, bl, curlen as usize);
                    count -= 1;
                }
            } else if curlen != 0 {
                if curlen != prevlen {
                    Self::send_code(out, bl, curlen as usize);
                    count -= 1;
                }
                Self::send_code(out, bl, REP_3_6);
                out.send(count as u32 - 3, 2);
            } else if count <= 10 {
                Self::send_code(out, bl, REPZ_3_10);
                out.send(count as u32 - 3, 3);
            } else {
                Self::send_code(out, bl, REPZ_11_138);
                out.send(count as u32 - 11, 7);
            }
            count = 0;
            prevlen = curlen;
            (max_count, min_count) = if nextlen == 0 {
                (138, 3)
            } else if curlen == nextlen {
                (6, 3)
            } else {
                (7, 4)
            };
        }
    }

    fn build_bl_tree(&mut self) -> usize {
        let (lm, dm) = (self.ltree.max_code, self.dtree.max_code);
        Self::scan_tree(&mut self.bltree, &mut self.ltree, lm);
        Self::scan_tree(&mut self.bltree, &mut self.dtree, dm);
        self.build_tree(2);
        let mut max_blindex = BL_CODES - 1;
        while max_blindex >= 3 {
            if self.bltree.len[BL_ORDER[max_blindex]] != 0 {
                break;
            }
            max_blindex -= 1;
        }
        self.opt_len = self.opt_len.wrapping_add(3 * (max_blindex as u64 + 1) + 5 + 5 + 4);
        max_blindex
    }

    fn compress_block(out: &mut Bits, syms: &[Sym], l: (&[u16], &[u16]), d: (&[u16], &[u16])) {
        let t = tables();
        // Each match length's code and extra bits as one string of bits.
        let mut lengths = [(0u32, 0usize); 256];
        if syms.iter().any(|s| s.is_match()) {
            for (lc, e) in lengths.iter_mut().enumerate() {
                let code = t.length_code[lc] as usize;
                let (c, n) = (u32::from(l.0[code + LITERALS + 1]), l.1[code + LITERALS + 1] as usize);
                // (Length 258 has code 285, no extra bits, and no base: trees.c's base_length[28] is 0.)
                let extra = if EXTRA_LBITS[code] == 0 { 0 } else { (lc - t.base_length[code] as usize) as u32 };
                *e = (c | extra << n, n + EXTRA_LBITS[code] as usize);
            }
        }
        for s in syms {
            if s.dist == 0 {
                out.send(u32::from(l.0[s.lc as usize]), l.1[s.lc as usize] as usize);
            } else {
                let (v, n) = lengths[s.lc as usize];
                out.send(v, n);
                let dist = s.dist as usize - 1;
                let code = d_code(t, dist);
                let n = d.1[code] as usize;
                out.send(u32::from(d.0[code]) | ((dist - t.base_dist[code] as usize) as u32) << n, n + EXTRA_DBITS[code] as usize);
            }
        }
        out.send(u32::from(l.0[END_BLOCK]), l.1[END_BLOCK] as usize);
    }

    fn stored_block(&mut self, data: &[u8], last: bool) {
        self.out.send(u32::from(last), 3);
        self.out.windup();
        let n = data.len() as u16;
        self.out.out.extend_from_slice(&n.to_le_bytes());
        self.out.out.extend_from_slice(&(!n).to_le_bytes());
        self.out.out.extend_from_slice(data);
    }

    /// _tr_flush_block for one planned block (init_block and _tr_tally folded in).
    fn flush_block(&mut self, syms: &[Sym], stored: Option<&[u8]>, stored_len: usize, last: bool) {
        let t = tables();
        self.ltree.freq[..L_CODES].fill(0);
        self.dtree.freq[..D_CODES].fill(0);
        self.bltree.freq[..BL_CODES].fill(0);
        self.ltree.freq[END_BLOCK] = 1;
        self.opt_len = 0;
        self.static_len = 0;
        for s in syms {
            if s.dist == 0 {
                self.ltree.freq[s.lc as usize] += 1;
            } else {
                self.ltree.freq[t.length_code[s.lc as usize] as usize + LITERALS + 1] += 1;
                self.dtree.freq[d_code(t, s.dist as usize - 1)] += 1;
            }
        }
        self.build_tree(0);
        self.build_tree(1);
        let max_blindex = self.build_bl_tree();
        let mut opt_lenb = (self.opt_len.wrapping_add(3 + 7)) >> 3;
        let static_lenb = (self.static_len.wrapping_add(3 + 7)) >> 3;
        if static_lenb <= opt_lenb {
            opt_lenb = static_lenb;
        }
        match stored {
            Some(data) if stored_len as u64 + 4 <= opt_lenb => self.stored_block(data, last),
            _ if static_lenb == opt_lenb => {
                self.out.send(2 + u32::from(last), 3);
                Self::compress_block(
                    &mut self.out,
                    syms,
                    (&t.static_lcode[..], &t.static_llen[..]),
                    (&t.static_dcode[..], &t.static_dlen[..]),
                );
            }
            _ => {
                self.out.send(4 + u32::from(last), 3);
                let (lcodes, dcodes, blcodes) = (self.ltree.max_code + 1, self.dtree.max_code + 1, max_blindex + 1);
                self.out.send(lcodes as u32 - 257, 5);
                self.out.send(dcodes as u32 - 1, 5);
                self.out.send(blcodes as u32 - 4, 4);
                for &o in &BL_ORDER[..blcodes] {
                    self.out.send(u32::from(self.bltree.len[o]), 3);
                }
                Self::send_tree(&mut self.out, &self.bltree, &self.ltree, lcodes - 1);
                Self::send_tree(&mut self.out, &self.bltree, &self.dtree, dcodes - 1);
                Self::compress_block(&mut self.out, syms, (&self.ltree.code, &self.ltree.len), (&self.dtree.code, &self.dtree.len));
            }
        }
        if last {
            self.out.windup();
        }
    }
}

/// Codes the parse `syms` of `stream[p0..]` as zlib's deflate call does.
fn encode(syms: &[Sym], stream: &[u8], p0: usize, params: ZlibParams, finish: bool) -> Vec<u8> {
    let blocks = plan_blocks(syms, stream.len(), p0, params, finish);
    let mut c = Coder::new((stream.len() - p0) / 3 + 64);
    for b in &blocks {
        let data = &stream[b.start..b.start + b.len];
        c.flush_block(&syms[b.syms.clone()], b.storable.then_some(data), b.len, b.last);
    }
    if !finish {
        // deflate(): Z_SYNC_FLUSH after block_done writes an empty stored block.
        c.stored_block(&[], false);
    }
    c.out.windup();
    c.out.out
}

// ---------------------------------------------------------------------------
// Reading the symbols back from zlib's output.

/// The symbols of a raw deflate stream and the input ranges (relative to the
/// stream's start) that were coded as stored blocks, whose symbols are not
/// known (literals stand in for them).
struct ReadBack {
    syms: Vec<Sym>,
    stored: Vec<(usize, usize)>,
    len: usize,
}

struct BitReader<'a> {
    data: &'a [u8],
    pos: usize,
    buf: u64,
    n: u32,
}

impl BitReader<'_> {
    fn need(&mut self, k: u32) {
        if self.n < k && self.n <= 56 - 8 {
            if let Some(bytes) = self.data.get(self.pos..self.pos + 8) {
                // Refill whole bytes at once: up to 56 bits held.
                let take = (63 - self.n) / 8;
                let v = u64::from_le_bytes(bytes.try_into().expect("8 bytes"));
                let mask = if take == 8 { u64::MAX } else { (1u64 << (take * 8)) - 1 };
                self.buf |= (v & mask) << self.n;
                self.n += take * 8;
                self.pos += take as usize;
                return;
            }
        }
        while self.n < k {
            let b = self.data.get(self.pos).copied().unwrap_or(0);
            self.pos += 1;
            self.buf |= u64::from(b) << self.n;
            self.n += 8;
        }
    }
    /// `k` bits the buffer already holds.
    fn take(&mut self, k: u32) -> u32 {
        let v = (self.buf & ((1u64 << k) - 1)) as u32;
        self.buf >>= k;
        self.n -= k;
        v
    }
    fn bits(&mut self, k: u32) -> u32 {
        if k == 0 {
            return 0;
        }
        self.need(k);
        let v = (self.buf & ((1u64 << k) - 1)) as u32;
        self.buf >>= k;
        self.n -= k;
        v
    }
    fn align(&mut self) {
        let drop = self.n % 8;
        self.bits(drop);
    }
}

/// A canonical Huffman decoding table: entry = symbol << 4 | length.
struct Decoder {
    table: Vec<u16>,
    bits: u32,
    mask: u64,
}

impl Decoder {
    fn new(lens: &[u8]) -> Option<Decoder> {
        let bits = u32::from(*lens.iter().max()?).max(1);
        let mut count = [0u16; 16];
        for &l in lens {
            count[l as usize] += 1;
        }
        count[0] = 0;
        let mut next = [0u32; 16];
        let mut code = 0u32;
        for b in 1..16 {
            code = (code + u32::from(count[b - 1])) << 1;
            next[b] = code;
        }
        let mut table = vec![0u16; 1 << bits];
        for (sym, &l) in lens.iter().enumerate() {
            if l == 0 {
                continue;
            }
            let c = next[l as usize];
            next[l as usize] += 1;
            if c >= 1 << l {
                return None;
            }
            let mut r = u32::from(bi_reverse(c, l as usize));
            while r < 1 << bits {
                table[r as usize] = (sym as u16) << 4 | u16::from(l);
                r += 1 << l;
            }
        }
        Some(Decoder { table, bits, mask: (1u64 << bits) - 1 })
    }
    fn decode(&self, br: &mut BitReader<'_>) -> Option<usize> {
        br.need(self.bits);
        self.decode_held(br)
    }
    /// [`Decoder::decode`] when the bit buffer holds enough bits.
    fn decode_held(&self, br: &mut BitReader<'_>) -> Option<usize> {
        let e = self.table[(br.buf & self.mask) as usize];
        let l = u32::from(e & 15);
        if l == 0 {
            return None;
        }
        br.buf >>= l;
        br.n -= l;
        Some((e >> 4) as usize)
    }
}

const LBASE: [u16; 29] =
    [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258];
const DBASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385,
    24577,
];

fn read_syms(data: &[u8]) -> Option<ReadBack> {
    let mut br = BitReader { data, pos: 0, buf: 0, n: 0 };
    let mut rb = ReadBack { syms: Vec::with_capacity(data.len()), stored: Vec::new(), len: 0 };
    loop {
        if br.pos >= data.len() && br.n < 8 {
            break; // after a sync flush: only padding left
        }
        let last = br.bits(1) == 1;
        let kind = br.bits(2);
        match kind {
            0 => {
                br.align();
                let n = br.bits(16) as usize;
                if br.bits(16) as usize != !n & 0xffff {
                    return None;
                }
                // The bit buffer holds no whole bytes after align + 32 bits unless it over-read.
                while br.n >= 8 {
                    br.n -= 8;
                    br.pos -= 1;
                }
                br.buf = 0;
                br.n = 0;
                let bytes = data.get(br.pos..br.pos + n)?;
                if n > 0 {
                    rb.stored.push((rb.len, rb.len + n));
                }
                rb.syms.extend(bytes.iter().map(|&b| Sym::lit(b)));
                rb.len += n;
                br.pos += n;
            }
            1 | 2 => {
                let (lit, dist) = if kind == 1 {
                    let mut l = [8u8; 288];
                    l[144..256].fill(9);
                    l[256..280].fill(7);
                    (Decoder::new(&l)?, Decoder::new(&[5u8; 30])?)
                } else {
                    let hlit = br.bits(5) as usize + 257;
                    let hdist = br.bits(5) as usize + 1;
                    let hclen = br.bits(4) as usize + 4;
                    let mut cl = [0u8; 19];
                    for &o in &BL_ORDER[..hclen] {
                        cl[o] = br.bits(3) as u8;
                    }
                    let cd = Decoder::new(&cl)?;
                    let mut lens = vec![0u8; hlit + hdist];
                    let mut i = 0;
                    while i < lens.len() {
                        let s = cd.decode(&mut br)?;
                        let (v, rep) = match s {
                            0..=15 => (s as u8, 1),
                            16 => (*lens.get(i.checked_sub(1)?)?, 3 + br.bits(2) as usize),
                            17 => (0, 3 + br.bits(3) as usize),
                            _ => (0, 11 + br.bits(7) as usize),
                        };
                        if i + rep > lens.len() {
                            return None;
                        }
                        lens[i..i + rep].fill(v);
                        i += rep;
                    }
                    (Decoder::new(&lens[..hlit])?, Decoder::new(&lens[hlit..])?)
                };
                loop {
                    // A symbol takes at most 15 + 5 + 15 + 13 bits: one refill
                    // (zeros past the end, caught after the block).
                    br.need(48);
                    let s = lit.decode_held(&mut br)?;
                    if s < 256 {
                        rb.syms.push(Sym::lit(s as u8));
                        rb.len += 1;
                    } else if s == 256 {
                        break;
                    } else {
                        let c = s - 257;
                        let len = usize::from(*LBASE.get(c)?) + br.take(u32::from(EXTRA_LBITS[c])) as usize;
                        let dc = dist.decode_held(&mut br)?;
                        let d = usize::from(*DBASE.get(dc)?) + br.take(u32::from(EXTRA_DBITS[dc])) as usize;
                        rb.syms.push(Sym { dist: d as u16, lc: (len - MIN_MATCH) as u8 });
                        rb.len += len;
                    }
                }
            }
            _ => return None,
        }
        if br.pos * 8 - br.n as usize > data.len() * 8 {
            return None; // read past the end
        }
        if last {
            break;
        }
    }
    Some(rb)
}

// ---------------------------------------------------------------------------
// Re-deflating a shifted block.

/// How [`deflate_shifted`] made its output, in input bytes: parsed around
/// the first changed byte (until the parse joined the old one, shifted),
/// copied from the old parse (before the change and after the join), and
/// parsed at the end; `shift` is the offset of the new stream against the
/// old after the change (new position = old position + shift).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ReuseStats {
    pub shift: isize,
    pub parsed_start: usize,
    pub copied: usize,
    pub parsed_end: usize,
}

/// An old block of a block-parallel member: its dictionary, its input and
/// zlib's compressed bytes for them (with the parameters given alongside).
#[derive(Debug, Clone, Copy)]
pub struct OldBlock<'a> {
    pub dict: &'a [u8],
    pub input: &'a [u8],
    pub data: &'a [u8],
}

/// The shift of `new` against `old` (new position = old position + shift)
/// and the interval of new positions where it holds: for 64-byte anchors at
/// 7/8, 1/2 and 1/4 of `new[from..]`, the offsets at which the anchor recurs
/// in `old` (within 16 of 0 first, else the first 8 occurrences), the one
/// with the longest agreement around its anchor winning.
fn find_shift(old: &[u8], new: &[u8], from: usize) -> Option<(isize, usize, usize)> {
    const ANCHOR: usize = 64;
    if new.len() < from + ANCHOR || old.len() < ANCHOR {
        return None;
    }
    let mut best: Option<(isize, usize, usize)> = None;
    let consider = |best: &mut Option<(isize, usize, usize)>, d: isize, at: usize| {
        let (a, b) = aligned(old, new, d, at);
        if best.is_none_or(|(_, ba, bb)| b - a > bb - ba) {
            *best = Some((d, a, b));
        }
    };
    for eighths in [7, 4, 2] {
        let at = from + (new.len() - from - ANCHOR) * eighths / 8;
        if best.is_some_and(|(_, a, b)| (a..b).contains(&at)) {
            continue;
        }
        let anchor = &new[at..at + ANCHOR];
        let agrees = |d: isize| {
            let o = at as isize - d;
            o >= 0 && (o as usize) + ANCHOR <= old.len() && &old[o as usize..o as usize + ANCHOR] == anchor
        };
        if let Some(d) = (0..=16isize).flat_map(|k| [k, -k]).find(|&d| agrees(d)) {
            consider(&mut best, d, at);
            continue;
        }
        for (o, _) in old.windows(ANCHOR).enumerate().filter(|(_, w)| *w == anchor).take(8) {
            consider(&mut best, at as isize - o as isize, at);
        }
    }
    best
}

/// Whether the symbols `syms` rebuild `stream[p0..]` after `stream[..p0]`.
/// (Copied symbols then rebuild the new input too, whatever made the old
/// data: they are copied only where both inputs agree, sources included.)
fn decodes_to(syms: &[Sym], stream: &[u8], p0: usize) -> bool {
    let mut at = p0;
    for s in syms {
        if s.dist == 0 {
            if stream.get(at) != Some(&s.lc) {
                return false;
            }
            at += 1;
        } else {
            let (len, dist) = (s.span(), s.dist as usize);
            if dist > at || at + len > stream.len() || !same_run(stream, at - dist, at, len) {
                return false;
            }
            at += len;
        }
    }
    at == stream.len()
}

/// Whether `s[a..a + len] == s[b..b + len]` (a < b), 8 bytes at a time
/// where the slice allows (matches are short: no call to memcmp).
fn same_run(s: &[u8], a: usize, b: usize, len: usize) -> bool {
    let word = |i: usize| u64::from_le_bytes(s[i..i + 8].try_into().expect("8 bytes"));
    let mut k = 0;
    while k + 8 <= len {
        if word(a + k) != word(b + k) {
            return false;
        }
        k += 8;
    }
    if b + k + 8 <= s.len() && len > k {
        let mask = (1u64 << ((len - k) * 8)) - 1;
        return (word(a + k) ^ word(b + k)) & mask == 0;
    }
    s[a + k..a + len] == s[b + k..b + len]
}

/// The length of the common prefix of `a` and `b`.
fn common_prefix(a: &[u8], b: &[u8]) -> usize {
    let n = a.len().min(b.len());
    let mut i = 0;
    while i + 64 <= n && a[i..i + 64] == b[i..i + 64] {
        i += 64;
    }
    while i < n && a[i] == b[i] {
        i += 1;
    }
    i
}

/// The largest interval of new positions around `at` where new[j] == old[j - d].
fn aligned(old: &[u8], new: &[u8], d: isize, at: usize) -> (usize, usize) {
    // New positions that have an old counterpart: [lo, hi).
    let lo = d.max(0) as usize;
    let hi = ((old.len() as isize + d).max(0) as usize).min(new.len());
    if at < lo || at >= hi {
        return (at, at);
    }
    let o = |j: usize| (j as isize - d) as usize;
    const CHUNK: usize = 64;
    let mut b = at;
    while b + CHUNK <= hi && new[b..b + CHUNK] == old[o(b)..o(b) + CHUNK] {
        b += CHUNK;
    }
    while b < hi && new[b] == old[o(b)] {
        b += 1;
    }
    let mut a = at;
    while a >= lo + CHUNK && new[a - CHUNK..a] == old[o(a) - CHUNK..o(a)] {
        a -= CHUNK;
    }
    while a > lo && new[a - 1] == old[o(a) - 1] {
        a -= 1;
    }
    (a, b)
}

/// Where the positions deflate_fast left out of its hash in `[from, to)`
/// last differ between both parses (sorted intervals; the old one's shifted
/// by `d`): a bound at or after the last differing position, None if none.
fn last_skip_difference(new_skips: &[(usize, usize)], old_skips: &[(usize, usize)], d: isize, from: usize, to: usize) -> Option<usize> {
    let (from, to) = (from as isize, to as isize);
    let clip = |v: &[(usize, usize)], shift: isize| -> Vec<(isize, isize)> {
        let first = v.partition_point(|&(_, b)| b as isize + shift <= from);
        v[first..]
            .iter()
            .map(|&(a, b)| (a as isize + shift, b as isize + shift))
            .take_while(|&(a, _)| a < to)
            .map(|(a, b)| (a.max(from), b.min(to)))
            .collect()
    };
    let (mut n, mut o) = (clip(new_skips, 0), clip(old_skips, d));
    while let (Some(x), Some(y)) = (n.last(), o.last()) {
        if x != y {
            break;
        }
        n.pop();
        o.pop();
    }
    let end = n.last().map(|x| x.1).max(o.last().map(|y| y.1))?;
    Some(end as usize - 1)
}

/// The positions deflate_fast leaves out of its hash: inside matches longer
/// than `max_insert` (the symbols start at `p0`).
fn skips(syms: &[Sym], p0: usize, max_insert: usize) -> Vec<(usize, usize)> {
    let mut at = p0;
    let mut v = Vec::new();
    for s in syms {
        if s.is_match() && s.span() > max_insert {
            v.push((at + 1, at + s.span()));
        }
        at += s.span();
    }
    v
}

/// zlib's output for `input` preset with `dict`, as [`deflate`] makes it,
/// computed by reusing the parse of `old` (zlib's output for an input of
/// which `input` is a shifted copy, with the same parameters) wherever it
/// must be the same; also says how much was reused. None for unsupported
/// parameters or an `old.data` that is not a raw deflate stream.
pub fn deflate_shifted(old: OldBlock<'_>, dict: &[u8], input: &[u8], params: ZlibParams, finish: bool) -> Option<(Vec<u8>, ReuseStats)> {
    let w = 1usize << params.window_bits;
    let (ostream, op0) = stream_of(old.dict, old.input, w);
    let (stream, p0) = stream_of(dict, input, w);
    deflate_shifted_stream(Stream { bytes: &ostream, p0: op0 }, old.data, Stream { bytes: &stream, p0 }, params, finish)
}

/// A deflate call's dictionary and input as one slice: `bytes[..p0]` is the
/// dictionary (at most 2^window_bits bytes), `bytes[p0..]` the input. For a
/// block-parallel member that is its content from the window before a
/// block to the block's end, so nothing needs copying.
#[derive(Debug, Clone, Copy)]
pub struct Stream<'a> {
    pub bytes: &'a [u8],
    pub p0: usize,
}

/// [`deflate_shifted`] on streams: `old_data` is zlib's output for `old`.
pub fn deflate_shifted_stream(
    old: Stream<'_>,
    old_data: &[u8],
    new: Stream<'_>,
    params: ZlibParams,
    finish: bool,
) -> Option<(Vec<u8>, ReuseStats)> {
    let w = 1usize << params.window_bits;
    if !supported(params) || old.p0 > w || new.p0 > w || old.p0 > old.bytes.len() || new.p0 > new.bytes.len() {
        return None;
    }
    let (ostream, op0, stream, p0) = (old.bytes, old.p0, new.bytes, new.p0);
    let full = |start: usize| {
        let stats = ReuseStats { parsed_start: start, ..ReuseStats::default() };
        Some((deflate_stream(stream, p0, params, finish), stats))
    };
    // The shift after the first changed byte (the old parse is used before
    // it anyway); without one, d = 0 over an empty region.
    let same_until = common_prefix(ostream, stream);
    let (d, a, b) = find_shift(ostream, stream, same_until.max(p0)).unwrap_or((0, p0, p0));
    let rb = read_syms(old_data)?;
    if rb.len != ostream.len() - op0 || !decodes_to(&rb.syms, ostream, op0) {
        return None; // not a deflate stream of the old input
    }
    let slow = params.level >= 4;
    let lazy = CONFIG[params.level as usize].1 as usize;

    // Old symbol boundaries (old stream positions) and which of them leave
    // the canonical lazy state.
    let mut ostarts = Vec::with_capacity(rb.syms.len() + 1);
    let mut at = op0;
    for s in &rb.syms {
        ostarts.push(at);
        at += s.span();
    }
    ostarts.push(at);
    let canonical_old = |i: usize| !slow || i == 0 || rb.syms[i - 1].is_match();
    let old_index = |pos_new: usize| -> Option<usize> {
        let o = pos_new as isize - d;
        if o < op0 as isize {
            return None;
        }
        let i = ostarts.binary_search(&(o as usize)).ok()?;
        canonical_old(i).then_some(i)
    };
    let in_stored = |from: usize, to: usize| rb.stored.iter().any(|&(s, e)| s + op0 < to && e + op0 > from);
    let old_skips = if slow { Vec::new() } else { skips(&rb.syms, op0, lazy) };

    // Where the copy must end: decisions there read up to 259 bytes ahead
    // and need the full lookahead in both parses.
    let end_new = stream.len();
    let end_old_in_new = ostream.len() as isize + d;
    let limit = (b as isize - 261).min(end_new as isize - 263).min(end_old_in_new - 263) - 8;

    // A parse state at a canonical loop top `r` after `syms`: the window
    // replayed, the hash chains rebuilt.
    let restarted = |syms: &[Sym], r: usize| {
        let mut lz = Lz::new_replaying(stream, p0, params);
        let mut at = p0;
        for s in syms {
            lz.visit(at);
            if slow && s.is_match() {
                lz.visit(at + 1);
            }
            at += s.span();
        }
        debug_assert_eq!(at, r);
        lz.restart_at(r, syms, p0, lazy);
        lz
    };

    // 1. Before the first changed byte (same dictionary, no shift), the old
    // parse holds up to a canonical boundary that far from it and from the end.
    let mut syms = Vec::with_capacity(rb.syms.len() + 64);
    let prefix_limit = (same_until as isize - 261).min(end_new as isize - 263).min(ostream.len() as isize - 263) - 8;
    let mut i_r0 = 0;
    if op0 == p0 && same_until > p0 {
        let mut i = ostarts.partition_point(|&x| x as isize <= prefix_limit).saturating_sub(1);
        while i > 0 && !canonical_old(i) {
            i -= 1;
        }
        if !in_stored(op0, ostarts[i]) {
            i_r0 = i;
        }
    }
    let r0 = ostarts[i_r0];
    syms.extend_from_slice(&rb.syms[..i_r0]);

    // 2. Parse from there until the parse joins the old one, shifted.
    let mut lz = if i_r0 == 0 {
        Lz::new(stream, p0, params)
    } else {
        let mut lz = restarted(&syms, r0);
        if !slow {
            lz.skips = skips(&syms, p0, lazy);
        }
        lz
    };
    let mut joined: Option<(usize, usize)> = None; // (new position, old symbol index)
    let earliest = a.max(1) + w;
    // deflate_fast: the skips are compared once per stretch, [checked, r),
    // from a window before the earliest join; the last difference is before
    // `differs_until`.
    let (mut checked, mut differs_until) = (earliest - w, 0usize);
    let finished = lz.run(&mut |r, lz| {
        if r < earliest || r as isize > limit {
            return false;
        }
        let Some(i) = old_index(r) else { return false };
        if !slow {
            if let Some(x) = last_skip_difference(&lz.skips, &old_skips, d, checked, r) {
                differs_until = x + 1;
            }
            checked = r;
            if differs_until + w > r {
                return false;
            }
        }
        joined = Some((r, i));
        true
    });
    syms.extend_from_slice(&lz.syms);
    drop(lz);
    let Some((r, i_r)) = joined.filter(|_| !finished) else {
        let stats = ReuseStats { shift: d, parsed_start: stream.len() - r0, copied: r0 - p0, ..ReuseStats::default() };
        return Some((encode(&syms, stream, p0, params, finish), stats));
    };

    // 3. Copy the old symbols up to the last canonical boundary before the limit.
    let mut i_r2 = i_r;
    let mut j = i_r;
    while j < rb.syms.len() && (ostarts[j + 1] as isize + d) <= limit {
        j += 1;
        if canonical_old(j) {
            i_r2 = j;
        }
    }
    let r2 = (ostarts[i_r2] as isize + d) as usize;
    if in_stored(ostarts[i_r], ostarts[i_r2]) {
        return full(stream.len() - p0);
    }
    syms.extend_from_slice(&rb.syms[i_r..i_r2]);

    // 4. Parse the end from a replayed window and rebuilt hash chains.
    let mut lz = restarted(&syms, r2);
    lz.run(&mut |_, _| false);
    syms.extend_from_slice(&lz.syms);
    let stats = ReuseStats { shift: d, parsed_start: r - r0, copied: (r0 - p0) + (r2 - r), parsed_end: end_new - r2 };
    Some((encode(&syms, stream, p0, params, finish), stats))
}

impl<'a> Lz<'a> {
    /// A parse state whose window is only replayed (see [`Lz::visit`]).
    fn new_replaying(stream: &'a [u8], p0: usize, p: ZlibParams) -> Self {
        let mut lz = Lz::new(&stream[..0], 0, p);
        lz.stream = stream;
        lz.hash_on = false;
        lz.avail_end = p0;
        if p0 > 0 {
            lz.fill_window();
            lz.strstart = p0;
            lz.lookahead = 0;
        }
        lz.avail_end = stream.len();
        lz
    }

    /// The window's upkeep at a loop top at stream position `x`.
    fn visit(&mut self, x: usize) {
        self.strstart = x - self.base;
        self.lookahead = self.next_in - x;
        if self.lookahead < MIN_LOOKAHEAD {
            self.fill_window();
        }
    }

    /// Makes this replayed state the parse state at loop top `r` (stream
    /// position) after the symbols `syms` of `stream[p0..r]`: the hash chains
    /// of the window's positions before `r` that zlib inserted, the
    /// canonical lazy state.
    fn restart_at(&mut self, r: usize, syms: &[Sym], p0: usize, max_insert: usize) {
        self.strstart = r - self.base;
        self.lookahead = self.next_in - r;
        let from = self.base.max(r.saturating_sub(self.w_size));
        let mut inserted = vec![true; r - from];
        if !self.slow {
            let mut at = r;
            for s in syms.iter().rev() {
                if at <= from || at <= p0 {
                    break;
                }
                at -= s.span();
                if s.is_match() && s.span() > max_insert {
                    for q in (at + 1).max(from)..at + s.span() {
                        inserted[q - from] = false;
                    }
                }
            }
        }
        for q in from..r {
            if inserted[q - from] {
                let s = q - self.base;
                self.ins_h = ((self.window[s] as usize) << self.hash_shift ^ self.window[s + 1] as usize) & self.hash_mask;
                self.insert_string(s);
            }
        }
        self.ins_h = ((self.window[self.strstart] as usize) << self.hash_shift ^ self.window[self.strstart + 1] as usize) & self.hash_mask;
        self.insert = 0;
        self.match_length = MIN_MATCH - 1;
        self.prev_length = MIN_MATCH - 1;
        self.match_available = false;
        self.hash_on = true;
    }
}

// ---------------------------------------------------------------------------
// The reference: zlib itself, called as LibreOffice's ThreadedDeflater does.

/// zlib's (libz-sys) raw deflate of `input` preset with `dict` (if not
/// empty), one `deflate` call with all the input and `deflateBound + 20`
/// bytes of room, ended with Z_FINISH or Z_SYNC_FLUSH: the reference this
/// port is tested and benchmarked against, the very call the block-parallel
/// rebuild makes ([`crate::deflate`]).
#[doc(hidden)]
pub fn zlib_deflate(dict: &[u8], input: &[u8], params: ZlibParams, finish: bool) -> Option<Vec<u8>> {
    crate::deflate::deflate_one_call(dict, input, params, finish)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(level: u8) -> ZlibParams {
        ZlibParams { level, mem_level: 8, window_bits: 15, strategy: 0 }
    }

    #[test]
    fn small_inputs_match_zlib() {
        for level in 1..=9 {
            for input in [&b""[..], b"a", b"ab", b"abc", b"abcabcabcabc", b"hello hello hello world"] {
                for finish in [true, false] {
                    assert_eq!(
                        deflate(b"", input, p(level), finish),
                        zlib_deflate(b"", input, p(level), finish),
                        "level {level} {input:?}"
                    );
                    assert_eq!(deflate(b"hello", input, p(level), finish), zlib_deflate(b"hello", input, p(level), finish));
                }
            }
        }
    }

    /// The window slides replayed from the symbols (which decide whether a
    /// block may be stored) are where the parse itself slid.
    #[test]
    fn slides_replayed_from_the_symbols_are_the_parses_own() {
        let mut x = 7u64;
        let mut text = Vec::new();
        while text.len() < 400_000 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let k = (x >> 40) as usize % 3000;
            if (x >> 20) % 3 == 0 {
                text.extend((0..k).map(|i| (x >> (i % 50)) as u8));
            } else {
                text.extend(b"<text:p text:style-name=\"P1\">edge courier ".iter().cycle().take(k));
            }
        }
        for level in 1..=9 {
            for mem_level in [1, 8, 9] {
                for (p0, len) in [(0, 1000), (0, 200_000), (32768, 131072 + 32768), (32768, 400_000), (100, 70_000)] {
                    let params = ZlibParams { level, mem_level, window_bits: 15, strategy: 0 };
                    let stream = &text[..len];
                    let mut lz = Lz::new(stream, p0, params);
                    lz.run(&mut |_, _| false);
                    let mut sl = Slides::new(1 << 15, p0, stream.len());
                    for (q, s) in positioned(&lz.syms, p0) {
                        sl.visit(q);
                        if level >= 4 {
                            sl.visit(q + 1);
                        }
                        let _ = s;
                    }
                    sl.visit(stream.len());
                    assert_eq!(sl.slid_at, lz.slid_at, "level {level} memLevel {mem_level} p0 {p0} len {len}");
                    assert_eq!(sl.base, lz.base);
                    assert!(len < 100_000 || lz.slid_at.len() >= 2, "no slides to compare");
                }
            }
        }
    }

    #[test]
    fn symbols_read_back() {
        let input: Vec<u8> = (0..100_000u32).map(|i| (i.wrapping_mul(i) % 251) as u8 ^ (i / 1000) as u8).collect();
        let out = zlib_deflate(b"", &input, p(6), true).unwrap();
        let rb = read_syms(&out).unwrap();
        assert_eq!(rb.len, input.len());
        assert_eq!(encode(&rb.syms, &input, 0, p(6), true), out);
    }
}
