//! What the EPS does with a protocol message: spec §5.1's order of checks
//! for a SAVE, §4.8 for a FETCH, §4.2 for a HELLO.
//!
//! Every request ends in exactly one answer: a result message, or an ERROR
//! whose code, HTTP status and stage follow §10. The stage is the contract
//! with the device: at stage 0 no provider was contacted and nothing
//! persistent changed, so the device may fall back to the direct path; at
//! stage 1 a provider may hold the upload and the device must not send it
//! again by itself.
//!
//! Heavy work (applying patches, hashing, the store's file I/O) runs on the
//! blocking pool so the listeners stay responsive.

// `Failure` is large (it carries the key to MAC the ERROR with); it only
// travels on error paths, once per request.
#![allow(clippy::result_large_err)]

use std::cmp::Reverse;
use std::collections::{BTreeSet, HashMap};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ec_protocol::mac::{verify_request_mac, MAC_LEN};
use ec_protocol::resolve::{operation_digest, resolve_fetch, resolve_save, response_digest, ResolvedBody, ResolvedRequest};
use ec_protocol::wire::Writer;
use ec_protocol::{
    Cb, DocKey, ErrorCode, ErrorMessage, Fetch, FetchBody, FetchPart, FetchResult, HeadRules, Hello, HelloOk, Limits, Payload, ProtoError,
    Provider, ResponseHead, ResultFlags, Save, SaveResult,
};
use ec_providers::{Body, ProcError, ProcErrorKind, ProviderRequest, ProviderResponse, Upstream, UpstreamConfig};
use ec_store::{BlobPin, Store, StoreConfig};
use sha2::{Digest, Sha256};
use tokio::sync::watch;

use crate::body::{BodyError, PreAuthBudget, RequestBody};
use crate::config::Checked;
use crate::conns::Timeouts;
use crate::metrics::{self, DeviceBytes, Direction, Metrics, ProcedureOnly, ProviderLabels, ProviderOnly, RequestLabels};
use crate::sessions::{CachedResponse, Sessions};

/// The protocol endpoints (spec §2.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `POST /ec/hello`.
    Hello,
    /// `POST /ec/1/save`.
    Save,
    /// `POST /ec/1/fetch`.
    Fetch,
}

impl Endpoint {
    /// For logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Endpoint::Hello => "hello",
            Endpoint::Save => "save",
            Endpoint::Fetch => "fetch",
        }
    }
    fn path(self) -> &'static str {
        match self {
            Endpoint::Hello => ec_protocol::PATH_HELLO,
            Endpoint::Save => ec_protocol::PATH_SAVE,
            Endpoint::Fetch => ec_protocol::PATH_FETCH,
        }
    }
    fn version(self) -> u8 {
        match self {
            Endpoint::Hello => ec_protocol::HELLO_VERSION,
            _ => ec_protocol::PROTOCOL_VERSION,
        }
    }
}

/// Capability bits this EPS offers (spec §11): the six procedures, FETCH,
/// FETCH with FOLLOW_REDIRECT, response references.
pub const CAPS: u64 = 0b1_1111_1111;
const CAP_FETCH: u64 = 1 << 6;
const CAP_FOLLOW: u64 = 1 << 7;
const CAP_RESP_REF: u64 = 1 << 8;
/// The names of spec §9's limits, in id order (id = index + 1).
const LIMIT_NAMES: [&str; 18] = [
    "max_envelope",
    "max_item_size",
    "max_patch_size",
    "max_items",
    "max_contexts",
    "max_context_bytes",
    "max_head",
    "max_headers",
    "max_url",
    "max_body_ref",
    "max_response_body",
    "replay_window",
    "max_inflight",
    "max_sessions",
    "resp_cache",
    "context_idle_ttl",
    "session_idle_ttl",
    "op_timeout",
];
/// Edit-patch versions the EPS applies.
const PATCH_VERSIONS: [u8; 2] = ec_patch::VERSIONS;

/// An error on its way to becoming an ERROR message.
#[derive(Debug)]
struct Failure {
    err: ProtoError,
    stage: u8,
    retry_after_ms: u64,
    cause: String,
    /// The key to MAC the answer with, and the request's MAC; `None` means unauthenticated (zero MAC).
    auth: Option<([u8; 32], [u8; MAC_LEN])>,
}

impl Failure {
    fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        Failure::from(ProtoError::new(code, detail))
    }
    fn stage(mut self, stage: u8) -> Self {
        self.stage = stage;
        self
    }
}

impl From<ProtoError> for Failure {
    fn from(err: ProtoError) -> Self {
        let stage = err.code.default_stage();
        Failure { err, stage, retry_after_ms: 0, cause: String::new(), auth: None }
    }
}

/// What a finished save left behind, kept for retries (spec §5.4).
#[derive(Debug, Clone)]
enum Outcome {
    /// The provider answered.
    Response { head: Vec<u8>, body: Vec<u8>, hash_disagreement: bool },
    /// The procedure failed without a provider response; a retry gets the same error.
    Failed { code: ErrorCode, stage: u8, detail: String },
}

impl Outcome {
    /// The bytes of provider response it holds (what the records' budget counts).
    fn size(&self) -> u64 {
        match self {
            Outcome::Response { head, body, .. } => (head.len() + body.len()) as u64,
            Outcome::Failed { .. } => 0,
        }
    }
}

/// Where an outcome record stands.
#[derive(Debug)]
enum Record {
    /// The procedure runs; its outcome comes on this channel.
    Running(watch::Receiver<Option<Outcome>>),
    /// The procedure ended with this outcome.
    Done(Outcome),
    /// The procedure ended with a provider response of this status, which
    /// was let go of to keep the records within their byte budget.
    Dropped { status: u16 },
}

#[derive(Debug)]
struct OutcomeEntry {
    digest: [u8; 32],
    record: Record,
    at: Instant,
}

/// The outcome records of spec §5.4, kept at least 15 minutes and at least
/// the last 256, whose provider responses hold at most `max_bytes` together.
/// Past it, records let go of their responses and keep request id, digest
/// and status ([`Record::Dropped`]), so that a retry is still never
/// performed twice (it is answered from the document's persisted record, or
/// "outcome unknown"): the largest response first, by size class (powers of
/// two), and the oldest first within a class; the record just finished is
/// one of the candidates, so a large answer that does not fit is the one let
/// go of. Most answers are a few hundred bytes, and each response kept
/// answers one retry: letting go of the oldest first, whatever its size, let
/// one large answer take the answers of hundreds of saves.
///
/// At most [`Outcomes::MAX_RECORDS`] records are held: past it the oldest
/// finished records are forgotten (running ones never), a 16th of the bound
/// at a time. A retry of a forgotten record is still never performed again:
/// it is answered from the document's persisted record when that is its
/// own, else, since the save's in-flight marker is on disk (kept 16 minutes
/// whatever the outcome), "outcome unknown" ([`Markers::on_disk`]). A save
/// that ended at stage 0 has no marker, and its retry may run it: nothing
/// of it reached a provider. Before, nothing bounded their number: a device
/// saving very fast made the EPS hold every record of 15 minutes.
#[derive(Debug)]
struct Outcomes {
    map: HashMap<[u8; 8], OutcomeEntry>,
    /// Records forgotten past [`Outcomes::MAX_RECORDS`] since start.
    forgotten: u64,
    /// The records that hold a response, in the order they let go of it:
    /// size class (largest first), then when the save claimed its id.
    holding: BTreeSet<(Reverse<u32>, Instant, [u8; 8])>,
    /// Bytes the records' responses hold.
    bytes: u64,
    max_bytes: u64,
}

/// The key under which a record holding a response of `size` bytes waits in [`Outcomes::holding`].
fn holding_key(size: u64, at: Instant, request_id: [u8; 8]) -> (Reverse<u32>, Instant, [u8; 8]) {
    (Reverse(u64::BITS - size.saturating_sub(1).leading_zeros()), at, request_id)
}

impl Outcomes {
    fn new(max_bytes: u64) -> Outcomes {
        Outcomes { map: HashMap::new(), forgotten: 0, holding: BTreeSet::new(), bytes: 0, max_bytes }
    }

    /// The most records held (about 3 MiB of them): more than 18 saves a
    /// second for 15 minutes.
    const MAX_RECORDS: usize = 1 << 14;

    /// Makes room for one more record: at the bound, forgets the oldest
    /// finished records, down to 15/16 of it.
    fn make_room(&mut self) {
        if self.map.len() < Self::MAX_RECORDS {
            return;
        }
        let mut finished: Vec<(Instant, [u8; 8])> =
            self.map.iter().filter(|(_, e)| !matches!(e.record, Record::Running(_))).map(|(rid, e)| (e.at, *rid)).collect();
        finished.sort_unstable();
        let excess = self.map.len() + 1 - (Self::MAX_RECORDS - Self::MAX_RECORDS / 16);
        for (at, rid) in finished.into_iter().take(excess) {
            if let Some(OutcomeEntry { record: Record::Done(o), .. }) = self.map.remove(&rid) {
                self.bytes -= o.size();
                self.holding.remove(&holding_key(o.size(), at, rid));
            }
            self.forgotten += 1;
        }
    }

    /// Forgets finished records older than 15 minutes once there are more than 256.
    fn prune(&mut self) {
        if self.map.len() <= 256 {
            return;
        }
        let Some(cutoff) = Instant::now().checked_sub(Duration::from_secs(15 * 60)) else { return };
        let (holding, bytes) = (&mut self.holding, &mut self.bytes);
        self.map.retain(|rid, e| {
            let keep = e.at > cutoff || matches!(e.record, Record::Running(_));
            if !keep {
                if let Record::Done(o) = &e.record {
                    *bytes -= o.size();
                    holding.remove(&holding_key(o.size(), e.at, *rid));
                }
            }
            keep
        });
    }

    /// Records the outcome of the save that holds the claim on `request_id`,
    /// within the byte budget.
    fn finish(&mut self, request_id: [u8; 8], outcome: &Outcome) {
        let Some(e) = self.map.get_mut(&request_id) else { return };
        let size = outcome.size();
        if let Record::Done(o) = &e.record {
            // Not expected (one claim finishes once); keep the count right anyway.
            self.bytes -= o.size();
            self.holding.remove(&holding_key(o.size(), e.at, request_id));
        }
        e.record = match outcome {
            Outcome::Response { head, .. } if size > self.max_bytes => Record::Dropped { status: response_status(head) },
            _ => Record::Done(outcome.clone()),
        };
        if matches!(e.record, Record::Done(_)) && size > 0 {
            self.bytes += size;
            self.holding.insert(holding_key(size, e.at, request_id));
        }
        while self.bytes > self.max_bytes {
            let Some((_, _, victim)) = self.holding.pop_first() else { break };
            let Some(e) = self.map.get_mut(&victim) else { continue };
            if let Record::Done(o @ Outcome::Response { head, .. }) = &e.record {
                self.bytes -= o.size();
                e.record = Record::Dropped { status: response_status(head) };
            }
        }
    }
}

/// The status of a canonical response head (`STATUS SP REASON LF`, §4.6.1).
fn response_status(head: &[u8]) -> u16 {
    head.get(..3).and_then(|s| std::str::from_utf8(s).ok()).and_then(|s| s.parse().ok()).unwrap_or(0)
}

/// The service state of one EPS instance.
#[derive(Debug)]
pub struct Service {
    cfg: Checked,
    limits: Limits,
    patch_limits: ec_patch::Limits,
    timeouts: Timeouts,
    preauth: PreAuthBudget,
    rules: HeadRules,
    store: Store,
    upstream: Upstream,
    sessions: Mutex<Sessions>,
    outcomes: Mutex<Outcomes>,
    /// Each session's share of `response_cache_max_bytes`.
    response_cache_share: u64,
    inflight: AtomicU64,
    /// When the last save or fetch ended, and a wake-up for
    /// [`Service::let_go_of_kept_contents`] each time one does.
    last_done: Mutex<Instant>,
    done: tokio::sync::Notify,
    markers: Markers,
    metrics: Metrics,
    /// One file at a time is learnt after a save that sent it whole ([`Service::learn_later`]).
    learning: Arc<tokio::sync::Semaphore>,
}

/// A marker found at start: the target's digest and when the marker expires.
type MarkerFound = ([u8; 32], Instant);

/// Spec §5.4 across restarts: the request ids whose provider procedure
/// started (step 10), one small file each in `<state>/inflight/` holding the
/// operation digest (no name, path, account or credential). A retry after a
/// restart is answered from the document's persisted outcome record when
/// there is one; otherwise, if its marker is there, "outcome unknown"
/// (`provider_timeout`, stage 1): the EPS never uploads twice for one
/// request id, and the device never falls back to a second upload either.
///
/// A marker is kept whatever the outcome, not only while the procedure
/// runs: the outcome record may not be persisted (a response that sets
/// cookies, a non-2xx answer, which moves no pointer, a failed pointer
/// write) or may be replaced by a later save of the same document, and in
/// each case a retry after a restart would otherwise find nothing and upload
/// again. Only a save that ended at stage 0 (nothing reached a provider)
/// drops its marker at once. Markers are aged out after [`Markers::KEEP`]
/// (the 15 minutes §5.4 keeps outcome records, plus a minute; the device's
/// retry window is 30 s), at start and by a sweep at most once a minute, so
/// the folder holds at most the saves of the last 16 minutes (32 bytes
/// each, a disk block on most file systems). Their number is bounded too:
/// with [`Markers::MAX_ON_DISK`] markers on disk, a save is refused `busy`
/// before it starts ([`Markers::room`]), until the oldest age out. The
/// files are written without fsync: they guard against a crashed process,
/// not a lost disk cache.
#[derive(Debug)]
struct Markers {
    dir: std::path::PathBuf,
    /// Markers found at start: digest and when the marker expires.
    found: Mutex<HashMap<[u8; 8], MarkerFound>>,
    last_sweep: Mutex<Instant>,
    /// The markers on disk: as counted at start and by the last sweep, plus
    /// those written since, less those removed.
    on_disk: AtomicU64,
    /// At most this many on disk ([`Markers::MAX_ON_DISK`]; lower in tests).
    max_on_disk: u64,
    /// When [`Markers::room`] last swept early, at most once a second.
    last_full_sweep: Mutex<Option<Instant>>,
}

impl Markers {
    const KEEP: Duration = Duration::from_secs(16 * 60);
    const SWEEP_EVERY: Duration = Duration::from_secs(60);
    /// Most markers loaded at start (2 MiB or so in memory): far more than
    /// the saves of 16 minutes; a folder with more holds what no EPS wrote.
    const MAX_FOUND: usize = 1 << 16;
    /// Most markers on disk while the EPS runs: 17 saves a second for 16
    /// minutes (as many as the outcome records it holds, §5.4), 64 MiB of
    /// 4 KiB blocks. Before, only their age bounded them: a device saving
    /// as fast as the provider answers could fill the access point's disk,
    /// which other users' instances share. The bound is checked when a save
    /// is admitted and the marker written later, so up to `max_inflight`
    /// more may be written; the count is set again by each sweep.
    const MAX_ON_DISK: u64 = 16_384;

    /// Loads the markers of the last 16 minutes. A marker is a regular file
    /// of exactly 32 bytes, and no more than that is read of any: anything
    /// else in the folder (a huge file, a link to `/dev/zero`, a folder) is
    /// not a marker, and is removed (logged) unread.
    fn open(dir: std::path::PathBuf) -> std::io::Result<Markers> {
        Self::open_with(dir, Self::MAX_ON_DISK)
    }

    fn open_with(dir: std::path::PathBuf, max_on_disk: u64) -> std::io::Result<Markers> {
        std::fs::create_dir_all(&dir)?;
        let mut found = HashMap::new();
        let now = Instant::now();
        let (mut damaged, mut over) = (0u64, 0u64);
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            // `DirEntry::metadata` does not follow a link.
            let meta = entry.metadata().ok().filter(|m| m.is_file() && m.len() == 32);
            // A time ahead of the clock (written before a restart whose clock
            // came up behind, as on a router before its time is synchronised)
            // is a marker of age 0: removing it would let a retry upload again.
            let age = meta.as_ref().and_then(|m| m.modified().ok()).map(|t| t.elapsed().unwrap_or(Duration::ZERO));
            let rid = hex::decode(entry.file_name().to_string_lossy().as_bytes()).ok().and_then(|v| <[u8; 8]>::try_from(v).ok());
            let digest = meta.as_ref().and_then(|_| read_marker(&entry.path()));
            match (age, rid, digest) {
                (Some(age), Some(r), Some(d)) if age <= Self::KEEP => {
                    if found.len() < Self::MAX_FOUND {
                        found.insert(r, (d, now + (Self::KEEP - age)));
                    } else {
                        over += 1;
                    }
                }
                (Some(_), Some(_), Some(_)) => {
                    let _ = std::fs::remove_file(entry.path());
                }
                _ => {
                    damaged += 1;
                    let _ = std::fs::remove_file(entry.path());
                }
            }
        }
        if damaged > 0 {
            tracing::warn!(
                damaged,
                "removed files of the in-flight markers folder that are not markers (32-byte files named by a request id)"
            );
        }
        if over > 0 {
            tracing::warn!(
                loaded = found.len(),
                over,
                "more in-flight markers than saves of 16 minutes; the rest are not loaded (a retry of one after this restart is not recognised)"
            );
        }
        if !found.is_empty() {
            tracing::info!(
                markers = found.len(),
                "saves started in the last 16 minutes before the EPS restarted; a retry of one whose outcome was not recorded will be answered 'outcome unknown'"
            );
        }
        let on_disk = AtomicU64::new(found.len() as u64 + over);
        Ok(Markers { dir, found: Mutex::new(found), last_sweep: Mutex::new(now), on_disk, max_on_disk, last_full_sweep: Mutex::new(None) })
    }

    /// Whether a save may start: fewer than `max_on_disk` markers on disk.
    /// At the bound, the markers past their age are removed first (at most
    /// once a second), so a full folder frees itself as they age out.
    fn room(&self) -> bool {
        if self.on_disk.load(Ordering::SeqCst) < self.max_on_disk {
            return true;
        }
        {
            let mut last = self.last_full_sweep.lock().expect("markers lock");
            if last.is_some_and(|t| t.elapsed() < Duration::from_secs(1)) {
                return false;
            }
            *last = Some(Instant::now());
        }
        self.sweep_now();
        self.on_disk.load(Ordering::SeqCst) < self.max_on_disk
    }

    fn start(&self, rid: &[u8; 8], digest: &[u8; 32]) {
        match std::fs::write(self.dir.join(hex::encode(rid)), digest) {
            Ok(()) => {
                self.on_disk.fetch_add(1, Ordering::SeqCst);
            }
            Err(e) => tracing::warn!("cannot write the in-flight marker of a save: {e}"),
        }
        self.sweep();
    }

    /// Drops the marker of a save that ended at stage 0 (nothing reached a provider).
    fn forget(&self, rid: &[u8; 8]) {
        if std::fs::remove_file(self.dir.join(hex::encode(rid))).is_ok() {
            let _ = self.on_disk.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| Some(n.saturating_sub(1)));
        }
        self.found.lock().expect("markers lock").remove(rid);
    }

    fn unknown(&self, rid: &[u8; 8]) -> Option<[u8; 32]> {
        let found = self.found.lock().expect("markers lock");
        found.get(rid).filter(|(_, until)| *until > Instant::now()).map(|(d, _)| *d)
    }

    /// The digest of the marker the folder holds for `rid`, if it is a marker
    /// of the last [`Markers::KEEP`] (a time ahead of the clock counts as
    /// now): a save that started and whose record is no longer in memory.
    fn on_disk(&self, rid: &[u8; 8]) -> Option<[u8; 32]> {
        let path = self.dir.join(hex::encode(rid));
        let meta = std::fs::symlink_metadata(&path).ok().filter(|m| m.is_file() && m.len() == 32)?;
        let age = meta.modified().ok()?.elapsed().unwrap_or(Duration::ZERO);
        if age > Self::KEEP {
            return None;
        }
        read_marker(&path)
    }

    /// Removes the markers older than [`Markers::KEEP`], at most once a minute.
    fn sweep(&self) {
        {
            let mut last = self.last_sweep.lock().expect("markers lock");
            if last.elapsed() < Self::SWEEP_EVERY {
                return;
            }
            *last = Instant::now();
        }
        self.sweep_now();
    }

    /// Removes the markers older than [`Markers::KEEP`] and counts those left.
    fn sweep_now(&self) {
        let now = Instant::now();
        self.found.lock().expect("markers lock").retain(|_, (_, until)| *until > now);
        let Ok(entries) = std::fs::read_dir(&self.dir) else { return };
        let mut left = 0;
        for entry in entries.flatten() {
            let old = entry.metadata().and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok()).is_some_and(|age| age > Self::KEEP);
            // One past its age that cannot be removed still takes its place.
            if !old || std::fs::remove_file(entry.path()).is_err() {
                left += 1;
            }
        }
        self.on_disk.store(left, Ordering::SeqCst);
    }
}

/// A marker's digest: the file's first 33 bytes at most, which must be 32.
fn read_marker(path: &std::path::Path) -> Option<[u8; 32]> {
    use std::io::Read;
    let mut v = Vec::with_capacity(33);
    std::fs::File::open(path).ok()?.take(33).read_to_end(&mut v).ok()?;
    <[u8; 32]>::try_from(v).ok()
}

/// Errors starting the service.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The store could not be opened.
    #[error("cannot open the last-synced store: {0}")]
    Store(#[from] ec_store::StoreError),
    /// The provider client could not be built.
    #[error("cannot set up provider access: {0}")]
    Upstream(String),
    /// The in-flight markers folder is not usable.
    #[error("cannot use the in-flight markers folder: {0}")]
    Markers(String),
    /// A configured limit is unknown or out of range.
    #[error("configuration: {0}")]
    Limits(String),
}

fn provider_of(p: Provider) -> ec_providers::Provider {
    match p {
        Provider::Dropbox => ec_providers::Provider::Dropbox,
        Provider::Graph => ec_providers::Provider::Graph,
        Provider::Drive => ec_providers::Provider::Drive,
        Provider::WebDav => ec_providers::Provider::WebDav,
    }
}

/// One request's timing for the `Server-Timing` of §7.3.
#[derive(Debug, Clone, Copy, Default)]
pub struct RequestTiming {
    /// The time spent in step 8 on patched items (set by `rebuild`).
    pub rebuild: Option<Duration>,
    /// When the whole body had been read (set after step 6).
    pub body_read: Option<Instant>,
    /// The time of the provider exchanges of step 10.
    pub provider: Option<Duration>,
    /// The part of `rebuild` that ran during `provider` (a streamed save, §5.6).
    pub overlap: Option<Duration>,
}

tokio::task_local! {
    /// The current request's [`RequestTiming`].
    static REQUEST_TIMING: std::cell::Cell<RequestTiming>;
}

/// Updates the current request's timing (nothing outside a request's task).
fn note_timing(f: impl FnOnce(&mut RequestTiming)) {
    let _ = REQUEST_TIMING.try_with(|c| {
        let mut t = c.get();
        f(&mut t);
        c.set(t);
    });
}

fn sha256(data: &[u8]) -> [u8; 32] {
    Sha256::digest(data).into()
}

impl Service {
    /// `ec_eps_provider_requests_total`: one count per provider request,
    /// labelled with that request's own status class (`none`: no response).
    fn count_provider_calls(&self, provider: &'static str, procedure: &'static str, statuses: &[Option<u16>]) {
        for status in statuses {
            self.metrics
                .provider_requests
                .get_or_create(&ProviderLabels { provider, procedure, status_class: metrics::status_class(*status) })
                .inc();
        }
    }

    /// Builds the service from a checked configuration.
    pub fn new(cfg: Checked) -> Result<Service, StartError> {
        let (limits, patch_limits) = configured_limits(&cfg)?;
        let mem = cfg.config.memory_limit_bytes;
        let c = &cfg.config.connections;
        let timeouts = Timeouts {
            tls_handshake: Duration::from_secs_f64(c.tls_handshake_timeout_s),
            header: Duration::from_secs_f64(c.header_timeout_s),
            envelope: Duration::from_secs_f64(c.envelope_timeout_s),
            body_read: Duration::from_secs_f64(c.body_read_timeout_s),
            idle: Duration::from_secs_f64(c.idle_timeout_s),
        };
        let preauth_bytes = match mem {
            Some(m) => c.preauth_buffer_bytes.min(m / 16),
            None => c.preauth_buffer_bytes,
        };
        // The requests of a device's connections beyond the first: what
        // `max_inflight` structured parts need (4 MiB by default). Not
        // clamped without a memory limit: docs/eps.md's memory bound counts
        // what it exceeds 4 MiB by.
        let device_preauth_bytes = limits.max_inflight.saturating_mul(limits.max_envelope + MAC_LEN as u64);
        let device_preauth_bytes = mem.map_or(device_preauth_bytes, |m| device_preauth_bytes.min(m / 16));
        // What the core keeps between saves counts against the 64 MiB a
        // memory limit reserves beyond the operations' budgets (docs/eps.md).
        if let Some(m) = mem {
            ec_patch::deflate::set_kept_content_bound(ec_patch::deflate::MEMO_CONTENT_BYTES.min((m / 8) as usize));
        }
        // What the instance keeps of provider responses between saves, within
        // the 64 MiB a memory limit reserves beyond the operations' budgets.
        let kept_bound = |configured: Option<u64>| {
            let v = configured.unwrap_or(crate::config::DEFAULT_KEPT_RESPONSE_BYTES);
            mem.map_or(v, |m| v.min(m / 32))
        };
        let outcome_bytes = kept_bound(cfg.config.outcome_records_max_bytes);
        let response_cache_share = kept_bound(cfg.config.response_cache_max_bytes) / limits.max_sessions.max(1);
        let rules = HeadRules::from_limits(&limits);
        let store =
            Store::open(cfg.state_dir.join("store"), StoreConfig { max_total_bytes: cfg.config.store_max_bytes.unwrap_or(1 << 30) })?;
        let over = store.pointers_over_bound_at_open();
        if over > 0 {
            tracing::warn!(
                kept = ec_store::MAX_DOCUMENTS,
                removed = over,
                "the store held more document pointers than its bound; the least recently used were removed (the next save of each goes whole)"
            );
        }
        let over = store.blobs_over_bound_at_open();
        if over > 0 {
            tracing::warn!(
                kept = ec_store::MAX_BLOBS,
                removed = over,
                "the store held more blobs than its bound; the least recently used that no document names were removed"
            );
        }
        let up = &cfg.config.upstream;
        let mut ucfg = UpstreamConfig::default();
        let pats = |v: &[String]| v.iter().map(|h| ec_providers::HostPattern::parse(h)).collect::<Result<Vec<_>, _>>();
        ucfg.webdav_hosts = pats(&up.webdav_hosts).map_err(|e| StartError::Upstream(e.to_string()))?;
        ucfg.allow_plain_http_hosts = pats(&up.plain_http_hosts).map_err(|e| StartError::Upstream(e.to_string()))?;
        for f in &up.extra_ca_pem_files {
            let p = cfg.path(f);
            ucfg.extra_root_ca_pem
                .push(std::fs::read(&p).map_err(|e| StartError::Upstream(format!("cannot read the CA file {}: {e}", p.display())))?);
        }
        ucfg.resolve = up.resolve.iter().map(|(h, a)| (h.clone(), *a)).collect();
        if let Some(v) = up.dropbox_chunk {
            ucfg.dropbox_chunk = v;
        }
        if let Some(v) = up.graph_fragment {
            ucfg.graph_fragment = v;
        }
        if let Some(v) = up.drive_chunk {
            ucfg.drive_chunk = v;
        }
        if let Some(v) = up.nc_chunk {
            ucfg.nc_chunk = v;
            ucfg.allow_small_nc_chunk = v < 5 << 20;
        }
        if let Some(s) = up.connect_timeout_s {
            ucfg.connect_timeout = Duration::from_secs(s);
        }
        if let Some(s) = up.response_timeout_s {
            ucfg.response_timeout = Duration::from_secs(s);
        }
        ucfg.op_timeout = Duration::from_secs(up.op_timeout_s.unwrap_or(limits.op_timeout));
        ucfg.max_response_body = limits.max_response_body;
        ucfg.max_download_body = limits.max_item_size;
        let upstream = Upstream::new(ucfg).map_err(|e| StartError::Upstream(e.to_string()))?;
        let markers = Markers::open(cfg.state_dir.join("inflight")).map_err(|e| StartError::Markers(e.to_string()))?;
        let metrics = Metrics::new();
        for (kind, d) in [
            ("tls_handshake", timeouts.tls_handshake),
            ("headers", timeouts.header),
            ("envelope", timeouts.envelope),
            ("body", timeouts.body_read),
            ("idle", timeouts.idle),
        ] {
            metrics.timeout_seconds.get_or_create(&metrics::KindOnly { kind }).set(d.as_secs_f64());
        }
        metrics.preauth_budget_bytes.set(preauth_bytes as i64);
        if let Some(r) = cfg.config.log_lines_per_s {
            crate::ratelimit::set_rate(r);
        }
        let svc = Service {
            cfg,
            limits,
            patch_limits,
            timeouts,
            preauth: PreAuthBudget::new(preauth_bytes, device_preauth_bytes),
            rules,
            store,
            upstream,
            sessions: Mutex::new(Sessions::default()),
            outcomes: Mutex::new(Outcomes::new(outcome_bytes)),
            response_cache_share,
            inflight: AtomicU64::new(0),
            last_done: Mutex::new(Instant::now()),
            done: tokio::sync::Notify::new(),
            markers,
            metrics,
            learning: Arc::new(tokio::sync::Semaphore::new(1)),
        };
        svc.update_store_gauges();
        Ok(svc)
    }

    /// The metrics (the listeners add theirs).
    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    /// Runs for the life of the service: once no save or fetch has run for
    /// `kept_content_idle_s`, lets go of the document contents the edit-patch
    /// core keeps from its last rebuilds (`ec_patch::kept_bytes`: up to
    /// 32 MiB, so that the next patch against a member need not inflate it
    /// again). An instance that saved a 1 MB-text document holds about
    /// 3.6 MB that way; on an access point with hundreds of idle instances
    /// that memory is worth more than the next save's 4 ms of inflating. It
    /// sleeps while nothing is kept, and wakes when a save or fetch ends.
    pub async fn let_go_of_kept_contents(self: Arc<Self>) {
        let idle = Duration::from_secs_f64(self.cfg.config.kept_content_idle_s);
        loop {
            if ec_patch::kept_bytes() == 0 || self.inflight.load(Ordering::SeqCst) != 0 {
                self.done.notified().await;
                continue;
            }
            let since = self.last_done.lock().unwrap_or_else(|e| e.into_inner()).elapsed();
            if since < idle {
                tokio::time::sleep(idle - since).await;
                continue;
            }
            let bytes = ec_patch::forget_kept();
            self.metrics.kept_content_bytes.set(ec_patch::kept_bytes() as i64);
            tracing::info!(bytes, idle_s = since.as_secs_f64(), "let go of the document contents kept from the last rebuilds");
        }
    }

    /// The connection and body timeouts.
    pub fn timeouts(&self) -> Timeouts {
        self.timeouts
    }

    /// The shared budget of unauthenticated request buffers.
    pub fn preauth(&self) -> PreAuthBudget {
        self.preauth.clone()
    }

    /// `/healthz`: a key, a writable store.
    pub fn healthy(&self) -> bool {
        !self.cfg.keys.is_empty() && self.store.root().join("tmp").is_dir()
    }

    /// `/metrics`.
    pub fn render_metrics(&self) -> String {
        let ((s, c), r) = {
            let sessions = self.sessions.lock().expect("sessions lock");
            (sessions.counts(), sessions.response_bytes())
        };
        self.metrics.sessions.set(s as i64);
        self.metrics.contexts.set(c as i64);
        self.metrics.response_cache_bytes.set(r as i64);
        self.update_store_gauges();
        let suppressed = crate::ratelimit::SUPPRESSED_TOTAL.load(Ordering::Relaxed);
        let counted = self.metrics.log_suppressed.get();
        if suppressed > counted {
            self.metrics.log_suppressed.inc_by(suppressed - counted);
        }
        self.metrics.render()
    }

    fn update_store_gauges(&self) {
        let st = self.store.stats();
        self.metrics.store_bytes.set(st.total_bytes as i64);
        self.metrics.store_documents.set(st.documents as i64);
        let counted = self.metrics.store_evictions.get();
        if st.evictions > counted {
            self.metrics.store_evictions.inc_by(st.evictions - counted);
        }
    }

    /// The most bytes a request body to `endpoint` may have (spec §5.1 step 1).
    pub fn body_bound(&self, endpoint: Endpoint) -> u64 {
        match endpoint {
            // The items' files together are at most max_item_size, their patches max_patch_size (§9).
            Endpoint::Save => self.limits.max_envelope + self.limits.max_item_size + self.limits.max_patch_size,
            _ => self.limits.max_envelope,
        }
    }

    fn answer_error(&self, endpoint: Endpoint, f: Failure) -> (u16, Vec<u8>) {
        let msg = ErrorMessage {
            version: endpoint.version(),
            code: f.err.code,
            stage: f.stage,
            retry_after_ms: f.retry_after_ms,
            list: f.err.list.clone(),
            cause: f.cause.clone(),
            detail: truncate_detail(&f.err.detail),
        };
        self.metrics.requests.get_or_create(&RequestLabels { endpoint: endpoint.name(), outcome: f.err.code.name() }).inc();
        crate::limited!(info, endpoint = endpoint.name(), code = f.err.code.name(), stage = f.stage, "answered an error: {}", msg.detail);
        let bytes = match &f.auth {
            Some((key, req_mac)) => msg.encode(Some((&key[..], req_mac))),
            None => msg.encode(None),
        };
        self.metrics.device_bytes.get_or_create(&DeviceBytes { direction: "out", kind: "envelope" }).inc_by(bytes.len() as u64);
        (f.err.code.http_status(), bytes)
    }

    fn count_in(&self, kind: &'static str, n: usize) {
        self.metrics.device_bytes.get_or_create(&DeviceBytes { direction: "in", kind }).inc_by(n as u64);
    }

    /// The answer to a path that is not the protocol's.
    pub fn unsupported_path(&self, _path: &str) -> (u16, Vec<u8>) {
        let (_, body) = self.answer_error(Endpoint::Save, Failure::new(ErrorCode::Unsupported, "no such endpoint"));
        (404, body)
    }

    /// The answer to a method other than POST on a protocol path.
    pub fn wrong_method(&self, endpoint: Endpoint) -> (u16, Vec<u8>) {
        let (_, body) = self.answer_error(endpoint, Failure::new(ErrorCode::Malformed, "protocol endpoints take POST"));
        (405, body)
    }

    /// The answer to a body over the bound.
    pub fn too_large(&self, endpoint: Endpoint, size: u64, bound: u64) -> (u16, Vec<u8>) {
        self.answer_error(
            endpoint,
            Failure::new(ErrorCode::TooLarge, format!("the request body ({size} bytes) is over the bound of {bound} bytes")),
        )
    }

    /// The answer to a body the device did not finish sending.
    pub fn body_cut(&self, endpoint: Endpoint) -> (u16, Vec<u8>) {
        self.answer_error(endpoint, Failure::new(ErrorCode::Malformed, "the request body ended before its declared length"))
    }

    /// Handles one protocol request in a task of its own: a device that
    /// goes away mid-save must not cancel the save half-way (the provider
    /// might be left with an upload session, and the retry is answered from
    /// the outcome record only if the save ran to its end).
    /// The third value says whether the body was read to its end (else the
    /// connection must close).
    /// The fourth value, for the `Server-Timing` of §2.2 / §7.3: the time
    /// this request spent rebuilding patched items, if it rebuilt any, when
    /// its whole body had been read, if it was, and the time of its provider
    /// exchanges, if it made any.
    ///
    /// `None` when the task ended without an answer (a panic): the request
    /// must then get none, its connection closed. An answer here could not
    /// be authenticated (the session is the task's), and the device takes
    /// an unauthenticated error to a save it sent as "not performed", so it
    /// would upload the file directly while this save may already have
    /// reached the provider. With no answer, the device asks again with the
    /// same request id (spec §7.1), and the save's claim, settled when its
    /// task ended, answers that retry ([`SaveClaim`]).
    pub async fn handle_detached(self: Arc<Self>, endpoint: Endpoint, body: RequestBody) -> Option<(u16, Vec<u8>, bool, RequestTiming)> {
        let svc = self.clone();
        let task = REQUEST_TIMING.scope(std::cell::Cell::new(RequestTiming::default()), async move {
            let answer = svc.handle(endpoint, body).await;
            (answer, REQUEST_TIMING.with(|c| c.get()))
        });
        match tokio::spawn(task).await {
            Ok(((s, b, finished), timing)) => Some((s, b, finished, timing)),
            Err(e) => {
                tracing::error!(endpoint = endpoint.name(), "the request's task failed, its connection is closed without an answer: {e}");
                None
            }
        }
    }

    /// Handles one protocol request.
    pub async fn handle(&self, endpoint: Endpoint, mut body: RequestBody) -> (u16, Vec<u8>, bool) {
        let result = match endpoint {
            Endpoint::Hello => match self.read_small(&mut body).await {
                Ok(b) => self.hello(&b, &mut body),
                Err(f) => Err(f),
            },
            Endpoint::Save => self.save(&mut body).await,
            Endpoint::Fetch => match self.read_small(&mut body).await {
                Ok(b) => self.fetch(b, &mut body).await,
                Err(f) => Err(f),
            },
        };
        let finished = body.finished();
        match result {
            Ok(bytes) => {
                self.metrics.requests.get_or_create(&RequestLabels { endpoint: endpoint.name(), outcome: "ok" }).inc();
                self.metrics.device_bytes.get_or_create(&DeviceBytes { direction: "out", kind: "envelope" }).inc_by(bytes.len() as u64);
                (200, bytes, finished)
            }
            Err(f) => {
                let (s, b) = self.answer_error(endpoint, f);
                (s, b, finished)
            }
        }
    }

    /// A body error as the Failure to answer (before or after authentication).
    fn body_failure(&self, e: BodyError) -> Failure {
        match e {
            BodyError::Timeout(kind) => {
                self.metrics.connection_timeouts.get_or_create(&metrics::TimeoutLabels { listener: "device", kind }).inc();
                Failure::new(ErrorCode::Malformed, format!("the request body stalled ({kind} timeout)"))
            }
            BodyError::Cut(_) => Failure::new(ErrorCode::Malformed, "the request body ended before its declared length"),
            BodyError::TooLarge(n) => Failure::new(ErrorCode::TooLarge, format!("the request body is over its bound ({n} bytes read)")),
            BodyError::Busy(why) => Failure { retry_after_ms: 1000, ..Failure::new(ErrorCode::Busy, why) },
        }
    }

    /// HELLO and FETCH: the whole body, at most `max_envelope` bytes, before authentication.
    async fn read_small(&self, body: &mut RequestBody) -> Result<Bytes, Failure> {
        let deadline = tokio::time::Instant::now() + self.timeouts.envelope;
        let b = body.read_small(self.limits.max_envelope, deadline).await.map_err(|e| self.body_failure(e));
        self.count_in("envelope", body.received as usize);
        b
    }

    /// SAVE step 2: reads until the structured part and its MAC are complete
    /// (at most `max_envelope` + 16 bytes and one network read), then decodes it.
    ///
    /// Before authentication, so the decoding is bounded by the bytes read,
    /// not by how the peer cuts them: after an attempt on an incomplete part,
    /// the next waits until the buffer has doubled (or the body ended, or the
    /// bound is reached). A peer that trickles a large structured part a byte
    /// per read thus costs at most about twice its size in decoding, where
    /// decoding it again after every read would cost its size squared. A
    /// device writes its whole message at once, which this never delays.
    async fn read_structured(&self, body: &mut RequestBody) -> Result<(Save, ec_protocol::messages::Framing, Bytes), Failure> {
        let deadline = tokio::time::Instant::now() + self.timeouts.envelope;
        let cap = self.limits.max_envelope as usize + MAC_LEN;
        let mut tried = 0usize;
        loop {
            let have = body.buffered().len();
            if have >= tried.saturating_mul(2).max(1) || have >= cap || body.ended() {
                tried = have;
                self.metrics.envelope_decodes.inc();
                match Save::decode(body.buffered(), &self.limits) {
                    Ok((save, framing)) => {
                        let envelope = body.take(framing.payload_offset);
                        return Ok((save, framing, envelope));
                    }
                    // Not complete yet: read on, up to the bound.
                    Err(_) if !body.ended() && have < cap => {}
                    Err(e) => return Err(e.into()),
                }
            }
            body.fill_more(cap, deadline).await.map_err(|e| self.body_failure(e))?;
        }
    }

    // ---- HELLO (§4.2) -------------------------------------------------

    fn hello(&self, body: &[u8], request: &mut RequestBody) -> Result<Vec<u8>, Failure> {
        let (hello, framing) = Hello::decode(body, &self.limits)?;
        let Some(secret) = self.cfg.keys.get(&hello.key_id) else {
            return Err(Failure::new(ErrorCode::AuthFailed, "unknown key id"));
        };
        if !verify_request_mac(secret, ec_protocol::PATH_HELLO, framing.s(body), &framing.mac) {
            return Err(Failure::new(ErrorCode::AuthFailed, "the MAC does not verify"));
        }
        request.authenticated();
        let auth = Some((*secret, framing.mac));
        if !hello.versions.contains(&ec_protocol::PROTOCOL_VERSION) {
            return Err(Failure {
                auth,
                ..Failure::new(ErrorCode::UnsupportedVersion, "no protocol version in common; this EPS speaks 1")
            });
        }
        let session_id: [u8; 8] = rand::random();
        let caps = hello.caps & CAPS;
        self.sessions.lock().expect("sessions lock").open(
            session_id,
            hello.key_id,
            caps,
            hello.patch_versions.clone(),
            self.limits.max_sessions as usize,
        );
        tracing::info!(session = %hex::encode(&session_id[..4]), caps, "session opened");
        let ok = HelloOk {
            chosen_version: ec_protocol::PROTOCOL_VERSION,
            session_id,
            caps: CAPS,
            patch_versions: PATCH_VERSIONS.to_vec(),
            limits: self.limits.to_pairs(),
        };
        Ok(ok.encode(secret, &framing.mac))
    }

    // ---- Authentication shared by SAVE and FETCH (§3) ------------------

    /// Step 3: session, MAC, sequence. Returns the key and the session's caps and patch versions.
    fn authenticate(
        &self,
        endpoint: Endpoint,
        header: &ec_protocol::RequestHeader,
        s: &[u8],
        mac: &[u8; MAC_LEN],
    ) -> Result<([u8; 32], u64, Vec<u8>), Failure> {
        let mut sessions = self.sessions.lock().expect("sessions lock");
        let ttl = Duration::from_secs(self.limits.session_idle_ttl);
        let Some(session) = sessions.get(&header.session_id, ttl) else {
            // §3.3: tell a device with a valid key that its session ended.
            for secret in self.cfg.keys.values() {
                if verify_request_mac(secret, endpoint.path(), s, mac) {
                    return Err(Failure {
                        auth: Some((*secret, *mac)),
                        ..Failure::new(ErrorCode::SessionUnknown, "the session ended or never existed; say HELLO again")
                    });
                }
            }
            return Err(Failure::new(ErrorCode::AuthFailed, "unknown session and no key verifies the MAC"));
        };
        let Some(secret) = self.cfg.keys.get(&session.key_id).copied() else {
            return Err(Failure::new(ErrorCode::AuthFailed, "the session's key was revoked"));
        };
        if !verify_request_mac(&secret, endpoint.path(), s, mac) {
            return Err(Failure::new(ErrorCode::AuthFailed, "the MAC does not verify"));
        }
        let auth = Some((secret, *mac));
        if !session.replay.acceptable(header.seq, self.limits.replay_window) {
            return Err(Failure {
                auth,
                ..Failure::new(ErrorCode::Replayed, format!("sequence number {} was used or is below the window", header.seq))
            });
        }
        session.replay.mark(header.seq, self.limits.replay_window);
        Ok((secret, session.caps, session.patch_versions.clone()))
    }

    fn check_doc(&self, doc: &DocKey) -> Result<(), ProtoError> {
        let bound = self.cfg.config.accounts.iter().any(|a| {
            (a.provider == "*" || a.provider == doc.provider.name()) && (a.account == "*" || a.account.as_bytes() == doc.account.as_slice())
        });
        if bound {
            Ok(())
        } else {
            Err(ProtoError::new(
                ErrorCode::KeyForbidden,
                format!("the {} account of this document is not bound to this instance", doc.provider.name()),
            ))
        }
    }

    // ---- SAVE (§5) -----------------------------------------------------

    async fn save(&self, request: &mut RequestBody) -> Result<Vec<u8>, Failure> {
        let started = Instant::now();
        // Step 2: only the structured part is read before the MAC is checked (§14).
        let (save, framing, body) = match self.read_structured(request).await {
            Ok(x) => x,
            Err(e) => {
                self.count_in("envelope", request.received as usize);
                return Err(e);
            }
        };
        self.count_in("envelope", framing.payload_offset);
        // Step 3.
        let (secret, caps, _device_patch_versions) = self.authenticate(Endpoint::Save, &save.header, framing.s(&body), &framing.mac)?;
        request.authenticated();
        let auth = Some((secret, framing.mac));
        let with_auth = |f: Failure| Failure { auth, ..f };
        // The items together are held to what one item may be (§9), before
        // anything is read or rebuilt for them: a DROPBOX_BATCH of `max_items`
        // files would otherwise hold `max_items` times one operation's memory.
        save_totals(&save, &self.limits).map_err(|e| with_auth(e.into()))?;
        // Steps 4-5.
        let resolved = {
            let mut sessions = self.sessions.lock().expect("sessions lock");
            let session = sessions
                .get(&save.header.session_id, Duration::from_secs(self.limits.session_idle_ttl))
                .ok_or_else(|| with_auth(Failure::new(ErrorCode::SessionUnknown, "the session ended")))?;
            session.define(&save.ctx_defs, &self.limits, &self.rules).map_err(|e| with_auth(e.into()))?;
            let ids: Vec<u64> = save.requests.iter().map(|q| q.ctx_id).collect();
            let table = session.contexts(&ids, Duration::from_secs(self.limits.context_idle_ttl));
            resolve_save(&save, table, &self.limits, &self.rules).map_err(|e| with_auth(e.into()))?
        };
        if caps & save.procedure.cap_bit() == 0 {
            return Err(with_auth(Failure::new(ErrorCode::Unsupported, format!("procedure {} was not negotiated", save.procedure.name()))));
        }
        let provider =
            resolved.docs.first().map(|d| d.provider).ok_or_else(|| with_auth(Failure::new(ErrorCode::InvalidRequest, "no items")))?;
        if resolved.docs.iter().any(|d| d.provider != provider) {
            return Err(with_auth(Failure::new(ErrorCode::InvalidRequest, "the items of one save name different providers")));
        }
        for d in &resolved.docs {
            self.check_doc(d).map_err(|e| with_auth(e.into()))?;
        }
        // Procedure shape and hosts, before the payloads are touched: the
        // files are not known yet, so check with empty ones.
        // Hosts now; the provider crate's shape rules that look at the files
        // (a Graph session cannot carry an empty file) run after the rebuild.
        let shape = build_procedure(save.procedure, &resolved.requests, &save.items, &vec![Bytes::new(); save.items.len()])
            .map_err(|e| with_auth(e.into()))?;
        self.upstream.check_hosts(provider_of(provider), &shape).map_err(|e| with_auth(proc_failure(e)))?;
        // The operation's slot before its payloads are read: `max_inflight`
        // bounds the payloads held, not only the procedures running.
        let inflight = self.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        self.metrics.inflight.inc();
        let _guard = InflightGuard(self);
        if inflight > self.limits.max_inflight {
            return Err(with_auth(Failure { retry_after_ms: 200, ..Failure::new(ErrorCode::Busy, "too many saves at once") }));
        }
        // Each save that starts leaves an in-flight marker for 16 minutes:
        // bounded in number. A retry of a save the EPS knows is not refused
        // (its claim answers it from its record, or waits for it).
        if !self.markers.room() && !self.knows(&save.header.request_id) {
            tracing::warn!(
                markers = Markers::MAX_ON_DISK,
                "a save is refused busy: the in-flight markers of the last 16 minutes are at their bound (a save a device repeats that fast?)"
            );
            return Err(with_auth(Failure {
                retry_after_ms: 1000,
                ..Failure::new(ErrorCode::Busy, "too many saves in the last 16 minutes")
            }));
        }
        // Step 6: the payloads, exactly as long as the items declare.
        let payload_bytes = request.read_exact_rest(save.payload_total()).await.map_err(|e| {
            with_auth(match e {
                BodyError::TooLarge(_) => Failure::new(ErrorCode::Malformed, "the payloads run on past what the items declare"),
                e => self.body_failure(e),
            })
        })?;
        // §7.3: the EPS's own time starts here; reading the body was the link's.
        note_timing(|t| t.body_read = Some(Instant::now()));
        let payloads = save.split_payloads(&payload_bytes).map_err(|e| with_auth(e.into()))?;
        for (item, payload) in save.items.iter().zip(&payloads) {
            self.count_in(if matches!(item.payload, Payload::Full) { "full" } else { "patch" }, payload.len());
        }
        // Step 7.
        let digest = operation_digest(save.procedure, &resolved.requests, &save.items, &resolved.docs);
        let request_id = save.header.request_id;
        let record_key = record_key(&digest, &resolved.requests);
        // Held until the outcome is recorded: a save that ends any other way
        // (stage 0, an error return, a panic) gives the id up or, once its
        // provider procedure started, records "outcome unknown" ([`SaveClaim`]).
        let mut claim = match self.claim(request_id, digest, &record_key, &resolved.docs).await {
            Claim::Replay(outcome) => {
                self.metrics.replays.inc();
                return self.save_result(&save, outcome, true, secret, &framing.mac).map_err(with_auth);
            }
            Claim::Conflict => {
                return Err(with_auth(Failure::new(ErrorCode::RequestIdConflict, "this request id was used for a different save")));
            }
            Claim::Busy => {
                return Err(with_auth(Failure {
                    retry_after_ms: 1000,
                    ..Failure::new(ErrorCode::InProgress, "the save with this request id is still running")
                }));
            }
            Claim::Mine(claim) => claim,
        };
        let proc_name = save.procedure.name();
        let provider_name = provider.name();
        let (performed, pins) = if streams(&save) {
            // Steps 8-10 at once (§5.6): the rebuild streams into the upload.
            self.stream_save(&save, &payloads, &resolved.requests, provider, &mut claim, &digest).await.map_err(with_auth)?
        } else {
            // Step 8.
            let files = self.rebuild(&save, &payloads).await.map_err(with_auth)?;
            let procedure = build_procedure(save.procedure, &resolved.requests, &save.items, &files).map_err(|e| with_auth(e.into()))?;
            self.upstream.check(provider_of(provider), &procedure).map_err(|e| with_auth(proc_failure(e)))?;
            // Step 9.
            let pins = self.store_targets(&files).await.map_err(with_auth)?;
            fail::fail_point!("eps::after_rebuild", |_| Err(Failure::new(ErrorCode::Internal, "fail point eps::after_rebuild")));
            // Step 10. From here a provider may hold the upload: a marker on disk
            // makes a retry after a crash answer "outcome unknown" instead of
            // uploading twice (§5.4).
            claim.provider_starts(&digest);
            let t = Instant::now();
            // Boxed as `dyn Future + Send` here, where the lifetimes are concrete:
            // the batch procedure's borrowed futures otherwise trip rustc's
            // higher-ranked Send inference inside hyper's service bound.
            let perform: std::pin::Pin<Box<dyn std::future::Future<Output = Result<ec_providers::Performed, ProcError>> + Send + '_>> =
                Box::pin(self.upstream.perform(provider_of(provider), procedure));
            let performed = perform.await;
            self.metrics.provider_seconds.get_or_create(&ProviderOnly { provider: provider_name }).observe(t.elapsed().as_secs_f64());
            note_timing(|timing| timing.provider = Some(timing.provider.unwrap_or_default() + t.elapsed()));
            (performed, pins.into_iter().map(Some).collect::<Vec<_>>())
        };
        fail::fail_point!("eps::after_provider", |_| Err(Failure::new(ErrorCode::Internal, "fail point eps::after_provider")));
        // Step 11.
        let outcome = match performed {
            Ok(p) => {
                // Each call with its own status (a session's 200s and the final 409 apart).
                self.count_provider_calls(provider_name, proc_name, &p.call_statuses);
                self.metrics.provider_bytes.get_or_create(&Direction { direction: "out" }).inc_by(p.bytes_sent);
                self.metrics.provider_bytes.get_or_create(&Direction { direction: "in" }).inc_by(p.bytes_received);
                if p.hash_disagreement {
                    self.metrics.hash_disagreements.get_or_create(&ProviderOnly { provider: provider_name }).inc();
                }
                let head = response_head(&p.response);
                let outcome = Outcome::Response { head, body: p.response.body.to_vec(), hash_disagreement: p.hash_disagreement };
                let record = encode_outcome(&request_id, &digest, &record_key, &outcome, &p.response);
                for (i, ok) in p.succeeded_items.iter().enumerate() {
                    if !ok {
                        continue;
                    }
                    // A streamed save whose file could not enter the CAS (§5.6) moves no pointer.
                    let Some(pin) = pins.get(i).cloned().flatten() else { continue };
                    let key = resolved.docs[i].encode();
                    let store = self.store.clone();
                    let rec = record.clone();
                    let set_at = Instant::now();
                    let set = tokio::task::spawn_blocking(move || store.set_document(&key, &pin, rec.as_deref())).await;
                    tracing::debug!(pointer_ms = set_at.elapsed().as_secs_f64() * 1e3, "pointer written");
                    if !matches!(set, Ok(Ok(()))) {
                        // The provider has the file; losing the pointer only costs a full upload next time.
                        tracing::warn!("could not record the last-synced version after a successful save");
                    } else if matches!(save.items[i].payload, Payload::Full) {
                        self.learn_later(payload_bytes.slice_ref(payloads[i]));
                    }
                }
                tracing::info!(
                    request = %hex::encode(request_id),
                    procedure = proc_name,
                    provider = provider_name,
                    status = p.response.status,
                    calls = p.calls,
                    ms = started.elapsed().as_millis() as u64,
                    "save forwarded"
                );
                outcome
            }
            Err(e) => {
                self.count_provider_calls(provider_name, proc_name, &e.call_statuses);
                if e.stage == 0 {
                    // Nothing reached a provider: the device may fall back, and may retry this id.
                    claim.nothing_sent();
                    return Err(with_auth(proc_failure(e)));
                }
                let f = proc_failure(e);
                Outcome::Failed { code: f.err.code, stage: f.stage, detail: f.err.detail }
            }
        };
        // The marker stays (see `Markers`): a retry after a restart is answered
        // from the persisted record if there is one, else "outcome unknown";
        // never performed again.
        claim.finish(&outcome);
        self.metrics.save_seconds.get_or_create(&ProcedureOnly { procedure: proc_name }).observe(started.elapsed().as_secs_f64());
        self.update_store_gauges();
        self.save_result(&save, outcome, false, secret, &framing.mac).map_err(with_auth)
    }

    /// After a save that sent `file` whole (the document's first, or one the
    /// device's rule sent whole), or a download sent to the device whole, made
    /// it the document's last-synced version: learns its block-parallel
    /// members' layouts and contents on a blocking thread started as the
    /// answer leaves ([`ec_patch::learn`], every block checked), so that the rebuild of the next patch against it copies the
    /// unchanged blocks and makes the shifted ones from its parse, as after a
    /// patched save, instead of deflating every block with zlib. One file at a
    /// time: a file that comes while another is being learnt is not learnt
    /// (its next patch is only slower). Within the patch limits (inflated
    /// sizes) and the kept-content bound.
    fn learn_later(&self, file: Bytes) {
        let Ok(permit) = self.learning.clone().try_acquire_owned() else { return };
        let (limits, learnt, kept) = (self.patch_limits, self.metrics.learnt_members.clone(), self.metrics.kept_content_bytes.clone());
        tokio::task::spawn_blocking(move || {
            let _one_at_a_time = permit;
            let t = Instant::now();
            match ec_patch::learn(&file, &limits, false) {
                Ok(members) => {
                    learnt.inc_by(members as u64);
                    kept.set(ec_patch::kept_bytes() as i64);
                    tracing::debug!(members, bytes = file.len(), ms = t.elapsed().as_secs_f64() * 1e3, "learnt a file sent whole");
                }
                Err(e) => tracing::debug!(error = %e, "could not learn a file sent whole"),
            }
        });
    }

    /// Turns an outcome into the SAVE_RESULT (or the recorded ERROR).
    fn save_result(
        &self,
        save: &Save,
        outcome: Outcome,
        replayed: bool,
        secret: [u8; 32],
        req_mac: &[u8; MAC_LEN],
    ) -> Result<Vec<u8>, Failure> {
        let (head, body, hash_disagreement) = match outcome {
            Outcome::Response { head, body, hash_disagreement } => (head, body, hash_disagreement),
            Outcome::Failed { code, stage, detail } => return Err(Failure::new(code, detail).stage(stage)),
        };
        let (head_cb, body_cb, ref_used) = self.code_response(save.header.session_id, save.header.resp_ref, &head, &body);
        let result = SaveResult { flags: ResultFlags { replayed, ref_used, hash_disagreement }, head: head_cb, body: body_cb };
        Ok(result.encode(&secret, req_mac))
    }

    /// Codes a response against the one the device named, if this session sent it (§4.6.2).
    fn code_response(&self, session_id: [u8; 8], resp_ref: Option<[u8; 8]>, head: &[u8], body: &[u8]) -> (Cb, Cb, bool) {
        let mut sessions = self.sessions.lock().expect("sessions lock");
        let session = sessions.get(&session_id, Duration::from_secs(self.limits.session_idle_ttl));
        let Some(session) = session else {
            return (Cb::best(&[], head), Cb::best(&[], body), false);
        };
        let use_ref = session.caps & CAP_RESP_REF != 0;
        let reference = if use_ref { resp_ref.and_then(|d| session.response(&d)) } else { None };
        let (head_cb, body_cb, used) = match &reference {
            Some(r) => (Cb::best(&r.head, head), Cb::best(&r.body, body), true),
            None => (Cb::best(&[], head), Cb::best(&[], body), false),
        };
        if use_ref {
            session.remember(
                response_digest(head, body),
                CachedResponse { head: head.to_vec(), body: body.to_vec() },
                self.limits.resp_cache as usize,
                self.response_cache_share,
            );
        }
        self.metrics.response_cache_bytes.set(sessions.response_bytes() as i64);
        (head_cb, body_cb, used)
    }

    /// Step 7: claims `request_id` for this save, or finds its outcome.
    /// Whether a save with this request id ran or runs: an outcome record,
    /// or an in-flight marker (in memory since the start, or on disk).
    fn knows(&self, request_id: &[u8; 8]) -> bool {
        self.outcomes.lock().expect("outcomes lock").map.contains_key(request_id)
            || self.markers.unknown(request_id).is_some()
            || self.markers.on_disk(request_id).is_some()
    }

    async fn claim(&self, request_id: [u8; 8], digest: [u8; 32], record_key: &[u8; 32], docs: &[DocKey]) -> Claim<'_> {
        enum Found {
            Running(watch::Receiver<Option<Outcome>>),
            Done(Outcome),
            Dropped(u16),
        }
        let (forgotten_any, existing) = {
            let mut outcomes = self.outcomes.lock().expect("outcomes lock");
            // Keep records at least 15 minutes and at least the last 256.
            outcomes.prune();
            let forgotten_any = outcomes.forgotten > 0;
            let existing = match outcomes.map.get(&request_id) {
                Some(e) if e.digest != digest => return Claim::Conflict,
                Some(e) => Some(match &e.record {
                    // Not left by a [`SaveClaim`], which resolves its record before
                    // its channel closes; never performed again all the same.
                    Record::Running(rx) if rx.has_changed().is_err() && rx.borrow().is_none() => {
                        return Claim::Replay(outcome_unknown("the save with this request id ended without an outcome"));
                    }
                    Record::Running(rx) => Found::Running(rx.clone()),
                    Record::Done(o) => Found::Done(o.clone()),
                    Record::Dropped { status } => Found::Dropped(*status),
                }),
                None => None,
            };
            (forgotten_any, existing)
        };
        let dropped = match existing {
            None => None,
            Some(Found::Done(o)) => return Claim::Replay(o),
            Some(Found::Dropped(status)) => Some(status),
            Some(Found::Running(mut rx)) => {
                // A retry while the procedure runs waits for its outcome (§5.4 SHOULD).
                let wait = Duration::from_secs(self.limits.op_timeout);
                let got = tokio::time::timeout(wait, async {
                    loop {
                        if let Some(o) = rx.borrow().clone() {
                            return Some(o);
                        }
                        if rx.changed().await.is_err() {
                            return None;
                        }
                    }
                })
                .await;
                return match got {
                    Ok(Some(o)) => Claim::Replay(o),
                    // The save that held the claim ended without an outcome: its
                    // [`SaveClaim`] gave the id up (nothing reached a provider:
                    // this transmission may run the save) or recorded "outcome
                    // unknown" first.
                    Ok(None) => Box::pin(self.claim(request_id, digest, record_key, docs)).await,
                    Err(_) => Claim::Busy,
                };
            }
        };
        // After a restart, or a record that let go of its response: the
        // document's persisted outcome record.
        for d in docs {
            let store = self.store.clone();
            let key = d.encode();
            let rec = tokio::task::spawn_blocking(move || store.document(&key)).await;
            if let Ok(Ok(Some(p))) = rec {
                if let Some((rid, dg, outcome)) = p.outcome.as_deref().and_then(|b| decode_outcome(b, record_key)) {
                    if rid == request_id {
                        if dg != digest {
                            return Claim::Conflict;
                        }
                        return Claim::Replay(
                            outcome.unwrap_or(Outcome::Failed {
                                code: ErrorCode::ProviderTimeout,
                                stage: 1,
                                detail:
                                    "this save was performed before the EPS restarted; its record does not open, so its outcome is unknown"
                                        .into(),
                            }),
                        );
                    }
                }
            }
        }
        if let Some(status) = dropped {
            // Performed once, and never again (§5.4): its answer is gone.
            return Claim::Replay(Outcome::Failed {
                code: ErrorCode::ProviderTimeout,
                stage: 1,
                detail: format!(
                    "this save was performed (the provider answered {status}); its response was not kept (outcome record budget), \
                     so it cannot be given again"
                ),
            });
        }
        // After a restart: a save that started and never recorded its outcome.
        // At run time, a save whose record was forgotten past
        // [`Outcomes::MAX_RECORDS`]: its marker is on disk.
        let started = self.markers.unknown(&request_id).or_else(|| forgotten_any.then(|| self.markers.on_disk(&request_id)).flatten());
        if let Some(started) = started {
            return if started == digest {
                Claim::Replay(outcome_unknown("this save started before the EPS restarted and its outcome was not kept"))
            } else {
                Claim::Conflict
            };
        }
        let (tx, rx) = watch::channel(None);
        let raced = {
            let mut outcomes = self.outcomes.lock().expect("outcomes lock");
            match outcomes.map.entry(request_id) {
                std::collections::hash_map::Entry::Occupied(_) => true,
                std::collections::hash_map::Entry::Vacant(_) => {
                    outcomes.make_room();
                    outcomes.map.insert(request_id, OutcomeEntry { digest, record: Record::Running(rx), at: Instant::now() });
                    false
                }
            }
        };
        if raced {
            // Another transmission of this request claimed it meanwhile: wait for it.
            return Box::pin(self.claim(request_id, digest, record_key, docs)).await;
        }
        Claim::Mine(SaveClaim { svc: self, request_id, tx: Some(tx), provider_started: false })
    }

    /// Step 8: rebuild every item and check it.
    async fn rebuild(&self, save: &Save, payloads: &[&[u8]]) -> Result<Vec<Bytes>, Failure> {
        let t = Instant::now();
        let bases = self.bases(save, payloads).await?;
        self.apply_items(save, payloads, bases, t).await
    }

    /// Step 8, first part: every PATCH item's patch header and base, so that
    /// every missing base is listed at once (`base_unknown`).
    async fn bases(&self, save: &Save, payloads: &[&[u8]]) -> Result<Vec<Option<(ec_patch::Patch, ec_store::Blob)>>, Failure> {
        // Patch headers and bases first, so every missing base is listed at once.
        let mut bases = Vec::with_capacity(save.items.len());
        let mut missing = Vec::new();
        // The bases together, as the files together (§9): checked before each is read.
        let mut base_total = 0u64;
        for (i, (item, payload)) in save.items.iter().zip(payloads).enumerate() {
            match item.payload {
                Payload::Full => bases.push(None),
                Payload::Patch { .. } => {
                    let patch = ec_patch::decode(payload, &self.patch_limits).map_err(|e| Failure {
                        cause: e.code().to_string(),
                        ..Failure::from(ProtoError::with_list(
                            ErrorCode::PatchFailed,
                            format!("item {i}: the patch does not decode"),
                            vec![i as u64],
                        ))
                    })?;
                    if patch.target_size != item.target_size || patch.target_sha256 != item.target_sha256 {
                        return Err(Failure::new(
                            ErrorCode::InvalidRequest,
                            format!("item {i}: the patch's target differs from the item's"),
                        ));
                    }
                    base_total = base_total.saturating_add(patch.base_size);
                    if base_total > self.limits.max_item_size {
                        return Err(Failure::new(
                            ErrorCode::TooLarge,
                            format!(
                                "the bases of the items' patches come to more than max_item_size ({} bytes) together",
                                self.limits.max_item_size
                            ),
                        ));
                    }
                    let store = self.store.clone();
                    let (named, size) = (patch.base_hash, patch.base_size);
                    // A version 2 patch names its base by a prefix of its SHA-256; the CAS
                    // resolves it to the whole hash (protocol §5.2).
                    let base = tokio::task::spawn_blocking(move || match store.find_blob(named.bytes(), size) {
                        Some(sha) => store.get_blob(&sha, size),
                        None => Ok(None),
                    })
                    .await
                    .map_err(|_| Failure::new(ErrorCode::Internal, "the store task failed"))?
                    .map_err(|e| {
                        tracing::warn!("store: {e}");
                        Failure::new(ErrorCode::StorageError, "the store could not read a base")
                    })?;
                    match base {
                        Some(b) => bases.push(Some((patch, b))),
                        None => {
                            missing.push(i as u64);
                            bases.push(None);
                        }
                    }
                }
            }
        }
        if !missing.is_empty() {
            self.metrics.base_unknown.inc();
            return Err(ProtoError::with_list(
                ErrorCode::BaseUnknown,
                format!("{} item(s) have no base here; send them FULL", missing.len()),
                missing,
            )
            .into());
        }
        Ok(bases)
    }

    /// Step 8, second part: applies the patches and checks every file.
    async fn apply_items(
        &self,
        save: &Save,
        payloads: &[&[u8]],
        bases: Vec<Option<(ec_patch::Patch, ec_store::Blob)>>,
        t: Instant,
    ) -> Result<Vec<Bytes>, Failure> {
        let mut out = Vec::with_capacity(save.items.len());
        let mut mismatched = Vec::new();
        for (i, ((item, payload), base)) in save.items.iter().zip(payloads).zip(bases).enumerate() {
            let file: Vec<u8> = match base {
                None => payload.to_vec(),
                Some((patch, blob)) => {
                    fail::fail_point!("eps::before_rebuild", |_| Err(Failure::new(ErrorCode::Internal, "fail point eps::before_rebuild")));
                    let limits = self.patch_limits;
                    let applied = tokio::task::spawn_blocking(move || {
                        // No reservation from the declared size: a forged patch may
                        // declare 2 GiB (issue 8); the output grows as it is made.
                        let mut v = Vec::new();
                        ec_patch::apply_decoded(&blob.data, &patch, &mut v, &limits).map(|stats| (v, stats.reused_blocks))
                    })
                    .await
                    .map_err(|_| Failure::new(ErrorCode::Internal, "the rebuild task failed"))?;
                    let (v, copied) = applied.map_err(|e| patch_failed(i, &e))?;
                    self.metrics.blocks_copied.inc_by(copied);
                    v
                }
            };
            let file = Bytes::from(file);
            let f2 = file.clone();
            let hash = tokio::task::spawn_blocking(move || sha256(&f2))
                .await
                .map_err(|_| Failure::new(ErrorCode::Internal, "hash task failed"))?;
            if file.len() as u64 != item.target_size || hash != item.target_sha256 {
                mismatched.push(i as u64);
            }
            out.push(file);
        }
        if !mismatched.is_empty() {
            self.metrics.target_mismatch.inc();
            return Err(ProtoError::with_list(
                ErrorCode::TargetMismatch,
                "the rebuilt or received file does not have the target size and SHA-256",
                mismatched,
            )
            .into());
        }
        self.metrics.rebuild_seconds.observe(t.elapsed().as_secs_f64());
        if save.items.iter().any(|item| matches!(item.payload, Payload::Patch { .. })) {
            // Told to the device in the answer's Server-Timing (§7.3): it charges the rebuild to its next patch-or-whole decision.
            note_timing(|timing| timing.rebuild = Some(t.elapsed()));
        }
        Ok(out)
    }

    /// Steps 8-10 of a streamed save (§5.6): one SINGLE request, one PATCH
    /// item. The patch header and base are checked first (stage 0, as in
    /// step 8), then the rebuild starts on a blocking thread, feeding a
    /// [`Forward`]; the in-flight marker is written before the request is
    /// handed to the provider client, whose body is fed as the file is made
    /// and whose last bytes wait for the file's size and SHA-256 to verify.
    /// The verified file enters the CAS while the tail is sent and the
    /// provider answers. A rebuild or verification failure aborts the request
    /// short of its `Content-Length` and is answered as step 8 answers it, at
    /// stage 0 (the marker dropped): no provider request was completed.
    /// Returns the procedure's result and the item's pin (`None`: the CAS
    /// write failed after the upload started, so no pointer will move).
    async fn stream_save(
        &self,
        save: &Save,
        payloads: &[&[u8]],
        requests: &[ResolvedRequest],
        provider: Provider,
        claim: &mut SaveClaim<'_>,
        digest: &[u8; 32],
    ) -> Result<(Result<ec_providers::Performed, ProcError>, Vec<Option<BlobPin>>), Failure> {
        let t = Instant::now();
        let item = &save.items[0];
        let Some(Some((patch, blob))) = self.bases(save, payloads).await?.pop() else {
            return Err(Failure::new(ErrorCode::Internal, "a streamed save has one PATCH item"));
        };
        let based = t.elapsed();
        if patch.target_size != item.target_size || patch.target_sha256 != item.target_sha256 {
            return Err(Failure::new(ErrorCode::InvalidRequest, "item 0: the patch's target differs from the item's"));
        }
        // The request's body without the file: the feed brings it.
        let procedure = build_procedure(save.procedure, requests, &save.items, &[Bytes::new()])?;
        self.upstream.check(provider_of(provider), &procedure).map_err(proc_failure)?;
        fail::fail_point!("eps::before_rebuild", |_| Err(Failure::new(ErrorCode::Internal, "fail point eps::before_rebuild")));
        let (tx, rx) = tokio::sync::mpsc::channel(FEED_DEPTH);
        let feed = ec_providers::FileFeed { len: item.target_size, rx };
        let (size, sha) = (item.target_size, item.target_sha256);
        let limits = self.patch_limits;
        let rb_start = Instant::now();
        let rebuild = tokio::task::spawn_blocking(move || stream_rebuild(&blob.data, &patch, &limits, size, sha, tx));
        // Step 10 starts: the marker before the first byte leaves (§5.4).
        claim.provider_starts(digest);
        let pv_start = Instant::now();
        let perform: std::pin::Pin<Box<dyn std::future::Future<Output = Result<ec_providers::Performed, ProcError>> + Send + '_>> =
            Box::pin(self.upstream.perform_streamed(provider_of(provider), procedure, feed));
        let checked = async {
            let rebuilt = match rebuild.await {
                Ok(r) => r,
                Err(_) => return (Err(Failure::new(ErrorCode::Internal, "the rebuild task failed")), None),
            };
            match rebuilt {
                // Step 9, while the tail is sent and the provider answers.
                Ok((file, own, copied)) => {
                    self.metrics.blocks_copied.inc_by(copied);
                    let verified = t.elapsed();
                    let pin = self.store_targets(std::slice::from_ref(&file)).await;
                    (Ok((own, verified, t.elapsed())), Some(pin))
                }
                Err(f) => (Err(f), None),
            }
        };
        let performed = async {
            let p = perform.await;
            (p, t.elapsed())
        };
        let ((performed, answered), (rebuilt, pin)) = tokio::join!(performed, checked);
        let pv = pv_start.elapsed();
        let provider_name = provider.name();
        self.metrics.provider_seconds.get_or_create(&ProviderOnly { provider: provider_name }).observe(pv.as_secs_f64());
        note_timing(|timing| timing.provider = Some(timing.provider.unwrap_or_default() + pv));
        let own = match rebuilt {
            Ok((own, verified, stored)) => {
                // Where a streamed save's time went (`EC_EPS_LOG=debug`), from the end of the body's read.
                tracing::debug!(
                    base_ms = based.as_secs_f64() * 1e3,
                    rebuild_ms = own.as_secs_f64() * 1e3,
                    verified_at_ms = verified.as_secs_f64() * 1e3,
                    stored_at_ms = stored.as_secs_f64() * 1e3,
                    answered_at_ms = answered.as_secs_f64() * 1e3,
                    "streamed save"
                );
                own
            }
            Err(f) => {
                if f.err.code == ErrorCode::TargetMismatch {
                    self.metrics.target_mismatch.inc();
                }
                let statuses = match &performed {
                    Ok(p) => p.call_statuses.clone(),
                    Err(e) => e.call_statuses.clone(),
                };
                self.count_provider_calls(provider_name, save.procedure.name(), &statuses);
                if performed.as_ref().is_ok_and(|p| (200..300).contains(&p.response.status)) {
                    // A provider that accepted a body it never got whole: not a provider these APIs describe.
                    tracing::error!("the provider accepted a streamed upload that was aborted before its end");
                    let e = ProcError {
                        kind: ProcErrorKind::Protocol,
                        stage: 1,
                        detail: "the provider accepted an upload that was aborted before its end".into(),
                        call_statuses: vec![],
                    };
                    return Ok((Err(e), vec![None]));
                }
                // The tail never left: no provider request was completed (§5.6), so stage 0.
                claim.nothing_sent();
                return Err(f);
            }
        };
        // The whole rebuild (headers and base, then applying and checking, less
        // the waits for the upload to take pieces); `ov`: its part during the
        // provider exchange (§7.3).
        let rb = rb_start.saturating_duration_since(t) + own;
        let overlap = rb.saturating_sub(pv_start.saturating_duration_since(t)).min(pv);
        self.metrics.rebuild_seconds.observe(rb.as_secs_f64());
        self.metrics.saves_streamed.inc();
        note_timing(|timing| {
            timing.rebuild = Some(rb);
            timing.overlap = Some(overlap);
        });
        let pin = match pin {
            Some(Ok(mut pins)) => pins.pop(),
            _ => {
                // The provider may hold the file already: the save goes on, and
                // losing this version only costs a base_unknown next time.
                tracing::warn!("a streamed save's file could not enter the store; its pointer will not move");
                None
            }
        };
        Ok((performed, vec![pin]))
    }

    /// Step 9: writes every target into the store, pinned while the save runs.
    async fn store_targets(&self, files: &[Bytes]) -> Result<Vec<BlobPin>, Failure> {
        let mut pins = Vec::with_capacity(files.len());
        for file in files {
            let store = self.store.clone();
            let f2 = file.clone();
            let pin = tokio::task::spawn_blocking(move || store.put_blob(&f2))
                .await
                .map_err(|_| Failure::new(ErrorCode::Internal, "the store task failed"))?
                .map_err(|e| {
                    tracing::warn!("store: {e}");
                    Failure::new(ErrorCode::StorageError, "the store could not write the new version")
                })?;
            pins.push(pin);
        }
        Ok(pins)
    }

    // ---- FETCH (§4.8) --------------------------------------------------

    async fn fetch(&self, body: Bytes, request: &mut RequestBody) -> Result<Vec<u8>, Failure> {
        let (fetch, framing) = Fetch::decode(&body, &self.limits)?;
        if framing.payload_offset != body.len() {
            return Err(Failure::new(ErrorCode::Malformed, "bytes after the FETCH message"));
        }
        let (secret, caps, device_patch_versions) = self.authenticate(Endpoint::Fetch, &fetch.header, framing.s(&body), &framing.mac)?;
        request.authenticated();
        let auth = Some((secret, framing.mac));
        let with_auth = |f: Failure| Failure { auth, ..f };
        let resolved = {
            let mut sessions = self.sessions.lock().expect("sessions lock");
            let session = sessions
                .get(&fetch.header.session_id, Duration::from_secs(self.limits.session_idle_ttl))
                .ok_or_else(|| with_auth(Failure::new(ErrorCode::SessionUnknown, "the session ended")))?;
            session.define(&fetch.ctx_defs, &self.limits, &self.rules).map_err(|e| with_auth(e.into()))?;
            let table = session.contexts(&[fetch.request.ctx_id], Duration::from_secs(self.limits.context_idle_ttl));
            resolve_fetch(&fetch, table, &self.limits, &self.rules).map_err(|e| with_auth(e.into()))?
        };
        if caps & CAP_FETCH == 0 || (fetch.follow_redirect && caps & CAP_FOLLOW == 0) {
            return Err(with_auth(Failure::new(ErrorCode::Unsupported, "FETCH was not negotiated")));
        }
        self.check_doc(&resolved.doc).map_err(|e| with_auth(e.into()))?;
        let provider = resolved.doc.provider;
        let mut request = provider_request(&resolved.request, &[]);
        // §6.8: the body must be the file.
        request.headers.retain(|(n, _)| n != "accept-encoding");
        request.headers.push(("accept-encoding".into(), b"identity".to_vec()));
        let inflight = self.inflight.fetch_add(1, Ordering::SeqCst) + 1;
        self.metrics.inflight.inc();
        let _guard = InflightGuard(self);
        if inflight > self.limits.max_inflight {
            return Err(with_auth(Failure { retry_after_ms: 200, ..Failure::new(ErrorCode::Busy, "too many saves and fetches at once") }));
        }
        let fetched = match self.upstream.fetch(provider_of(provider), request, fetch.follow_redirect).await {
            Ok(f) => f,
            Err(e) => {
                self.count_provider_calls(provider.name(), "fetch", &e.call_statuses);
                return Err(with_auth(proc_failure(e)));
            }
        };
        self.count_provider_calls(provider.name(), "fetch", &fetched.call_statuses);
        self.metrics.provider_bytes.get_or_create(&Direction { direction: "in" }).inc_by(fetched.response.body.len() as u64);
        if fetched.hash_disagreement {
            self.metrics.hash_disagreements.get_or_create(&ProviderOnly { provider: provider.name() }).inc();
        }
        let mut parts = Vec::new();
        let mut flags = ResultFlags { replayed: false, ref_used: false, hash_disagreement: fetched.hash_disagreement };
        if let Some(r) = &fetched.redirect {
            let (h, b, _) = self.code_response(fetch.header.session_id, None, &response_head(r), &r.body);
            parts.push(FetchPart { head: h, body: FetchBody::Inline(b) });
        }
        let resp = &fetched.response;
        let head = response_head(resp);
        let identity = resp.header("content-encoding").is_none_or(|v| v.eq_ignore_ascii_case(b"identity"));
        let mut payload = Vec::new();
        if resp.status == 200 {
            let file = resp.body.clone();
            let target_sha256 = {
                let f = file.clone();
                tokio::task::spawn_blocking(move || sha256(&f))
                    .await
                    .map_err(|_| with_auth(Failure::new(ErrorCode::Internal, "hash task failed")))?
            };
            let target_size = file.len() as u64;
            let storable = !fetched.hash_disagreement && identity;
            let mut body_kind = FetchBody::Full { target_size, target_sha256 };
            // The newest edit-patch version both sides read (the device lists its own newest first).
            let version = device_patch_versions.iter().copied().find(|v| PATCH_VERSIONS.contains(v));
            if let (true, Some(version)) = (storable, version) {
                if let Some(have) = fetch.have_sha256 {
                    if let Some(patch) = self.patch_from(&resolved.doc, have, file.clone(), version).await {
                        if (patch.len() as u64) < target_size {
                            body_kind = FetchBody::Patch { target_size, target_sha256, payload_len: patch.len() as u64 };
                            payload = patch;
                        }
                    }
                }
            }
            if matches!(body_kind, FetchBody::Full { .. }) {
                payload = file.to_vec();
            }
            let (h, _, used) = self.code_response(
                fetch.header.session_id,
                if fetched.redirect.is_none() { fetch.header.resp_ref } else { None },
                &head,
                &[],
            );
            flags.ref_used = used;
            let whole = matches!(body_kind, FetchBody::Full { .. });
            parts.push(FetchPart { head: h, body: body_kind });
            if storable {
                let store = self.store.clone();
                let key = resolved.doc.encode();
                let f = file.clone();
                if !matches!(tokio::task::spawn_blocking(move || store.put_document(&key, &f, None)).await, Ok(Ok(_))) {
                    tracing::warn!("could not record a downloaded version");
                } else if whole {
                    // Sent whole, so not diffed here: learnt for the next save's patch against it.
                    self.learn_later(file.clone());
                }
            }
        } else {
            let (h, b, used) = self.code_response(
                fetch.header.session_id,
                if fetched.redirect.is_none() { fetch.header.resp_ref } else { None },
                &head,
                &resp.body,
            );
            flags.ref_used = used;
            parts.push(FetchPart { head: h, body: FetchBody::Inline(b) });
        }
        let kind = match parts.last().map(|p| &p.body) {
            Some(FetchBody::Patch { .. }) => "patch",
            Some(FetchBody::Full { .. }) => "full",
            _ => "envelope",
        };
        self.metrics.device_bytes.get_or_create(&DeviceBytes { direction: "out", kind }).inc_by(payload.len() as u64);
        let result = FetchResult { flags, parts };
        let mut bytes = result.encode(&secret, &framing.mac);
        bytes.extend_from_slice(&payload);
        self.update_store_gauges();
        Ok(bytes)
    }

    /// An edit patch from the stored version `have` to `file`, if the store holds `have`,
    /// in edit-patch format `version` at most.
    async fn patch_from(&self, doc: &DocKey, have: [u8; 32], file: Bytes, version: u8) -> Option<Vec<u8>> {
        let store = self.store.clone();
        let key = doc.encode();
        let opts = ec_patch::DiffOptions { limits: self.patch_limits, max_version: Some(version), ..Default::default() };
        tokio::task::spawn_blocking(move || {
            // The device's version, by its hash (§6.8): the document's pointer first (FETCH names no
            // size), else any version this user's store holds, such as the same file saved under
            // another addressing form (a driveItem by path, downloaded by id). `get_blob` verifies it.
            let size = match store.document(&key).ok().flatten().filter(|p| p.sha256 == have) {
                Some(pointer) => pointer.size,
                None => store.blob_size(&have)?,
            };
            let base = store.get_blob(&have, size).ok().flatten()?;
            let p = ec_patch::diff(&base.data, &file, &opts).ok()?;
            Some(ec_patch::encode(&p))
        })
        .await
        .ok()
        .flatten()
    }
}

enum Claim<'a> {
    Mine(SaveClaim<'a>),
    Replay(Outcome),
    Conflict,
    Busy,
}

/// A save's claim on its request id (step 7), held until its outcome is
/// recorded ([`SaveClaim::finish`]). A save that ends any other way (at
/// stage 0, by an error return, or by a panic that ends its task) drops it,
/// and the record is resolved at once, without waiting for a retry: given
/// up if no provider request can have been sent (a retry runs the save),
/// "outcome unknown" (`provider_timeout`, stage 1) from the moment the
/// provider procedure started ([`SaveClaim::provider_starts`]), so that a
/// retry is never performed again. Claims are taken after the save's
/// `max_inflight` slot, so at most `max_inflight` records are running.
struct SaveClaim<'a> {
    svc: &'a Service,
    request_id: [u8; 8],
    /// Until the outcome is recorded: the retries waiting for it listen.
    tx: Option<watch::Sender<Option<Outcome>>>,
    /// Whether a provider may hold the upload (step 10 started, the in-flight marker written).
    provider_started: bool,
}

impl SaveClaim<'_> {
    /// Step 10 starts: from here a provider may hold the upload. The in-flight
    /// marker on disk makes a retry after a crash answer "outcome unknown"
    /// instead of uploading twice (§5.4); this claim does the same for a save
    /// whose task ends without recording its outcome.
    fn provider_starts(&mut self, digest: &[u8; 32]) {
        self.provider_started = true;
        self.svc.markers.start(&self.request_id, digest);
    }

    /// The procedure ended at stage 0 after all: no provider request was
    /// completed (§5.6), so a retry may run the save.
    fn nothing_sent(&mut self) {
        self.provider_started = false;
        self.svc.markers.forget(&self.request_id);
    }

    /// Records the save's outcome and hands it to the retries waiting for it.
    fn finish(mut self, outcome: &Outcome) {
        let Some(tx) = self.tx.take() else { return };
        {
            let mut outcomes = self.svc.outcomes.lock().expect("outcomes lock");
            outcomes.finish(self.request_id, outcome);
            self.svc.metrics.outcome_record_bytes.set(outcomes.bytes as i64);
        }
        let _ = tx.send(Some(outcome.clone()));
    }
}

impl Drop for SaveClaim<'_> {
    fn drop(&mut self) {
        let Some(tx) = self.tx.take() else { return };
        // A panic elsewhere may have poisoned the lock; the records are still whole.
        let mut outcomes = self.svc.outcomes.lock().unwrap_or_else(|e| e.into_inner());
        if !self.provider_started {
            outcomes.map.remove(&self.request_id);
            return;
        }
        tracing::error!(
            request = %hex::encode(self.request_id),
            "a save ended without recording its outcome after its provider procedure started; a retry will be answered 'outcome unknown'"
        );
        let outcome = outcome_unknown("the save with this request id ended inside the EPS after its upload started");
        outcomes.finish(self.request_id, &outcome);
        self.svc.metrics.outcome_record_bytes.set(outcomes.bytes as i64);
        drop(outcomes);
        // The record first, then the answer: a retry woken by it finds the record.
        let _ = tx.send(Some(outcome));
    }
}

/// The outcome of a save that may have reached its provider and whose answer
/// is not known: `provider_timeout` at stage 1 (the device answers the app
/// 504, §7.1), never a second attempt.
fn outcome_unknown(why: &str) -> Outcome {
    Outcome::Failed { code: ErrorCode::ProviderTimeout, stage: 1, detail: format!("{why}; whether the provider holds it is unknown") }
}

struct InflightGuard<'a>(&'a Service);

impl Drop for InflightGuard<'_> {
    fn drop(&mut self) {
        *self.0.last_done.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
        self.0.inflight.fetch_sub(1, Ordering::SeqCst);
        self.0.metrics.inflight.dec();
        self.0.metrics.kept_content_bytes.set(ec_patch::kept_bytes() as i64);
        self.0.done.notify_one();
    }
}

fn truncate_detail(s: &str) -> String {
    let mut d = s.to_owned();
    while d.len() > ec_protocol::MAX_DETAIL as usize {
        d.pop();
    }
    d
}

fn proc_failure(e: ProcError) -> Failure {
    let code = match e.kind {
        ProcErrorKind::Unreachable => ErrorCode::ProviderUnreachable,
        ProcErrorKind::Timeout => ErrorCode::ProviderTimeout,
        ProcErrorKind::Truncated => ErrorCode::ProviderTruncated,
        ProcErrorKind::Protocol => ErrorCode::ProviderProtocol,
        ProcErrorKind::HostForbidden => ErrorCode::HostForbidden,
        ProcErrorKind::Invalid => ErrorCode::InvalidRequest,
    };
    Failure::new(code, e.detail.clone()).stage(e.stage)
}

/// The canonical response head of a provider response (§4.6.1).
fn response_head(r: &ProviderResponse) -> Vec<u8> {
    ResponseHead { status: r.status, reason: r.reason.as_bytes().to_vec(), fields: r.headers.clone() }.to_bytes()
}

/// A resolved request as the provider client takes it.
fn provider_request(q: &ResolvedRequest, files: &[Bytes]) -> ProviderRequest {
    let body = match &q.body {
        ResolvedBody::Empty => Body::Empty,
        ResolvedBody::Bytes(b) => Body::Bytes(Bytes::from(b.clone())),
        ResolvedBody::File { item } => Body::File(files.get(*item).cloned().unwrap_or_default()),
        ResolvedBody::Wrapped { item, bytes, split } => Body::Wrapped {
            prefix: Bytes::copy_from_slice(&bytes[..*split]),
            file: files.get(*item).cloned().unwrap_or_default(),
            suffix: Bytes::copy_from_slice(&bytes[*split..]),
        },
    };
    ProviderRequest {
        method: http::Method::from_bytes(q.head.method.as_bytes()).unwrap_or(http::Method::POST),
        url: q.head.url.clone(),
        headers: q.head.fields.clone(),
        body,
    }
}

/// Messages of a streamed file in flight at once (each up to [`FORWARD_MAX`]).
const FEED_DEPTH: usize = 8;
/// A streamed file goes to the upload in pieces of at least this much (the
/// last piece before the held-back tail may be shorter)…
const FORWARD_MIN: usize = 16 << 10;
/// …and at most this much.
const FORWARD_MAX: usize = 256 << 10;
/// The end of a streamed file held back until it is verified (§5.6): this
/// much, or the whole file if it is smaller.
const HOLD_BACK: usize = 64 << 10;

/// Whether a save is streamed (§5.6): a SINGLE procedure (its file goes in
/// one provider request) whose one item is a PATCH of a non-empty file.
/// FULL items, sessions and batches keep steps 8-10 in order.
fn streams(save: &Save) -> bool {
    save.procedure == ec_protocol::Procedure::Single
        && save.items.len() == 1
        && matches!(save.items[0].payload, Payload::Patch { .. })
        && save.items[0].target_size > 0
}

/// Fail point `eps::corrupt_rebuild` (crash and fault tests): flips one bit
/// of the rebuilt output as it is made, as a faulty rebuild would.
fn corrupt_rebuild() -> bool {
    fail::fail_point!("eps::corrupt_rebuild", |_| true);
    false
}

/// Fail point `eps::mid_rebuild`: the rebuild has handed its first piece to
/// the upload and is not finished.
fn mid_rebuild() {
    fail::fail_point!("eps::mid_rebuild");
}

/// The writer a streamed rebuild writes into: keeps the whole file (the CAS
/// and the provider-hash comparison need it), hashes exactly the bytes it
/// keeps and forwards, and forwards all but the last [`HOLD_BACK`] bytes of
/// the declared size to the upload as they come. If the upload has ended
/// (its receiver is gone) it goes on building the file in memory.
struct Forward {
    tx: tokio::sync::mpsc::Sender<ec_providers::Feed>,
    file: Vec<u8>,
    hasher: Sha256,
    /// Bytes handed to the upload, and how far they may go.
    sent: usize,
    limit: usize,
    open: bool,
    first: bool,
    corrupt: bool,
    /// Time spent waiting for the upload to take a piece.
    blocked: Duration,
}

impl Forward {
    fn new(tx: tokio::sync::mpsc::Sender<ec_providers::Feed>, size: u64) -> Forward {
        let size = usize::try_from(size).unwrap_or(usize::MAX);
        // The last HOLD_BACK bytes (the whole file if smaller, so at least one byte of any non-empty file) wait for `Done`.
        let limit = size - HOLD_BACK.min(size);
        Forward {
            tx,
            file: Vec::new(),
            hasher: Sha256::new(),
            sent: 0,
            limit,
            open: true,
            first: true,
            corrupt: corrupt_rebuild(),
            blocked: Duration::ZERO,
        }
    }

    fn forward(&mut self) {
        let upto = self.file.len().min(self.limit);
        while upto > self.sent && (upto - self.sent >= FORWARD_MIN || upto == self.limit) {
            let end = upto.min(self.sent + FORWARD_MAX);
            if self.open {
                let piece = Bytes::copy_from_slice(&self.file[self.sent..end]);
                let t = Instant::now();
                // The upload ended (failed, or the provider answered early): keep building.
                self.open = self.tx.blocking_send(ec_providers::Feed::Data(piece)).is_ok();
                self.blocked += t.elapsed();
            }
            self.sent = end;
            if self.first {
                self.first = false;
                mid_rebuild();
            }
        }
    }
}

impl std::io::Write for Forward {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let at = self.file.len();
        self.file.extend_from_slice(buf);
        if self.corrupt && !buf.is_empty() {
            self.corrupt = false;
            self.file[at] ^= 1;
        }
        self.hasher.update(&self.file[at..]);
        self.forward();
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Item `i`'s patch did not apply: `patch_failed` naming the item, with
/// the core's error code as the cause.
fn patch_failed(i: usize, e: &ec_patch::PatchError) -> Failure {
    Failure {
        cause: e.code().to_string(),
        ..Failure::from(ProtoError::with_list(
            ErrorCode::PatchFailed,
            format!("item {i}: the patch does not apply ({})", e.code()),
            vec![i as u64],
        ))
    }
}

/// A streamed rebuild (§5.6), on a blocking thread: applies the patch into
/// a [`Forward`], checks the file's size and SHA-256 over the bytes
/// forwarded, and only then sends the held-back tail (`Done`). On any
/// failure the sender is dropped without `Done`, which aborts the upload.
/// Returns the file, the rebuild's own time (waits for the upload to
/// take pieces left out) and the compressed blocks it copied from the base.
fn stream_rebuild(
    base: &[u8],
    patch: &ec_patch::Patch,
    limits: &ec_patch::Limits,
    size: u64,
    sha: [u8; 32],
    tx: tokio::sync::mpsc::Sender<ec_providers::Feed>,
) -> Result<(Bytes, Duration, u64), Failure> {
    let started = Instant::now();
    let mut fwd = Forward::new(tx, size);
    let copied = ec_patch::apply_decoded(base, patch, &mut fwd, limits).map_err(|e| patch_failed(0, &e))?.reused_blocks;
    let hash: [u8; 32] = std::mem::take(&mut fwd.hasher).finalize().into();
    if fwd.file.len() as u64 != size || hash != sha {
        return Err(ProtoError::with_list(
            ErrorCode::TargetMismatch,
            "the rebuilt or received file does not have the target size and SHA-256",
            vec![0],
        )
        .into());
    }
    let own = started.elapsed().saturating_sub(fwd.blocked);
    // Verified; the tail has not left yet.
    fail::fail_point!("eps::after_rebuild");
    let file = Bytes::from(std::mem::take(&mut fwd.file));
    let tail = file.slice(fwd.sent..);
    let _ = fwd.tx.blocking_send(ec_providers::Feed::Done { tail, file: file.clone() });
    Ok((file, own, copied))
}

/// Maps a SAVE onto a provider procedure (§6), checking the shape rules
/// that need the protocol's view (request counts, body kinds, bindings).
fn build_procedure(
    procedure: ec_protocol::Procedure,
    requests: &[ResolvedRequest],
    items: &[ec_protocol::Item],
    files: &[Bytes],
) -> Result<ec_providers::Procedure, ProtoError> {
    use ec_protocol::Procedure as P;
    let shape = |ok: bool, what: &str| {
        if ok {
            Ok(())
        } else {
            Err(ProtoError::new(ErrorCode::InvalidRequest, format!("{}: {what}", procedure.name())))
        }
    };
    let binding = |i: usize| String::from_utf8_lossy(&items[i].binding).into_owned();
    let one_item = items.len() == 1;
    Ok(match procedure {
        P::Single => {
            shape(requests.len() == 1 && one_item, "takes one request and one item")?;
            shape(
                matches!(requests[0].body, ResolvedBody::File { .. } | ResolvedBody::Wrapped { .. }),
                "the request's body must be the file",
            )?;
            ec_providers::Procedure::Single { request: provider_request(&requests[0], files) }
        }
        P::DropboxSession => {
            shape(requests.len() == 1 && one_item, "takes one request and one item")?;
            shape(matches!(requests[0].body, ResolvedBody::Empty), "the finish request has an empty body")?;
            ec_providers::Procedure::DropboxSession {
                finish: provider_request(&requests[0], files),
                file: files[0].clone(),
                binding: binding(0),
            }
        }
        P::DropboxBatch => {
            shape(requests.len() == 1 && !items.is_empty(), "takes one request")?;
            shape(matches!(requests[0].body, ResolvedBody::Bytes(_)), "the batch request's body is its JSON")?;
            ec_providers::Procedure::DropboxBatch {
                batch: provider_request(&requests[0], files),
                items: (0..items.len()).map(|i| (binding(i), files[i].clone())).collect(),
            }
        }
        P::GraphSession => {
            shape(requests.len() == 1 && one_item, "takes one request and one item")?;
            shape(matches!(requests[0].body, ResolvedBody::Empty | ResolvedBody::Bytes(_)), "createUploadSession has a JSON body or none")?;
            shape(items[0].target_size > 0, "a Graph upload session cannot carry an empty file")?;
            ec_providers::Procedure::GraphSession { create: provider_request(&requests[0], files), file: files[0].clone() }
        }
        P::DriveResumable => {
            shape(requests.len() == 1 && one_item, "takes one request and one item")?;
            shape(matches!(requests[0].body, ResolvedBody::Empty | ResolvedBody::Bytes(_)), "the initiation has a JSON body or none")?;
            if let Some(v) = requests[0].head.field("x-upload-content-length") {
                shape(
                    std::str::from_utf8(v).ok().and_then(|s| s.parse::<u64>().ok()) == Some(items[0].target_size),
                    "x-upload-content-length differs from the file size",
                )?;
            }
            ec_providers::Procedure::DriveResumable { initiate: provider_request(&requests[0], files), file: files[0].clone() }
        }
        P::NextcloudChunked => {
            shape(requests.len() == 2 && one_item, "takes two requests (MKCOL, MOVE) and one item")?;
            shape(requests.iter().all(|q| matches!(q.body, ResolvedBody::Empty)), "MKCOL and MOVE have empty bodies")?;
            ec_providers::Procedure::NextcloudChunked {
                mkcol: provider_request(&requests[0], files),
                mv: provider_request(&requests[1], files),
                file: files[0].clone(),
            }
        }
    })
}

/// The protocol and edit-patch limits of a configuration (spec §9 lowered
/// by `limits`, `memory_limit_bytes`; [`patch_limits`]); `check-config`
/// runs this too.
pub fn configured_limits(cfg: &Checked) -> Result<(Limits, ec_patch::Limits), StartError> {
    let mut pairs = Limits::default().to_pairs();
    for (name, value) in &cfg.config.limits {
        let id = LIMIT_NAMES
            .iter()
            .position(|n| n == name)
            .ok_or_else(|| StartError::Limits(format!("unknown limit `{name}`; known: {}", LIMIT_NAMES.join(", "))))?;
        let slot = &mut pairs[id];
        if *value > slot.1 {
            return Err(StartError::Limits(format!("limit `{name}` may only be lowered (default {})", slot.1)));
        }
        slot.1 = *value;
    }
    // A memory limit bounds what one save or fetch may hold: its file
    // (twice: received or rebuilt, and the base), so lower max_item_size to fit.
    let mem = cfg.config.memory_limit_bytes;
    let max_inflight = pairs[12].1.max(1);
    if let Some(m) = mem {
        let per_op = (m.saturating_sub(64 << 20) / (3 * max_inflight)).max(1 << 20);
        if pairs[1].1 > per_op {
            tracing::info!(max_item_size = per_op, "max_item_size lowered to fit memory_limit_bytes");
            pairs[1].1 = per_op;
        }
    }
    let limits = Limits::from_pairs(&pairs);
    let patch = patch_limits(&cfg.config.patch_limits, &limits, mem).map_err(StartError::Limits)?;
    Ok((limits, patch))
}

/// Spec §9: the items of one SAVE together are held to one item's limits,
/// their files (`target_size`) to `max_item_size` and their patches
/// (`payload_len`) to `max_patch_size` (`too_large`), so that an operation
/// holds no more with many items than with one.
fn save_totals(save: &Save, limits: &Limits) -> Result<(), ProtoError> {
    let files = save.items.iter().fold(0u64, |a, i| a.saturating_add(i.target_size));
    if files > limits.max_item_size {
        return Err(ProtoError::new(
            ErrorCode::TooLarge,
            format!("the items' files come to {files} bytes together, over max_item_size ({} bytes)", limits.max_item_size),
        ));
    }
    let patches = save.items.iter().fold(0u64, |a, i| match i.payload {
        Payload::Patch { payload_len } => a.saturating_add(payload_len),
        Payload::Full => a,
    });
    if patches > limits.max_patch_size {
        return Err(ProtoError::new(
            ErrorCode::TooLarge,
            format!("the items' patches come to {patches} bytes together, over max_patch_size ({} bytes)", limits.max_patch_size),
        ));
    }
    Ok(())
}

/// The key that seals a save's outcome record (see [`crate::sealed`]): the
/// operation digest and every field of the resolved provider requests (the
/// app's credentials among them). Only a transmission of the same request
/// can derive it; nothing on disk can.
fn record_key(digest: &[u8; 32], requests: &[ResolvedRequest]) -> [u8; 32] {
    let mut kb = crate::sealed::KeyBuilder::new(digest);
    for q in requests {
        kb.part(q.head.method.as_bytes()).part(q.head.url.as_bytes());
        for (n, v) in &q.head.fields {
            kb.part(n.as_bytes()).part(v);
        }
        if let ResolvedBody::Bytes(b) | ResolvedBody::Wrapped { bytes: b, .. } = &q.body {
            kb.part(b);
        }
    }
    kb.finish()
}

/// The persisted outcome record (§5.4): request id and operation digest in
/// clear (they name nothing), then the flags, response head and body sealed
/// with `key` ([`record_key`]): the response names the file and its path,
/// and may hold a capability URL. A response that sets a cookie is not
/// persisted at all (spec §5.4).
fn encode_outcome(request_id: &[u8; 8], digest: &[u8; 32], key: &[u8; 32], outcome: &Outcome, resp: &ProviderResponse) -> Option<Vec<u8>> {
    if resp.header("set-cookie").is_some() {
        return None;
    }
    let Outcome::Response { head, body, hash_disagreement } = outcome else {
        return None;
    };
    let mut plain = Writer::new();
    plain.u8(u8::from(*hash_disagreement));
    plain.blob(head);
    plain.blob(body);
    let mut plain = plain.into_bytes();
    let mut w = Writer::new();
    w.u8(2);
    w.bytes(request_id);
    w.bytes(digest);
    let header = w.into_bytes();
    let sealed = crate::sealed::seal(key, &header, &plain);
    plain.iter_mut().for_each(|b| *b = 0);
    let mut out = header;
    out.extend_from_slice(&sealed);
    Some(out)
}

/// Request id, digest and, when `key` opens it, the outcome. Records of
/// version 1 (response in clear, before issue 8) are not trusted: their
/// retry is answered "outcome unknown".
fn decode_outcome(b: &[u8], key: &[u8; 32]) -> Option<([u8; 8], [u8; 32], Option<Outcome>)> {
    let mut r = ec_protocol::wire::Reader::new(b);
    let v = r.u8("v").ok()?;
    let rid: [u8; 8] = r.array("rid").ok()?;
    let digest: [u8; 32] = r.array("digest").ok()?;
    if v != 2 {
        return Some((rid, digest, None));
    }
    let plain = crate::sealed::open(key, &b[..41], &b[41..]);
    let outcome = plain.and_then(|p| {
        let mut r = ec_protocol::wire::Reader::new(&p);
        let hd = r.u8("flags").ok()? == 1;
        let n = r.varint("head").ok()? as usize;
        let head = r.take(n, "head").ok()?.to_vec();
        let n = r.varint("body").ok()? as usize;
        let body = r.take(n, "body").ok()?.to_vec();
        Some(Outcome::Response { head, body, hash_disagreement: hd })
    });
    Some((rid, digest, outcome))
}

/// The edit-patch limits of this instance: the defaults
/// (`ec_patch::Limits::default()`, so limits the core adds keep theirs),
/// lowered by the configuration's `patch_limits`, bounded by the protocol's
/// `max_item_size` and by the memory limit if one is configured.
fn patch_limits(cfg: &std::collections::BTreeMap<String, u64>, limits: &Limits, mem: Option<u64>) -> Result<ec_patch::Limits, String> {
    let mut l = ec_patch::Limits::default();
    for (name, v) in cfg {
        let slot = match name.as_str() {
            "max_file_size" => &mut l.max_file_size,
            "max_part_size" => &mut l.max_part_size,
            "max_total_inflated" => &mut l.max_total_inflated,
            "max_expansion_ratio" => &mut l.max_expansion_ratio,
            "max_segments" => &mut l.max_segments,
            "preflate_block_allowance" => &mut l.preflate_block_allowance,
            "preflate_bytes_per_block" => &mut l.preflate_bytes_per_block,
            "max_preflate_content" => &mut l.max_preflate_content,
            _ => {
                return Err(format!(
                    "unknown patch limit `{name}`; known: max_file_size, max_part_size, max_total_inflated, max_expansion_ratio, \
                     max_segments, preflate_block_allowance, preflate_bytes_per_block, max_preflate_content"
                ))
            }
        };
        if *v > *slot {
            return Err(format!("patch limit `{name}` may only be lowered (default {})", *slot));
        }
        *slot = *v;
    }
    l.max_file_size = l.max_file_size.min(limits.max_item_size);
    if let Some(m) = mem {
        // One rebuild may inflate at most what the memory left to each of
        // max_inflight operations allows (see Service::new).
        let per_op = (m.saturating_sub(64 << 20) / (3 * limits.max_inflight.max(1))).max(1 << 20);
        l.max_total_inflated = l.max_total_inflated.min(per_op);
        l.max_part_size = l.max_part_size.min(per_op);
        // preflate holds about ten times the content it re-creates.
        l.max_preflate_content = l.max_preflate_content.min(per_op / 10);
    }
    Ok(l)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn outcome_records_are_sealed_and_open_with_their_key() {
        let outcome = Outcome::Response {
            head: b"200 OK\ncontent-type: application/json\n".to_vec(),
            body: br#"{"name":"Quarterly plan.docx","path_display":"/Team/Quarterly plan.docx"}"#.to_vec(),
            hash_disagreement: false,
        };
        let resp = ProviderResponse { status: 200, reason: String::new(), headers: vec![], body: Bytes::new() };
        let key = [9u8; 32];
        let rec = encode_outcome(&[1; 8], &[2; 32], &key, &outcome, &resp).unwrap();
        assert!(!rec.windows(9).any(|w| w == b"Quarterly"));
        let (rid, dg, o) = decode_outcome(&rec, &key).unwrap();
        assert_eq!((rid, dg), ([1; 8], [2; 32]));
        assert!(
            matches!(o, Some(Outcome::Response { body, .. }) if body == br#"{"name":"Quarterly plan.docx","path_display":"/Team/Quarterly plan.docx"}"#)
        );
        let (_, _, o) = decode_outcome(&rec, &[8; 32]).unwrap();
        assert!(o.is_none());
    }

    fn peak_memory() -> u64 {
        let status = std::fs::read_to_string("/proc/self/status").unwrap();
        let line = status.lines().find(|l| l.starts_with("VmHWM:")).unwrap();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap() * 1024
    }

    #[test]
    fn what_is_not_a_marker_is_removed_unread() {
        // A marker is the 32-byte operation digest. A huge file (sparse: no
        // disk used) or a link to /dev/zero put in the folder must not be
        // read whole at start: before, `fs::read` took it all into memory.
        let dir = tempfile::tempdir().unwrap();
        let inflight = dir.path().join("inflight");
        std::fs::create_dir_all(&inflight).unwrap();
        std::fs::write(inflight.join(hex::encode([1u8; 8])), [7u8; 32]).unwrap();
        std::fs::write(inflight.join(hex::encode([2u8; 8])), [7u8; 33]).unwrap();
        let huge = inflight.join(hex::encode([3u8; 8]));
        std::fs::File::create(&huge).unwrap().set_len(2 << 30).unwrap();
        let endless = inflight.join(hex::encode([4u8; 8]));
        std::os::unix::fs::symlink("/dev/zero", &endless).unwrap();
        let markers = Markers::open(inflight.clone()).unwrap();
        assert!(peak_memory() < 512 << 20, "the test process peaked at {} MiB", peak_memory() >> 20);
        assert_eq!(markers.unknown(&[1; 8]), Some([7; 32]));
        for rid in [[2u8; 8], [3; 8], [4; 8]] {
            assert_eq!(markers.unknown(&rid), None);
            assert!(std::fs::symlink_metadata(inflight.join(hex::encode(rid))).is_err(), "removed");
        }
    }

    #[test]
    fn markers_on_disk_are_bounded_in_number() {
        // A save may start while fewer than the bound are on disk: a marker
        // written counts, one forgotten (stage 0) frees its place, and at
        // the bound the folder is counted again (here, after files went).
        let dir = tempfile::tempdir().unwrap();
        let inflight = dir.path().join("inflight");
        std::fs::create_dir_all(&inflight).unwrap();
        std::fs::write(inflight.join(hex::encode([1u8; 8])), [7u8; 32]).unwrap();
        let markers = Markers::open_with(inflight.clone(), 3).unwrap();
        assert!(markers.room());
        markers.start(&[2; 8], &[8; 32]);
        assert!(markers.room());
        markers.start(&[3; 8], &[8; 32]);
        assert!(!markers.room(), "three on disk");
        markers.forget(&[3; 8]);
        assert!(markers.room(), "one forgotten");
        markers.start(&[4; 8], &[8; 32]);
        assert!(!markers.room());
        // Aged out (removed here by hand): the next check after a second counts again.
        std::fs::remove_file(inflight.join(hex::encode([1u8; 8]))).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
        assert!(markers.room(), "counted again at the bound");
        assert_eq!(markers.on_disk.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_marker_written_ahead_of_the_clock_is_kept() {
        // The EPS restarted with its clock behind the time the marker was
        // written: the marker still stands for a save whose outcome is
        // unknown (before, it was taken for damage and removed, and a retry
        // after the restart would have uploaded again).
        let dir = tempfile::tempdir().unwrap();
        let inflight = dir.path().join("inflight");
        std::fs::create_dir_all(&inflight).unwrap();
        let path = inflight.join(hex::encode([5u8; 8]));
        std::fs::write(&path, [9u8; 32]).unwrap();
        let ahead = std::time::SystemTime::now() + Duration::from_secs(3600);
        std::fs::File::options().write(true).open(&path).unwrap().set_modified(ahead).unwrap();
        let markers = Markers::open(inflight).unwrap();
        assert_eq!(markers.unknown(&[5; 8]), Some([9; 32]));
        assert!(path.exists());
    }

    #[test]
    fn patch_limits_lower_only_and_follow_memory() {
        let mut cfg = std::collections::BTreeMap::new();
        cfg.insert("max_part_size".to_string(), 1 << 20);
        let l = patch_limits(&cfg, &Limits::default(), None).unwrap();
        assert_eq!(l.max_part_size, 1 << 20);
        cfg.insert("max_segments".to_string(), u64::MAX);
        assert!(patch_limits(&cfg, &Limits::default(), None).is_err());
        let l = patch_limits(&Default::default(), &Limits::default(), Some(256 << 20)).unwrap();
        assert_eq!(l.max_total_inflated, 16 << 20);
    }

    /// A record of a save that ended with a provider answer of `body_len` bytes.
    fn finished(outcomes: &mut Outcomes, rid: [u8; 8], body_len: usize) {
        let (_tx, rx) = watch::channel(None);
        outcomes.map.insert(rid, OutcomeEntry { digest: [0; 32], record: Record::Running(rx), at: Instant::now() });
        outcomes.finish(rid, &Outcome::Response { head: b"200 OK\n".to_vec(), body: vec![b'x'; body_len], hash_disagreement: false });
    }

    fn keeps_answer(outcomes: &Outcomes, rid: [u8; 8]) -> bool {
        matches!(outcomes.map[&rid].record, Record::Done(Outcome::Response { .. }))
    }

    #[test]
    fn one_large_answer_does_not_make_the_records_of_many_small_ones_let_go() {
        // 100 saves answered with 1 kB each, then one answered with almost
        // the whole budget: before, the small answers of the oldest 51 saves
        // were let go of to keep the large one (their retries would have
        // been answered "outcome unknown"); now the large one is let go of,
        // the largest answer first (by powers of two), the newcomer too.
        let mut outcomes = Outcomes::new(1 << 20);
        for i in 0..100u64 {
            finished(&mut outcomes, i.to_le_bytes(), 1000);
        }
        finished(&mut outcomes, [0xff; 8], (1 << 20) - 50_000);
        for i in 0..100u64 {
            assert!(keeps_answer(&outcomes, i.to_le_bytes()), "the small answer of save {i} is kept");
        }
        assert!(matches!(outcomes.map[&[0xff; 8]].record, Record::Dropped { status: 200 }));
        assert!(outcomes.bytes <= 1 << 20);
        // Among answers of one size class, the oldest goes first.
        for k in 0..3 {
            finished(&mut outcomes, [0xe0 + k; 8], 400_000);
        }
        assert!(matches!(outcomes.map[&[0xe0; 8]].record, Record::Dropped { status: 200 }));
        assert!(keeps_answer(&outcomes, [0xe1; 8]) && keeps_answer(&outcomes, [0xe2; 8]));
        for i in 0..100u64 {
            assert!(keeps_answer(&outcomes, i.to_le_bytes()), "the small answer of save {i} is kept");
        }
        assert_eq!(outcomes.bytes, 100 * 1007 + 2 * 400_007);
    }

    /// A service over a state folder of its own (nothing listens; no provider is reached).
    fn test_service(dir: &std::path::Path) -> Service {
        let config = serde_json::json!({
            "listen": "127.0.0.1:0",
            "insecure_plain_http": true,
            "keys": [{"id": 1, "secret_hex": hex::encode((1..=32).collect::<Vec<u8>>())}],
            "accounts": [{"provider": "*", "account": "*"}],
        });
        std::fs::write(dir.join("eps.json"), config.to_string()).unwrap();
        Service::new(crate::config::Config::load(&dir.join("eps.json"), dir).unwrap()).unwrap()
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap()
    }

    #[test]
    fn a_claim_whose_save_ended_before_any_provider_request_goes_at_once() {
        // A save that ended (at stage 0, or its task died) before its
        // provider procedure started leaves no record: a retry may run it.
        // Before, a save that ended without releasing its claim (a panic, a
        // return that skipped the release) left a running record with no
        // task behind it, kept until a retry came, for ever if none did.
        let dir = tempfile::tempdir().unwrap();
        let svc = test_service(dir.path());
        runtime().block_on(async {
            let (rid, digest, key) = ([1u8; 8], [2u8; 32], [3u8; 32]);
            let Claim::Mine(claim) = svc.claim(rid, digest, &key, &[]).await else { panic!("a new request id is claimed") };
            drop(claim);
            assert!(!svc.outcomes.lock().unwrap().map.contains_key(&rid), "the record went with its save");
            let Claim::Mine(_claim) = svc.claim(rid, digest, &key, &[]).await else {
                panic!("a save that reached no provider runs on a retry")
            };
        });
    }

    #[test]
    fn the_outcome_records_are_bounded_in_number_and_a_forgotten_ones_retry_is_never_performed_again() {
        // A device with a valid key saving very fast: before, every record of
        // the last 15 minutes was held, whatever their number (this test's
        // saves made 16,400 records). Now at most MAX_RECORDS; the retry of a
        // forgotten record whose procedure started is "outcome unknown" (its
        // marker is on disk), never a second upload.
        let dir = tempfile::tempdir().unwrap();
        let svc = test_service(dir.path());
        let saves = Outcomes::MAX_RECORDS as u64 + 16;
        runtime().block_on(async {
            let (digest, key) = ([2u8; 32], [3u8; 32]);
            for i in 0..saves {
                let rid = i.to_le_bytes();
                let Claim::Mine(mut claim) = svc.claim(rid, digest, &key, &[]).await else { panic!("a new request id is claimed") };
                claim.provider_starts(&digest);
                claim.finish(&Outcome::Response { head: b"200 OK\n".to_vec(), body: b"{}".to_vec(), hash_disagreement: false });
            }
            let held = svc.outcomes.lock().unwrap().map.len();
            assert!(held <= Outcomes::MAX_RECORDS, "{held} records held");
            let first = 0u64.to_le_bytes();
            assert!(!svc.outcomes.lock().unwrap().map.contains_key(&first), "the oldest record is forgotten");
            let retry = svc.claim(first, digest, &key, &[]).await;
            assert!(
                matches!(retry, Claim::Replay(Outcome::Failed { code: ErrorCode::ProviderTimeout, stage: 1, .. })),
                "the retry of a forgotten record is answered 'outcome unknown'"
            );
            assert!(matches!(svc.claim(first, [9u8; 32], &key, &[]).await, Claim::Conflict), "another operation under its id conflicts");
            // The newest records are kept, with their answers.
            let last = (saves - 1).to_le_bytes();
            assert!(matches!(svc.claim(last, digest, &key, &[]).await, Claim::Replay(Outcome::Response { .. })));
        });
    }

    #[test]
    fn a_save_whose_task_ended_after_its_provider_procedure_started_is_never_performed_again() {
        // The save's task ended after its in-flight marker was written (the
        // provider may hold the upload) and before its outcome was recorded.
        // Before, a retry found the running record without a task, dropped
        // it and performed the save again: a second upload.
        let dir = tempfile::tempdir().unwrap();
        let svc = test_service(dir.path());
        runtime().block_on(async {
            let outcome_unknown =
                |c: &Claim| matches!(c, Claim::Replay(Outcome::Failed { code: ErrorCode::ProviderTimeout, stage: 1, .. }));
            let (digest, key) = ([2u8; 32], [3u8; 32]);
            for (rid, retried) in [([1u8; 8], true), ([4u8; 8], false)] {
                let Claim::Mine(mut claim) = svc.claim(rid, digest, &key, &[]).await else { panic!("a new request id is claimed") };
                claim.provider_starts(&digest);
                drop(claim);
                if retried {
                    assert!(outcome_unknown(&svc.claim(rid, digest, &key, &[]).await), "a retry is answered 'outcome unknown'");
                } else {
                    // Without a retry, the record is resolved at once.
                    let outcomes = svc.outcomes.lock().unwrap();
                    let record = &outcomes.map[&rid].record;
                    assert!(
                        matches!(record, Record::Done(Outcome::Failed { code: ErrorCode::ProviderTimeout, stage: 1, .. })),
                        "{record:?}"
                    );
                }
            }
        });
    }
}
