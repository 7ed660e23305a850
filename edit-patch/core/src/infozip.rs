//! A byte-exact port of Info-ZIP Zip 3.0's own deflater (`deflate.c` and
//! `trees.c` of `zip30`, the source of Debian's `zip` 3.0-13, which is built
//! without `USE_ZLIB`, `MMAP`, `BIG_MEM` or the assembler `longest_match`).
//!
//! [`deflate`] returns the member data that `zip -N` (N = 1 to 9, default 6)
//! writes for a file's content, when it writes a deflated member. `zip -0`
//! writes stored members (method 0, no deflate stream), and so does every
//! level when the whole file fits one block and storing it is no longer than
//! the block (`flush_block`'s "whole file stored" path, taken only when the
//! archive is seekable): this port takes the other path there (a stored or
//! coded deflate block, as zip writes to a pipe), which zip's deflated
//! members never need. [`matches`] runs the same deflater but compares its
//! output with an expected stream as it is written and stops at the first
//! byte that differs, and before any output, at the first symbol of the
//! expected stream's first block that differs from the deflater's.
//!
//! The deflater descends from the same code as gzip 1.2.4 and zlib, and
//! differs from zlib's in what it outputs:
//! * levels 1-3 run `deflate_fast` (no lazy matching; zlib: 1-3 too, but with
//!   other parameters), 4-9 the lazy `deflate`, with zip's configuration
//!   table (good/lazy/nice/chain: 4/4/8/4, 4/5/16/8, 4/6/32/32, 4/4/16/16,
//!   8/16/32/32, 8/16/128/128, 8/32/128/256, 32/128/258/1024,
//!   32/258/258/4096);
//! * a block ends after 32767 symbols (`LIT_BUFSIZE` - 1) or 32768 matches,
//!   and at levels 3-9 also where `ct_tally`'s estimate, every 4096 symbols,
//!   says the block compresses to less than half its input with fewer matches
//!   than half its symbols;
//! * `nice_match` is clipped to the lookahead near the end of the input and
//!   stays clipped; a match of length 3 farther than 4096 bytes is dropped
//!   (lazy levels only); strings are inserted only while 3 bytes are ahead;
//! * the 64 KiB window slides by 32 KiB when the position reaches 65274 and
//!   fewer than 262 bytes are ahead, dropping chain entries at exactly 32768
//!   (they become the chain's end); a block that began before a slide can no
//!   longer be stored;
//! * a block is stored when its length + 4 is at most its coded length, else
//!   coded with the fixed codes when that is no longer than the dynamic codes.
//!
//! Input is read as zip reads a regular file: 64 KiB at first, then whatever
//! the window has room for (`read()` returns every byte asked for, so the
//! output depends on the content and level only).
//!
//! Cost: one call allocates about 200 KiB (the 64 KiB window, the hash
//! chains, the 32 Ki-symbol buffer) besides the output; the speed is zip's
//! (0.23 s for 6.4 MB of XML at level 6, 1.4 s at level 9). zip's first
//! output comes when its first block ends, up to 32767 symbols in (most of a
//! megabyte of XML), so [`matches`] reads the expected stream's first block
//! as symbols (a bit at a time, as puff.c does) and compares each symbol the
//! deflater records with it: a wrong level or another deflater is refuted
//! within its first differing symbol (the nine levels in 0.1-0.4 ms on
//! 1.3-1.6 MB parts written by other deflaters, against 80-100 ms when
//! waiting for zip's first block).
//!
//! The tests in `edit-patch/core/tests/integration/infozip.rs` compare it
//! with the `zip` binary, when one is installed, at every level on the
//! shared corpus's parts and on made inputs.

const WSIZE: usize = 0x8000;
const WMASK: usize = WSIZE - 1;
const WINDOW_SIZE: usize = 2 * WSIZE;
const MIN_MATCH: u32 = 3;
const MAX_MATCH: u32 = 258;
const MIN_LOOKAHEAD: u32 = MAX_MATCH + MIN_MATCH + 1;
const MAX_DIST: u32 = WSIZE as u32 - MIN_LOOKAHEAD;
const HASH_BITS: u32 = 15;
const HASH_SIZE: usize = 1 << HASH_BITS;
const HASH_MASK: u32 = HASH_SIZE as u32 - 1;
const H_SHIFT: u32 = HASH_BITS.div_ceil(MIN_MATCH);
const NIL: u32 = 0;
const TOO_FAR: u32 = 4096;
const LIT_BUFSIZE: usize = 0x8000;
const DIST_BUFSIZE: usize = LIT_BUFSIZE;

/// good_length, max_lazy, nice_length, max_chain of `configuration_table`.
const CONFIG: [(u32, u32, u32, u32); 10] = [
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

// trees.c
const MAX_BITS: usize = 15;
const MAX_BL_BITS: usize = 7;
const LENGTH_CODES: usize = 29;
const LITERALS: usize = 256;
const END_BLOCK: usize = 256;
const L_CODES: usize = LITERALS + 1 + LENGTH_CODES;
const D_CODES: usize = 30;
const BL_CODES: usize = 19;
const HEAP_SIZE: usize = 2 * L_CODES + 1;
const REP_3_6: usize = 16;
const REPZ_3_10: usize = 17;
const REPZ_11_138: usize = 18;
const STORED_BLOCK: u32 = 0;
const STATIC_TREES: u32 = 1;
const DYN_TREES: u32 = 2;

const EXTRA_LBITS: [u32; LENGTH_CODES] = [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 5, 5, 5, 5, 0];
const EXTRA_DBITS: [u32; D_CODES] = [0, 0, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6, 7, 7, 8, 8, 9, 9, 10, 10, 11, 11, 12, 12, 13, 13];
const EXTRA_BLBITS: [u32; BL_CODES] = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 2, 3, 7];
const BL_ORDER: [usize; BL_CODES] = [16, 17, 18, 0, 8, 7, 9, 6, 10, 5, 11, 4, 12, 3, 13, 2, 14, 1, 15];

/// One element of a tree: `fc` is Freq, then Code; `dl` is Dad, then Len
/// (the unions of `ct_data`, whose overlap `gen_bitlen` relies on).
#[derive(Clone, Copy, Default)]
struct Node {
    fc: u16,
    dl: u16,
}

/// The fixed tables `ct_init` computes once.
struct Tables {
    length_code: [u8; 256],
    dist_code: [u8; 512],
    base_length: [u32; LENGTH_CODES],
    base_dist: [u32; D_CODES],
    static_ltree: [Node; L_CODES + 2],
    static_dtree: [Node; D_CODES],
}

fn bi_reverse(mut code: u32, mut len: u32) -> u32 {
    let mut res = 0u32;
    loop {
        res |= code & 1;
        code >>= 1;
        res <<= 1;
        len -= 1;
        if len == 0 {
            break;
        }
    }
    res >> 1
}

/// `gen_codes`: the codes of `tree[..=max_code]` from their lengths and `bl_count`.
fn gen_codes(tree: &mut [Node], max_code: usize, bl_count: &[u16; MAX_BITS + 1]) {
    let mut next_code = [0u16; MAX_BITS + 1];
    let mut code: u16 = 0;
    for bits in 1..=MAX_BITS {
        code = code.wrapping_add(bl_count[bits - 1]) << 1;
        next_code[bits] = code;
    }
    for node in &mut tree[..=max_code] {
        let len = node.dl as usize;
        if len == 0 {
            continue;
        }
        node.fc = bi_reverse(u32::from(next_code[len]), len as u32) as u16;
        next_code[len] = next_code[len].wrapping_add(1);
    }
}

fn tables() -> &'static Tables {
    static T: std::sync::OnceLock<Tables> = std::sync::OnceLock::new();
    T.get_or_init(|| {
        let mut t = Tables {
            length_code: [0; 256],
            dist_code: [0; 512],
            base_length: [0; LENGTH_CODES],
            base_dist: [0; D_CODES],
            static_ltree: [Node::default(); L_CODES + 2],
            static_dtree: [Node::default(); D_CODES],
        };
        let mut length = 0usize;
        let mut code = 0usize;
        while code < LENGTH_CODES - 1 {
            t.base_length[code] = length as u32;
            for _ in 0..(1 << EXTRA_LBITS[code]) {
                t.length_code[length] = code as u8;
                length += 1;
            }
            code += 1;
        }
        t.length_code[length - 1] = code as u8;
        let mut dist = 0usize;
        code = 0;
        while code < 16 {
            t.base_dist[code] = dist as u32;
            for _ in 0..(1 << EXTRA_DBITS[code]) {
                t.dist_code[dist] = code as u8;
                dist += 1;
            }
            code += 1;
        }
        dist >>= 7;
        while code < D_CODES {
            t.base_dist[code] = (dist << 7) as u32;
            for _ in 0..(1 << (EXTRA_DBITS[code] - 7)) {
                t.dist_code[256 + dist] = code as u8;
                dist += 1;
            }
            code += 1;
        }
        let mut bl_count = [0u16; MAX_BITS + 1];
        for (n, node) in t.static_ltree.iter_mut().enumerate() {
            let len = match n {
                0..=143 => 8,
                144..=255 => 9,
                256..=279 => 7,
                _ => 8,
            };
            node.dl = len;
            bl_count[len as usize] += 1;
        }
        gen_codes(&mut t.static_ltree, L_CODES + 1, &bl_count);
        for (n, node) in t.static_dtree.iter_mut().enumerate() {
            node.dl = 5;
            node.fc = bi_reverse(n as u32, 5) as u16;
        }
        t
    })
}

impl Tables {
    fn d_code(&self, dist: u32) -> usize {
        if dist < 256 {
            self.dist_code[dist as usize] as usize
        } else {
            self.dist_code[256 + (dist >> 7) as usize] as usize
        }
    }
}

// ---------------------------------------------------------------- output

/// Where the deflater hands its bytes; `false` stops it.
trait Sink {
    fn write(&mut self, b: &[u8]) -> bool;
}

impl Sink for Vec<u8> {
    fn write(&mut self, b: &[u8]) -> bool {
        self.extend_from_slice(b);
        true
    }
}

struct FnSink<F>(F);

impl<F: FnMut(&[u8]) -> bool> Sink for FnSink<F> {
    fn write(&mut self, b: &[u8]) -> bool {
        (self.0)(b)
    }
}

/// Bytes are handed on in runs of about this many (and at each block's end).
const OUT_CHUNK: usize = 4096;

/// zip's bit writer (`send_bits`, `bi_windup`, `copy_block`): the bytes it
/// writes do not depend on its 16-bit buffer, which is not copied.
struct Bits<S> {
    buf: u64,
    valid: u32,
    out: Vec<u8>,
    sink: S,
    failed: bool,
}

impl<S: Sink> Bits<S> {
    fn send(&mut self, value: u32, length: u32) {
        self.buf |= u64::from(value) << self.valid;
        self.valid += length;
        while self.valid >= 8 {
            self.out.push(self.buf as u8);
            self.buf >>= 8;
            self.valid -= 8;
        }
        if self.out.len() >= OUT_CHUNK {
            self.hand_on();
        }
    }

    fn windup(&mut self) {
        if self.valid > 0 {
            self.out.push(self.buf as u8);
        }
        self.buf = 0;
        self.valid = 0;
    }

    fn hand_on(&mut self) {
        if !self.failed && !self.out.is_empty() && !self.sink.write(&self.out) {
            self.failed = true;
        }
        self.out.clear();
    }
}

// ---------------------------------------------------------------- trees

/// The Huffman scratch of trees.c (`heap`, `depth`, `bl_count`) and the
/// block's bit counts.
struct Huff {
    heap: [usize; 2 * L_CODES + 1],
    heap_len: usize,
    heap_max: usize,
    depth: [u8; 2 * L_CODES + 1],
    bl_count: [u16; MAX_BITS + 1],
    opt_len: u64,
    static_len: u64,
}

/// A `tree_desc` without its tree.
struct Desc {
    stree: Option<&'static [Node]>,
    extra: &'static [u32],
    extra_base: usize,
    elems: usize,
    max_length: usize,
}

fn smaller(tree: &[Node], depth: &[u8], n: usize, m: usize) -> bool {
    tree[n].fc < tree[m].fc || (tree[n].fc == tree[m].fc && depth[n] <= depth[m])
}

impl Huff {
    fn pqdownheap(&mut self, tree: &[Node], mut k: usize) {
        let v = self.heap[k];
        let mut j = k << 1;
        while j <= self.heap_len {
            if j < self.heap_len && smaller(tree, &self.depth, self.heap[j + 1], self.heap[j]) {
                j += 1;
            }
            let htemp = self.heap[j];
            if smaller(tree, &self.depth, v, htemp) {
                break;
            }
            self.heap[k] = htemp;
            k = j;
            j <<= 1;
        }
        self.heap[k] = v;
    }

    fn gen_bitlen(&mut self, tree: &mut [Node], d: &Desc, max_code: usize) {
        self.bl_count = [0; MAX_BITS + 1];
        let mut overflow = 0i32;
        tree[self.heap[self.heap_max]].dl = 0;
        let mut h = self.heap_max + 1;
        while h < HEAP_SIZE {
            let n = self.heap[h];
            h += 1;
            let mut bits = tree[tree[n].dl as usize].dl as usize + 1;
            if bits > d.max_length {
                bits = d.max_length;
                overflow += 1;
            }
            tree[n].dl = bits as u16;
            if n > max_code {
                continue;
            }
            self.bl_count[bits] += 1;
            let xbits = if n >= d.extra_base { d.extra[n - d.extra_base] } else { 0 };
            let f = u64::from(tree[n].fc);
            self.opt_len = self.opt_len.wrapping_add(f * (bits as u64 + u64::from(xbits)));
            if let Some(st) = d.stree {
                self.static_len = self.static_len.wrapping_add(f * (u64::from(st[n].dl) + u64::from(xbits)));
            }
        }
        if overflow == 0 {
            return;
        }
        loop {
            let mut bits = d.max_length - 1;
            while self.bl_count[bits] == 0 {
                bits -= 1;
            }
            self.bl_count[bits] -= 1;
            self.bl_count[bits + 1] += 2;
            self.bl_count[d.max_length] -= 1;
            overflow -= 2;
            if overflow <= 0 {
                break;
            }
        }
        let mut h = HEAP_SIZE;
        for bits in (1..=d.max_length).rev() {
            let mut n = self.bl_count[bits];
            while n != 0 {
                h -= 1;
                let m = self.heap[h];
                if m > max_code {
                    continue;
                }
                if tree[m].dl as usize != bits {
                    let delta = (bits as i64 - i64::from(tree[m].dl)) * i64::from(tree[m].fc);
                    self.opt_len = self.opt_len.wrapping_add(delta as u64);
                    tree[m].dl = bits as u16;
                }
                n -= 1;
            }
        }
    }

    /// `build_tree`: returns the tree's `max_code`.
    fn build_tree(&mut self, tree: &mut [Node], d: &Desc) -> usize {
        let mut max_code: i32 = -1;
        let mut node = d.elems;
        self.heap_len = 0;
        self.heap_max = HEAP_SIZE;
        for (n, leaf) in tree[..d.elems].iter_mut().enumerate() {
            if leaf.fc != 0 {
                self.heap_len += 1;
                self.heap[self.heap_len] = n;
                max_code = n as i32;
                self.depth[n] = 0;
            } else {
                leaf.dl = 0;
            }
        }
        while self.heap_len < 2 {
            let new = if max_code < 2 {
                max_code += 1;
                max_code as usize
            } else {
                0
            };
            self.heap_len += 1;
            self.heap[self.heap_len] = new;
            tree[new].fc = 1;
            self.depth[new] = 0;
            self.opt_len = self.opt_len.wrapping_sub(1);
            if let Some(st) = d.stree {
                self.static_len = self.static_len.wrapping_sub(u64::from(st[new].dl));
            }
        }
        let max_code = max_code as usize;
        for n in (1..=self.heap_len / 2).rev() {
            self.pqdownheap(tree, n);
        }
        loop {
            // pqremove
            let n = self.heap[1];
            self.heap[1] = self.heap[self.heap_len];
            self.heap_len -= 1;
            self.pqdownheap(tree, 1);
            let m = self.heap[1];
            self.heap_max -= 1;
            self.heap[self.heap_max] = n;
            self.heap_max -= 1;
            self.heap[self.heap_max] = m;
            tree[node].fc = tree[n].fc.wrapping_add(tree[m].fc);
            self.depth[node] = self.depth[n].max(self.depth[m]).wrapping_add(1);
            tree[n].dl = node as u16;
            tree[m].dl = node as u16;
            self.heap[1] = node;
            node += 1;
            self.pqdownheap(tree, 1);
            if self.heap_len < 2 {
                break;
            }
        }
        self.heap_max -= 1;
        self.heap[self.heap_max] = self.heap[1];
        self.gen_bitlen(tree, d, max_code);
        gen_codes(tree, max_code, &self.bl_count);
        max_code
    }
}

/// `scan_tree`: counts `tree`'s run-length coding into `bl_tree`.
fn scan_tree(tree: &mut [Node], max_code: usize, bl_tree: &mut [Node]) {
    let mut prevlen: i32 = -1;
    let mut nextlen = i32::from(tree[0].dl);
    let mut count = 0u16;
    let (mut max_count, mut min_count) = if nextlen == 0 { (138, 3) } else { (7, 4) };
    tree[max_code + 1].dl = 0xffff;
    for n in 0..=max_code {
        let curlen = nextlen;
        nextlen = i32::from(tree[n + 1].dl);
        count += 1;
        if count < max_count && curlen == nextlen {
            continue;
        } else if count < min_count {
            bl_tree[curlen as usize].fc = bl_tree[curlen as usize].fc.wrapping_add(count);
        } else if curlen != 0 {
            if curlen != prevlen {
                bl_tree[curlen as usize].fc = bl_tree[curlen as usize].fc.wrapping_add(1);
            }
            bl_tree[REP_3_6].fc = bl_tree[REP_3_6].fc.wrapping_add(1);
        } else if count <= 10 {
            bl_tree[REPZ_3_10].fc = bl_tree[REPZ_3_10].fc.wrapping_add(1);
        } else {
            bl_tree[REPZ_11_138].fc = bl_tree[REPZ_11_138].fc.wrapping_add(1);
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

/// `send_tree`: writes `tree`'s run-length coding with `bl_tree`'s codes.
fn send_tree<S: Sink>(bits: &mut Bits<S>, tree: &[Node], max_code: usize, bl_tree: &[Node]) {
    let send_code = |bits: &mut Bits<S>, c: usize| bits.send(u32::from(bl_tree[c].fc), u32::from(bl_tree[c].dl));
    let mut prevlen: i32 = -1;
    let mut nextlen = i32::from(tree[0].dl);
    let mut count = 0u32;
    let (mut max_count, mut min_count) = if nextlen == 0 { (138, 3) } else { (7, 4) };
    for n in 0..=max_code {
        let curlen = nextlen;
        nextlen = i32::from(tree[n + 1].dl);
        count += 1;
        if count < max_count && curlen == nextlen {
            continue;
        } else if count < min_count {
            while count != 0 {
                send_code(bits, curlen as usize);
                count -= 1;
            }
        } else if curlen != 0 {
            if curlen != prevlen {
                send_code(bits, curlen as usize);
                count -= 1;
            }
            send_code(bits, REP_3_6);
            bits.send(count - 3, 2);
        } else if count <= 10 {
            send_code(bits, REPZ_3_10);
            bits.send(count - 3, 3);
        } else {
            send_code(bits, REPZ_11_138);
            bits.send(count - 11, 7);
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

// ---------------------------------------------------------------- deflater

/// The state of deflate.c and trees.c for one file.
struct Zip<'a, S> {
    t: &'static Tables,
    level: u32,
    input: &'a [u8],
    read_at: usize,
    // deflate.c
    window: Vec<u8>,
    prev: Vec<u16>,
    head: Vec<u16>,
    block_start: i64,
    ins_h: u32,
    prev_length: u32,
    strstart: u32,
    match_start: u32,
    eofile: bool,
    lookahead: u32,
    max_chain_length: u32,
    max_lazy_match: u32,
    good_match: u32,
    nice_match: i32,
    // trees.c
    dyn_ltree: [Node; HEAP_SIZE],
    dyn_dtree: [Node; 2 * D_CODES + 1],
    bl_tree: [Node; 2 * BL_CODES + 1],
    huff: Huff,
    /// `l_buf`, `d_buf` and `flag_buf` in one: (distance, or 0 for a
    /// literal; the literal, or the match length - 3).
    syms: Vec<(u16, u8)>,
    last_dist: usize,
    bits: Bits<S>,
    /// [`matches`]: the expected stream's first block, compared symbol by
    /// symbol as `ct_tally` records them (dropped after that block).
    check: Option<FirstBlock<'a>>,
    /// A symbol or the first block's end differed from `check`'s.
    refuted: bool,
}

impl<'a, S: Sink> Zip<'a, S> {
    fn new(input: &'a [u8], level: u32, sink: S) -> Self {
        let (good, lazy, nice, chain) = CONFIG[level as usize];
        let mut z = Zip {
            t: tables(),
            level,
            input,
            read_at: 0,
            window: vec![0; WINDOW_SIZE],
            prev: vec![0; WSIZE],
            head: vec![0; HASH_SIZE],
            block_start: 0,
            ins_h: 0,
            prev_length: 0,
            strstart: 0,
            match_start: 0,
            eofile: false,
            lookahead: 0,
            max_chain_length: chain,
            max_lazy_match: lazy,
            good_match: good,
            nice_match: nice as i32,
            dyn_ltree: [Node::default(); HEAP_SIZE],
            dyn_dtree: [Node::default(); 2 * D_CODES + 1],
            bl_tree: [Node::default(); 2 * BL_CODES + 1],
            huff: Huff {
                heap: [0; 2 * L_CODES + 1],
                heap_len: 0,
                heap_max: 0,
                depth: [0; 2 * L_CODES + 1],
                bl_count: [0; MAX_BITS + 1],
                opt_len: 0,
                static_len: 0,
            },
            syms: Vec::with_capacity(LIT_BUFSIZE),
            last_dist: 0,
            bits: Bits { buf: 0, valid: 0, out: Vec::with_capacity(OUT_CHUNK + 64), sink, failed: false },
            check: None,
            refuted: false,
        };
        z.init_block();
        z.lm_init();
        z
    }

    /// zip's `file_read` on a regular file: every byte asked for, up to the end.
    fn read_buf(&mut self, at: usize, size: usize) -> u32 {
        let n = size.min(self.input.len() - self.read_at);
        self.window[at..at + n].copy_from_slice(&self.input[self.read_at..self.read_at + n]);
        self.read_at += n;
        n as u32
    }

    fn lm_init(&mut self) {
        self.strstart = 0;
        self.block_start = 0;
        self.lookahead = self.read_buf(0, 2 * WSIZE);
        if self.lookahead == 0 {
            self.eofile = true;
            return;
        }
        self.eofile = false;
        if self.lookahead < MIN_LOOKAHEAD {
            self.fill_window();
        }
        self.ins_h = 0;
        for j in 0..(MIN_MATCH - 1) as usize {
            self.update_hash(self.window[j]);
        }
    }

    fn update_hash(&mut self, c: u8) {
        self.ins_h = ((self.ins_h << H_SHIFT) ^ u32::from(c)) & HASH_MASK;
    }

    /// `INSERT_STRING(s, match_head)`: returns the chain's former head.
    fn insert_string(&mut self, s: u32) -> u32 {
        self.update_hash(self.window[(s + MIN_MATCH - 1) as usize]);
        let head = self.head[self.ins_h as usize];
        self.prev[s as usize & WMASK] = head;
        self.head[self.ins_h as usize] = s as u16;
        u32::from(head)
    }

    fn longest_match(&mut self, mut cur_match: u32) -> u32 {
        let mut chain_length = self.max_chain_length;
        let scan = self.strstart as usize;
        let mut best_len = self.prev_length as usize;
        let limit = if self.strstart > MAX_DIST { self.strstart - MAX_DIST } else { NIL };
        let strend = scan + MAX_MATCH as usize;
        let w = &self.window;
        let mut scan_end1 = w[scan + best_len - 1];
        let mut scan_end = w[scan + best_len];
        if self.prev_length >= self.good_match {
            chain_length >>= 2;
        }
        loop {
            let m = cur_match as usize;
            if !(w[m + best_len] != scan_end || w[m + best_len - 1] != scan_end1 || w[m] != w[scan] || w[m + 1] != w[scan + 1]) {
                // Bytes 3 on, compared 8 at a time as the C loop does (it
                // stops at the first difference or at 258).
                let (mut s, mut mm) = (scan + 2, m + 2);
                loop {
                    let mut i = 0;
                    let mut differ = false;
                    while i < 8 {
                        s += 1;
                        mm += 1;
                        if w[s] != w[mm] {
                            differ = true;
                            break;
                        }
                        i += 1;
                    }
                    if differ || s >= strend {
                        break;
                    }
                }
                let len = MAX_MATCH as usize - (strend - s);
                if len > best_len {
                    self.match_start = cur_match;
                    best_len = len;
                    if len as i32 >= self.nice_match {
                        break;
                    }
                    scan_end1 = w[scan + best_len - 1];
                    scan_end = w[scan + best_len];
                }
            }
            cur_match = u32::from(self.prev[cur_match as usize & WMASK]);
            if cur_match <= limit {
                break;
            }
            chain_length -= 1;
            if chain_length == 0 {
                break;
            }
        }
        best_len as u32
    }

    fn fill_window(&mut self) {
        loop {
            let mut more = WINDOW_SIZE as u32 - self.lookahead - self.strstart;
            if self.strstart >= WSIZE as u32 + MAX_DIST {
                self.window.copy_within(WSIZE.., 0);
                self.match_start = self.match_start.wrapping_sub(WSIZE as u32);
                self.strstart -= WSIZE as u32;
                self.block_start -= WSIZE as i64;
                for h in self.head.iter_mut().chain(self.prev.iter_mut()) {
                    *h = if usize::from(*h) >= WSIZE { *h - WSIZE as u16 } else { NIL as u16 };
                }
                more += WSIZE as u32;
            }
            if self.eofile {
                return;
            }
            let n = self.read_buf((self.strstart + self.lookahead) as usize, more as usize);
            if n == 0 {
                self.eofile = true;
            } else {
                self.lookahead += n;
            }
            if self.lookahead >= MIN_LOOKAHEAD || self.eofile {
                break;
            }
        }
    }

    /// `FLUSH_BLOCK(eof)`.
    fn flush(&mut self, eof: bool) {
        if let Some(c) = self.check.take() {
            self.refuted |= !c.ends_here();
        }
        if self.refuted {
            return;
        }
        let stored_len = (i64::from(self.strstart) - self.block_start) as u64;
        let buf = (self.block_start >= 0).then_some(self.block_start as usize);
        self.flush_block(buf, stored_len, eof);
    }

    fn deflate_fast(&mut self) {
        let mut hash_head = NIL;
        let mut match_length: u32 = 0;
        self.prev_length = MIN_MATCH - 1;
        while self.lookahead != 0 && !self.refuted {
            if self.lookahead >= MIN_MATCH {
                hash_head = self.insert_string(self.strstart);
            }
            if hash_head != NIL && self.strstart.wrapping_sub(hash_head) <= MAX_DIST {
                if self.nice_match as u32 > self.lookahead {
                    self.nice_match = self.lookahead as i32;
                }
                match_length = self.longest_match(hash_head);
                if match_length > self.lookahead {
                    match_length = self.lookahead;
                }
            }
            let flush;
            if match_length >= MIN_MATCH {
                flush = self.ct_tally(self.strstart.wrapping_sub(self.match_start), match_length - MIN_MATCH);
                self.lookahead -= match_length;
                if match_length <= self.max_lazy_match && self.lookahead >= MIN_MATCH {
                    match_length -= 1;
                    loop {
                        self.strstart += 1;
                        hash_head = self.insert_string(self.strstart);
                        match_length -= 1;
                        if match_length == 0 {
                            break;
                        }
                    }
                    self.strstart += 1;
                } else {
                    self.strstart += match_length;
                    match_length = 0;
                    self.ins_h = u32::from(self.window[self.strstart as usize]);
                    self.update_hash(self.window[self.strstart as usize + 1]);
                }
            } else {
                flush = self.ct_tally(0, u32::from(self.window[self.strstart as usize]));
                self.lookahead -= 1;
                self.strstart += 1;
            }
            if flush {
                self.flush(false);
                self.block_start = i64::from(self.strstart);
            }
            if self.lookahead < MIN_LOOKAHEAD {
                self.fill_window();
            }
        }
        self.flush(true);
    }

    fn deflate_lazy(&mut self) {
        let mut hash_head = NIL;
        let mut match_available = false;
        let mut match_length: u32 = MIN_MATCH - 1;
        while self.lookahead != 0 && !self.refuted {
            if self.lookahead >= MIN_MATCH {
                hash_head = self.insert_string(self.strstart);
            }
            self.prev_length = match_length;
            let prev_match = self.match_start;
            match_length = MIN_MATCH - 1;
            if hash_head != NIL && self.prev_length < self.max_lazy_match && self.strstart.wrapping_sub(hash_head) <= MAX_DIST {
                if self.nice_match as u32 > self.lookahead {
                    self.nice_match = self.lookahead as i32;
                }
                match_length = self.longest_match(hash_head);
                if match_length > self.lookahead {
                    match_length = self.lookahead;
                }
                if match_length == MIN_MATCH && self.strstart.wrapping_sub(self.match_start) > TOO_FAR {
                    match_length = MIN_MATCH - 1;
                }
            }
            if self.prev_length >= MIN_MATCH && match_length <= self.prev_length {
                let max_insert = self.strstart + self.lookahead - MIN_MATCH;
                let flush = self.ct_tally(self.strstart.wrapping_sub(1).wrapping_sub(prev_match), self.prev_length - MIN_MATCH);
                self.lookahead -= self.prev_length - 1;
                self.prev_length -= 2;
                loop {
                    self.strstart += 1;
                    if self.strstart <= max_insert {
                        hash_head = self.insert_string(self.strstart);
                    }
                    self.prev_length -= 1;
                    if self.prev_length == 0 {
                        break;
                    }
                }
                self.strstart += 1;
                match_available = false;
                match_length = MIN_MATCH - 1;
                if flush {
                    self.flush(false);
                    self.block_start = i64::from(self.strstart);
                }
            } else if match_available {
                if self.ct_tally(0, u32::from(self.window[self.strstart as usize - 1])) {
                    self.flush(false);
                    self.block_start = i64::from(self.strstart);
                }
                self.strstart += 1;
                self.lookahead -= 1;
            } else {
                match_available = true;
                self.strstart += 1;
                self.lookahead -= 1;
            }
            if self.lookahead < MIN_LOOKAHEAD {
                self.fill_window();
            }
        }
        if match_available {
            self.ct_tally(0, u32::from(self.window[self.strstart as usize - 1]));
        }
        self.flush(true);
    }

    // ------------------------------------------------------------ trees.c

    fn init_block(&mut self) {
        for n in &mut self.dyn_ltree[..L_CODES] {
            n.fc = 0;
        }
        for n in &mut self.dyn_dtree[..D_CODES] {
            n.fc = 0;
        }
        for n in &mut self.bl_tree[..BL_CODES] {
            n.fc = 0;
        }
        self.dyn_ltree[END_BLOCK].fc = 1;
        self.huff.opt_len = 0;
        self.huff.static_len = 0;
        self.syms.clear();
        self.last_dist = 0;
    }

    /// `ct_tally(dist, lc)`: whether to end the block here.
    fn ct_tally(&mut self, dist: u32, lc: u32) -> bool {
        if let Some(c) = &mut self.check {
            self.refuted |= !c.next_is(dist, lc);
        }
        self.syms.push((dist as u16, lc as u8));
        if dist == 0 {
            self.dyn_ltree[lc as usize].fc = self.dyn_ltree[lc as usize].fc.wrapping_add(1);
        } else {
            let d = dist - 1;
            let l = self.t.length_code[lc as usize] as usize + LITERALS + 1;
            self.dyn_ltree[l].fc = self.dyn_ltree[l].fc.wrapping_add(1);
            let dc = self.t.d_code(d);
            self.dyn_dtree[dc].fc = self.dyn_dtree[dc].fc.wrapping_add(1);
            self.last_dist += 1;
        }
        let last_lit = self.syms.len();
        if self.level > 2 && last_lit & 0xfff == 0 {
            let mut out_length = last_lit as u64 * 8;
            let in_length = (i64::from(self.strstart) - self.block_start) as u64;
            for (node, extra) in self.dyn_dtree[..D_CODES].iter().zip(EXTRA_DBITS) {
                out_length += u64::from(node.fc) * (5 + u64::from(extra));
            }
            out_length >>= 3;
            if self.last_dist < last_lit / 2 && out_length < in_length / 2 {
                return true;
            }
        }
        last_lit == LIT_BUFSIZE - 1 || self.last_dist == DIST_BUFSIZE
    }

    fn flush_block(&mut self, buf: Option<usize>, stored_len: u64, eof: bool) {
        let t = self.t;
        let l_desc =
            Desc { stree: Some(&t.static_ltree[..]), extra: &EXTRA_LBITS, extra_base: LITERALS + 1, elems: L_CODES, max_length: MAX_BITS };
        let d_desc = Desc { stree: Some(&t.static_dtree[..]), extra: &EXTRA_DBITS, extra_base: 0, elems: D_CODES, max_length: MAX_BITS };
        let bl_desc = Desc { stree: None, extra: &EXTRA_BLBITS, extra_base: 0, elems: BL_CODES, max_length: MAX_BL_BITS };
        let l_max = self.huff.build_tree(&mut self.dyn_ltree, &l_desc);
        let d_max = self.huff.build_tree(&mut self.dyn_dtree, &d_desc);
        // build_bl_tree
        scan_tree(&mut self.dyn_ltree, l_max, &mut self.bl_tree);
        scan_tree(&mut self.dyn_dtree, d_max, &mut self.bl_tree);
        self.huff.build_tree(&mut self.bl_tree, &bl_desc);
        let mut max_blindex = BL_CODES - 1;
        while max_blindex >= 3 {
            if self.bl_tree[BL_ORDER[max_blindex]].dl != 0 {
                break;
            }
            max_blindex -= 1;
        }
        self.huff.opt_len = self.huff.opt_len.wrapping_add(3 * (max_blindex as u64 + 1) + 5 + 5 + 4);

        let mut opt_lenb = self.huff.opt_len.wrapping_add(3 + 7) >> 3;
        let static_lenb = self.huff.static_len.wrapping_add(3 + 7) >> 3;
        if static_lenb <= opt_lenb {
            opt_lenb = static_lenb;
        }
        // zip's "whole file stored" path (method STORE, no deflate stream)
        // is not taken: see the module's introduction.
        let eof_bit = u32::from(eof);
        if let (true, Some(at)) = (stored_len + 4 <= opt_lenb, buf) {
            self.bits.send((STORED_BLOCK << 1) + eof_bit, 3);
            self.bits.windup();
            let len = stored_len as u16;
            self.bits.out.extend_from_slice(&len.to_le_bytes());
            self.bits.out.extend_from_slice(&(!len).to_le_bytes());
            self.bits.hand_on();
            let data = &self.window[at..at + stored_len as usize];
            if !self.bits.failed && !data.is_empty() && !self.bits.sink.write(data) {
                self.bits.failed = true;
            }
        } else if static_lenb == opt_lenb {
            self.bits.send((STATIC_TREES << 1) + eof_bit, 3);
            self.compress_block(true);
        } else {
            self.bits.send((DYN_TREES << 1) + eof_bit, 3);
            self.send_all_trees(l_max + 1, d_max + 1, max_blindex + 1);
            self.compress_block(false);
        }
        self.init_block();
        if eof {
            self.bits.windup();
        }
        self.bits.hand_on();
    }

    fn send_all_trees(&mut self, lcodes: usize, dcodes: usize, blcodes: usize) {
        self.bits.send(lcodes as u32 - 257, 5);
        self.bits.send(dcodes as u32 - 1, 5);
        self.bits.send(blcodes as u32 - 4, 4);
        for &o in &BL_ORDER[..blcodes] {
            self.bits.send(u32::from(self.bl_tree[o].dl), 3);
        }
        send_tree(&mut self.bits, &self.dyn_ltree, lcodes - 1, &self.bl_tree);
        send_tree(&mut self.bits, &self.dyn_dtree, dcodes - 1, &self.bl_tree);
    }

    fn compress_block(&mut self, fixed: bool) {
        let t = self.t;
        let (ltree, dtree): (&[Node], &[Node]) =
            if fixed { (&t.static_ltree, &t.static_dtree) } else { (&self.dyn_ltree, &self.dyn_dtree) };
        let bits = &mut self.bits;
        for &(dist, lc) in &self.syms {
            if dist == 0 {
                let n = ltree[lc as usize];
                bits.send(u32::from(n.fc), u32::from(n.dl));
            } else {
                let code = t.length_code[lc as usize] as usize;
                let n = ltree[code + LITERALS + 1];
                bits.send(u32::from(n.fc), u32::from(n.dl));
                let extra = EXTRA_LBITS[code];
                if extra != 0 {
                    bits.send(u32::from(lc) - t.base_length[code], extra);
                }
                let d = u32::from(dist) - 1;
                let code = t.d_code(d);
                let n = dtree[code];
                bits.send(u32::from(n.fc), u32::from(n.dl));
                let extra = EXTRA_DBITS[code];
                if extra != 0 {
                    bits.send(d - t.base_dist[code], extra);
                }
            }
        }
        let n = ltree[END_BLOCK];
        bits.send(u32::from(n.fc), u32::from(n.dl));
    }

    fn run(&mut self) {
        if self.level <= 3 {
            self.deflate_fast();
        } else {
            self.deflate_lazy();
        }
    }
}

/// The levels zip deflates at (`-1` to `-9`; `-0` stores).
pub const LEVELS: std::ops::RangeInclusive<u8> = 1..=9;

/// The deflate stream `zip -level` writes for a member with content `data`
/// (see the module's introduction); empty for a level outside 1 to 9.
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
/// every piece accepted; false for a level outside 1 to 9.
pub fn run(data: &[u8], level: u8, sink: impl FnMut(&[u8]) -> bool) -> bool {
    run_checked(data, level, sink, None)
}

fn run_checked<'a>(data: &'a [u8], level: u8, sink: impl FnMut(&[u8]) -> bool, check: Option<FirstBlock<'a>>) -> bool {
    if !LEVELS.contains(&level) {
        return false;
    }
    let mut z = Zip::new(data, u32::from(level), FnSink(sink));
    z.check = check;
    z.run();
    !z.bits.failed && !z.refuted
}

/// Whether `zip -level` makes exactly `expected` of `data`. Stops at the
/// first differing output byte, and before that, when `expected` begins
/// with a coded block, at the first symbol of that block that differs from
/// the deflater's (so a wrong level or deflater costs the work up to that
/// symbol rather than zip's whole first block, up to 32767 symbols).
pub fn matches(data: &[u8], level: u8, expected: &[u8]) -> bool {
    makes_exactly(expected, |sink, check| run_checked(data, level, sink, check))
}

/// Whether the deflater that `run` drives (handing its output to the sink
/// it is given, with the check of `expected`'s first block) makes exactly
/// `expected`: false at the first output byte that differs, at the first
/// symbol of that block that differs, and when `expected` is not a deflate
/// stream at all (no data is one; the ported deflaters' never are).
pub(crate) fn makes_exactly<'a>(
    expected: &'a [u8],
    run: impl FnOnce(&mut dyn FnMut(&[u8]) -> bool, Option<FirstBlock<'a>>) -> bool,
) -> bool {
    let check = match FirstBlock::new(expected) {
        Ok(c) => c,
        Err(Unreadable) => return false,
    };
    let mut at = 0usize;
    let ok = run(
        &mut |c: &[u8]| {
            let same = expected.len() - at >= c.len() && expected[at..at + c.len()] == *c;
            at += c.len();
            same
        },
        check,
    );
    ok && at == expected.len()
}

// ---------------------------------------------------------------- refutation

/// The expected stream's first block could not be read.
pub(crate) struct Unreadable;

/// A canonical Huffman code as puff.c decodes it: codes per length, and the
/// symbols in code order.
struct Code {
    count: [u16; 16],
    symbol: Vec<u16>,
}

impl Code {
    fn new(lengths: &[u8]) -> Code {
        let mut count = [0u16; 16];
        for &l in lengths {
            count[l as usize] += 1;
        }
        let mut offs = [0u16; 16];
        for len in 1..15 {
            offs[len + 1] = offs[len] + count[len];
        }
        let mut symbol = vec![0u16; lengths.len()];
        for (s, &l) in lengths.iter().enumerate() {
            if l != 0 {
                symbol[offs[l as usize] as usize] = s as u16;
                offs[l as usize] += 1;
            }
        }
        count[0] = 0;
        Code { count, symbol }
    }
}

/// One of the expected block's symbols.
#[derive(PartialEq)]
enum Sym {
    Literal(u32),
    /// (distance, length - 3), as `ct_tally` takes them.
    Match(u32, u32),
    End,
}

/// Reads the first block of an expected deflate stream symbol by symbol.
pub(crate) struct FirstBlock<'a> {
    r: BitReader<'a>,
    lit: Code,
    dist: Code,
}

/// A deflate stream's bits, least significant first.
struct BitReader<'a> {
    data: &'a [u8],
    bit: usize,
}

impl BitReader<'_> {
    fn bits(&mut self, n: u32) -> Result<u32, Unreadable> {
        let mut v = 0u32;
        for i in 0..n {
            let byte = *self.data.get(self.bit >> 3).ok_or(Unreadable)?;
            v |= u32::from((byte >> (self.bit & 7)) & 1) << i;
            self.bit += 1;
        }
        Ok(v)
    }

    /// puff.c's `decode`: one symbol of code `c`, a bit at a time.
    fn decode(&mut self, c: &Code) -> Result<u16, Unreadable> {
        let (mut code, mut first, mut index) = (0i32, 0i32, 0i32);
        for len in 1..16 {
            code |= self.bits(1)? as i32;
            let count = i32::from(c.count[len]);
            if code - count < first {
                return c.symbol.get((index + code - first) as usize).copied().ok_or(Unreadable);
            }
            index += count;
            first = (first + count) << 1;
            code <<= 1;
        }
        Err(Unreadable)
    }
}

const LEN_BASE: [u16; 29] =
    [3, 4, 5, 6, 7, 8, 9, 10, 11, 13, 15, 17, 19, 23, 27, 31, 35, 43, 51, 59, 67, 83, 99, 115, 131, 163, 195, 227, 258];
const DIST_BASE: [u16; 30] = [
    1, 2, 3, 4, 5, 7, 9, 13, 17, 25, 33, 49, 65, 97, 129, 193, 257, 385, 513, 769, 1025, 1537, 2049, 3073, 4097, 6145, 8193, 12289, 16385,
    24577,
];

impl<'a> FirstBlock<'a> {
    /// `Ok(None)` when the first block is stored (no symbols to compare).
    pub(crate) fn new(data: &'a [u8]) -> Result<Option<Self>, Unreadable> {
        let mut r = BitReader { data, bit: 0 };
        r.bits(1)?;
        let (lit, dist) = match r.bits(2)? {
            0 => return Ok(None),
            1 => {
                let mut l = [8u8; 288];
                l[144..256].fill(9);
                l[256..280].fill(7);
                (Code::new(&l), Code::new(&[5; 30]))
            }
            2 => {
                let nlen = r.bits(5)? as usize + 257;
                let ndist = r.bits(5)? as usize + 1;
                let ncode = r.bits(4)? as usize + 4;
                let mut cl = [0u8; 19];
                for &o in &BL_ORDER[..ncode] {
                    cl[o] = r.bits(3)? as u8;
                }
                let clc = Code::new(&cl);
                let mut lengths = vec![0u8; nlen + ndist];
                let mut i = 0;
                while i < nlen + ndist {
                    let sym = r.decode(&clc)?;
                    let (value, n) = match sym {
                        0..=15 => (sym as u8, 1),
                        16 => (*lengths[..i].last().ok_or(Unreadable)?, 3 + r.bits(2)? as usize),
                        17 => (0, 3 + r.bits(3)? as usize),
                        _ => (0, 11 + r.bits(7)? as usize),
                    };
                    if i + n > nlen + ndist {
                        return Err(Unreadable);
                    }
                    lengths[i..i + n].fill(value);
                    i += n;
                }
                (Code::new(&lengths[..nlen]), Code::new(&lengths[nlen..]))
            }
            _ => return Err(Unreadable),
        };
        Ok(Some(FirstBlock { r, lit, dist }))
    }

    fn next(&mut self) -> Result<Sym, Unreadable> {
        let s = self.r.decode(&self.lit)?;
        Ok(match s {
            0..=255 => Sym::Literal(u32::from(s)),
            256 => Sym::End,
            257..=285 => {
                let i = usize::from(s - 257);
                let len = u32::from(LEN_BASE[i]) + self.r.bits(EXTRA_LBITS[i])?;
                let d = usize::from(self.r.decode(&self.dist)?);
                if d >= 30 {
                    return Err(Unreadable);
                }
                let dist = u32::from(DIST_BASE[d]) + self.r.bits(EXTRA_DBITS[d])?;
                Sym::Match(dist, len - 3)
            }
            _ => return Err(Unreadable),
        })
    }

    /// Whether the block's next symbol is `ct_tally(dist, lc)`'s.
    pub(crate) fn next_is(&mut self, dist: u32, lc: u32) -> bool {
        let want = if dist == 0 { Sym::Literal(lc) } else { Sym::Match(dist, lc) };
        self.next().is_ok_and(|s| s == want)
    }

    /// Whether the block ends after the symbols read.
    pub(crate) fn ends_here(mut self) -> bool {
        self.next().is_ok_and(|s| s == Sym::End)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: u32) -> Vec<u8> {
        (0..n).flat_map(|i| format!("<w:p><w:r><w:t>word {} {}</w:t></w:r></w:p>", i % 977, i % 13).into_bytes()).collect()
    }

    #[test]
    fn round_trips_at_every_level() {
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
            for level in LEVELS {
                let c = deflate(input, level);
                assert_eq!(crate::deflate::inflate(&c, 1 << 30).unwrap(), *input, "level {level}, {} bytes", input.len());
                assert!(matches(input, level, &c));
                if !c.is_empty() {
                    assert!(!matches(input, level, &c[..c.len() - 1]));
                }
            }
        }
        assert!(deflate(b"abc", 0).is_empty() && deflate(b"abc", 10).is_empty());
    }

    /// A level whose first block's symbols differ is refuted by them; one
    /// whose bytes are another level's is not.
    #[test]
    fn the_other_levels_are_refuted() {
        let t = text(30_000);
        let outs: Vec<Vec<u8>> = LEVELS.map(|l| deflate(&t, l)).collect();
        for (i, a) in outs.iter().enumerate() {
            for (j, b) in outs.iter().enumerate() {
                assert_eq!(matches(&t, i as u8 + 1, b), a == b, "level {} against level {}'s bytes", i + 1, j + 1);
            }
        }
        let mut wrong = outs[5].clone();
        wrong[20] ^= 0x10;
        assert!(!matches(&t, 6, &wrong));
        assert!(!matches(&t, 6, &[]));
        assert!(!matches(&t, 6, &[0xff; 100]));
    }
}
