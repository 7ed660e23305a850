//! A byte-exact port of 7-Zip's Deflate encoder (`DeflateEncoder.cpp`,
//! `LzFind.c`'s `Bt3Zip` and `Hc3Zip` match finders and `HuffEnc.c`'s
//! `Huffman_Generate` of 7-Zip 26.02, the source of Debian bookworm's `7zip`
//! package) as 7-Zip's zip writer runs it at `-mx=1` to `-mx=6` (`7z a
//! -tzip -mm=Deflate -mx=5`), which `CEncProps::Normalize` makes two
//! encoders: at 5 and 6 the optimal parser (`GetOptimal`, algo 1) over the
//! binary-tree match finder, at 1 to 4 the fast mode (`GetOptimalFast`,
//! algo 0: the longest match found, else a literal) over the hash-chain
//! match finder; both with 32 fast bytes, a cut value of 32, one pass, no
//! fixed-code trial and no block division. Levels 7-9 (several passes,
//! divided blocks) are not ported.
//!
//! [`deflate`] returns the member data 7-Zip writes for a file's content
//! when it writes a deflated member (7-Zip stores a file whose deflated form
//! is not smaller than it). [`matches`] runs the same encoder but compares its
//! output with an expected stream as it is written and stops at the first
//! byte that differs, and before any output, at the first symbol of the
//! expected stream's first block that differs from the encoder's.
//!
//! What the encoder does, as ported:
//! * the match finder keeps a binary tree (levels 5-6) or a chain (1-4) per
//!   3-byte hash (`((b0 << 8 | b2) ^ crc32_table[b1]) & 0xffff`) over the
//!   last 32768 positions (a cyclic buffer of 32769 nodes), walks at most 32
//!   nodes per position, and reports matches of 3 to 32 bytes, each longer
//!   than the nearer ones (the length limit is the bytes left near the end;
//!   with fewer than 3 left, nothing is inserted); the longest, when 32
//!   bytes long, is then extended at its distance up to 258;
//! * the fast mode takes the longest match, else a literal;
//! * the optimal parser takes a match longer than 32 at once; otherwise it prices
//!   paths of literals and matches up to the longest match found ahead (or
//!   4096 positions) with the Huffman code lengths of the previous block
//!   (the first block: 8 bits a literal, 5 a length or distance code, plus
//!   extra bits; an unused symbol: 11 for a literal or length, 6 for a
//!   distance) and takes the cheapest (the first found on ties);
//! * a block ends, between two parsed paths, after 60923 input bytes or 11264
//!   symbols, or at the input's end; its codes are 7-Zip's Huffman codes
//!   limited to 9, 10, 11 or 12 bits (by the block's symbol count; 7 for the
//!   code-length code), and it is stored (one stored block) when that is no
//!   longer in bits than the dynamic block, never coded with the fixed codes.
//!
//! The output depends on the content only (7-Zip reads its input in pieces
//! whose sizes do not change what it writes).
//!
//! Cost: one call allocates about 600 KiB (the match finder's hash table and
//! tree, the parser's 4354 path entries, the block's symbols) besides the
//! output. 7-Zip writes its first output when its first block ends (up to
//! 60923 bytes of input), so [`matches`] reads the expected stream's first
//! block as symbols and compares each symbol the encoder records with it: a
//! stream written by another deflater is refuted at its first differing
//! symbol.
//!
//! The tests in `edit-patch/core/tests/integration/sevenzip.rs` compare it
//! with the `7zz` (or `7z`) binary, when one is installed, on made inputs and
//! on the shared corpus's parts.

use crate::infozip::FirstBlock;

const HISTORY: u32 = 1 << 15;
/// `cyclicBufferSize`: `historySize + 1`.
const CYCLIC: u32 = HISTORY + 1;
const HASH_SIZE: usize = 1 << 16;
/// The most content the encoder takes: its positions are 32-bit, as
/// 7-Zip's are (the format's own limits keep parts far below this).
const MAX_INPUT: usize = (u32::MAX - 2 * CYCLIC) as usize;
/// `m_NumFastBytes` (`fb`), also the match finder's `matchMaxLen`.
const FAST_BYTES: u32 = 32;
/// `cutValue` (`mc` = 16 + fb / 2).
const CUT_VALUE: u32 = 32;
const MATCH_MIN: u32 = 3;
const MATCH_MAX: u32 = 258;
const NUM_OPTS_BASE: u32 = 1 << 12;
const NUM_OPTS: usize = (NUM_OPTS_BASE + MATCH_MAX) as usize;
const MAX_UNCOMPRESSED_BLOCK: u32 = (1 << 16) - 1;
/// `kBlockUncompressedSizeThreshold`.
const BLOCK_THRESHOLD: u32 = MAX_UNCOMPRESSED_BLOCK - MATCH_MAX - NUM_OPTS as u32;
/// `m_ValueBlockSize` with one division pass.
const VALUE_BLOCK_SIZE: usize = (7 << 10) + (1 << 12);
const INFINITE_PRICE: u32 = 0xFFF_FFFF;

const END_OF_BLOCK: usize = 256;
const SYMBOL_MATCH: usize = 257;
const MAIN_TABLE: usize = 286;
const FIXED_MAIN_TABLE: usize = 288;
const DIST_TABLE: usize = 32;
const LEVEL_TABLE: usize = 19;
const NUM_LIT_LEN_MIN: usize = 257;
const NUM_DIST_MIN: usize = 1;
const NUM_LEVEL_MIN: usize = 4;
const LEVEL_REP: usize = 16;
const LEVEL_ZERO: usize = 17;
const LEVEL_ZERO2: usize = 18;

const NO_LITERAL_PRICE: u8 = 11;
const NO_LEN_PRICE: u8 = 11;
const NO_POS_PRICE: u8 = 6;

const LEN_START: [u8; 31] =
    [0, 1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 14, 16, 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 255, 0, 0];
const LEN_DIRECT_BITS: [u8; 31] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0, 0, 0];
const DIST_START: [u32; DIST_TABLE] = [
    0, 1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 6144, 8192, 12288, 16384,
    24576, 32768, 49152,
];
const DIST_DIRECT_BITS: [u8; DIST_TABLE] =
    [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13, 14, 14];
const LEVEL_DIRECT_BITS: [u8; 3] = [2, 3, 7];
const LEVEL_ORDER: [usize; LEVEL_TABLE] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];

/// The fixed tables: `g_LenSlots` and the CRC table of the match finder's hash.
struct Tables {
    len_slot: [u8; 256],
    crc: [u32; 256],
}

fn tables() -> &'static Tables {
    static T: std::sync::OnceLock<Tables> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut len_slot = [0u8; 256];
        for slot in 0..29 {
            let start = usize::from(LEN_START[slot]);
            for k in 0..(1usize << LEN_DIRECT_BITS[slot]) {
                len_slot[start + k] = slot as u8;
            }
        }
        let mut crc = [0u32; 256];
        for (i, c) in crc.iter_mut().enumerate() {
            let mut r = i as u32;
            for _ in 0..8 {
                r = (r >> 1) ^ (0xEDB8_8320 & 0u32.wrapping_sub(r & 1));
            }
            *c = r;
        }
        Tables { len_slot, crc }
    })
}

/// `GetPosSlot`: the distance code of a distance - 1.
fn pos_slot(pos: u32) -> usize {
    if pos < 4 {
        pos as usize
    } else {
        let hb = 31 - pos.leading_zeros();
        (2 * hb + ((pos >> (hb - 1)) & 1)) as usize
    }
}

// ---------------------------------------------------------------- match finder

/// `CMatchFinder` in `Bt3Zip` mode (binary trees, levels 5-6) or `Hc3Zip`
/// mode (hash chains, levels 1-4) over the whole input: positions are
/// 1-based as LzFind's (0 marks an empty hash slot or link).
struct MatchFinder<'a> {
    data: &'a [u8],
    /// Binary trees (`btMode`), else hash chains.
    bt: bool,
    crc: &'static [u32; 256],
    /// Index in `data` of the next byte to insert.
    at: usize,
    hash: Vec<u32>,
    son: Vec<u32>,
}

impl MatchFinder<'_> {
    fn avail(&self) -> u32 {
        (self.data.len() - self.at) as u32
    }

    fn len_limit(&self) -> u32 {
        self.avail().min(FAST_BYTES)
    }

    fn hash_head(&mut self) -> (u32, u32) {
        let d = self.data;
        let cur = self.at;
        let hv = ((u32::from(d[cur + 2]) | (u32::from(d[cur]) << 8)) ^ self.crc[usize::from(d[cur + 1])]) & 0xFFFF;
        let pos = self.at as u32 + 1;
        let cur_match = self.hash[hv as usize];
        self.hash[hv as usize] = pos;
        (cur_match, pos)
    }

    /// `Bt3Zip_MatchFinder_GetMatches` (`Hc3Zip_…`): pushes (length,
    /// distance - 1) pairs of increasing length.
    fn get_matches(&mut self, out: &mut Vec<(u32, u32)>) {
        out.clear();
        let len_limit = self.len_limit();
        if len_limit < MATCH_MIN {
            self.at += 1;
            return;
        }
        let (cur_match, pos) = self.hash_head();
        if self.bt {
            self.tree(len_limit, cur_match, pos, Some(out));
        } else {
            self.chain(len_limit, cur_match, pos, Some(out));
        }
        self.at += 1;
    }

    /// `Bt3Zip_MatchFinder_Skip` (`Hc3Zip_…`).
    fn skip(&mut self, num: u32) {
        for _ in 0..num {
            let len_limit = self.len_limit();
            if len_limit < MATCH_MIN {
                self.at += 1;
                continue;
            }
            let (cur_match, pos) = self.hash_head();
            if self.bt {
                self.tree(len_limit, cur_match, pos, None);
            } else {
                self.chain(len_limit, cur_match, pos, None);
            }
            self.at += 1;
        }
    }

    /// `Hc_GetMatchesSpec` (with `out`; without, only the link is set).
    fn chain(&mut self, len_limit: u32, mut cur_match: u32, pos: u32, out: Option<&mut Vec<(u32, u32)>>) {
        self.son[(pos % CYCLIC) as usize] = cur_match;
        let Some(out) = out else { return };
        let d = self.data;
        let cur = self.at;
        let len_limit = len_limit as usize;
        let mut max_len = (MATCH_MIN - 1) as usize;
        let mut cut = CUT_VALUE;
        loop {
            if cur_match == 0 {
                break;
            }
            let delta = pos - cur_match;
            if delta >= CYCLIC {
                break;
            }
            let next = self.son[(cur_match % CYCLIC) as usize];
            let pb = cur - delta as usize;
            if d[cur + max_len] == d[pb + max_len] {
                let mut len = 0;
                while d[cur + len] == d[pb + len] {
                    len += 1;
                    if len == len_limit {
                        out.push((len_limit as u32, delta - 1));
                        return;
                    }
                }
                if max_len < len {
                    max_len = len;
                    out.push((len as u32, delta - 1));
                }
            }
            cur_match = next;
            cut -= 1;
            if cut == 0 {
                break;
            }
        }
    }

    /// `GetMatchesSpec1` (with `out`) and `SkipMatchesSpec` (without).
    fn tree(&mut self, len_limit: u32, mut cur_match: u32, pos: u32, mut out: Option<&mut Vec<(u32, u32)>>) {
        let d = self.data;
        let cur = self.at;
        let cyc_pos = (pos % CYCLIC) as usize;
        let mut ptr0 = (cyc_pos << 1) + 1;
        let mut ptr1 = cyc_pos << 1;
        let (mut len0, mut len1) = (0u32, 0u32);
        let mut max_len = MATCH_MIN - 1;
        let cm_check = pos.saturating_sub(CYCLIC);
        let mut cut = CUT_VALUE;
        let son = &mut self.son;
        while cm_check < cur_match {
            let delta = pos - cur_match;
            let pair = ((cur_match % CYCLIC) as usize) << 1;
            let pb = cur - delta as usize;
            let mut len = len0.min(len1);
            let pair0 = son[pair];
            if d[pb + len as usize] == d[cur + len as usize] {
                len += 1;
                while len != len_limit && d[pb + len as usize] == d[cur + len as usize] {
                    len += 1;
                }
                let longer = max_len < len;
                if longer {
                    max_len = len;
                }
                if let (true, Some(o)) = (longer, out.as_deref_mut()) {
                    o.push((len, delta - 1));
                }
                if len == len_limit {
                    son[ptr1] = pair0;
                    son[ptr0] = son[pair + 1];
                    return;
                }
            }
            if d[pb + len as usize] < d[cur + len as usize] {
                son[ptr1] = cur_match;
                ptr1 = pair + 1;
                cur_match = son[ptr1];
                len1 = len;
            } else {
                son[ptr0] = cur_match;
                ptr0 = pair;
                cur_match = son[ptr0];
                len0 = len;
            }
            cut -= 1;
            if cut == 0 {
                break;
            }
        }
        son[ptr0] = 0;
        son[ptr1] = 0;
    }
}

// ---------------------------------------------------------------- Huffman

/// `Huffman_Generate`'s code lengths for `freqs` limited to `max_len`:
/// leaves sorted by (frequency, symbol), merged two queues at a time with
/// the leaf first on equal frequencies, then the depths counted level by
/// level, a node that would reach `max_len` put at the deepest level above
/// it that still has a leaf, and the lengths given out longest first in the
/// leaves' order.
fn huffman_lengths(freqs: &[u32], max_len: usize, lens: &mut [u8]) {
    lens.fill(0);
    let mut leaves: Vec<(u32, usize)> = freqs.iter().enumerate().filter(|(_, &f)| f != 0).map(|(s, &f)| (f, s)).collect();
    leaves.sort_unstable();
    let num = leaves.len();
    if num <= 2 {
        let (mut min_code, mut max_code) = (0usize, 1usize);
        if num > 0 {
            max_code = leaves[num - 1].1;
            if num == 2 {
                min_code = leaves[0].1;
                if min_code > max_code {
                    std::mem::swap(&mut min_code, &mut max_code);
                }
            } else if max_code == 0 {
                max_code = 1;
            }
        }
        lens[min_code] = 1;
        lens[max_code] = 1;
        return;
    }
    let mut node_freq = vec![0u32; num - 1];
    let mut parent = vec![0usize; num - 1];
    let (mut i, mut b, mut e) = (0usize, 0usize, 0usize);
    while e < num - 1 {
        let mut sum = 0;
        for _ in 0..2 {
            if i != num && (b == e || leaves[i].0 <= node_freq[b]) {
                sum += leaves[i].0;
                i += 1;
            } else {
                sum += node_freq[b];
                parent[b] = e;
                b += 1;
            }
        }
        node_freq[e] = sum;
        e += 1;
    }
    let mut depth = vec![0usize; num - 1];
    let mut counts = [0u32; 17];
    counts[1] = 2;
    for e in (0..num - 2).rev() {
        let mut len = depth[parent[e]] + 1;
        depth[e] = len;
        if len >= max_len {
            len = max_len - 1;
            while counts[len] == 0 {
                len -= 1;
            }
        }
        counts[len] -= 1;
        counts[len + 1] += 2;
    }
    let mut k = 0;
    for len in (1..=max_len).rev() {
        for _ in 0..counts[len] {
            lens[leaves[k].1] = len as u8;
            k += 1;
        }
    }
}

/// The canonical codes of `lens`, bit-reversed for writing.
fn codes(lens: &[u8], out: &mut [u32]) {
    let mut count = [0u32; 17];
    for &l in lens {
        count[usize::from(l)] += 1;
    }
    count[0] = 0;
    let mut next = [0u32; 17];
    let mut code = 0u32;
    for len in 1..17 {
        code = (code + count[len - 1]) << 1;
        next[len] = code;
    }
    for (c, &l) in out.iter_mut().zip(lens) {
        if l == 0 {
            *c = 0;
            continue;
        }
        let v = next[usize::from(l)];
        next[usize::from(l)] += 1;
        *c = v.reverse_bits() >> (32 - u32::from(l));
    }
}

// ---------------------------------------------------------------- output

/// Bytes are handed on in runs of about this many (and at each block's end).
const OUT_CHUNK: usize = 4096;

/// `CBitlEncoder`: bits least significant first.
struct Bits<F> {
    buf: u64,
    valid: u32,
    out: Vec<u8>,
    sink: F,
    failed: bool,
}

impl<F: FnMut(&[u8]) -> bool> Bits<F> {
    fn send(&mut self, value: u32, length: u32) {
        self.buf |= u64::from(value) << self.valid;
        self.valid += length;
        while self.valid >= 8 {
            self.out.push(self.buf as u8);
            self.buf >>= 8;
            self.valid -= 8;
        }
    }

    fn flush_byte(&mut self) {
        if self.valid > 0 {
            self.out.push(self.buf as u8);
        }
        self.buf = 0;
        self.valid = 0;
    }

    fn hand_on(&mut self) {
        if !self.failed && !self.out.is_empty() && !(self.sink)(&self.out) {
            self.failed = true;
        }
        self.out.clear();
    }

    fn maybe_hand_on(&mut self) {
        if self.out.len() >= OUT_CHUNK {
            self.hand_on();
        }
    }
}

// ---------------------------------------------------------------- encoder

#[derive(Clone, Copy, Default)]
struct Optimal {
    price: u32,
    pos_prev: u32,
    back_prev: u32,
}

/// One symbol of a block: a literal, or a match (length - 3, distance - 1).
#[derive(Clone, Copy)]
enum Value {
    Literal(u8),
    Match(u8, u16),
}

/// `CLevels`: code lengths of the literal/length and distance codes.
#[derive(Clone, Copy)]
struct Levels {
    lit_len: [u8; FIXED_MAIN_TABLE],
    dist: [u8; DIST_TABLE],
}

struct Encoder<'a, F> {
    t: &'static Tables,
    /// Levels 1-4: `GetOptimalFast` (the longest match, no pricing).
    fast: bool,
    data: &'a [u8],
    mf: MatchFinder<'a>,
    /// Index in `data` of the next byte to code.
    at: usize,
    matches: Vec<(u32, u32)>,
    opt: Vec<Optimal>,
    opt_end: u32,
    opt_cur: u32,
    literal_prices: [u8; 256],
    len_prices: [u8; 256],
    pos_prices: [u8; DIST_TABLE],
    /// `m_Tables[1]`'s levels: the previous block's code lengths.
    prev_levels: Levels,
    levels: Levels,
    main_freqs: [u32; FIXED_MAIN_TABLE],
    dist_freqs: [u32; DIST_TABLE],
    main_codes: [u32; FIXED_MAIN_TABLE],
    dist_codes: [u32; DIST_TABLE],
    level_lens: [u8; LEVEL_TABLE],
    level_codes: [u32; LEVEL_TABLE],
    level_levels: [u8; LEVEL_TABLE],
    num_lit_len_levels: usize,
    num_dist_levels: usize,
    num_level_codes: usize,
    values: Vec<Value>,
    block_size: u32,
    bits: Bits<F>,
    /// [`matches`]: the expected stream's first block, compared symbol by
    /// symbol as the parser records them (dropped after that block).
    check: Option<FirstBlock<'a>>,
    refuted: bool,
}

impl<'a, F: FnMut(&[u8]) -> bool> Encoder<'a, F> {
    fn new(data: &'a [u8], fast: bool, sink: F) -> Self {
        let t = tables();
        // CTables::InitStructures
        let mut lit_len = [5u8; FIXED_MAIN_TABLE];
        lit_len[..256].fill(8);
        lit_len[256] = 13;
        Encoder {
            t,
            fast,
            data,
            mf: MatchFinder { data, bt: !fast, crc: &t.crc, at: 0, hash: vec![0; HASH_SIZE], son: vec![0; 2 * CYCLIC as usize] },
            at: 0,
            matches: Vec::with_capacity(2 * MATCH_MAX as usize),
            opt: vec![Optimal::default(); NUM_OPTS],
            opt_end: 0,
            opt_cur: 0,
            literal_prices: [0; 256],
            len_prices: [0; 256],
            pos_prices: [0; DIST_TABLE],
            prev_levels: Levels { lit_len, dist: [5; DIST_TABLE] },
            levels: Levels { lit_len: [0; FIXED_MAIN_TABLE], dist: [0; DIST_TABLE] },
            main_freqs: [0; FIXED_MAIN_TABLE],
            dist_freqs: [0; DIST_TABLE],
            main_codes: [0; FIXED_MAIN_TABLE],
            dist_codes: [0; DIST_TABLE],
            level_lens: [0; LEVEL_TABLE],
            level_codes: [0; LEVEL_TABLE],
            level_levels: [0; LEVEL_TABLE],
            num_lit_len_levels: 0,
            num_dist_levels: 0,
            num_level_codes: 0,
            values: Vec::with_capacity(VALUE_BLOCK_SIZE + NUM_OPTS),
            block_size: 0,
            bits: Bits { buf: 0, valid: 0, out: Vec::with_capacity(OUT_CHUNK + 64), sink, failed: false },
            check: None,
            refuted: false,
        }
    }

    /// `CCoder::GetMatches`: the match finder's matches at its position, the
    /// longest extended past the fast bytes at its distance.
    fn get_matches(&mut self) {
        self.mf.get_matches(&mut self.matches);
        if let Some(last) = self.matches.last_mut() {
            if last.0 == FAST_BYTES {
                let at = self.mf.at - 1;
                let limit = (self.data.len() - at).min(MATCH_MAX as usize);
                let from = at - (last.1 as usize + 1);
                let mut len = last.0 as usize;
                while len < limit && self.data[at + len] == self.data[from + len] {
                    len += 1;
                }
                last.0 = len as u32;
            }
        }
    }

    fn backward(&mut self, mut cur: u32) -> (u32, u32) {
        self.opt_end = cur;
        let mut pos_mem = self.opt[cur as usize].pos_prev;
        let mut back_mem = self.opt[cur as usize].back_prev;
        loop {
            let pos_prev = pos_mem;
            let back_cur = back_mem;
            let o = &mut self.opt[pos_prev as usize];
            back_mem = o.back_prev;
            pos_mem = o.pos_prev;
            o.back_prev = back_cur;
            o.pos_prev = cur;
            cur = pos_prev;
            if cur == 0 {
                break;
            }
        }
        self.opt_cur = self.opt[0].pos_prev;
        (self.opt_cur, self.opt[0].back_prev)
    }

    /// `GetOptimalFast`: the longest match here, or a literal.
    fn get_optimal_fast(&mut self) -> (u32, u32) {
        self.get_matches();
        let Some(&(len, dist)) = self.matches.last() else {
            return (1, 0);
        };
        self.mf.skip(len - 1);
        (len, dist)
    }

    /// `GetOptimal`: the next (length, distance - 1); a length of 1 is a literal.
    fn get_optimal(&mut self) -> (u32, u32) {
        if self.opt_end != self.opt_cur {
            let o = self.opt[self.opt_cur as usize];
            let len = o.pos_prev - self.opt_cur;
            self.opt_cur = o.pos_prev;
            return (len, o.back_prev);
        }
        self.opt_cur = 0;
        self.opt_end = 0;
        let base = self.at;
        self.get_matches();
        let Some(&(mut len_end, dist)) = self.matches.last() else {
            return (1, 0);
        };
        if len_end > FAST_BYTES {
            self.mf.skip(len_end - 1);
            return (len_end, dist);
        }
        self.opt[1].price = u32::from(self.literal_prices[usize::from(self.data[base])]);
        self.opt[1].pos_prev = 0;
        self.opt[2].price = INFINITE_PRICE;
        self.opt[2].pos_prev = 1;
        let mut offs = 0;
        for i in MATCH_MIN..=len_end {
            let (mlen, distance) = self.matches[offs];
            let o = &mut self.opt[i as usize];
            o.pos_prev = 0;
            o.back_prev = distance;
            o.price = u32::from(self.len_prices[(i - MATCH_MIN) as usize]) + u32::from(self.pos_prices[pos_slot(distance)]);
            if i == mlen {
                offs += 1;
            }
        }
        let mut cur = 0u32;
        loop {
            cur += 1;
            if cur == len_end || cur == NUM_OPTS_BASE {
                return self.backward(cur);
            }
            self.get_matches();
            let mut new_len = 0;
            if let Some(&(l, d)) = self.matches.last() {
                new_len = l;
                if new_len > FAST_BYTES {
                    let r = self.backward(cur);
                    self.opt_end = cur + new_len;
                    let o = &mut self.opt[cur as usize];
                    o.back_prev = d;
                    o.pos_prev = self.opt_end;
                    self.mf.skip(new_len - 1);
                    return r;
                }
            }
            let cur_price = self.opt[cur as usize].price;
            let p1 = cur_price + u32::from(self.literal_prices[usize::from(self.data[base + cur as usize])]);
            let o = &mut self.opt[cur as usize + 1];
            if p1 < o.price {
                o.price = p1;
                o.pos_prev = cur;
            }
            if self.matches.is_empty() {
                continue;
            }
            while len_end < cur + new_len {
                len_end += 1;
                self.opt[len_end as usize].price = INFINITE_PRICE;
            }
            let mut offs = 0;
            let mut distance = self.matches[0].1;
            let mut price = cur_price + u32::from(self.pos_prices[pos_slot(distance)]);
            let mut len_test = MATCH_MIN;
            loop {
                let p = price + u32::from(self.len_prices[(len_test - MATCH_MIN) as usize]);
                let o = &mut self.opt[(cur + len_test) as usize];
                if p < o.price {
                    o.price = p;
                    o.pos_prev = cur;
                    o.back_prev = distance;
                }
                if len_test == self.matches[offs].0 {
                    offs += 1;
                    if offs == self.matches.len() {
                        break;
                    }
                    price -= u32::from(self.pos_prices[pos_slot(distance)]);
                    distance = self.matches[offs].1;
                    price += u32::from(self.pos_prices[pos_slot(distance)]);
                }
                len_test += 1;
            }
        }
    }

    fn set_prices(&mut self, levels: &Levels) {
        for (p, &l) in self.literal_prices.iter_mut().zip(&levels.lit_len[..256]) {
            *p = if l != 0 { l } else { NO_LITERAL_PRICE };
        }
        for (i, p) in self.len_prices.iter_mut().enumerate() {
            let slot = usize::from(self.t.len_slot[i]);
            let l = levels.lit_len[SYMBOL_MATCH + slot];
            *p = if l != 0 { l } else { NO_LEN_PRICE } + LEN_DIRECT_BITS[slot];
        }
        for (i, p) in self.pos_prices.iter_mut().enumerate() {
            let l = levels.dist[i];
            *p = if l != 0 { l } else { NO_POS_PRICE } + DIST_DIRECT_BITS[i];
        }
    }

    /// `TryBlock` (first pass): parses the block's symbols.
    fn try_block(&mut self) {
        self.main_freqs = [0; FIXED_MAIN_TABLE];
        self.dist_freqs = [0; DIST_TABLE];
        self.values.clear();
        let limit = self.block_size;
        self.block_size = 0;
        loop {
            if self.opt_cur == self.opt_end
                && (self.block_size >= limit || self.mf.avail() == 0 || self.values.len() >= VALUE_BLOCK_SIZE || self.refuted)
            {
                break;
            }
            let (len, pos) = if self.fast { self.get_optimal_fast() } else { self.get_optimal() };
            if len >= MATCH_MIN {
                let l = len - MATCH_MIN;
                self.main_freqs[SYMBOL_MATCH + usize::from(self.t.len_slot[l as usize])] += 1;
                self.dist_freqs[pos_slot(pos)] += 1;
                self.values.push(Value::Match(l as u8, pos as u16));
                if let Some(c) = &mut self.check {
                    self.refuted |= !c.next_is(pos + 1, l);
                }
            } else {
                let b = self.data[self.at];
                self.main_freqs[usize::from(b)] += 1;
                self.values.push(Value::Literal(b));
                if let Some(c) = &mut self.check {
                    self.refuted |= !c.next_is(0, u32::from(b));
                }
            }
            self.at += len as usize;
            self.block_size += len;
        }
        self.main_freqs[END_OF_BLOCK] += 1;
    }

    /// `LevelTableDummy` (`send` false: counts into `freqs`) and
    /// `LevelTableCode` (`send` true: writes with the level codes).
    fn level_table(&mut self, dist: bool, send: bool, freqs: &mut [u32; LEVEL_TABLE]) {
        let all = self.levels;
        let (levels, num): (&[u8], usize) = if dist { (&all.dist, self.num_dist_levels) } else { (&all.lit_len, self.num_lit_len_levels) };
        let levels = &levels[..num];
        let (level_codes, level_lens) = (self.level_codes, self.level_lens);
        let mut put = |bits: &mut Bits<F>, sym: usize, extra: Option<(u32, u32)>| {
            if send {
                bits.send(level_codes[sym], u32::from(level_lens[sym]));
                if let Some((v, n)) = extra {
                    bits.send(v, n);
                }
            } else {
                freqs[sym] += 1;
            }
        };
        let mut prev_len = 0xFFusize;
        let mut next_len = usize::from(levels[0]);
        let mut count = 0u32;
        let (mut max_count, mut min_count) = if next_len == 0 { (138, 3) } else { (7, 4) };
        for n in 0..num {
            let cur_len = next_len;
            next_len = if n + 1 < num { usize::from(levels[n + 1]) } else { 0xFF };
            count += 1;
            if count < max_count && cur_len == next_len {
                continue;
            }
            if count < min_count {
                for _ in 0..count {
                    put(&mut self.bits, cur_len, None);
                }
            } else if cur_len != 0 {
                if cur_len != prev_len {
                    put(&mut self.bits, cur_len, None);
                    count -= 1;
                }
                put(&mut self.bits, LEVEL_REP, Some((count - 3, 2)));
            } else if count <= 10 {
                put(&mut self.bits, LEVEL_ZERO, Some((count - 3, 3)));
            } else {
                put(&mut self.bits, LEVEL_ZERO2, Some((count - 11, 7)));
            }
            count = 0;
            prev_len = cur_len;
            (max_count, min_count) = if next_len == 0 {
                (138, 3)
            } else if cur_len == next_len {
                (6, 3)
            } else {
                (7, 4)
            };
        }
    }

    /// `TryDynBlock(1, 1)`: parses the block and returns its price in bits
    /// as a dynamic block.
    fn try_dyn_block(&mut self) -> u32 {
        let prev = self.prev_levels;
        self.set_prices(&prev);
        self.try_block();
        let n = self.values.len();
        let max_bits = if n > 18000 {
            12
        } else if n > 7000 {
            11
        } else if n > 2000 {
            10
        } else {
            9
        };
        // MakeTables
        huffman_lengths(&self.main_freqs, max_bits, &mut self.levels.lit_len);
        huffman_lengths(&self.dist_freqs, max_bits, &mut self.levels.dist);
        codes(&self.levels.lit_len, &mut self.main_codes);
        codes(&self.levels.dist, &mut self.dist_codes);
        self.prev_levels = self.levels;

        self.num_lit_len_levels = MAIN_TABLE;
        while self.num_lit_len_levels > NUM_LIT_LEN_MIN && self.levels.lit_len[self.num_lit_len_levels - 1] == 0 {
            self.num_lit_len_levels -= 1;
        }
        self.num_dist_levels = DIST_TABLE;
        while self.num_dist_levels > NUM_DIST_MIN && self.levels.dist[self.num_dist_levels - 1] == 0 {
            self.num_dist_levels -= 1;
        }
        let mut level_freqs = [0u32; LEVEL_TABLE];
        self.level_table(false, false, &mut level_freqs);
        self.level_table(true, false, &mut level_freqs);
        huffman_lengths(&level_freqs, 7, &mut self.level_lens);
        codes(&self.level_lens, &mut self.level_codes);
        self.num_level_codes = NUM_LEVEL_MIN;
        for (i, &o) in LEVEL_ORDER.iter().enumerate() {
            let level = self.level_lens[o];
            if level > 0 && i >= self.num_level_codes {
                self.num_level_codes = i + 1;
            }
            self.level_levels[i] = level;
        }

        let mut price = 0u32;
        for (f, &l) in self.main_freqs.iter().zip(&self.levels.lit_len) {
            price += f * u32::from(l);
        }
        for (f, &b) in self.main_freqs[SYMBOL_MATCH..].iter().zip(&LEN_DIRECT_BITS) {
            price += f * u32::from(b);
        }
        for ((f, &l), &b) in self.dist_freqs.iter().zip(&self.levels.dist).zip(&DIST_DIRECT_BITS) {
            price += f * (u32::from(l) + u32::from(b));
        }
        for (f, &l) in level_freqs.iter().zip(&self.level_lens) {
            price += f * u32::from(l);
        }
        for (f, &b) in level_freqs[LEVEL_REP..].iter().zip(&LEVEL_DIRECT_BITS) {
            price += f * u32::from(b);
        }
        price + 5 + 5 + 4 + self.num_level_codes as u32 * 3 + 1 + 2
    }

    fn write_block(&mut self) {
        let bits = &mut self.bits;
        for v in &self.values {
            match *v {
                Value::Literal(b) => bits.send(self.main_codes[usize::from(b)], u32::from(self.levels.lit_len[usize::from(b)])),
                Value::Match(l, d) => {
                    let slot = usize::from(self.t.len_slot[usize::from(l)]);
                    let sym = SYMBOL_MATCH + slot;
                    bits.send(self.main_codes[sym], u32::from(self.levels.lit_len[sym]));
                    bits.send(u32::from(l) - u32::from(LEN_START[slot]), u32::from(LEN_DIRECT_BITS[slot]));
                    let d = u32::from(d);
                    let ps = pos_slot(d);
                    bits.send(self.dist_codes[ps], u32::from(self.levels.dist[ps]));
                    bits.send(d - DIST_START[ps], u32::from(DIST_DIRECT_BITS[ps]));
                }
            }
            bits.maybe_hand_on();
        }
        bits.send(self.main_codes[END_OF_BLOCK], u32::from(self.levels.lit_len[END_OF_BLOCK]));
    }

    /// One block: `GetBlockPrice(1, 1)` then `CodeBlock(1, final)`.
    fn block(&mut self) {
        self.block_size = BLOCK_THRESHOLD;
        let start = self.at;
        let price = self.try_dyn_block();
        if let Some(c) = self.check.take() {
            self.refuted |= !c.ends_here();
        }
        if self.refuted {
            return;
        }
        let len = self.block_size;
        // GetStorePrice(len, 0): one stored block (blocks stay under 64 KiB).
        let store_price = 3 + 5 + 32 + len * 8;
        let last = u32::from(self.mf.avail() == 0);
        if store_price <= price {
            self.bits.send(last, 1);
            self.bits.send(0, 2);
            self.bits.flush_byte();
            self.bits.send(len, 16);
            self.bits.send(!len & 0xFFFF, 16);
            self.bits.out.extend_from_slice(&self.data[start..start + len as usize]);
        } else {
            self.bits.send(last, 1);
            self.bits.send(2, 2);
            self.bits.send((self.num_lit_len_levels - NUM_LIT_LEN_MIN) as u32, 5);
            self.bits.send((self.num_dist_levels - NUM_DIST_MIN) as u32, 5);
            self.bits.send((self.num_level_codes - NUM_LEVEL_MIN) as u32, 4);
            for i in 0..self.num_level_codes {
                self.bits.send(u32::from(self.level_levels[i]), 3);
            }
            let mut unused = [0u32; LEVEL_TABLE];
            self.level_table(false, true, &mut unused);
            self.level_table(true, true, &mut unused);
            self.write_block();
        }
        self.bits.hand_on();
    }

    fn run(&mut self) {
        loop {
            self.block();
            if self.refuted || self.bits.failed || self.mf.avail() == 0 {
                break;
            }
        }
        if !self.refuted {
            self.bits.flush_byte();
            self.bits.hand_on();
        }
    }
}

/// The levels ported: 7-Zip's `-mx=1` to `-mx=6`. 1 to 4 are one encoder
/// (the fast mode: hash chains, the longest match), 5 and 6 another (the
/// optimal parser): see the module's introduction.
pub const LEVELS: std::ops::RangeInclusive<u8> = 1..=6;

/// The deflate stream `7z a -tzip -mm=Deflate -mx=level` writes for a member
/// with content `data` (see the module's introduction); empty for a level
/// not in [`LEVELS`].
pub fn deflate(data: &[u8], level: u8) -> Vec<u8> {
    let mut out = Vec::new();
    run(data, level, |b| {
        out.extend_from_slice(b);
        true
    });
    out
}

/// Deflates `data` at `level`, handing the output to `sink` in order as it
/// is made; `sink` returns false to stop. True when the stream was made and
/// every piece accepted; false for a level not in [`LEVELS`] or content over 4 GiB less 64 KiB.
pub fn run(data: &[u8], level: u8, sink: impl FnMut(&[u8]) -> bool) -> bool {
    run_checked(data, level, sink, None)
}

fn run_checked<'a>(data: &'a [u8], level: u8, sink: impl FnMut(&[u8]) -> bool, check: Option<FirstBlock<'a>>) -> bool {
    if !LEVELS.contains(&level) || data.len() > MAX_INPUT {
        return false;
    }
    let mut e = Encoder::new(data, level < 5, sink);
    e.check = check;
    e.run();
    !e.bits.failed && !e.refuted
}

/// Whether 7-Zip at `level` makes exactly `expected` of `data`. Stops at
/// the first differing output byte, and before that, when `expected` begins
/// with a coded block, at the first symbol of that block that differs from
/// the encoder's (so another deflater costs the work up to that symbol
/// rather than 7-Zip's whole first block).
pub fn matches(data: &[u8], level: u8, expected: &[u8]) -> bool {
    crate::infozip::makes_exactly(expected, |sink, check| run_checked(data, level, sink, check))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: u32) -> Vec<u8> {
        (0..n).flat_map(|i| format!("<w:p><w:r><w:t>word {} {}</w:t></w:r></w:p>", i % 977, i % 13).into_bytes()).collect()
    }

    #[test]
    fn round_trips() {
        let mut inputs = vec![Vec::new(), b"a".to_vec(), b"abcabcabc".to_vec(), text(20_000), vec![0u8; 300_000]];
        let mut x = 0x9e37_79b9_u32;
        inputs.push(
            (0..200_000)
                .map(|_| {
                    x ^= x << 13;
                    x ^= x >> 17;
                    x ^= x << 5;
                    x as u8
                })
                .collect(),
        );
        for input in &inputs {
            for (level, same) in [(5, 6), (1, 4)] {
                let c = deflate(input, level);
                assert_eq!(crate::deflate::inflate(&c, 1 << 30).unwrap(), *input, "{} bytes", input.len());
                assert_eq!(deflate(input, same), c);
                assert!(matches(input, level, &c));
                if !c.is_empty() {
                    assert!(!matches(input, level, &c[..c.len() - 1]));
                }
            }
        }
        assert!(deflate(b"abc", 0).is_empty() && deflate(b"abc", 7).is_empty());
    }

    /// Streams of other deflaters are refuted; a changed byte is.
    #[test]
    fn other_streams_are_refuted() {
        let t = text(30_000);
        let ours = deflate(&t, 5);
        for level in crate::infozip::LEVELS {
            let other = crate::infozip::deflate(&t, level);
            assert_eq!(matches(&t, 5, &other), other == ours);
        }
        let mut wrong = ours.clone();
        wrong[20] ^= 0x10;
        assert!(!matches(&t, 5, &wrong));
        assert!(!matches(&t, 5, &[]));
        assert!(!matches(&t, 5, &[0xff; 100]));
    }

    /// Content past 32-bit positions is refused before any work (zeroed
    /// pages: nothing is touched). Without the bound the positions wrapped.
    #[test]
    fn content_past_32_bit_positions_is_refused() {
        let huge = vec![0u8; MAX_INPUT + 1];
        assert!(!run(&huge, 5, |_| true));
        assert!(!run(&huge, 1, |_| true));
    }

    /// The Huffman lengths are a complete prefix code within the limit.
    #[test]
    fn huffman_lengths_are_complete() {
        let mut x = 12345u32;
        for n in [3usize, 5, 19, 30, 288] {
            for limit in [7usize, 9, 12] {
                if n > 1 << limit {
                    continue;
                }
                for _ in 0..50 {
                    let freqs: Vec<u32> = (0..n)
                        .map(|_| {
                            x ^= x << 13;
                            x ^= x >> 17;
                            x ^= x << 5;
                            if x % 5 == 0 {
                                0
                            } else {
                                1 << (x % 16)
                            }
                        })
                        .collect();
                    let mut lens = vec![0u8; n];
                    huffman_lengths(&freqs, limit, &mut lens);
                    let kraft: f64 = lens.iter().filter(|&&l| l > 0).map(|&l| 0.5f64.powi(i32::from(l))).sum();
                    assert!(lens.iter().all(|&l| usize::from(l) <= limit));
                    if freqs.iter().filter(|&&f| f > 0).count() >= 2 {
                        assert!((kraft - 1.0).abs() < 1e-9, "{kraft}");
                    }
                }
            }
        }
    }
}
