//! The normalised header stream (spec §6).
//!
//! All ZIP bytes that are not member data (local headers, descriptors,
//! central records, the end record, raw gaps) are concatenated into one
//! stream, coded with zstd against the same stream of the base. Fields that
//! change on every save but can be derived are first XORed with the value
//! they are expected to have, so that they become zero, or equal to the
//! base's, and cost nothing:
//! - DOS timestamps: XOR the previous record's (most writers stamp every
//!   member with the same time, so all but the first become zero);
//! - CRC and sizes in local headers (bit 3 clear) and data descriptors: XOR
//!   the values computed from a rebuilt member, or the declared values of
//!   the base member whose data is copied (and, in the base's own stream,
//!   each member's declared values), so unchanged or consistent fields are zero;
//! - in central records: CRC, sizes and local-header offset XOR those of the
//!   matching local record (the j-th central record matches the j-th local);
//! - in the end record: counts, directory size and offset XOR the actual ones.
//!
//! XOR is its own inverse, so this is exact for any input, regular or not:
//! regularity only decides how small the result is.
//!
//! The base's stream is the frame's reference. A save whose members' times
//! cross a two-second boundary of the DOS clock leaves a time other than
//! the previous one where the run changes, in the local headers and again in
//! the central records; the new file's runs change elsewhere (or nowhere),
//! and each difference of the two costs the frame a few bytes. In version 2
//! the encoder may key the times **fresh** (flag bit 3, edit-patch-v2.md §2):
//! a central record's time with its local header's, in both streams, and in
//! the base's stream every local header's time after the first with its own
//! value, so 0 there, whatever runs the base had.

use crate::renumber::{renumber, Renumbering};
use crate::wire::{le16, le32, le64, xor16, xor32, xor64};

/// Values computed from a rebuilt member's content and data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Computed {
    pub crc: u32,
    pub csize: u64,
    pub usize: u64,
}

#[derive(Debug, Clone, Copy)]
struct LocalInfo {
    time: u32,
    offset: u64,
    crc: u32,
    csize: u64,
    usize: u64,
}

/// Which way a record is transformed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Raw record → stream form (encoder; base stream).
    Normalise,
    /// Stream form → raw record (decoder).
    Restore,
}

/// The running state of the transformation over one archive.
#[derive(Debug)]
pub struct Normaliser {
    dir: Direction,
    prev_time: u32,
    /// Fresh times (flag bit 3): a central record's time keyed with its local header's.
    fresh_times: bool,
    /// With fresh times, in the base's stream: a local header's time after the first keyed with itself.
    own_local_times: bool,
    locals: Vec<LocalInfo>,
    next_central: usize,
    cd_start: Option<u64>,
    cd_bytes: u64,
    cd_count: u64,
}

impl Normaliser {
    /// A state that keys times fresh (flag bit 3) or as version 1 does.
    pub fn with_times(dir: Direction, fresh_times: bool) -> Self {
        Normaliser {
            dir,
            prev_time: 0,
            fresh_times,
            own_local_times: false,
            locals: Vec::new(),
            next_central: 0,
            cd_start: None,
            cd_bytes: 0,
            cd_count: 0,
        }
    }

    /// XORs `key` into the u32 at `at` and returns the field's raw value.
    fn xor_raw32(&self, rec: &mut [u8], at: usize, key: u32) -> u32 {
        let before = le32(rec, at);
        xor32(rec, at, key);
        match self.dir {
            Direction::Normalise => before,
            Direction::Restore => le32(rec, at),
        }
    }

    fn xor_raw64(&self, rec: &mut [u8], at: usize, key: u64) -> u64 {
        let before = le64(rec, at);
        xor64(rec, at, key);
        match self.dir {
            Direction::Normalise => before,
            Direction::Restore => le64(rec, at),
        }
    }

    fn time(&mut self, rec: &mut [u8], at: usize, key: u32) -> u32 {
        self.prev_time = self.xor_raw32(rec, at, key);
        self.prev_time
    }

    /// A local header (at least 30 bytes) at `offset`; `computed` when its data is rebuilt.
    pub fn local(&mut self, rec: &mut [u8], offset: u64, computed: Option<Computed>) {
        let key = match self.own_local_times && !self.locals.is_empty() {
            true => le32(rec, 10),
            false => self.prev_time,
        };
        let time = self.time(rec, 10, key);
        let deferred = le16(rec, 6) & 0x0008 != 0;
        let c = computed.filter(|_| !deferred).unwrap_or(Computed { crc: 0, csize: 0, usize: 0 });
        let crc = self.xor_raw32(rec, 14, c.crc);
        let csize = self.xor_raw32(rec, 18, c.csize as u32);
        let usize = self.xor_raw32(rec, 22, c.usize as u32);
        self.locals.push(LocalInfo { time, offset, crc, csize: csize.into(), usize: usize.into() });
    }

    /// A data descriptor of 12, 16, 20 or 24 bytes after the member `computed` describes.
    pub fn descriptor(&mut self, rec: &mut [u8], computed: Option<Computed>) {
        let s = if rec.len() == 16 || rec.len() == 24 { 4 } else { 0 };
        let c = computed.unwrap_or(Computed { crc: 0, csize: 0, usize: 0 });
        let crc = self.xor_raw32(rec, s, c.crc);
        let (csize, usize) = if rec.len() >= 20 {
            (self.xor_raw64(rec, s + 4, c.csize), self.xor_raw64(rec, s + 12, c.usize))
        } else {
            (u64::from(self.xor_raw32(rec, s + 4, c.csize as u32)), u64::from(self.xor_raw32(rec, s + 8, c.usize as u32)))
        };
        if let Some(last) = self.locals.last_mut() {
            *last = LocalInfo { crc, csize, usize, ..*last };
        }
    }

    /// A central-directory record (at least 46 bytes) at `offset`.
    pub fn central(&mut self, rec: &mut [u8], offset: u64) {
        let local = self.locals.get(self.next_central).copied();
        let key = match (self.fresh_times, local) {
            (true, Some(l)) => l.time,
            _ => self.prev_time,
        };
        self.time(rec, 12, key);
        if let Some(l) = local {
            xor32(rec, 16, l.crc);
            xor32(rec, 20, l.csize as u32);
            xor32(rec, 24, l.usize as u32);
            xor32(rec, 42, l.offset as u32);
        }
        self.next_central += 1;
        self.cd_start.get_or_insert(offset);
        self.cd_bytes += rec.len() as u64;
        self.cd_count += 1;
    }

    /// The end-of-central-directory record (at least 22 bytes).
    pub fn eocd(&mut self, rec: &mut [u8]) {
        xor16(rec, 8, self.cd_count as u16);
        xor16(rec, 10, self.cd_count as u16);
        xor32(rec, 12, self.cd_bytes as u32);
        xor32(rec, 16, self.cd_start.unwrap_or(0) as u32);
    }
}

/// The values a member's headers declare, as the scanner found them: the
/// key for members whose data is copied, and for every member of the base.
pub fn declared(e: &crate::zip::Entry) -> Computed {
    Computed { crc: e.crc, csize: e.data_len, usize: e.declared_size }
}

/// Builds the normalised header stream of an archive: every non-data region
/// in file order, records transformed, raw regions verbatim. `computed(e)`
/// gives the key values of member `e`: computed from its content when the
/// patch rebuilds it, the declared values of the base member when its data is
/// copied, and each base member's own declared values for the base stream.
/// With `fresh_times` (version 2, flag bit 3), a central record's time is
/// keyed with its local header's (edit-patch-v2.md §2).
pub fn header_stream(
    data: &[u8],
    layout: &crate::zip::ZipLayout,
    computed: impl Fn(usize) -> Option<Computed>,
    fresh_times: bool,
) -> Vec<u8> {
    stream(data, layout, computed, fresh_times, false, None).expect("no names renumbered, no bound")
}

/// The base's header stream, the reference of the header frame (§6.5): each
/// base member keyed with its declared values; with `fresh_times` (version 2,
/// flag bit 3), the time of every local header after the first keyed with its
/// own value, so 0, and a central record's time with its local header's
/// (edit-patch-v2.md §2). With a name map (version 2, flag bit 4, members
/// renumbered), the file name of every local header and central record is
/// renumbered by it, and its length field follows; `None` when the names grow
/// by more than `max_growth` bytes in all.
pub fn base_reference(
    base: &[u8],
    layout: &crate::zip::ZipLayout,
    fresh_times: bool,
    renamed: &Renumbering,
    max_growth: u64,
) -> Option<Vec<u8>> {
    let names = (!renamed.is_empty()).then_some((renamed, max_growth));
    stream(base, layout, |e| Some(declared(&layout.entries[e])), fresh_times, true, names)
}

/// The file name of a local header (`fixed` 30, its length at 26) or a
/// central record (46, at 28) at `start` of `out`, renumbered by `map` in
/// place, its length field following mod 2^16 (edit-patch-v2.md §2, flag bit
/// 4). `growth` is what the names may still grow by; `None` past it.
fn renumber_name(out: &mut Vec<u8>, start: usize, fixed: usize, len_at: usize, map: &Renumbering, growth: &mut u64) -> Option<()> {
    let rec = &out[start..];
    if rec.len() < fixed {
        return Some(());
    }
    let n = usize::from(le16(rec, len_at)).min(rec.len() - fixed);
    let name = &rec[fixed..fixed + n];
    let new = renumber(name, map, (n as u64).saturating_add(*growth))?;
    *growth -= new.len().saturating_sub(n) as u64;
    out[start + len_at..start + len_at + 2].copy_from_slice(&(new.len() as u16).to_le_bytes());
    out.splice(start + fixed..start + fixed + n, new);
    Some(())
}

/// Whether the local and central records of an archive carry more than one
/// time: only then can fresh times (flag bit 3) make another reference.
pub fn times_differ(data: &[u8], layout: &crate::zip::ZipLayout) -> bool {
    use crate::zip::RegionKind;
    let mut times = layout.regions.iter().filter_map(|r| {
        let at = match r.kind {
            RegionKind::Local => 10,
            RegionKind::Central => 12,
            _ => return None,
        };
        (r.len >= at + 4).then(|| le32(data, (r.offset + at) as usize))
    });
    times.next().is_some_and(|first| times.any(|t| t != first))
}

fn stream(
    data: &[u8],
    layout: &crate::zip::ZipLayout,
    computed: impl Fn(usize) -> Option<Computed>,
    fresh_times: bool,
    reference: bool,
    names: Option<(&Renumbering, u64)>,
) -> Option<Vec<u8>> {
    use crate::zip::RegionKind;
    let mut growth = names.map_or(0, |(_, g)| g);
    let mut n = Normaliser::with_times(Direction::Normalise, fresh_times);
    n.own_local_times = fresh_times && reference;
    let mut out = Vec::new();
    let mut last = None;
    for (i, r) in layout.regions.iter().enumerate() {
        let bytes = &data[r.offset as usize..(r.offset + r.len) as usize];
        if let RegionKind::Data { entry } = r.kind {
            last = computed(entry);
            continue;
        }
        let start = out.len();
        out.extend_from_slice(bytes);
        let rec = &mut out[start..];
        match r.kind {
            RegionKind::Local => {
                let next = match layout.regions.get(i + 1).map(|r| r.kind) {
                    Some(RegionKind::Data { entry }) => computed(entry),
                    _ => None,
                };
                n.local(rec, r.offset, next);
                if let Some((map, _)) = names {
                    renumber_name(&mut out, start, 30, 26, map, &mut growth)?;
                }
            }
            RegionKind::Descriptor => n.descriptor(rec, last),
            RegionKind::Central => {
                n.central(rec, r.offset);
                if let Some((map, _)) = names {
                    renumber_name(&mut out, start, 46, 28, map, &mut growth)?;
                }
            }
            RegionKind::Eocd => n.eocd(rec),
            RegionKind::Raw | RegionKind::Data { .. } => {}
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalise_then_restore_is_identity() {
        let mut l0: Vec<u8> = (0..40u8).collect();
        l0[6] = 0;
        let (c0, e0): (Vec<u8>, Vec<u8>) = ((100..160u8).collect(), (7..29u8).collect());
        let comp = Some(Computed { crc: 0xdead_beef, csize: 1234, usize: 99_999 });
        for fresh in [false, true] {
            let (mut local, mut central, mut eocd) = (l0.clone(), c0.clone(), e0.clone());
            let mut n = Normaliser::with_times(Direction::Normalise, fresh);
            n.local(&mut local, 0, comp);
            n.central(&mut central, 500);
            n.eocd(&mut eocd);
            assert_ne!(local, l0);
            let mut r = Normaliser::with_times(Direction::Restore, fresh);
            r.local(&mut local, 0, comp);
            r.central(&mut central, 500);
            r.eocd(&mut eocd);
            assert_eq!((&local, &central, &eocd), (&l0, &c0, &e0));
        }
    }

    #[test]
    fn fresh_times_key_a_central_time_with_its_local_one() {
        let stamped = |len: usize, at: usize, time: u32| {
            let mut r = vec![0u8; len];
            r[at..at + 4].copy_from_slice(&time.to_le_bytes());
            r
        };
        // Two members, the second stamped 2 s later (a save that crossed a boundary).
        let (t, u) = (0x5B81_0A2Cu32, 0x5B81_0A2Du32);
        let run = |fresh: bool, own: bool| {
            let mut n = Normaliser::with_times(Direction::Normalise, fresh);
            n.own_local_times = own;
            let mut out = Vec::new();
            for (len, at, time) in [(30, 10, t), (30, 10, u), (46, 12, t), (46, 12, u)] {
                let mut rec = stamped(len, at, time);
                match len {
                    30 => n.local(&mut rec, 0, None),
                    _ => n.central(&mut rec, 0),
                }
                out.push(le32(&rec, at));
            }
            out
        };
        // Version 1's keys: each time against the one before, a change at every step of the runs.
        assert_eq!(run(false, false), [t, t ^ u, u ^ t, t ^ u]);
        // Fresh: a central time against its local one (0), the local times as before.
        assert_eq!(run(true, false), [t, t ^ u, 0, 0]);
        // The base's stream with fresh times: every time but the first is 0.
        assert_eq!(run(true, true), [t, 0, 0, 0]);
    }
}
