//! The manager: owns every EPS instance of the access point.
//!
//! [`Manager::handle`] performs one [`Action`] for one [`Caller`]; the HTTP
//! layer and the tests call nothing else. Operations on one instance are
//! serialised by a lock of that instance; the state file is rewritten after
//! every change. A watcher ([`Manager::watch`]) polls each running instance
//! through its backend and its `/healthz`, records crashes with their exit
//! reason and last log lines, applies the restart policy and gathers the
//! EPS's own save counters.

use std::collections::{BTreeMap, HashMap};
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use rand::RngCore;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::api::*;
use crate::metrics::Metrics;
use crate::runtime::{self, InstanceSpec, Limits, Observed, Runtime, RuntimeKind};
use crate::state::{Instance, State, User};
use crate::tls;

/// Settings of one manager (the command line of `ec-edge serve`).
#[derive(Debug, Clone)]
pub struct Settings {
    /// The manager's state folder: `manager.json`, `operator.token`,
    /// `tls/`, `instances/<id>/` (each instance's state), `logs/`.
    pub state_dir: PathBuf,
    /// The address devices reach instances at (the access point's Wi-Fi side).
    pub advertise: IpAddr,
    /// Instance `n` listens for devices on `device_port_base + n`.
    pub device_port_base: u16,
    /// Instance `n`'s management listener is `127.0.0.1:(management_port_base + n)`.
    pub management_port_base: u16,
    /// Instances at most on this access point.
    pub max_slots: u32,
    /// Instance `n` runs as uid/gid `uid_base + n`.
    pub uid_base: u32,
    /// Backend when a request names none.
    pub default_runtime: RuntimeKind,
    /// Limits when a request names none.
    pub default_limits: Limits,
    /// The largest limits a request may ask for.
    pub max_limits: Limits,
    /// Instances per user when the operator sets none.
    pub max_instances_per_user: u32,
    /// The static `ec-eps`.
    pub eps_binary: PathBuf,
    /// `ec-launcher`.
    pub launcher: PathBuf,
    /// Cgroups and a uid per instance (process backend); off only on a single-user laptop.
    pub isolate: bool,
    /// The Docker image of the EPS.
    pub docker_image: String,
    /// Merged into every instance's `eps.json` (upstream settings, accounts, store size, limits).
    pub eps_template: serde_json::Value,
    /// How long a start may take to answer `/healthz`.
    pub ready_timeout: Duration,
    /// Backends to probe besides the default one (a VM backend's probe boots
    /// the appliance once, so they are probed only when asked for).
    pub enabled: Vec<RuntimeKind>,
    /// The microvm backend's settings.
    pub microvm: runtime::microvm::MicrovmConfig,
    /// The xen backend's settings.
    pub xen: runtime::xen::XenConfig,
}

/// One manager.
#[derive(Debug)]
pub struct Manager {
    settings: Settings,
    state: Mutex<State>,
    runtimes: BTreeMap<RuntimeKind, Arc<dyn Runtime>>,
    unavailable: BTreeMap<RuntimeKind, String>,
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    operator_token_sha256: [u8; 32],
    manager_pin: String,
    /// Gathered from each EPS's `/metrics`: (saves, bytes saved).
    eps_counters: Mutex<HashMap<String, (u64, u64)>>,
    memory: Mutex<HashMap<String, u64>>,
    /// Instances the engine's events named (a container died): checked at
    /// the next round instead of waiting for the slow sweep.
    urgent: Arc<Mutex<std::collections::HashSet<String>>>,
    /// Keeps the docker events stream open for the manager's life.
    _docker_events: Option<runtime::docker::EventWatch>,
    /// Prometheus metrics of the manager.
    pub metrics: Metrics,
}

fn now() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

fn internal(e: impl std::fmt::Display) -> ApiError {
    ApiError::Internal(e.to_string())
}

impl Manager {
    /// Opens (or makes) the state folder, probes the backends.
    pub fn open(settings: Settings) -> Result<Self, String> {
        let dir = &settings.state_dir;
        for sub in ["instances", "logs"] {
            std::fs::create_dir_all(dir.join(sub)).map_err(|e| format!("{}: {e}", dir.join(sub).display()))?;
        }
        if settings.isolate {
            check_traversable(&dir.join("instances"))?;
        }
        let state = State::load(&dir.join("manager.json"))?;
        let token_path = dir.join("operator.token");
        if !token_path.exists() {
            let mut t = [0u8; 32];
            rand::thread_rng().fill_bytes(&mut t);
            tls::write_private(&token_path, hex::encode(t).as_bytes())?;
        }
        let token = std::fs::read_to_string(&token_path).map_err(|e| format!("{}: {e}", token_path.display()))?;
        let manager_pin = tls::ensure_cert(&dir.join("tls"), &[settings.advertise.to_string(), "edge-manager.local".into()])?;
        let mut runtimes: BTreeMap<RuntimeKind, Arc<dyn Runtime>> = BTreeMap::new();
        let mut unavailable = BTreeMap::new();
        let wanted = |k: RuntimeKind| settings.default_runtime == k || settings.enabled.contains(&k);
        if wanted(RuntimeKind::Microvm) {
            match runtime::microvm::MicrovmRuntime::probe(
                settings.microvm.clone(),
                &settings.launcher,
                settings.isolate,
                dir,
                settings.advertise,
            ) {
                Ok(r) => {
                    runtimes.insert(RuntimeKind::Microvm, Arc::new(r));
                }
                Err(e) => {
                    unavailable.insert(RuntimeKind::Microvm, e.to_string());
                }
            }
        } else {
            unavailable.insert(RuntimeKind::Microvm, "not enabled (--runtimes)".into());
        }
        if wanted(RuntimeKind::Xen) {
            match runtime::xen::XenRuntime::probe(settings.xen.clone(), settings.isolate, dir, settings.advertise) {
                Ok(r) => {
                    runtimes.insert(RuntimeKind::Xen, Arc::new(r));
                }
                Err(e) => {
                    unavailable.insert(RuntimeKind::Xen, e.to_string());
                }
            }
        } else {
            unavailable.insert(RuntimeKind::Xen, "not enabled (--runtimes)".into());
        }
        match runtime::process::ProcessRuntime::probe(&settings.launcher, settings.isolate) {
            Ok(r) => {
                runtimes.insert(RuntimeKind::Process, Arc::new(r));
            }
            Err(e) => {
                unavailable.insert(RuntimeKind::Process, e.to_string());
            }
        }
        let urgent: Arc<Mutex<std::collections::HashSet<String>>> = Arc::default();
        let mut docker_events = None;
        match runtime::docker::DockerRuntime::probe(&settings.docker_image) {
            Ok(r) => {
                // Restarts are detected through the engine's events, not by
                // asking the engine about every container every round.
                let (tx, rx) = std::sync::mpsc::channel::<runtime::docker::ContainerEvent>();
                match r.watch_events(tx) {
                    Ok(w) => {
                        docker_events = Some(w);
                        let urgent = urgent.clone();
                        std::thread::Builder::new()
                            .name("docker-events-to-watcher".into())
                            .spawn(move || {
                                for ev in rx {
                                    if matches!(ev.action, runtime::docker::EventAction::Die { .. } | runtime::docker::EventAction::Oom) {
                                        urgent.lock().unwrap_or_else(std::sync::PoisonError::into_inner).insert(ev.instance);
                                    }
                                }
                            })
                            .map_err(|e| e.to_string())?;
                    }
                    Err(e) => tracing::warn!("docker events unavailable ({e}); containers are checked by the sweep only"),
                }
                runtimes.insert(RuntimeKind::Docker, Arc::new(r));
            }
            Err(e) => {
                unavailable.insert(RuntimeKind::Docker, e.to_string());
            }
        }
        for (kind, why) in &unavailable {
            tracing::warn!(runtime = kind.name(), "backend unavailable: {why}");
        }
        Ok(Self {
            settings,
            state: Mutex::new(state),
            runtimes,
            unavailable,
            locks: Mutex::new(HashMap::new()),
            operator_token_sha256: Sha256::digest(token.trim().as_bytes()).into(),
            manager_pin,
            eps_counters: Mutex::new(HashMap::new()),
            memory: Mutex::new(HashMap::new()),
            urgent,
            _docker_events: docker_events,
            metrics: Metrics::new(),
        })
    }

    /// The settings.
    pub fn settings(&self) -> &Settings {
        &self.settings
    }

    /// The SPKI pin (hex) of the manager's device-listener certificate.
    pub fn pin(&self) -> &str {
        &self.manager_pin
    }

    /// The backends this host has, and why the others are missing.
    /// The manager is going away (its instances stay): each backend gives
    /// back what no running instance needs.
    pub fn shutdown(&self) {
        for rt in self.runtimes.values() {
            rt.shutdown();
        }
    }

    pub fn backends(&self) -> (Vec<RuntimeKind>, BTreeMap<RuntimeKind, String>) {
        (self.runtimes.keys().copied().collect(), self.unavailable.clone())
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn persist(&self, st: &State) -> Result<(), ApiError> {
        st.save(&self.settings.state_dir.join("manager.json")).map_err(|e| ApiError::Internal(format!("writing the manager state: {e}")))
    }

    fn lock_of(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        self.locks.lock().unwrap_or_else(std::sync::PoisonError::into_inner).entry(id.to_owned()).or_default().clone()
    }

    // ------------------------------------------------------------ authentication

    /// The operator's bearer token, checked in constant time.
    pub fn operator(&self, token: &str) -> Result<Caller, ApiError> {
        let got: [u8; 32] = Sha256::digest(token.as_bytes()).into();
        if subtle::ConstantTimeEq::ct_eq(&got[..], &self.operator_token_sha256[..]).into() {
            Ok(Caller::Operator)
        } else {
            Err(ApiError::Unauthenticated("wrong operator token (it is in <state>/operator.token)".into()))
        }
    }

    /// A device's user and credential secret.
    pub fn device(&self, user: &str, secret: &str) -> Result<Caller, ApiError> {
        let st = self.state();
        let want = st.users.get(user).map(|u| u.credential_sha256.clone()).unwrap_or_else(|| "0".repeat(64));
        let got = hex::encode(Sha256::digest(secret.as_bytes()));
        let ok: bool = subtle::ConstantTimeEq::ct_eq(got.as_bytes(), want.as_bytes()).into();
        if ok && st.users.contains_key(user) {
            Ok(Caller::Device { user: user.to_owned() })
        } else {
            Err(ApiError::Unauthenticated("unknown user or wrong credential".into()))
        }
    }

    // ------------------------------------------------------------ the actions

    /// Performs one action for one caller.
    pub async fn handle(self: &Arc<Self>, caller: &Caller, action: Action) -> Result<Reply, ApiError> {
        match action {
            Action::AddUser(a) => self.add_user(caller, a),
            Action::ListUsers => self.list_users(caller),
            Action::RemoveUser(u) => self.remove_user(caller, &u),
            Action::Create(c) => self.create(caller, c).await,
            Action::List => Ok(Reply::Instances(self.list(caller))),
            Action::Status(id) => Ok(Reply::Instance(self.view_of(caller, &id)?, false)),
            Action::Start(id) => self.start(caller, &id, false).await,
            Action::Stop(id) => self.stop(caller, &id, false).await,
            Action::Revoke(id) => self.stop(caller, &id, true).await,
            Action::Restore(id) => self.start(caller, &id, true).await,
            Action::Delete(id) => self.delete(caller, &id).await,
            Action::Logs { id, lines } => self.logs(caller, &id, lines).await,
            Action::Enrolment(id) => self.enrolment(caller, &id).map(Reply::Enrolment),
            Action::Join(j) => self.join(caller, j).await,
            Action::Leave(l) => self.leave(caller, l).await,
        }
    }

    fn operator_only(caller: &Caller) -> Result<(), ApiError> {
        match caller {
            Caller::Operator => Ok(()),
            // To a device, the user administration does not exist.
            Caller::Device { .. } => Err(ApiError::NotFound("no such resource".into())),
        }
    }

    fn add_user(&self, caller: &Caller, a: AddUser) -> Result<Reply, ApiError> {
        Self::operator_only(caller)?;
        check_name("user", &a.user, 32)?;
        let mut secret = [0u8; 24];
        rand::thread_rng().fill_bytes(&mut secret);
        let secret = hex::encode(secret);
        let mut st = self.state();
        if st.users.contains_key(&a.user) {
            return Err(ApiError::Conflict(format!("user {} exists", a.user)));
        }
        let max_instances = a.max_instances.unwrap_or(self.settings.max_instances_per_user);
        st.users.insert(a.user.clone(), User { credential_sha256: hex::encode(Sha256::digest(secret.as_bytes())), max_instances });
        self.persist(&st)?;
        tracing::info!(user = %a.user, "user added");
        Ok(Reply::User(
            UserView {
                user: a.user.clone(),
                max_instances,
                instances: vec![],
                credential: Some(format!("ecu1.{}.{}.{}", a.user, secret, self.manager_pin)),
            },
            true,
        ))
    }

    fn list_users(&self, caller: &Caller) -> Result<Reply, ApiError> {
        Self::operator_only(caller)?;
        let st = self.state();
        Ok(Reply::Users(
            st.users
                .iter()
                .map(|(name, u)| UserView {
                    user: name.clone(),
                    max_instances: u.max_instances,
                    instances: st.instances.iter().filter(|(_, i)| &i.user == name).map(|(id, _)| id.clone()).collect(),
                    credential: None,
                })
                .collect(),
        ))
    }

    fn remove_user(&self, caller: &Caller, user: &str) -> Result<Reply, ApiError> {
        Self::operator_only(caller)?;
        let mut st = self.state();
        if !st.users.contains_key(user) {
            return Err(ApiError::NotFound(format!("no user {user}")));
        }
        let owned: Vec<&String> = st.instances.iter().filter(|(_, i)| i.user == user).map(|(id, _)| id).collect();
        if !owned.is_empty() {
            return Err(ApiError::Conflict(format!(
                "user {user} still has instances ({}); delete them first",
                owned.into_iter().cloned().collect::<Vec<_>>().join(", ")
            )));
        }
        st.users.remove(user);
        self.persist(&st)?;
        Ok(Reply::Done)
    }

    fn resolve_limits(&self, req: LimitsRequest) -> Result<Limits, ApiError> {
        let d = self.settings.default_limits;
        let m = self.settings.max_limits;
        let l = Limits {
            memory_bytes: req.memory_bytes.unwrap_or(d.memory_bytes),
            cpu_millis: req.cpu_millis.unwrap_or(d.cpu_millis),
            pids: req.pids.unwrap_or(d.pids),
        };
        let over = |limit: &'static str, asked: u64, max: u64| ApiError::OverLimit {
            limit,
            message: format!("{limit} {asked} is over this access point's maximum of {max}"),
        };
        let under = |limit: &'static str, asked: u64, min: u64| ApiError::OverLimit {
            limit,
            message: format!("{limit} {asked} is under the minimum of {min} an EPS needs"),
        };
        if l.memory_bytes > m.memory_bytes {
            return Err(over("memory_bytes", l.memory_bytes, m.memory_bytes));
        }
        if l.cpu_millis > m.cpu_millis {
            return Err(over("cpu_millis", l.cpu_millis.into(), m.cpu_millis.into()));
        }
        if l.pids > m.pids {
            return Err(over("pids", l.pids.into(), m.pids.into()));
        }
        if l.memory_bytes < 16 << 20 {
            return Err(under("memory_bytes", l.memory_bytes, 16 << 20));
        }
        if l.cpu_millis < 10 {
            return Err(under("cpu_millis", l.cpu_millis.into(), 10));
        }
        if l.pids < 8 {
            return Err(under("pids", l.pids.into(), 8));
        }
        Ok(l)
    }

    fn runtime(&self, kind: RuntimeKind) -> Result<Arc<dyn Runtime>, ApiError> {
        self.runtimes.get(&kind).cloned().ok_or_else(|| {
            ApiError::RuntimeUnavailable(
                self.unavailable.get(&kind).cloned().unwrap_or_else(|| format!("the {} runtime is not available", kind.name())),
            )
        })
    }

    async fn create(self: &Arc<Self>, caller: &Caller, c: CreateInstance) -> Result<Reply, ApiError> {
        let user = match (caller, &c.user) {
            (Caller::Operator, Some(u)) => u.clone(),
            (Caller::Operator, None) => return Err(ApiError::BadRequest("the operator must name the user".into())),
            (Caller::Device { user }, Some(u)) if u == user => user.clone(),
            (Caller::Device { .. }, None) => return Err(ApiError::BadRequest("name the user (a device's own)".into())),
            (Caller::Device { .. }, Some(_)) => return Err(ApiError::Forbidden("a device creates instances for its own user only".into())),
        };
        check_name("user", &user, 32)?;
        check_name("service", &c.service, 16)?;
        let kind = c.runtime.unwrap_or(self.settings.default_runtime);
        self.runtime(kind)?;
        let limits = self.resolve_limits(c.limits)?;
        let id = format!("{user}-{}", c.service);
        let view = {
            let mut st = self.state();
            let Some(u) = st.users.get(&user) else { return Err(ApiError::NotFound(format!("no user {user}"))) };
            if st.instances.contains_key(&id) {
                return Err(ApiError::Conflict(format!("instance {id} exists")));
            }
            let owned = st.instances.values().filter(|i| i.user == user).count() as u32;
            if owned >= u.max_instances {
                return Err(ApiError::OverLimit {
                    limit: "max_instances",
                    message: format!("user {user} has {owned} instances, the limit (max_instances) is {}", u.max_instances),
                });
            }
            let slot = st.free_slot(self.settings.max_slots).ok_or(ApiError::OverLimit {
                limit: "max_slots",
                message: format!("this access point hosts at most {} instances (max_slots)", self.settings.max_slots),
            })?;
            let uid = self.settings.uid_base + st.next_uid;
            st.next_uid += 1;
            let inst = Instance {
                user: user.clone(),
                service: c.service.clone(),
                runtime: kind,
                limits,
                restart: c.restart,
                state: InstanceState::Stopped,
                slot: Some(slot),
                uid,
                handle: None,
                starts: 0,
                crashes: 0,
                recent_restarts: vec![],
                last_exit: None,
                ready_seconds: None,
            };
            self.write_instance_files(&id, &inst)?;
            st.instances.insert(id.clone(), inst);
            self.persist(&st)?;
            self.view(&id, &st.instances[&id])
        };
        tracing::info!(instance = %id, runtime = kind.name(), "instance created");
        Ok(Reply::Instance(view, true))
    }

    /// The instance's folder: keys, certificate, configuration (made once;
    /// the listen addresses are rewritten at each start).
    fn write_instance_files(&self, id: &str, inst: &Instance) -> Result<(), ApiError> {
        let dir = self.instance_dir(id);
        std::fs::create_dir_all(&dir).map_err(internal)?;
        tls::ensure_cert(&dir.join("tls"), &[self.settings.advertise.to_string(), format!("{id}.eps.local")]).map_err(internal)?;
        let mut secret = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut secret);
        let mut cfg = self.settings.eps_template.clone();
        if !cfg.is_object() {
            cfg = serde_json::json!({});
        }
        let o = cfg.as_object_mut().expect("object");
        o.insert("keys".into(), serde_json::json!([{"id": 1, "secret_hex": hex::encode(secret)}]));
        o.insert("tls".into(), serde_json::json!({"cert_pem": "tls/cert.pem", "key_pem": "tls/key.pem"}));
        o.remove("insecure_plain_http");
        o.entry("accounts").or_insert(serde_json::json!([{"provider": "*", "account": "*"}]));
        // Files the template names are copied in: the instance reads nothing
        // outside its own folder (its uid cannot, nor can a container or a VM).
        if let Some(cas) = cfg.pointer_mut("/upstream/extra_ca_pem_files").and_then(|v| v.as_array_mut()) {
            for (n, ca) in cas.iter_mut().enumerate() {
                let Some(src) = ca.as_str().map(PathBuf::from) else { continue };
                let name = format!("tls/extra-ca-{n}.pem");
                std::fs::copy(&src, dir.join(&name)).map_err(|e| internal(format!("copying the template's CA {}: {e}", src.display())))?;
                *ca = serde_json::Value::String(name);
            }
        }
        let _ = inst;
        tls::write_private(&dir.join("eps.json"), &serde_json::to_vec_pretty(&cfg).map_err(internal)?).map_err(internal)
    }

    fn instance_dir(&self, id: &str) -> PathBuf {
        self.settings.state_dir.join("instances").join(id)
    }

    fn spec(&self, id: &str, inst: &Instance) -> InstanceSpec {
        let slot = inst.slot.unwrap_or(0);
        InstanceSpec {
            id: id.to_owned(),
            slot,
            state_dir: self.instance_dir(id),
            device_addr: SocketAddr::new(self.settings.advertise, self.settings.device_port_base + slot as u16),
            management_addr: SocketAddr::new(IpAddr::V4(Ipv4Addr::LOCALHOST), self.settings.management_port_base + slot as u16),
            limits: inst.limits,
            log_path: self.settings.state_dir.join("logs").join(format!("{id}.log")),
            eps_binary: self.settings.eps_binary.clone(),
            uid: inst.uid,
            gid: inst.uid,
        }
    }

    fn visible<'a>(caller: &Caller, id: &str, st: &'a State) -> Result<&'a Instance, ApiError> {
        match st.instances.get(id) {
            Some(i) if matches!(caller, Caller::Operator) => Ok(i),
            Some(i) if matches!(caller, Caller::Device { user } if user == &i.user) => Ok(i),
            // Another user's instance does not exist, to a device.
            _ => Err(ApiError::NotFound(format!("no instance {id}"))),
        }
    }

    fn view(&self, id: &str, i: &Instance) -> InstanceView {
        let (saves, bytes_saved) = self.eps_counters.lock().map(|m| m.get(id).copied().unwrap_or_default()).unwrap_or_default();
        let memory_bytes = if i.state == InstanceState::Running || i.state == InstanceState::Starting {
            self.memory.lock().ok().and_then(|m| m.get(id).copied())
        } else {
            None
        };
        InstanceView {
            id: id.to_owned(),
            user: i.user.clone(),
            service: i.service.clone(),
            runtime: i.runtime,
            state: i.state,
            limits: i.limits,
            restart: i.restart,
            device_url: i.slot.map(|_| format!("https://{}", self.spec(id, i).device_addr)),
            starts: i.starts,
            crashes: i.crashes,
            last_exit: i.last_exit.clone(),
            memory_bytes,
            ready_seconds: i.ready_seconds,
            saves,
            bytes_saved,
        }
    }

    fn view_of(&self, caller: &Caller, id: &str) -> Result<InstanceView, ApiError> {
        let st = self.state();
        let i = Self::visible(caller, id, &st)?;
        Ok(self.view(id, i))
    }

    /// The instances the caller may see.
    pub fn list(&self, caller: &Caller) -> Vec<InstanceView> {
        let st = self.state();
        st.instances.iter().filter(|(id, _)| Self::visible(caller, id, &st).is_ok()).map(|(id, i)| self.view(id, i)).collect()
    }

    /// Starts (or, with `restore`, restores a revoked) instance and waits for it to be ready.
    async fn start(self: &Arc<Self>, caller: &Caller, id: &str, restore: bool) -> Result<Reply, ApiError> {
        self.view_of(caller, id)?;
        let lock = self.lock_of(id);
        let _g = lock.lock().await;
        let (inst, rt) = {
            let mut st = self.state();
            let inst = Self::visible(caller, id, &st)?.clone();
            match (inst.state, restore) {
                (InstanceState::Running | InstanceState::Starting, _) => return Ok(Reply::Instance(self.view(id, &inst), false)),
                (InstanceState::Revoked, false) => return Err(ApiError::Conflict(format!("instance {id} is revoked: restore it"))),
                (InstanceState::Stopped | InstanceState::Crashed, true) => {
                    return Err(ApiError::Conflict(format!("instance {id} is not revoked: start it")))
                }
                _ => {}
            }
            let rt = self.runtime(inst.runtime)?;
            if inst.state == InstanceState::Revoked {
                let slot = st.free_slot(self.settings.max_slots).ok_or(ApiError::OverLimit {
                    limit: "max_slots",
                    message: format!("this access point hosts at most {} instances (max_slots)", self.settings.max_slots),
                })?;
                let i = st.instances.get_mut(id).expect("visible");
                i.slot = Some(slot);
                i.state = InstanceState::Stopped;
                self.persist(&st)?;
            }
            (st.instances[id].clone(), rt)
        };
        self.launch(id, inst, rt, false).await?;
        Ok(Reply::Instance(self.view_of(caller, id)?, false))
    }

    /// Launches an instance whose lock the caller holds, and waits for `/healthz`.
    async fn launch(self: &Arc<Self>, id: &str, inst: Instance, rt: Arc<dyn Runtime>, automatic: bool) -> Result<(), ApiError> {
        let spec = self.spec(id, &inst);
        // Another program on the instance's ports would answer its /healthz for it.
        for addr in [spec.device_addr, spec.management_addr] {
            if let Err(e) = std::net::TcpListener::bind(addr) {
                return Err(ApiError::Unavailable(format!("instance {id}: its port {addr} is taken by another program ({e}); free it or move the manager's --device-port-base / --management-port-base")));
            }
        }
        self.write_listen(&spec, rt.as_ref())?;
        let t0 = Instant::now();
        let s2 = spec.clone();
        let rt2 = rt.clone();
        let handle =
            tokio::task::spawn_blocking(move || rt2.start(&s2)).await.map_err(internal)?.map_err(|e| ApiError::Unavailable(e.to_string()));
        let handle = match handle {
            Ok(h) => h,
            Err(e) => {
                self.set(id, |i| i.state = InstanceState::Crashed)?;
                return Err(e);
            }
        };
        self.set(id, |i| {
            i.handle = Some(handle.clone());
            i.state = InstanceState::Starting;
            i.starts += 1;
        })?;
        self.metrics.started(inst.runtime);
        let deadline = t0 + self.settings.ready_timeout;
        let observe_period = rt.observe_period();
        let mut observed_at: Option<Instant> = None;
        // A probe every READY_POLL, each allowed its second, several in flight: a
        // guest's first answers can be lost (a SYN that reaches a VM before its
        // network is up is not answered, and TCP sends it again only after a
        // second), and one lost probe must not hold readiness back by that second.
        let mut probes = tokio::task::JoinSet::new();
        loop {
            if probes.len() < READY_PROBES_IN_FLIGHT {
                probes.spawn(healthz(spec.management_addr));
            }
            let tick = tokio::time::sleep(READY_POLL);
            tokio::pin!(tick);
            let mut answered = false;
            while !answered {
                tokio::select! {
                    Some(done) = probes.join_next() => answered = matches!(done, Ok(true)),
                    () = &mut tick => break,
                }
            }
            if answered {
                probes.abort_all();
                let ready = t0.elapsed().as_secs_f64();
                self.metrics.ready(inst.runtime, ready);
                self.set(id, |i| {
                    i.state = InstanceState::Running;
                    i.ready_seconds = Some(ready);
                })?;
                tracing::info!(instance = %id, runtime = inst.runtime.name(), ready_ms = (ready * 1000.0) as u64, automatic, "instance ready");
                return Ok(());
            }
            let due = observed_at.is_none_or(|t| t.elapsed() >= observe_period);
            let observed = if due {
                observed_at = Some(Instant::now());
                let (s2, rt2, h2) = (spec.clone(), rt.clone(), handle.clone());
                tokio::task::spawn_blocking(move || match rt2.observe(&s2, &h2) {
                    Observed::Gone => Observed::Exited { reason: "gone".into() },
                    o => o,
                })
                .await
                .map_err(internal)?
            } else {
                Observed::Running
            };
            if let Observed::Exited { reason } = observed {
                let tail = rt.log_tail(&spec, Some(&handle), 20);
                self.record_exit(id, &reason, &tail)?;
                let (s2, rt2, h2) = (spec.clone(), rt.clone(), handle.clone());
                let _ = tokio::task::spawn_blocking(move || rt2.release(&s2, Some(&h2))).await;
                return Err(ApiError::Unavailable(format!("instance {id} ended before it was ready: {reason}; last log lines:\n{tail}")));
            }
            if Instant::now() > deadline {
                let tail = rt.log_tail(&spec, Some(&handle), 20);
                let (s2, rt2, h2) = (spec.clone(), rt.clone(), handle.clone());
                let _ = tokio::task::spawn_blocking(move || {
                    let _ = rt2.stop(&s2, &h2, Duration::from_secs(2));
                    rt2.release(&s2, Some(&h2))
                })
                .await;
                self.set(id, |i| i.state = InstanceState::Crashed)?;
                return Err(ApiError::Unavailable(format!(
                    "instance {id} did not answer /healthz within {:?}; last log lines:\n{tail}",
                    self.settings.ready_timeout
                )));
            }
        }
    }

    /// Rewrites the listen addresses of the instance's `eps.json`.
    fn write_listen(&self, spec: &InstanceSpec, rt: &dyn Runtime) -> Result<(), ApiError> {
        let path = spec.state_dir.join("eps.json");
        let mut cfg: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).map_err(|e| internal(format!("{}: {e}", path.display())))?).map_err(internal)?;
        let (device, management) = rt.eps_listen(spec);
        cfg["listen"] = serde_json::Value::String(device.to_string());
        cfg["management_listen"] = serde_json::Value::String(management.to_string());
        // All interfaces of a container or guest are its one private link, which the manager's
        // network rules guard: the EPS's warning about a public management listener is not for it.
        cfg["allow_public_management"] = serde_json::Value::Bool(management.ip().is_unspecified());
        tls::write_private(&path, &serde_json::to_vec_pretty(&cfg).map_err(internal)?).map_err(internal)
    }

    fn set(&self, id: &str, f: impl FnOnce(&mut Instance)) -> Result<(), ApiError> {
        let mut st = self.state();
        if let Some(i) = st.instances.get_mut(id) {
            f(i);
        }
        self.persist(&st)
    }

    fn record_exit(&self, id: &str, reason: &str, tail: &str) -> Result<(), ApiError> {
        tracing::warn!(instance = %id, reason, "instance ended on its own");
        let rt = self.state().instances.get(id).map(|i| i.runtime);
        if let Some(rt) = rt {
            self.metrics.crashed(rt);
        }
        self.set(id, |i| {
            i.crashes += 1;
            i.state = InstanceState::Crashed;
            i.last_exit = Some(ExitInfo { at: now(), reason: reason.to_owned(), log_tail: tail.to_owned() });
        })
    }

    /// Stops (or revokes) an instance.
    async fn stop(self: &Arc<Self>, caller: &Caller, id: &str, revoke: bool) -> Result<Reply, ApiError> {
        self.view_of(caller, id)?;
        let lock = self.lock_of(id);
        let _g = lock.lock().await;
        let inst = Self::visible(caller, id, &self.state())?.clone();
        if inst.state == InstanceState::Revoked {
            return if revoke {
                Ok(Reply::Instance(self.view_of(caller, id)?, false))
            } else {
                Err(ApiError::Conflict(format!("instance {id} is revoked")))
            };
        }
        self.halt(id, &inst, revoke).await?;
        Ok(Reply::Instance(self.view_of(caller, id)?, false))
    }

    /// Stops the instance's process; with `revoke`, also frees its resources and slot.
    async fn halt(&self, id: &str, inst: &Instance, revoke: bool) -> Result<(), ApiError> {
        let rt = self.runtime(inst.runtime)?;
        let spec = self.spec(id, inst);
        let handle = inst.handle.clone();
        let rt2 = rt.clone();
        tokio::task::spawn_blocking(move || -> Result<(), runtime::RuntimeError> {
            if let Some(h) = &handle {
                rt2.stop(&spec, h, Duration::from_secs(10))?;
            }
            rt2.release(&spec, handle.as_ref())
        })
        .await
        .map_err(internal)?
        .map_err(|e| ApiError::Unavailable(e.to_string()))?;
        self.memory.lock().map(|mut m| m.remove(id)).ok();
        self.set(id, |i| {
            i.handle = None;
            i.state = if revoke { InstanceState::Revoked } else { InstanceState::Stopped };
            if revoke {
                i.slot = None;
            }
        })?;
        tracing::info!(instance = %id, revoke, "instance stopped");
        Ok(())
    }

    async fn delete(self: &Arc<Self>, caller: &Caller, id: &str) -> Result<Reply, ApiError> {
        self.view_of(caller, id)?;
        let lock = self.lock_of(id);
        let _g = lock.lock().await;
        let inst = Self::visible(caller, id, &self.state())?.clone();
        if inst.state != InstanceState::Revoked {
            self.halt(id, &inst, true).await?;
        }
        let dir = self.instance_dir(id);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).map_err(|e| internal(format!("{}: {e}", dir.display())))?;
        }
        let _ = std::fs::remove_file(self.settings.state_dir.join("logs").join(format!("{id}.log")));
        let mut st = self.state();
        st.instances.remove(id);
        self.persist(&st)?;
        tracing::info!(instance = %id, "instance deleted");
        Ok(Reply::Done)
    }

    async fn logs(&self, caller: &Caller, id: &str, lines: usize) -> Result<Reply, ApiError> {
        let inst = Self::visible(caller, id, &self.state())?.clone();
        let rt = self.runtime(inst.runtime)?;
        let spec = self.spec(id, &inst);
        let lines = lines.clamp(1, 1000);
        let text = tokio::task::spawn_blocking(move || rt.log_tail(&spec, inst.handle.as_ref(), lines)).await.map_err(internal)?;
        Ok(Reply::Logs(text))
    }

    fn enrolment(&self, caller: &Caller, id: &str) -> Result<Enrolment, ApiError> {
        let st = self.state();
        let inst = Self::visible(caller, id, &st)?;
        if caller == &Caller::Operator {
            return Err(ApiError::Forbidden(
                "the enrolment bundle is handed only to the user's own device (it holds the instance secret)".into(),
            ));
        }
        if inst.slot.is_none() {
            return Err(ApiError::Conflict(format!("instance {id} is revoked: restore it first")));
        }
        let dir = self.instance_dir(id);
        let cfg: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("eps.json")).map_err(internal)?).map_err(internal)?;
        let key = &cfg["keys"][0];
        Ok(Enrolment {
            url: format!("https://{}", self.spec(id, inst).device_addr),
            key_id: key["id"].as_u64().unwrap_or(1),
            secret: key["secret_hex"].as_str().unwrap_or_default().to_owned(),
            spki_sha256: tls::pin_of(&dir.join("tls").join("key.pem")).map_err(internal)?,
            plain_http: false,
        })
    }

    async fn join(self: &Arc<Self>, caller: &Caller, j: Join) -> Result<Reply, ApiError> {
        let Caller::Device { user } = caller else { return Err(ApiError::Forbidden("join is for a user's device".into())) };
        check_name("service", &j.service, 16)?;
        let id = format!("{user}-{}", j.service);
        let exists = self.state().instances.get(&id).map(|i| i.state);
        match exists {
            None => {
                self.create(
                    caller,
                    CreateInstance {
                        user: Some(user.clone()),
                        service: j.service.clone(),
                        runtime: j.runtime,
                        limits: LimitsRequest::default(),
                        restart: RestartPolicy::OnFailure,
                    },
                )
                .await?;
                self.start(caller, &id, false).await?;
            }
            Some(InstanceState::Revoked) => {
                self.start(caller, &id, true).await?;
            }
            Some(_) => {
                self.start(caller, &id, false).await?;
            }
        }
        let instance = self.view_of(caller, &id)?;
        let enrolment = self.enrolment(caller, &id)?;
        tracing::info!(instance = %id, "device joined");
        Ok(Reply::Joined(Joined { instance, enrolment }))
    }

    async fn leave(self: &Arc<Self>, caller: &Caller, l: Leave) -> Result<Reply, ApiError> {
        let Caller::Device { user } = caller else { return Err(ApiError::Forbidden("leave is for a user's device".into())) };
        check_name("service", &l.service, 16)?;
        let id = format!("{user}-{}", l.service);
        self.stop(caller, &id, l.mode == LeaveMode::Revoke).await
    }

    // ------------------------------------------------------------ restart and watch

    /// After the manager's own restart: re-adopts instances that still run,
    /// restarts those that should run and do not (none is started twice:
    /// a live one is adopted by pid and start time, or container id).
    pub async fn adopt_all(self: &Arc<Self>) {
        let ids: Vec<(String, Instance)> = self.state().instances.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
        for (id, inst) in ids {
            let Ok(rt) = self.runtime(inst.runtime) else {
                tracing::warn!(instance = %id, "its runtime is not available on this host; left as it is");
                continue;
            };
            let spec = self.spec(&id, &inst);
            let should_run = matches!(inst.state, InstanceState::Running | InstanceState::Starting);
            let adopted = match &inst.handle {
                Some(h) => {
                    let (rt2, s2, h2) = (rt.clone(), spec.clone(), h.clone());
                    tokio::task::spawn_blocking(move || rt2.adopt(&s2, &h2)).await.ok().flatten()
                }
                None => None,
            };
            match (adopted, should_run) {
                (Some(h), true) => {
                    tracing::info!(instance = %id, handle = %h.id, "re-adopted a running instance");
                    let _ = self.set(&id, |i| i.state = InstanceState::Running);
                }
                (Some(h), false) => {
                    // Running although it should not (the manager died mid-stop): finish the stop.
                    let (rt2, s2) = (rt.clone(), spec.clone());
                    let _ = tokio::task::spawn_blocking(move || {
                        let _ = rt2.stop(&s2, &h, Duration::from_secs(10));
                        rt2.release(&s2, Some(&h))
                    })
                    .await;
                    let _ = self.set(&id, |i| i.handle = None);
                }
                (None, true) => {
                    tracing::info!(instance = %id, "was running when the manager stopped and is gone: starting it again");
                    let lock = self.lock_of(&id);
                    let _g = lock.lock().await;
                    if let Err(e) = self.launch(&id, inst.clone(), rt, true).await {
                        tracing::warn!(instance = %id, "restart after the manager's restart failed: {e}");
                    }
                }
                (None, false) => {
                    if inst.handle.is_some() {
                        let _ = self.set(&id, |i| i.handle = None);
                    }
                }
            }
        }
    }

    /// One round of the watcher: crashes, restarts, memory, EPS counters.
    /// `sweep`: also ask the backend of every container (otherwise only those
    /// the engine's events named); processes are asked every round (cheap).
    pub async fn watch_once(self: &Arc<Self>, gather: bool, sweep: bool) {
        let ids: Vec<(String, Instance)> =
            self.state().instances.iter().filter(|(_, i)| i.state == InstanceState::Running).map(|(k, v)| (k.clone(), v.clone())).collect();
        let urgent: std::collections::HashSet<String> =
            std::mem::take(&mut *self.urgent.lock().unwrap_or_else(std::sync::PoisonError::into_inner));
        for (id, inst) in ids {
            let ask = sweep || inst.runtime == RuntimeKind::Process || urgent.contains(&id);
            if !ask && !gather {
                continue;
            }
            let lock = self.lock_of(&id);
            let Ok(_g) = lock.try_lock() else { continue };
            let (Ok(rt), Some(handle)) = (self.runtime(inst.runtime), inst.handle.clone()) else { continue };
            let spec = self.spec(&id, &inst);
            let (rt2, s2, h2) = (rt.clone(), spec.clone(), handle.clone());
            let (observed, mem) = tokio::task::spawn_blocking(move || {
                (if ask { rt2.observe(&s2, &h2) } else { Observed::Running }, rt2.memory_bytes(&s2, &h2))
            })
            .await
            .unwrap_or((Observed::Running, None));
            if let Some(m) = mem {
                self.memory.lock().map(|mut x| x.insert(id.clone(), m)).ok();
            }
            let reason = match observed {
                Observed::Running => {
                    if gather {
                        if let Some(c) = eps_counters(spec.management_addr).await {
                            self.eps_counters.lock().map(|mut x| x.insert(id.clone(), c)).ok();
                        }
                    }
                    continue;
                }
                Observed::Exited { reason } => reason,
                Observed::Gone => "gone from its runtime".to_owned(),
            };
            let tail = rt.log_tail(&spec, Some(&handle), 20);
            let _ = self.record_exit(&id, &reason, &tail);
            let (rt2, s2, h2) = (rt.clone(), spec.clone(), handle.clone());
            let _ = tokio::task::spawn_blocking(move || rt2.release(&s2, Some(&h2))).await;
            self.memory.lock().map(|mut m| m.remove(&id)).ok();
            let _ = self.set(&id, |i| i.handle = None);
            // The restart policy: on-failure, with a pause that grows, at most 5 in 10 minutes.
            let recent: Vec<u64> = inst.recent_restarts.iter().copied().filter(|t| now().saturating_sub(*t) < 600).collect();
            if inst.restart == RestartPolicy::OnFailure && recent.len() < 5 {
                let pause = Duration::from_millis(250 << recent.len());
                tokio::time::sleep(pause).await;
                let _ = self.set(&id, |i| {
                    i.recent_restarts = recent.clone();
                    i.recent_restarts.push(now());
                });
                let inst = self.state().instances[&id].clone();
                if let Err(e) = self.launch(&id, inst, rt, true).await {
                    tracing::warn!(instance = %id, "automatic restart failed: {e}");
                }
            } else if inst.restart == RestartPolicy::OnFailure {
                tracing::warn!(instance = %id, "crashed 5 times in 10 minutes: left crashed (start it by hand)");
            }
        }
    }

    /// The watcher: forever, every `period`.
    pub async fn watch(self: Arc<Self>, period: Duration) {
        let mut round = 0u64;
        loop {
            tokio::time::sleep(period).await;
            // EPS counters and memory every 5th round; every container asked every 40th (a safety net for lost events).
            self.watch_once(round % 5 == 0, round % 40 == 0).await;
            round += 1;
        }
    }

    /// Instances by runtime and state, for metrics and the status page.
    pub fn census(&self) -> BTreeMap<(RuntimeKind, InstanceState), u64> {
        let mut m = BTreeMap::new();
        for i in self.state().instances.values() {
            *m.entry((i.runtime, i.state)).or_default() += 1;
        }
        m
    }
}

/// Each instance runs as its own uid and must reach its folder under
/// `instances/`: every folder above it needs the others' search bit (o+x),
/// while `instances/<id>` itself stays owner-only.
fn check_traversable(instances: &std::path::Path) -> Result<(), String> {
    use std::os::unix::fs::PermissionsExt;
    let abs = std::fs::canonicalize(instances).map_err(|e| format!("{}: {e}", instances.display()))?;
    let mut perms = std::fs::metadata(&abs).map_err(|e| e.to_string())?.permissions();
    perms.set_mode(0o711);
    std::fs::set_permissions(&abs, perms).map_err(|e| format!("{}: {e}", abs.display()))?;
    for dir in abs.ancestors().skip(1) {
        let mode = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?.permissions().mode();
        if mode & 0o001 == 0 {
            return Err(format!(
                "instances run as their own uids and cannot reach {}: {} has mode {:o} (no search bit for others); run `chmod o+x {}` or choose a --state below a folder others can traverse",
                abs.display(),
                dir.display(),
                mode & 0o777,
                dir.display()
            ));
        }
    }
    Ok(())
}

/// How often a starting instance's `/healthz` is asked.
const READY_POLL: Duration = Duration::from_millis(25);
/// Probes of a starting instance in flight at once (each ends within its second).
const READY_PROBES_IN_FLIGHT: usize = 40;

/// `GET /healthz` of an EPS: true on 200 within a second.
pub async fn healthz(addr: SocketAddr) -> bool {
    matches!(http_get(addr, "/healthz", 1 << 10).await, Some((200, _)))
}

async fn http_get(addr: SocketAddr, path: &str, max: usize) -> Option<(u16, String)> {
    let fut = async {
        let mut s = tokio::net::TcpStream::connect(addr).await.ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: eps\r\n\r\n").as_bytes()).await.ok()?;
        let mut buf = Vec::new();
        s.take(max as u64).read_to_end(&mut buf).await.ok()?;
        let text = String::from_utf8_lossy(&buf).into_owned();
        let status: u16 = text.split_whitespace().nth(1)?.parse().ok()?;
        let body = text.split_once("\r\n\r\n").map(|(_, b)| b.to_owned()).unwrap_or_default();
        Some((status, body))
    };
    tokio::time::timeout(Duration::from_secs(1), fut).await.ok().flatten()
}

/// (saves answered, bytes saved on the device link) from an EPS's `/metrics`.
async fn eps_counters(addr: SocketAddr) -> Option<(u64, u64)> {
    let (status, body) = http_get(addr, "/metrics", 1 << 20).await?;
    if status != 200 {
        return None;
    }
    Some(parse_eps_counters(&body))
}

/// Sums the EPS's counters: saves (`ec_eps_requests_total{endpoint="save"}`)
/// and bytes saved (provider-link bytes sent minus device-link bytes received).
pub fn parse_eps_counters(text: &str) -> (u64, u64) {
    let mut saves = 0.0;
    let mut provider_out = 0.0;
    let mut device_in = 0.0;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name_labels, value)) = line.rsplit_once(' ') else { continue };
        let v: f64 = value.parse().unwrap_or(0.0);
        if name_labels.starts_with("ec_eps_requests_total") && name_labels.contains("endpoint=\"save\"") {
            saves += v;
        } else if name_labels.starts_with("ec_eps_provider_bytes_total") && name_labels.contains("direction=\"out\"") {
            provider_out += v;
        } else if name_labels.starts_with("ec_eps_device_bytes_total") && name_labels.contains("direction=\"in\"") {
            device_in += v;
        }
    }
    (saves as u64, (provider_out - device_in).max(0.0) as u64)
}
