//! One interface for every place an EPS instance can run.
//!
//! The manager decides *what* should run (which instance, with which
//! limits, in which state); a [`Runtime`] knows *how* to run it in one kind
//! of place. Each backend lives in its own module with the same shape
//! (`process.rs`, `docker.rs`, `microvm.rs`, `xen.rs`): a struct
//! implementing [`Runtime`], built by `probe()`, which fails with
//! [`RuntimeError::Unavailable`] naming what the host lacks.
//!
//! Contract shared by every backend:
//! - `start` returns once the instance was launched (not once it is ready:
//!   the manager waits for `/healthz` itself, the same way for every backend);
//! - `observe` never blocks for long and never changes anything;
//! - `stop` is graceful (SIGTERM or the backend's equivalent, then a hard
//!   stop after `grace`), and idempotent;
//! - `release` frees what `start` allocated beyond the process (a
//!   container, a cgroup), keeping the instance's state folder;
//! - the state folder (`InstanceSpec::state_dir`) is the only thing that
//!   survives: revocation keeps it, deletion is the manager's business.
//! - `adopt` finds an instance a previous manager started (after the
//!   manager's own restart), from the handle it persisted.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

pub mod appliance;
pub mod docker;
pub mod launcher;
pub mod microvm;
pub mod process;
pub mod vmnet;
pub mod xen;

/// Which backend runs an instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, PartialOrd, Ord)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    /// A process of the host, in its own cgroup, as an unprivileged user.
    Process,
    /// A container of the local Docker engine, from an image built `FROM scratch`.
    Docker,
    /// The appliance (a minimal kernel and the EPS) in a QEMU microVM.
    Microvm,
    /// The appliance as a Xen PVH guest (the manager runs in dom0).
    Xen,
}

impl RuntimeKind {
    /// Every backend, in the order the API lists them.
    pub const ALL: [RuntimeKind; 4] = [Self::Process, Self::Docker, Self::Microvm, Self::Xen];

    /// The name used in the API, the CLI and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Self::Process => "process",
            Self::Docker => "docker",
            Self::Microvm => "microvm",
            Self::Xen => "xen",
        }
    }
}

/// Resource limits of one instance.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    /// Memory (RSS + page cache of the instance's cgroup), bytes.
    pub memory_bytes: u64,
    /// CPU, in thousandths of one core (1000 = one core).
    pub cpu_millis: u32,
    /// Processes and threads.
    pub pids: u32,
}

/// Everything a backend needs to start one instance.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    /// Unique, DNS-label-safe (`[a-z0-9-]`, at most 40 characters).
    pub id: String,
    /// The instance's slot: its ports are the manager's bases plus the slot;
    /// the VM backends also derive its link and addresses from it.
    pub slot: u32,
    /// The instance's state folder on the host: `eps.json`, `tls/`, `store/`.
    pub state_dir: PathBuf,
    /// Where the device listener must be reachable from the Wi-Fi side.
    pub device_addr: SocketAddr,
    /// Where the manager reaches `/healthz` and `/metrics` (host loopback).
    pub management_addr: SocketAddr,
    /// Resource limits.
    pub limits: Limits,
    /// Where the backend writes the EPS's stdout and stderr on the host
    /// (outside the state folder, which belongs to the instance's uid).
    pub log_path: PathBuf,
    /// The static `ec-eps` binary on the host (the process backend runs it;
    /// the docker backend's image carries its own copy of it).
    pub eps_binary: PathBuf,
    /// Unprivileged uid/gid the EPS runs as (distinct per instance).
    pub uid: u32,
    /// See `uid`.
    pub gid: u32,
}

/// What a backend persists to find its instance again (after a manager restart).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Handle {
    /// Process id (process, microvm), container id (docker) or domain id (xen).
    pub id: String,
    /// Distinguishes a reused pid: the process's start time in clock ticks
    /// since boot (process, microvm), the container's creation time
    /// (docker), or the domain's UUID (xen).
    pub started: String,
}

/// What a backend observes of an instance it started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "snake_case")]
pub enum Observed {
    /// Alive (not necessarily ready).
    Running,
    /// Ended; the reason in the backend's words ("exit code 1", "killed by
    /// signal 9 (out of memory)").
    Exited {
        /// Why it ended.
        reason: String,
    },
    /// The backend knows nothing of this handle any more.
    Gone,
}

/// Errors of a backend. Messages name what the operator can do.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// The backend cannot run on this host.
    #[error("the {runtime} runtime is not available on this host: {missing}")]
    Unavailable {
        /// The backend.
        runtime: &'static str,
        /// What is missing, and how to get it.
        missing: String,
    },
    /// A launch or stop failed.
    #[error("{runtime}: {what}")]
    Failed {
        /// The backend.
        runtime: &'static str,
        /// What failed.
        what: String,
    },
}

/// The interface of every backend.
pub trait Runtime: Send + Sync + std::fmt::Debug {
    /// Which backend this is.
    fn kind(&self) -> RuntimeKind;
    /// Launches the instance; returns once it was launched.
    fn start(&self, spec: &InstanceSpec) -> Result<Handle, RuntimeError>;
    /// Whether it still runs.
    fn observe(&self, spec: &InstanceSpec, handle: &Handle) -> Observed;
    /// How often the manager may ask [`Runtime::observe`] while it waits for
    /// an instance to be ready (its `/healthz` is asked every 25 ms): a
    /// backend whose observation costs a process says so.
    fn observe_period(&self) -> Duration {
        Duration::ZERO
    }
    /// Stops it: graceful, then hard after `grace`. Idempotent.
    fn stop(&self, spec: &InstanceSpec, handle: &Handle, grace: Duration) -> Result<(), RuntimeError>;
    /// Frees what `start` allocated besides the state folder. Idempotent.
    fn release(&self, spec: &InstanceSpec, handle: Option<&Handle>) -> Result<(), RuntimeError>;
    /// Whether a handle persisted by an earlier manager still names this
    /// instance, running (`Some`) or not (`None`, and then it is released).
    fn adopt(&self, spec: &InstanceSpec, handle: &Handle) -> Option<Handle>;
    /// Host memory charged to the instance now, bytes (its cgroup's usage).
    fn memory_bytes(&self, spec: &InstanceSpec, handle: &Handle) -> Option<u64>;
    /// The listen addresses to write into the instance's `eps.json`
    /// (`listen`, `management_listen`), as seen from inside the instance.
    /// A process listens where the host is reached; a container or a VM
    /// listens on its own interfaces and the backend forwards.
    fn eps_listen(&self, spec: &InstanceSpec) -> (SocketAddr, SocketAddr) {
        (spec.device_addr, spec.management_addr)
    }
    /// The manager stops (its instances keep running): give back host
    /// resources that no running instance needs.
    fn shutdown(&self) {}
    /// The last `lines` lines the EPS wrote (stdout and stderr).
    fn log_tail(&self, spec: &InstanceSpec, _handle: Option<&Handle>, lines: usize) -> String {
        tail_file(&spec.log_path, lines)
    }
}

/// What a program run by [`run_with_timeout`] did.
#[derive(Debug)]
pub struct Ran {
    /// How it ended.
    pub status: std::process::ExitStatus,
    /// Everything it wrote on stdout.
    pub stdout: String,
    /// Everything it wrote on stderr.
    pub stderr: String,
}

/// Runs a command line tool (stdin closed, both outputs read on threads so
/// neither pipe fills), killing it when it runs over `timeout`: `Ok(None)`.
pub fn run_with_timeout<S: AsRef<std::ffi::OsStr>>(
    program: &std::path::Path,
    args: &[S],
    timeout: Duration,
) -> std::io::Result<Option<Ran>> {
    use std::io::Read;
    use std::process::{Command, Stdio};
    let mut child = Command::new(program).args(args).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn()?;
    let mut so = child.stdout.take().expect("piped");
    let mut se = child.stderr.take().expect("piped");
    let t_out = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = so.read_to_string(&mut s);
        s
    });
    let t_err = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = se.read_to_string(&mut s);
        s
    });
    let deadline = std::time::Instant::now() + timeout;
    let mut pause = Duration::from_millis(1);
    let status = loop {
        match child.try_wait()? {
            Some(st) => break Some(st),
            None if std::time::Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            None => {
                std::thread::sleep(pause);
                pause = (pause * 2).min(Duration::from_millis(20));
            }
        }
    };
    let stdout = t_out.join().unwrap_or_default();
    let stderr = t_err.join().unwrap_or_default();
    Ok(status.map(|status| Ran { status, stdout, stderr }))
}

/// A program's absolute path (PATH is searched for a bare name).
pub fn which(p: &std::path::Path) -> Option<PathBuf> {
    if p.components().count() > 1 {
        return p.is_file().then(|| p.to_owned());
    }
    std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).map(|d| d.join(p)).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .find(|c| c.is_file())
}

/// The last `lines` lines of a file (at most 64 KiB read), or "" if absent.
pub fn tail_file(path: &std::path::Path, lines: usize) -> String {
    use std::io::{Read, Seek, SeekFrom};
    let Ok(mut f) = std::fs::File::open(path) else { return String::new() };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let start = len.saturating_sub(64 * 1024);
    if f.seek(SeekFrom::Start(start)).is_err() {
        return String::new();
    }
    let mut buf = Vec::new();
    let _ = f.take(64 * 1024).read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}
