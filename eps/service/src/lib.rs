//! # ec-eps: the edge-hosted personal service
//!
//! One instance per user, on the Wi-Fi access point or edge router. It
//! answers the device-to-edge protocol (`docs/spec/device-edge-protocol-v1.md`):
//! rebuilds each save from its edit patch against the user's last-synced
//! version, checks the SHA-256 the device sent, performs the provider's own
//! upload requests with the whole file and hands back the provider's
//! response; downloads come back to the device as patches.
//!
//! - [`config`]: the instance's JSON configuration.
//! - [`server`]: listeners, TLS and routing (translation only).
//! - [`service`]: what each message does, in the spec's order of checks.
//! - [`sessions`]: sessions, replay windows, contexts (memory only).
//! - [`metrics`]: the Prometheus metrics of spec §12.
//! - [`conns`]: the connection cap and timeouts; [`body`]: reading request bodies with bounds.
//! - [`sealed`]: outcome records sealed with a key only a retry of the request can derive.
//! - [`ratelimit`]: log lines limited per site.
//!
//! The store (`ec-store`), the provider procedures (`ec-providers`) and the
//! codec (`ec-protocol`) are crates of their own.

pub mod body;
pub mod config;
pub mod conns;
#[macro_use]
pub mod ratelimit;
pub mod metrics;
pub mod sealed;
pub mod server;
pub mod service;
pub mod sessions;
