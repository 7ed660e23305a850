//! Limits that keep hostile input (zip bombs, absurd declared sizes) from
//! exhausting memory or time. Every size the core allocates or inflates is
//! checked against one of these before the work is done.

use crate::error::{PatchError, Result};

/// Bounds applied while diffing and applying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest file (base or target) accepted, in bytes.
    pub max_file_size: u64,
    /// Largest uncompressed size of one ZIP member.
    pub max_part_size: u64,
    /// Largest sum of the uncompressed sizes of all members inflated for one file.
    pub max_total_inflated: u64,
    /// Largest ratio of uncompressed to compressed size for one member
    /// (deflate cannot exceed about 1032:1; anything past this is a bomb).
    pub max_expansion_ratio: u64,
    /// Most segments a patch may list.
    pub max_segments: u64,
    /// Deflate blocks a stream handled by preflate (analysed when diffing,
    /// re-created when applying) may have whatever its size: together with
    /// `preflate_bytes_per_block` this bounds preflate's work, which grows
    /// with the number of blocks even when they are empty. A stream past the
    /// bound gets no preflate recipe when diffing (its bytes are sent raw) and
    /// a patch whose preflate recipe re-creates more blocks is refused
    /// ([`PatchError::LimitExceeded`]).
    pub preflate_block_allowance: u64,
    /// One more deflate block is allowed per this many bytes of the member's
    /// content (real deflaters put thousands of bytes in a block; zlib at
    /// its smallest `memLevel` still about 127). 0: no block beyond the allowance.
    pub preflate_bytes_per_block: u64,
    /// Largest content preflate runs on, in bytes (its memory is about 10x
    /// the content): a larger member gets no preflate recipe when diffing and
    /// a patch with one is refused.
    pub max_preflate_content: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_file_size: 2 << 30,
            max_part_size: 512 << 20,
            max_total_inflated: 2 << 30,
            max_expansion_ratio: 1100,
            max_segments: 4_000_000,
            preflate_block_allowance: 4096,
            preflate_bytes_per_block: 64,
            max_preflate_content: 64 << 20,
        }
    }
}

impl Limits {
    /// Fails with [`PatchError::LimitExceeded`] when `value > limit`.
    pub(crate) fn check(what: &'static str, value: u64, limit: u64) -> Result<()> {
        if value > limit {
            return Err(PatchError::LimitExceeded { what, value, limit });
        }
        Ok(())
    }

    /// The most deflate blocks preflate may handle for a member whose content
    /// has `content_len` bytes.
    pub fn preflate_max_blocks(&self, content_len: u64) -> u64 {
        let by_size = content_len.checked_div(self.preflate_bytes_per_block).unwrap_or(0);
        self.preflate_block_allowance.saturating_add(by_size)
    }

    /// The most bytes one member of `compressed_len` bytes may inflate to.
    pub(crate) fn inflate_bound(&self, compressed_len: u64) -> u64 {
        let by_ratio = compressed_len.saturating_mul(self.max_expansion_ratio).saturating_add(64 << 10);
        by_ratio.min(self.max_part_size)
    }
}
