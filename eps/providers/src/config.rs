//! Upstream configuration: which hosts each provider may be sent to, the
//! trust store additions, lab DNS overrides, timeouts and chunk sizes.
//!
//! The defaults are §6.0's allowlists and timeouts and the chunk sizes of
//! §6.2–§6.6. Real-cloud mode is the default configuration; the lab adds
//! the test CA (`extra_root_ca_pem`) and sends the providers' real host
//! names to the local test servers (`resolve`), so both run the same code.

use std::net::SocketAddr;
use std::time::Duration;

use crate::error::ConfigError;
use crate::types::Provider;

/// A host allowlist entry: an exact host name (or IP literal), or
/// `*.suffix`, which matches any host ending in `.suffix` (not `suffix`
/// itself). Comparison ignores ASCII case.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostPattern(String);

impl HostPattern {
    /// Parses `host` or `*.suffix`.
    pub fn parse(pattern: &str) -> Result<Self, ConfigError> {
        let bad = || ConfigError::BadHostPattern(pattern.to_owned());
        let body = pattern.strip_prefix("*.").unwrap_or(pattern);
        if body.is_empty() || body.contains('*') || !body.bytes().all(|b| b.is_ascii_alphanumeric() || b"-.:[]_".contains(&b)) {
            return Err(bad());
        }
        Ok(Self(pattern.to_ascii_lowercase()))
    }

    /// Whether `host` (as in a URL's authority, without port) matches.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.to_ascii_lowercase();
        match self.0.strip_prefix("*.") {
            Some(suffix) => host.len() > suffix.len() + 1 && host.ends_with(&format!(".{suffix}")),
            None => host == self.0,
        }
    }
}

fn patterns(list: &[&str]) -> Vec<HostPattern> {
    list.iter().map(|p| HostPattern::parse(p).expect("built-in pattern")).collect()
}

/// Everything [`crate::Upstream::new`] needs.
#[derive(Debug, Clone)]
pub struct UpstreamConfig {
    /// Dropbox hosts (default `api.dropboxapi.com`, `content.dropboxapi.com`).
    pub dropbox_hosts: Vec<HostPattern>,
    /// Graph hosts (default `graph.microsoft.com`, `api.onedrive.com`,
    /// `*.sharepoint.com`, `*.files.1drv.com`).
    pub graph_hosts: Vec<HostPattern>,
    /// Drive hosts (default `www.googleapis.com`).
    pub drive_hosts: Vec<HostPattern>,
    /// WebDAV hosts: the ones this instance is configured with (default none).
    pub webdav_hosts: Vec<HostPattern>,
    /// Hosts that may be reached over plain `http` (lab only; default none).
    pub allow_plain_http_hosts: Vec<HostPattern>,
    /// PEM certificates added to the webpki roots (the lab's test CA).
    pub extra_root_ca_pem: Vec<Vec<u8>>,
    /// Host name overrides: connect to this address instead of resolving
    /// (lab). A URL's explicit port wins over the address's port.
    pub resolve: Vec<(String, SocketAddr)>,
    /// TCP connect (and TLS handshake) timeout. Default 10 s.
    pub connect_timeout: Duration,
    /// Wait for the response head after the body was sent. Default 120 s.
    pub response_timeout: Duration,
    /// Longest pause between body bytes, both directions. Default 60 s.
    pub idle_timeout: Duration,
    /// Bound of one whole procedure or fetch (`op_timeout`). Default 900 s.
    pub op_timeout: Duration,
    /// Dropbox session chunk (default 64 MiB; at most 150 MiB).
    pub dropbox_chunk: u64,
    /// Graph fragment (default 10 MiB; a multiple of 327,680, at most 60 MiB).
    pub graph_fragment: u64,
    /// Drive chunk (default 64 MiB; a multiple of 256 KiB).
    pub drive_chunk: u64,
    /// Nextcloud chunk (default 10 MiB; at least 5 MiB, at most 5 GiB).
    /// Tests may go lower with `allow_small_nc_chunk`.
    pub nc_chunk: u64,
    /// Lets `nc_chunk` be under 5 MiB (tests only: Nextcloud refuses it).
    pub allow_small_nc_chunk: bool,
    /// Dropbox batch: sessions run at once (default 4).
    pub batch_parallelism: usize,
    /// Largest provider response body carried back (`max_response_body`, 16 MiB).
    pub max_response_body: u64,
    /// Largest 200 body of a download (the file; `max_item_size`, 2 GiB).
    pub max_download_body: u64,
}

const MIB: u64 = 1024 * 1024;

impl Default for UpstreamConfig {
    fn default() -> Self {
        Self {
            dropbox_hosts: patterns(&["api.dropboxapi.com", "content.dropboxapi.com"]),
            graph_hosts: patterns(&["graph.microsoft.com", "api.onedrive.com", "*.sharepoint.com", "*.files.1drv.com"]),
            drive_hosts: patterns(&["www.googleapis.com"]),
            webdav_hosts: vec![],
            allow_plain_http_hosts: vec![],
            extra_root_ca_pem: vec![],
            resolve: vec![],
            connect_timeout: Duration::from_secs(10),
            response_timeout: Duration::from_secs(120),
            idle_timeout: Duration::from_secs(60),
            op_timeout: Duration::from_secs(900),
            dropbox_chunk: 64 * MIB,
            graph_fragment: 10 * MIB,
            drive_chunk: 64 * MIB,
            nc_chunk: 10 * MIB,
            allow_small_nc_chunk: false,
            batch_parallelism: 4,
            max_response_body: 16 * MIB,
            max_download_body: 2 * 1024 * MIB,
        }
    }
}

impl UpstreamConfig {
    /// The allowlist of `provider`.
    pub fn hosts(&self, provider: Provider) -> &[HostPattern] {
        match provider {
            Provider::Dropbox => &self.dropbox_hosts,
            Provider::Graph => &self.graph_hosts,
            Provider::Drive => &self.drive_hosts,
            Provider::WebDav => &self.webdav_hosts,
        }
    }

    /// Checks the chunk sizes against the providers' rules.
    pub fn validate(&self) -> Result<(), ConfigError> {
        let bad = |name, value, rule| Err(ConfigError::BadChunkSize { name, value, rule });
        if self.dropbox_chunk == 0 || self.dropbox_chunk > 150 * MIB {
            return bad("dropbox_chunk", self.dropbox_chunk, "must be 1 byte to 150 MiB");
        }
        if self.graph_fragment == 0 || self.graph_fragment % 327_680 != 0 || self.graph_fragment > 60 * MIB {
            return bad("graph_fragment", self.graph_fragment, "must be a multiple of 327,680 bytes, at most 60 MiB");
        }
        if self.drive_chunk == 0 || self.drive_chunk % (256 * 1024) != 0 {
            return bad("drive_chunk", self.drive_chunk, "must be a multiple of 256 KiB");
        }
        if self.nc_chunk == 0 || self.nc_chunk > 5 * 1024 * MIB || (self.nc_chunk < 5 * MIB && !self.allow_small_nc_chunk) {
            return bad("nc_chunk", self.nc_chunk, "must be 5 MiB to 5 GiB");
        }
        if self.batch_parallelism == 0 {
            return bad("batch_parallelism", 0, "must be at least 1");
        }
        Ok(())
    }
}
