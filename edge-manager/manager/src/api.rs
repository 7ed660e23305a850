//! The manager's whole surface: one [`Action`] enum, the callers, the
//! answers and the errors. The HTTP layer (`http.rs`) only turns a request
//! into one `Action` (firecracker's `VmmAction` is the model); the spec is
//! `docs/spec/edge-manager-api-v1.yaml`.

use serde::{Deserialize, Serialize};

use crate::runtime::{Limits, RuntimeKind};

/// Who is asking.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Caller {
    /// The operator of the access point (a bearer token, on the operator
    /// listener): every instance and user.
    Operator,
    /// A user's device (HTTP Basic with the user's credential, on the
    /// device listener): that user's instances only; others do not exist.
    Device {
        /// The authenticated user.
        user: String,
    },
}

/// Every operation the manager performs.
#[derive(Debug, Clone)]
pub enum Action {
    /// Add a user and issue the credential their devices join with (operator).
    AddUser(AddUser),
    /// The users (operator).
    ListUsers,
    /// Remove a user; refused while the user has instances (operator).
    RemoveUser(String),
    /// Create an instance (stopped) for a user and a service.
    Create(CreateInstance),
    /// The instances the caller may see.
    List,
    /// One instance.
    Status(String),
    /// Start a stopped or crashed instance and wait until it is ready.
    Start(String),
    /// Stop it; it keeps its resources (ports, container) for a quick start.
    Stop(String),
    /// Stop it, keep its state on the edge's storage, free everything else.
    Revoke(String),
    /// Give a revoked instance its resources back and start it.
    Restore(String),
    /// Stop it and delete it with its state.
    Delete(String),
    /// Its last log lines.
    Logs {
        /// The instance.
        id: String,
        /// How many lines (at most 1,000).
        lines: usize,
    },
    /// The device's enrolment bundle (protocol spec §3.1); devices only.
    Enrolment(String),
    /// A device joins: its user's instance for the service is created,
    /// restored or started as needed, and its bundle returned.
    Join(Join),
    /// A device leaves: its instance for the service is stopped or revoked.
    Leave(Leave),
}

/// `POST /v1/users`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AddUser {
    /// `[a-z0-9][a-z0-9-]{0,31}`.
    pub user: String,
    /// Instances this user may have (default: the manager's setting).
    pub max_instances: Option<u32>,
}

/// Limits asked for; missing ones take the manager's defaults.
#[derive(Debug, Clone, Copy, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsRequest {
    /// Bytes.
    pub memory_bytes: Option<u64>,
    /// Thousandths of a core.
    pub cpu_millis: Option<u32>,
    /// Processes and threads.
    pub pids: Option<u32>,
}

/// What to do when an instance ends on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum RestartPolicy {
    /// Leave it crashed.
    Never,
    /// Restart it, with a growing pause, up to 5 times in 10 minutes.
    #[default]
    OnFailure,
}

/// `POST /v1/instances`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CreateInstance {
    /// The user (operator only; a device creates for itself).
    pub user: Option<String>,
    /// The provider service this instance serves, `[a-z0-9-]{1,16}` (e.g. `dropbox`, `default`).
    #[serde(default = "default_service")]
    pub service: String,
    /// The backend (default: the manager's).
    pub runtime: Option<RuntimeKind>,
    /// Resource limits.
    #[serde(default)]
    pub limits: LimitsRequest,
    /// Restart policy.
    #[serde(default)]
    pub restart: RestartPolicy,
}

fn default_service() -> String {
    "default".into()
}

/// `POST /v1/join`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Join {
    /// As in [`CreateInstance::service`].
    #[serde(default = "default_service")]
    pub service: String,
    /// Used only when the instance is created by this join.
    pub runtime: Option<RuntimeKind>,
}

/// `POST /v1/leave`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Leave {
    /// As in [`CreateInstance::service`].
    #[serde(default = "default_service")]
    pub service: String,
    /// `stop` (default) or `revoke`.
    #[serde(default)]
    pub mode: LeaveMode,
}

/// How a device leaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LeaveMode {
    /// Stop the instance.
    #[default]
    Stop,
    /// Revoke it (state kept, resources freed).
    Revoke,
}

/// The life of an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum InstanceState {
    /// Created or stopped: resources held, not running.
    Stopped,
    /// Launched, waiting for `/healthz`.
    Starting,
    /// Ready.
    Running,
    /// Ended on its own; see `last_exit`.
    Crashed,
    /// Stopped, state kept, resources freed.
    Revoked,
}

impl InstanceState {
    /// All states, for metrics.
    pub const ALL: [Self; 5] = [Self::Stopped, Self::Starting, Self::Running, Self::Crashed, Self::Revoked];
    /// The name used in the API and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Stopped => "stopped",
            Self::Starting => "starting",
            Self::Running => "running",
            Self::Crashed => "crashed",
            Self::Revoked => "revoked",
        }
    }
}

/// How an instance last ended on its own.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExitInfo {
    /// Seconds since the Unix epoch.
    pub at: u64,
    /// In the backend's words.
    pub reason: String,
    /// The EPS's last log lines.
    pub log_tail: String,
}

/// An instance as the API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct InstanceView {
    /// `<user>-<service>`.
    pub id: String,
    /// Its user.
    pub user: String,
    /// Its service.
    pub service: String,
    /// Its backend.
    pub runtime: RuntimeKind,
    /// Its state.
    pub state: InstanceState,
    /// Its limits.
    pub limits: Limits,
    /// Its restart policy.
    pub restart: RestartPolicy,
    /// Where devices reach it (absent while revoked).
    pub device_url: Option<String>,
    /// Times started.
    pub starts: u64,
    /// Times it ended on its own.
    pub crashes: u64,
    /// The last of those.
    pub last_exit: Option<ExitInfo>,
    /// Host memory charged to it now.
    pub memory_bytes: Option<u64>,
    /// Seconds from its last launch to its first healthy answer.
    pub ready_seconds: Option<f64>,
    /// Saves the EPS answered (its own counter, gathered).
    pub saves: u64,
    /// Bytes the device link did not carry thanks to patches (whole-file
    /// bytes on the provider link minus bytes on the device link).
    pub bytes_saved: u64,
}

/// A user as the API shows it (never the credential, only at creation).
#[derive(Debug, Clone, Serialize)]
pub struct UserView {
    /// The name.
    pub user: String,
    /// Their instance limit.
    pub max_instances: u32,
    /// Their instances.
    pub instances: Vec<String>,
    /// Only in the answer to `AddUser`: the credential their devices join
    /// with, `ecu1.<user>.<secret>.<manager pin>`; the manager keeps only its hash.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub credential: Option<String>,
}

/// The enrolment bundle of protocol spec §3.1, as `ec_protocol.EnrolmentBundle.from_dict` reads it.
#[derive(Debug, Clone, Serialize)]
pub struct Enrolment {
    /// The EPS URL.
    pub url: String,
    /// The key id.
    pub key_id: u64,
    /// The instance secret, hex.
    pub secret: String,
    /// SHA-256 of the EPS certificate's SubjectPublicKeyInfo, hex.
    pub spki_sha256: String,
    /// Always false from the manager: its instances use TLS.
    pub plain_http: bool,
}

/// The answer to a join.
#[derive(Debug, Clone, Serialize)]
pub struct Joined {
    /// The instance.
    pub instance: InstanceView,
    /// Its bundle.
    pub enrolment: Enrolment,
}

/// A successful answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// One instance (201 when created).
    Instance(InstanceView, bool),
    /// Several.
    Instances(Vec<InstanceView>),
    /// One user (201 when created).
    User(UserView, bool),
    /// Several.
    Users(Vec<UserView>),
    /// Log lines.
    Logs(String),
    /// A bundle.
    Enrolment(Enrolment),
    /// A join.
    Joined(Joined),
    /// Done, nothing to show (204).
    Done,
}

/// Every error the API answers, with its HTTP status and a stable code.
#[derive(Debug, thiserror::Error)]
pub enum ApiError {
    /// 400.
    #[error("{0}")]
    BadRequest(String),
    /// 401.
    #[error("{0}")]
    Unauthenticated(String),
    /// 403.
    #[error("{0}")]
    Forbidden(String),
    /// 404: also what a device gets for another user's instance.
    #[error("{0}")]
    NotFound(String),
    /// 405: a known path, another method; `allow` lists the methods it has.
    #[error("method not allowed here; this path allows {allow}")]
    MethodNotAllowed {
        /// The methods of the path, for the `Allow` header.
        allow: &'static str,
    },
    /// 409: the operation does not fit the instance's state.
    #[error("{0}")]
    Conflict(String),
    /// 422: over a limit; names the limit.
    #[error("{message}")]
    OverLimit {
        /// Which limit (`max_instances`, `memory_bytes`, ...).
        limit: &'static str,
        /// The whole sentence.
        message: String,
    },
    /// 501: the backend cannot run here; names what is missing.
    #[error("{0}")]
    RuntimeUnavailable(String),
    /// 503: the instance did not become ready, or a backend failed.
    #[error("{0}")]
    Unavailable(String),
    /// 500.
    #[error("{0}")]
    Internal(String),
}

impl ApiError {
    /// The HTTP status.
    pub fn status(&self) -> u16 {
        match self {
            Self::BadRequest(_) => 400,
            Self::Unauthenticated(_) => 401,
            Self::Forbidden(_) => 403,
            Self::NotFound(_) => 404,
            Self::MethodNotAllowed { .. } => 405,
            Self::Conflict(_) => 409,
            Self::OverLimit { .. } => 422,
            Self::RuntimeUnavailable(_) => 501,
            Self::Unavailable(_) => 503,
            Self::Internal(_) => 500,
        }
    }

    /// The stable code in the error body.
    pub fn code(&self) -> &'static str {
        match self {
            Self::BadRequest(_) => "bad_request",
            Self::Unauthenticated(_) => "unauthenticated",
            Self::Forbidden(_) => "forbidden",
            Self::NotFound(_) => "not_found",
            Self::MethodNotAllowed { .. } => "method_not_allowed",
            Self::Conflict(_) => "conflict",
            Self::OverLimit { .. } => "over_limit",
            Self::RuntimeUnavailable(_) => "runtime_unavailable",
            Self::Unavailable(_) => "unavailable",
            Self::Internal(_) => "internal",
        }
    }
}

/// Names of users, services and instances: `[a-z0-9][a-z0-9-]*`.
pub fn check_name(what: &str, name: &str, max: usize) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= max
        && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        && !name.starts_with('-');
    if ok {
        Ok(())
    } else {
        Err(ApiError::BadRequest(format!("{what} {name:?} must be 1-{max} characters of a-z, 0-9 and '-', not starting with '-'")))
    }
}
