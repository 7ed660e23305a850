//! # ec-protocol: the EdgeCourier device-to-edge protocol, version 1
//!
//! The codec of `docs/spec/device-edge-protocol-v1.md`: the bytes a device
//! proxy and its edge service (EPS) exchange, and the pure functions both
//! need around them. It holds no state and does no I/O.
//!
//! - [`wire`]: varints, blobs, a bounded reader (§1.2).
//! - [`cb`]: coded bytes, SAME / DELTA / LITERAL against a reference (§1.3).
//! - [`mac`]: the request and response MACs (§3.2).
//! - [`head`]: canonical request and response heads, URL rules (§4.3.1, §4.6.1).
//! - [`messages`]: HELLO … ERROR, `encode` and structural `decode` (§4).
//! - [`resolve`]: context definitions, request resolution, the digests (§4.3, §4.6.2, §5.4).
//! - [`limits`], [`error`]: §9 and §10.
//!
//! Typical EPS use for a SAVE: [`messages::Save::decode`] (step 2), look up
//! the session and check the MAC over `framing.s(bytes)` with
//! [`mac::verify_request_mac`] (step 3), [`resolve::apply_definitions`]
//! (step 4), [`resolve::resolve_save`] (step 5),
//! [`messages::Save::split_payloads`] (step 6), [`resolve::operation_digest`]
//! (step 7).

pub mod cb;
pub mod error;
pub mod head;
pub mod limits;
pub mod mac;
pub mod messages;
pub mod resolve;
pub mod wire;

pub use cb::Cb;
pub use error::{ErrorCode, ProtoError, Result};
pub use head::{Head, HeadRules, ResponseHead};
pub use limits::Limits;
pub use messages::*;
pub use resolve::{Context, ContextTable, ResolvedBody, ResolvedRequest, ResolvedSave};
