//! The limits of spec §9: what the EPS enforces and advertises in HELLO_OK
//! as (id, value) pairs. The codec checks every count and length of a
//! message against them before it allocates anything for it.

/// The limits of §9. `Default` gives the spec's defaults, which the test
/// vectors assume.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// 1: bytes of a structured part (up to `mac`).
    pub max_envelope: u64,
    /// 2: `target_size` of an item.
    pub max_item_size: u64,
    /// 3: `payload_len` of a PATCH.
    pub max_patch_size: u64,
    /// 4: items of a SAVE.
    pub max_items: u64,
    /// 5: highest `ctx_id`.
    pub max_contexts: u64,
    /// 6: heads, bodies and keys of one session's contexts.
    pub max_context_bytes: u64,
    /// 7: one canonical head.
    pub max_head: u64,
    /// 8: header field lines of one head.
    pub max_headers: u64,
    /// 9: one URL.
    pub max_url: u64,
    /// 10: a BYTES or context body.
    pub max_body_ref: u64,
    /// 11: a provider response body carried INLINE or in SAVE_RESULT.
    pub max_response_body: u64,
    /// 12: the `seq` replay window.
    pub replay_window: u64,
    /// 13: concurrent saves and fetches.
    pub max_inflight: u64,
    /// 14: sessions kept.
    pub max_sessions: u64,
    /// 15: responses kept per session.
    pub resp_cache: u64,
    /// 16: seconds a context lives unused.
    pub context_idle_ttl: u64,
    /// 17: seconds a session lives unused.
    pub session_idle_ttl: u64,
    /// 18: seconds one operation may take.
    pub op_timeout: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_envelope: 1 << 20,
            max_item_size: 2 << 30,
            max_patch_size: 64 << 20,
            max_items: 100,
            max_contexts: 64,
            max_context_bytes: 256 << 10,
            max_head: 64 << 10,
            max_headers: 100,
            max_url: 8 << 10,
            max_body_ref: 256 << 10,
            max_response_body: 16 << 20,
            replay_window: 1024,
            max_inflight: 4,
            max_sessions: 8,
            resp_cache: 32,
            context_idle_ttl: 600,
            session_idle_ttl: 3600,
            op_timeout: 900,
        }
    }
}

/// Most (id, value) pairs a HELLO_OK may carry (§4.2).
pub const MAX_LIMIT_PAIRS: u64 = 64;

impl Limits {
    fn slots(&mut self) -> [(u64, &mut u64); 18] {
        [
            (1, &mut self.max_envelope),
            (2, &mut self.max_item_size),
            (3, &mut self.max_patch_size),
            (4, &mut self.max_items),
            (5, &mut self.max_contexts),
            (6, &mut self.max_context_bytes),
            (7, &mut self.max_head),
            (8, &mut self.max_headers),
            (9, &mut self.max_url),
            (10, &mut self.max_body_ref),
            (11, &mut self.max_response_body),
            (12, &mut self.replay_window),
            (13, &mut self.max_inflight),
            (14, &mut self.max_sessions),
            (15, &mut self.resp_cache),
            (16, &mut self.context_idle_ttl),
            (17, &mut self.session_idle_ttl),
            (18, &mut self.op_timeout),
        ]
    }

    /// The (id, value) pairs HELLO_OK advertises, ids 1 to 18 in order.
    pub fn to_pairs(&self) -> Vec<(u64, u64)> {
        let mut copy = *self;
        copy.slots().into_iter().map(|(id, v)| (id, *v)).collect()
    }

    /// Limits from advertised pairs: ids not listed keep their defaults,
    /// unknown ids are ignored (§4.2, §11).
    pub fn from_pairs(pairs: &[(u64, u64)]) -> Limits {
        let mut l = Limits::default();
        for &(id, value) in pairs {
            if let Some((_, slot)) = l.slots().into_iter().find(|(i, _)| *i == id) {
                *slot = value;
            }
        }
        l
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_round_trip_and_unknown_ids_are_ignored() {
        let l = Limits { max_items: 7, ..Limits::default() };
        let mut pairs = l.to_pairs();
        assert_eq!(pairs.len(), 18);
        assert_eq!(pairs[3], (4, 7));
        pairs.push((99, 5));
        assert_eq!(Limits::from_pairs(&pairs), l);
        assert_eq!(Limits::from_pairs(&[]), Limits::default());
    }
}
