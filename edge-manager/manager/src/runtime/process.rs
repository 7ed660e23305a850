//! The `process` backend: the EPS as a process of the host.
//!
//! The embedded default (a laptop, the demo, the tests). Each instance is
//! started through `ec-launcher` (the small privileged helper in
//! `edge-manager/launcher`), which puts it in a cgroup of its own with the
//! instance's memory, CPU and process limits (v1 or v2), gives it a uid of
//! its own (its state folder is owner-only, so no instance reads
//! another's), and `exec`s `ec-eps`: nothing stays between the manager and
//! the EPS. The launcher calls `setsid`, so instances outlive a manager
//! restart and are re-adopted by pid and process start time (a reused pid
//! has another start time).
//!
//! Network: the EPS listens on the access point's Wi-Fi address at the
//! instance's own port and on host loopback for management; separation
//! between users is by authentication (each instance holds only its own
//! user's keys) and by uid, not by network namespace.

use std::path::Path;
use std::time::Duration;

use super::launcher::{Launch, Launcher};
use super::{Handle, InstanceSpec, Observed, Runtime, RuntimeError, RuntimeKind};

pub use super::launcher::cgroup_name;

const NAME: &str = "process";

/// The process backend.
#[derive(Debug)]
pub struct ProcessRuntime {
    launcher: Launcher,
}

impl ProcessRuntime {
    /// Checks that the launcher exists and, when `isolate`, that it can
    /// make cgroups (root and a v1 or v2 hierarchy).
    pub fn probe(launcher: &Path, isolate: bool) -> Result<Self, RuntimeError> {
        Ok(Self { launcher: Launcher::probe(launcher, isolate, NAME)? })
    }
}

impl Runtime for ProcessRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Process
    }

    fn start(&self, spec: &InstanceSpec) -> Result<Handle, RuntimeError> {
        let config = spec.state_dir.join("eps.json");
        let program = vec![spec.eps_binary.clone().into_os_string(), "serve".into(), "--config".into(), config.into_os_string()];
        let env = vec![("EC_EPS_LOG", std::env::var("EC_EPS_LOG").unwrap_or_else(|_| "info".into()))];
        self.launcher
            .spawn(spec, Launch { program, env, memory_bytes: spec.limits.memory_bytes, extra_gid: None, fd3: None, no_thp: false })
    }

    fn observe(&self, spec: &InstanceSpec, handle: &Handle) -> Observed {
        self.launcher.observe(spec, handle)
    }

    fn stop(&self, spec: &InstanceSpec, handle: &Handle, grace: Duration) -> Result<(), RuntimeError> {
        self.launcher.terminate(spec, handle, grace)
    }

    fn release(&self, spec: &InstanceSpec, _handle: Option<&Handle>) -> Result<(), RuntimeError> {
        self.launcher.release(spec)
    }

    fn adopt(&self, spec: &InstanceSpec, handle: &Handle) -> Option<Handle> {
        if self.launcher.alive(handle) {
            Some(handle.clone())
        } else {
            let _ = self.release(spec, Some(handle));
            None
        }
    }

    fn memory_bytes(&self, spec: &InstanceSpec, handle: &Handle) -> Option<u64> {
        self.launcher.memory_bytes(spec, handle)
    }
}
