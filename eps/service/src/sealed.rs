//! Outcome records at rest (spec §5.4, issue 8): the provider's response to a
//! save names the file and its path (Dropbox `name`, `path_display`) and may
//! hold a capability URL (Graph `@microsoft.graph.downloadUrl`), so it is
//! never written in clear. The record is sealed with a key derived from the
//! request itself: the operation digest and every field of the resolved
//! provider requests, the app's credential (`authorization`, cookies, URL
//! query) included. Neither is on disk: the key exists only in memory while
//! a save, or its retry, is being processed. A retry after a restart carries
//! the same request (same `request_id`, same operation digest) and so
//! re-derives the key and opens the record; nothing in the state folder
//! does.
//!
//! Construction: key = HMAC-SHA-256(`"ec-eps outcome record v2"`, digest ‖
//! heads); encryption key and MAC key are HMACs of that key; the plaintext is
//! XORed with HMAC-SHA-256(enc, nonce ‖ counter) blocks and the record ends
//! with HMAC-SHA-256(mac, header ‖ nonce ‖ ciphertext) (encrypt-then-MAC).

use sha2::{Digest, Sha256};

const BLOCK: usize = 64;

/// HMAC-SHA-256 (RFC 2104) over the concatenation of `parts`.
pub fn hmac(key: &[u8], parts: &[&[u8]]) -> [u8; 32] {
    let mut k = [0u8; BLOCK];
    if key.len() > BLOCK {
        k[..32].copy_from_slice(&Sha256::digest(key));
    } else {
        k[..key.len()].copy_from_slice(key);
    }
    let mut inner = Sha256::new();
    inner.update(k.map(|b| b ^ 0x36));
    for p in parts {
        inner.update(p);
    }
    let mut outer = Sha256::new();
    outer.update(k.map(|b| b ^ 0x5c));
    outer.update(inner.finalize());
    outer.finalize().into()
}

/// Derives a record key from the parts of a request only its sender (and a
/// retry of it) knows.
#[derive(Debug)]
pub struct KeyBuilder(Vec<u8>);

impl KeyBuilder {
    /// Starts with the operation digest.
    pub fn new(digest: &[u8; 32]) -> Self {
        let mut v = Vec::with_capacity(4096);
        v.extend_from_slice(digest);
        KeyBuilder(v)
    }
    /// Adds one length-prefixed part.
    pub fn part(&mut self, p: &[u8]) -> &mut Self {
        self.0.extend_from_slice(&(p.len() as u64).to_le_bytes());
        self.0.extend_from_slice(p);
        self
    }
    /// The key; the material is zeroed.
    pub fn finish(mut self) -> [u8; 32] {
        let k = hmac(b"ec-eps outcome record v2", &[&self.0]);
        self.0.iter_mut().for_each(|b| *b = 0);
        k
    }
}

fn keystream_xor(enc: &[u8; 32], nonce: &[u8; 16], data: &mut [u8]) {
    for (i, chunk) in data.chunks_mut(32).enumerate() {
        let block = hmac(enc, &[nonce, &(i as u64).to_le_bytes()]);
        chunk.iter_mut().zip(block).for_each(|(b, k)| *b ^= k);
    }
}

/// Seals `plain`; `header` (stored in clear in front) is authenticated too.
pub fn seal(key: &[u8; 32], header: &[u8], plain: &[u8]) -> Vec<u8> {
    let nonce: [u8; 16] = rand::random();
    let enc = hmac(key, &[b"enc"]);
    let mac = hmac(key, &[b"mac"]);
    let mut ct = plain.to_vec();
    keystream_xor(&enc, &nonce, &mut ct);
    let tag = hmac(&mac, &[header, &nonce, &ct]);
    let mut out = Vec::with_capacity(16 + ct.len() + 32);
    out.extend_from_slice(&nonce);
    out.extend_from_slice(&ct);
    out.extend_from_slice(&tag);
    out
}

/// Opens what [`seal`] made; `None` when the key or the bytes are wrong.
pub fn open(key: &[u8; 32], header: &[u8], sealed: &[u8]) -> Option<Vec<u8>> {
    if sealed.len() < 48 {
        return None;
    }
    let (nonce, rest) = sealed.split_at(16);
    let (ct, tag) = rest.split_at(rest.len() - 32);
    let mac = hmac(key, &[b"mac"]);
    let want = hmac(&mac, &[header, nonce, ct]);
    // Constant time, as every MAC comparison here.
    if want.iter().zip(tag).fold(0u8, |a, (x, y)| a | (x ^ y)) != 0 {
        return None;
    }
    let enc = hmac(key, &[b"enc"]);
    let mut pt = ct.to_vec();
    keystream_xor(&enc, nonce.try_into().ok()?, &mut pt);
    Some(pt)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hmac_matches_rfc4231_case_2() {
        let got = hmac(b"Jefe", &[b"what do ya want ", b"for nothing?"]);
        assert_eq!(hex::encode(got), "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
    }

    #[test]
    fn sealed_records_open_only_with_their_key() {
        let mut kb = KeyBuilder::new(&[7; 32]);
        kb.part(b"authorization: Bearer x");
        let key = kb.finish();
        let s = seal(&key, b"hdr", b"{\"name\":\"report.docx\"}");
        assert!(!s.windows(6).any(|w| w == b"report"));
        assert_eq!(open(&key, b"hdr", &s).unwrap(), b"{\"name\":\"report.docx\"}");
        assert!(open(&key, b"hdx", &s).is_none());
        assert!(open(&[1; 32], b"hdr", &s).is_none());
    }
}
