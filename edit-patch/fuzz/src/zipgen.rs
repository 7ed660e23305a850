//! A small ZIP writer whose every choice comes from the fuzzer.
//!
//! [`ArchiveSpec`] (derived with `arbitrary`) describes an archive: members
//! with names, contents (raw bytes, repeated units, generated XML), methods
//! (stored, zlib deflate at any level and window, miniz_oxide deflate, method
//! 8 over bytes that are not deflate, other method numbers), timestamps,
//! extra fields, data descriptors in their four forms; a preamble, an archive
//! comment, trailing bytes, central records in reverse order, ZIP64 end
//! records. [`Mutation`]s turn a base archive into a new version the way an
//! editor would (edit, replace, add, remove, rename, touch, recompress,
//! reorder) or the way a damaged file would (poke and truncate).
//!
//! Sizes are capped ([`MAX_CONTENT`], [`MAX_MEMBERS`]) to keep executions fast.

use arbitrary::{Arbitrary, Result, Unstructured};
use std::io::Write;

/// Largest content of one member.
pub const MAX_CONTENT: usize = 64 << 10;
/// Most members in an archive (after mutations).
pub const MAX_MEMBERS: usize = 12;

/// At most `N` arbitrary bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmallBytes<const N: usize>(pub Vec<u8>);

impl<'a, const N: usize> Arbitrary<'a> for SmallBytes<N> {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let len = u.arbitrary_len::<u8>()?.min(N);
        Ok(SmallBytes(u.bytes(len)?.to_vec()))
    }
}

/// At most `N` arbitrary items.
#[derive(Debug, Clone, Default)]
pub struct SmallVec<T, const N: usize>(pub Vec<T>);

impl<'a, T: Arbitrary<'a>, const N: usize> Arbitrary<'a> for SmallVec<T, N> {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let mut v = Vec::new();
        for _ in 0..N {
            if u.is_empty() || !u.arbitrary::<bool>()? {
                break;
            }
            v.push(u.arbitrary()?);
        }
        Ok(SmallVec(v))
    }
}

const KNOWN_NAMES: [&str; 16] = [
    "mimetype",
    "[Content_Types].xml",
    "_rels/.rels",
    "word/document.xml",
    "word/styles.xml",
    "xl/worksheets/sheet1.xml",
    "xl/sharedStrings.xml",
    "ppt/slides/slide1.xml",
    "content.xml",
    "styles.xml",
    "META-INF/manifest.xml",
    "Pictures/image1.png",
    "docProps/app.xml",
    "dir/",
    "",
    "a\\b.xml",
];

#[derive(Arbitrary, Debug, Clone)]
pub enum Name {
    Known(u8),
    Raw(SmallBytes<40>),
}

impl Name {
    pub fn render(&self) -> Vec<u8> {
        match self {
            Name::Known(i) => KNOWN_NAMES[*i as usize % KNOWN_NAMES.len()].as_bytes().to_vec(),
            Name::Raw(b) => b.0.clone(),
        }
    }
}

/// What a member holds, before compression.
#[derive(Arbitrary, Debug, Clone)]
pub enum Content {
    Empty,
    Bytes(SmallBytes<2048>),
    /// `unit` repeated `times` times: long, very compressible content.
    Repeat { unit: SmallBytes<48>, times: u16 },
    /// Spreadsheet-like XML, generated from `seed`: what real parts look like.
    Xml { seed: u32, cells: u16 },
}

impl Content {
    pub fn render(&self, cap: usize) -> Vec<u8> {
        let mut v = match self {
            Content::Empty => Vec::new(),
            Content::Bytes(b) => b.0.clone(),
            Content::Repeat { unit, times } => {
                if unit.0.is_empty() {
                    Vec::new()
                } else {
                    let n = (*times as usize).min(cap / unit.0.len() + 1);
                    unit.0.repeat(n)
                }
            }
            Content::Xml { seed, cells } => xml(*seed, *cells as usize, cap),
        };
        v.truncate(cap);
        v
    }
}

fn xml(seed: u32, cells: usize, cap: usize) -> Vec<u8> {
    let mut x = u64::from(seed) | 1;
    let mut next = move || {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
        (x >> 33) as u32
    };
    let mut s = Vec::with_capacity(cap.min(cells * 40 + 128));
    s.extend_from_slice(b"<?xml version=\"1.0\" encoding=\"UTF-8\" standalone=\"yes\"?>\r\n<worksheet xmlns=\"http://schemas.openxmlformats.org/spreadsheetml/2006/main\"><sheetData>");
    let mut row = 0;
    for i in 0..cells {
        if s.len() >= cap {
            break;
        }
        if i % 8 == 0 {
            if row > 0 {
                s.extend_from_slice(b"</row>");
            }
            row += 1;
            let _ = write!(s, "<row r=\"{row}\" spans=\"1:8\">");
        }
        let col = (b'A' + (i % 8) as u8) as char;
        let r = next();
        match r % 4 {
            0 => {
                let _ = write!(s, "<c r=\"{col}{row}\" t=\"s\"><v>{}</v></c>", r % 97);
            }
            1 => {
                let _ = write!(s, "<c r=\"{col}{row}\" s=\"{}\"><v>{}.{}</v></c>", r % 5, r % 10_000, r % 100);
            }
            2 => {
                let _ = write!(s, "<c r=\"{col}{row}\"><f>SUM(A1:{col}{row})</f><v>{}</v></c>", r % 1000);
            }
            _ => {
                let _ = write!(s, "<c r=\"{col}{row}\"/>");
            }
        }
    }
    s.extend_from_slice(b"</row></sheetData></worksheet>");
    s
}

/// How a member's data is made from its content.
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Stored,
    /// Raw deflate by the reference zlib (level 0-9, window 2^9 to 2^15).
    Zlib { level: u8, window_bits: u8 },
    /// Raw deflate by miniz_oxide (level 0-10): streams zlib does not reproduce.
    Miniz { level: u8 },
    /// Method 8 over the content as is (usually not a valid deflate stream).
    DeflateGarbage,
    /// Another method number over the content as is (bzip2, LZMA, AES...).
    Other(u16),
}

impl Method {
    /// (method number, data)
    pub fn apply(self, content: &[u8]) -> (u16, Vec<u8>) {
        match self {
            Method::Stored => (0, content.to_vec()),
            Method::Zlib { level, window_bits } => {
                let bits = 9 + window_bits % 7;
                let mut c = flate2::Compress::new_with_window_bits(flate2::Compression::new(u32::from(level % 10)), false, bits);
                let mut out = Vec::with_capacity(content.len() + 64);
                loop {
                    let before_in = c.total_in() as usize;
                    out.reserve(content.len() / 2 + 1024);
                    let st = c.compress_vec(&content[before_in..], &mut out, flate2::FlushCompress::Finish).expect("zlib deflate");
                    if st == flate2::Status::StreamEnd {
                        break;
                    }
                }
                (8, out)
            }
            Method::Miniz { level } => (8, miniz_oxide::deflate::compress_to_vec(content, level % 11)),
            Method::DeflateGarbage => (8, content.to_vec()),
            Method::Other(m) => {
                // Keep 0 and 8 for the variants above.
                let m = if m == 0 || m == 8 { 12 } else { m };
                (m, content.to_vec())
            }
        }
    }
}

/// Data descriptor after a member's data (general-purpose flag bit 3).
#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Descriptor {
    None,
    /// crc, csize, usize as u32 (12 bytes).
    Plain32,
    /// signature + the above (16 bytes).
    Signed32,
    /// crc, csize, usize as u64 (20 bytes).
    Plain64,
    /// signature + the above (24 bytes).
    Signed64,
}

#[derive(Arbitrary, Debug, Clone)]
pub struct MemberSpec {
    pub name: Name,
    pub content: Content,
    pub method: Method,
    /// DOS time (low 16 bits) and date (high 16 bits).
    pub time: u32,
    pub descriptor: Descriptor,
    pub extra: SmallBytes<24>,
    /// Whether the central record repeats the local extra field.
    pub central_extra: bool,
    /// Flag bits other than bit 3 (e.g. 0x0800 UTF-8 names, 0x0002/0x0004 deflate level hints).
    pub flags: u16,
    pub external_attr: u32,
}

#[derive(Arbitrary, Debug, Clone, Copy, PartialEq, Eq)]
pub enum Zip64 {
    No,
    /// ZIP64 end record and locator present, but the end record's fields are not saturated.
    Records,
    /// ZIP64 end record and locator, end record fields saturated (0xffff / 0xffffffff).
    Forced,
}

#[derive(Arbitrary, Debug, Clone)]
pub struct ArchiveSpec {
    pub members: SmallVec<MemberSpec, 8>,
    pub preamble: SmallBytes<64>,
    pub comment: SmallBytes<64>,
    pub trailing: SmallBytes<32>,
    pub reverse_central: bool,
    pub zip64: Zip64,
    pub made_by: u16,
}

/// A member with its content materialised (what mutations edit).
#[derive(Debug, Clone)]
pub struct Member {
    pub name: Vec<u8>,
    pub content: Vec<u8>,
    pub method: Method,
    pub time: u32,
    pub descriptor: Descriptor,
    pub extra: Vec<u8>,
    pub central_extra: bool,
    pub flags: u16,
    pub external_attr: u32,
}

impl MemberSpec {
    pub fn materialise(&self) -> Member {
        Member {
            name: self.name.render(),
            content: self.content.render(MAX_CONTENT),
            method: self.method,
            time: self.time,
            descriptor: self.descriptor,
            extra: self.extra.0.clone(),
            central_extra: self.central_extra,
            flags: self.flags & !0x0009, // no encryption bit, no descriptor bit (set from `descriptor`)
            external_attr: self.external_attr,
        }
    }
}

#[derive(Debug, Clone)]
pub struct Archive {
    pub members: Vec<Member>,
    pub preamble: Vec<u8>,
    pub comment: Vec<u8>,
    pub trailing: Vec<u8>,
    pub reverse_central: bool,
    pub zip64: Zip64,
    pub made_by: u16,
}

impl ArchiveSpec {
    pub fn materialise(&self) -> Archive {
        Archive {
            members: self.members.0.iter().map(MemberSpec::materialise).collect(),
            preamble: self.preamble.0.clone(),
            comment: self.comment.0.clone(),
            trailing: self.trailing.0.clone(),
            reverse_central: self.reverse_central,
            zip64: self.zip64,
            made_by: self.made_by,
        }
    }
}

/// A built archive and the number of ZIP signatures the writer put in it.
#[derive(Debug, Clone)]
pub struct Built {
    pub bytes: Vec<u8>,
    pub signatures: usize,
    /// (name, local header offset, data offset, data length) per member, in file order.
    pub members: Vec<(Vec<u8>, u64, u64, u64)>,
}

fn p16(v: &mut Vec<u8>, x: u16) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn p32(v: &mut Vec<u8>, x: u32) {
    v.extend_from_slice(&x.to_le_bytes());
}
fn p64(v: &mut Vec<u8>, x: u64) {
    v.extend_from_slice(&x.to_le_bytes());
}

impl Archive {
    pub fn build(&self) -> Built {
        let mut out = self.preamble.clone();
        let mut centrals: Vec<Vec<u8>> = Vec::new();
        let mut members = Vec::new();
        let mut sigs = 0;
        for m in &self.members {
            let (method, data) = m.method.apply(&m.content);
            let crc = crc32fast::hash(&m.content);
            let (csize, usize_) = (data.len() as u32, m.content.len() as u32);
            let deferred = m.descriptor != Descriptor::None;
            let flags = m.flags | if deferred { 0x0008 } else { 0 };
            let off = out.len() as u32;
            let name_len = m.name.len().min(0xffff);
            let extra_len = m.extra.len().min(0xffff);
            // local header
            p32(&mut out, 0x0403_4b50);
            p16(&mut out, 20);
            p16(&mut out, flags);
            p16(&mut out, method);
            p32(&mut out, m.time);
            if deferred {
                p32(&mut out, 0);
                p32(&mut out, 0);
                p32(&mut out, 0);
            } else {
                p32(&mut out, crc);
                p32(&mut out, csize);
                p32(&mut out, usize_);
            }
            p16(&mut out, name_len as u16);
            p16(&mut out, extra_len as u16);
            out.extend_from_slice(&m.name[..name_len]);
            out.extend_from_slice(&m.extra[..extra_len]);
            sigs += 1;
            let data_off = out.len() as u64;
            out.extend_from_slice(&data);
            members.push((m.name[..name_len].to_vec(), u64::from(off), data_off, data.len() as u64));
            match m.descriptor {
                Descriptor::None => {}
                Descriptor::Plain32 | Descriptor::Signed32 => {
                    if m.descriptor == Descriptor::Signed32 {
                        p32(&mut out, 0x0807_4b50);
                        sigs += 1;
                    }
                    p32(&mut out, crc);
                    p32(&mut out, csize);
                    p32(&mut out, usize_);
                }
                Descriptor::Plain64 | Descriptor::Signed64 => {
                    if m.descriptor == Descriptor::Signed64 {
                        p32(&mut out, 0x0807_4b50);
                        sigs += 1;
                    }
                    p32(&mut out, crc);
                    p64(&mut out, u64::from(csize));
                    p64(&mut out, u64::from(usize_));
                }
            }
            // central record
            let cextra: &[u8] = if m.central_extra { &m.extra[..extra_len] } else { &[] };
            let mut c = Vec::with_capacity(46 + name_len + cextra.len());
            p32(&mut c, 0x0201_4b50);
            p16(&mut c, self.made_by);
            p16(&mut c, 20);
            p16(&mut c, flags);
            p16(&mut c, method);
            p32(&mut c, m.time);
            p32(&mut c, crc);
            p32(&mut c, csize);
            p32(&mut c, usize_);
            p16(&mut c, name_len as u16);
            p16(&mut c, cextra.len() as u16);
            p16(&mut c, 0); // comment
            p16(&mut c, 0); // disk
            p16(&mut c, 0); // internal attributes
            p32(&mut c, m.external_attr);
            p32(&mut c, off);
            c.extend_from_slice(&m.name[..name_len]);
            c.extend_from_slice(cextra);
            centrals.push(c);
            sigs += 1;
        }
        if self.reverse_central {
            centrals.reverse();
        }
        let cd_offset = out.len() as u64;
        for c in &centrals {
            out.extend_from_slice(c);
        }
        let cd_size = out.len() as u64 - cd_offset;
        let count = centrals.len() as u64;
        if self.zip64 != Zip64::No {
            let rec = out.len() as u64;
            p32(&mut out, 0x0606_4b50);
            p64(&mut out, 44);
            p16(&mut out, 45);
            p16(&mut out, 45);
            p32(&mut out, 0);
            p32(&mut out, 0);
            p64(&mut out, count);
            p64(&mut out, count);
            p64(&mut out, cd_size);
            p64(&mut out, cd_offset);
            p32(&mut out, 0x0706_4b50);
            p32(&mut out, 0);
            p64(&mut out, rec);
            p32(&mut out, 1);
            sigs += 2;
        }
        let forced = self.zip64 == Zip64::Forced;
        let comment_len = self.comment.len().min(0xffff);
        p32(&mut out, 0x0605_4b50);
        p16(&mut out, 0);
        p16(&mut out, 0);
        p16(&mut out, if forced { 0xffff } else { count as u16 });
        p16(&mut out, if forced { 0xffff } else { count as u16 });
        p32(&mut out, if forced { 0xffff_ffff } else { cd_size as u32 });
        p32(&mut out, if forced { 0xffff_ffff } else { cd_offset as u32 });
        p16(&mut out, comment_len as u16);
        out.extend_from_slice(&self.comment[..comment_len]);
        sigs += 1;
        out.extend_from_slice(&self.trailing);
        Built { bytes: out, signatures: sigs, members }
    }

    pub fn apply(&mut self, m: &Mutation) {
        let n = self.members.len();
        let pick = |i: u8| if n == 0 { None } else { Some(i as usize % n) };
        match m {
            Mutation::Edit { member, at, delete, insert } => {
                if let Some(i) = pick(*member) {
                    let c = &mut self.members[i].content;
                    let at = (*at as usize).min(c.len());
                    let end = (at + *delete as usize).min(c.len());
                    c.splice(at..end, insert.0.iter().copied());
                    c.truncate(MAX_CONTENT);
                }
            }
            Mutation::Replace { member, content } => {
                if let Some(i) = pick(*member) {
                    self.members[i].content = content.render(MAX_CONTENT);
                }
            }
            Mutation::Add { at, member } => {
                if n < MAX_MEMBERS {
                    self.members.insert(*at as usize % (n + 1), member.materialise());
                }
            }
            Mutation::Remove { member } => {
                if let Some(i) = pick(*member) {
                    self.members.remove(i);
                }
            }
            Mutation::Duplicate { member } => {
                if let Some(i) = pick(*member) {
                    if n < MAX_MEMBERS {
                        let m = self.members[i].clone();
                        self.members.push(m);
                    }
                }
            }
            Mutation::Rename { member, name } => {
                if let Some(i) = pick(*member) {
                    self.members[i].name = name.render();
                }
            }
            Mutation::Touch { member, time } => {
                if let Some(i) = pick(*member) {
                    self.members[i].time = *time;
                }
            }
            Mutation::TouchAll { time } => {
                for m in &mut self.members {
                    m.time = *time;
                }
            }
            Mutation::Recompress { member, method } => {
                if let Some(i) = pick(*member) {
                    self.members[i].method = *method;
                }
            }
            Mutation::SetDescriptor { member, descriptor } => {
                if let Some(i) = pick(*member) {
                    self.members[i].descriptor = *descriptor;
                }
            }
            Mutation::Swap { a, b } => {
                if let (Some(a), Some(b)) = (pick(*a), pick(*b)) {
                    self.members.swap(a, b);
                }
            }
            Mutation::Comment(c) => self.comment = c.0.clone(),
            Mutation::Preamble(p) => self.preamble = p.0.clone(),
            Mutation::Trailing(t) => self.trailing = t.0.clone(),
            Mutation::Zip64(z) => self.zip64 = *z,
            Mutation::ReverseCentral => self.reverse_central = !self.reverse_central,
            Mutation::Poke { .. } | Mutation::Truncate { .. } => {}
        }
    }
}

/// One change from the base archive to the new one.
#[derive(Arbitrary, Debug, Clone)]
pub enum Mutation {
    Edit { member: u8, at: u16, delete: u8, insert: SmallBytes<32> },
    Replace { member: u8, content: Content },
    Add { at: u8, member: MemberSpec },
    Remove { member: u8 },
    Duplicate { member: u8 },
    Rename { member: u8, name: Name },
    Touch { member: u8, time: u32 },
    TouchAll { time: u32 },
    Recompress { member: u8, method: Method },
    SetDescriptor { member: u8, descriptor: Descriptor },
    Swap { a: u8, b: u8 },
    Comment(SmallBytes<64>),
    Preamble(SmallBytes<64>),
    Trailing(SmallBytes<32>),
    Zip64(Zip64),
    ReverseCentral,
    /// Overwrite one byte of the built new file (damage).
    Poke { at: u32, value: u8 },
    /// Cut the built new file (a truncated download).
    Truncate { keep: u32 },
}

/// A base archive and the mutations that make the new version.
#[derive(Arbitrary, Debug, Clone)]
pub struct ZipCase {
    pub base: ArchiveSpec,
    pub mutations: SmallVec<Mutation, 8>,
    /// Damage applied to the base after building (so bases can be odd too).
    pub base_damage: SmallVec<(u32, u8), 2>,
}

/// The built pair plus whether both are clean (no damage, no stray signatures).
#[derive(Debug)]
pub struct Pair {
    pub base: Built,
    pub new: Built,
    pub damaged: bool,
}

impl ZipCase {
    pub fn build(&self) -> Pair {
        let a = self.base.materialise();
        let mut base = a.build();
        let mut damaged = false;
        for &(at, value) in &self.base_damage.0 {
            if !base.bytes.is_empty() {
                let i = at as usize % base.bytes.len();
                damaged |= base.bytes[i] != value;
                base.bytes[i] = value;
            }
        }
        let mut b = a;
        for m in &self.mutations.0 {
            b.apply(m);
        }
        let mut new = b.build();
        for m in &self.mutations.0 {
            match *m {
                Mutation::Poke { at, value } if !new.bytes.is_empty() => {
                    let i = at as usize % new.bytes.len();
                    damaged |= new.bytes[i] != value;
                    new.bytes[i] = value;
                }
                Mutation::Truncate { keep } => {
                    let keep = keep as usize;
                    damaged |= keep < new.bytes.len();
                    new.bytes.truncate(keep);
                }
                _ => {}
            }
        }
        Pair { base, new, damaged }
    }
}

/// How many ZIP signatures ("PK" followed by 1 2, 3 4, 5 6, 6 6, 6 7 or 7 8) occur in `b`.
pub fn count_signatures(b: &[u8]) -> usize {
    b.windows(4).filter(|w| w[0] == b'P' && w[1] == b'K' && matches!((w[2], w[3]), (1, 2) | (3, 4) | (5, 6) | (6, 6) | (6, 7) | (7, 8))).count()
}

/// Edits of a flat byte string (for the raw-bytes and content-delta cases).
#[derive(Arbitrary, Debug, Clone)]
pub enum Edit {
    Insert { at: u32, bytes: SmallBytes<64> },
    Delete { at: u32, len: u16 },
    Overwrite { at: u32, bytes: SmallBytes<16> },
    /// Move `len` bytes from `from` to `to` (a moved block).
    Move { from: u32, len: u16, to: u32 },
    /// Append `unit` `times` times (long compressible tails).
    AppendRepeat { unit: SmallBytes<16>, times: u32 },
    Truncate { keep: u32 },
}

/// Applies `edits` to `base`, keeping the result within `cap` bytes.
pub fn apply_edits(base: &[u8], edits: &[Edit], cap: usize) -> Vec<u8> {
    let mut v = base.to_vec();
    for e in edits {
        let len = v.len();
        let pos = |at: u32| if len == 0 { 0 } else { at as usize % (len + 1) };
        match e {
            Edit::Insert { at, bytes } => {
                let at = pos(*at);
                v.splice(at..at, bytes.0.iter().copied());
            }
            Edit::Delete { at, len: n } => {
                let at = pos(*at);
                let end = (at + *n as usize).min(v.len());
                v.drain(at..end);
            }
            Edit::Overwrite { at, bytes } => {
                let at = pos(*at);
                for (i, &b) in bytes.0.iter().enumerate() {
                    match v.get_mut(at + i) {
                        Some(x) => *x = b,
                        None => v.push(b),
                    }
                }
            }
            Edit::Move { from, len: n, to } => {
                let from = pos(*from);
                let end = (from + *n as usize).min(v.len());
                let block: Vec<u8> = v.drain(from..end).collect();
                let to = if v.is_empty() { 0 } else { *to as usize % (v.len() + 1) };
                v.splice(to..to, block);
            }
            Edit::AppendRepeat { unit, times } => {
                if !unit.0.is_empty() {
                    let n = (*times as usize).min(cap.saturating_sub(v.len()) / unit.0.len() + 1);
                    for _ in 0..n {
                        v.extend_from_slice(&unit.0);
                    }
                }
            }
            Edit::Truncate { keep } => v.truncate(*keep as usize),
        }
        v.truncate(cap);
    }
    v
}
