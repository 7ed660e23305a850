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

use std::collections::HashMap;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Handle, InstanceSpec, Observed, Runtime, RuntimeError, RuntimeKind};

const NAME: &str = "process";

/// The process backend.
#[derive(Debug)]
pub struct ProcessRuntime {
    launcher: PathBuf,
    isolate: bool,
    /// Instances this manager started itself: their exit status is known.
    children: Mutex<HashMap<String, Child>>,
}

impl ProcessRuntime {
    /// Checks that the launcher exists and, when `isolate`, that it can
    /// make cgroups (root and a v1 or v2 hierarchy).
    pub fn probe(launcher: &Path, isolate: bool) -> Result<Self, RuntimeError> {
        let unavailable = |missing: String| RuntimeError::Unavailable { runtime: NAME, missing };
        if !launcher.is_file() {
            return Err(unavailable(format!("the launcher {} does not exist (make build installs it)", launcher.display())));
        }
        if isolate {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return Err(unavailable("isolation (cgroups, a uid per instance) needs root: run the manager as root, or pass --no-isolation on a single-user laptop".into()));
            }
            let out =
                Command::new(launcher).arg("probe").output().map_err(|e| unavailable(format!("running {}: {e}", launcher.display())))?;
            if !out.status.success() {
                return Err(unavailable(String::from_utf8_lossy(&out.stderr).trim().to_owned()));
            }
        }
        Ok(Self { launcher: launcher.to_owned(), isolate, children: Mutex::new(HashMap::new()) })
    }

    fn children(&self) -> std::sync::MutexGuard<'_, HashMap<String, Child>> {
        self.children.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cgroup_file(&self, spec: &InstanceSpec) -> Option<PathBuf> {
        let v2 = Path::new("/sys/fs/cgroup/edgecourier").join(cgroup_name(spec)).join("memory.current");
        let v1 = Path::new("/sys/fs/cgroup/memory/edgecourier").join(cgroup_name(spec)).join("memory.usage_in_bytes");
        [v2, v1].into_iter().find(|p| p.exists())
    }

    fn oom_killed(&self, spec: &InstanceSpec) -> bool {
        let v2 = Path::new("/sys/fs/cgroup/edgecourier").join(cgroup_name(spec)).join("memory.events");
        let v1 = Path::new("/sys/fs/cgroup/memory/edgecourier").join(cgroup_name(spec)).join("memory.oom_control");
        for p in [v2, v1] {
            if let Ok(text) = std::fs::read_to_string(p) {
                return text.lines().any(|l| (l.starts_with("oom_kill ") || l.starts_with("oom_kill\t")) && !l.ends_with(" 0"));
            }
        }
        false
    }
}

/// The instance's cgroup under `edgecourier/`: its id and its uid, so that
/// two managers on one host (a lab, a test run) never share one.
pub fn cgroup_name(spec: &InstanceSpec) -> String {
    format!("{}-u{}", spec.id, spec.uid)
}

/// The start time of a process (field 22 of /proc/<pid>/stat, clock ticks since boot).
fn start_time(pid: &str) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces and parentheses: fields count from the last ')'.
    let rest = &stat[stat.rfind(')')? + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // State is field 3 (index 0 here); a zombie is not running.
    if fields.first() == Some(&"Z") {
        return None;
    }
    fields.get(19).map(|s| (*s).to_owned())
}

fn describe(status: std::process::ExitStatus, oom: bool) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(c), _) => format!("exited with code {c}"),
        (None, Some(9)) if oom => "killed by signal 9: out of memory (the instance's memory limit)".into(),
        (None, Some(s)) => format!("killed by signal {s}"),
        _ => "ended".into(),
    }
}

impl Runtime for ProcessRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Process
    }

    fn start(&self, spec: &InstanceSpec) -> Result<Handle, RuntimeError> {
        let failed = |what: String| RuntimeError::Failed { runtime: NAME, what };
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log_path)
            .map_err(|e| failed(format!("log file {}: {e}", spec.log_path.display())))?;
        let log2 = log.try_clone().map_err(|e| failed(e.to_string()))?;
        let config = spec.state_dir.join("eps.json");
        let mut cmd = Command::new(&self.launcher);
        cmd.arg("run").arg("--name").arg(cgroup_name(spec)).arg("--state").arg(&spec.state_dir);
        if self.isolate {
            cmd.args([
                "--memory-bytes",
                &spec.limits.memory_bytes.to_string(),
                "--cpu-millis",
                &spec.limits.cpu_millis.to_string(),
                "--pids",
                &spec.limits.pids.to_string(),
            ]);
            cmd.args(["--uid", &spec.uid.to_string(), "--gid", &spec.gid.to_string()]);
        } else {
            cmd.arg("--no-isolation");
        }
        cmd.arg("--").arg(&spec.eps_binary).arg("serve").arg("--config").arg(&config);
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        cmd.env_clear().env("EC_EPS_LOG", std::env::var("EC_EPS_LOG").unwrap_or_else(|_| "info".into()));
        let child = cmd.spawn().map_err(|e| failed(format!("spawning {}: {e}", self.launcher.display())))?;
        let pid = child.id().to_string();
        // The start time is read right away; the launcher execs in place, so it stays the same.
        let started = start_time(&pid).unwrap_or_default();
        self.children().insert(spec.id.clone(), child);
        Ok(Handle { id: pid, started })
    }

    fn observe(&self, spec: &InstanceSpec, handle: &Handle) -> Observed {
        if let Some(child) = self.children().get_mut(&spec.id) {
            return match child.try_wait() {
                Ok(None) => Observed::Running,
                Ok(Some(status)) => Observed::Exited { reason: describe(status, self.oom_killed(spec)) },
                Err(e) => Observed::Exited { reason: format!("unknown ({e})") },
            };
        }
        match start_time(&handle.id) {
            Some(t) if t == handle.started => Observed::Running,
            _ if self.oom_killed(spec) => Observed::Exited { reason: "killed: out of memory (the instance's memory limit)".into() },
            _ => Observed::Exited { reason: "ended while not a child of this manager (exit status unknown)".into() },
        }
    }

    fn stop(&self, spec: &InstanceSpec, handle: &Handle, grace: Duration) -> Result<(), RuntimeError> {
        let Ok(pid) = handle.id.parse::<i32>() else { return Ok(()) };
        if self.observe(spec, handle) != Observed::Running {
            return Ok(());
        }
        // SAFETY: kill with a pid we started (its start time was checked just above).
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if self.observe(spec, handle) != Observed::Running {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        // SAFETY: as above.
        unsafe { libc::kill(pid, libc::SIGKILL) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if self.observe(spec, handle) != Observed::Running {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(RuntimeError::Failed { runtime: NAME, what: format!("pid {pid} survived SIGKILL for 5 s") })
    }

    fn release(&self, spec: &InstanceSpec, _handle: Option<&Handle>) -> Result<(), RuntimeError> {
        self.children().remove(&spec.id);
        if !self.isolate {
            return Ok(());
        }
        let out = Command::new(&self.launcher)
            .args(["release", "--name", &cgroup_name(spec)])
            .output()
            .map_err(|e| RuntimeError::Failed { runtime: NAME, what: format!("running the launcher: {e}") })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(RuntimeError::Failed { runtime: NAME, what: String::from_utf8_lossy(&out.stderr).trim().to_owned() })
        }
    }

    fn adopt(&self, spec: &InstanceSpec, handle: &Handle) -> Option<Handle> {
        match start_time(&handle.id) {
            Some(t) if t == handle.started => Some(handle.clone()),
            _ => {
                let _ = self.release(spec, Some(handle));
                None
            }
        }
    }

    fn memory_bytes(&self, spec: &InstanceSpec, handle: &Handle) -> Option<u64> {
        if let Some(p) = self.cgroup_file(spec) {
            return std::fs::read_to_string(p).ok()?.trim().parse().ok();
        }
        // Without isolation: the process's own resident memory.
        let status = std::fs::read_to_string(format!("/proc/{}/status", handle.id)).ok()?;
        let kb: u64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }
}
