//! Byte-level reading and writing: u8, fixed-size arrays, LEB128 varints
//! (at most 64 bits, shortest form, spec §1.2 = patch spec §1.3) and blobs.
//!
//! The [`Reader`] never panics and never reads past its slice. Every failure
//! is a [`ProtoError`] `malformed` naming the field and its offset, because
//! in this protocol a truncated or overlong field is a layout error (§1.2).
//! Lengths are checked against the caller's bound *and* the bytes left
//! before anything is sliced or allocated.

use crate::error::{ErrorCode, ProtoError, Result};

/// Appends fields to a message.
#[derive(Debug, Default, Clone)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty writer.
    pub fn new() -> Self {
        Self::default()
    }
    /// One byte.
    pub fn u8(&mut self, v: u8) {
        self.buf.push(v);
    }
    /// Bytes as they are, with no length.
    pub fn bytes(&mut self, b: &[u8]) {
        self.buf.extend_from_slice(b);
    }
    /// An unsigned LEB128 varint in its shortest form.
    pub fn varint(&mut self, v: u64) {
        put_varint(&mut self.buf, v);
    }
    /// A varint length and that many bytes.
    pub fn blob(&mut self, b: &[u8]) {
        self.varint(b.len() as u64);
        self.bytes(b);
    }
    /// Bytes written so far.
    pub fn len(&self) -> usize {
        self.buf.len()
    }
    /// Whether nothing was written.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
    }
    /// The bytes.
    pub fn into_bytes(self) -> Vec<u8> {
        self.buf
    }
}

/// Appends `v` as a shortest-form LEB128 varint.
pub fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    loop {
        let byte = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(byte);
            return;
        }
        out.push(byte | 0x80);
    }
}

/// `v` as a varint.
pub fn varint_bytes(v: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(10);
    put_varint(&mut out, v);
    out
}

/// Reads fields from a message, tracking the offset for error details.
#[derive(Debug, Clone)]
pub struct Reader<'a> {
    data: &'a [u8],
    pos: usize,
    ran_out: bool,
}

impl<'a> Reader<'a> {
    /// A reader over `data`, starting at its first byte.
    pub fn new(data: &'a [u8]) -> Self {
        Reader { data, pos: 0, ran_out: false }
    }
    /// Offset of the next byte to read.
    pub fn pos(&self) -> usize {
        self.pos
    }
    /// Bytes left.
    pub fn remaining(&self) -> usize {
        self.data.len() - self.pos
    }
    /// Whether a read failed because the data ended (as opposed to a bad
    /// value): lets a caller that bounded the slice tell "too long" apart.
    pub fn ran_out(&self) -> bool {
        self.ran_out
    }
    /// Whether every byte was read.
    pub fn is_at_end(&self) -> bool {
        self.pos == self.data.len()
    }
    /// One byte.
    pub fn u8(&mut self, what: &str) -> Result<u8> {
        Ok(self.take(1, what)?[0])
    }
    /// Exactly `n` bytes.
    pub fn take(&mut self, n: usize, what: &str) -> Result<&'a [u8]> {
        if n > self.remaining() {
            self.ran_out = true;
            return Err(ProtoError::malformed(format!("the message ends inside {what} at byte {}", self.pos)));
        }
        let s = &self.data[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    /// A fixed-size array.
    pub fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N]> {
        Ok(self.take(N, what)?.try_into().expect("take returned N bytes"))
    }
    /// A varint: at most 10 bytes, at most 64 bits, shortest form.
    pub fn varint(&mut self, what: &str) -> Result<u64> {
        let start = self.pos;
        let mut v: u64 = 0;
        for i in 0..10 {
            let b = self.u8(what)?;
            if i == 9 && b > 1 {
                return Err(ProtoError::malformed(format!("{what} at byte {start}: varint over 64 bits")));
            }
            v |= u64::from(b & 0x7f) << (7 * i);
            if b & 0x80 == 0 {
                if i > 0 && b == 0 {
                    return Err(ProtoError::malformed(format!("{what} at byte {start}: varint not in its shortest form")));
                }
                return Ok(v);
            }
        }
        unreachable!("the tenth byte either ends the varint or is rejected")
    }
    /// A varint that must be at most `max`, else `over` (the code the
    /// field's table names).
    pub fn varint_max(&mut self, what: &str, max: u64, over: ErrorCode) -> Result<u64> {
        let at = self.pos;
        let v = self.varint(what)?;
        if v > max {
            return Err(ProtoError::new(over, format!("{what} at byte {at} is {v}, over the limit of {max}")));
        }
        Ok(v)
    }
    /// A count of entries that each take at least `min_entry_len` bytes:
    /// at most `max` (else `over`), and at most what the bytes left can hold
    /// (else `malformed`), so that a caller may allocate for it.
    pub fn count(&mut self, what: &str, max: u64, over: ErrorCode, min_entry_len: usize) -> Result<usize> {
        let at = self.pos;
        let n = self.varint_max(what, max, over)?;
        if n.saturating_mul(min_entry_len.max(1) as u64) > self.remaining() as u64 {
            self.ran_out = true;
            return Err(ProtoError::malformed(format!("the message ends inside the {n} entries of {what} at byte {at}")));
        }
        Ok(n as usize)
    }
    /// A blob of at most `max` bytes (else `over`).
    pub fn blob_max(&mut self, what: &str, max: u64, over: ErrorCode) -> Result<&'a [u8]> {
        let at = self.pos;
        let n = self.varint_max(what, max, over)?;
        if n > self.remaining() as u64 {
            self.ran_out = true;
            return Err(ProtoError::malformed(format!("the message ends inside {what} at byte {at}")));
        }
        self.take(n as usize, what)
    }
    /// A blob bounded only by the bytes left.
    pub fn blob(&mut self, what: &str) -> Result<&'a [u8]> {
        self.blob_max(what, u64::MAX, ErrorCode::Malformed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn varints_follow_the_patch_spec_examples() {
        let cases: [(u64, &[u8]); 7] = [
            (0, &[0x00]),
            (127, &[0x7f]),
            (128, &[0x80, 0x01]),
            (300, &[0xac, 0x02]),
            (131_072, &[0x80, 0x80, 0x08]),
            (1 << 31, &[0x80, 0x80, 0x80, 0x80, 0x08]),
            (u64::MAX, &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01]),
        ];
        for (v, bytes) in cases {
            assert_eq!(varint_bytes(v), bytes);
            let mut r = Reader::new(bytes);
            assert_eq!(r.varint("v").unwrap(), v);
            assert!(r.is_at_end());
        }
    }

    #[test]
    fn bad_varints_are_malformed() {
        for bad in [&[0x80, 0x00][..], &[0x80], &[0xff; 10], &[0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02], &[]] {
            assert_eq!(Reader::new(bad).varint("v").unwrap_err().code, ErrorCode::Malformed, "{bad:02x?}");
        }
    }

    #[test]
    fn counts_and_blobs_are_bounded_before_use() {
        assert_eq!(Reader::new(&[0x05, 1, 2]).blob("b").unwrap_err().code, ErrorCode::Malformed);
        assert_eq!(
            Reader::new(&[0x05, 1, 2, 3, 4, 5]).blob_max("b", 4, ErrorCode::LimitExceeded).unwrap_err().code,
            ErrorCode::LimitExceeded
        );
        assert_eq!(Reader::new(&[0x03, 0, 0]).count("c", 10, ErrorCode::LimitExceeded, 1).unwrap_err().code, ErrorCode::Malformed);
        assert_eq!(Reader::new(&[0x0b]).count("c", 10, ErrorCode::LimitExceeded, 1).unwrap_err().code, ErrorCode::LimitExceeded);
        assert_eq!(Reader::new(&[0x02, 0, 0]).count("c", 10, ErrorCode::LimitExceeded, 1).unwrap(), 2);
    }
}
