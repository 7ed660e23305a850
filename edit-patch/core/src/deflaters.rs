//! Raw deflate by the known deflaters other than zlib (format version 2,
//! docs/spec/edit-patch-v2.md §3): each is a pinned crate whose output, for
//! given content and parameters, a recipe reproduces byte for byte.
//!
//! - tag 7, [`Deflater::MinizOxide`]: miniz_oxide 0.9.1, as Rust's flate2
//!   (default `rust_backend`) calls it for `DeflateEncoder::new(w, Compression::new(level))`;
//! - tag 8, [`Deflater::ZlibRs`]: zlib-rs 0.6.8, as flate2's `zlib-rs`
//!   feature calls it for the same encoder (window bits 15, raw, memory level
//!   8, default strategy).
//! - tag 9, [`Deflater::GoFlate`]: Go 1.19's `compress/flate`, as ported
//!   byte for byte in [`crate::goflate`] (`flate.NewWriter(w, level)`, one
//!   `Write` of the whole content, `Close`). Go's levels run from -2
//!   (HuffmanOnly) to 9, -1 meaning 6; the level byte is Go's level + 2
//!   (0 to 11: [`KnownDeflate::go_level`]). Go's `archive/zip` writes its
//!   members at level 5 (level byte 7), which the search tries first. The
//!   port hands its output on as its bit writer writes it, so [`matches()`]
//!   stops at the first differing run as for the crates.
//! - tag 10, [`Deflater::InfoZip`]: Info-ZIP Zip 3.0's own deflater, as
//!   ported byte for byte in [`crate::infozip`] (`zip -1` to `zip -9`, the
//!   member data of a regular file's deflated member). The level byte is
//!   zip's level, 1 to 9 (`zip -0` stores: no deflate stream); zip's default
//!   6 is tried first.
//! - tag 12, [`Deflater::SevenZip`]: 7-Zip 26.02's Deflate encoder, as
//!   ported byte for byte in [`crate::sevenzip`], as its zip writer runs it
//!   (`7z a -tzip -mm=Deflate -mx=5`, the member data of a deflated
//!   member). The level byte is 7-Zip's level, 1 to 6: 1 to 4 are one
//!   encoder (its fast mode) and 5 and 6 another, so the search tries 5
//!   (7-Zip's default) and 1 only; 7 to 9 are not ported.
//!
//! The two crates are driven as flate2's `write::DeflateEncoder` drives them
//! when the whole content is written at once: calls with all the input not
//! yet consumed and 32 KiB of fresh output space each, without flushing,
//! until the input is consumed; then calls with no input and `Finish` until
//! the stream ends ([`run`], spec §3.2). The output is the pinned crate's:
//! a release of either crate that deflates differently is a new recipe tag,
//! never a change of these (their tests hold golden hashes).

/// A known deflater other than zlib: the recipe tag that names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Deflater {
    /// Recipe 7: miniz_oxide 0.9.1 (flate2's default backend).
    MinizOxide,
    /// Recipe 8: zlib-rs 0.6.8 (flate2's `zlib-rs` feature).
    ZlibRs,
    /// Recipe 9: Go 1.19's `compress/flate` ([`crate::goflate`]); the level
    /// byte is Go's level + 2.
    GoFlate,
    /// Recipe 10: Info-ZIP Zip 3.0's deflater ([`crate::infozip`]); the
    /// level byte is zip's level, 1 to 9.
    InfoZip,
    /// Recipe 12: 7-Zip's Deflate encoder ([`crate::sevenzip`]); the level
    /// byte is 7-Zip's level, 1 to 6.
    SevenZip,
}

/// A recipe of a known deflater: which one, and its level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KnownDeflate {
    pub deflater: Deflater,
    /// The level byte as the patch carries it: the level itself for recipes
    /// 7, 8, 10 and 12, Go's level + 2 for recipe 9 ([`KnownDeflate::go_level`]).
    pub level: u8,
}

impl Deflater {
    /// Every known deflater, in the order the recipe search tries them.
    pub const ALL: [Deflater; 5] = [Deflater::MinizOxide, Deflater::ZlibRs, Deflater::GoFlate, Deflater::InfoZip, Deflater::SevenZip];

    /// The recipe tag (spec v2 §3).
    pub fn tag(self) -> u8 {
        match self {
            Deflater::MinizOxide => 7,
            Deflater::ZlibRs => 8,
            Deflater::GoFlate => 9,
            Deflater::InfoZip => 10,
            Deflater::SevenZip => 12,
        }
    }

    /// The deflater a recipe tag names, if it names one.
    pub fn from_tag(tag: u8) -> Option<Self> {
        Self::ALL.into_iter().find(|d| d.tag() == tag)
    }

    /// The lowest level byte the recipe accepts: 1 for Info-ZIP (its level
    /// 0 stores; 7-Zip's too), 0 for the others.
    pub fn min_level(self) -> u8 {
        match self {
            Deflater::InfoZip | Deflater::SevenZip => 1,
            _ => 0,
        }
    }

    /// The highest level byte the recipe accepts.
    pub fn max_level(self) -> u8 {
        match self {
            // miniz_oxide has a level 10 (flate2 passes it on unchanged).
            Deflater::MinizOxide => 10,
            Deflater::ZlibRs => 9,
            // Go's 9, + 2.
            Deflater::GoFlate => 11,
            Deflater::InfoZip => 9,
            // 7 to 9 (several passes) are not ported.
            Deflater::SevenZip => 6,
        }
    }

    /// Short name, for summaries.
    pub fn name(self) -> &'static str {
        match self {
            Deflater::MinizOxide => "miniz-oxide",
            Deflater::ZlibRs => "zlib-rs",
            Deflater::GoFlate => "go-flate",
            Deflater::InfoZip => "info-zip",
            Deflater::SevenZip => "7-zip",
        }
    }

    /// The level bytes the recipe search tries, likeliest first. Recipes 7
    /// and 8: flate2's `Compression::default()` (6), `fast()` (1), `best()`
    /// (9), then the rest. Recipe 9: Go's 5 (what `archive/zip` uses), 6
    /// (`DefaultCompression`), 1 (`BestSpeed`), 9 (`BestCompression`), 2-4,
    /// 7, 8, 0, then -2 (`HuffmanOnly`); never -1, which makes 6's bytes.
    /// Recipe 10: zip's default 6, then 9 (`zip -9`), 1, then the rest.
    /// Recipe 12: 7-Zip's default 5, then 1 (its fast mode); never 2-4 or
    /// 6, which make 1's and 5's bytes.
    pub fn candidate_levels(self) -> impl Iterator<Item = u8> {
        const ORDER: [u8; 11] = [6, 1, 9, 2, 3, 4, 5, 7, 8, 0, 10];
        // Go's levels 5, 6, 1, 9, 2, 3, 4, 7, 8, 0, -2, + 2.
        const GO_ORDER: [u8; 11] = [7, 8, 3, 11, 4, 5, 6, 9, 10, 2, 0];
        const ZIP_ORDER: [u8; 9] = [6, 9, 1, 2, 3, 4, 5, 7, 8];
        const SEVEN_ZIP_ORDER: [u8; 2] = [5, 1];
        let order: &'static [u8] = match self {
            Deflater::GoFlate => &GO_ORDER,
            Deflater::InfoZip => &ZIP_ORDER,
            Deflater::SevenZip => &SEVEN_ZIP_ORDER,
            _ => &ORDER,
        };
        order.iter().copied().filter(move |&l| (self.min_level()..=self.max_level()).contains(&l))
    }
}

impl KnownDeflate {
    /// Whether the recipe's parameters are in range.
    pub fn is_valid(&self) -> bool {
        (self.deflater.min_level()..=self.deflater.max_level()).contains(&self.level)
    }

    /// Recipe 9's Go level (-2 to 9) of a level byte (0 to 11).
    pub fn go_level(&self) -> i32 {
        i32::from(self.level) - 2
    }

    /// Short name, for summaries.
    pub fn name(&self) -> &'static str {
        self.deflater.name()
    }
}

/// Output space of each call: flate2's writer compresses into a 32 KiB buffer.
pub const OUT_SPACE: usize = 32 << 10;

/// Deflates `input` as §3.2 specifies, handing each call's output to `sink`
/// in order; `sink` returns false to stop. Returns true when the stream
/// ended and every chunk was accepted; false if stopped, if the crate
/// failed, or if a call made no progress.
pub fn run(input: &[u8], k: KnownDeflate, mut sink: impl FnMut(&[u8]) -> bool) -> bool {
    if !k.is_valid() {
        return false;
    }
    if k.deflater == Deflater::GoFlate {
        // One `Write` of the whole content, then `Close` (Go's output does
        // not depend on how the content is split: spec v2 §3.2).
        return crate::goflate::run(input, k.go_level(), sink);
    }
    if k.deflater == Deflater::InfoZip {
        // zip reads the file itself: no split to choose (spec v2 §3.6).
        return crate::infozip::run(input, k.level, sink);
    }
    if k.deflater == Deflater::SevenZip {
        // 7-Zip's output does not depend on how it reads the file (spec v2 §3.8).
        return crate::sevenzip::run(input, k.level, sink);
    }
    let mut out = vec![0u8; OUT_SPACE];
    match k.deflater {
        Deflater::MinizOxide => {
            use miniz_oxide::deflate::core::CompressorOxide;
            use miniz_oxide::{DataFormat, MZFlush, MZStatus};
            let mut c: Box<CompressorOxide> = Box::default();
            c.set_format_and_level(DataFormat::Raw, k.level);
            let mut rest = input;
            loop {
                let finish = rest.is_empty();
                let flush = if finish { MZFlush::Finish } else { MZFlush::None };
                let r = miniz_oxide::deflate::stream::deflate(&mut c, rest, &mut out, flush);
                if r.bytes_written > 0 && !sink(&out[..r.bytes_written]) {
                    return false;
                }
                rest = &rest[r.bytes_consumed..];
                match r.status {
                    Ok(MZStatus::StreamEnd) => return finish,
                    Ok(MZStatus::Ok) => {}
                    // A full output buffer with input left is no error for the caller.
                    Err(miniz_oxide::MZError::Buf) => {}
                    _ => return false,
                }
                if r.bytes_consumed == 0 && r.bytes_written == 0 {
                    return false;
                }
            }
        }
        Deflater::ZlibRs => {
            use zlib_rs::{DeflateFlush, Status};
            let mut d = zlib_rs::Deflate::new(i32::from(k.level), false, 15);
            let mut rest = input;
            loop {
                let finish = rest.is_empty();
                let flush = if finish { DeflateFlush::Finish } else { DeflateFlush::NoFlush };
                let (in0, out0) = (d.total_in(), d.total_out());
                let status = d.compress(rest, &mut out, flush);
                let consumed = (d.total_in() - in0) as usize;
                let written = (d.total_out() - out0) as usize;
                if written > 0 && !sink(&out[..written]) {
                    return false;
                }
                rest = &rest[consumed..];
                match status {
                    Ok(Status::StreamEnd) => return finish,
                    Ok(Status::Ok | Status::BufError) => {}
                    Err(_) => return false,
                }
                if consumed == 0 && written == 0 {
                    return false;
                }
            }
        }
        Deflater::GoFlate | Deflater::InfoZip | Deflater::SevenZip => unreachable!("handled above"),
    }
}

/// Why [`deflate`] made no data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// The output would pass `max_out` bytes.
    TooLong,
    /// The crate refused or failed.
    Codec,
}

/// The data recipe `k` makes of `input`, refused as soon as it passes
/// `max_out` bytes (so a hostile patch allocates no more than that).
pub fn deflate(input: &[u8], k: KnownDeflate, max_out: u64) -> Result<Vec<u8>, Failure> {
    let mut out = Vec::with_capacity((input.len() / 4 + 64).min(max_out as usize));
    let mut too_long = false;
    let ok = run(input, k, |c| {
        too_long = (out.len() + c.len()) as u64 > max_out;
        !too_long && {
            out.extend_from_slice(c);
            true
        }
    });
    match (ok, too_long) {
        (true, _) => Ok(out),
        (false, true) => Err(Failure::TooLong),
        (false, false) => Err(Failure::Codec),
    }
}

/// Whether recipe `k` turns `input` into exactly `expected`. Compares each
/// call's output as it comes and stops at the first that differs (or that
/// runs past `expected`), so a wrong guess costs the work up to the first
/// block the deflater emits.
pub fn matches(input: &[u8], k: KnownDeflate, expected: &[u8]) -> bool {
    if k.deflater == Deflater::InfoZip {
        // Also compares the first block's symbols as they are made (zip's
        // first output comes after up to 32767 of them).
        return k.is_valid() && crate::infozip::matches(input, k.level, expected);
    }
    if k.deflater == Deflater::SevenZip {
        // Likewise: 7-Zip's first output comes after up to 60923 input bytes.
        return k.is_valid() && crate::sevenzip::matches(input, k.level, expected);
    }
    let mut at = 0usize;
    let ended = run(input, k, |c| {
        let ok = expected.len() - at >= c.len() && expected[at..at + c.len()] == *c;
        at += c.len();
        ok
    });
    ended && at == expected.len()
}

/// Every recipe of a known deflater, in the order the search tries them.
pub fn candidates() -> impl Iterator<Item = KnownDeflate> {
    Deflater::ALL.into_iter().flat_map(|deflater| deflater.candidate_levels().map(move |level| KnownDeflate { deflater, level }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(n: u32) -> Vec<u8> {
        (0..n).flat_map(|i| format!("<w:p><w:r><w:t>word {} {}</w:t></w:r></w:p>", i % 977, i % 13).into_bytes()).collect()
    }

    /// Feeds `input` in pieces of `piece` bytes, as flate2's writer does
    /// when it is written piece by piece (each write: one call with the
    /// piece's rest and 32 KiB of output space; then Finish calls).
    fn run_pieces(input: &[u8], k: KnownDeflate, piece: usize) -> Vec<u8> {
        let mut out = Vec::new();
        let mut buf = vec![0u8; OUT_SPACE];
        match k.deflater {
            Deflater::MinizOxide => {
                use miniz_oxide::deflate::core::CompressorOxide;
                let mut c: Box<CompressorOxide> = Box::default();
                c.set_format_and_level(miniz_oxide::DataFormat::Raw, k.level);
                for p in input.chunks(piece) {
                    let mut rest = p;
                    while !rest.is_empty() {
                        let r = miniz_oxide::deflate::stream::deflate(&mut c, rest, &mut buf, miniz_oxide::MZFlush::None);
                        out.extend_from_slice(&buf[..r.bytes_written]);
                        rest = &rest[r.bytes_consumed..];
                    }
                }
                loop {
                    let r = miniz_oxide::deflate::stream::deflate(&mut c, &[], &mut buf, miniz_oxide::MZFlush::Finish);
                    out.extend_from_slice(&buf[..r.bytes_written]);
                    if r.status == Ok(miniz_oxide::MZStatus::StreamEnd) {
                        return out;
                    }
                }
            }
            Deflater::ZlibRs => {
                let mut d = zlib_rs::Deflate::new(i32::from(k.level), false, 15);
                for p in input.chunks(piece) {
                    let mut rest = p;
                    while !rest.is_empty() {
                        let (i0, o0) = (d.total_in(), d.total_out());
                        d.compress(rest, &mut buf, zlib_rs::DeflateFlush::NoFlush).unwrap();
                        out.extend_from_slice(&buf[..(d.total_out() - o0) as usize]);
                        rest = &rest[(d.total_in() - i0) as usize..];
                    }
                }
                loop {
                    let o0 = d.total_out();
                    let s = d.compress(&[], &mut buf, zlib_rs::DeflateFlush::Finish).unwrap();
                    out.extend_from_slice(&buf[..(d.total_out() - o0) as usize]);
                    if s == zlib_rs::Status::StreamEnd {
                        return out;
                    }
                }
            }
            Deflater::GoFlate => {
                let mut w = crate::goflate::Writer::new(k.go_level()).unwrap();
                for p in input.chunks(piece) {
                    w.write(p);
                }
                w.finish()
            }
            Deflater::InfoZip => crate::infozip::deflate(input, k.level),
            Deflater::SevenZip => crate::sevenzip::deflate(input, k.level),
        }
    }

    #[test]
    fn round_trip_match_and_refusal() {
        let t = text(20_000);
        for k in candidates() {
            let c = deflate(&t, k, u64::MAX).unwrap();
            assert_eq!(crate::deflate::inflate(&c, 1 << 30).unwrap(), t, "{k:?}");
            assert!(matches(&t, k, &c), "{k:?}");
            assert!(!matches(&t, k, &c[..c.len() - 1]), "{k:?}");
            let mut longer = c.clone();
            longer.push(0);
            assert!(!matches(&t, k, &longer), "{k:?}");
            let mut wrong = c.clone();
            let mid = wrong.len() / 2;
            wrong[mid] ^= 1;
            assert!(!matches(&t, k, &wrong), "{k:?}");
            assert_eq!(deflate(&t, k, c.len() as u64 - 1), Err(Failure::TooLong), "{k:?}");
            assert_eq!(deflate(&t, k, c.len() as u64).unwrap(), c);
        }
        for d in Deflater::ALL {
            let level = d.candidate_levels().next().unwrap();
            let empty = deflate(&[], KnownDeflate { deflater: d, level }, 100).unwrap();
            assert_eq!(crate::deflate::inflate(&empty, 10).unwrap(), b"");
            assert_eq!(deflate(&t, KnownDeflate { deflater: d, level: d.max_level() + 1 }, u64::MAX), Err(Failure::Codec));
            if d.min_level() > 0 {
                assert_eq!(deflate(&t, KnownDeflate { deflater: d, level: d.min_level() - 1 }, u64::MAX), Err(Failure::Codec));
            }
        }
    }

    #[test]
    fn the_levels_differ_and_the_deflaters_differ_from_zlib() {
        let t = text(20_000);
        let zlib6 = crate::deflate::deflate(&t, crate::ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 }).unwrap();
        for d in Deflater::ALL {
            let first = d.candidate_levels().next().unwrap();
            let six = deflate(&t, KnownDeflate { deflater: d, level: first }, u64::MAX).unwrap();
            assert_ne!(six, zlib6, "{d:?}");
            assert_ne!(six, deflate(&t, KnownDeflate { deflater: d, level: 1 }, u64::MAX).unwrap(), "{d:?}");
        }
    }

    /// Whether the output depends on how the input is split across calls
    /// (spec v2 §3.2 fixes the single-write form), measured on text,
    /// incompressible bytes and text again, at every level: miniz_oxide's
    /// does not; zlib-rs's does (at level 6, pieces of 8 KiB give other
    /// bytes), so recipe 8 reproduces a writer that hands flate2 the whole
    /// content in one write, as `write_all(&content)` does.
    #[test]
    fn how_the_input_is_split_matters_to_zlib_rs_only() {
        let mut t = text(30_000);
        let mut x = 0x9e37_79b9_u32;
        t.extend((0..300_000).map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        }));
        t.extend(text(5_000));
        let mut split_differs = Vec::new();
        for k in candidates() {
            let whole = deflate(&t, k, u64::MAX).unwrap();
            assert!(run_pieces(&t, k, t.len()) == whole, "{k:?}: one piece is the single-write form");
            for piece in [1 << 20, 8192, 1000, 65_536 + 7] {
                let split = run_pieces(&t, k, piece);
                assert_eq!(crate::deflate::inflate(&split, 1 << 30).unwrap(), t);
                if split != whole {
                    split_differs.push((k.deflater, k.level, piece));
                }
            }
        }
        assert!(split_differs.iter().all(|d| d.0 == Deflater::ZlibRs), "{split_differs:?}");
        assert!(candidates().any(|k| k.deflater == Deflater::GoFlate), "Go's pieces were compared");
        assert!(split_differs.contains(&(Deflater::ZlibRs, 6, 8192)), "{split_differs:?}");
    }

    /// Golden CRC-32s of the pinned crates' output: a crate release that
    /// deflates differently must be a new recipe tag, not a silent change.
    #[test]
    fn the_pinned_crates_output_is_unchanged() {
        let t = text(20_000);
        let got: Vec<(u8, u8, u32, usize)> = [
            (Deflater::MinizOxide, 6),
            (Deflater::MinizOxide, 1),
            (Deflater::ZlibRs, 6),
            (Deflater::ZlibRs, 9),
            (Deflater::GoFlate, 7),
            (Deflater::GoFlate, 0),
            (Deflater::InfoZip, 6),
            (Deflater::InfoZip, 1),
            (Deflater::InfoZip, 9),
            (Deflater::SevenZip, 5),
            (Deflater::SevenZip, 1),
        ]
        .into_iter()
        .map(|(deflater, level)| {
            let c = deflate(&t, KnownDeflate { deflater, level }, u64::MAX).unwrap();
            (deflater.tag(), level, crc32fast::hash(&c), c.len())
        })
        .collect();
        assert_eq!(got, GOLDEN, "{got:x?}");
    }

    const GOLDEN: [(u8, u8, u32, usize); 11] = [
        (7, 6, 0x129c86e1, 60166),
        (7, 1, 0x53d02df6, 77241),
        (8, 6, 0x2a664c85, 63366),
        (8, 9, 0x2bf46c84, 60363),
        (9, 7, 0x8a1a30cc, 59737),
        (9, 0, 0xf4ba984e, 398867),
        // The real `zip -6`, `-1` and `-9` (Debian's zip 3.0-13) make these
        // bytes of the same text.
        (10, 6, 0x276fb24c, 60027),
        (10, 1, 0x8c605e1b, 70119),
        (10, 9, 0xa5b20807, 60441),
        // The real `7z a -tzip -mm=Deflate -mx=5` and `-mx=1` (Debian's
        // 7zip 26.02) make these bytes of the same text.
        (12, 5, 0x60dba522, 59776),
        (12, 1, 0x6277e440, 67749),
    ];

    /// Recipe 9's level byte is Go's level + 2; -1 (Go's default) makes
    /// level 6's bytes and is never a candidate; every other level is, once.
    #[test]
    fn go_level_bytes() {
        let t = text(20_000);
        let go = |b: u8| KnownDeflate { deflater: Deflater::GoFlate, level: b };
        assert_eq!(deflate(&t, go(1), u64::MAX), deflate(&t, go(8), u64::MAX));
        assert_eq!(deflate(&t, go(7), u64::MAX).unwrap(), crate::goflate::deflate(&t, 5));
        assert_eq!(deflate(&t, go(0), u64::MAX).unwrap(), crate::goflate::deflate(&t, -2));
        assert_eq!(deflate(&t, go(11), u64::MAX).unwrap(), crate::goflate::deflate(&t, 9));
        let mut levels: Vec<u8> = Deflater::GoFlate.candidate_levels().collect();
        assert_eq!(levels[0], 7, "archive/zip's level 5 first");
        levels.sort();
        assert_eq!(levels, [0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]);
        assert_eq!(deflate(&t, go(12), u64::MAX), Err(Failure::Codec));
    }

    /// Recipe 10's level byte is zip's level, 1 to 9, 6 (zip's default) first.
    #[test]
    fn info_zip_level_bytes() {
        let t = text(2_000);
        let zip = |b: u8| KnownDeflate { deflater: Deflater::InfoZip, level: b };
        let mut levels: Vec<u8> = Deflater::InfoZip.candidate_levels().collect();
        assert_eq!(levels[0], 6, "zip's default first");
        levels.sort();
        assert_eq!(levels, [1, 2, 3, 4, 5, 6, 7, 8, 9]);
        for l in 1..=9 {
            assert_eq!(deflate(&t, zip(l), u64::MAX).unwrap(), crate::infozip::deflate(&t, l));
        }
        assert!(!zip(0).is_valid() && !zip(10).is_valid() && zip(1).is_valid() && zip(9).is_valid());
        assert_eq!(deflate(&t, zip(0), u64::MAX), Err(Failure::Codec));
        assert_eq!(deflate(&t, zip(10), u64::MAX), Err(Failure::Codec));
    }

    /// Recipe 12's level byte is 7-Zip's level, 1 to 6: two encoders, 1-4
    /// and 5-6; 5 (7-Zip's default) and 1 are the candidates.
    #[test]
    fn seven_zip_level_bytes() {
        let t = text(2_000);
        let sz = |b: u8| KnownDeflate { deflater: Deflater::SevenZip, level: b };
        assert_eq!(Deflater::SevenZip.candidate_levels().collect::<Vec<_>>(), [5, 1]);
        for l in 1..=6 {
            assert!(sz(l).is_valid());
            assert_eq!(deflate(&t, sz(l), u64::MAX).unwrap(), crate::sevenzip::deflate(&t, l));
            let same = if l < 5 { 1 } else { 5 };
            assert_eq!(crate::sevenzip::deflate(&t, l), crate::sevenzip::deflate(&t, same));
        }
        assert_ne!(crate::sevenzip::deflate(&t, 1), crate::sevenzip::deflate(&t, 5));
        for l in [0, 7, 9, 255] {
            assert!(!sz(l).is_valid());
            assert_eq!(deflate(&t, sz(l), u64::MAX), Err(Failure::Codec));
        }
    }
}
