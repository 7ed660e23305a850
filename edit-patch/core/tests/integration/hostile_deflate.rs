//! Hostile deflate streams and forged sizes under a memory bound (issue 8).
//!
//! A ZIP member made of millions of empty deflate blocks has an empty
//! content and a preflate recipe of a few dozen bytes; preflate-rs 0.7.6
//! kept about 100 bytes per block while rebuilding or analysing it, without
//! bound (a 185-byte patch drove apply to 1 GiB). Each case here runs in a
//! child process (this test binary, re-run on one test) whose peak resident
//! memory is measured by the kernel (`wait4`'s `ru_maxrss`) and watched
//! while it runs (`VmHWM`, killed past the bound), under an address-space
//! limit (`RLIMIT_AS`, as in a small VM without overcommit).
//!
//! The bound: **64 MiB + 2 x the largest document of the case** (base, new
//! file, or patch).

use crate::common;

use common::{document_xml, zip, Member};
use ec_patch::{apply_to_vec, decode, diff, diff_verified, encode, Body, DiffOptions, Limits, Recipe, Segment};
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Address space of the child: a small VM without overcommit.
const CHILD_ADDRESS_SPACE: u64 = 1 << 30;
/// Empty blocks in the hostile patch's member: 1.25 MB of data, rebuilt by
/// preflate-rs 0.7.6 in about 105 MB.
const APPLY_BLOCKS: usize = 1_000_000;
/// Empty blocks in the hostile file diffed: 2.5 MB, analysed by preflate-rs
/// 0.7.6 in several hundred MB.
const DIFF_BLOCKS: usize = 2_000_000;

/// `n` empty deflate blocks with fixed Huffman codes (10 bits each: BFINAL,
/// BTYPE = 01, the 7-bit end-of-block code), the last one final: a valid
/// raw deflate stream whose content is empty.
fn empty_blocks(n: usize) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * 10 / 8 + 2);
    let (mut acc, mut bits) = (0u32, 0u32);
    for i in 0..n {
        let last = u32::from(i + 1 == n);
        acc |= (last | 0b10) << bits; // BFINAL, then BTYPE 01 (LSB first); EOB is 0000000
        bits += 10;
        while bits >= 8 {
            out.push(acc as u8);
            acc >>= 8;
            bits -= 8;
        }
    }
    if bits > 0 {
        out.push(acc as u8);
    }
    out
}

/// A ZIP whose members' compressed data is given as is (method 8).
fn zip_deflated(members: &[(&[u8], Vec<u8>, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut central = Vec::new();
    for (name, data, content) in members {
        let offset = out.len() as u32;
        let crc = crc32fast::hash(content);
        let fixed = |sig: u32, out: &mut Vec<u8>, central: bool| {
            out.extend(sig.to_le_bytes());
            if central {
                out.extend(20u16.to_le_bytes());
            }
            out.extend(20u16.to_le_bytes());
            out.extend(0x0800u16.to_le_bytes());
            out.extend(8u16.to_le_bytes());
            out.extend(0x5a21_6000u32.to_le_bytes());
            out.extend(crc.to_le_bytes());
            out.extend((data.len() as u32).to_le_bytes());
            out.extend((content.len() as u32).to_le_bytes());
            out.extend((name.len() as u16).to_le_bytes());
            out.extend(0u16.to_le_bytes());
        };
        fixed(0x0403_4b50, &mut out, false);
        out.extend(*name);
        out.extend(data);
        fixed(0x0201_4b50, &mut central, true);
        central.extend([0u8; 6]);
        central.extend(0u32.to_le_bytes());
        central.extend(offset.to_le_bytes());
        central.extend(*name);
    }
    let cd_offset = out.len() as u32;
    out.extend(&central);
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0u8; 4]);
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(cd_offset.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

const TYPES: &[u8] = b"<?xml version=\"1.0\"?><Types xmlns=\"http://schemas.openxmlformats.org/package/2006/content-types\"/>";

/// A legitimate document: two members deflated by zlib.
fn legit_doc(seed: u64) -> Vec<u8> {
    zip(&[Member::new(b"[Content_Types].xml", TYPES), Member::new(b"word/document.xml", document_xml(2000, seed))])
}

/// The same document whose `word/document.xml` is `blocks` empty deflate blocks.
fn hostile_doc(blocks: usize) -> Vec<u8> {
    let types = ec_patch::deflate::deflate(TYPES, common::ZLIB6).unwrap();
    zip_deflated(&[(b"[Content_Types].xml", types, TYPES.to_vec()), (b"word/document.xml", empty_blocks(blocks), Vec::new())])
}

/// Limits under which diff still makes a preflate recipe of any stream:
/// how an attacker makes the hostile patch (the generator, not the test).
fn attacker_limits() -> Limits {
    Limits { preflate_block_allowance: u64::MAX, ..Limits::default() }
}

/// The hostile patch: legit base → hostile document, the empty-block member
/// rebuilt by a preflate recipe. Cached in the test's temporary folder
/// (preflate's analysis of a million blocks takes a few seconds).
fn hostile_patch(base: &[u8], blocks: usize) -> Vec<u8> {
    let cache = tmp().join(format!("hostile-patch-{blocks}-{:016x}.ecp", fxhash(base)));
    if let Ok(p) = std::fs::read(&cache) {
        return p;
    }
    let new = hostile_doc(blocks);
    let p = diff(base, &new, &DiffOptions { limits: attacker_limits(), ..Default::default() }).unwrap();
    let preflate = match &p.body {
        Body::Zip(z) => z.segments.iter().any(|s| matches!(s, Segment::Member(m) if matches!(m.recipe, Recipe::Preflate(_)))),
        _ => false,
    };
    assert!(preflate, "the generator must make a preflate recipe");
    let bytes = encode(&p);
    std::fs::write(&cache, &bytes).unwrap();
    bytes
}

fn fxhash(b: &[u8]) -> u64 {
    b.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &x| (h ^ u64::from(x)).wrapping_mul(0x100_0000_01b3))
}

fn tmp() -> PathBuf {
    let d = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("hostile_deflate");
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn has_preflate(patch: &[u8]) -> bool {
    match decode(patch, &Limits::default()).unwrap().body {
        Body::Zip(z) => z.segments.iter().any(|s| matches!(s, Segment::Member(m) if matches!(m.recipe, Recipe::Preflate(_)))),
        _ => false,
    }
}

// ---------------------------------------------------------------------------
// The child side: one case, run in a fresh process.

/// What the child does, chosen by `EC_HOSTILE_CASE`; inputs are files in
/// `EC_HOSTILE_DIR` (`base`, `new`, `patch`). Prints one `RESULT ...` line.
#[test]
fn child_entry() {
    let Ok(case) = std::env::var("EC_HOSTILE_CASE") else { return };
    let dir = PathBuf::from(std::env::var("EC_HOSTILE_DIR").unwrap());
    let space = if measuring() { 16 << 30 } else { CHILD_ADDRESS_SPACE };
    let rl = libc::rlimit { rlim_cur: space, rlim_max: space };
    // SAFETY: plain system call on a valid struct.
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_AS, &rl) }, 0);
    let read = |n: &str| std::fs::read(dir.join(n)).unwrap();
    let l = Limits::default();
    let result = match case.as_str() {
        "apply" => match apply_to_vec(&read("base"), &read("patch"), &l) {
            Ok(out) => format!("ok {}", out.len()),
            Err(e) => format!("err {}", e.code()),
        },
        "diff" => {
            let (base, new) = (read("base"), read("new"));
            match diff_verified(&base, &new, &DiffOptions::default()) {
                Ok(p) => {
                    let back = apply_to_vec(&base, &p, &l).map(|o| o == new).unwrap_or(false);
                    format!("ok rebuilds={back} preflate={}", has_preflate(&p))
                }
                Err(e) => format!("err {}", e.code()),
            }
        }
        other => panic!("unknown case {other}"),
    };
    // The high-water mark of this process's own memory (ru_maxrss would
    // also count the parent's, inherited through exec).
    let hwm = vm_hwm(std::process::id() as libc::pid_t).unwrap();
    println!("RESULT {result}");
    println!("HWM {hwm}");
}

/// `EC_HOSTILE_MEASURE=1`: no bound (16 GiB of address space, kill at 8 GiB),
/// to measure what a case costs; the assertions on the bound then still fail.
fn measuring() -> bool {
    std::env::var_os("EC_HOSTILE_MEASURE").is_some()
}

/// `VmHWM` of a process, in bytes: the kernel's peak resident set size.
fn vm_hwm(pid: libc::pid_t) -> Option<u64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    s.lines().find(|l| l.starts_with("VmHWM:")).and_then(|l| l.split_whitespace().nth(1)?.parse::<u64>().ok()).map(|kib| kib * 1024)
}

struct Run {
    result: String,
    peak_rss: u64,
}

/// Runs `case` on the given files in a child; fails if its peak resident
/// memory passes `bound` (it is killed as soon as the kernel's high-water
/// mark does) or it dies.
fn run_child(case: &str, files: &[(&str, &[u8])], bound: u64) -> Run {
    let dir = tmp().join(format!("{case}-{}-{}", std::process::id(), fxhash(files[files.len() - 1].1)));
    std::fs::create_dir_all(&dir).unwrap();
    for (name, bytes) in files {
        std::fs::write(dir.join(name), bytes).unwrap();
    }
    // Reaped below with waitpid (polled, to watch its memory), which clippy cannot see.
    #[allow(clippy::zombie_processes)]
    let child = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "hostile_deflate::child_entry", "--nocapture", "--test-threads=1"])
        .env("EC_HOSTILE_CASE", case)
        .env("EC_HOSTILE_DIR", &dir)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let pid = child.id() as libc::pid_t;
    let start = Instant::now();
    let mut killed_at = None;
    let kill_at = if measuring() { 8 << 30 } else { bound };
    let status = loop {
        let mut status = 0;
        // SAFETY: pid is our child; WNOHANG polls.
        let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        if r == pid {
            break status;
        }
        if killed_at.is_none() {
            let hwm = vm_hwm(pid);
            if hwm.is_some_and(|b| b > kill_at) || start.elapsed() > Duration::from_secs(if measuring() { 600 } else { 120 }) {
                // SAFETY: signalling our own child.
                unsafe { libc::kill(pid, libc::SIGKILL) };
                killed_at = Some(hwm.unwrap_or(0));
            }
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.unwrap(), &mut out).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    if let Some(at) = killed_at {
        panic!(
            "case {case}: peak RSS passed the bound of {} MiB (killed at {:.1} MiB after {:.1} s)",
            bound / MIB,
            at as f64 / MIB as f64,
            start.elapsed().as_secs_f64()
        );
    }
    let field = |key: &str| out.lines().find_map(|l| l.find(key).map(|i| l[i + key.len()..].trim().to_owned()));
    let Some(result) = field("RESULT ") else {
        panic!("case {case}: the child died (wait status {status:#x}) without a result; stdout: {out}")
    };
    let peak_rss: u64 = field("HWM ").and_then(|h| h.parse().ok()).expect("the child reports its peak");
    eprintln!(
        "case {case}: {result}; peak RSS {:.1} MiB (bound {:.1} MiB), {:.2} s",
        peak_rss as f64 / MIB as f64,
        bound as f64 / MIB as f64,
        start.elapsed().as_secs_f64()
    );
    assert!(peak_rss <= bound, "case {case}: peak RSS {peak_rss} over the bound {bound}");
    Run { result, peak_rss }
}

fn bound_for(docs: &[&[u8]]) -> u64 {
    64 * MIB + 2 * docs.iter().map(|d| d.len() as u64).max().unwrap_or(0)
}

// ---------------------------------------------------------------------------
// The cases.

#[test]
fn generator_makes_what_the_issue_describes() {
    let data = empty_blocks(5);
    assert_eq!(data.len(), 7);
    assert_eq!(ec_patch::deflate::inflate(&data, 10).unwrap(), b"");
    assert_eq!(ec_patch::deflate::count_blocks(&data, 10), Some(5));
    assert_eq!(ec_patch::deflate::count_blocks(&data, 4), None);
    let base = legit_doc(1);
    let patch = hostile_patch(&base, APPLY_BLOCKS);
    assert!(patch.len() < 1000, "a million empty blocks in a patch of {} bytes", patch.len());
}

#[test]
fn a_patch_rebuilding_a_million_empty_blocks_is_refused_within_the_bound() {
    let base = legit_doc(1);
    let patch = hostile_patch(&base, APPLY_BLOCKS);
    let new_len = hostile_doc(APPLY_BLOCKS).len();
    let bound = 64 * MIB + 2 * (new_len.max(base.len()) as u64);
    let run = run_child("apply", &[("base", &base), ("patch", &patch)], bound);
    assert_eq!(run.result, "err limit_exceeded", "peak {} bytes", run.peak_rss);
}

#[test]
fn diff_of_a_hostile_new_file_falls_back_to_raw_bytes_within_the_bound() {
    let base = legit_doc(2);
    let new = hostile_doc(DIFF_BLOCKS);
    let run = run_child("diff", &[("base", &base), ("new", &new)], bound_for(&[&base, &new]));
    assert_eq!(run.result, "ok rebuilds=true preflate=false");
}

#[test]
fn diff_against_a_hostile_base_stays_within_the_bound() {
    // The hostile file was downloaded (the base); the user's app saved over it.
    let base = hostile_doc(DIFF_BLOCKS);
    let new = legit_doc(3);
    let run = run_child("diff", &[("base", &base), ("new", &new)], bound_for(&[&base, &new]));
    assert!(run.result.starts_with("ok rebuilds=true"), "{}", run.result);
    // The hostile file edited again, keeping the hostile member: copied by reference.
    let types2 = ec_patch::deflate::deflate(b"<Types/>", common::ZLIB6).unwrap();
    let edited = zip_deflated(&[
        (b"[Content_Types].xml", types2, b"<Types/>".to_vec()),
        (b"word/document.xml", empty_blocks(DIFF_BLOCKS), Vec::new()),
    ]);
    let run = run_child("diff", &[("base", &base), ("new", &edited)], bound_for(&[&base, &edited]));
    assert_eq!(run.result, "ok rebuilds=true preflate=false");
    // And with one block more: a changed member that needs a recipe.
    let more = hostile_doc(DIFF_BLOCKS + 1);
    let run = run_child("diff", &[("base", &base), ("new", &more)], bound_for(&[&base, &more]));
    assert_eq!(run.result, "ok rebuilds=true preflate=false");
}

#[test]
fn a_forged_two_gib_target_reserves_nothing_before_the_checks() {
    let (base, new) = (legit_doc(4), legit_doc(5));
    for binary in [false, true] {
        let mut p = diff(&base, &new, &DiffOptions { force_binary: binary, ..Default::default() }).unwrap();
        p.target_size = (2 << 30) - 1;
        let patch = encode(&p);
        let run = run_child("apply", &[("base", &base), ("patch", &patch)], bound_for(&[&base, &new]));
        assert!(["err codec", "err malformed", "err target_mismatch"].contains(&run.result.as_str()), "binary={binary}: {}", run.result);
    }
}

#[test]
fn legit_preflate_recipes_stay_within_the_default_budget() {
    // A deflate stream with many small blocks, as a real deflater at its
    // smallest memLevel writes it (zlib memLevel 1: blocks of ~127 symbols).
    // Random letters: every symbol a literal, so a block carries ~127 bytes, the fewest any zlib setting puts in one.
    let mut x = 7u64;
    let text: Vec<u8> = (0..200_000)
        .map(|_| {
            x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            b'a' + (x >> 59) as u8
        })
        .collect();
    let params = ec_patch::deflate::ZlibParams { level: 6, mem_level: 1, window_bits: 15, strategy: 0 };
    let data = ec_patch::deflate::deflate(&text, params).unwrap();
    let blocks = ec_patch::deflate::count_blocks(&data, u64::MAX).unwrap();
    assert!(blocks > 1000, "{blocks} blocks");
    assert!(blocks <= Limits::default().preflate_max_blocks(text.len() as u64), "{blocks} blocks for {} bytes", text.len());
    assert!(ec_patch::deflate::preflate_admits(&data, &text, &Limits::default()).is_ok());
    let strict = Limits { preflate_block_allowance: 0, preflate_bytes_per_block: 0, ..Limits::default() };
    assert_eq!(ec_patch::deflate::preflate_admits(&data, &text, &strict), Err(ec_patch::deflate::PreflateRefusal::TooManyBlocks));
    let small = Limits { max_preflate_content: 1000, ..Limits::default() };
    assert_eq!(ec_patch::deflate::preflate_admits(&data, &text, &small), Err(ec_patch::deflate::PreflateRefusal::ContentTooLarge));
}

#[test]
fn a_preflate_recipe_past_the_callers_limits_is_a_typed_error() {
    // A member that only preflate rebuilds (miniz's deflater), then applied
    // under limits that do not admit it: limit_exceeded, never a crash.
    let text = document_xml(1500, 9);
    let data = miniz_oxide_08::deflate::compress_to_vec(&text, 6);
    let types = ec_patch::deflate::deflate(TYPES, common::ZLIB6).unwrap();
    let base = legit_doc(8);
    let new = zip_deflated(&[(b"[Content_Types].xml", types, TYPES.to_vec()), (b"word/document.xml", data, text.clone())]);
    // Version 1: version 2 rebuilds miniz_oxide's stream with recipe 7.
    let v1 = DiffOptions { max_version: Some(1), ..Default::default() };
    let patch = diff_verified(&base, &new, &v1).unwrap();
    assert!(has_preflate(&patch), "miniz's stream needs preflate");
    assert_eq!(apply_to_vec(&base, &patch, &Limits::default()).unwrap(), new);
    for strict in [
        Limits { preflate_block_allowance: 0, preflate_bytes_per_block: 0, ..Limits::default() },
        Limits { max_preflate_content: 100, ..Limits::default() },
    ] {
        assert_eq!(apply_to_vec(&base, &patch, &strict).unwrap_err().code(), "limit_exceeded");
        // diff under the same limits sends the member's bytes instead.
        let p = diff_verified(&base, &new, &DiffOptions { limits: strict, ..v1.clone() }).unwrap();
        assert!(!has_preflate(&p));
        assert_eq!(apply_to_vec(&base, &p, &strict).unwrap(), new);
    }
}
