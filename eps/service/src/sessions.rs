//! Sessions (spec §3.3): the replay window, the context definitions and
//! the response cache of one device connection's lifetime.
//!
//! Everything here lives in memory only: contexts hold provider credentials
//! (spec §8), and a restart simply ends every session (devices then say
//! HELLO again).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::{Duration, Instant};

use ec_protocol::{ContextTable, CtxDef, HeadRules, Limits};

/// A response the EPS sent, kept for `resp_ref` (spec §4.6.2).
#[derive(Debug, Clone)]
pub struct CachedResponse {
    /// Canonical response head.
    pub head: Vec<u8>,
    /// The body as carried in a CB (empty for FETCH payload bodies).
    pub body: Vec<u8>,
}

impl CachedResponse {
    /// The bytes it holds (what the response cache's byte budget counts).
    pub fn size(&self) -> u64 {
        (self.head.len() + self.body.len()) as u64
    }
}

/// The replay window of §3.3.
#[derive(Debug, Default)]
pub struct ReplayWindow {
    highest: u64,
    seen: std::collections::BTreeSet<u64>,
}

impl ReplayWindow {
    /// Whether `seq` may be accepted (does not mark it).
    pub fn acceptable(&self, seq: u64, window: u64) -> bool {
        if seq > self.highest {
            return true;
        }
        // seq <= highest here; `seq + window` could overflow near u64::MAX.
        self.highest - seq < window && !self.seen.contains(&seq)
    }

    /// Marks `seq` accepted (after its MAC verified).
    pub fn mark(&mut self, seq: u64, window: u64) {
        self.seen.insert(seq);
        if seq > self.highest {
            self.highest = seq;
        }
        let floor = self.highest.saturating_sub(window);
        while let Some(&first) = self.seen.first() {
            if first > floor {
                break;
            }
            self.seen.pop_first();
        }
    }
}

/// One session.
#[derive(Debug)]
pub struct Session {
    /// The instance key the session is bound to.
    pub key_id: u64,
    /// Negotiated capability bits.
    pub caps: u64,
    /// Edit-patch versions the device can apply.
    pub patch_versions: Vec<u8>,
    /// Replay protection.
    pub replay: ReplayWindow,
    contexts: ContextTable,
    context_used: BTreeMap<u64, Instant>,
    responses: VecDeque<([u8; 8], CachedResponse)>,
    /// Bytes `responses` holds.
    response_bytes: u64,
    last_used: Instant,
}

impl Session {
    /// Applies a message's context definitions (all or none, spec
    /// §4.3.2), then forgets least-recently-used contexts over
    /// `max_context_bytes` (never one the message just defined).
    pub fn define(&mut self, defs: &[CtxDef], limits: &Limits, rules: &HeadRules) -> ec_protocol::Result<()> {
        ec_protocol::resolve::apply_definitions(&mut self.contexts, defs, limits, rules)?;
        let now = Instant::now();
        for d in defs {
            self.context_used.insert(d.ctx_id, now);
        }
        while self.contexts.values().map(|c| c.size()).sum::<u64>() > limits.max_context_bytes {
            let oldest = self
                .context_used
                .iter()
                .filter(|(id, _)| !defs.iter().any(|d| d.ctx_id == **id))
                .min_by_key(|(_, t)| **t)
                .map(|(id, _)| *id);
            let Some(id) = oldest else { break };
            self.forget(id);
        }
        Ok(())
    }

    fn forget(&mut self, id: u64) {
        if let Some(mut c) = self.contexts.remove(&id) {
            // Best effort: do not leave tokens in freed memory (spec §8 SHOULD).
            c.head.iter_mut().for_each(|b| *b = 0);
            std::hint::black_box(&c.head);
        }
        self.context_used.remove(&id);
    }

    /// The contexts still alive after dropping those idle past `ttl`; the
    /// ones `ids` names count as used now.
    pub fn contexts(&mut self, ids: &[u64], ttl: Duration) -> &ContextTable {
        let now = Instant::now();
        let expired: Vec<u64> = self.context_used.iter().filter(|(_, t)| now.duration_since(**t) > ttl).map(|(id, _)| *id).collect();
        for id in expired {
            self.forget(id);
        }
        for id in ids {
            if let Some(t) = self.context_used.get_mut(id) {
                *t = now;
            }
        }
        &self.contexts
    }

    /// Number of contexts.
    pub fn context_count(&self) -> usize {
        self.contexts.len()
    }

    /// Remembers a response the EPS sent: at most `keep` responses and
    /// `max_bytes` bytes (heads and bodies), the oldest forgotten first; a
    /// response larger than `max_bytes` is not kept (spec §4.6.2: an
    /// unknown `resp_ref` only means an answer coded against empty
    /// references).
    pub fn remember(&mut self, digest: [u8; 8], r: CachedResponse, keep: usize, max_bytes: u64) {
        if let Some(at) = self.responses.iter().position(|(d, _)| *d == digest) {
            if let Some((_, old)) = self.responses.remove(at) {
                self.response_bytes -= old.size();
            }
        }
        if r.size() > max_bytes || keep == 0 {
            return;
        }
        self.response_bytes += r.size();
        self.responses.push_back((digest, r));
        while self.responses.len() > keep || self.response_bytes > max_bytes {
            let Some((_, old)) = self.responses.pop_front() else { break };
            self.response_bytes -= old.size();
        }
    }

    /// Bytes the response cache holds.
    pub fn response_bytes(&self) -> u64 {
        self.response_bytes
    }

    /// A response the EPS sent in this session, by digest.
    pub fn response(&self, digest: &[u8; 8]) -> Option<CachedResponse> {
        self.responses.iter().find(|(d, _)| d == digest).map(|(_, r)| r.clone())
    }
}

/// Every session of the instance.
#[derive(Debug, Default)]
pub struct Sessions {
    map: HashMap<[u8; 8], Session>,
}

impl Sessions {
    /// Opens a session; ends the least recently used ones over `max`.
    pub fn open(&mut self, id: [u8; 8], key_id: u64, caps: u64, patch_versions: Vec<u8>, max: usize) {
        while self.map.len() >= max.max(1) {
            let oldest = self.map.iter().min_by_key(|(_, s)| s.last_used).map(|(k, _)| *k);
            match oldest {
                Some(k) => {
                    self.map.remove(&k);
                }
                None => break,
            }
        }
        self.map.insert(
            id,
            Session {
                key_id,
                caps,
                patch_versions,
                replay: ReplayWindow::default(),
                contexts: ContextTable::new(),
                context_used: BTreeMap::new(),
                responses: VecDeque::new(),
                response_bytes: 0,
                last_used: Instant::now(),
            },
        );
    }

    /// The session `id`, unless it idled past `ttl` (then it ends).
    pub fn get(&mut self, id: &[u8; 8], ttl: Duration) -> Option<&mut Session> {
        let now = Instant::now();
        if self.map.get(id).is_some_and(|s| now.duration_since(s.last_used) > ttl) {
            self.map.remove(id);
            return None;
        }
        let s = self.map.get_mut(id)?;
        s.last_used = now;
        Some(s)
    }

    /// Open sessions and their contexts, for the gauges.
    pub fn counts(&self) -> (usize, usize) {
        (self.map.len(), self.map.values().map(|s| s.context_count()).sum())
    }

    /// Bytes the sessions' response caches hold together.
    pub fn response_bytes(&self) -> u64 {
        self.map.values().map(Session::response_bytes).sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn replay_window_accepts_new_and_late_unseen_rejects_seen_and_old() {
        let mut w = ReplayWindow::default();
        for s in [1, 2, 5] {
            assert!(w.acceptable(s, 4));
            w.mark(s, 4);
        }
        assert!(!w.acceptable(5, 4), "seen");
        assert!(w.acceptable(3, 4), "late but inside the window and unseen");
        assert!(!w.acceptable(1, 4), "already seen");
        w.mark(10, 4);
        assert!(!w.acceptable(6, 4), "below the window");
        assert!(w.acceptable(7, 4));
    }

    #[test]
    fn replay_window_near_the_largest_seq() {
        let mut w = ReplayWindow::default();
        w.mark(u64::MAX, 64);
        assert!(w.acceptable(u64::MAX - 1, 64), "inside the window and unseen");
        assert!(!w.acceptable(u64::MAX, 64), "seen");
        assert!(!w.acceptable(u64::MAX - 64, 64), "below the window");
    }

    fn def(id: u64, pad: usize) -> CtxDef {
        let head = format!("PUT https://example.com/{}\n", "a".repeat(pad)).into_bytes();
        CtxDef { ctx_id: id, head, body: vec![], doc: None }
    }

    #[test]
    fn contexts_expire_and_evict_oldest_over_the_byte_bound() {
        let limits = Limits { max_context_bytes: 100, ..Limits::default() };
        let rules = HeadRules::from_limits(&limits);
        let mut s = Sessions::default();
        let id = [1; 8];
        s.open(id, 1, 0, vec![1], 8);
        let sess = s.get(&id, Duration::from_secs(60)).unwrap();
        sess.define(&[def(1, 40)], &limits, &rules).unwrap();
        sess.define(&[def(2, 40)], &limits, &rules).unwrap();
        let live = sess.contexts(&[], Duration::from_secs(60));
        assert!(!live.contains_key(&1), "evicted as the oldest");
        assert!(live.contains_key(&2));
        assert!(sess.contexts(&[], Duration::ZERO).is_empty(), "idle past the TTL");
    }

    #[test]
    fn an_invalid_definition_applies_none() {
        let limits = Limits::default();
        let rules = HeadRules::from_limits(&limits);
        let mut s = Sessions::default();
        s.open([2; 8], 1, 0, vec![1], 8);
        let sess = s.get(&[2; 8], Duration::from_secs(60)).unwrap();
        let bad = CtxDef { ctx_id: 0, head: b"PUT https://example.com/\n".to_vec(), body: vec![], doc: None };
        assert!(sess.define(&[def(1, 1), bad], &limits, &rules).is_err());
        assert!(sess.contexts(&[], Duration::from_secs(60)).is_empty());
    }

    #[test]
    fn the_response_cache_keeps_within_its_count_and_bytes() {
        let mut s = Sessions::default();
        s.open([3; 8], 1, 0, vec![], 8);
        let sess = s.get(&[3; 8], Duration::from_secs(60)).unwrap();
        let r = |n: usize| CachedResponse { head: b"200 OK\n".to_vec(), body: vec![b'x'; n] };
        for i in 0..10u8 {
            sess.remember([i; 8], r(1000), 32, 3500);
        }
        assert!(sess.response_bytes() <= 3500, "{}", sess.response_bytes());
        assert!(sess.response(&[9; 8]).is_some(), "the newest is kept");
        assert!(sess.response(&[0; 8]).is_none(), "the oldest went first");
        sess.remember([20; 8], r(5000), 32, 3500);
        assert!(sess.response(&[20; 8]).is_none(), "larger than the whole budget: not kept");
        assert!(sess.response(&[9; 8]).is_some(), "and nothing else was dropped for it");
        sess.remember([9; 8], r(10), 32, 3500);
        assert_eq!(sess.responses.iter().filter(|(d, _)| *d == [9; 8]).count(), 1, "a digest once");
        assert_eq!(sess.response_bytes(), sess.responses.iter().map(|(_, r)| r.size()).sum::<u64>());
        for i in 30..40u8 {
            sess.remember([i; 8], r(1), 4, 1 << 20);
        }
        assert_eq!(sess.responses.len(), 4, "at most `keep`");
    }

    #[test]
    fn sessions_over_max_end_oldest_first() {
        let mut s = Sessions::default();
        for i in 0..3u8 {
            s.open([i; 8], 1, 0, vec![], 2);
        }
        assert!(s.get(&[0; 8], Duration::from_secs(60)).is_none());
        assert!(s.get(&[2; 8], Duration::from_secs(60)).is_some());
    }
}
