//! Errors of a provider procedure ([`ProcError`]) and of building the
//! upstream client ([`ConfigError`]).
//!
//! A [`ProcError`] maps one-to-one onto the `provider_*`, `host_forbidden`
//! and `invalid_request` codes of §10, and carries the stage the ERROR
//! message reports. Its `detail` is built from fixed text, numbers, a
//! scheme and host at most: never a credential, a query string, a path or
//! a provider error text (§8).

use std::fmt;

/// What went wrong, in the terms of the protocol's error codes (§10).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ProcErrorKind {
    /// DNS, connect or TLS failure (`provider_unreachable`).
    Unreachable,
    /// No (complete) provider response within the timeouts (`provider_timeout`).
    Timeout,
    /// The provider's response ended early (`provider_truncated`).
    Truncated,
    /// The provider's response is unusable for the procedure (`provider_protocol`).
    Protocol,
    /// A URL, or a provider-given URL, outside the allowlist (`host_forbidden`).
    HostForbidden,
    /// The procedure's requests are inconsistent (`invalid_request`); always stage 0.
    Invalid,
}

impl ProcErrorKind {
    /// The protocol's error code name (§10).
    pub fn code(self) -> &'static str {
        match self {
            Self::Unreachable => "provider_unreachable",
            Self::Timeout => "provider_timeout",
            Self::Truncated => "provider_truncated",
            Self::Protocol => "provider_protocol",
            Self::HostForbidden => "host_forbidden",
            Self::Invalid => "invalid_request",
        }
    }
}

/// A procedure that did not produce a provider response to hand back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProcError {
    /// The error code.
    pub kind: ProcErrorKind,
    /// 0: nothing was sent to a provider yet; 1: provider requests may have been sent.
    pub stage: u8,
    /// For people; never holds credentials, query strings, paths or file names.
    pub detail: String,
    /// The provider requests the procedure sent before it failed, each with
    /// its status (`None`: no response), in the order they completed; for
    /// per-call metrics.
    pub call_statuses: Vec<Option<u16>>,
}

impl ProcError {
    pub(crate) fn new(kind: ProcErrorKind, stage: u8, detail: impl Into<String>) -> Self {
        Self { kind, stage, detail: detail.into(), call_statuses: Vec::new() }
    }
    pub(crate) fn invalid(detail: impl Into<String>) -> Self {
        Self::new(ProcErrorKind::Invalid, 0, detail)
    }
    pub(crate) fn protocol(detail: impl Into<String>) -> Self {
        Self::new(ProcErrorKind::Protocol, 1, detail)
    }
}

impl fmt::Display for ProcError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (stage {}): {}", self.kind.code(), self.stage, self.detail)
    }
}

impl std::error::Error for ProcError {}

/// The upstream configuration cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// An extra root CA is not a PEM certificate rustls accepts.
    #[error("extra root CA #{index} is not a usable PEM certificate: {reason}")]
    BadRootCa {
        /// Position in `extra_root_ca_pem`.
        index: usize,
        /// What rustls or the PEM parser said.
        reason: String,
    },
    /// A host pattern is empty or malformed.
    #[error("host pattern {0:?} is not a host name or `*.suffix`")]
    BadHostPattern(String),
    /// A chunk or fragment size breaks the provider's rule.
    #[error("{name} = {value} bytes: {rule}")]
    BadChunkSize {
        /// The configuration name (`graph_fragment`, ...).
        name: &'static str,
        /// The configured value.
        value: u64,
        /// The rule it breaks.
        rule: &'static str,
    },
    /// The TLS configuration could not be built.
    #[error("TLS setup failed: {0}")]
    Tls(String),
}
