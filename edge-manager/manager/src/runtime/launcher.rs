//! The client of `ec-launcher`, shared by the backends whose instance is a
//! host process (`process`: the EPS itself; `microvm`: the QEMU process of
//! the appliance): a cgroup of its own with the instance's limits, a uid of
//! its own, `setsid` so that it outlives a manager restart, and then exec.
//! The handle is the pid and the process's start time (a reused pid has
//! another start time).

use std::collections::HashMap;
use std::ffi::OsString;
use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::{Handle, InstanceSpec, Observed, RuntimeError};

/// What to run for an instance.
#[derive(Debug)]
pub struct Launch<'a> {
    /// The program and its arguments.
    pub program: Vec<OsString>,
    /// The environment (everything else is cleared).
    pub env: Vec<(&'a str, String)>,
    /// The cgroup's memory limit (bytes).
    pub memory_bytes: u64,
    /// A supplementary group (`kvm`).
    pub extra_gid: Option<u32>,
    /// A descriptor the program gets as its fd 3 (the microvm backend's tap,
    /// opened by the manager: the instance's uid needs no access to
    /// /dev/net/tun). Only that child gets it: the manager's copy is close-on-exec.
    pub fd3: Option<std::os::fd::RawFd>,
    /// No transparent huge pages for the program (`PR_SET_THP_DISABLE`).
    pub no_thp: bool,
}

/// Launches and follows instance processes through `ec-launcher`.
#[derive(Debug)]
pub struct Launcher {
    path: PathBuf,
    isolate: bool,
    runtime: &'static str,
    /// Instances this manager started itself: their exit status is known.
    children: Mutex<HashMap<String, Child>>,
}

/// The instance's cgroup under `edgecourier/`: its id and its uid, so that
/// two managers on one host (a lab, a test run) never share one.
pub fn cgroup_name(spec: &InstanceSpec) -> String {
    format!("{}-u{}", spec.id, spec.uid)
}

/// The start time of a process (field 22 of /proc/<pid>/stat, clock ticks since boot).
pub fn start_time(pid: &str) -> Option<String> {
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

impl Launcher {
    /// Checks that the launcher exists and, when `isolate`, that it can
    /// make cgroups (root and a v1 or v2 hierarchy).
    pub fn probe(path: &Path, isolate: bool, runtime: &'static str) -> Result<Self, RuntimeError> {
        let unavailable = |missing: String| RuntimeError::Unavailable { runtime, missing };
        if !path.is_file() {
            return Err(unavailable(format!("the launcher {} does not exist (make build installs it)", path.display())));
        }
        if isolate {
            // SAFETY: geteuid has no preconditions.
            if unsafe { libc::geteuid() } != 0 {
                return Err(unavailable("isolation (cgroups, a uid per instance) needs root: run the manager as root, or pass --no-isolation on a single-user laptop".into()));
            }
            let out = Command::new(path).arg("probe").output().map_err(|e| unavailable(format!("running {}: {e}", path.display())))?;
            if !out.status.success() {
                return Err(unavailable(String::from_utf8_lossy(&out.stderr).trim().to_owned()));
            }
        }
        Ok(Self { path: path.to_owned(), isolate, runtime, children: Mutex::new(HashMap::new()) })
    }

    /// Whether instances get their own cgroup and uid.
    pub fn isolates(&self) -> bool {
        self.isolate
    }

    fn children(&self) -> std::sync::MutexGuard<'_, HashMap<String, Child>> {
        self.children.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn cgroup_file(&self, spec: &InstanceSpec, v2: &str, v1: &str) -> Option<PathBuf> {
        let v2 = Path::new("/sys/fs/cgroup/edgecourier").join(cgroup_name(spec)).join(v2);
        let v1 = Path::new("/sys/fs/cgroup/memory/edgecourier").join(cgroup_name(spec)).join(v1);
        [v2, v1].into_iter().find(|p| p.exists())
    }

    fn oom_killed(&self, spec: &InstanceSpec) -> bool {
        let Some(p) = self.cgroup_file(spec, "memory.events", "memory.oom_control") else { return false };
        std::fs::read_to_string(p)
            .map(|text| text.lines().any(|l| (l.starts_with("oom_kill ") || l.starts_with("oom_kill\t")) && !l.ends_with(" 0")))
            .unwrap_or(false)
    }

    /// Starts `what` for the instance; stdout and stderr go to its log.
    pub fn spawn(&self, spec: &InstanceSpec, what: Launch<'_>) -> Result<Handle, RuntimeError> {
        let failed = |what: String| RuntimeError::Failed { runtime: self.runtime, what };
        let log = OpenOptions::new()
            .create(true)
            .append(true)
            .open(&spec.log_path)
            .map_err(|e| failed(format!("log file {}: {e}", spec.log_path.display())))?;
        let log2 = log.try_clone().map_err(|e| failed(e.to_string()))?;
        let mut cmd = Command::new(&self.path);
        cmd.arg("run").arg("--name").arg(cgroup_name(spec)).arg("--state").arg(&spec.state_dir);
        if self.isolate {
            cmd.args([
                "--memory-bytes",
                &what.memory_bytes.to_string(),
                "--cpu-millis",
                &spec.limits.cpu_millis.to_string(),
                "--pids",
                &spec.limits.pids.to_string(),
            ]);
            cmd.args(["--uid", &spec.uid.to_string(), "--gid", &spec.gid.to_string()]);
            if let Some(g) = what.extra_gid {
                cmd.args(["--extra-gid", &g.to_string()]);
            }
        } else {
            cmd.arg("--no-isolation");
        }
        if what.no_thp {
            cmd.arg("--no-thp");
        }
        cmd.arg("--").args(&what.program);
        cmd.stdin(Stdio::null()).stdout(log).stderr(log2);
        if let Some(fd) = what.fd3 {
            use std::os::unix::process::CommandExt;
            // SAFETY: dup2 is async-signal-safe; the copy on fd 3 has no
            // close-on-exec flag, so it survives the launcher's exec.
            unsafe {
                cmd.pre_exec(move || if libc::dup2(fd, 3) < 0 { Err(std::io::Error::last_os_error()) } else { Ok(()) });
            }
        }
        cmd.env_clear();
        for (k, v) in what.env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().map_err(|e| failed(format!("spawning {}: {e}", self.path.display())))?;
        let pid = child.id().to_string();
        // The start time is read right away; the launcher execs in place, so it stays the same.
        let started = start_time(&pid).unwrap_or_default();
        self.children().insert(spec.id.clone(), child);
        Ok(Handle { id: pid, started })
    }

    /// Whether it still runs.
    pub fn observe(&self, spec: &InstanceSpec, handle: &Handle) -> Observed {
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

    /// Waits up to `within` for the process to end; true if it did.
    pub fn wait_ended(&self, spec: &InstanceSpec, handle: &Handle, within: Duration) -> bool {
        let deadline = Instant::now() + within;
        loop {
            if self.observe(spec, handle) != Observed::Running {
                return true;
            }
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Sends `sig` to the process if it still is the one started.
    pub fn signal(&self, spec: &InstanceSpec, handle: &Handle, sig: libc::c_int) {
        let Ok(pid) = handle.id.parse::<i32>() else { return };
        if self.observe(spec, handle) == Observed::Running {
            // SAFETY: kill with a pid we started (its start time was checked just above).
            unsafe { libc::kill(pid, sig) };
        }
    }

    /// SIGTERM, then SIGKILL after `grace`. Idempotent.
    pub fn terminate(&self, spec: &InstanceSpec, handle: &Handle, grace: Duration) -> Result<(), RuntimeError> {
        if self.observe(spec, handle) != Observed::Running {
            return Ok(());
        }
        self.signal(spec, handle, libc::SIGTERM);
        if self.wait_ended(spec, handle, grace) {
            return Ok(());
        }
        self.signal(spec, handle, libc::SIGKILL);
        if self.wait_ended(spec, handle, Duration::from_secs(5)) {
            return Ok(());
        }
        Err(RuntimeError::Failed { runtime: self.runtime, what: format!("pid {} survived SIGKILL for 5 s", handle.id) })
    }

    /// Forgets the child and removes the cgroup.
    pub fn release(&self, spec: &InstanceSpec) -> Result<(), RuntimeError> {
        self.children().remove(&spec.id);
        if !self.isolate {
            return Ok(());
        }
        let out = Command::new(&self.path)
            .args(["release", "--name", &cgroup_name(spec)])
            .output()
            .map_err(|e| RuntimeError::Failed { runtime: self.runtime, what: format!("running the launcher: {e}") })?;
        if out.status.success() {
            Ok(())
        } else {
            Err(RuntimeError::Failed { runtime: self.runtime, what: String::from_utf8_lossy(&out.stderr).trim().to_owned() })
        }
    }

    /// Whether a persisted handle still names a running process.
    pub fn alive(&self, handle: &Handle) -> bool {
        matches!(start_time(&handle.id), Some(t) if t == handle.started)
    }

    /// The cgroup's memory use, or the process's resident memory without isolation.
    pub fn memory_bytes(&self, spec: &InstanceSpec, handle: &Handle) -> Option<u64> {
        if let Some(p) = self.cgroup_file(spec, "memory.current", "memory.usage_in_bytes") {
            return std::fs::read_to_string(p).ok()?.trim().parse().ok();
        }
        let status = std::fs::read_to_string(format!("/proc/{}/status", handle.id)).ok()?;
        let kb: u64 = status.lines().find(|l| l.starts_with("VmRSS:"))?.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb * 1024)
    }
}
