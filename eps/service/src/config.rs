//! The EPS configuration: one JSON file, written by the edge-manager into
//! the instance's state folder (or by hand for a lab run).
//!
//! Everything an instance needs is here or in its state folder, because in
//! the docker and microVM runtimes the EPS is the only program and has no
//! other files. Real-cloud mode and lab mode differ only in this file: lab
//! mode adds `resolve` entries that send the providers' real host names to
//! the local test servers and a test CA in `extra_ca_pem_files`; the code
//! path is the same.
//!
//! The instance secret(s) live here; provider credentials never do (they
//! arrive with each request and stay in memory, spec §8).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use serde::Deserialize;

/// Errors reading or checking the configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file could not be read.
    #[error("cannot read the EPS configuration {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    /// The file is not valid JSON for this schema.
    #[error("the EPS configuration {path} is not valid: at `{at}`: {source} (see docs/eps.md for the format)")]
    Parse { path: PathBuf, at: String, source: serde_json::Error },
    /// A value is out of range or inconsistent.
    #[error("the EPS configuration {path} is not usable: {message}")]
    Invalid { path: PathBuf, message: String },
}

/// One instance key (spec §3.1).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KeyConfig {
    /// The `key_id` devices name in HELLO.
    pub id: u64,
    /// 32 bytes, hex.
    pub secret_hex: String,
}

/// A provider account bound to this instance (spec §4.4.1).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccountConfig {
    /// `dropbox`, `graph`, `drive` or `webdav`, or `*` for any (lab only).
    pub provider: String,
    /// The account as the device names it, or `*` for any account of the provider (lab only).
    pub account: String,
}

/// TLS for the device listener (spec §2.3).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    /// PEM certificate chain, relative to the state folder or absolute.
    pub cert_pem: PathBuf,
    /// PEM private key.
    pub key_pem: PathBuf,
}

/// How the EPS reaches the providers.
#[derive(Debug, Clone, Deserialize, Default)]
#[serde(deny_unknown_fields, default)]
pub struct UpstreamSection {
    /// Lab mode: provider host name -> address of the local test server.
    pub resolve: BTreeMap<String, SocketAddr>,
    /// PEM files of extra trusted roots (the lab's test CA).
    pub extra_ca_pem_files: Vec<PathBuf>,
    /// WebDAV / Nextcloud hosts this user's devices may address.
    pub webdav_hosts: Vec<String>,
    /// Lab only: hosts that may be reached over plain HTTP.
    pub plain_http_hosts: Vec<String>,
    /// Chunk sizes of the upload procedures (spec §6), bytes.
    pub dropbox_chunk: Option<u64>,
    /// Graph upload-session fragment size (multiple of 327,680).
    pub graph_fragment: Option<u64>,
    /// Drive resumable chunk size (multiple of 256 KiB).
    pub drive_chunk: Option<u64>,
    /// Nextcloud chunk size.
    pub nc_chunk: Option<u64>,
    /// Seconds; defaults of spec §6.0.
    pub connect_timeout_s: Option<u64>,
    /// Seconds to wait for a provider's response head.
    pub response_timeout_s: Option<u64>,
    /// Seconds a whole save or fetch may take.
    pub op_timeout_s: Option<u64>,
}

/// The whole configuration file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// The device-facing listener, e.g. `0.0.0.0:8443`.
    pub listen: SocketAddr,
    /// The management listener (`/metrics`, `/healthz`); not reachable from the Wi-Fi side.
    #[serde(default)]
    pub management_listen: Option<SocketAddr>,
    /// TLS for the device listener; absent means plain HTTP, allowed only with `insecure_plain_http`.
    #[serde(default)]
    pub tls: Option<TlsConfig>,
    /// Lab mode: serve the protocol over plain HTTP (spec §2.3: test credentials only).
    #[serde(default)]
    pub insecure_plain_http: bool,
    /// Instance keys.
    pub keys: Vec<KeyConfig>,
    /// Accounts bound to this instance.
    pub accounts: Vec<AccountConfig>,
    /// Bound on the last-synced store, bytes (default 1 GiB).
    #[serde(default)]
    pub store_max_bytes: Option<u64>,
    /// Provider access.
    #[serde(default)]
    pub upstream: UpstreamSection,
    /// Protocol limits to lower (spec §9), by name, e.g. `{"max_inflight": 2}`.
    #[serde(default)]
    pub limits: BTreeMap<String, u64>,
    /// Edit-patch limits (`ec_patch::Limits`) to lower, by field name, e.g. `{"max_part_size": 134217728}`.
    #[serde(default)]
    pub patch_limits: BTreeMap<String, u64>,
    /// The instance's memory limit in bytes (the container's or microVM's), if it has one: the
    /// patch budgets and the unauthenticated read buffer are derived from it (docs/eps.md).
    #[serde(default)]
    pub memory_limit_bytes: Option<u64>,
    /// Connection cap and timeouts of the listeners.
    #[serde(default)]
    pub connections: ConnectionsSection,
    /// Say yes to a management listener on all interfaces (`0.0.0.0` / `::`); without it `check-config`
    /// and the start warn, because `/metrics` must not be reachable from the Wi-Fi side.
    #[serde(default)]
    pub allow_public_management: bool,
    /// Log lines a log site may write per second (token bucket; a burst of ten times as many); the rest
    /// are counted and reported as `suppressed` on the site's next line.
    #[serde(default)]
    pub log_lines_per_s: Option<u32>,
    /// Seconds without a save or fetch after which the instance lets go of the document contents the
    /// edit-patch core keeps from its last rebuilds (up to 32 MiB; default 30; 0: right after each).
    #[serde(default = "default_kept_content_idle_s")]
    pub kept_content_idle_s: f64,
    /// Bytes of provider responses (head and body) the outcome records of spec §5.4 keep in memory
    /// for retries, all records together (default 8 MiB). Past it records keep only their request
    /// id, digest and status, the largest answer first: a retry of one is answered from the
    /// document's persisted record or "outcome unknown", never performed again.
    #[serde(default)]
    pub outcome_records_max_bytes: Option<u64>,
    /// Bytes of responses the sessions keep for `resp_ref` (spec §4.6.2), all sessions together
    /// (default 8 MiB; each of `max_sessions` sessions gets an equal share). Past it a session
    /// forgets its oldest responses; the next answer is coded against empty references.
    #[serde(default)]
    pub response_cache_max_bytes: Option<u64>,
}

/// Default of `outcome_records_max_bytes` and of `response_cache_max_bytes`.
pub const DEFAULT_KEPT_RESPONSE_BYTES: u64 = 8 << 20;

fn default_kept_content_idle_s() -> f64 {
    30.0
}

/// Connection cap and timeouts (docs/eps.md, spec §14).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ConnectionsSection {
    /// Most connections the device listener holds at once; capped further by the file limit.
    pub max: u64,
    /// Most connections the management listener holds at once.
    pub management_max: u64,
    /// Seconds a TLS handshake may take.
    pub tls_handshake_timeout_s: f64,
    /// Seconds from a connection's start (or a request's first byte) to its complete request head.
    pub header_timeout_s: f64,
    /// Seconds to receive a request's structured part (what is read before the MAC is checked).
    pub envelope_timeout_s: f64,
    /// Seconds one read of a request body may wait for bytes.
    pub body_read_timeout_s: f64,
    /// Seconds an idle keep-alive connection is kept (spec §2.2: at least 120).
    pub idle_timeout_s: f64,
    /// Bytes all unauthenticated requests together may buffer beyond their first 16 KiB.
    pub preauth_buffer_bytes: u64,
}

impl Default for ConnectionsSection {
    fn default() -> Self {
        ConnectionsSection {
            max: 256,
            management_max: 16,
            tls_handshake_timeout_s: 10.0,
            header_timeout_s: 10.0,
            envelope_timeout_s: 10.0,
            body_read_timeout_s: 30.0,
            idle_timeout_s: 120.0,
            preauth_buffer_bytes: 16 << 20,
        }
    }
}

/// A checked configuration with decoded secrets and resolved paths.
#[derive(Debug, Clone)]
pub struct Checked {
    /// The parsed file.
    pub config: Config,
    /// The state folder (the folder of the configuration file unless given).
    pub state_dir: PathBuf,
    /// Decoded keys: id -> secret.
    pub keys: BTreeMap<u64, [u8; 32]>,
    /// Things that work but should not be so (said by `check-config` and at start).
    pub warnings: Vec<String>,
}

impl Config {
    /// Reads and checks the configuration at `path`; relative paths inside it are relative to `state_dir`.
    pub fn load(path: &Path, state_dir: &Path) -> Result<Checked, ConfigError> {
        let text = std::fs::read(path).map_err(|source| ConfigError::Read { path: path.to_owned(), source })?;
        // The error names the key it is about (`connections.max`), not only a line and column.
        let config: Config = serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_slice(&text)).map_err(|e| {
            let at = e.path().to_string();
            ConfigError::Parse { path: path.to_owned(), at, source: e.into_inner() }
        })?;
        let invalid = |message: String| ConfigError::Invalid { path: path.to_owned(), message };
        if config.tls.is_none() && !config.insecure_plain_http {
            return Err(invalid(
                "no `tls` section: set `tls` (production) or `insecure_plain_http: true` (lab, test credentials only)".into(),
            ));
        }
        if config.keys.is_empty() {
            return Err(invalid("`keys` is empty: a device could never authenticate".into()));
        }
        let mut keys = BTreeMap::new();
        for k in &config.keys {
            let bytes = hex::decode(&k.secret_hex).map_err(|e| invalid(format!("key {}: secret_hex is not hex: {e}", k.id)))?;
            let secret: [u8; 32] =
                bytes.try_into().map_err(|_| invalid(format!("key {}: the secret must be 32 bytes (64 hex digits)", k.id)))?;
            // A secret anyone can guess authenticates anyone (spec §3.1: 32 random bytes).
            let distinct = secret.iter().collect::<std::collections::BTreeSet<_>>().len();
            if distinct < 8 {
                return Err(invalid(format!(
                    "key {}: the secret has only {distinct} distinct byte values (all zero or a pattern); use 32 random bytes",
                    k.id
                )));
            }
            if keys.insert(k.id, secret).is_some() {
                return Err(invalid(format!("key id {} appears twice", k.id)));
            }
        }
        for a in &config.accounts {
            if !matches!(a.provider.as_str(), "dropbox" | "graph" | "drive" | "webdav" | "*") {
                return Err(invalid(format!("account provider `{}` is not one of dropbox, graph, drive, webdav, *", a.provider)));
            }
        }
        let mut warnings = Vec::new();
        if let Some(m) = config.management_listen {
            if m.ip().is_unspecified() && !config.allow_public_management {
                warnings.push(format!(
                    "management_listen {m} listens on all interfaces: /metrics would be reachable from the Wi-Fi side; \
                     bind it to the edge-manager's address, or set allow_public_management: true"
                ));
            }
        }
        let c = &config.connections;
        let times = [
            ("tls_handshake_timeout_s", c.tls_handshake_timeout_s),
            ("header_timeout_s", c.header_timeout_s),
            ("envelope_timeout_s", c.envelope_timeout_s),
            ("body_read_timeout_s", c.body_read_timeout_s),
            ("idle_timeout_s", c.idle_timeout_s),
        ];
        for (name, v) in times {
            if !(v > 0.0 && v <= 86_400.0) {
                return Err(invalid(format!("connections.{name} must be more than 0 and at most 86400 seconds")));
            }
        }
        if c.max == 0 || c.management_max == 0 {
            return Err(invalid("connections.max and connections.management_max must be at least 1".into()));
        }
        if c.idle_timeout_s < 120.0 {
            warnings.push(format!("connections.idle_timeout_s {} is under the 120 s spec §2.2 asks for", c.idle_timeout_s));
        }
        if !(config.kept_content_idle_s >= 0.0 && config.kept_content_idle_s <= 86_400.0) {
            return Err(invalid("kept_content_idle_s must be at least 0 and at most 86400 seconds".into()));
        }
        if config.log_lines_per_s == Some(0) {
            return Err(invalid("log_lines_per_s must be at least 1".into()));
        }
        if let Some(m) = config.memory_limit_bytes {
            if m < 64 << 20 {
                return Err(invalid(format!("memory_limit_bytes {m} is under 64 MiB, too little for an EPS")));
            }
        }
        Ok(Checked { config, state_dir: state_dir.to_owned(), keys, warnings })
    }
}

impl Checked {
    /// A path from the configuration, relative to the state folder unless absolute.
    pub fn path(&self, p: &Path) -> PathBuf {
        if p.is_absolute() {
            p.to_owned()
        } else {
            self.state_dir.join(p)
        }
    }
}
