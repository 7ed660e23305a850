//! PNG images inside documents (spec §4.2.1).
//!
//! OpenDocument files carry `Thumbnails/thumbnail.png`, redrawn on every
//! save; its pixels change only where the first page changed, but its zlib
//! stream changes from there to the end. So a stored PNG member is patched in
//! *canonical form*: the bytes before the first IDAT chunk, the inflated
//! image data, and the bytes after the last IDAT chunk. The PNG recipe
//! recompresses the image data (with an inner deflate recipe), wraps it in
//! its zlib header and Adler-32, and cuts it into IDAT chunks of the
//! original size with fresh CRCs.
//!
//! Only PNGs this rebuild reproduces exactly are taken: consecutive IDAT
//! chunks of one size (the last may be shorter), valid CRCs, a plain zlib
//! header, a stream that ends exactly with its Adler-32. Format version 2
//! also takes a first chunk of another size (recipe 11, edit-patch-v2.md
//! §3.7): Microsoft Office's writer puts 65,445 bytes in the first IDAT
//! chunk and 65,524 in the others.

use crate::deflate;
use crate::wire::Writer;

const SIGNATURE: [u8; 8] = [0x89, b'P', b'N', b'G', b'\r', b'\n', 0x1a, b'\n'];

/// How a canonical PNG maps back to its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PngFrame {
    /// Bytes before the first IDAT chunk (kept verbatim at the front of the content).
    pub head_len: u64,
    /// Bytes after the last IDAT chunk (kept verbatim at the back).
    pub tail_len: u64,
    /// Data length of every IDAT chunk but the first and the last.
    pub chunk_size: u64,
    /// Data length of the first IDAT chunk (when there are two or more):
    /// `chunk_size` but in a PNG that only recipe 11 (version 2) rebuilds.
    pub first_chunk: u64,
    /// The zlib stream's two header bytes.
    pub zlib_header: [u8; 2],
}

impl PngFrame {
    /// Whether the first IDAT chunk has a size of its own (recipe 11, version 2).
    pub fn first_differs(&self) -> bool {
        self.first_chunk != self.chunk_size
    }

    /// How many IDAT chunks a zlib stream of `z_len` bytes is cut into.
    pub fn chunks_for(&self, z_len: u64) -> u64 {
        let first = self.first_chunk.max(1);
        if z_len <= first {
            1
        } else {
            1 + (z_len - first).div_ceil(self.chunk_size.max(1))
        }
    }
}

/// A PNG split into its canonical content and the deflate stream of its image data.
#[derive(Debug)]
pub struct Canonical {
    pub content: Vec<u8>,
    pub frame: PngFrame,
    /// The raw deflate stream (without zlib header and Adler-32).
    pub deflate: Vec<u8>,
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}

/// Adler-32 as zlib defines it.
pub fn adler32(data: &[u8]) -> u32 {
    let (mut a, mut b) = (1u32, 0u32);
    for chunk in data.chunks(5552) {
        for &x in chunk {
            a += u32::from(x);
            b += a;
        }
        a %= 65521;
        b %= 65521;
    }
    (b << 16) | a
}

fn chunk_crc(kind: &[u8], data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(kind);
    h.update(data);
    h.finalize()
}

/// Splits `data` into canonical form (v1 §4.2.1: IDAT chunks of one size),
/// or `None` if it is not a PNG this module rebuilds exactly. `max_out`
/// bounds the inflated image data. How a base member is read in content
/// mode 2, in either version.
pub fn canonicalize(data: &[u8], max_out: u64) -> Option<Canonical> {
    canonicalize_with(data, max_out, false)
}

/// [`canonicalize`], and with `first_may_differ` also a PNG whose first
/// IDAT chunk has a size of its own (a target member of version 2,
/// rebuilt by recipe 11; edit-patch-v2.md §3.7).
pub fn canonicalize_with(data: &[u8], max_out: u64, first_may_differ: bool) -> Option<Canonical> {
    if data.len() < 8 || data[..8] != SIGNATURE {
        return None;
    }
    let mut pos = 8;
    let mut idat: Vec<(usize, usize)> = Vec::new();
    let mut after_idat = None;
    while pos + 12 <= data.len() {
        let len = be32(data, pos) as usize;
        let kind = &data[pos + 4..pos + 8];
        let end = pos.checked_add(12)?.checked_add(len)?;
        if end > data.len() {
            return None;
        }
        if kind == b"IDAT" {
            if after_idat.is_some() || chunk_crc(kind, &data[pos + 8..pos + 8 + len]) != be32(data, pos + 8 + len) {
                return None;
            }
            idat.push((pos, len));
        } else if !idat.is_empty() && after_idat.is_none() {
            after_idat = Some(pos);
        }
        pos = end;
        if kind == b"IEND" {
            break;
        }
    }
    let (first, first_chunk) = *idat.first()?;
    let (last_pos, last_len) = *idat.last()?;
    // One size for every chunk but the last, which is no larger and not
    // empty; or, failing that, a first chunk of its own size before them.
    let fits = |rest: &[(usize, usize)], size: usize| {
        size > 0 && rest[..rest.len() - 1].iter().all(|&(_, l)| l == size) && last_len <= size && (rest.len() == 1 || last_len > 0)
    };
    let chunk_size = if fits(&idat, first_chunk) {
        first_chunk
    } else if first_may_differ && idat.len() > 1 && first_chunk > 0 && fits(&idat[1..], idat[1].1) && last_len > 0 {
        idat[1].1
    } else {
        return None;
    };
    let tail_start = last_pos + 12 + last_len;
    let mut z = Vec::with_capacity(idat.len() * chunk_size);
    for &(p, l) in &idat {
        z.extend_from_slice(&data[p + 8..p + 8 + l]);
    }
    if z.len() < 6 || z[0] & 0x0f != 8 || z[1] & 0x20 != 0 || (u16::from(z[0]) << 8 | u16::from(z[1])) % 31 != 0 {
        return None;
    }
    let image = deflate::inflate(&z[2..z.len() - 4], max_out).ok()?;
    if adler32(&image) != be32(&z, z.len() - 4) {
        return None;
    }
    let mut content = Vec::with_capacity(first + image.len() + data.len() - tail_start);
    content.extend_from_slice(&data[..first]);
    content.extend_from_slice(&image);
    content.extend_from_slice(&data[tail_start..]);
    let frame = PngFrame {
        head_len: first as u64,
        tail_len: (data.len() - tail_start) as u64,
        chunk_size: chunk_size as u64,
        first_chunk: first_chunk as u64,
        zlib_header: [z[0], z[1]],
    };
    Some(Canonical { content, frame, deflate: z[2..z.len() - 4].to_vec() })
}

/// The image data of canonical `content`, or `None` if the frame does not fit it.
pub fn image_of<'c>(content: &'c [u8], f: &PngFrame) -> Option<&'c [u8]> {
    let end = (content.len() as u64).checked_sub(f.tail_len)?;
    (f.head_len <= end).then(|| &content[f.head_len as usize..end as usize])
}

/// Rebuilds the PNG bytes from canonical `content` and the recompressed `deflate` stream.
pub fn rebuild(content: &[u8], f: &PngFrame, deflate_stream: &[u8]) -> Option<Vec<u8>> {
    let image = image_of(content, f)?;
    let mut z = Vec::with_capacity(deflate_stream.len() + 6);
    z.extend_from_slice(&f.zlib_header);
    z.extend_from_slice(deflate_stream);
    z.extend_from_slice(&adler32(image).to_be_bytes());
    let size = usize::try_from(f.chunk_size).ok().filter(|&s| s > 0)?;
    let first = usize::try_from(f.first_chunk).ok().filter(|&s| s > 0)?.min(z.len());
    let mut w = Writer::default();
    w.bytes(&content[..f.head_len as usize]);
    for chunk in std::iter::once(&z[..first]).chain(z[first..].chunks(size)) {
        w.bytes(&(chunk.len() as u32).to_be_bytes());
        w.bytes(b"IDAT");
        w.bytes(chunk);
        w.bytes(&chunk_crc(b"IDAT", chunk).to_be_bytes());
    }
    w.bytes(&content[content.len() - f.tail_len as usize..]);
    Some(w.buf)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn png(image: &[u8], chunk: usize) -> Vec<u8> {
        png_cut(image, &|_| chunk)
    }

    /// A PNG whose first IDAT chunk holds `first` bytes of the zlib stream, the others `chunk`.
    fn png_first(image: &[u8], first: usize, chunk: usize) -> Vec<u8> {
        png_cut(image, &|i| if i == 0 { first } else { chunk })
    }

    /// A PNG of `image` whose IDAT chunk `i` holds (at most) `size(i)` bytes of the zlib stream.
    fn png_cut(image: &[u8], size: &dyn Fn(usize) -> usize) -> Vec<u8> {
        let mut z = vec![0x78, 0xda];
        z.extend(deflate::deflate(image, deflate::ZlibParams { level: 9, mem_level: 8, window_bits: 15, strategy: 0 }).unwrap());
        z.extend(adler32(image).to_be_bytes());
        let mut chunks = Vec::new();
        let mut at = 0;
        while at < z.len() {
            let n = size(chunks.len()).min(z.len() - at);
            chunks.push(&z[at..at + n]);
            at += n;
        }
        let mut out = SIGNATURE.to_vec();
        let ihdr = [0u8; 13];
        for (kind, data) in std::iter::once((&b"IHDR"[..], &ihdr[..]))
            .chain(chunks.into_iter().map(|c| (&b"IDAT"[..], c)))
            .chain(std::iter::once((&b"IEND"[..], &[][..])))
        {
            out.extend((data.len() as u32).to_be_bytes());
            out.extend(kind);
            out.extend(data);
            out.extend(chunk_crc(kind, data).to_be_bytes());
        }
        out
    }

    #[test]
    fn canonical_round_trip() {
        let image: Vec<u8> = (0..50_000u32).map(|i| (i * 7 % 251) as u8).collect();
        let bytes = png(&image, 8192);
        let c = canonicalize(&bytes, 1 << 30).unwrap();
        assert_eq!(image_of(&c.content, &c.frame).unwrap(), &image[..]);
        assert_eq!(rebuild(&c.content, &c.frame, &c.deflate).unwrap(), bytes);
    }

    /// Microsoft Office's layout: a first chunk of its own size (recipe 11).
    #[test]
    fn first_chunk_of_its_own_size() {
        // Noise, so that the zlib stream (about as long) makes many chunks.
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let image: Vec<u8> = (0..60_000)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 56) as u8
            })
            .collect();
        for (first, chunk) in [(3000, 8192), (9000, 8192), (8192, 8192)] {
            let bytes = png_first(&image, first, chunk);
            assert_eq!(canonicalize(&bytes, 1 << 30).is_some(), first == chunk, "version 1 takes one size only");
            let c = canonicalize_with(&bytes, 1 << 30, true).unwrap();
            assert_eq!((c.frame.first_chunk, c.frame.chunk_size), (first as u64, chunk as u64));
            assert_eq!(c.frame.first_differs(), first != chunk);
            assert_eq!(image_of(&c.content, &c.frame).unwrap(), &image[..]);
            assert_eq!(rebuild(&c.content, &c.frame, &c.deflate).unwrap(), bytes);
            let idat = bytes.windows(4).filter(|w| *w == b"IDAT").count() as u64;
            assert_eq!(c.frame.chunks_for(c.deflate.len() as u64 + 6), idat);
        }
        // Two chunks, the second the larger: its size is the chunk size.
        let bytes = png_first(&image, 100, 1 << 20);
        let c = canonicalize_with(&bytes, 1 << 30, true).unwrap();
        assert_eq!(c.frame.first_chunk, 100);
        assert_eq!(rebuild(&c.content, &c.frame, &c.deflate).unwrap(), bytes);
        // Chunks of three sizes before the last are not taken.
        let three = png_cut(&image, &|i| [3000, 5000, 8192][i.min(2)]);
        assert!(canonicalize_with(&three, 1 << 30, true).is_none());
    }

    #[test]
    fn refuses_what_it_cannot_rebuild() {
        let image = vec![7u8; 1000];
        let mut bytes = png(&image, 100);
        let last = bytes.len() - 20;
        bytes[last] ^= 1; // break a CRC or data byte
        assert!(canonicalize(&bytes, 1 << 30).is_none());
        assert!(canonicalize(b"not a png", 1 << 30).is_none());
        assert_eq!(adler32(b"Wikipedia"), 0x11E6_0398);
    }
}
