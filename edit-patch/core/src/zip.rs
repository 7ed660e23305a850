//! A tolerant ZIP layout scanner.
//!
//! It does not extract files; it tiles a ZIP archive into regions (local
//! headers, member data, data descriptors, central-directory records, the
//! end record, and raw bytes for everything else) so that the patch can copy
//! unchanged regions and rebuild changed ones, byte for byte. Every byte of
//! the input belongs to exactly one region, so concatenating the regions
//! always gives the input back, whatever the archive's quirks.
//!
//! Two strategies, tried in order:
//! 1. **Central directory**: find the end record, walk the directory, visit
//!    each local header it points at (shared offsets are visited once).
//!    Member sizes come from the directory (ZIP64 extra fields honoured).
//! 2. **Forward scan**, for archives with no usable directory (truncated
//!    downloads): walk local headers from offset 0; a member whose size is
//!    deferred to a data descriptor is measured by inflating it.
//!
//! Members overlapping each other or the directory make the archive
//! unusable for structured patching ([`ZipScanError`]); callers then fall
//! back to a generic binary delta. The scanner is deterministic: the patch
//! decoder re-runs it on the base and must see exactly what the encoder saw.
//! Its rules are part of the format (docs/spec/edit-patch-v1.md, section 5).

use crate::deflate;
use crate::wire::{le16, le32, le64};

pub const SIG_LOCAL: u32 = 0x0403_4b50;
pub const SIG_CENTRAL: u32 = 0x0201_4b50;
pub const SIG_EOCD: u32 = 0x0605_4b50;
pub const SIG_DESCRIPTOR: u32 = 0x0807_4b50;
pub const SIG_ZIP64_LOCATOR: u32 = 0x0706_4b50;
pub const SIG_ZIP64_EOCD: u32 = 0x0606_4b50;

pub const LOCAL_FIXED: usize = 30;
pub const CENTRAL_FIXED: usize = 46;
pub const EOCD_FIXED: usize = 22;

/// Why an input cannot be patched structurally.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ZipScanError {
    /// No local header at offset 0 and no end record: not a ZIP at all.
    NotZip,
    /// A ZIP whose structure is inconsistent (overlaps, out-of-range offsets).
    Inconsistent(String),
}

impl std::fmt::Display for ZipScanError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ZipScanError::NotZip => write!(f, "not a ZIP archive"),
            ZipScanError::Inconsistent(s) => write!(f, "inconsistent ZIP structure: {s}"),
        }
    }
}

/// The kind of bytes a region holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RegionKind {
    /// A local file header (signature, fixed fields, name, extra).
    Local,
    /// The compressed data of member `entry` (index into [`ZipLayout::entries`]).
    Data { entry: usize },
    /// A data descriptor following member data.
    Descriptor,
    /// One central-directory file header.
    Central,
    /// The end-of-central-directory record with its comment.
    Eocd,
    /// Anything else: preambles, gaps, ZIP64 end records, trailing bytes.
    Raw,
}

/// A run of input bytes of one kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    pub kind: RegionKind,
    pub offset: u64,
    pub len: u64,
}

/// One member as found in the archive (in file order of local headers).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Member name as stored (no decoding, no sanitising: names are never used as paths).
    pub name: Vec<u8>,
    pub local_offset: u64,
    pub method: u16,
    pub flags: u16,
    pub data_offset: u64,
    /// Length of the compressed data.
    pub data_len: u64,
    /// CRC-32 of the uncompressed content as the archive declares it.
    pub crc: u32,
    /// Uncompressed size as the archive declares it (untrusted).
    pub declared_size: u64,
}

/// The tiling of an archive into regions, plus its members.
#[derive(Debug, Clone, Default)]
pub struct ZipLayout {
    pub regions: Vec<Region>,
    pub entries: Vec<Entry>,
    /// True when the layout came from the forward scan (no usable directory).
    pub forward_scanned: bool,
}

struct Found {
    local_offset: u64,
    header_len: u64,
    data_len: u64,
    descriptor_len: u64,
    entry: Entry,
}

/// The most a member measured by the forward scan may inflate to. A format
/// constant, not a local limit: encoder and decoder must tile a base alike.
/// Measuring streams through a CRC, so it costs time, not memory.
pub const SCAN_INFLATE_LIMIT: u64 = 1 << 30;

/// Scans `data` into a [`ZipLayout`].
pub fn scan(data: &[u8]) -> Result<ZipLayout, ZipScanError> {
    if let Some(eocd) = find_eocd(data) {
        match scan_with_directory(data, eocd) {
            Ok(layout) => return Ok(layout),
            Err(e) => {
                // A directory that lies: fall back to the forward scan only if
                // the file starts like a ZIP; otherwise report the directory's fault.
                if !starts_with_local(data) {
                    return Err(e);
                }
            }
        }
    }
    if !starts_with_local(data) {
        return Err(ZipScanError::NotZip);
    }
    scan_forward(data)
}

fn starts_with_local(data: &[u8]) -> bool {
    data.len() >= 4 && le32(data, 0) == SIG_LOCAL
}

/// The last end record whose comment fits the file; one that ends exactly at
/// the end of the file is preferred.
fn find_eocd(data: &[u8]) -> Option<usize> {
    if data.len() < EOCD_FIXED {
        return None;
    }
    let lowest = data.len().saturating_sub(EOCD_FIXED + 0xffff);
    let mut fallback = None;
    let mut at = data.len() - EOCD_FIXED;
    loop {
        if le32(data, at) == SIG_EOCD {
            let end = at + EOCD_FIXED + le16(data, at + 20) as usize;
            if end == data.len() {
                return Some(at);
            }
            if end < data.len() && fallback.is_none() {
                fallback = Some(at);
            }
        }
        if at == lowest {
            return fallback;
        }
        at -= 1;
    }
}

struct Directory {
    cd_offset: u64,
    cd_end: u64,
}

fn directory_bounds(data: &[u8], eocd: usize) -> Result<Directory, ZipScanError> {
    let mut cd_size = u64::from(le32(data, eocd + 12));
    let mut cd_offset = u64::from(le32(data, eocd + 16));
    let needs64 = cd_size == 0xffff_ffff || cd_offset == 0xffff_ffff || le16(data, eocd + 10) == 0xffff;
    if needs64 && eocd >= 20 && le32(data, eocd - 20) == SIG_ZIP64_LOCATOR {
        let rec = le64(data, eocd - 20 + 8);
        if rec.checked_add(56).is_some_and(|end| end <= data.len() as u64) && le32(data, rec as usize) == SIG_ZIP64_EOCD {
            cd_size = le64(data, rec as usize + 40);
            cd_offset = le64(data, rec as usize + 48);
        }
    }
    let cd_end = cd_offset.checked_add(cd_size).filter(|&e| e <= eocd as u64).ok_or_else(|| {
        ZipScanError::Inconsistent(format!("central directory at {cd_offset}+{cd_size} runs past the end record at {eocd}"))
    })?;
    Ok(Directory { cd_offset, cd_end })
}

/// Values a ZIP64 extended-information extra field replaces, in its fixed order.
fn zip64_values(extra: &[u8], want_usize: bool, want_csize: bool, want_offset: bool) -> (Option<u64>, Option<u64>, Option<u64>) {
    let mut i = 0;
    while i + 4 <= extra.len() {
        let id = le16(extra, i);
        let len = le16(extra, i + 2) as usize;
        let body_end = (i + 4 + len).min(extra.len());
        if id == 0x0001 {
            let body = &extra[i + 4..body_end];
            let mut p = 0;
            let mut next = |want: bool| -> Option<u64> {
                if want && p + 8 <= body.len() {
                    let v = le64(body, p);
                    p += 8;
                    Some(v)
                } else {
                    None
                }
            };
            let u = next(want_usize);
            let c = next(want_csize);
            let o = next(want_offset);
            return (u, c, o);
        }
        i = body_end;
    }
    (None, None, None)
}

fn scan_with_directory(data: &[u8], eocd: usize) -> Result<ZipLayout, ZipScanError> {
    let dir = directory_bounds(data, eocd)?;
    let mut centrals: Vec<(u64, u64)> = Vec::new();
    let mut found: Vec<Found> = Vec::new();
    let mut seen_locals = std::collections::HashSet::new();
    let mut pos = dir.cd_offset;
    while pos + CENTRAL_FIXED as u64 <= dir.cd_end && le32(data, pos as usize) == SIG_CENTRAL {
        let p = pos as usize;
        let (n, m, k) = (le16(data, p + 28) as usize, le16(data, p + 30) as usize, le16(data, p + 32) as usize);
        let len = (CENTRAL_FIXED + n + m + k) as u64;
        if pos + len > dir.cd_end {
            return Err(ZipScanError::Inconsistent(format!("central record at {pos} runs past the directory end")));
        }
        centrals.push((pos, len));
        let extra = &data[p + CENTRAL_FIXED + n..p + CENTRAL_FIXED + n + m];
        let (mut csize, mut usize_, mut local) =
            (u64::from(le32(data, p + 20)), u64::from(le32(data, p + 24)), u64::from(le32(data, p + 42)));
        let (u64v, c64v, o64v) = zip64_values(extra, usize_ == 0xffff_ffff, csize == 0xffff_ffff, local == 0xffff_ffff);
        usize_ = u64v.unwrap_or(usize_);
        csize = c64v.unwrap_or(csize);
        local = o64v.unwrap_or(local);
        if seen_locals.insert(local) {
            let f = visit_local(data, local, csize, le32(data, p + 16), usize_, dir.cd_offset)?;
            found.push(f);
        }
        pos += len;
    }
    if centrals.is_empty() && dir.cd_end > dir.cd_offset {
        return Err(ZipScanError::Inconsistent("end record points at no central directory".into()));
    }
    found.sort_by_key(|f| f.local_offset);
    let mut regions = Vec::new();
    let mut entries = Vec::new();
    let mut cursor = 0u64;
    for f in found {
        if f.local_offset < cursor {
            return Err(ZipScanError::Inconsistent(format!("member at {} overlaps the previous one", f.local_offset)));
        }
        push_raw(&mut regions, cursor, f.local_offset);
        cursor = push_member(&mut regions, &mut entries, f);
    }
    if cursor > dir.cd_offset {
        return Err(ZipScanError::Inconsistent("member data overlaps the central directory".into()));
    }
    for (off, len) in centrals {
        push_raw(&mut regions, cursor, off);
        regions.push(Region { kind: RegionKind::Central, offset: off, len });
        cursor = off + len;
    }
    push_raw(&mut regions, cursor, eocd as u64);
    let eocd_len = (EOCD_FIXED + le16(data, eocd + 20) as usize) as u64;
    regions.push(Region { kind: RegionKind::Eocd, offset: eocd as u64, len: eocd_len });
    push_raw(&mut regions, eocd as u64 + eocd_len, data.len() as u64);
    Ok(ZipLayout { regions, entries, forward_scanned: false })
}

fn push_raw(regions: &mut Vec<Region>, from: u64, to: u64) {
    if to > from {
        regions.push(Region { kind: RegionKind::Raw, offset: from, len: to - from });
    }
}

fn push_member(regions: &mut Vec<Region>, entries: &mut Vec<Entry>, f: Found) -> u64 {
    let idx = entries.len();
    regions.push(Region { kind: RegionKind::Local, offset: f.local_offset, len: f.header_len });
    regions.push(Region { kind: RegionKind::Data { entry: idx }, offset: f.entry.data_offset, len: f.data_len });
    let mut end = f.entry.data_offset + f.data_len;
    if f.descriptor_len > 0 {
        regions.push(Region { kind: RegionKind::Descriptor, offset: end, len: f.descriptor_len });
        end += f.descriptor_len;
    }
    entries.push(f.entry);
    end
}

/// Reads the local header at `off`; `csize`, `crc`, `usize_` come from the directory.
fn visit_local(data: &[u8], off: u64, csize: u64, crc: u32, usize_: u64, limit: u64) -> Result<Found, ZipScanError> {
    let bad = |what: &str| ZipScanError::Inconsistent(format!("local header at {off}: {what}"));
    if off.checked_add(LOCAL_FIXED as u64).is_none_or(|end| end > limit) || le32(data, off as usize) != SIG_LOCAL {
        return Err(bad("missing or out of range"));
    }
    let p = off as usize;
    let header_len = (LOCAL_FIXED + le16(data, p + 26) as usize + le16(data, p + 28) as usize) as u64;
    let data_offset = off + header_len;
    let data_end =
        data_offset.checked_add(csize).filter(|&e| e <= limit).ok_or_else(|| bad("member data runs past the central directory"))?;
    let flags = le16(data, p + 6);
    let descriptor_len = if flags & 0x0008 != 0 { descriptor_at(data, data_end, limit, crc, csize, usize_) } else { 0 };
    let name = data[p + LOCAL_FIXED..p + LOCAL_FIXED + le16(data, p + 26) as usize].to_vec();
    Ok(Found {
        local_offset: off,
        header_len,
        data_len: csize,
        descriptor_len,
        entry: Entry {
            name,
            local_offset: off,
            method: le16(data, p + 8),
            flags,
            data_offset,
            data_len: csize,
            crc,
            declared_size: usize_,
        },
    })
}

/// Length of a data descriptor at `at` that agrees with the known values, or 0.
/// Forms tried: with signature 16 / 24 bytes, without 12 / 20 bytes.
fn descriptor_at(data: &[u8], at: u64, limit: u64, crc: u32, csize: u64, usize_: u64) -> u64 {
    let avail = limit.saturating_sub(at);
    let a = at as usize;
    let fits = |n: u64| n <= avail;
    let has_sig = fits(4) && le32(data, a) == SIG_DESCRIPTOR;
    let base = if has_sig { 4 } else { 0 };
    if fits(base as u64 + 12) && le32(data, a + base) == crc {
        if le32(data, a + base + 4) as u64 == (csize & 0xffff_ffff) && le32(data, a + base + 8) as u64 == (usize_ & 0xffff_ffff) {
            return base as u64 + 12;
        }
        if fits(base as u64 + 20) && le64(data, a + base + 4) == csize && le64(data, a + base + 12) == usize_ {
            return base as u64 + 20;
        }
    }
    0
}

/// Walks local headers from offset 0 (no usable central directory).
fn scan_forward(data: &[u8]) -> Result<ZipLayout, ZipScanError> {
    let mut regions = Vec::new();
    let mut entries = Vec::new();
    let mut pos = 0u64;
    let len = data.len() as u64;
    while pos + LOCAL_FIXED as u64 <= len && le32(data, pos as usize) == SIG_LOCAL {
        let p = pos as usize;
        let n = le16(data, p + 26) as usize;
        let header_len = (LOCAL_FIXED + n + le16(data, p + 28) as usize) as u64;
        let data_offset = pos + header_len;
        if data_offset > len {
            break;
        }
        let flags = le16(data, p + 6);
        let method = le16(data, p + 8);
        let mut crc = le32(data, p + 14);
        let mut csize = u64::from(le32(data, p + 18));
        let mut usize_ = u64::from(le32(data, p + 22));
        let mut descriptor_len = 0;
        if flags & 0x0008 != 0 {
            // Sizes deferred: only a deflate stream can be measured.
            if method != 8 {
                break;
            }
            let Some((consumed, produced, c)) = deflate::measure(&data[data_offset as usize..], SCAN_INFLATE_LIMIT) else { break };
            csize = consumed;
            usize_ = produced;
            crc = c;
            descriptor_len = descriptor_at(data, data_offset + csize, len, crc, csize, usize_);
        } else if csize == 0xffff_ffff {
            let extra = &data[p + LOCAL_FIXED + n..(data_offset as usize)];
            match zip64_values(extra, usize_ == 0xffff_ffff, true, false) {
                (u, Some(c), _) => {
                    csize = c;
                    usize_ = u.unwrap_or(usize_);
                }
                _ => break,
            }
        }
        if data_offset.checked_add(csize).is_none_or(|end| end > len) {
            break;
        }
        let f = Found {
            local_offset: pos,
            header_len,
            data_len: csize,
            descriptor_len,
            entry: Entry {
                name: data[p + LOCAL_FIXED..p + LOCAL_FIXED + n].to_vec(),
                local_offset: pos,
                method,
                flags,
                data_offset,
                data_len: csize,
                crc,
                declared_size: usize_,
            },
        };
        pos = push_member(&mut regions, &mut entries, f);
    }
    if entries.is_empty() {
        return Err(ZipScanError::NotZip);
    }
    push_raw(&mut regions, pos, len);
    Ok(ZipLayout { regions, entries, forward_scanned: true })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tiles(layout: &ZipLayout, len: u64) -> bool {
        let mut at = 0;
        for r in &layout.regions {
            if r.offset != at {
                return false;
            }
            at += r.len;
        }
        at == len
    }

    #[test]
    fn hostile_offsets_do_not_overflow() {
        // An end record whose ZIP64 locator points near u64::MAX, and a
        // directory whose local offset and ZIP64 sizes are absurd.
        let mut f = vec![0u8; 64];
        f[..4].copy_from_slice(&SIG_ZIP64_LOCATOR.to_le_bytes());
        f[8..16].copy_from_slice(&(u64::MAX - 10).to_le_bytes());
        f.extend_from_slice(&SIG_EOCD.to_le_bytes());
        f.extend_from_slice(&[0, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0]);
        let _ = scan(&f);
        let mut local = SIG_LOCAL.to_le_bytes().to_vec();
        local.extend_from_slice(&[20, 0, 0, 0, 8, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        local.extend_from_slice(&0xffff_ffffu32.to_le_bytes());
        local.extend_from_slice(&0xffff_ffffu32.to_le_bytes());
        local.extend_from_slice(&[0, 0, 20, 0]);
        local.extend_from_slice(&[1, 0, 16, 0]);
        local.extend_from_slice(&(u64::MAX - 5).to_le_bytes());
        local.extend_from_slice(&(u64::MAX - 5).to_le_bytes());
        local.extend_from_slice(b"tail");
        if let Ok(l) = scan(&local) {
            assert!(tiles(&l, local.len() as u64));
        }
    }

    #[test]
    fn not_a_zip() {
        assert_eq!(scan(b"hello world, not a zip at all").unwrap_err(), ZipScanError::NotZip);
        assert_eq!(scan(b"").unwrap_err(), ZipScanError::NotZip);
    }

    #[test]
    fn corpus_files_tile_exactly() {
        // The shared folder: EC_SHARED, else ../shared beside the repository (testbed/shared.py).
        let shared = std::env::var_os("EC_SHARED")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
        let root = shared.join("corpus/real");
        let Ok(dirs) = std::fs::read_dir(&root) else { panic!("corpus not found at {}", root.display()) };
        let mut n = 0;
        for d in dirs.flatten().filter(|d| d.path().is_dir()) {
            for f in std::fs::read_dir(d.path()).unwrap().flatten() {
                let bytes = std::fs::read(f.path()).unwrap();
                if let Ok(layout) = scan(&bytes) {
                    assert!(tiles(&layout, bytes.len() as u64), "{} does not tile", f.path().display());
                    n += 1;
                }
            }
        }
        assert!(n > 70, "only {n} corpus files scanned");
    }
}
