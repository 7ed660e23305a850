//! Fresh times (edit-patch-v2.md §2, flag bit 3): a save whose members'
//! DOS times cross a two-second boundary changes the time from one member
//! to the next somewhere; a base saved so changes it elsewhere. Keyed as
//! version 1 keys them (each time against the one before, in the local
//! headers and again in the central records), every place where either file
//! changes runs costs the header frame a few bytes; keyed fresh, only the
//! new file's own local change does.

use crate::common;

use common::{zip, Member};
use ec_patch::{apply_to_vec, decode, diff, encode, DiffOptions, Limits, FLAG_FRESH_TIMES};

const T: u32 = 0x5a21_6000;

/// `count` parts, the text of part `edited` changed when given, every
/// member stamped `time`, from member `later_from` on 2 s later.
fn parts(count: usize, time: u32, later_from: usize, edited: Option<usize>) -> Vec<u8> {
    let names: Vec<String> = (1..=count).map(|k| format!("ppt/slides/slide{k}.xml")).collect();
    let members: Vec<Member<'_>> = names
        .iter()
        .enumerate()
        .map(|(k, name)| {
            let word = if edited == Some(k) { "edited" } else { "text" };
            let xml = format!("<p:sld><a:t>Slide {} with some {word} on it</a:t></p:sld>", k + 1).repeat(20);
            Member { time: time + u32::from(k >= later_from), ..Member::new(name.as_bytes(), xml.into_bytes()) }
        })
        .collect();
    zip(&members)
}

fn opts(version: u8) -> DiffOptions {
    DiffOptions { max_version: Some(version), ..DiffOptions::default() }
}

#[test]
fn a_save_across_a_two_second_boundary_costs_about_what_one_in_a_single_stamp_does() {
    let new = parts(300, T + 16, 299, Some(150));
    // The base's members in one run, then across a boundary at member 200.
    let (even, crossed) = (parts(300, T, 300, None), parts(300, T, 200, None));
    let cost = |base: &[u8], version: u8| {
        let packed = encode(&diff(base, &new, &opts(version)).unwrap());
        assert_eq!(apply_to_vec(base, &packed, &Limits::default()).unwrap(), new);
        packed
    };
    let (plain, fresh) = (cost(&even, 2), cost(&crossed, 2));
    assert_ne!(fresh[6] & FLAG_FRESH_TIMES, 0, "keyed fresh: flags {:#x}", fresh[6]);
    // Version 1 keys them as it must: every change of runs costs.
    let v1 = cost(&crossed, 1);
    assert_eq!(v1[6] & FLAG_FRESH_TIMES, 0);
    eprintln!(
        "one run in the base: {} B; across a boundary: {} B (version 1's keys: {} B, 16 bytes more for the whole hash)",
        plain.len(),
        fresh.len(),
        v1.len()
    );
    assert!(fresh.len() <= plain.len() + 4, "{} B across a boundary, {} B in one run", fresh.len(), plain.len());
    assert!(fresh.len() + 16 + 8 <= v1.len(), "fresh {} B, version 1 {} B", fresh.len(), v1.len());
    common::cuts_and_flips_fail_cleanly(&crossed, &new, [&fresh, &common::plain_section(&fresh)]);
}

/// A writer that keeps each file's own time (Info-ZIP re-zipping an
/// unpacked document) gives the new file the base's times but the edited
/// member's: version 1's keys, whose changes repeat the base's, stay.
#[test]
fn times_that_follow_the_base_keep_version_1_keys() {
    let stamp = |edited: Option<usize>| {
        let names: Vec<String> = (1..=60).map(|k| format!("word/part{k}.xml")).collect();
        let members: Vec<Member<'_>> = names
            .iter()
            .enumerate()
            .map(|(k, name)| {
                let time = if edited == Some(k) { T + 0x400 } else { T + (k as u32 % 7) * 0x21 };
                Member { time, ..Member::new(name.as_bytes(), format!("<w:t>part {k}</w:t>").repeat(30 + k).into_bytes()) }
            })
            .collect();
        zip(&members)
    };
    let (base, new) = (stamp(None), stamp(Some(30)));
    let packed = encode(&diff(&base, &new, &opts(2)).unwrap());
    assert_eq!(apply_to_vec(&base, &packed, &Limits::default()).unwrap(), new);
    assert_eq!(packed[6] & FLAG_FRESH_TIMES, 0, "flags {:#x}", packed[6]);
    assert!(decode(&packed, &Limits::default()).is_ok());
}
