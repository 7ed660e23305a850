//! What the known non-zlib deflaters' candidates (recipes 7, 8, 9, 10 and
//! 12, edit-patch-v2.md §3.3) cost on the members of a ZIP none of them
//! wrote: the per-archive price of refuting them before PREFLATE. Best of 3,
//! the four groups (flate2's, Go's, Info-ZIP's, 7-Zip's; every level) in the
//! same run:
//!
//!     cargo run --release -p ec-patch --example known_deflaters_cost -- A.zip [B.zip ...]
//!
//! Members under 10 kB of content are skipped.

use ec_patch::deflaters::{candidates, matches, Deflater};
use std::time::Instant;

fn main() {
    let files: Vec<String> = std::env::args().skip(1).collect();
    if files.is_empty() {
        eprintln!("usage: known_deflaters_cost A.zip [B.zip ...]");
        std::process::exit(2);
    }
    println!("file | member | content | flate2 candidates | ms | Go candidates | ms | Info-ZIP candidates | ms | 7-Zip candidates | ms");
    for f in files {
        let zip = std::fs::read(&f).unwrap_or_else(|e| panic!("{f}: {e}"));
        let layout = ec_patch::zip::scan(&zip).unwrap_or_else(|e| panic!("{f}: {e}"));
        for e in &layout.entries {
            if e.method != 8 {
                continue;
            }
            let data = &zip[e.data_offset as usize..(e.data_offset + e.data_len) as usize];
            let Ok(content) = miniz_oxide::inflate::decompress_to_vec(data) else { continue };
            if content.len() < 10_000 {
                continue;
            }
            let group = |d: Deflater| match d {
                Deflater::MinizOxide | Deflater::ZlibRs => 0,
                Deflater::GoFlate => 1,
                Deflater::InfoZip => 2,
                Deflater::SevenZip => 3,
            };
            let time = |g: usize| {
                let t = Instant::now();
                let mut n = 0;
                for k in candidates().filter(|k| group(k.deflater) == g) {
                    std::hint::black_box(matches(&content, k, data));
                    n += 1;
                }
                (t.elapsed().as_secs_f64() * 1e3, n)
            };
            let best = |g| (0..3).map(|_| time(g)).fold((f64::MAX, 0), |a, b| if b.0 < a.0 { b } else { a });
            let ((fm, nf), (gm, ng), (im, ni), (sm, ns)) = (best(0), best(1), best(2), best(3));
            println!(
                "{f} | {} | {} | {nf} | {fm:.1} | {ng} | {gm:.1} | {ni} | {im:.1} | {ns} | {sm:.1}",
                String::from_utf8_lossy(&e.name),
                content.len()
            );
        }
    }
}
