//! Byte-level reading and writing for the patch format: LEB128 varints,
//! fixed-width little-endian integers and length-prefixed byte strings.
//! The reader never panics and never reads past its slice: every failure is
//! a [`PatchError::Truncated`] or [`PatchError::Malformed`] naming the field.

use crate::error::{PatchError, Result};

/// Appends fields to a growing patch.
#[derive(Debug, Default)]
pub struct Writer {
    pub(crate) buf: Vec<u8>,
}

impl Writer {
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    pub fn varint(&mut self, mut v: u64) {
        loop {
            let byte = (v & 0x7f) as u8;
            v >>= 7;
            if v == 0 {
                self.buf.push(byte);
                return;
            }
            self.buf.push(byte | 0x80);
        }
    }
    /// A varint length followed by that many bytes.
    pub fn blob(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.bytes(b);
    }
}

/// Reads fields from a patch, tracking the offset for error messages.
#[derive(Debug)]
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0 }
    }
    pub fn pos(&self) -> usize {
        self.pos
    }
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
    pub fn u8(&mut self, what: &'static str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    pub fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            return Err(PatchError::Truncated { what, offset: self.pos });
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    /// A LEB128 varint of at most 10 bytes; overlong or overflowing encodings are rejected.
    pub fn varint(&mut self, what: &'static str) -> Result<u64> {
        let start = self.pos;
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.u8(what)?;
            let part = u64::from(b & 0x7f);
            if i == 9 && b > 1 {
                return Err(PatchError::malformed(what, start, "varint overflows 64 bits"));
            }
            v |= part << (7 * i);
            if b & 0x80 == 0 {
                if i > 0 && b == 0 {
                    return Err(PatchError::malformed(what, start, "varint is not in its shortest form"));
                }
                return Ok(v);
            }
        }
        Err(PatchError::malformed(what, start, "varint longer than 10 bytes"))
    }
    /// A varint that must also fit in `usize` and be at most `max`.
    pub fn len_at_most(&mut self, what: &'static str, max: u64) -> Result<usize> {
        let at = self.pos;
        let v = self.varint(what)?;
        if v > max {
            return Err(PatchError::malformed(what, at, format!("{v} exceeds the largest allowed value {max}")));
        }
        usize::try_from(v).map_err(|_| PatchError::malformed(what, at, "does not fit in memory"))
    }
    /// A varint length (bounded by the bytes left) followed by that many bytes.
    pub fn blob(&mut self, what: &'static str) -> Result<&'a [u8]> {
        let at = self.pos;
        let n = self.varint(what)?;
        if n > self.remaining() as u64 {
            return Err(PatchError::Truncated { what, offset: at });
        }
        self.take(n as usize, what)
    }
}

/// Little-endian field access on a record held in a byte slice.
pub(crate) fn le16(b: &[u8], at: usize) -> u16 {
    u16::from_le_bytes([b[at], b[at + 1]])
}
pub(crate) fn le32(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("4 bytes"))
}
pub(crate) fn le64(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("8 bytes"))
}
pub(crate) fn xor16(b: &mut [u8], at: usize, v: u16) {
    let x = le16(b, at) ^ v;
    b[at..at + 2].copy_from_slice(&x.to_le_bytes());
}
pub(crate) fn xor32(b: &mut [u8], at: usize, v: u32) {
    let x = le32(b, at) ^ v;
    b[at..at + 4].copy_from_slice(&x.to_le_bytes());
}
pub(crate) fn xor64(b: &mut [u8], at: usize, v: u64) {
    let x = le64(b, at) ^ v;
    b[at..at + 8].copy_from_slice(&x.to_le_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varint_round_trips_and_rejects_overlong() {
        for v in [0u64, 1, 127, 128, 300, u32::MAX as u64, u64::MAX] {
            let mut w = Writer::default();
            w.varint(v);
            assert_eq!(Reader::new(&w.buf).varint("v").unwrap(), v);
        }
        assert!(matches!(Reader::new(&[0x80, 0x00]).varint("v"), Err(PatchError::Malformed { .. })));
        assert!(matches!(Reader::new(&[0x80]).varint("v"), Err(PatchError::Truncated { .. })));
        assert!(matches!(Reader::new(&[0xff; 11]).varint("v"), Err(PatchError::Malformed { .. })));
    }
}
