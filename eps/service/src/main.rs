//! `ec-eps`: the edge-hosted personal service of one user.
//!
//! Run `ec-eps serve --config <state>/eps.json`; see docs/eps.md.

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use clap::{Parser, Subcommand};

use ec_eps::config::Config;
use ec_eps::server::{self, Listener};
use ec_eps::service::Service;

/// The EdgeCourier edge service: rebuilds office-document saves from edit
/// patches, verifies them and uploads them with the provider's own API.
#[derive(Debug, Parser)]
#[command(version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Serve one user's devices until stopped (SIGTERM / SIGINT).
    Serve {
        /// The configuration file (JSON; docs/eps.md). Its folder is the state folder unless --state is given.
        #[arg(long, short)]
        config: PathBuf,
        /// The state folder (last-synced store, TLS files); must be writable.
        #[arg(long)]
        state: Option<PathBuf>,
        /// Log format: `text` (people) or `json` (collectors).
        #[arg(long, default_value = "text")]
        log_format: String,
    },
    /// Open an instance's last-synced store (recovering from a crash as a
    /// start would), read every file, and print a JSON report; exit 0 when
    /// consistent, 1 when not.
    CheckStore {
        /// The state folder (the store is its `store/` subfolder).
        #[arg(long)]
        state: PathBuf,
    },
    /// Check a configuration file and exit (0 when usable).
    CheckConfig {
        /// The configuration file.
        #[arg(long, short)]
        config: PathBuf,
    },
}

/// Provider credentials pass through this process's memory (spec §8):
/// no core dump may write them to disk.
fn forbid_core_dumps() {
    // SAFETY: plain system calls with constant arguments and a valid struct pointer.
    unsafe {
        libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0);
        let zero = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_CORE, &zero);
    }
}

/// glibc keeps freed memory in per-thread arenas and never trims them: an
/// idle instance would hold on to the buffers of its last save (5-10 MiB,
/// docs/benchmarks.md). One arena and low mmap / trim thresholds give it
/// back; set in code so that a `FROM scratch` image or an initramfs needs no
/// environment variable.
fn return_freed_memory() {
    // SAFETY: mallopt only sets allocator parameters; called before any thread starts.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024);
        libc::mallopt(libc::M_TRIM_THRESHOLD, 128 * 1024);
    }
}

/// Colours in the log only on a terminal, and not when `NO_COLOR` is set
/// (<https://no-color.org>; the appliance's init sets it: its console is a
/// file on the access point).
fn colour_logs() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if !matches!(cli.command, Command::Serve { .. }) {
        // A one-shot check whose output may go to `head`: once the reader
        // has gone it ends as cat does, by SIGPIPE, not with a panic in
        // println! (Rust ignores SIGPIPE by default, which `serve` keeps for
        // its sockets).
        // SAFETY: signal(2) with SIG_DFL, before any thread is started.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
    }
    match cli.command {
        Command::CheckConfig { config } => {
            let state = config.parent().map(|p| p.to_owned()).unwrap_or_default();
            match Config::load(&config, &state) {
                Ok(checked) => {
                    if let Err(e) = ec_eps::service::configured_limits(&checked) {
                        eprintln!("ec-eps: {e}");
                        return ExitCode::from(2);
                    }
                    for w in &checked.warnings {
                        eprintln!("ec-eps: warning: {w}");
                    }
                    println!("{}: ok", config.display());
                    ExitCode::SUCCESS
                }
                Err(e) => {
                    eprintln!("ec-eps: {e}");
                    ExitCode::from(2)
                }
            }
        }
        Command::CheckStore { state } => check_store(&state),
        Command::Serve { config, state, log_format } => {
            forbid_core_dumps();
            return_freed_memory();
            let filter = tracing_subscriber::EnvFilter::try_from_env("EC_EPS_LOG").unwrap_or_else(|_| "info".into());
            let sub = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(colour_logs());
            if log_format == "json" {
                sub.json().init();
            } else {
                sub.init();
            }
            #[cfg(feature = "failpoints")]
            let _fail_scenario = fail::FailScenario::setup();
            let state = state.or_else(|| config.parent().map(|p| p.to_owned())).unwrap_or_default();
            let rt = match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    eprintln!("ec-eps: cannot start the runtime: {e}");
                    return ExitCode::FAILURE;
                }
            };
            match rt.block_on(run(config, state)) {
                Ok(()) => ExitCode::SUCCESS,
                Err(e) => {
                    eprintln!("ec-eps: {e}");
                    ExitCode::FAILURE
                }
            }
        }
    }
}

fn check_store(state: &std::path::Path) -> ExitCode {
    let store = match ec_store::Store::open(state.join("store"), ec_store::StoreConfig { max_total_bytes: u64::MAX }) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("ec-eps: {e}");
            return ExitCode::from(2);
        }
    };
    match store.check() {
        Ok(report) => {
            let stats = store.stats();
            println!(
                "{}",
                serde_json::json!({
                    "consistent": report.is_consistent(),
                    "blobs_checked": report.blobs_checked,
                    "documents_checked": report.documents_checked,
                    "bytes_on_disk": report.bytes_on_disk,
                    "documents": stats.documents,
                    "blobs": stats.blobs,
                    "pointers_over_bound_removed": store.pointers_over_bound_at_open(),
                    "blobs_over_bound_removed": store.blobs_over_bound_at_open(),
                    "problems": report.problems.iter().map(|p| format!("{p:?}")).collect::<Vec<_>>(),
                })
            );
            if report.is_consistent() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("ec-eps: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(config: PathBuf, state: PathBuf) -> Result<(), String> {
    let checked = Config::load(&config, &state).map_err(|e| e.to_string())?;
    for w in &checked.warnings {
        tracing::warn!("configuration: {w}");
    }
    // Connections must never exhaust the file limit (issue 8: ~1,010 idle
    // sockets locked every device out): raise the soft limit to the hard one
    // and keep a reserve for the store, provider connections and listeners.
    let nofile = ec_eps::conns::raise_nofile();
    let cc = checked.config.connections.clone();
    let mgmt_max = cc.management_max.min(64);
    let room = nofile.saturating_sub(ec_eps::conns::FD_RESERVE + mgmt_max).max(8);
    let device_max = cc.max.min(room);
    if device_max < cc.max {
        tracing::warn!(configured = cc.max, nofile, device_max, "connections.max lowered to fit the open-file limit");
    }
    let tls = match &checked.config.tls {
        Some(t) => Some(server::tls_acceptor(&checked.path(&t.cert_pem), &checked.path(&t.key_pem))?),
        None => {
            tracing::warn!("serving the protocol over PLAIN HTTP (insecure_plain_http): lab use with test credentials only");
            None
        }
    };
    let device = server::bind(checked.config.listen, "device listener").await?;
    let management = match checked.config.management_listen {
        Some(a) => Some(server::bind(a, "management listener").await?),
        None => None,
    };
    let svc = Arc::new(Service::new(checked).map_err(|e| e.to_string())?);
    let device_addr = device.local_addr().map_err(|e| e.to_string())?;
    let mgmt_addr = management.as_ref().and_then(|l| l.local_addr().ok());
    // One machine-readable line for the edge-manager and the tests.
    println!(
        "{}",
        serde_json::json!({"ready": true, "device": device_addr.to_string(), "management": mgmt_addr.map(|a| a.to_string()), "tls": tls.is_some()})
    );
    tracing::info!(%device_addr, management = ?mgmt_addr, "EPS ready");
    tokio::spawn(svc.clone().let_go_of_kept_contents());
    let device_tracker = ec_eps::conns::Tracker::new("device", device_max as usize, svc.metrics());
    tokio::spawn(server::serve(svc.clone(), Listener::Device, device, tls, device_tracker));
    if let Some(m) = management {
        let t = ec_eps::conns::Tracker::new("management", mgmt_max as usize, svc.metrics());
        tokio::spawn(server::serve(svc.clone(), Listener::Management, m, None, t));
    }
    shutdown_signal().await;
    tracing::info!("stopping");
    Ok(())
}

async fn shutdown_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {},
        _ = term.recv() => {},
    }
}
