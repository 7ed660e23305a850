//! The edge manager: every user's EPS instance on the access point.
//!
//! - [`api`]: the whole surface, one [`api::Action`] enum, its callers,
//!   replies and errors (spec: `docs/spec/edge-manager-api-v1.yaml`);
//! - [`http`]: the two listeners, translating requests into actions;
//! - [`manager`]: performs actions, watches instances, restarts them;
//! - [`runtime`]: one interface, one module per backend (`process`, `docker`);
//! - [`state`]: the persisted state; [`tls`]: certificates and pins;
//! - [`metrics`], [`status_page`]: what the operator sees.
//!
//! The privileged steps (cgroups, uids) are in a separate program,
//! `ec-launcher` (`edge-manager/launcher`).

pub mod api;
pub mod http;
pub mod manager;
pub mod metrics;
pub mod runtime;
pub mod state;
pub mod status_page;
pub mod tls;
