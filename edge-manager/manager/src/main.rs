//! `ec-edge`: the edge manager (`ec-edge serve`) and its operator command line.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ec_edge::manager::{Manager, Settings};
use ec_edge::runtime::{Limits, RuntimeKind};

/// EdgeCourier's edge manager: each user's EPS on this access point.
#[derive(Debug, Parser)]
#[command(
    name = "ec-edge",
    version,
    after_help = "The operator commands talk to a running manager on --manager with the token in <state>/operator.token (or EC_EDGE_TOKEN). `ec-edge serve --help` for the manager's own settings."
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
    /// The manager's operator listener.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8440", env = "EC_EDGE_MANAGER")]
    manager: String,
    /// The manager's state folder (to read the operator token from).
    #[arg(long, global = true, default_value = "/var/lib/edgecourier", env = "EC_EDGE_STATE")]
    state: PathBuf,
    /// Print the manager's JSON answer, for scripts.
    #[arg(long, global = true)]
    json: bool,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Run the manager.
    Serve(Box<Serve>),
    /// The EPS appliance of the microvm and xen backends (unikernel/build calls these).
    #[command(subcommand)]
    Appliance(ApplianceCmd),
    /// Add a user; prints the credential to give to the user's devices (shown once).
    AddUser {
        /// Name: a-z, 0-9, '-'.
        user: String,
        /// Instances this user may have.
        #[arg(long)]
        max_instances: Option<u32>,
    },
    /// List users.
    Users,
    /// Remove a user (who has no instances left).
    RemoveUser {
        /// The user.
        user: String,
    },
    /// Create an instance for a user and a service (stopped; `start` it).
    Create {
        /// The user.
        user: String,
        /// The service (e.g. dropbox, onedrive, default).
        #[arg(long, default_value = "default")]
        service: String,
        /// process, docker, microvm or xen (default: the manager's).
        #[arg(long)]
        runtime: Option<String>,
        /// Memory limit in MiB.
        #[arg(long)]
        memory_mib: Option<u64>,
        /// CPU limit in thousandths of a core.
        #[arg(long)]
        cpu_millis: Option<u32>,
        /// Process limit.
        #[arg(long)]
        pids: Option<u32>,
        /// on-failure (default) or never.
        #[arg(long)]
        restart: Option<String>,
    },
    /// List instances.
    List,
    /// One instance.
    Status {
        /// The instance id (<user>-<service>).
        id: String,
    },
    /// Start an instance and wait until it is ready.
    Start {
        /// The instance id.
        id: String,
    },
    /// Stop an instance.
    Stop {
        /// The instance id.
        id: String,
    },
    /// Stop an instance, keep its state, free its resources.
    Revoke {
        /// The instance id.
        id: String,
    },
    /// Start a revoked instance again with its state.
    Restore {
        /// The instance id.
        id: String,
    },
    /// Delete an instance and its state.
    Delete {
        /// The instance id.
        id: String,
    },
    /// An instance's last log lines.
    Logs {
        /// The instance id.
        id: String,
        /// How many.
        #[arg(long, default_value_t = 50)]
        lines: usize,
    },
}

#[derive(Debug, Subcommand)]
enum ApplianceCmd {
    /// Write the base initramfs (newc cpio): /init, /sbin/poweroff, /ec-eps, /dev/console.
    Pack {
        /// The static ec-init.
        #[arg(long)]
        init: PathBuf,
        /// The static ec-eps.
        #[arg(long)]
        eps: PathBuf,
        /// The archive to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Write the kernel with its segments packed at page alignment in the file (a third
    /// smaller; the same bytes where the loaders put them).
    PackKernel {
        /// The kernel as built (vmlinux, with its PVH entry).
        #[arg(long)]
        kernel: PathBuf,
        /// The packed kernel to write.
        #[arg(long)]
        out: PathBuf,
    },
    /// Boot the appliance once (KVM if it works, else TCG) and print its sizes and boot time.
    Check {
        /// The folder with vmlinux and initramfs.cpio.lz4.
        #[arg(long)]
        dir: PathBuf,
        /// auto, kvm or tcg.
        #[arg(long, default_value = "auto")]
        accel: String,
        /// The QEMU binary.
        #[arg(long, default_value = "qemu-system-x86_64")]
        qemu: PathBuf,
    },
}

fn appliance(cmd: &ApplianceCmd) -> Result<(), String> {
    use ec_edge::runtime::microvm::{check, AccelChoice, MicrovmConfig};
    match cmd {
        ApplianceCmd::Pack { init, eps, out } => {
            let read = |p: &PathBuf| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
            let archive = ec_edge::runtime::appliance::base_initramfs(&read(init)?, &read(eps)?);
            std::fs::write(out, &archive).map_err(|e| format!("{}: {e}", out.display()))
        }
        ApplianceCmd::PackKernel { kernel, out } => {
            let elf = std::fs::read(kernel).map_err(|e| format!("{}: {e}", kernel.display()))?;
            let packed = ec_edge::runtime::appliance::pack_kernel(&elf).map_err(|e| format!("{}: {e}", kernel.display()))?;
            std::fs::write(out, &packed).map_err(|e| format!("{}: {e}", out.display()))
        }
        ApplianceCmd::Check { dir, accel, qemu } => {
            let accel: AccelChoice = accel.parse().map_err(|e| format!("--accel {e}"))?;
            let cfg = MicrovmConfig { appliance_dir: dir.clone(), qemu: qemu.clone(), accel, ..MicrovmConfig::default() };
            let r = check(&cfg)?;
            if !r.note.is_empty() {
                eprintln!("{}", r.note);
            }
            println!(
                "{}",
                serde_json::json!({
                    "accel": r.accel.name(),
                    "boot_to_init_s": (r.boot_s * 1000.0).round() / 1000.0,
                    "kernel_bytes": r.sizes.0,
                    "initramfs_bytes": r.sizes.1,
                    "image_bytes": r.sizes.0 + r.sizes.1,
                })
            );
            Ok(())
        }
    }
}

/// The manager's settings.
#[derive(Debug, clap::Args)]
struct Serve {
    /// Operator listener: the API with the operator token, /metrics, the status page. Keep it off the Wi-Fi.
    #[arg(long, default_value = "127.0.0.1:8440")]
    operator_listen: SocketAddr,
    /// Device listener (TLS): devices join here with their user's credential.
    #[arg(long, default_value = "0.0.0.0:8441")]
    device_listen: SocketAddr,
    /// The access point's address on the Wi-Fi side: where devices reach instances.
    #[arg(long, default_value = "127.0.0.1")]
    advertise: IpAddr,
    /// Instance n listens for devices on this port + n.
    #[arg(long, default_value_t = 20000)]
    device_port_base: u16,
    /// Instance n's management listener is 127.0.0.1:(this + n).
    #[arg(long, default_value_t = 24000)]
    management_port_base: u16,
    /// Most instances on this access point.
    #[arg(long, default_value_t = 4000)]
    max_slots: u32,
    /// Instance n runs as uid and gid (this + n).
    #[arg(long, default_value_t = 200000)]
    uid_base: u32,
    /// The default backend: process, docker, microvm or xen.
    #[arg(long, default_value = "process")]
    runtime: String,
    /// Backends offered besides the default one (comma-separated). The
    /// microvm backend boots the appliance once when the manager starts, to
    /// choose KVM or TCG and to check the image, and the xen backend needs a
    /// Xen dom0: each is probed only when named here or as --runtime.
    #[arg(long, default_value = "process,docker", value_delimiter = ',')]
    runtimes: Vec<String>,
    /// microvm, xen: the folder with the appliance's vmlinux and initramfs.cpio.lz4
    /// (default: share/edgecourier/appliance beside this program's folder; `make appliance`).
    #[arg(long)]
    appliance_dir: Option<PathBuf>,
    /// microvm, xen: the guests' subnet; each instance takes a /30 (host side .1, guest .2).
    #[arg(long, default_value = "10.208.0.0/14")]
    vm_subnet: String,
    /// microvm, xen: a host service guests may reach (ADDRESS:PORT; repeatable). Only for a
    /// lab whose provider servers run on the access point itself; guests reach nothing else on the host.
    #[arg(long)]
    vm_allow_host: Vec<SocketAddr>,
    /// microvm: auto (KVM if a probe boot with it works, else TCG), kvm or tcg.
    #[arg(long, default_value = "auto")]
    vm_accel: String,
    /// microvm: the QEMU binary.
    #[arg(long, default_value = "qemu-system-x86_64")]
    qemu: PathBuf,
    /// microvm: identical pages of different guests (the kernel, the EPS binary) share host
    /// memory through the kernel's KSM. auto: turn KSM on if the host has it (and scan
    /// 1000 pages per wake-up if the host left the default 100); on: the same, and fail
    /// without it; off: leave the host's KSM setting alone.
    #[arg(long, default_value = "auto")]
    vm_ksm: String,
    /// microvm under TCG: each guest's translation cache, MiB (host memory per guest; a
    /// smaller one re-translates more often).
    #[arg(long, default_value_t = 16)]
    vm_tcg_cache_mib: u64,
    /// microvm, xen: how long the check boot of the appliance at start may take to reach its
    /// init (default: 30 s for microvm, 60 s per boot for xen; a nested host needs minutes).
    #[arg(long)]
    vm_probe_timeout_s: Option<u64>,
    /// microvm, xen: size of a new instance's state disk, MiB (a sparse file).
    #[arg(long, default_value_t = 1536)]
    vm_disk_mib: u64,
    /// xen: the toolstack's `xl`.
    #[arg(long, default_value = "xl")]
    xl: PathBuf,
    /// xen: where xenconsoled writes the guests' consoles (`xenconsoled --log=guest`; Debian:
    /// XENCONSOLED_TRACE=guest in /etc/default/xencommons): the instances' logs.
    #[arg(long, default_value = "/var/log/xen/console")]
    xen_console_dir: PathBuf,
    /// Default memory limit per instance, MiB.
    #[arg(long, default_value_t = 64)]
    memory_mib: u64,
    /// Default CPU limit per instance, thousandths of a core.
    #[arg(long, default_value_t = 1000)]
    cpu_millis: u32,
    /// Default process limit per instance.
    #[arg(long, default_value_t = 64)]
    pids: u32,
    /// Largest memory limit a request may ask for, MiB.
    #[arg(long, default_value_t = 1024)]
    max_memory_mib: u64,
    /// Largest CPU limit, thousandths of a core.
    #[arg(long, default_value_t = 2000)]
    max_cpu_millis: u32,
    /// Largest process limit.
    #[arg(long, default_value_t = 256)]
    max_pids: u32,
    /// Instances per user unless the operator says otherwise.
    #[arg(long, default_value_t = 4)]
    max_instances_per_user: u32,
    /// The static EPS binary (default: ec-eps beside this program).
    #[arg(long)]
    eps_binary: Option<PathBuf>,
    /// The launcher (default: ec-launcher beside this program).
    #[arg(long)]
    launcher: Option<PathBuf>,
    /// Run instances without cgroups or their own uid (a single-user laptop without root).
    #[arg(long)]
    no_isolation: bool,
    /// The EPS image for the docker backend.
    #[arg(long, default_value = "edgecourier/eps:local")]
    docker_image: String,
    /// JSON merged into every new instance's eps.json (docs/eps.md: upstream, accounts, limits).
    #[arg(long)]
    eps_template: Option<PathBuf>,
    /// Seconds a start may take to answer /healthz.
    #[arg(long, default_value_t = 20)]
    ready_timeout_s: u64,
}

fn microvm_config(s: &Serve) -> Result<ec_edge::runtime::microvm::MicrovmConfig, String> {
    use ec_edge::runtime::microvm::{AccelChoice, MemoryMerge, MicrovmConfig};
    let (addr, len) = s.vm_subnet.split_once('/').ok_or_else(|| format!("--vm-subnet {}: expected A.B.C.D/len", s.vm_subnet))?;
    let accel: AccelChoice = s.vm_accel.parse().map_err(|e| format!("--vm-accel {e}"))?;
    let memory_merge: MemoryMerge = s.vm_ksm.parse().map_err(|e| format!("--vm-ksm {e}"))?;
    if !(1..=1024).contains(&s.vm_tcg_cache_mib) {
        return Err(format!("--vm-tcg-cache-mib {}: from 1 to 1024", s.vm_tcg_cache_mib));
    }
    Ok(MicrovmConfig {
        qemu: s.qemu.clone(),
        appliance_dir: absolute(s.appliance_dir.clone().unwrap_or_else(|| beside_me("../share/edgecourier/appliance"))),
        net: ec_edge::runtime::vmnet::VmNetConfig {
            subnet: addr.parse().map_err(|_| format!("--vm-subnet {}: bad address", s.vm_subnet))?,
            prefix: len.parse().map_err(|_| format!("--vm-subnet {}: bad prefix length", s.vm_subnet))?,
            allow_host: s.vm_allow_host.clone(),
        },
        disk_mib: s.vm_disk_mib,
        accel,
        probe_timeout: s.vm_probe_timeout_s.map_or(MicrovmConfig::default().probe_timeout, Duration::from_secs),
        tcg_cache_mib: s.vm_tcg_cache_mib,
        memory_merge,
        ..MicrovmConfig::default()
    })
}

fn beside_me(name: &str) -> PathBuf {
    std::env::current_exe().ok().and_then(|p| p.parent().map(|d| d.join(name))).unwrap_or_else(|| PathBuf::from(name))
}

/// Instances run in their own folder: paths given relative to ours must not change meaning.
fn absolute(p: PathBuf) -> PathBuf {
    std::fs::canonicalize(&p).unwrap_or(p)
}

fn parse_runtime(s: &str) -> Result<RuntimeKind, String> {
    serde_json::from_value(serde_json::Value::String(s.to_owned()))
        .map_err(|_| format!("unknown runtime {s:?}: process, docker, microvm or xen"))
}

async fn serve(state: PathBuf, s: Serve) -> Result<(), String> {
    let template = match &s.eps_template {
        Some(p) => serde_json::from_slice(&std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()))?)
            .map_err(|e| format!("{}: {e}", p.display()))?,
        None => serde_json::json!({}),
    };
    let microvm = microvm_config(&s)?;
    let xen = ec_edge::runtime::xen::XenConfig {
        xl: s.xl.clone(),
        appliance_dir: microvm.appliance_dir.clone(),
        net: microvm.net.clone(),
        disk_mib: s.vm_disk_mib,
        console_dir: s.xen_console_dir.clone(),
        probe_timeout: s.vm_probe_timeout_s.map_or(ec_edge::runtime::xen::XenConfig::default().probe_timeout, Duration::from_secs),
        ..Default::default()
    };
    let settings = Settings {
        state_dir: state,
        advertise: s.advertise,
        device_port_base: s.device_port_base,
        management_port_base: s.management_port_base,
        max_slots: s.max_slots,
        uid_base: s.uid_base,
        default_runtime: parse_runtime(&s.runtime)?,
        default_limits: Limits { memory_bytes: s.memory_mib << 20, cpu_millis: s.cpu_millis, pids: s.pids },
        max_limits: Limits { memory_bytes: s.max_memory_mib << 20, cpu_millis: s.max_cpu_millis, pids: s.max_pids },
        max_instances_per_user: s.max_instances_per_user,
        eps_binary: absolute(s.eps_binary.unwrap_or_else(|| beside_me("ec-eps"))),
        launcher: absolute(s.launcher.unwrap_or_else(|| beside_me("ec-launcher"))),
        isolate: !s.no_isolation,
        docker_image: s.docker_image,
        eps_template: template,
        ready_timeout: Duration::from_secs(s.ready_timeout_s),
        enabled: s.runtimes.iter().map(|r| parse_runtime(r)).collect::<Result<_, _>>()?,
        microvm,
        xen,
    };
    let m = Arc::new(Manager::open(settings)?);
    let (have, _) = m.backends();
    if !have.contains(&m.settings().default_runtime) {
        let (_, missing) = m.backends();
        return Err(missing.get(&m.settings().default_runtime).cloned().unwrap_or_else(|| "the default runtime is not available".into()));
    }
    let op = tokio::net::TcpListener::bind(s.operator_listen).await.map_err(|e| format!("operator listener {}: {e}", s.operator_listen))?;
    let dev = tokio::net::TcpListener::bind(s.device_listen).await.map_err(|e| format!("device listener {}: {e}", s.device_listen))?;
    let tls = ec_edge::tls::server_config(&m.settings().state_dir.join("tls"))?;
    m.adopt_all().await;
    println!(
        "{}",
        serde_json::json!({
            "ready": true,
            "operator": op.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            "device": dev.local_addr().map(|a| a.to_string()).unwrap_or_default(),
            "pin": m.pin(),
            "runtimes": have.iter().map(|k| k.name()).collect::<Vec<_>>(),
        })
    );
    tokio::spawn(m.clone().watch(Duration::from_millis(500)));
    tokio::spawn(ec_edge::http::serve(
        m.clone(),
        ec_edge::http::Listener::Device,
        dev,
        Some(tokio_rustls::TlsAcceptor::from(Arc::new(tls))),
    ));
    let operator = ec_edge::http::serve(m.clone(), ec_edge::http::Listener::Operator, op, None);
    tokio::select! {
        () = operator => {}
        _ = tokio::signal::ctrl_c() => {}
        () = async { if let Ok(mut s) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) { s.recv().await; } } => {}
    }
    // Instances keep running: a restarted manager re-adopts them. Host
    // resources that no running instance needs are given back.
    m.shutdown();
    Ok(())
}

fn client(cli: &Cli, method: &str, path: &str, body: Option<serde_json::Value>) -> Result<serde_json::Value, String> {
    let token = match std::env::var("EC_EDGE_TOKEN") {
        Ok(t) => t,
        Err(_) => std::fs::read_to_string(cli.state.join("operator.token")).map_err(|e| {
            format!("the operator token {}: {e} (pass --state or set EC_EDGE_TOKEN)", cli.state.join("operator.token").display())
        })?,
    };
    let agent: ureq::Agent =
        ureq::Agent::config_builder().http_status_as_error(false).timeout_global(Some(Duration::from_secs(120))).build().into();
    let url = format!("{}{path}", cli.manager.trim_end_matches('/'));
    let auth = format!("Bearer {}", token.trim());
    let resp = match (method, body) {
        ("GET", _) => agent.get(&url).header("Authorization", &auth).call(),
        ("DELETE", _) => agent.delete(&url).header("Authorization", &auth).call(),
        (_, Some(b)) => agent
            .post(&url)
            .header("Authorization", &auth)
            .header("Content-Type", "application/json")
            .send(&serde_json::to_vec(&b).unwrap_or_default()[..]),
        (_, None) => agent.post(&url).header("Authorization", &auth).send_empty(),
    }
    .map_err(|e| format!("{url}: {e} (is the manager running? `ec-edge serve`)"))?;
    let status = resp.status().as_u16();
    let text = resp.into_body().read_to_string().map_err(|e| e.to_string())?;
    let value: serde_json::Value =
        if text.is_empty() { serde_json::json!({}) } else { serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))? };
    if status >= 400 {
        if cli.json {
            println!("{}", serde_json::to_string_pretty(&value).unwrap_or_default());
        }
        return Err(value["error"]["message"].as_str().unwrap_or(&text).to_owned());
    }
    Ok(value)
}

fn mib(v: &serde_json::Value) -> String {
    v.as_u64().map_or_else(|| "-".into(), |b| format!("{:.1}", b as f64 / 1048576.0))
}

fn print_instances(list: &[serde_json::Value]) {
    println!("{:<28} {:<8} {:<9} {:>8} {:>6} {:>7} {:<28}", "INSTANCE", "RUNTIME", "STATE", "MEM MiB", "SAVES", "STARTS", "DEVICE URL");
    for i in list {
        println!(
            "{:<28} {:<8} {:<9} {:>8} {:>6} {:>7} {:<28}",
            i["id"].as_str().unwrap_or(""),
            i["runtime"].as_str().unwrap_or(""),
            i["state"].as_str().unwrap_or(""),
            mib(&i["memory_bytes"]),
            i["saves"].to_string(),
            i["starts"].to_string(),
            i["device_url"].as_str().unwrap_or("-")
        );
        if let Some(e) = i["last_exit"].as_object() {
            println!("    last exit: {}", e.get("reason").and_then(|r| r.as_str()).unwrap_or(""));
        }
    }
}

fn run_client(cli: &Cli) -> Result<(), String> {
    let (v, show): (serde_json::Value, &str) = match &cli.cmd {
        Cmd::Serve(_) | Cmd::Appliance(_) => unreachable!(),
        Cmd::AddUser { user, max_instances } => {
            (client(cli, "POST", "/v1/users", Some(serde_json::json!({"user": user, "max_instances": max_instances})))?, "user")
        }
        Cmd::Users => (client(cli, "GET", "/v1/users", None)?, "users"),
        Cmd::RemoveUser { user } => (client(cli, "DELETE", &format!("/v1/users/{user}"), None)?, "done"),
        Cmd::Create { user, service, runtime, memory_mib, cpu_millis, pids, restart } => {
            let mut body = serde_json::json!({"user": user, "service": service, "limits": {}});
            if let Some(r) = runtime {
                body["runtime"] = r.clone().into();
            }
            if let Some(r) = restart {
                body["restart"] = r.clone().into();
            }
            if let Some(m) = memory_mib {
                body["limits"]["memory_bytes"] = (m << 20).into();
            }
            if let Some(c) = cpu_millis {
                body["limits"]["cpu_millis"] = (*c).into();
            }
            if let Some(p) = pids {
                body["limits"]["pids"] = (*p).into();
            }
            (client(cli, "POST", "/v1/instances", Some(body))?, "instance")
        }
        Cmd::List => (client(cli, "GET", "/v1/instances", None)?, "instances"),
        Cmd::Status { id } => (client(cli, "GET", &format!("/v1/instances/{id}"), None)?, "instance"),
        Cmd::Start { id } => (client(cli, "POST", &format!("/v1/instances/{id}/start"), None)?, "instance"),
        Cmd::Stop { id } => (client(cli, "POST", &format!("/v1/instances/{id}/stop"), None)?, "instance"),
        Cmd::Revoke { id } => (client(cli, "POST", &format!("/v1/instances/{id}/revoke"), None)?, "instance"),
        Cmd::Restore { id } => (client(cli, "POST", &format!("/v1/instances/{id}/restore"), None)?, "instance"),
        Cmd::Delete { id } => (client(cli, "DELETE", &format!("/v1/instances/{id}"), None)?, "done"),
        Cmd::Logs { id, lines } => (client(cli, "GET", &format!("/v1/instances/{id}/logs?lines={lines}"), None)?, "logs"),
    };
    if cli.json {
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        return Ok(());
    }
    match show {
        "user" => println!(
            "user {} added; give their devices this credential (shown once):\n{}",
            v["user"].as_str().unwrap_or(""),
            v["credential"].as_str().unwrap_or("")
        ),
        "users" => {
            for u in v["users"].as_array().into_iter().flatten() {
                println!("{:<20} max {:>3} instances: {}", u["user"].as_str().unwrap_or(""), u["max_instances"], u["instances"]);
            }
        }
        "instance" => {
            print_instances(std::slice::from_ref(&v));
            if let Some(e) = v["last_exit"].as_object() {
                println!("{}", e.get("log_tail").and_then(|r| r.as_str()).unwrap_or(""));
            }
        }
        "instances" => print_instances(v["instances"].as_array().map(Vec::as_slice).unwrap_or(&[])),
        "logs" => println!("{}", v["lines"].as_str().unwrap_or("")),
        _ => println!("done"),
    }
    Ok(())
}

fn main() {
    let cli = Cli::parse();
    let result = match &cli.cmd {
        Cmd::Serve(_) => {
            use std::io::IsTerminal;
            tracing_subscriber::fmt()
                .with_writer(std::io::stderr)
                // Colours only on a terminal (the manager's log is usually a file), never with NO_COLOR.
                .with_ansi(std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()))
                .with_env_filter(tracing_subscriber::EnvFilter::try_from_env("EC_EDGE_LOG").unwrap_or_else(|_| "info".into()))
                .init();
            let Cmd::Serve(s) = Cli::parse().cmd else { unreachable!() };
            let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("tokio runtime");
            rt.block_on(serve(cli.state.clone(), *s))
        }
        Cmd::Appliance(a) => appliance(a),
        _ => {
            // A short-lived client whose output may go to `head`: once the
            // reader has gone it ends as cat does, by SIGPIPE, not with a
            // panic in println! (Rust ignores SIGPIPE by default, which the
            // server keeps for its sockets).
            // SAFETY: signal(2) with SIG_DFL, before any thread is started.
            unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
            run_client(&cli)
        }
    };
    if let Err(e) = result {
        eprintln!("ec-edge: {e}");
        std::process::exit(1);
    }
}
