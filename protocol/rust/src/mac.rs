//! The message MACs of spec §3.2: the first 16 bytes of HMAC-SHA-256 keyed
//! with the instance secret, over a domain tag, what binds the message to
//! its place (the request path, or the request's MAC), and the structured
//! part *S*. Verification is constant-time.

use hmac::{Hmac, Mac};
use sha2::Sha256;
use subtle::ConstantTimeEq;

/// Length of every MAC.
pub const MAC_LEN: usize = 16;

/// The MAC an ERROR carries when the request's MAC did not verify (§3.2).
pub const ZERO_MAC: [u8; MAC_LEN] = [0; MAC_LEN];

fn hmac16(secret: &[u8], parts: &[&[u8]]) -> [u8; MAC_LEN] {
    let mut m = <Hmac<Sha256> as Mac>::new_from_slice(secret).expect("HMAC takes keys of any length");
    for p in parts {
        m.update(p);
    }
    let full = m.finalize().into_bytes();
    full[..MAC_LEN].try_into().expect("SHA-256 is 32 bytes")
}

/// MAC of a request (HELLO, SAVE, FETCH) sent to `path`: over
/// `"ec1q" ‖ path ‖ 00 ‖ S`.
pub fn request_mac(secret: &[u8], path: &str, s: &[u8]) -> [u8; MAC_LEN] {
    hmac16(secret, &[b"ec1q", path.as_bytes(), &[0], s])
}

/// MAC of a response to the request whose MAC is `req_mac`: over
/// `"ec1r" ‖ req_mac ‖ S`.
pub fn response_mac(secret: &[u8], req_mac: &[u8; MAC_LEN], s: &[u8]) -> [u8; MAC_LEN] {
    hmac16(secret, &[b"ec1r", req_mac, s])
}

/// Constant-time comparison of two MACs.
pub fn macs_equal(a: &[u8; MAC_LEN], b: &[u8; MAC_LEN]) -> bool {
    a.ct_eq(b).into()
}

/// Whether `mac` is the request MAC of `s` sent to `path`.
pub fn verify_request_mac(secret: &[u8], path: &str, s: &[u8], mac: &[u8; MAC_LEN]) -> bool {
    macs_equal(&request_mac(secret, path, s), mac)
}

/// Whether `mac` is the response MAC of `s` answering `req_mac`. A zero
/// MAC never verifies: such an answer is unauthenticated (§3.2).
pub fn verify_response_mac(secret: &[u8], req_mac: &[u8; MAC_LEN], s: &[u8], mac: &[u8; MAC_LEN]) -> bool {
    macs_equal(&response_mac(secret, req_mac, s), mac)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn macs_bind_path_request_and_content() {
        let secret: Vec<u8> = (0u8..32).collect();
        let m = request_mac(&secret, "/ec/1/save", b"abc");
        assert!(verify_request_mac(&secret, "/ec/1/save", b"abc", &m));
        assert!(!verify_request_mac(&secret, "/ec/1/fetch", b"abc", &m));
        assert!(!verify_request_mac(&secret, "/ec/1/save", b"abd", &m));
        assert!(!verify_request_mac(&[0u8; 32], "/ec/1/save", b"abc", &m));
        let r = response_mac(&secret, &m, b"xyz");
        assert!(verify_response_mac(&secret, &m, b"xyz", &r));
        assert!(!verify_response_mac(&secret, &ZERO_MAC, b"xyz", &r));
        assert!(!verify_response_mac(&secret, &m, b"xyz", &ZERO_MAC));
    }

    #[test]
    fn mac_is_hmac_sha256_truncated() {
        // RFC 4231 test case 2: key "Jefe", data "what do ya want for nothing?".
        let full = hex::decode("5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843").unwrap();
        assert_eq!(hmac16(b"Jefe", &[b"what do ya ", b"want for nothing?"]), full[..16]);
    }
}
