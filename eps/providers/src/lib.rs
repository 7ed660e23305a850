//! The EPS's provider procedures: the provider requests the edge service
//! performs for one save or one download, as fixed by §6 of
//! `docs/spec/device-edge-protocol-v1.md`.
//!
//! The service decodes a SAVE into a [`Procedure`] (the app's request(s)
//! plus the rebuilt file) and hands it to [`Upstream::perform`], which runs
//! the provider's request sequence over one shared, pooled HTTP client and
//! returns the provider's final response untouched. Downloads go through
//! [`Upstream::fetch`]. Everything here follows four rules of §6.0:
//!
//! - the app's requests go out exactly as sent (header order and bytes),
//!   with only `Host` and `Content-Length` added;
//! - no hidden retries: every provider request is sent at most once;
//! - a provider status of 400 or more stops a sequence and is returned
//!   unchanged; anything else unexpected is [`ProcErrorKind::Protocol`];
//! - only allow-listed hosts are contacted, provider-given URLs included,
//!   and TLS is always verified.
//!
//! Errors carry a *stage* (0: nothing reached a provider, 1: something may
//! have), which decides whether the device may fall back (§7).
//!
//! Module map: [`config`] (hosts, timeouts, chunk sizes), `transport` (the
//! one HTTP client: sending, timeouts, error mapping), `procedures` (one
//! module per provider, quirks isolated there), `hashes` (§6.7 provider
//! hash comparison), `json_splice` (byte-exact edits of Dropbox JSON).

#![deny(missing_docs)]

pub mod config;
mod error;
mod hashes;
mod json_splice;
mod procedures;
mod redact;
mod transport;
mod types;
mod upstream;

pub use config::{HostPattern, UpstreamConfig};
pub use error::{ConfigError, ProcError, ProcErrorKind};
pub use types::{Body, Feed, Fetched, FileFeed, Performed, Procedure, Provider, ProviderRequest, ProviderResponse};
pub use upstream::Upstream;
