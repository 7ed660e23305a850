//! The zlib port (`ec_patch::zport`) against zlib itself (libz-sys, called
//! as LibreOffice's ThreadedDeflater calls it): every level, with and
//! without a dictionary, Z_SYNC_FLUSH and Z_FINISH, on synthetic inputs, the
//! real-document corpus and random ones; and the re-deflation of a shifted
//! block from the old block's parse, on LibreOffice's own content.xml.

use crate::common;

use ec_patch::zport::{deflate, deflate_shifted, deflate_shifted_stream, zlib_deflate, OldBlock, ReuseStats, Stream};
use ec_patch::ZlibParams;
use proptest::prelude::*;

const BLOCK: usize = 128 << 10;
const WINDOW: usize = 32 << 10;

fn params(level: u8) -> ZlibParams {
    ZlibParams { level, mem_level: 8, window_bits: 15, strategy: 0 }
}

fn rng(seed: u64) -> impl FnMut() -> u64 {
    let mut x = seed.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
    move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    }
}

fn random(n: usize, seed: u64) -> Vec<u8> {
    let mut r = rng(seed);
    (0..n).map(|_| r() as u8).collect()
}

/// Text with runs of incompressible bytes: blocks that zlib stores, next to
/// ones it codes, some of them flushed after a window slide.
fn mixed(n: usize, seed: u64) -> Vec<u8> {
    let text = common::document_xml(n / 6, seed);
    let mut r = rng(seed);
    let mut out = Vec::with_capacity(n);
    while out.len() < n {
        let k = (r() % 40_000) as usize + 1;
        if r() % 3 == 0 {
            out.extend((0..k).map(|_| r() as u8));
        } else {
            let at = (r() as usize) % text.len().saturating_sub(k).max(1);
            out.extend_from_slice(&text[at..(at + k).min(text.len())]);
        }
    }
    out.truncate(n);
    out
}

fn check(dict: &[u8], input: &[u8], p: ZlibParams, finish: bool, what: &str) {
    let want = zlib_deflate(dict, input, p, finish).expect("zlib deflates");
    let got = deflate(dict, input, p, finish).expect("supported parameters");
    if got != want {
        let at = got.iter().zip(&want).position(|(a, b)| a != b).unwrap_or(got.len().min(want.len()));
        panic!(
            "{what}: {p:?} finish={finish} dict={} input={}: differs from zlib at byte {at} of {} (ours {})",
            dict.len(),
            input.len(),
            want.len(),
            got.len()
        );
    }
}

#[test]
fn every_level_matches_zlib_on_edge_case_inputs() {
    let xml = common::document_xml(60_000, 3);
    let inputs: Vec<(&str, Vec<u8>)> = vec![
        ("empty", Vec::new()),
        ("one byte", b"x".to_vec()),
        ("two bytes", b"xy".to_vec()),
        ("small text", b"<w:t>hello hello hello</w:t>".to_vec()),
        ("random 1 KiB", random(1024, 1)),
        ("random 200 KiB", random(200 << 10, 2)),
        ("zeros 300 KiB", vec![0; 300 << 10]),
        ("abc 100 KiB", b"abc".iter().copied().cycle().take(100 << 10).collect()),
        ("xml 360 KB", xml.clone()),
        ("mixed 400 KB", mixed(400_000, 4)),
        ("exactly a window", xml[..WINDOW].to_vec()),
        ("window + 1", xml[..WINDOW + 1].to_vec()),
        ("64 KiB - 262", xml[..(64 << 10) - 262].to_vec()),
        ("64 KiB + 1", mixed((64 << 10) + 1, 5)),
    ];
    let dict_text = common::document_xml(8_000, 9);
    let dict_random = random(WINDOW, 7);
    let dicts: [(&str, &[u8]); 4] =
        [("none", &[]), ("short", &dict_text[..100]), ("32 KiB text", &dict_text[..WINDOW]), ("32 KiB random", &dict_random)];
    for level in 1..=9 {
        for (name, input) in &inputs {
            for (dname, dict) in dicts {
                for finish in [false, true] {
                    check(dict, input, params(level), finish, &format!("{name}, dictionary {dname}"));
                }
            }
        }
    }
}

#[test]
fn other_memory_levels_and_windows_match_zlib() {
    let input = mixed(300_000, 11);
    for mem_level in [1, 2, 7, 9] {
        for window_bits in [9, 12, 15] {
            for level in [1, 3, 4, 6, 9] {
                let p = ZlibParams { level, mem_level, window_bits, strategy: 0 };
                let dict = &input[..1 << window_bits];
                check(dict, &input[1 << window_bits..], p, true, "mixed");
                check(&[], &input, p, false, "mixed");
            }
        }
    }
}

/// Every deflated part of every corpus file, block-parallel as LibreOffice
/// writes a big part (128 KiB blocks, the 32 KiB before each as dictionary,
/// the last one finished), at level 6; the first 200 KB of each part at
/// levels 1, 4 and 9 too.
#[test]
fn corpus_parts_match_zlib() {
    let (mut parts, mut bytes) = (0, 0);
    common::for_each_corpus_part(&["odt", "ods", "odp", "docx", "xlsx", "pptx"], |label, content| {
        parts += 1;
        bytes += content.len();
        let mut start = 0;
        loop {
            let end = (start + BLOCK).min(content.len());
            let last = end == content.len();
            check(&content[start.saturating_sub(WINDOW)..start], &content[start..end], params(6), last, label);
            if last {
                break;
            }
            start = end;
        }
        let head = &content[..content.len().min(200_000)];
        for level in [1, 4, 9] {
            check(&[], head, params(level), true, label);
        }
    });
    assert!(parts > 100, "only {parts} parts");
    eprintln!("{parts} corpus parts, {bytes} bytes: byte-exact");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    #[test]
    fn random_inputs_match_zlib(
        seed in any::<u64>(),
        len in 0usize..150_000,
        dict_len in prop_oneof![Just(0usize), 1usize..100, Just(WINDOW), WINDOW..WINDOW + 5000],
        alphabet in prop_oneof![Just(2u64), Just(4), Just(16), Just(256)],
        level in 1u8..=9,
        mem_level in prop_oneof![Just(8u8), 1u8..=9],
        finish in any::<bool>(),
    ) {
        let mut r = rng(seed);
        // Runs copied from earlier (matches of every length and distance) between random bytes.
        let mut all: Vec<u8> = Vec::with_capacity(len + dict_len);
        while all.len() < len + dict_len {
            if all.len() > 300 && r() % 2 == 0 {
                let n = (r() % 300) as usize + 1;
                let from = (r() as usize) % (all.len() - 1).clamp(1, 40_000);
                let at = all.len() - from - 1;
                for k in 0..n { all.push(all[at + k]); }
            } else {
                all.push((r() % alphabet) as u8);
            }
        }
        all.truncate(len + dict_len);
        let p = ZlibParams { level, mem_level, window_bits: 15, strategy: 0 };
        let (dict, input) = all.split_at(dict_len);
        prop_assert_eq!(deflate(dict, input, p, finish), zlib_deflate(dict, input, p, finish));
    }
}

// ---------------------------------------------------------------------------
// Shifted blocks

/// content.xml of a trace's base document (LibreOffice's own output).
fn trace_content(trace: &str) -> Option<Vec<u8>> {
    let traces = std::env::var_os("EC_TRACES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/traces"));
    let dir = traces.join(trace);
    let file = std::fs::read_dir(&dir).ok()?.flatten().map(|e| e.path()).find(|p| p.file_stem().is_some_and(|s| s == "base"))?;
    let data = std::fs::read(file).ok()?;
    common::members(&data).into_iter().find(|(name, _, _)| name == "content.xml").map(|(_, _, c)| c)
}

/// Block `k` of `content` (dictionary, input, last?) as LibreOffice cuts it.
fn block_of(content: &[u8], k: usize) -> (&[u8], &[u8], bool) {
    let start = k * BLOCK;
    let end = (start + BLOCK).min(content.len());
    (&content[start.saturating_sub(WINDOW)..start], &content[start..end], end == content.len())
}

/// Re-deflates block `k` of `new` from block `k` of `old` and checks it is zlib's output.
fn shifted(old: &[u8], new: &[u8], k: usize, p: ZlibParams, what: &str) -> ReuseStats {
    let (odict, oinput, olast) = block_of(old, k);
    let odata = zlib_deflate(odict, oinput, p, olast).unwrap();
    let (dict, input, last) = block_of(new, k);
    let want = zlib_deflate(dict, input, p, last).unwrap();
    let (got, stats) = deflate_shifted(OldBlock { dict: odict, input: oinput, data: &odata }, dict, input, p, last).expect("reuses");
    assert!(got == want, "{what}: block {k} {p:?}: differs from zlib ({stats:?})");
    stats
}

fn edited(content: &[u8], at: usize, edit: &str) -> Vec<u8> {
    let mut v = content.to_vec();
    match edit {
        "insert" => v.insert(at, b'Q'),
        "delete" => {
            v.remove(at);
        }
        "replace" => v[at] = b'Q',
        "paste" => v.splice(at..at, b"<text:span>pasted words</text:span>".iter().copied()).for_each(drop),
        _ => unreachable!(),
    }
    v
}

#[test]
fn a_shifted_block_is_rebuilt_exactly_from_the_old_parse() {
    let Some(content) = trace_content("writer-1m-middle-odt") else {
        panic!("no trace writer-1m-middle-odt: run `make traces` (or set EC_TRACES)");
    };
    let blocks = content.len().div_ceil(BLOCK);
    assert!(blocks >= 4, "{blocks} blocks");
    let k = 2;
    let start = k * BLOCK;
    // Edits well before the block, in its dictionary, at its first byte, inside it.
    let points = [100, start - WINDOW - 1, start - WINDOW + 5, start - 300, start - 1, start + 10, start + BLOCK / 2];
    for edit in ["insert", "delete", "replace", "paste"] {
        for &at in &points {
            let new = edited(&content, at, edit);
            let stats = shifted(&content, &new, k, params(6), &format!("{edit} at {at}"));
            if at < start - WINDOW && edit != "replace" {
                assert!(stats.copied > BLOCK - 2000, "{edit} at {at}: little reuse: {stats:?}");
            }
            if at == start + BLOCK / 2 {
                // The old parse before the edit, and from a window after it.
                assert!(stats.copied > BLOCK - WINDOW - 2000, "{edit} at {at}: little reuse: {stats:?}");
            }
        }
    }
}

#[test]
fn every_later_block_of_an_edited_document_is_rebuilt_exactly_at_every_level() {
    for trace in ["writer-1m-start-odt", "writer-1m-end-odt", "writer-100k-middle-odt"] {
        let Some(content) = trace_content(trace) else {
            panic!("no trace {trace}: run `make traces` (or set EC_TRACES)");
        };
        let new = edited(&content, 500, "insert");
        let blocks = content.len().div_ceil(BLOCK);
        for level in 1..=9 {
            let mut copied = 0;
            for k in 1..blocks {
                copied += shifted(&content, &new, k, params(level), &format!("{trace} level {level}")).copied;
            }
            if blocks > 1 {
                assert!(copied > (blocks - 1) * BLOCK / 2, "{trace} level {level}: copied {copied}");
            }
        }
        // The last block shortened or lengthened by the edit (Z_FINISH).
        let del = edited(&content, 500, "delete");
        shifted(&content, &del, blocks - 1, params(6), &format!("{trace} delete"));
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 96, ..ProptestConfig::default() })]
    /// Random edits of random XML-like content, before or inside a block.
    #[test]
    fn random_shifts_are_rebuilt_exactly(
        seed in any::<u64>(),
        edit in prop_oneof![Just("insert"), Just("delete"), Just("replace"), Just("paste")],
        offset in prop_oneof![-200_000isize..0, -(WINDOW as isize)..0, 0isize..BLOCK as isize],
        level in 1u8..=9,
        mem_level in prop_oneof![Just(8u8), 1u8..=9],
        window_bits in prop_oneof![Just(15u8), 9u8..=15],
    ) {
        let content = mixed(3 * BLOCK + 5000, seed);
        let content = [common::document_xml(50_000, seed).as_slice(), &content].concat();
        let k = 2;
        let at = ((k * BLOCK) as isize + offset).max(1) as usize;
        let new = edited(&content, at, edit);
        let p = ZlibParams { level, mem_level, window_bits, strategy: 0 };
        shifted(&content, &new, k, p, &format!("{edit} at {at}"));
    }
}

// ---------------------------------------------------------------------------
// LibreOffice's own output

/// content.xml of a trace's document `which` ("base" or "new"): its content
/// and its compressed bytes as LibreOffice wrote them.
fn libreoffice_member(trace: &str, which: &str) -> Option<(Vec<u8>, Vec<u8>)> {
    let traces = std::env::var_os("EC_TRACES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/traces"));
    let dir = traces.join(trace);
    let file = std::fs::read_dir(&dir).ok()?.flatten().map(|e| e.path()).find(|p| p.file_stem().is_some_and(|s| s == which))?;
    let zip = std::fs::read(file).ok()?;
    let layout = ec_patch::zip::scan(&zip).ok()?;
    let e = layout.entries.iter().find(|e| e.name == b"content.xml" && e.method == 8)?;
    let data = zip[e.data_offset as usize..(e.data_offset + e.data_len) as usize].to_vec();
    Some((ec_patch::deflate::inflate(&data, 1 << 30).ok()?, data))
}

/// The port's block-parallel output for `content`: each block's bytes.
fn port_blocks(content: &[u8], p: ZlibParams) -> Vec<Vec<u8>> {
    (0..content.len().div_ceil(BLOCK).max(1))
        .map(|k| {
            let (dict, input, last) = block_of(content, k);
            deflate(dict, input, p, last).unwrap()
        })
        .collect()
}

/// The port reproduces the content.xml LibreOffice wrote (block-parallel,
/// level 6) in the traces' base and new documents, and the new one's blocks
/// after the edit come out of deflate_shifted from the base's blocks.
#[test]
fn libreoffice_members_are_reproduced_and_rebuilt_from_the_base_parse() {
    let mut seen = 0;
    for trace in ["writer-1m-start-odt", "writer-1m-middle-odt", "writer-1m-end-odt", "writer-100k-middle-odt", "writer-100k-multi-odt"] {
        let (Some((old, odata)), Some((new, ndata))) = (libreoffice_member(trace, "base"), libreoffice_member(trace, "new")) else {
            panic!("no trace {trace}: run `make traces` (or set EC_TRACES)");
        };
        seen += 1;
        let oblocks = port_blocks(&old, params(6));
        assert!(oblocks.concat() == odata, "{trace}: base content.xml is not the port's block-parallel level 6");
        assert!(port_blocks(&new, params(6)).concat() == ndata, "{trace}: new content.xml is not the port's block-parallel level 6");
        let mut rebuilt = Vec::new();
        let mut copied = 0;
        for k in 0..new.len().div_ceil(BLOCK) {
            let (dict, input, last) = block_of(&new, k);
            let made = if k < oblocks.len() {
                // The content slices themselves (deflate_shifted_stream copies nothing).
                let s = k * BLOCK;
                let (from, p0) = (s.saturating_sub(WINDOW), s.min(WINDOW));
                let old_stream = Stream { bytes: &old[from..(s + BLOCK).min(old.len())], p0 };
                let new_stream = Stream { bytes: &new[from..s + input.len()], p0 };
                assert_eq!(&new_stream.bytes[p0..], input);
                assert_eq!(&new_stream.bytes[..p0], dict);
                let (made, stats) = deflate_shifted_stream(old_stream, &oblocks[k], new_stream, params(6), last).unwrap();
                copied += stats.copied;
                made
            } else {
                deflate(dict, input, params(6), last).unwrap()
            };
            rebuilt.extend_from_slice(&made);
        }
        assert!(rebuilt == ndata, "{trace}: rebuilt content.xml differs from LibreOffice's");
        eprintln!("{trace}: {} blocks, {copied} of {} bytes from the base's parse", oblocks.len(), new.len());
    }
    assert!(seen > 0, "no writer traces");
}

// ---------------------------------------------------------------------------
// Debian's zlib 1.2.13 (what LibreOffice links), loaded at run time

mod system_zlib {
    use libz_sys as z;
    use std::os::raw::{c_char, c_int};

    type Init = unsafe extern "C" fn(z::z_streamp, c_int, c_int, c_int, c_int, c_int, *const c_char, c_int) -> c_int;
    type SetDict = unsafe extern "C" fn(z::z_streamp, *const u8, z::uInt) -> c_int;
    type Bound = unsafe extern "C" fn(z::z_streamp, z::uLong) -> z::uLong;
    type Deflate = unsafe extern "C" fn(z::z_streamp, c_int) -> c_int;
    type End = unsafe extern "C" fn(z::z_streamp) -> c_int;
    type Version = unsafe extern "C" fn() -> *const c_char;

    pub struct Lib {
        init: Init,
        set_dict: SetDict,
        bound: Bound,
        deflate: Deflate,
        end: End,
        pub version: String,
    }

    unsafe extern "C" fn zalloc(_: z::voidpf, items: z::uInt, size: z::uInt) -> z::voidpf {
        // SAFETY: plain C allocation, freed by `zfree`.
        unsafe { libc::calloc(items as libc::size_t, size as libc::size_t) }
    }
    unsafe extern "C" fn zfree(_: z::voidpf, p: z::voidpf) {
        // SAFETY: `p` came from `zalloc`.
        unsafe { libc::free(p) }
    }

    pub fn load() -> Option<Lib> {
        // SAFETY: dlopen/dlsym with NUL-terminated names; the symbols have zlib's C signatures.
        unsafe {
            let h = libc::dlopen(c"libz.so.1".as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL);
            if h.is_null() {
                return None;
            }
            let sym = |name: &std::ffi::CStr| {
                let p = libc::dlsym(h, name.as_ptr());
                (!p.is_null()).then_some(p)
            };
            let version: Version = std::mem::transmute(sym(c"zlibVersion")?);
            Some(Lib {
                init: std::mem::transmute::<*mut libc::c_void, Init>(sym(c"deflateInit2_")?),
                set_dict: std::mem::transmute::<*mut libc::c_void, SetDict>(sym(c"deflateSetDictionary")?),
                bound: std::mem::transmute::<*mut libc::c_void, Bound>(sym(c"deflateBound")?),
                deflate: std::mem::transmute::<*mut libc::c_void, Deflate>(sym(c"deflate")?),
                end: std::mem::transmute::<*mut libc::c_void, End>(sym(c"deflateEnd")?),
                version: std::ffi::CStr::from_ptr(version()).to_string_lossy().into_owned(),
            })
        }
    }

    impl Lib {
        /// As `ec_patch::zport::zlib_deflate`, with this library.
        pub fn deflate(&self, dict: &[u8], input: &[u8], level: u8, finish: bool) -> Vec<u8> {
            let mut s = Box::new(z::z_stream {
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
            });
            let version = std::ffi::CString::new(self.version.clone()).unwrap();
            // SAFETY: a boxed z_stream that does not move; pointers valid for the lengths given.
            unsafe {
                let rc =
                    (self.init)(&mut *s, c_int::from(level), 8, -15, 8, 0, version.as_ptr(), std::mem::size_of::<z::z_stream>() as c_int);
                assert_eq!(rc, 0);
                if !dict.is_empty() {
                    assert_eq!((self.set_dict)(&mut *s, dict.as_ptr(), dict.len() as z::uInt), 0);
                }
                let cap = (self.bound)(&mut *s, input.len() as z::uLong) as usize + 20;
                let mut out = vec![0u8; cap];
                s.next_in = input.as_ptr() as *mut u8;
                s.avail_in = input.len() as z::uInt;
                s.next_out = out.as_mut_ptr();
                s.avail_out = cap as z::uInt;
                let rc = (self.deflate)(&mut *s, if finish { 4 } else { 2 });
                assert_eq!(rc, if finish { 1 } else { 0 });
                out.truncate(cap - s.avail_out as usize);
                (self.end)(&mut *s);
                out
            }
        }
    }
}

/// The port also gives the bytes of the system's zlib (Debian's 1.2.13,
/// which LibreOffice uses), not only of the 1.3.2 libz-sys builds.
#[test]
fn system_zlib_gives_the_same_bytes() {
    let Some(lib) = system_zlib::load() else {
        panic!("no libz.so.1 (Debian: zlib1g), the zlib LibreOffice links");
    };
    eprintln!("system zlib {}", lib.version);
    let mut n = 0;
    let mut each = |dict: &[u8], input: &[u8], level: u8, finish: bool, what: &str| {
        n += 1;
        assert!(
            deflate(dict, input, params(level), finish).unwrap() == lib.deflate(dict, input, level, finish),
            "{what} level {level}: differs from zlib {}",
            lib.version
        );
    };
    common::for_each_corpus_part(&["odt", "docx"], |label, content| {
        for k in 0..content.len().div_ceil(BLOCK) {
            let (dict, input, last) = block_of(content, k);
            each(dict, input, 6, last, label);
        }
    });
    let m = mixed(400_000, 21);
    for level in 1..=9 {
        each(&m[..WINDOW], &m[WINDOW..], level, true, "mixed");
        each(&[], &random(100_000, 3), level, false, "random");
    }
    eprintln!("{n} deflate calls equal");
}

/// Every deflated part of 20 KB or more in every trace's documents (base
/// and new) is the port's output at level 6: block-parallel (Writer's
/// content.xml and the like) or one stream (Calc's content.xml, the .docx
/// word/document.xml LibreOffice writes).
#[test]
fn every_big_part_libreoffice_wrote_in_the_traces_is_the_ports_output() {
    let traces = std::env::var_os("EC_TRACES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/traces"));
    let Ok(dirs) = std::fs::read_dir(&traces) else {
        panic!("no traces in {}: run `make traces` (or set EC_TRACES)", traces.display());
    };
    let (mut blocks, mut single) = (0, 0);
    for dir in dirs.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
        for doc in std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()) {
            let zip = std::fs::read(&doc).unwrap();
            let Ok(layout) = ec_patch::zip::scan(&zip) else { continue };
            for e in layout.entries.iter().filter(|e| e.method == 8) {
                let data = &zip[e.data_offset as usize..(e.data_offset + e.data_len) as usize];
                let content = ec_patch::deflate::inflate(data, 1 << 30).unwrap();
                if content.len() < 20_000 {
                    continue;
                }
                if port_blocks(&content, params(6)).concat() == data {
                    blocks += 1;
                } else {
                    let what = format!("{} {}", doc.display(), String::from_utf8_lossy(&e.name));
                    assert!(deflate(&[], &content, params(6), true).unwrap() == data, "{what}: not the port's output at level 6");
                    single += 1;
                }
            }
        }
    }
    eprintln!("{blocks} block-parallel and {single} single-stream parts: the port's output");
}

/// The parts of 20 KB or more (by name) in every trace's base and new
/// documents: the new one's bytes rebuilt from the base's parse, block by
/// block for a block-parallel part, whole for a single-stream one.
#[test]
fn every_big_part_of_every_trace_pair_is_rebuilt_from_the_base_parse() {
    let traces = std::env::var_os("EC_TRACES")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../.cache/traces"));
    let Ok(dirs) = std::fs::read_dir(&traces) else {
        panic!("no traces in {}: run `make traces` (or set EC_TRACES)", traces.display());
    };
    let parts = |doc: &std::path::Path| -> Vec<(Vec<u8>, Vec<u8>, Vec<u8>)> {
        let zip = std::fs::read(doc).unwrap();
        let layout = ec_patch::zip::scan(&zip).unwrap();
        layout
            .entries
            .iter()
            .filter(|e| e.method == 8)
            .map(|e| {
                let data = zip[e.data_offset as usize..(e.data_offset + e.data_len) as usize].to_vec();
                (e.name.clone(), ec_patch::deflate::inflate(&data, 1 << 30).unwrap(), data)
            })
            .filter(|(_, c, _)| c.len() >= 20_000)
            .collect()
    };
    let (mut pairs, mut copied, mut total) = (0, 0, 0);
    for dir in dirs.flatten().map(|e| e.path()).filter(|p| p.is_dir()) {
        let find =
            |stem: &str| std::fs::read_dir(&dir).unwrap().flatten().map(|e| e.path()).find(|p| p.file_stem().is_some_and(|s| s == stem));
        let (Some(base), Some(new)) = (find("base"), find("new")) else { continue };
        let old_parts = parts(&base);
        for (name, content, data) in parts(&new) {
            let Some((_, ocontent, odata)) = old_parts.iter().find(|(n, _, _)| *n == name) else { continue };
            let what = format!("{} {}", dir.display(), String::from_utf8_lossy(&name));
            pairs += 1;
            total += content.len();
            let rebuilt = if port_blocks(ocontent, params(6)).concat() == *odata {
                let oblocks = port_blocks(ocontent, params(6));
                let mut out = Vec::new();
                for k in 0..content.len().div_ceil(BLOCK) {
                    let s = k * BLOCK;
                    let (from, p0) = (s.saturating_sub(WINDOW), s.min(WINDOW));
                    let last = s + BLOCK >= content.len();
                    let new_stream = Stream { bytes: &content[from..(s + BLOCK).min(content.len())], p0 };
                    let made = match oblocks.get(k) {
                        Some(ob) => {
                            let old_stream = Stream { bytes: &ocontent[from..(s + BLOCK).min(ocontent.len())], p0 };
                            let (made, stats) = deflate_shifted_stream(old_stream, ob, new_stream, params(6), last).unwrap();
                            copied += stats.copied;
                            made
                        }
                        None => deflate(&new_stream.bytes[..p0], &new_stream.bytes[p0..], params(6), last).unwrap(),
                    };
                    out.extend_from_slice(&made);
                }
                out
            } else {
                let old_block = OldBlock { dict: &[], input: ocontent, data: odata };
                let (made, stats) = deflate_shifted(old_block, &[], &content, params(6), true).unwrap();
                copied += stats.copied;
                made
            };
            assert!(rebuilt == data, "{what}: rebuilt part differs from LibreOffice's");
        }
    }
    eprintln!("{pairs} parts rebuilt exactly, {copied} of {total} bytes from the base's parse");
}

/// An old block that is not zlib's output for the old input (another
/// deflater's, another input's, garbage) never gives a wrong content: the
/// result is None or a deflate stream of the new input.
#[test]
fn a_wrong_old_block_never_gives_a_wrong_content() {
    let old = common::document_xml(40_000, 31);
    let mut new = old.clone();
    new.insert(5_000, b'Q');
    let p = params(6);
    let other = common::document_xml(40_000, 32);
    let mut flipped = zlib_deflate(&[], &old, p, true).unwrap();
    let mid = flipped.len() / 2;
    flipped[mid] ^= 0x10;
    let candidates: Vec<(&str, Vec<u8>)> = vec![
        ("level 1", zlib_deflate(&[], &old, params(1), true).unwrap()),
        ("memLevel 9", zlib_deflate(&[], &old, ZlibParams { mem_level: 9, ..p }, true).unwrap()),
        ("another input", zlib_deflate(&[], &other[..old.len().min(other.len())], p, true).unwrap()),
        ("a flipped bit", flipped),
        ("garbage", random(50_000, 8)),
        ("empty", Vec::new()),
    ];
    for (what, data) in candidates {
        let old_block = OldBlock { dict: &[], input: &old, data: &data };
        if let Some((made, _)) = deflate_shifted(old_block, &[], &new, p, true) {
            assert_eq!(ec_patch::deflate::inflate(&made, 1 << 24).unwrap(), new, "{what}");
        }
    }
}

/// The block-parallel rebuild itself (`ec_patch::deflate`, as apply and the
/// differ call it) makes the blocks after an edit from the base's blocks
/// (`zport::deflate_shifted_stream`) once it knows the base's layout: on
/// LibreOffice's content.xml with a character typed at the start, in the
/// middle and near the end, the three paths (a whole member, block by block
/// as the EPS streams it, and the differ's check) give LibreOffice's bytes.
#[test]
fn the_block_parallel_rebuild_makes_shifted_blocks_exactly_from_the_base() {
    use ec_patch::deflate::{
        deflate_blocks_matches_reusing, deflate_blocks_reusing, deflate_blocks_reusing_into, BlockBase, LIBREOFFICE_BLOCK,
    };
    for trace in ["writer-1m-start-odt", "writer-1m-middle-odt", "writer-1m-end-odt", "writer-100k-start-odt"] {
        let (Some((old, odata)), Some((new, ndata))) = (libreoffice_member(trace, "base"), libreoffice_member(trace, "new")) else {
            panic!("no trace {trace}: run `make traces` (or set EC_TRACES)");
        };
        let p = params(6);
        let layout = deflate_blocks_matches_reusing(&old, p, LIBREOFFICE_BLOCK, &odata, None).expect("the base is block-parallel level 6");
        let base = BlockBase { content: &old, data: &odata, layout: &layout };
        let before = ec_patch::deflate::blocks_made_from_parse();
        let (whole, made_layout, copied) = deflate_blocks_reusing(&new, p, LIBREOFFICE_BLOCK, Some(base)).unwrap();
        assert!(whole == ndata, "{trace}: the whole member differs from LibreOffice's");
        // Every block not copied was made from the base's parse, not by zlib (the
        // total only grows: tests running beside this one can add, never take away).
        let made = made_layout.ends.len() - copied;
        assert!(made > 0, "{trace}: the edit shifts at least one block");
        let from_parse = ec_patch::deflate::blocks_made_from_parse() - before;
        assert!(from_parse >= made as u64, "{trace}: {from_parse} of {made} blocks made from the base's parse");
        let mut streamed = Vec::new();
        deflate_blocks_reusing_into(&new, p, LIBREOFFICE_BLOCK, Some(base), |b| {
            streamed.extend_from_slice(b);
            true
        })
        .unwrap();
        assert!(streamed == ndata, "{trace}: the streamed member differs from LibreOffice's");
        assert!(deflate_blocks_matches_reusing(&new, p, LIBREOFFICE_BLOCK, &ndata, Some(base)).is_some(), "{trace}: the check refutes it");
    }
}
