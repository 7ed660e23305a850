//! Error codes of the protocol (spec §10) and the one error type of this crate.
//!
//! Every failure a codec function reports is a [`ProtoError`]: the code the
//! EPS answers with (which fixes the HTTP status and, by default, the stage),
//! a detail for people, and the list of item indexes or context ids that the
//! codes `base_unknown`, `patch_failed`, `target_mismatch` and
//! `context_unknown` carry. The detail is built from fixed text and numbers
//! only, never from message content, so it may go into an ERROR (§8).

use thiserror::Error;

/// The error codes of spec §10, with their wire numbers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum ErrorCode {
    Malformed = 1,
    UnsupportedVersion = 2,
    AuthFailed = 3,
    SessionUnknown = 4,
    Replayed = 5,
    TooLarge = 6,
    LimitExceeded = 7,
    InvalidRequest = 8,
    Unsupported = 9,
    HostForbidden = 10,
    KeyForbidden = 11,
    ContextUnknown = 12,
    BaseUnknown = 13,
    PatchFailed = 14,
    TargetMismatch = 15,
    RequestIdConflict = 16,
    InProgress = 17,
    Busy = 18,
    StorageError = 19,
    ProviderUnreachable = 20,
    ProviderTimeout = 21,
    ProviderTruncated = 22,
    ProviderProtocol = 23,
    Internal = 24,
}

/// Every code, in wire order.
pub const ALL_CODES: [ErrorCode; 24] = {
    use ErrorCode::*;
    [
        Malformed,
        UnsupportedVersion,
        AuthFailed,
        SessionUnknown,
        Replayed,
        TooLarge,
        LimitExceeded,
        InvalidRequest,
        Unsupported,
        HostForbidden,
        KeyForbidden,
        ContextUnknown,
        BaseUnknown,
        PatchFailed,
        TargetMismatch,
        RequestIdConflict,
        InProgress,
        Busy,
        StorageError,
        ProviderUnreachable,
        ProviderTimeout,
        ProviderTruncated,
        ProviderProtocol,
        Internal,
    ]
};

impl ErrorCode {
    /// The code's number on the wire (the `code` byte of an ERROR).
    pub fn number(self) -> u8 {
        self as u8
    }

    /// The code for a wire number, if it is one of §10.
    pub fn from_number(n: u8) -> Option<ErrorCode> {
        ALL_CODES.get(usize::from(n).wrapping_sub(1)).copied()
    }

    /// The snake_case name the spec and the test vectors use.
    pub fn name(self) -> &'static str {
        use ErrorCode::*;
        match self {
            Malformed => "malformed",
            UnsupportedVersion => "unsupported_version",
            AuthFailed => "auth_failed",
            SessionUnknown => "session_unknown",
            Replayed => "replayed",
            TooLarge => "too_large",
            LimitExceeded => "limit_exceeded",
            InvalidRequest => "invalid_request",
            Unsupported => "unsupported",
            HostForbidden => "host_forbidden",
            KeyForbidden => "key_forbidden",
            ContextUnknown => "context_unknown",
            BaseUnknown => "base_unknown",
            PatchFailed => "patch_failed",
            TargetMismatch => "target_mismatch",
            RequestIdConflict => "request_id_conflict",
            InProgress => "in_progress",
            Busy => "busy",
            StorageError => "storage_error",
            ProviderUnreachable => "provider_unreachable",
            ProviderTimeout => "provider_timeout",
            ProviderTruncated => "provider_truncated",
            ProviderProtocol => "provider_protocol",
            Internal => "internal",
        }
    }

    /// The code with this name.
    pub fn from_name(name: &str) -> Option<ErrorCode> {
        ALL_CODES.iter().copied().find(|c| c.name() == name)
    }

    /// The HTTP status of the EPS's answer carrying this code.
    pub fn http_status(self) -> u16 {
        use ErrorCode::*;
        match self {
            Malformed | UnsupportedVersion | LimitExceeded => 400,
            AuthFailed | SessionUnknown => 401,
            HostForbidden | KeyForbidden => 403,
            Replayed | ContextUnknown | BaseUnknown | RequestIdConflict => 409,
            TooLarge => 413,
            InvalidRequest | Unsupported | PatchFailed | TargetMismatch => 422,
            StorageError | Internal => 500,
            ProviderUnreachable | ProviderTruncated | ProviderProtocol => 502,
            InProgress | Busy => 503,
            ProviderTimeout => 504,
        }
    }

    /// The stage the table of §10 gives; for the codes marked "0/1" this is
    /// 0 and the EPS raises it to 1 once a provider may have been contacted.
    pub fn default_stage(self) -> u8 {
        use ErrorCode::*;
        match self {
            InProgress | ProviderTimeout | ProviderTruncated | ProviderProtocol => 1,
            _ => 0,
        }
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A protocol failure: the §10 code to answer with, a detail for people
/// (fixed text and numbers only), and the ids the code lists.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
#[error("{code}: {detail}")]
pub struct ProtoError {
    /// What the EPS answers.
    pub code: ErrorCode,
    /// For logs and the ERROR's `detail`; never holds message content.
    pub detail: String,
    /// Item indexes or context ids, for the codes that list them.
    pub list: Vec<u64>,
}

impl ProtoError {
    /// An error with this code and detail and an empty list.
    pub fn new(code: ErrorCode, detail: impl Into<String>) -> Self {
        ProtoError { code, detail: detail.into(), list: Vec::new() }
    }
    /// An error that lists item indexes or context ids.
    pub fn with_list(code: ErrorCode, detail: impl Into<String>, list: Vec<u64>) -> Self {
        ProtoError { code, detail: detail.into(), list }
    }
    pub(crate) fn malformed(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::Malformed, detail)
    }
    pub(crate) fn invalid(detail: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidRequest, detail)
    }
}

/// Result of this crate.
pub type Result<T, E = ProtoError> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_names_and_statuses_follow_the_table() {
        for (i, c) in ALL_CODES.iter().enumerate() {
            assert_eq!(usize::from(c.number()), i + 1);
            assert_eq!(ErrorCode::from_number(c.number()), Some(*c));
            assert_eq!(ErrorCode::from_name(c.name()), Some(*c));
        }
        assert_eq!(ErrorCode::from_number(0), None);
        assert_eq!(ErrorCode::from_number(25), None);
        assert_eq!(ErrorCode::AuthFailed.http_status(), 401);
        assert_eq!(ErrorCode::TooLarge.http_status(), 413);
        assert_eq!(ErrorCode::ProviderTimeout.http_status(), 504);
        assert_eq!(ErrorCode::InProgress.default_stage(), 1);
        assert_eq!(ErrorCode::BaseUnknown.default_stage(), 0);
    }
}
