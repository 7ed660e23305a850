//! Dropbox `content_hash`, as Dropbox's "Content hash" developer page
//! defines it: split the file into 4,194,304-byte blocks (the last one
//! may be shorter), take the SHA-256 of each block, concatenate those
//! digests, and take the SHA-256 of the concatenation; lower-case hex.
//! An empty file has no blocks, so its hash is the SHA-256 of the empty
//! string. The streaming form keeps one block digest in progress and
//! never buffers file bytes.

use sha2::{Digest, Sha256};

/// Dropbox's block size for `content_hash`: 4 MiB.
pub const DROPBOX_BLOCK_SIZE: usize = 4 * 1024 * 1024;

/// Streaming Dropbox `content_hash`.
#[derive(Debug, Clone, Default)]
pub struct DropboxContentHasher {
    overall: Sha256,
    block: Sha256,
    block_filled: usize,
}

impl DropboxContentHasher {
    /// A hasher that has seen no bytes.
    pub fn new() -> Self {
        Self::default()
    }

    /// Feeds the next bytes of the file; any split gives the same hash.
    pub fn update(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let take = (DROPBOX_BLOCK_SIZE - self.block_filled).min(data.len());
            self.block.update(&data[..take]);
            self.block_filled += take;
            data = &data[take..];
            // A full block is closed at once, so that a file of exactly
            // n blocks never gets an extra empty block at the end.
            if self.block_filled == DROPBOX_BLOCK_SIZE {
                self.close_block();
            }
        }
    }

    fn close_block(&mut self) {
        let digest = std::mem::take(&mut self.block).finalize();
        self.overall.update(digest);
        self.block_filled = 0;
    }

    /// The 32 digest bytes.
    pub fn finalize(mut self) -> [u8; 32] {
        if self.block_filled > 0 {
            self.close_block();
        }
        self.overall.finalize().into()
    }

    /// The value as Dropbox writes it: lower-case hex.
    pub fn finalize_hex(self) -> String {
        hex::encode(self.finalize())
    }
}

/// Dropbox `content_hash` of a whole file, lower-case hex.
pub fn dropbox_content_hash(data: &[u8]) -> String {
    let mut hasher = DropboxContentHasher::new();
    hasher.update(data);
    hasher.finalize_hex()
}
