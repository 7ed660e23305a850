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
    locals: Vec<LocalInfo>,
    next_central: usize,
    cd_start: Option<u64>,
    cd_bytes: u64,
    cd_count: u64,
}

impl Normaliser {
    pub fn new(dir: Direction) -> Self {
        Normaliser { dir, prev_time: 0, locals: Vec::new(), next_central: 0, cd_start: None, cd_bytes: 0, cd_count: 0 }
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

    fn time(&mut self, rec: &mut [u8], at: usize) {
        self.prev_time = self.xor_raw32(rec, at, self.prev_time);
    }

    /// A local header (at least 30 bytes) at `offset`; `computed` when its data is rebuilt.
    pub fn local(&mut self, rec: &mut [u8], offset: u64, computed: Option<Computed>) {
        self.time(rec, 10);
        let deferred = le16(rec, 6) & 0x0008 != 0;
        let c = computed.filter(|_| !deferred).unwrap_or(Computed { crc: 0, csize: 0, usize: 0 });
        let crc = self.xor_raw32(rec, 14, c.crc);
        let csize = self.xor_raw32(rec, 18, c.csize as u32);
        let usize = self.xor_raw32(rec, 22, c.usize as u32);
        self.locals.push(LocalInfo { offset, crc, csize: csize.into(), usize: usize.into() });
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
            *last = LocalInfo { offset: last.offset, crc, csize, usize };
        }
    }

    /// A central-directory record (at least 46 bytes) at `offset`.
    pub fn central(&mut self, rec: &mut [u8], offset: u64) {
        self.time(rec, 12);
        if let Some(l) = self.locals.get(self.next_central).copied() {
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
pub fn header_stream(data: &[u8], layout: &crate::zip::ZipLayout, computed: impl Fn(usize) -> Option<Computed>) -> Vec<u8> {
    use crate::zip::RegionKind;
    let mut n = Normaliser::new(Direction::Normalise);
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
            }
            RegionKind::Descriptor => n.descriptor(rec, last),
            RegionKind::Central => n.central(rec, r.offset),
            RegionKind::Eocd => n.eocd(rec),
            RegionKind::Raw | RegionKind::Data { .. } => {}
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalise_then_restore_is_identity() {
        let mut local: Vec<u8> = (0..40u8).collect();
        local[6] = 0;
        let mut central: Vec<u8> = (100..160u8).collect();
        let mut eocd: Vec<u8> = (7..29u8).collect();
        let (l0, c0, e0) = (local.clone(), central.clone(), eocd.clone());
        let comp = Some(Computed { crc: 0xdead_beef, csize: 1234, usize: 99_999 });
        let mut n = Normaliser::new(Direction::Normalise);
        n.local(&mut local, 0, comp);
        n.central(&mut central, 500);
        n.eocd(&mut eocd);
        assert_ne!(local, l0);
        let mut r = Normaliser::new(Direction::Restore);
        r.local(&mut local, 0, comp);
        r.central(&mut central, 500);
        r.eocd(&mut eocd);
        assert_eq!((local, central, eocd), (l0, c0, e0));
    }
}
