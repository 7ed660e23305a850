//! The `docker` backend: each EPS instance is one container of the local
//! Docker engine, from the image `docker/build` makes `FROM scratch` around
//! the static `ec-eps` (`make docker-image`; nothing is pulled).
//!
//! # Why the `docker` CLI and not an API client crate
//!
//! The engine is driven through the `docker` command (`std::process::Command`),
//! not through its HTTP API with a client crate (bollard and the like pull in
//! an async runtime, hyper, and a large generated API surface). The manager
//! calls a backend from blocking threads, a handful of calls per instance
//! life; a fork+exec of the CLI costs some 20-50 ms, which is nothing next to
//! the container's own start, and the CLI speaks every engine version with
//! API-version negotiation (this host: CLI 28 against engine 20.10). Every
//! call has a timeout, so `observe` cannot hang on a stuck engine.
//!
//! # Design
//!
//! **Container.** `docker run -d --name ec-<id> --label edgecourier.instance=<id>`
//! with `--user <uid>:<gid>` (the spec's own numeric ids), `--read-only`,
//! `--cap-drop ALL`, `--security-opt no-new-privileges`, `--restart no` (the
//! manager owns restarts), `--memory`/`--memory-swap` (the same value: no
//! swap), `--cpus`, `--pids-limit` from `spec.limits`, and the state folder
//! bind-mounted at `/state`. The image's entry point is
//! `/ec-eps serve --config /state/eps.json`: the EPS takes the folder of its
//! configuration as its state folder, so inside the container every relative
//! path of eps.json (tls/…, store/) resolves under `/state`. Before the run the
//! state folder is given to the instance's uid (the container sees host ids),
//! and absolute `upstream.extra_ca_pem_files` of eps.json (the lab's CA) are
//! mounted read-only at the same path. `upstream.resolve` addresses must be
//! reachable from inside a container: not 127.0.0.1 (the container's own),
//! but a host address such as the advertised one, with the server listening
//! there.
//!
//! **Addresses.** Inside the container the EPS listens on
//! [`EPS_DEVICE_LISTEN`] (`0.0.0.0:8443`) and [`EPS_MANAGEMENT_LISTEN`]
//! (`0.0.0.0:9100`): the manager writes exactly these into eps.json for this
//! backend (the trait's `eps_listen` returns them). The device port is published
//! at `spec.device_addr` (`-p <ip>:<port>:8443`); the management port is
//! published on the host loopback at `spec.management_addr`
//! (`-p 127.0.0.1:<port>:9100`), so the manager reaches `/healthz` and
//! `/metrics` there exactly as for the process backend. Both are reachable
//! directly at the container's address too ([`DockerRuntime::container_ip`]),
//! which is what a density setup uses with `publish_management: false`
//! (each published port costs a `docker-proxy` process unless the engine runs
//! with `"userland-proxy": false`; see docs/benchmarks.md, Density).
//!
//! **Networks: users apart, at scale.** One network per user does not scale
//! (Docker's default address pools give about 30 networks; every network is a
//! bridge, iptables rules and a subnet). Instead the backend creates a few
//! shared bridge networks `ec-net-<k>` with inter-container communication
//! disabled (`com.docker.network.bridge.enable_icc=false`: the engine drops
//! bridge-to-same-bridge forwarding, and its isolation chains drop traffic
//! between different Docker bridges), each with an explicit /22 subnet taken
//! from `subnet_base` (so no default pool is used up). A container reaches
//! the outside (the providers) and is reached through its published ports,
//! but never another container directly: tested below for two containers on
//! the same network and on different ones. A Linux bridge takes at most
//! 1,023 ports, so one network cannot hold more than ~1,000 containers:
//! instances are spread over `networks` networks by a hash of the instance
//! id (stable, so an instance tends to land where it was), and a start that
//! finds its network full tries the next one. 4 networks × 1,022 addresses
//! hold 4,000 instances.
//!
//! **Finding containers again.** The handle is the full container id plus its
//! creation time; every container carries the label `edgecourier.instance`,
//! so [`Runtime::adopt`] after a manager restart, [`DockerRuntime::list`] and
//! [`DockerRuntime::remove_all`] find them even without a handle.
//!
//! **Observing.** `observe` reads `docker inspect` (`OOMKilled` → "killed: out
//! of memory"); [`DockerRuntime::watch_events`] follows `docker events` for
//! restart detection without polling; `memory_bytes` reads the container's
//! cgroup (v1 `memory.usage_in_bytes`, v2 `memory.current`) straight from
//! /sys/fs/cgroup, with `docker stats --no-stream` as the fallback.
//!
//! **Privilege.** Whoever may use the engine's socket is root-equivalent; the
//! manager's user needs that access (the `docker` group) for this backend.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::Deserialize;

use super::{Handle, InstanceSpec, Observed, Runtime, RuntimeError, RuntimeKind};

const RT: &str = "docker";

/// The image `make docker-image` tags last.
pub const DEFAULT_IMAGE: &str = "edgecourier/eps:local";
/// The label every container of this backend carries: the instance id.
pub const LABEL_INSTANCE: &str = "edgecourier.instance";
/// The label of the networks this backend creates.
pub const LABEL_NETWORK: &str = "edgecourier.network";
/// Where the state folder is mounted inside the container.
pub const CONTAINER_STATE_DIR: &str = "/state";
/// The device listener's port inside the container.
pub const CONTAINER_DEVICE_PORT: u16 = 8443;
/// The management listener's port inside the container.
pub const CONTAINER_MANAGEMENT_PORT: u16 = 9100;
/// `listen` of eps.json for this backend.
pub const EPS_DEVICE_LISTEN: &str = "0.0.0.0:8443";
/// `management_listen` of eps.json for this backend.
pub const EPS_MANAGEMENT_LISTEN: &str = "0.0.0.0:9100";

/// Settings of the backend; [`Default`] is what the manager uses.
#[derive(Debug, Clone)]
pub struct DockerConfig {
    /// The CLI (a name looked up on PATH, or a path).
    pub docker: PathBuf,
    /// How many shared networks instances are spread over (1..=64).
    pub networks: u16,
    /// Network `k` is `network_prefix-k` ...
    pub network_prefix: String,
    /// ... with the subnet `subnet_base + k * 1024` / 22 (addresses the host
    /// does not route elsewhere; the default 10.213.0.0 leaves room for 64).
    pub subnet_base: Ipv4Addr,
    /// Publish the management port on the host loopback at
    /// `spec.management_addr` (else it is reached at the container's address).
    pub publish_management: bool,
    /// Upper bound of one CLI call (a `stop` adds its grace).
    pub cli_timeout: Duration,
    /// Per-container log bound (json-file `max-size`, two files).
    pub log_max_size: String,
    /// Bind-mount the host's copy of the binary the image was built from
    /// (label `edgecourier.eps.source`) over `/ec-eps`, read-only, when its
    /// SHA-256 still matches the image's (label `edgecourier.eps.sha256`).
    /// On a fuse-overlayfs engine every container's root is its own FUSE
    /// mount, so the EPS's code pages would be cached once per container
    /// (about 3.6 MB each, measured); one host file is cached once for all.
    /// Falls back to the image's own copy when the file changed or is gone.
    pub share_binary: bool,
}

impl Default for DockerConfig {
    fn default() -> Self {
        Self {
            docker: PathBuf::from("docker"),
            networks: 4,
            network_prefix: "ec-net".into(),
            subnet_base: Ipv4Addr::new(10, 213, 0, 0),
            publish_management: true,
            cli_timeout: Duration::from_secs(60),
            log_max_size: "1m".into(),
            share_binary: true,
        }
    }
}

/// The docker backend.
#[derive(Debug)]
pub struct DockerRuntime {
    image: String,
    image_id: String,
    /// The host file bind-mounted over `/ec-eps` (see [`DockerConfig::share_binary`]).
    /// Its size and modification time when it was checked, to notice a rebuild.
    shared_binary: Option<(PathBuf, u64, SystemTime)>,
    config: DockerConfig,
    /// Networks known to exist (created or found by this process).
    networks_ready: Mutex<HashSet<u16>>,
}

/// Serialises network creation in this process: the engine (20.10) does not
/// reliably refuse two concurrent creates of one name.
static NETWORK_CREATE: Mutex<()> = Mutex::new(());

/// One container of this backend, as [`DockerRuntime::list`] finds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Found {
    /// The instance id (label `edgecourier.instance`).
    pub instance: String,
    /// Full container id.
    pub container: String,
    /// The engine's state word (`running`, `exited`, `created`, …).
    pub state: String,
}

/// One engine event about a container of this backend.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerEvent {
    /// The instance id (label `edgecourier.instance`).
    pub instance: String,
    /// Full container id (compare with the instance's [`Handle::id`]).
    pub container: String,
    /// What happened.
    pub action: EventAction,
    /// The engine's timestamp, nanoseconds since the epoch.
    pub time_nanos: i64,
}

/// The engine's container actions, those the manager acts on named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EventAction {
    /// The container's process started.
    Start,
    /// The container's process ended (crash, OOM kill, or a stop).
    Die {
        /// Its exit code, when the engine reported one.
        exit_code: Option<i32>,
    },
    /// The kernel's OOM killer hit the container's cgroup (a `Die` follows).
    Oom,
    /// A signal was sent by the engine (`docker stop`/`kill`).
    Kill {
        /// The signal's number.
        signal: Option<i32>,
    },
    /// `docker stop` completed.
    Stop,
    /// The container was removed.
    Destroy,
    /// Anything else (`create`, `attach`, `rename`, …), the engine's word.
    Other(String),
}

/// A running [`DockerRuntime::watch_events`]; stops the watcher when dropped.
#[derive(Debug)]
pub struct EventWatch {
    stop: Arc<AtomicBool>,
    child: Arc<Mutex<Option<Child>>>,
    thread: Option<JoinHandle<()>>,
}

impl EventWatch {
    /// Stops the watcher and waits for its thread.
    pub fn stop(mut self) {
        self.shutdown();
    }

    fn shutdown(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(child) = self.child.lock().unwrap_or_else(|e| e.into_inner()).as_mut() {
            let _ = child.kill();
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for EventWatch {
    fn drop(&mut self) {
        self.shutdown();
    }
}

/// What a CLI call gave.
#[derive(Debug)]
struct Out {
    ok: bool,
    stdout: String,
    stderr: String,
}

fn failed(what: impl Into<String>) -> RuntimeError {
    RuntimeError::Failed { runtime: RT, what: what.into() }
}

fn unavailable(missing: impl Into<String>) -> RuntimeError {
    RuntimeError::Unavailable { runtime: RT, missing: missing.into() }
}

fn no_such(stderr: &str) -> bool {
    let s = stderr.to_ascii_lowercase();
    s.contains("no such container") || s.contains("no such object")
}

/// Runs the CLI with a timeout (the child is killed when it runs over).
fn run_cli(docker: &Path, args: &[String], timeout: Duration) -> Result<Out, String> {
    match super::run_with_timeout(docker, args, timeout).map_err(|e| format!("cannot run {}: {e}", docker.display()))? {
        Some(r) => Ok(Out { ok: r.status.success(), stdout: r.stdout, stderr: r.stderr.trim().to_owned() }),
        None => Err(format!(
            "`docker {}` did not answer within {} s (engine stuck?)",
            args.first().map(String::as_str).unwrap_or(""),
            timeout.as_secs()
        )),
    }
}

fn on_path(name: &Path) -> bool {
    if name.components().count() > 1 {
        return name.is_file();
    }
    std::env::var_os("PATH").map(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file())).unwrap_or(false)
}

/// FNV-1a: a stable hash of the instance id (std's hasher is seeded per process).
fn fnv1a(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

/// `docker inspect` of one container, the fields used here.
#[derive(Debug, Deserialize)]
struct Inspect {
    #[serde(rename = "Id")]
    id: String,
    #[serde(rename = "Created")]
    created: String,
    #[serde(rename = "State")]
    state: State,
    #[serde(rename = "Config")]
    config: InspectConfig,
    #[serde(rename = "NetworkSettings")]
    network: Option<NetworkSettings>,
}

#[derive(Debug, Deserialize)]
#[allow(dead_code)]
struct State {
    #[serde(rename = "Status")]
    status: String,
    #[serde(rename = "Running", default)]
    running: bool,
    #[serde(rename = "OOMKilled", default)]
    oom_killed: bool,
    #[serde(rename = "ExitCode", default)]
    exit_code: i64,
    #[serde(rename = "Error", default)]
    error: String,
    #[serde(rename = "Pid", default)]
    pid: i64,
}

#[derive(Debug, Deserialize)]
struct InspectConfig {
    #[serde(rename = "Labels", default)]
    labels: Option<std::collections::HashMap<String, String>>,
}

#[derive(Debug, Deserialize)]
struct NetworkSettings {
    #[serde(rename = "Networks", default)]
    networks: Option<std::collections::HashMap<String, Endpoint>>,
}

#[derive(Debug, Deserialize)]
struct Endpoint {
    #[serde(rename = "IPAddress", default)]
    ip: String,
}

impl Inspect {
    fn instance(&self) -> Option<&str> {
        self.config.labels.as_ref()?.get(LABEL_INSTANCE).map(String::as_str)
    }
}

/// The words of [`Observed::Exited`] for a container that ended.
fn exit_reason(st: &State) -> String {
    if st.oom_killed {
        return format!("killed: out of memory (exit code {})", st.exit_code);
    }
    if !st.error.is_empty() {
        return format!("failed to start: {}", st.error);
    }
    match st.exit_code {
        c if c > 128 && c < 160 => format!("killed by signal {} (exit code {c})", c - 128),
        c => format!("exit code {c}"),
    }
}

impl DockerRuntime {
    /// Checks the CLI, the engine and the image, with the default settings.
    pub fn probe(image: &str) -> Result<Self, RuntimeError> {
        Self::probe_with(image, DockerConfig::default())
    }

    /// [`Self::probe`] with other settings (tests and benchmarks use their own networks).
    pub fn probe_with(image: &str, config: DockerConfig) -> Result<Self, RuntimeError> {
        if config.networks == 0 || config.networks > 64 {
            return Err(failed(format!("networks must be 1..=64, not {}", config.networks)));
        }
        if !on_path(&config.docker) {
            return Err(unavailable(format!(
                "no `{}` command on PATH (install the Docker CLI and engine, e.g. Debian's docker.io)",
                config.docker.display()
            )));
        }
        let t = Duration::from_secs(15);
        let version =
            run_cli(&config.docker, &["version".into(), "--format".into(), "{{.Server.Version}}".into()], t).map_err(unavailable)?;
        if !version.ok || version.stdout.trim().is_empty() {
            return Err(unavailable(format!(
                "the Docker engine is not reachable through `docker` ({}); is dockerd running, and may this user use its socket?",
                version.stderr.lines().last().unwrap_or("no answer")
            )));
        }
        let img = run_cli(&config.docker, &["image".into(), "inspect".into(), "--format".into(), "{{.Id}}".into(), image.into()], t)
            .map_err(unavailable)?;
        if !img.ok {
            return Err(unavailable(format!("the image {image} is not built: run `make docker-image`")));
        }
        let shared_binary = if config.share_binary { shared_binary(&config.docker, image) } else { None }.and_then(|p| {
            let m = std::fs::metadata(&p).ok()?;
            Some((p, m.len(), m.modified().ok()?))
        });
        Ok(Self {
            image: image.to_owned(),
            image_id: img.stdout.trim().to_owned(),
            shared_binary,
            config,
            networks_ready: Mutex::new(HashSet::new()),
        })
    }

    /// The image this runtime starts (as given to `probe`).
    pub fn image(&self) -> &str {
        &self.image
    }

    /// The host copy of the EPS binary the containers map, if shared.
    /// `None` once the file changed since `probe` (a rebuild: the image's
    /// own copy is used until the next `make docker-image` and probe).
    pub fn shared_binary(&self) -> Option<&Path> {
        let (p, len, mtime) = self.shared_binary.as_ref()?;
        let m = std::fs::metadata(p).ok()?;
        (m.len() == *len && m.modified().ok()? == *mtime).then_some(p.as_path())
    }

    /// The image's id at probe time.
    pub fn image_id(&self) -> &str {
        &self.image_id
    }

    /// The `listen` and `management_listen` addresses eps.json must carry for
    /// this backend (inside the container): `0.0.0.0:8443`, `0.0.0.0:9100`.
    pub fn container_listen() -> (SocketAddr, SocketAddr) {
        (SocketAddr::from(([0, 0, 0, 0], CONTAINER_DEVICE_PORT)), SocketAddr::from(([0, 0, 0, 0], CONTAINER_MANAGEMENT_PORT)))
    }

    /// The container's name for an instance.
    pub fn container_name(id: &str) -> String {
        format!("ec-{id}")
    }

    fn cli(&self, args: &[&str]) -> Result<Out, RuntimeError> {
        self.cli_t(args, self.config.cli_timeout)
    }

    fn cli_t(&self, args: &[&str], timeout: Duration) -> Result<Out, RuntimeError> {
        let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
        run_cli(&self.config.docker, &args, timeout).map_err(failed)
    }

    fn network_name(&self, k: u16) -> String {
        format!("{}-{k}", self.config.network_prefix)
    }

    fn subnet(&self, k: u16) -> String {
        let base = u32::from(self.config.subnet_base);
        format!("{}/22", Ipv4Addr::from(base + u32::from(k) * 1024))
    }

    /// The network an instance goes to first.
    pub fn network_of(&self, id: &str) -> String {
        self.network_name((fnv1a(id) % u64::from(self.config.networks)) as u16)
    }

    /// Creates network `k` unless it exists.
    fn ensure_network(&self, k: u16) -> Result<String, RuntimeError> {
        let name = self.network_name(k);
        if self.networks_ready.lock().unwrap_or_else(|e| e.into_inner()).contains(&k) {
            return Ok(name);
        }
        let _g = NETWORK_CREATE.lock().unwrap_or_else(|e| e.into_inner());
        let found = self.cli(&["network", "inspect", "--format", "{{.Id}}", &name])?;
        if !found.ok {
            let subnet = self.subnet(k);
            let label = format!("{LABEL_NETWORK}=1");
            let bridge = format!("com.docker.network.bridge.name={}", bridge_name(&self.config.network_prefix, k));
            let out = self.cli(&[
                "network",
                "create",
                "--driver",
                "bridge",
                "--subnet",
                &subnet,
                "--opt",
                "com.docker.network.bridge.enable_icc=false",
                "--opt",
                &bridge,
                "--label",
                &label,
                &name,
            ])?;
            if !out.ok && !out.stderr.contains("already exists") {
                return Err(failed(format!("cannot create network {name} ({subnet}): {}", out.stderr)));
            }
        }
        self.networks_ready.lock().unwrap_or_else(|e| e.into_inner()).insert(k);
        Ok(name)
    }

    fn inspect(&self, container: &str) -> Result<Option<Inspect>, RuntimeError> {
        let out = self.cli_t(&["container", "inspect", "--format", "{{json .}}", container], Duration::from_secs(15))?;
        if !out.ok {
            if no_such(&out.stderr) {
                return Ok(None);
            }
            return Err(failed(format!("docker inspect {container}: {}", out.stderr)));
        }
        serde_json::from_str(out.stdout.trim()).map(Some).map_err(|e| failed(format!("docker inspect {container}: unreadable answer: {e}")))
    }

    fn run_args(&self, spec: &InstanceSpec, network: &str) -> Result<Vec<String>, RuntimeError> {
        let l = &spec.limits;
        if spec.device_addr.port() == 0 || (self.config.publish_management && spec.management_addr.port() == 0) {
            return Err(failed("the docker backend needs fixed ports (port 0 cannot be published)"));
        }
        let state = spec.state_dir.canonicalize().map_err(|e| failed(format!("state folder {}: {e}", spec.state_dir.display())))?;
        let state = state.to_str().ok_or_else(|| failed("state folder path is not UTF-8"))?;
        if state.contains(',') {
            return Err(failed("state folder path contains a comma (not allowed in --mount)"));
        }
        let mut a: Vec<String> = vec![
            "run".into(),
            "--detach".into(),
            "--name".into(),
            Self::container_name(&spec.id),
            "--label".into(),
            format!("{LABEL_INSTANCE}={}", spec.id),
            "--user".into(),
            format!("{}:{}", spec.uid, spec.gid),
            "--read-only".into(),
            "--cap-drop".into(),
            "ALL".into(),
            "--security-opt".into(),
            "no-new-privileges".into(),
            "--restart".into(),
            "no".into(),
            "--network".into(),
            network.into(),
            "--mount".into(),
            format!("type=bind,source={state},target={CONTAINER_STATE_DIR}"),
            "--publish".into(),
            format!("{}:{CONTAINER_DEVICE_PORT}", publish_addr(spec.device_addr)),
            "--log-opt".into(),
            format!("max-size={}", self.config.log_max_size),
            "--log-opt".into(),
            "max-file=2".into(),
        ];
        if let Some(bin) = self.shared_binary().and_then(|b| b.to_str()).filter(|b| !b.contains(',')) {
            a.push("--mount".into());
            a.push(format!("type=bind,source={bin},target=/ec-eps,readonly"));
        }
        // Extra trusted roots named by absolute host paths in eps.json (the
        // lab's CA) are mounted read-only at the same path, so the file the
        // configuration names exists inside the container too.
        for ca in absolute_ca_files(&spec.state_dir.join("eps.json")) {
            a.push("--mount".into());
            a.push(format!("type=bind,source={ca},target={ca},readonly"));
        }
        if self.config.publish_management {
            a.push("--publish".into());
            a.push(format!("{}:{CONTAINER_MANAGEMENT_PORT}", publish_addr(spec.management_addr)));
        }
        if l.memory_bytes > 0 {
            a.extend(["--memory".into(), l.memory_bytes.to_string(), "--memory-swap".into(), l.memory_bytes.to_string()]);
        }
        if l.cpu_millis > 0 {
            a.extend(["--cpus".into(), format!("{}.{:03}", l.cpu_millis / 1000, l.cpu_millis % 1000)]);
        }
        if l.pids > 0 {
            a.extend(["--pids-limit".into(), l.pids.to_string()]);
        }
        a.push(self.image.clone());
        Ok(a)
    }

    /// All containers of this backend (any state).
    pub fn list(&self) -> Result<Vec<Found>, RuntimeError> {
        let filter = format!("label={LABEL_INSTANCE}");
        let fmt = format!("{{{{.ID}}}}\t{{{{.Label \"{LABEL_INSTANCE}\"}}}}\t{{{{.State}}}}");
        let out = self.cli(&["ps", "--all", "--no-trunc", "--filter", &filter, "--format", &fmt])?;
        if !out.ok {
            return Err(failed(format!("docker ps: {}", out.stderr)));
        }
        Ok(out
            .stdout
            .lines()
            .filter_map(|l| {
                let mut f = l.split('\t');
                Some(Found { container: f.next()?.into(), instance: f.next()?.into(), state: f.next()?.into() })
            })
            .collect())
    }

    /// Removes every container of this backend (cleanup after tests, benchmarks
    /// or a lost manager state). Returns how many were removed.
    pub fn remove_all(&self) -> Result<usize, RuntimeError> {
        let found = self.list()?;
        for chunk in found.chunks(100) {
            let mut args = vec!["rm", "--force"];
            args.extend(chunk.iter().map(|f| f.container.as_str()));
            let out = self.cli(&args)?;
            if !out.ok && !no_such(&out.stderr) {
                return Err(failed(format!("docker rm: {}", out.stderr)));
            }
        }
        Ok(found.len())
    }

    /// The container's address on its network (the management listener is at
    /// `<ip>:9100` there, the device listener at `<ip>:8443`).
    pub fn container_ip(&self, handle: &Handle) -> Option<IpAddr> {
        let info = self.inspect(&handle.id).ok()??;
        info.network?.networks?.values().find_map(|e| e.ip.parse().ok())
    }

    /// The host pid of the container's process (0 when not running).
    pub fn pid(&self, handle: &Handle) -> Option<u32> {
        let info = self.inspect(&handle.id).ok()??;
        u32::try_from(info.state.pid).ok().filter(|p| *p > 0)
    }

    /// The last `lines` lines the EPS wrote (stdout and stderr), for crash reports.
    pub fn logs(&self, handle: &Handle, lines: usize) -> Result<String, RuntimeError> {
        let n = lines.to_string();
        let out = self.cli_t(&["logs", "--tail", &n, &handle.id], Duration::from_secs(15))?;
        if !out.ok {
            return Err(failed(format!("docker logs: {}", out.stderr)));
        }
        // The CLI copies the container's stdout and stderr to its own.
        let mut s = out.stdout;
        if !out.stderr.is_empty() {
            if !s.is_empty() && !s.ends_with('\n') {
                s.push('\n');
            }
            s.push_str(&out.stderr);
        }
        Ok(s)
    }

    /// Follows the engine's events about this backend's containers and sends
    /// each to `tx` from a thread of its own, until the returned
    /// [`EventWatch`] is stopped or dropped, or `tx`'s receiver is gone.
    /// Events from the moment of this call on are delivered (the CLI is asked
    /// for `--since <now>`, so none is lost while it connects); when the
    /// stream breaks (engine restart) it reconnects from the last event seen.
    pub fn watch_events(&self, tx: Sender<ContainerEvent>) -> Result<EventWatch, RuntimeError> {
        let stop = Arc::new(AtomicBool::new(false));
        let child: Arc<Mutex<Option<Child>>> = Arc::new(Mutex::new(None));
        let docker = self.config.docker.clone();
        let since = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos() as i64).unwrap_or(0);
        let first = spawn_events(&docker, since).map_err(failed)?;
        *child.lock().unwrap_or_else(|e| e.into_inner()) = Some(first);
        let (stop2, child2) = (stop.clone(), child.clone());
        let thread = std::thread::Builder::new()
            .name("docker-events".into())
            .spawn(move || events_loop(docker, since, stop2, child2, tx))
            .map_err(|e| failed(format!("cannot start the events thread: {e}")))?;
        Ok(EventWatch { stop, child, thread: Some(thread) })
    }
}

/// The absolute, existing `upstream.extra_ca_pem_files` of an eps.json
/// (relative ones are under `/state` already).
fn absolute_ca_files(config: &Path) -> Vec<String> {
    let Ok(text) = std::fs::read(config) else { return vec![] };
    let Ok(cfg) = serde_json::from_slice::<serde_json::Value>(&text) else { return vec![] };
    let Some(files) = cfg.pointer("/upstream/extra_ca_pem_files").and_then(|v| v.as_array()) else { return vec![] };
    files
        .iter()
        .filter_map(|f| f.as_str())
        .filter(|f| f.starts_with('/') && !f.contains(',') && !f.starts_with("/state/") && Path::new(f).is_file())
        .map(str::to_owned)
        .collect()
}

/// Gives the state folder to the instance's uid:gid. It is bind-mounted and
/// the container sees the host's ids, so the EPS (running as `spec.uid`)
/// can read eps.json and write its store only if they are its own. Links
/// are not followed (`lchown`); only what differs is changed.
fn give_state(spec: &InstanceSpec) -> Result<(), RuntimeError> {
    use std::os::unix::fs::MetadataExt;
    fn walk(p: &Path, uid: u32, gid: u32) -> std::io::Result<()> {
        let m = std::fs::symlink_metadata(p)?;
        if m.uid() != uid || m.gid() != gid {
            std::os::unix::fs::lchown(p, Some(uid), Some(gid))?;
        }
        if m.is_dir() {
            for e in std::fs::read_dir(p)? {
                walk(&e?.path(), uid, gid)?;
            }
        }
        Ok(())
    }
    walk(&spec.state_dir, spec.uid, spec.gid).map_err(|e| {
        failed(format!(
            "the state folder {} must belong to uid {} (the EPS's uid in its container) and cannot be given to it: {e}",
            spec.state_dir.display(),
            spec.uid
        ))
    })
}

/// The image's source binary, if the host file still is the one in the image.
fn shared_binary(docker: &Path, image: &str) -> Option<PathBuf> {
    let fmt = "{{index .Config.Labels \"edgecourier.eps.source\"}} {{index .Config.Labels \"edgecourier.eps.sha256\"}}";
    let args: Vec<String> = ["image", "inspect", "--format", fmt, image].iter().map(|s| s.to_string()).collect();
    let out = run_cli(docker, &args, Duration::from_secs(15)).ok().filter(|o| o.ok)?;
    let mut f = out.stdout.split_whitespace();
    let (path, want) = (PathBuf::from(f.next()?), f.next()?.to_owned());
    if !path.is_absolute() || want.len() != 64 {
        return None;
    }
    let sum = Command::new("sha256sum").arg(&path).stderr(Stdio::null()).output().ok()?;
    let got = String::from_utf8_lossy(&sum.stdout);
    (sum.status.success() && got.split_whitespace().next() == Some(want.as_str())).then_some(path)
}

fn bridge_name(prefix: &str, k: u16) -> String {
    // Linux interface names hold 15 bytes: a hash of the prefix, not the prefix.
    format!("br-ec{:06x}-{k}", fnv1a(prefix) & 0xff_ffff)
}

fn publish_addr(a: SocketAddr) -> String {
    match a.ip() {
        IpAddr::V4(ip) => format!("{ip}:{}", a.port()),
        IpAddr::V6(ip) => format!("[{ip}]:{}", a.port()),
    }
}

fn spawn_events(docker: &Path, since_nanos: i64) -> Result<Child, String> {
    let since = format!("{}.{:09}", since_nanos / 1_000_000_000, since_nanos % 1_000_000_000);
    Command::new(docker)
        .args(["events", "--since", &since, "--filter", "type=container"])
        .args(["--filter", &format!("label={LABEL_INSTANCE}"), "--format", "{{json .}}"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot run `docker events`: {e}"))
}

#[derive(Debug, Deserialize)]
struct RawEvent {
    #[serde(rename = "Action", default)]
    action: String,
    #[serde(rename = "Actor", default)]
    actor: Option<RawActor>,
    #[serde(rename = "timeNano", default)]
    time_nano: i64,
}

#[derive(Debug, Deserialize)]
struct RawActor {
    #[serde(rename = "ID", default)]
    id: String,
    #[serde(rename = "Attributes", default)]
    attributes: std::collections::HashMap<String, String>,
}

fn parse_event(line: &str) -> Option<ContainerEvent> {
    let raw: RawEvent = serde_json::from_str(line).ok()?;
    let actor = raw.actor?;
    let instance = actor.attributes.get(LABEL_INSTANCE)?.clone();
    let num = |k: &str| actor.attributes.get(k).and_then(|v| v.parse().ok());
    // Actions like "exec_start: sh" carry a suffix after a colon.
    let word = raw.action.split(':').next().unwrap_or("").trim();
    let action = match word {
        "start" => EventAction::Start,
        "die" => EventAction::Die { exit_code: num("exitCode") },
        "oom" => EventAction::Oom,
        "kill" => EventAction::Kill { signal: num("signal") },
        "stop" => EventAction::Stop,
        "destroy" => EventAction::Destroy,
        other => EventAction::Other(other.to_owned()),
    };
    Some(ContainerEvent { instance, container: actor.id, action, time_nanos: raw.time_nano })
}

fn events_loop(docker: PathBuf, mut since: i64, stop: Arc<AtomicBool>, child: Arc<Mutex<Option<Child>>>, tx: Sender<ContainerEvent>) {
    // Events at the last timestamp seen, so a reconnect does not repeat them.
    let mut seen_at_since: Vec<(String, String)> = Vec::new();
    loop {
        let stdout = {
            let mut g = child.lock().unwrap_or_else(|e| e.into_inner());
            if g.is_none() {
                if let Ok(c) = spawn_events(&docker, since) {
                    *g = Some(c);
                }
            }
            if stop.load(Ordering::SeqCst) {
                if let Some(c) = g.as_mut() {
                    let _ = c.kill();
                }
            }
            g.as_mut().and_then(|c| c.stdout.take())
        };
        if let Some(out) = stdout {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { break };
                let Some(ev) = parse_event(&line) else { continue };
                let key = (ev.container.clone(), format!("{:?}", ev.action));
                if ev.time_nanos < since || (ev.time_nanos == since && seen_at_since.contains(&key)) {
                    continue;
                }
                if ev.time_nanos > since {
                    since = ev.time_nanos;
                    seen_at_since.clear();
                }
                seen_at_since.push(key);
                if tx.send(ev).is_err() {
                    stop.store(true, Ordering::SeqCst);
                    break;
                }
            }
        }
        // The stream ended: stopped, receiver gone, or the engine went away.
        if let Some(mut c) = child.lock().unwrap_or_else(|e| e.into_inner()).take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        if stop.load(Ordering::SeqCst) {
            return;
        }
        // Reconnect after a pause (engine restarting), replaying from `since`.
        for _ in 0..10 {
            if stop.load(Ordering::SeqCst) {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Runtime for DockerRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Docker
    }

    fn start(&self, spec: &InstanceSpec) -> Result<Handle, RuntimeError> {
        give_state(spec)?;
        let name = Self::container_name(&spec.id);
        let n = self.config.networks;
        let first = (fnv1a(&spec.id) % u64::from(n)) as u16;
        let mut last_err = String::new();
        for step in 0..n {
            let network = self.ensure_network((first + step) % n)?;
            let args = self.run_args(spec, &network)?;
            let refs: Vec<&str> = args.iter().map(String::as_str).collect();
            let out = self.cli(&refs)?;
            if out.ok {
                let id = out.stdout.trim().to_owned();
                let info = self.inspect(&id)?.ok_or_else(|| failed(format!("container {id} vanished right after its start")))?;
                return Ok(Handle { id: info.id, started: info.created });
            }
            last_err = out.stderr.clone();
            if out.stderr.contains("is already in use by container") {
                // A container of this name exists: left over (not running) is
                // removed and the start retried; running means a double start.
                match self.inspect(&name)? {
                    Some(old) if old.state.running => {
                        return Err(failed(format!(
                            "instance {} already runs as container {} (adopt it instead of starting it again)",
                            spec.id, old.id
                        )))
                    }
                    _ => {
                        let _ = self.cli(&["rm", "--force", &name]);
                        let out = self.cli(&refs)?;
                        if out.ok {
                            let id = out.stdout.trim().to_owned();
                            let info = self.inspect(&id)?.ok_or_else(|| failed(format!("container {id} vanished")))?;
                            return Ok(Handle { id: info.id, started: info.created });
                        }
                        last_err = out.stderr.clone();
                    }
                }
            }
            // `docker run` may leave a created-but-not-started container behind.
            let _ = self.cli(&["rm", "--force", &name]);
            let full = last_err.contains("no available IPv4 addresses")
                || last_err.contains("exchange full")
                || last_err.contains("no space left on device");
            if !full {
                break;
            }
        }
        Err(failed(format!("cannot start container {name}: {}", last_err.lines().last().unwrap_or(&last_err))))
    }

    fn observe(&self, spec: &InstanceSpec, handle: &Handle) -> Observed {
        match self.inspect(&handle.id) {
            Ok(None) => Observed::Gone,
            Ok(Some(info)) if info.instance() != Some(spec.id.as_str()) || info.created != handle.started => Observed::Gone,
            Ok(Some(info)) => match info.state.status.as_str() {
                "running" | "paused" | "restarting" => Observed::Running,
                "removing" => Observed::Gone,
                "created" => Observed::Exited { reason: "created but never started".into() },
                _ => Observed::Exited { reason: exit_reason(&info.state) },
            },
            // The engine does not answer: the instance cannot be served.
            Err(e) => Observed::Exited { reason: format!("engine unreachable: {e}") },
        }
    }

    fn stop(&self, _spec: &InstanceSpec, handle: &Handle, grace: Duration) -> Result<(), RuntimeError> {
        let secs = grace.as_secs() + u64::from(grace.subsec_nanos() > 0);
        let t = secs.to_string();
        let out = self.cli_t(&["stop", "--time", &t, &handle.id], self.config.cli_timeout + grace)?;
        if out.ok || no_such(&out.stderr) {
            Ok(())
        } else {
            Err(failed(format!("docker stop {}: {}", handle.id, out.stderr)))
        }
    }

    fn release(&self, spec: &InstanceSpec, handle: Option<&Handle>) -> Result<(), RuntimeError> {
        let name = Self::container_name(&spec.id);
        let target = handle.map(|h| h.id.as_str()).unwrap_or(&name);
        let out = self.cli(&["rm", "--force", target])?;
        if !out.ok && !no_such(&out.stderr) {
            return Err(failed(format!("docker rm {target}: {}", out.stderr)));
        }
        if handle.is_some() {
            // A container of the same instance under its name (e.g. started by a
            // manager that died before persisting the handle) goes too, but not
            // if it runs: that one is another start's business.
            if let Ok(Some(other)) = self.inspect(&name) {
                if !other.state.running && other.instance() == Some(spec.id.as_str()) {
                    let _ = self.cli(&["rm", "--force", &other.id]);
                }
            }
        }
        Ok(())
    }

    fn adopt(&self, spec: &InstanceSpec, handle: &Handle) -> Option<Handle> {
        if let Ok(Some(info)) = self.inspect(&handle.id) {
            if info.instance() == Some(spec.id.as_str()) && info.created == handle.started {
                if info.state.running {
                    return Some(handle.clone());
                }
                let _ = self.cli(&["rm", "--force", &info.id]);
                return None;
            }
        }
        // Not that container any more: any other container of this instance
        // (a start whose handle was never persisted) is adopted if it runs,
        // removed otherwise.
        let mut adopted = None;
        for f in self.list().ok()?.into_iter().filter(|f| f.instance == spec.id) {
            if f.state == "running" && adopted.is_none() {
                if let Ok(Some(info)) = self.inspect(&f.container) {
                    adopted = Some(Handle { id: info.id, started: info.created });
                    continue;
                }
            }
            let _ = self.cli(&["rm", "--force", &f.container]);
        }
        adopted
    }

    fn eps_listen(&self, _spec: &InstanceSpec) -> (SocketAddr, SocketAddr) {
        Self::container_listen()
    }

    fn log_tail(&self, spec: &InstanceSpec, handle: Option<&Handle>, lines: usize) -> String {
        let name = Self::container_name(&spec.id);
        let target = handle.map(|h| h.id.clone()).unwrap_or(name);
        let h = Handle { id: target, started: String::new() };
        self.logs(&h, lines).unwrap_or_default().trim_end().to_owned()
    }

    fn memory_bytes(&self, _spec: &InstanceSpec, handle: &Handle) -> Option<u64> {
        let id = &handle.id;
        let candidates = [
            format!("/sys/fs/cgroup/memory/docker/{id}/memory.usage_in_bytes"),
            format!("/sys/fs/cgroup/docker/{id}/memory.current"),
            format!("/sys/fs/cgroup/system.slice/docker-{id}.scope/memory.current"),
            format!("/sys/fs/cgroup/memory/system.slice/docker-{id}.scope/memory.usage_in_bytes"),
        ];
        for p in &candidates {
            if let Ok(s) = std::fs::read_to_string(p) {
                if let Ok(v) = s.trim().parse() {
                    return Some(v);
                }
            }
        }
        let out = self.cli_t(&["stats", "--no-stream", "--format", "{{.MemUsage}}", id], Duration::from_secs(15)).ok()?;
        if !out.ok {
            return None;
        }
        parse_size(out.stdout.split('/').next()?.trim())
    }
}

/// "1.5MiB" → bytes (the units `docker stats` prints).
fn parse_size(s: &str) -> Option<u64> {
    let i = s.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(s.len());
    let (n, unit) = s.split_at(i);
    let n: f64 = n.trim().parse().ok()?;
    let m = match unit.trim() {
        "" | "B" => 1.0,
        "KiB" => 1024.0,
        "kB" | "KB" => 1e3,
        "MiB" => 1024.0 * 1024.0,
        "MB" => 1e6,
        "GiB" => 1024.0 * 1024.0 * 1024.0,
        "GB" => 1e9,
        _ => return None,
    };
    Some((n * m) as u64)
}

/// These tests drive the real engine (no stand-in): they need a Docker
/// engine, root (for `nsenter` in the isolation test and to chown the state
/// folders), and the image (`make docker-image`). Their containers carry
/// instance ids starting with `t-` and use their own networks (`ec-test-*`,
/// 10.214.0.0/16), and are removed even when a test fails.
#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::Limits;
    use std::io::{Read, Write};
    use std::net::{TcpListener, TcpStream};
    use std::sync::mpsc;
    use std::time::Instant;

    const SECRET_HEX: &str = "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f";

    fn config(prefix: &str, networks: u16) -> DockerConfig {
        // Each prefix its own addresses: 10.214.<0|64|128>.0 upwards.
        let third = match prefix {
            "ec-test" => 0,
            "ec-test-iso" => 64,
            _ => 128,
        };
        DockerConfig { network_prefix: prefix.into(), networks, subnet_base: Ipv4Addr::new(10, 214, third, 0), ..DockerConfig::default() }
    }

    fn runtime(prefix: &str, networks: u16) -> DockerRuntime {
        DockerRuntime::probe_with(DEFAULT_IMAGE, config(prefix, networks))
            .unwrap_or_else(|e| panic!("these tests need the docker engine and the image: {e}"))
    }

    fn free_port() -> u16 {
        TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
    }

    /// Removes the instance's container and state folder when dropped.
    struct Instance<'a> {
        rt: &'a DockerRuntime,
        spec: InstanceSpec,
    }

    impl Drop for Instance<'_> {
        fn drop(&mut self) {
            let _ = self.rt.release(&self.spec, None);
            let _ = std::fs::remove_dir_all(&self.spec.state_dir);
        }
    }

    fn instance<'a>(rt: &'a DockerRuntime, id: &str, uid: u32, limits: Limits) -> Instance<'a> {
        let dir = std::env::temp_dir().join(format!("ec-docker-test-{}-{id}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let (device, management) = DockerRuntime::container_listen();
        let cfg = serde_json::json!({
            "listen": device.to_string(),
            "management_listen": management.to_string(),
            "insecure_plain_http": true,
            "keys": [{"id": 1, "secret_hex": SECRET_HEX}],
            "accounts": [{"provider": "*", "account": "*"}],
        });
        std::fs::write(dir.join("eps.json"), serde_json::to_vec(&cfg).unwrap()).unwrap();
        // Left to root: `start` gives the folder to the instance's uid.
        let spec = InstanceSpec {
            id: id.into(),
            slot: 0,
            state_dir: dir,
            device_addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            management_addr: SocketAddr::from(([127, 0, 0, 1], free_port())),
            limits,
            log_path: std::env::temp_dir().join(format!("ec-docker-test-{id}.log")),
            eps_binary: PathBuf::from("/nonexistent: the image carries it"),
            uid,
            gid: uid,
        };
        let _ = rt.release(&spec, None);
        Instance { rt, spec }
    }

    fn limits() -> Limits {
        Limits { memory_bytes: 64 << 20, cpu_millis: 500, pids: 64 }
    }

    fn http_get(addr: SocketAddr, path: &str) -> Option<(u16, String)> {
        let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
        s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        write!(s, "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").ok()?;
        let mut r = String::new();
        s.read_to_string(&mut r).ok()?;
        let status = r.split_whitespace().nth(1)?.parse().ok()?;
        Some((status, r.split("\r\n\r\n").nth(1).unwrap_or("").to_owned()))
    }

    fn wait_healthy(addr: SocketAddr, within: Duration) -> Duration {
        let t0 = Instant::now();
        while t0.elapsed() < within {
            if matches!(http_get(addr, "/healthz"), Some((200, _))) {
                return t0.elapsed();
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("no /healthz answer at {addr} within {within:?}");
    }

    fn inspect_json(id: &str) -> serde_json::Value {
        let out = Command::new("docker").args(["inspect", id]).output().unwrap();
        assert!(out.status.success());
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()[0].clone()
    }

    #[test]
    fn lifecycle_health_memory_stop_release() {
        let rt = runtime("ec-test", 2);
        let inst = instance(&rt, "t-life", 64101, limits());
        let spec = &inst.spec;
        let h = rt.start(spec).unwrap();
        assert_eq!(h.id.len(), 64, "full container id: {h:?}");
        // The state folder was given to the instance's uid (it was root's).
        use std::os::unix::fs::MetadataExt;
        assert_eq!(std::fs::metadata(spec.state_dir.join("eps.json")).unwrap().uid(), 64101);
        let ready = wait_healthy(spec.management_addr, Duration::from_secs(10));
        eprintln!("start-to-ready after `docker run` returned: {ready:?}");
        // The device listener is published too.
        assert_eq!(http_get(spec.device_addr, "/healthz").map(|r| r.0), Some(200));
        assert_eq!(rt.observe(spec, &h), Observed::Running);
        let mem = rt.memory_bytes(spec, &h).expect("memory of a running container");
        assert!(mem > 100_000 && mem < 64 << 20, "memory {mem}");
        assert!(rt.container_ip(&h).is_some());
        assert!(rt.logs(&h, 20).unwrap().contains("\"ready\":true"));
        // Adopted by a new runtime object (a restarted manager) while it runs.
        assert_eq!(runtime("ec-test", 2).adopt(spec, &h), Some(h.clone()));

        rt.stop(spec, &h, Duration::from_secs(5)).unwrap();
        match rt.observe(spec, &h) {
            // SIGTERM: the EPS shuts down cleanly.
            Observed::Exited { reason } => assert_eq!(reason, "exit code 0"),
            other => panic!("after stop: {other:?}"),
        }
        rt.stop(spec, &h, Duration::from_secs(1)).unwrap(); // idempotent
        rt.release(spec, Some(&h)).unwrap();
        assert_eq!(rt.observe(spec, &h), Observed::Gone);
        rt.release(spec, Some(&h)).unwrap(); // idempotent
        rt.stop(spec, &h, Duration::from_secs(1)).unwrap();
        assert_eq!(rt.memory_bytes(spec, &h), None);
        // The state folder is kept.
        assert!(spec.state_dir.join("eps.json").exists());
    }

    #[test]
    fn limits_user_and_hardening_are_applied() {
        let rt = runtime("ec-test", 2);
        let lim = Limits { memory_bytes: 48 << 20, cpu_millis: 250, pids: 32 };
        let inst = instance(&rt, "t-limits", 64102, lim);
        // An absolute CA path in eps.json (as the lab writes) is mounted at that path.
        // A real certificate: the EPS reads it at start and exits on a bad one,
        // and the uid check below needs the EPS still running.
        let ca_dir = std::env::temp_dir().join(format!("ec-docker-test-ca-{}", std::process::id()));
        crate::tls::ensure_cert(&ca_dir, &["ca.test".into()]).unwrap();
        let ca = ca_dir.join("cert.pem");
        let cfg_path = inst.spec.state_dir.join("eps.json");
        let mut cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(&cfg_path).unwrap()).unwrap();
        cfg["upstream"] = serde_json::json!({"extra_ca_pem_files": [ca.to_str().unwrap()]});
        std::fs::write(&cfg_path, serde_json::to_vec(&cfg).unwrap()).unwrap();
        let h = rt.start(&inst.spec).unwrap();
        let j = inspect_json(&h.id);
        let hc = &j["HostConfig"];
        assert_eq!(hc["Memory"], 48 << 20);
        assert_eq!(hc["MemorySwap"], 48 << 20);
        assert_eq!(hc["NanoCpus"], 250_000_000);
        assert_eq!(hc["PidsLimit"], 32);
        assert_eq!(hc["ReadonlyRootfs"], true);
        assert_eq!(hc["RestartPolicy"]["Name"], "no");
        assert_eq!(hc["CapDrop"], serde_json::json!(["ALL"]));
        assert_eq!(j["Config"]["User"], "64102:64102");
        assert_eq!(j["Config"]["Labels"][LABEL_INSTANCE], "t-limits");
        assert_eq!(j["Config"]["Image"], DEFAULT_IMAGE);
        let mounts = j["Mounts"].as_array().unwrap();
        let ca_mount = mounts.iter().find(|m| m["Destination"] == ca.to_str().unwrap()).expect("the CA file is mounted");
        assert_eq!(ca_mount["RW"], false);
        assert!(mounts.iter().any(|m| m["Destination"] == CONTAINER_STATE_DIR && m["RW"] == true));
        let _ = std::fs::remove_dir_all(&ca_dir);
        // And the kernel enforces them (cgroup v1 here; v2 names in the else branch).
        let cg = Path::new("/sys/fs/cgroup/memory/docker").join(&h.id).join("memory.limit_in_bytes");
        if let Ok(v) = std::fs::read_to_string(&cg) {
            assert_eq!(v.trim(), (48u64 << 20).to_string());
            let pids = std::fs::read_to_string(format!("/sys/fs/cgroup/pids/docker/{}/pids.max", h.id)).unwrap();
            assert_eq!(pids.trim(), "32");
            let quota = std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/docker/{}/cpu.cfs_quota_us", h.id)).unwrap();
            let period = std::fs::read_to_string(format!("/sys/fs/cgroup/cpu/docker/{}/cpu.cfs_period_us", h.id)).unwrap();
            assert_eq!(quota.trim().parse::<u64>().unwrap() * 1000 / period.trim().parse::<u64>().unwrap(), 250);
        } else {
            let max = std::fs::read_to_string(format!("/sys/fs/cgroup/docker/{}/memory.max", h.id)).unwrap();
            assert_eq!(max.trim(), (48u64 << 20).to_string());
        }
        // The process inside runs as the instance's uid.
        let pid = rt.pid(&h).unwrap();
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
        assert!(status.lines().any(|l| l.starts_with("Uid:") && l.contains("64102")), "{status}");
    }

    /// A program that allocates until the kernel kills it, as the only file
    /// of a `FROM scratch` image: the EPS bounds its own memory, so an OOM
    /// kill cannot be provoked from outside it on demand.
    fn hog_image() -> String {
        let tag = "edgecourier/eps-test-oom:local";
        let dir = std::env::temp_dir().join(format!("ec-docker-hog-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("hog.c"),
            "#include <stdlib.h>\n#include <string.h>\nint main(void){for(;;){char*p=malloc(1<<20);if(p)memset(p,1,1<<20);}}\n",
        )
        .unwrap();
        let cc = Command::new("cc").args(["-static", "-O1", "-o"]).arg(dir.join("ec-eps")).arg(dir.join("hog.c")).status();
        assert!(cc.map(|s| s.success()).unwrap_or(false), "cc -static is needed for the OOM test");
        std::fs::write(dir.join("Dockerfile"), "FROM scratch\nCOPY ec-eps /ec-eps\nENTRYPOINT [\"/ec-eps\"]\n").unwrap();
        let b = Command::new("docker").env("DOCKER_BUILDKIT", "0").args(["build", "-q", "-t", tag]).arg(&dir).output().unwrap();
        assert!(b.status.success(), "{}", String::from_utf8_lossy(&b.stderr));
        let _ = std::fs::remove_dir_all(&dir);
        tag.into()
    }

    #[test]
    fn out_of_memory_is_named_and_evented() {
        let image = hog_image();
        let cfg = DockerConfig { share_binary: false, ..config("ec-test", 2) };
        let rt = DockerRuntime::probe_with(&image, cfg).unwrap();
        let (tx, rx) = mpsc::channel();
        let watch = rt.watch_events(tx).unwrap();
        let inst = instance(&rt, "t-oom", 64103, Limits { memory_bytes: 16 << 20, cpu_millis: 0, pids: 0 });
        let h = rt.start(&inst.spec).unwrap();
        let t0 = Instant::now();
        let reason = loop {
            match rt.observe(&inst.spec, &h) {
                Observed::Exited { reason } => break reason,
                Observed::Gone => panic!("gone"),
                Observed::Running if t0.elapsed() > Duration::from_secs(20) => panic!("not killed"),
                Observed::Running => std::thread::sleep(Duration::from_millis(50)),
            }
        };
        assert_eq!(reason, "killed: out of memory (exit code 137)");
        // The engine's events told the same story.
        let mut seen = Vec::new();
        while let Ok(ev) = rx.recv_timeout(Duration::from_secs(5)) {
            if ev.instance == "t-oom" {
                assert_eq!(ev.container, h.id);
                seen.push(ev.action.clone());
                if matches!(ev.action, EventAction::Die { .. }) {
                    break;
                }
            }
        }
        assert!(seen.contains(&EventAction::Start), "{seen:?}");
        assert!(seen.contains(&EventAction::Oom), "{seen:?}");
        assert!(seen.contains(&EventAction::Die { exit_code: Some(137) }), "{seen:?}");
        watch.stop();
    }

    #[test]
    fn crash_is_seen_by_events_and_adopt_drops_a_dead_container() {
        let rt = runtime("ec-test", 2);
        let (tx, rx) = mpsc::channel();
        let watch = rt.watch_events(tx).unwrap();
        let inst = instance(&rt, "t-crash", 64104, limits());
        let h = rt.start(&inst.spec).unwrap();
        wait_healthy(inst.spec.management_addr, Duration::from_secs(10));
        // A crash: SIGKILL from outside the engine, straight to the process.
        let pid = rt.pid(&h).unwrap();
        assert!(Command::new("kill").args(["-9", &pid.to_string()]).status().unwrap().success());
        let t0 = Instant::now();
        let die = loop {
            let ev = rx.recv_timeout(Duration::from_secs(10)).expect("a die event");
            if ev.instance == "t-crash" && matches!(ev.action, EventAction::Die { .. }) {
                break ev;
            }
        };
        eprintln!("die event {:?} after the kill", t0.elapsed());
        assert_eq!(die.action, EventAction::Die { exit_code: Some(137) });
        assert_eq!(rt.observe(&inst.spec, &h), Observed::Exited { reason: "killed by signal 9 (exit code 137)".into() });
        // A restarted manager finds it dead: not adopted, and removed.
        assert_eq!(runtime("ec-test", 2).adopt(&inst.spec, &h), None);
        assert_eq!(rt.observe(&inst.spec, &h), Observed::Gone);
        // A start after that works (same name), and the events say so.
        let h2 = rt.start(&inst.spec).unwrap();
        assert_ne!(h2, h);
        let ev = loop {
            let ev = rx.recv_timeout(Duration::from_secs(10)).expect("a start event");
            if ev.instance == "t-crash" && ev.action == EventAction::Start {
                break ev;
            }
        };
        assert_eq!(ev.container, h2.id);
        // A handle lost before it was persisted: adopt finds the container by its label.
        let lost = Handle { id: "0".repeat(64), started: "never".into() };
        assert_eq!(rt.adopt(&inst.spec, &lost), Some(h2.clone()));
        // Starting it twice is refused, not a second container.
        let err = rt.start(&inst.spec).unwrap_err().to_string();
        assert!(err.contains("already runs"), "{err}");
        drop(watch);
    }

    /// Runs `curl` inside the network namespace of the process `pid` (the
    /// host's own namespace for `None`).
    fn reach_from(pid: Option<u32>, addr: SocketAddr) -> bool {
        let url = format!("http://{addr}/healthz");
        let mut cmd = match pid {
            Some(pid) => {
                let mut c = Command::new("nsenter");
                c.args(["-t", &pid.to_string(), "-n", "curl"]);
                c
            }
            None => Command::new("curl"),
        };
        let out = cmd.args(["-s", "-m", "2", &url]).output().expect("nsenter and curl (these tests run as root)");
        out.status.success() && String::from_utf8_lossy(&out.stdout).contains("ok")
    }

    #[test]
    fn containers_cannot_reach_each_other() {
        // One network for a and b (the common case), another for c.
        let one = runtime("ec-test-iso", 1);
        let other = runtime("ec-test-iso2", 1);
        let a = instance(&one, "t-iso-a", 64105, limits());
        let b = instance(&one, "t-iso-b", 64106, limits());
        let c = instance(&other, "t-iso-c", 64107, limits());
        let ha = one.start(&a.spec).unwrap();
        let hb = one.start(&b.spec).unwrap();
        let hc = other.start(&c.spec).unwrap();
        for i in [&a, &b, &c] {
            wait_healthy(i.spec.management_addr, Duration::from_secs(10));
        }
        let ip = |rt: &DockerRuntime, h: &Handle| rt.container_ip(h).unwrap();
        let (ia, ib, ic) = (ip(&one, &ha), ip(&one, &hb), ip(&other, &hc));
        let port = CONTAINER_MANAGEMENT_PORT;
        let pa = Some(one.pid(&ha).unwrap());
        // Controls: the host reaches each container, and a reaches itself.
        assert!(reach_from(None, SocketAddr::new(ib, port)), "host -> b");
        assert!(reach_from(None, SocketAddr::new(ic, port)), "host -> c");
        assert!(reach_from(pa, SocketAddr::new(ia, port)), "a -> a");
        // a reaches neither b (same bridge) nor c (another bridge), on either listener.
        for target in [ib, ic] {
            for p in [CONTAINER_DEVICE_PORT, CONTAINER_MANAGEMENT_PORT] {
                assert!(!reach_from(pa, SocketAddr::new(target, p)), "a reached {target}:{p}");
            }
        }
        // Nor b's management listener, published on the host's loopback only.
        assert!(!reach_from(pa, b.spec.management_addr), "a reached b's management port on the host");
    }

    #[test]
    fn probe_names_what_is_missing() {
        let cfg = DockerConfig { docker: "/nonexistent/docker".into(), ..DockerConfig::default() };
        let e = DockerRuntime::probe_with(DEFAULT_IMAGE, cfg).unwrap_err();
        assert!(matches!(e, RuntimeError::Unavailable { .. }), "{e}");
        assert!(e.to_string().contains("no `/nonexistent/docker` command"), "{e}");
        let e = DockerRuntime::probe("edgecourier/eps:no-such-tag").unwrap_err();
        assert!(e.to_string().contains("run `make docker-image`"), "{e}");
        // An engine that does not answer (a socket nobody listens on).
        let dir = std::env::temp_dir().join(format!("ec-docker-nohost-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("docker");
        std::fs::write(&script, format!("#!/bin/sh\nexec docker -H unix://{}/none.sock \"$@\"\n", dir.display())).unwrap();
        Command::new("chmod").arg("755").arg(&script).status().unwrap();
        let e = DockerRuntime::probe_with(DEFAULT_IMAGE, DockerConfig { docker: script, ..DockerConfig::default() }).unwrap_err();
        assert!(e.to_string().contains("engine is not reachable"), "{e}");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn parses_sizes_and_events() {
        assert_eq!(parse_size("1.5MiB"), Some(1_572_864));
        assert_eq!(parse_size("980KiB"), Some(1_003_520));
        let line = r#"{"status":"die","id":"abc","Type":"container","Action":"die","Actor":{"ID":"abc","Attributes":{"edgecourier.instance":"u1","exitCode":"137"}},"time":1,"timeNano":1000000001}"#;
        let ev = parse_event(line).unwrap();
        assert_eq!(
            ev,
            ContainerEvent {
                instance: "u1".into(),
                container: "abc".into(),
                action: EventAction::Die { exit_code: Some(137) },
                time_nanos: 1_000_000_001
            }
        );
        assert!(parse_event(r#"{"Action":"die","Actor":{"ID":"x","Attributes":{}}}"#).is_none());
    }
}
