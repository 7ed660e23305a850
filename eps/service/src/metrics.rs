//! Prometheus metrics of spec §12, served on the management listener.
//!
//! Labels never carry document keys, accounts, paths, URLs or credentials:
//! only endpoint names, outcome codes, provider and procedure names and
//! status classes, all from fixed sets.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// `endpoint`, `outcome`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// `hello`, `save`, `fetch`.
    pub endpoint: &'static str,
    /// `ok` or an error code name.
    pub outcome: &'static str,
}

/// `provider`, `procedure`, `status_class`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderLabels {
    /// `dropbox`, `graph`, `drive`, `webdav`.
    pub provider: &'static str,
    /// Procedure name, or `fetch`.
    pub procedure: &'static str,
    /// `2xx` ... `5xx`, or `none`.
    pub status_class: &'static str,
}

/// `provider`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProviderOnly {
    /// Provider name.
    pub provider: &'static str,
}

/// `procedure`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ProcedureOnly {
    /// Procedure name.
    pub procedure: &'static str,
}

/// `direction`, `kind`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DeviceBytes {
    /// `in` or `out`.
    pub direction: &'static str,
    /// `envelope`, `patch`, `full`.
    pub kind: &'static str,
}

/// `direction`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct Direction {
    /// `in` or `out`.
    pub direction: &'static str,
}

/// Which listener.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct ListenerLabel {
    pub listener: &'static str,
}

/// A connection timeout.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct TimeoutLabels {
    pub listener: &'static str,
    pub kind: &'static str,
}

/// A configured timeout.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct KindOnly {
    pub kind: &'static str,
}

type HistFamily<L> = Family<L, Histogram, fn() -> Histogram>;

fn seconds_histogram() -> Histogram {
    // 1 ms .. ~65 s.
    Histogram::new(exponential_buckets(0.001, 2.0, 17))
}

/// Every metric of the EPS.
#[derive(Debug)]
pub struct Metrics {
    registry: Registry,
    /// `ec_eps_requests_total`.
    pub requests: Family<RequestLabels, Counter>,
    /// `ec_eps_provider_requests_total`.
    pub provider_requests: Family<ProviderLabels, Counter>,
    /// `ec_eps_provider_request_seconds`.
    pub provider_seconds: HistFamily<ProviderOnly>,
    /// `ec_eps_save_seconds`.
    pub save_seconds: HistFamily<ProcedureOnly>,
    /// `ec_eps_rebuild_seconds`: applying patches and checking hashes.
    pub rebuild_seconds: Histogram,
    /// `ec_eps_device_bytes_total`.
    pub device_bytes: Family<DeviceBytes, Counter>,
    /// `ec_eps_provider_bytes_total`.
    pub provider_bytes: Family<Direction, Counter>,
    /// `ec_eps_base_unknown_total`.
    pub base_unknown: Counter,
    /// `ec_eps_target_mismatch_total`.
    pub target_mismatch: Counter,
    /// `ec_eps_rebuild_blocks_copied_total`: compressed blocks of
    /// block-parallel members that rebuilds copied from the base instead of
    /// deflating them (its layout was known: made by a rebuild, or learnt
    /// after a save that sent it whole).
    pub blocks_copied: Counter,
    /// `ec_eps_blocks_from_base_parse_total`: compressed blocks this process
    /// made from a base block's LZ77 parse instead of deflating them with
    /// zlib (the blocks an edit shifts, in rebuilds and in the diffs of
    /// downloads); brought up to date from `ec_patch` when /metrics is read.
    pub blocks_from_parse: Counter,
    /// What `blocks_from_parse` last took from `ec_patch`.
    blocks_from_parse_seen: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// `ec_eps_learnt_members_total`: block-parallel members of files sent
    /// whole whose layout and content were learnt for the next patch.
    pub learnt_members: Counter,
    /// `ec_eps_saves_streamed_total`: saves whose rebuild streamed into the upload (spec §5.6).
    pub saves_streamed: Counter,
    /// `ec_eps_idempotent_replays_total`.
    pub replays: Counter,
    /// `ec_eps_envelope_decodes_total`: attempts to decode a SAVE's
    /// structured part before authentication (one per SAVE when it arrives
    /// whole; a trickled one adds about one per doubling of its bytes).
    pub envelope_decodes: Counter,
    /// `ec_eps_provider_hash_disagreements_total`.
    pub hash_disagreements: Family<ProviderOnly, Counter>,
    /// `ec_eps_sessions`.
    pub sessions: Gauge,
    /// `ec_eps_contexts`.
    pub contexts: Gauge,
    /// `ec_eps_inflight`.
    pub inflight: Gauge,
    /// `ec_eps_store_bytes`.
    pub store_bytes: Gauge,
    /// `ec_eps_store_documents`.
    pub store_documents: Gauge,
    /// `ec_eps_store_evictions_total`.
    pub store_evictions: Counter,
    /// `ec_eps_kept_content_bytes`: document contents the edit-patch core keeps from the last rebuilds.
    pub kept_content_bytes: Gauge,
    /// `ec_eps_outcome_record_bytes`: provider responses the outcome records of §5.4 keep in memory.
    pub outcome_record_bytes: Gauge,
    /// `ec_eps_response_cache_bytes`: responses the sessions keep for `resp_ref` (§4.6.2).
    pub response_cache_bytes: Gauge,
    pub connections: Family<ListenerLabel, Gauge>,
    pub connections_max: Family<ListenerLabel, Gauge>,
    pub connections_refused: Family<ListenerLabel, Counter>,
    pub connections_evicted: Family<ListenerLabel, Counter>,
    pub connection_timeouts: Family<TimeoutLabels, Counter>,
    pub timeout_seconds: Family<KindOnly, Gauge<f64, std::sync::atomic::AtomicU64>>,
    pub preauth_budget_bytes: Gauge,
    pub log_suppressed: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

impl Metrics {
    /// Creates and registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("ec_eps");
        let m = Metrics {
            requests: Family::default(),
            provider_requests: Family::default(),
            provider_seconds: Family::new_with_constructor(seconds_histogram),
            save_seconds: Family::new_with_constructor(seconds_histogram),
            rebuild_seconds: seconds_histogram(),
            device_bytes: Family::default(),
            provider_bytes: Family::default(),
            base_unknown: Counter::default(),
            target_mismatch: Counter::default(),
            blocks_copied: Counter::default(),
            blocks_from_parse: Counter::default(),
            blocks_from_parse_seen: Default::default(),
            learnt_members: Counter::default(),
            saves_streamed: Counter::default(),
            replays: Counter::default(),
            envelope_decodes: Counter::default(),
            hash_disagreements: Family::default(),
            sessions: Gauge::default(),
            contexts: Gauge::default(),
            inflight: Gauge::default(),
            store_bytes: Gauge::default(),
            store_documents: Gauge::default(),
            store_evictions: Counter::default(),
            kept_content_bytes: Gauge::default(),
            outcome_record_bytes: Gauge::default(),
            response_cache_bytes: Gauge::default(),
            connections: Family::default(),
            connections_max: Family::default(),
            connections_refused: Family::default(),
            connections_evicted: Family::default(),
            connection_timeouts: Family::default(),
            timeout_seconds: Family::default(),
            preauth_budget_bytes: Gauge::default(),
            log_suppressed: Counter::default(),
            registry: Registry::default(),
        };
        registry.register("requests", "Protocol requests by endpoint and outcome", m.requests.clone());
        registry.register("provider_requests", "Requests sent to providers", m.provider_requests.clone());
        registry.register("provider_request_seconds", "Time of one provider procedure", m.provider_seconds.clone());
        registry.register("save_seconds", "Time of a whole save, device request to answer", m.save_seconds.clone());
        registry.register("rebuild_seconds", "Time to rebuild and verify the files of a save", m.rebuild_seconds.clone());
        registry.register("device_bytes", "Bytes on the device link", m.device_bytes.clone());
        registry.register("provider_bytes", "Bytes on the provider link", m.provider_bytes.clone());
        registry.register("base_unknown", "Saves answered base_unknown", m.base_unknown.clone());
        registry.register("target_mismatch", "Saves answered target_mismatch", m.target_mismatch.clone());
        registry.register(
            "rebuild_blocks_copied",
            "Compressed blocks rebuilds copied from the base instead of deflating them",
            m.blocks_copied.clone(),
        );
        registry.register(
            "blocks_from_base_parse",
            "Compressed blocks made from a base block's parse instead of deflating them",
            m.blocks_from_parse.clone(),
        );
        registry.register(
            "learnt_members",
            "Block-parallel members of files sent whole, learnt for the next patch",
            m.learnt_members.clone(),
        );
        registry.register(
            "saves_streamed",
            "Saves whose rebuild was streamed into the provider upload, its tail held until verified",
            m.saves_streamed.clone(),
        );
        registry.register("idempotent_replays", "Saves answered from an outcome record", m.replays.clone());
        registry.register(
            "envelope_decodes",
            "Attempts to decode a SAVE's structured part before authentication",
            m.envelope_decodes.clone(),
        );
        registry.register("provider_hash_disagreements", "Provider hashes that disagreed with the file", m.hash_disagreements.clone());
        registry.register("sessions", "Open sessions", m.sessions.clone());
        registry.register("contexts", "Defined contexts", m.contexts.clone());
        registry.register("inflight", "Saves and fetches running", m.inflight.clone());
        registry.register("store_bytes", "Bytes in the last-synced store", m.store_bytes.clone());
        registry.register("store_documents", "Documents in the last-synced store", m.store_documents.clone());
        registry.register("store_evictions", "Documents evicted from the store", m.store_evictions.clone());
        registry.register(
            "kept_content_bytes",
            "Document contents kept from the last rebuilds, so that the next patch need not inflate them",
            m.kept_content_bytes.clone(),
        );
        registry.register(
            "outcome_record_bytes",
            "Provider response bytes the outcome records keep in memory for retries (within outcome_records_max_bytes)",
            m.outcome_record_bytes.clone(),
        );
        registry.register(
            "response_cache_bytes",
            "Response bytes the sessions keep for resp_ref (within response_cache_max_bytes)",
            m.response_cache_bytes.clone(),
        );
        registry.register("connections", "Open connections by listener", m.connections.clone());
        registry.register(
            "connections_max",
            "The connection cap by listener (configured, lowered to fit the file limit)",
            m.connections_max.clone(),
        );
        registry.register(
            "connections_refused",
            "Connections closed at once: over the cap, every held connection authenticated",
            m.connections_refused.clone(),
        );
        registry.register(
            "connections_evicted",
            "Unauthenticated connections closed to make room for a new one",
            m.connections_evicted.clone(),
        );
        registry.register(
            "connection_timeouts",
            "Connections or requests ended by a timeout, by kind (tls_handshake, headers, envelope, body, idle)",
            m.connection_timeouts.clone(),
        );
        registry.register("timeout_seconds", "Configured timeouts, by kind", m.timeout_seconds.clone());
        registry.register(
            "preauth_budget_bytes",
            "Bytes unauthenticated requests may buffer together beyond their first 16 KiB",
            m.preauth_budget_bytes.clone(),
        );
        registry.register("log_suppressed", "Log lines suppressed by the per-site rate limit", m.log_suppressed.clone());
        Metrics { registry, ..m }
    }

    /// The Prometheus text exposition.
    pub fn render(&self) -> String {
        let total = ec_patch::deflate::blocks_made_from_parse();
        let seen = self.blocks_from_parse_seen.fetch_max(total, std::sync::atomic::Ordering::Relaxed);
        self.blocks_from_parse.inc_by(total.saturating_sub(seen));
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry).expect("writing to a String cannot fail");
        out
    }
}

/// `2xx` ... `5xx` for a status.
pub fn status_class(status: Option<u16>) -> &'static str {
    match status {
        Some(100..=199) => "1xx",
        Some(200..=299) => "2xx",
        Some(300..=399) => "3xx",
        Some(400..=499) => "4xx",
        Some(500..=599) => "5xx",
        _ => "none",
    }
}
