//! Google Drive's `md5Checksum`: the MD5 of the file's bytes in
//! lower-case hex. A thin wrapper over the `md-5` crate so that every
//! provider hash in this crate has the same shape.

use md5::{Digest, Md5};

/// Streaming MD5, as Drive reports it in `md5Checksum`.
#[derive(Debug, Clone, Default)]
pub struct Md5Hasher(Md5);

impl Md5Hasher {
    /// A hasher that has seen no bytes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes of the file.
    pub fn update(&mut self, data: &[u8]) {
        self.0.update(data);
    }

    /// The 16 digest bytes.
    pub fn finalize(self) -> [u8; 16] {
        self.0.finalize().into()
    }

    /// The value as Drive writes it: lower-case hex.
    pub fn finalize_hex(self) -> String {
        hex::encode(self.finalize())
    }
}

/// MD5 of a whole file, lower-case hex (Drive `md5Checksum`).
pub fn md5_hex(data: &[u8]) -> String {
    let mut hasher = Md5Hasher::new();
    hasher.update(data);
    hasher.finalize_hex()
}
