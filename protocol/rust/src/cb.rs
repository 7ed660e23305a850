//! Coded bytes (CB, spec §1.3): a byte string sent as SAME as a reference
//! *T* the receiver holds, as an ec-diff DELTA against *T*, or LITERAL.
//!
//! Decoding computes the decoded length from the ec-diff header
//! (|*T*| − `base_mid` + middle length) and checks it against the limit of
//! the value *before* zstd runs, so a hostile frame cannot make the
//! receiver allocate more than the limit. The DELTA itself is applied by
//! `ec_patch::delta`, the reference encoder both implementations share.

use crate::error::{ErrorCode, ProtoError, Result};
use crate::wire::{Reader, Writer};

/// Mode byte of SAME.
pub const CB_SAME: u8 = 0;
/// Mode byte of DELTA.
pub const CB_DELTA: u8 = 1;
/// Mode byte of LITERAL.
pub const CB_LITERAL: u8 = 2;

/// Coded bytes as they travel.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cb {
    /// The value is the reference.
    Same,
    /// An ec-diff that turns the reference into the value.
    Delta(Vec<u8>),
    /// The value itself.
    Literal(Vec<u8>),
}

impl Cb {
    /// Reads a CB. The `data` blob may be at most `max_data` bytes (the
    /// rest of the structured part bounds it anyway); for LITERAL that is
    /// the value's own limit, so a caller passes it with its code.
    pub fn read(r: &mut Reader<'_>, what: &str, literal_max: u64, literal_over: ErrorCode) -> Result<Cb> {
        let at = r.pos();
        match r.u8(what)? {
            CB_SAME => Ok(Cb::Same),
            CB_DELTA => Ok(Cb::Delta(r.blob(what)?.to_vec())),
            CB_LITERAL => Ok(Cb::Literal(r.blob_max(what, literal_max, literal_over)?.to_vec())),
            m => Err(ProtoError::malformed(format!("{what} at byte {at}: unknown CB mode {m}"))),
        }
    }

    /// Appends the CB.
    pub fn write(&self, w: &mut Writer) {
        match self {
            Cb::Same => w.u8(CB_SAME),
            Cb::Delta(d) => {
                w.u8(CB_DELTA);
                w.blob(d);
            }
            Cb::Literal(v) => {
                w.u8(CB_LITERAL);
                w.blob(v);
            }
        }
    }

    /// The mode byte.
    pub fn mode(&self) -> u8 {
        match self {
            Cb::Same => CB_SAME,
            Cb::Delta(_) => CB_DELTA,
            Cb::Literal(_) => CB_LITERAL,
        }
    }

    /// Bytes the CB takes on the wire.
    pub fn wire_len(&self) -> usize {
        match self {
            Cb::Same => 1,
            Cb::Delta(d) | Cb::Literal(d) => 1 + crate::wire::varint_bytes(d.len() as u64).len() + d.len(),
        }
    }

    /// The value, given the reference: at most `limit` bytes, else `over`;
    /// a DELTA that does not apply to `reference` is `malformed`.
    pub fn decode(&self, reference: &[u8], what: &str, limit: u64, over: ErrorCode) -> Result<Vec<u8>> {
        let check = |len: u64| {
            if len > limit {
                Err(ProtoError::new(over, format!("{what} decodes to {len} bytes, over the limit of {limit}")))
            } else {
                Ok(())
            }
        };
        match self {
            Cb::Same => {
                check(reference.len() as u64)?;
                Ok(reference.to_vec())
            }
            Cb::Literal(v) => {
                check(v.len() as u64)?;
                Ok(v.clone())
            }
            Cb::Delta(d) => {
                check(delta_output_len(d, reference.len() as u64, what)?)?;
                // The length is within `limit`, so the part limit only has to admit it.
                let limits = ec_patch::Limits { max_part_size: limit, ..ec_patch::Limits::default() };
                ec_patch::delta::decode_and_apply(reference, d, &limits)
                    .map_err(|e| ProtoError::malformed(format!("{what}: the DELTA does not apply to its reference ({})", e.code())))
            }
        }
    }

    /// The cheapest coding of `value` against `reference`: SAME when equal,
    /// else the shorter of DELTA (the reference encoder) and LITERAL, with
    /// LITERAL on a tie.
    pub fn best(reference: &[u8], value: &[u8]) -> Cb {
        if reference == value {
            return Cb::Same;
        }
        let literal = Cb::Literal(value.to_vec());
        match ec_patch::delta::diff(reference, value) {
            Ok(d) => {
                let delta = Cb::Delta(ec_patch::delta::encode(&d));
                if delta.wire_len() < literal.wire_len() {
                    delta
                } else {
                    literal
                }
            }
            Err(_) => literal,
        }
    }
}

/// The length an ec-diff produces from a reference of `ref_len` bytes, read
/// from its header alone (patch spec §4.2 / Appendix B): `malformed` when
/// the header is cut or replaces bytes the reference does not have.
pub fn delta_output_len(delta: &[u8], ref_len: u64, what: &str) -> Result<u64> {
    let bad = |why: &str| ProtoError::malformed(format!("{what}: the DELTA {why}"));
    let mut r = Reader::new(delta);
    let prefix = r.varint(what).map_err(|_| bad("has a bad header"))?;
    let base_mid = r.varint(what).map_err(|_| bad("has a bad header"))?;
    let mid_len = match r.u8(what).map_err(|_| bad("has a bad header"))? {
        0 => r.varint(what).map_err(|_| bad("has a bad header"))?,
        1 => r.varint(what).map_err(|_| bad("has a bad header"))?,
        _ => return Err(bad("has an unknown middle kind")),
    };
    let kept = prefix.checked_add(base_mid).filter(|&k| k <= ref_len).ok_or_else(|| bad("does not apply to its reference"))?;
    (ref_len - kept).checked_add(prefix).and_then(|v| v.checked_add(mid_len)).ok_or_else(|| bad("declares an impossible length"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn round(reference: &[u8], value: &[u8]) -> Cb {
        let cb = Cb::best(reference, value);
        let mut w = Writer::new();
        cb.write(&mut w);
        let bytes = w.into_bytes();
        assert_eq!(bytes.len(), cb.wire_len());
        let mut r = Reader::new(&bytes);
        let back = Cb::read(&mut r, "cb", u64::MAX, ErrorCode::LimitExceeded).unwrap();
        assert!(r.is_at_end());
        assert_eq!(back, cb);
        assert_eq!(back.decode(reference, "cb", 1 << 20, ErrorCode::LimitExceeded).unwrap(), value);
        cb
    }

    #[test]
    fn best_picks_same_delta_or_literal() {
        let head = b"POST https://content.dropboxapi.com/2/files/upload\nauthorization: Bearer abcdefghijklmnopqrstuvwxyz0123456789\ndropbox-api-arg: {\"path\":\"/a.docx\",\"mode\":{\".tag\":\"update\",\"update\":\"0123456789abcdef\"}}\n";
        assert_eq!(round(head, head), Cb::Same);
        let mut edited = head.to_vec();
        edited[150] = b'9';
        assert!(matches!(round(head, &edited), Cb::Delta(_)));
        assert!(matches!(round(b"", b"xy"), Cb::Literal(_)));
        assert!(matches!(round(b"abc", b""), Cb::Literal(_)));
    }

    #[test]
    fn length_is_checked_before_decoding() {
        let reference = vec![b'a'; 1000];
        let value = vec![b'b'; 5000];
        let cb = Cb::Delta(ec_patch::delta::encode(&ec_patch::delta::diff(&reference, &value).unwrap()));
        assert_eq!(cb.decode(&reference, "head", 4999, ErrorCode::LimitExceeded).unwrap_err().code, ErrorCode::LimitExceeded);
        assert_eq!(cb.decode(&reference, "head", 5000, ErrorCode::LimitExceeded).unwrap(), value);
        // Against a shorter reference the DELTA replaces bytes that do not exist.
        assert_eq!(cb.decode(&reference[..10], "head", 1 << 20, ErrorCode::LimitExceeded).unwrap_err().code, ErrorCode::Malformed);
        assert_eq!(Cb::Literal(vec![0; 11]).decode(b"", "x", 10, ErrorCode::TooLarge).unwrap_err().code, ErrorCode::TooLarge);
        assert_eq!(Cb::Same.decode(&[0; 11], "x", 10, ErrorCode::LimitExceeded).unwrap_err().code, ErrorCode::LimitExceeded);
    }

    #[test]
    fn unknown_mode_is_malformed() {
        let mut r = Reader::new(&[3, 0]);
        assert_eq!(Cb::read(&mut r, "cb", 10, ErrorCode::LimitExceeded).unwrap_err().code, ErrorCode::Malformed);
    }
}
