//! Re-deflating a block shifted by a one-character edit: zlib's full
//! re-deflate against `ec_patch::zport::deflate_shifted_stream` (the old
//! block's parse reused), same run, alternating, medians of RUNS:
//!
//!     cargo run --profile release-test -p ec-patch --example zport_shifted -- [DOCUMENT] [RUNS] [LEVEL]
//!
//! DOCUMENT is a LibreOffice .odt (its content.xml is used) or any .docx
//! (word/document.xml); it defaults to the base of the trace
//! writer-1m-middle-odt in .cache/traces (EC_TRACES names another folder).
//! A byte is inserted 100 bytes into the part and every 128 KiB block from
//! the third on (the blocks a receiver re-deflates today) is timed both
//! ways; then the block holding an edit (a byte inserted at its middle),
//! and the whole part as one stream. Each result is checked against zlib's.
//! The load average is printed with the numbers: both ways share the
//! machine alike, but absolute times move with it. With ZPORT_REUSE_ONLY
//! set, only the reuse path runs (10 x RUNS times, nothing printed), for a
//! profiler.
//!
//! Recorded (2 CPUs, load 1.8, two other builds intermittently running),
//! default document, 15 runs, level 6:
//!
//!     zlib full re-deflate      :    56.58 ms (7.072 ms per block)
//!     zport reuse (shifted)     :     5.92 ms (0.740 ms per block)  9.6x faster
//!     zport full port           :    56.04 ms (7.005 ms per block)
//!     edited block (byte inserted at its middle): zlib 7.342 ms, zport reuse 2.687 ms, 2.7x faster
//!     whole part as one stream (1264565 bytes): zlib 69.47 ms, zport reuse 8.00 ms, 8.7x faster
//!
//! At levels 1-3 (zlib's deflate_fast: about 1 ms a block) the reuse path
//! is no faster than zlib.

use ec_patch::zport::{deflate, deflate_shifted_stream, zlib_deflate, Stream};
use ec_patch::ZlibParams;
use std::path::PathBuf;
use std::time::Instant;

const BLOCK: usize = 128 << 10;
const WINDOW: usize = 32 << 10;

fn part(path: &PathBuf) -> Vec<u8> {
    let data = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let layout = ec_patch::zip::scan(&data).expect("a ZIP");
    let e = layout
        .entries
        .iter()
        .find(|e| e.name == b"content.xml" || e.name == b"word/document.xml")
        .expect("content.xml or word/document.xml");
    let raw = &data[e.data_offset as usize..(e.data_offset + e.data_len) as usize];
    ec_patch::deflate::inflate(raw, 1 << 30).expect("inflates")
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn ms(since: Instant) -> f64 {
    since.elapsed().as_secs_f64() * 1e3
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let doc = args.first().map(PathBuf::from).unwrap_or_else(|| {
        let traces = std::env::var_os("EC_TRACES")
            .map(PathBuf::from)
            .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../.cache/traces"));
        traces.join("writer-1m-middle-odt/base.odt")
    });
    let runs: usize = args.get(1).map_or(15, |s| s.parse().expect("RUNS"));
    let level: u8 = args.get(2).map_or(6, |s| s.parse().expect("LEVEL"));
    let p = ZlibParams { level, mem_level: 8, window_bits: 15, strategy: 0 };
    let old = part(&doc);
    let mut new = old.clone();
    new.insert(100, b'Q');
    let blocks = old.len().div_ceil(BLOCK);
    assert!(blocks >= 3, "{}: {} bytes, fewer than 3 blocks", doc.display(), old.len());
    // Block k: its stream (the window before it, then the block) and whether it is the last.
    let block = |c: &[u8], k: usize| {
        let s = k * BLOCK;
        let e = (s + BLOCK).min(c.len());
        (s - WINDOW..e, e == c.len())
    };
    let todo: Vec<_> = (2..blocks)
        .map(|k| {
            let (or, ol) = block(&old, k);
            let odata = zlib_deflate(&old[or.start..or.start + WINDOW], &old[or.start + WINDOW..or.end], p, ol).unwrap();
            let (nr, nl) = block(&new, k);
            (or, odata, nr, nl)
        })
        .collect();
    let shifted = |(or, odata, nr, nl): &(std::ops::Range<usize>, Vec<u8>, std::ops::Range<usize>, bool)| {
        let old_stream = Stream { bytes: &old[or.clone()], p0: WINDOW };
        deflate_shifted_stream(old_stream, odata, Stream { bytes: &new[nr.clone()], p0: WINDOW }, p, *nl).unwrap()
    };
    let input = |nr: &std::ops::Range<usize>| (&new[nr.start..nr.start + WINDOW], &new[nr.start + WINDOW..nr.end]);
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "{}: part {} bytes, level {level}, blocks 2..{} ({} blocks), {runs} runs, load {}",
        doc.display(),
        old.len(),
        blocks - 1,
        todo.len(),
        load.trim()
    );

    let (mut zlib_t, mut reuse_t, mut port_t) = (Vec::new(), Vec::new(), Vec::new());
    let mut copied = 0;
    if std::env::var_os("ZPORT_REUSE_ONLY").is_some() {
        // For a profiler: the reuse path alone, 10 x RUNS times.
        for _ in 0..runs * 10 {
            todo.iter().for_each(|t| drop(shifted(t)));
        }
        return;
    }
    for run in 0..runs {
        let t = Instant::now();
        let want: Vec<Vec<u8>> = todo
            .iter()
            .map(|(_, _, nr, nl)| {
                let (dict, input) = input(nr);
                zlib_deflate(dict, input, p, *nl).unwrap()
            })
            .collect();
        zlib_t.push(ms(t));
        let t = Instant::now();
        let got: Vec<(Vec<u8>, _)> = todo.iter().map(shifted).collect();
        reuse_t.push(ms(t));
        let t = Instant::now();
        let full: Vec<Vec<u8>> = todo
            .iter()
            .map(|(_, _, nr, nl)| {
                let (dict, input) = input(nr);
                deflate(dict, input, p, *nl).unwrap()
            })
            .collect();
        port_t.push(ms(t));
        assert!(got.iter().map(|g| &g.0).eq(want.iter()), "reuse differs from zlib");
        assert!(full == want, "port differs from zlib");
        if run == 0 {
            copied = got.iter().map(|g| g.1.copied).sum::<usize>();
        }
    }
    let n = todo.len() as f64;
    let (z, r, f) = (median(&mut zlib_t), median(&mut reuse_t), median(&mut port_t));
    println!("copied from the old parse: {copied} of {} input bytes", todo.iter().map(|t| t.2.len() - WINDOW).sum::<usize>());
    println!("zlib full re-deflate      : {z:8.2} ms ({:.3} ms per block)", z / n);
    println!("zport reuse (shifted)     : {r:8.2} ms ({:.3} ms per block)  {:.1}x faster", r / n, z / r);
    println!("zport full port           : {f:8.2} ms ({:.3} ms per block)", f / n);

    // The block holding the edit: a byte inserted in the middle of block 1.
    let at = BLOCK + BLOCK / 2;
    let mut edited = old.clone();
    edited.insert(at, b'Q');
    let (s, e) = (BLOCK - WINDOW, 2 * BLOCK);
    let odata = zlib_deflate(&old[s..BLOCK], &old[BLOCK..e], p, false).unwrap();
    let (mut zt, mut rt) = (Vec::new(), Vec::new());
    let mut stats = None;
    for _ in 0..runs {
        let t = Instant::now();
        let want = zlib_deflate(&edited[s..BLOCK], &edited[BLOCK..e], p, false).unwrap();
        zt.push(ms(t));
        let t = Instant::now();
        let got =
            deflate_shifted_stream(Stream { bytes: &old[s..e], p0: WINDOW }, &odata, Stream { bytes: &edited[s..e], p0: WINDOW }, p, false)
                .unwrap();
        rt.push(ms(t));
        assert!(got.0 == want, "reuse differs from zlib on the edited block");
        stats = Some(got.1);
    }
    let (z, r) = (median(&mut zt), median(&mut rt));
    println!(
        "edited block (byte inserted at its middle): zlib {z:.3} ms, zport reuse {r:.3} ms, {:.1}x faster; {:?}",
        z / r,
        stats.expect("runs > 0")
    );

    // The whole part as one stream (as LibreOffice writes Calc's content.xml
    // and a .docx's word/document.xml), the byte inserted 100 bytes in.
    let odata = zlib_deflate(&[], &old, p, true).unwrap();
    let (mut zt, mut rt) = (Vec::new(), Vec::new());
    let mut stats = None;
    for _ in 0..runs.div_ceil(3) {
        let t = Instant::now();
        let want = zlib_deflate(&[], &new, p, true).unwrap();
        zt.push(ms(t));
        let t = Instant::now();
        let got = deflate_shifted_stream(Stream { bytes: &old, p0: 0 }, &odata, Stream { bytes: &new, p0: 0 }, p, true).unwrap();
        rt.push(ms(t));
        assert!(got.0 == want, "reuse differs from zlib on the single stream");
        stats = Some(got.1);
    }
    let (z, r) = (median(&mut zt), median(&mut rt));
    println!(
        "whole part as one stream ({} bytes): zlib {z:.2} ms, zport reuse {r:.2} ms, {:.1}x faster; {:?}",
        new.len(),
        z / r,
        stats.expect("runs > 0")
    );
    let load = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!("load after: {}", load.trim());
}
