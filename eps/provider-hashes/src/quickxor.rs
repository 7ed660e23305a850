//! Microsoft's QuickXorHash, the `quickXorHash` of OneDrive and
//! SharePoint driveItems (Microsoft Graph), following Microsoft's
//! published description ("QuickXorHash" code snippet, OneDrive developer
//! docs) and rclone's `backend/onedrive/quickxorhash`.
//!
//! The state is a 160-bit value. Byte *i* of the file is XORed into it
//! shifted left by (11 · *i*) mod 160 bits, circularly; at the end the
//! file length, as a 64-bit little-endian integer, is XORed into the
//! last 8 of the 20 bytes, and the 20 bytes are reported in base64.
//!
//! Because 11 · 160 is a multiple of 160, bytes whose indices agree
//! modulo 160 get the same shift; XOR being linear, the streaming form
//! first folds the input into a 160-byte accumulator (a plain XOR, which
//! the compiler vectorises) and applies the 160 shifts once, in
//! [`QuickXorHasher::finalize`].
//!
//! The crates.io crate `quickxorhash` (0.1.0, one release) does the
//! same; it is not used because it keeps the length in a `usize` and has
//! had no maintenance, and the algorithm is this short.

use base64::Engine as _;

const WIDTH_BITS: usize = 160;
const WIDTH_BYTES: usize = WIDTH_BITS / 8;
const SHIFT_BITS: usize = 11;
/// Input bytes after which the shift pattern repeats.
const PERIOD: usize = WIDTH_BITS;

/// Streaming QuickXorHash.
#[derive(Debug, Clone)]
pub struct QuickXorHasher {
    folded: [u8; PERIOD],
    /// Index into `folded` of the next input byte.
    position: usize,
    length: u64,
}

impl Default for QuickXorHasher {
    fn default() -> Self {
        Self { folded: [0; PERIOD], position: 0, length: 0 }
    }
}

impl QuickXorHasher {
    /// A hasher that has seen no bytes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes of the file; any split gives the same hash.
    pub fn update(&mut self, data: &[u8]) {
        self.length = self.length.wrapping_add(data.len() as u64);
        let mut rest = data;
        while self.position != 0 && !rest.is_empty() {
            self.folded[self.position] ^= rest[0];
            self.position = (self.position + 1) % PERIOD;
            rest = &rest[1..];
        }
        let mut periods = rest.chunks_exact(PERIOD);
        for period in &mut periods {
            for (acc, byte) in self.folded.iter_mut().zip(period) {
                *acc ^= byte;
            }
        }
        for &byte in periods.remainder() {
            self.folded[self.position] ^= byte;
            self.position += 1;
        }
    }

    /// The 20 hash bytes.
    pub fn finalize(self) -> [u8; WIDTH_BYTES] {
        let mut out = [0u8; WIDTH_BYTES];
        for (index, &byte) in self.folded.iter().enumerate() {
            let shift = (index * SHIFT_BITS) % WIDTH_BITS;
            let (at, bits) = (shift / 8, shift % 8);
            out[at] ^= byte << bits;
            if bits != 0 {
                out[(at + 1) % WIDTH_BYTES] ^= byte >> (8 - bits);
            }
        }
        for (slot, length_byte) in out[WIDTH_BYTES - 8..].iter_mut().zip(self.length.to_le_bytes()) {
            *slot ^= length_byte;
        }
        out
    }

    /// The value as Graph writes it: standard base64 with padding.
    pub fn finalize_base64(self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.finalize())
    }
}

/// QuickXorHash of a whole file, base64 (Graph `quickXorHash`).
pub fn quick_xor_hash(data: &[u8]) -> String {
    let mut hasher = QuickXorHasher::new();
    hasher.update(data);
    hasher.finalize_base64()
}
