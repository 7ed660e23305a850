//! The `xen` backend: each EPS instance is the appliance (`unikernel/`: the
//! same kernel and initramfs as the `microvm` backend) as a Xen PVH guest,
//! started with the toolstack's own `xl`. The manager runs in dom0.
//!
//! # The guest
//! A config is generated per instance (`<state>/xl.cfg`, see
//! [`XenRuntime::guest_config`]) and checked by the toolstack's own parser
//! when the backend starts (`xl -N create`, a dry run). The kernel boots
//! through its PVH entry with one vCPU, the instance's memory (plus what the
//! appliance itself takes) and a CPU cap from the instance's CPU limit. Its
//! devices are Xen's paravirtual ones: the console `hvc0` (xenconsoled
//! writes it to `<console dir>/guest-<name>.log`, which is the instance's
//! log), a routed vif named like a `microvm` tap (so [`super::vmnet`]'s one
//! nftables table forwards and isolates both kinds), and the state disk
//! `store.img` as `xvda` (blkback on a loop device).
//!
//! The domain is kept when it powers off or crashes (`on_* = "preserve"`):
//! the manager sees *why* it ended (Xen's shutdown reason code and the
//! guest's last console lines), and [`Runtime::release`] destroys it.
//!
//! # Revocation
//! `xl shutdown` asks the guest for a clean power-off (its kernel runs
//! `/sbin/poweroff`, which is the appliance's init: the EPS gets SIGTERM, the
//! store is synced and unmounted), then the domain is destroyed; the state
//! disk stays. `xl save` is not used, for the reason the `microvm` backend
//! gives: a save file would hold the user's keys and documents in a second
//! place, and a cold boot is as fast.
//!
//! # Checks
//! When the backend starts it boots the appliance once as a small guest
//! with `ec.probe` (no network, no disk: its init prints `ec-init: probe ok`
//! and powers off), as the `microvm` backend does: a kernel or initramfs
//! that does not boot makes the backend unavailable, within
//! [`XenConfig::probe_timeout`] per boot, with the guest's last console
//! lines. An instance whose guest ends before its init ran, or whose init
//! never says anything within [`XenConfig::init_timeout`], fails to start
//! with its console's last lines.
//!
//! # Robustness
//! `xl` is a C program talking to xenstored; under nested emulation it has
//! been seen to die of a signal now and then (`unikernel/xen-host/README.md`).
//! A call that died of a signal is retried (twice), after destroying what a
//! failed `xl create` may have left. A guest that dies before its init
//! prints a line (seen: a triple fault of the booting kernel under nested
//! TCG) is booted again, twice at most, unless its kernel said why
//! (`Kernel panic`: it would say it again): the EPS never ran, so nothing of
//! the user's is involved; a guest whose init ran and then ended is the
//! manager's business (its restart policy).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::appliance::{self, Appliance};
use super::vmnet::{VmNet, VmNetConfig, GUEST_DEVICE_PORT, GUEST_MANAGEMENT_PORT};
use super::{tail_file, which, Handle, InstanceSpec, Observed, Runtime, RuntimeError, RuntimeKind};

const NAME: &str = "xen";

/// The hotplug script of a routed vif (also used by the nested test host).
const VIF_SCRIPT: &str = include_str!("../../../../unikernel/xen-host/dom0/ec-vif-route");

/// Settings of the backend.
#[derive(Debug, Clone)]
pub struct XenConfig {
    /// The toolstack's `xl`.
    pub xl: PathBuf,
    /// Where `vmlinux` and `initramfs.cpio.lz4` are (`make appliance`).
    pub appliance_dir: PathBuf,
    /// The guests' network.
    pub net: VmNetConfig,
    /// Size of a new state disk, MiB (sparse).
    pub disk_mib: u64,
    /// Guest memory beyond the instance's limit (the appliance's kernel and files).
    pub guest_extra_mib: u64,
    /// Where xenconsoled writes the guests' consoles (`xenconsoled --log=guest`).
    pub console_dir: PathBuf,
    /// How long one `xl` call may take (`xl create` waits for the hotplug scripts).
    pub xl_timeout: Duration,
    /// How long `start` waits for the guest's init to say it started (a
    /// guest that dies before is booted again, twice at most).
    pub init_timeout: Duration,
    /// How long the backend's check boot (at start) may take to reach the
    /// appliance's init, per boot.
    pub probe_timeout: Duration,
}

impl Default for XenConfig {
    fn default() -> Self {
        Self {
            xl: PathBuf::from("xl"),
            appliance_dir: PathBuf::new(),
            net: VmNetConfig::default(),
            disk_mib: 1536,
            guest_extra_mib: 32,
            console_dir: PathBuf::from("/var/log/xen/console"),
            xl_timeout: Duration::from_secs(180),
            init_timeout: Duration::from_secs(300),
            probe_timeout: Duration::from_secs(60),
        }
    }
}

/// The xen backend.
#[derive(Debug)]
pub struct XenRuntime {
    cfg: XenConfig,
    appliance: Appliance,
    net: VmNet,
    /// `<run dir>/ec-vif-route`.
    vif_script: PathBuf,
    run_dir: PathBuf,
    /// Seconds from `xl create` to the init's first line, in the check boot.
    pub probe_boot_s: f64,
    /// The last `xl list -v` of every domain and when it was taken: the
    /// watcher's readings of all instances share one `xl` run per
    /// [`LIST_MAX_AGE`] instead of one per instance.
    listing: std::sync::Mutex<Option<(Instant, String)>>,
}

/// How old the shared domain listing may be for the watcher's readings
/// (state and memory of running guests). Starting, stopping and the boot
/// watch ask `xl` afresh, and every change the backend makes drops it.
const LIST_MAX_AGE: Duration = Duration::from_secs(1);

/// What `xl list -v` says of one domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainInfo {
    /// Domain id.
    pub domid: u32,
    /// Memory, MiB.
    pub mem_mib: u64,
    /// The state flags (`r b p s c d`: running, blocked, paused, shut down, crashed, dying).
    pub state: String,
    /// The domain's UUID (tells a domain from a later one of the same name).
    pub uuid: String,
    /// Xen's shutdown reason code (`None` while it runs).
    pub reason: Option<u32>,
}

/// Parses the line of `name` in `xl list -v` output.
pub fn parse_list(out: &str, name: &str) -> Option<DomainInfo> {
    // Name ID Mem VCPUs State Time(s) UUID Reason-Code Security-Label
    out.lines().find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        if f.len() < 8 || f[0] != name {
            return None;
        }
        Some(DomainInfo {
            domid: f[1].parse().ok()?,
            mem_mib: f[2].parse().ok()?,
            state: f[4].to_owned(),
            uuid: f[6].to_owned(),
            reason: f[7].parse().ok(),
        })
    })
}

/// Xen's shutdown reason, in words (`xen/include/public/sched.h`).
pub fn shutdown_reason(code: Option<u32>) -> &'static str {
    match code {
        Some(0) => "powered off",
        Some(1) => "asked for a reboot",
        Some(2) => "suspended",
        Some(3) => "crashed",
        Some(4) => "was stopped by its watchdog",
        Some(5) => "asked for a soft reset",
        _ => "ended",
    }
}

/// The result of one `xl` call.
struct XlOut {
    ok: bool,
    stdout: String,
    stderr: String,
    /// Died of a signal (or glibc's abort, 134): worth another try.
    signalled: bool,
}

fn run_xl(xl: &Path, args: &[&str], timeout: Duration) -> Result<XlOut, String> {
    use std::os::unix::process::ExitStatusExt;
    let r = super::run_with_timeout(xl, args, timeout)
        .map_err(|e| format!("{}: {e}", xl.display()))?
        .ok_or_else(|| format!("`xl {}` did not finish within {timeout:?}", args.join(" ")))?;
    let signalled = r.status.signal().is_some() || r.status.code().is_some_and(|c| c > 128);
    Ok(XlOut { ok: r.status.success(), stdout: r.stdout, stderr: r.stderr, signalled })
}

/// A path as the inside of an xl config's double-quoted string.
fn xl_string(p: &Path) -> String {
    p.to_string_lossy().replace('\\', "\\\\").replace('"', "\\\"")
}

/// The domain name of an instance.
pub fn domain_name(spec: &InstanceSpec) -> String {
    format!("ec-{}", spec.id)
}

/// The line the manager writes into the console log before each boot.
const BOOT_MARK: &str = "--- ec-edge: booting";

/// Everything after the last [`BOOT_MARK`] of a console log.
fn since_boot_mark(log: &Path) -> String {
    let tail = tail_file(log, 200);
    match tail.rfind(BOOT_MARK) {
        Some(i) => tail[i..].to_owned(),
        None => tail,
    }
}

/// The last `n` lines of a console, for an error message.
fn last_lines(console: &str, n: usize) -> String {
    let lines: Vec<&str> = console.lines().filter(|l| !l.starts_with(BOOT_MARK)).collect();
    let last = lines[lines.len().saturating_sub(n)..].join("\n");
    if last.trim().is_empty() {
        "(nothing)".to_owned()
    } else {
        last
    }
}

/// How a boot went, up to the appliance's init.
#[derive(Debug, PartialEq, Eq)]
enum Boot {
    /// The init printed its first line.
    Init,
    /// The guest ended before: why (Xen's shutdown reason), whether its
    /// kernel or init said why (it would again: not worth another boot), its
    /// console since the boot mark once that stopped growing, and what the
    /// hypervisor logged about the domain ([`hypervisor_lines`]).
    Died { why: String, said_why: bool, console: String, xen_log: String },
    /// Still booting when the time was up.
    Timeout,
}

impl Boot {
    /// Why a guest that died before its init did, for an error message:
    /// the console's last lines, and the hypervisor's own when it logged any.
    fn died_message(what: &str, console: &str, xen_log: &str) -> String {
        let mut m = format!("{what}; the console's last lines:\n{}", last_lines(console, 15));
        if !xen_log.is_empty() {
            m.push_str("\nXen's log on the domain (xl dmesg):\n");
            m.push_str(xen_log);
        }
        m
    }
}

/// Boots of one guest when it dies before its init without a word (a
/// triple fault seen under nested emulation, where a busy host saw three in
/// a row): each such boot costs only its seconds to the fault.
const BOOT_ATTEMPTS: usize = 5;

/// A guest's console may still grow after its domain has ended: xenconsoled
/// copies what is left in the console ring (a panic's last words) into the
/// log, and destroying the domain ends that. The watch waits until the log
/// has not grown for [`CONSOLE_QUIET`], at most [`CONSOLE_SETTLE`].
const CONSOLE_SETTLE: Duration = Duration::from_secs(3);
/// See [`CONSOLE_SETTLE`].
const CONSOLE_QUIET: Duration = Duration::from_millis(600);

/// The console since the last boot mark once the log has stopped growing.
fn settled_console(log: &Path) -> String {
    let len = || std::fs::metadata(log).map(|m| m.len()).unwrap_or(0);
    let deadline = Instant::now() + CONSOLE_SETTLE;
    let (mut seen, mut quiet_since) = (len(), Instant::now());
    while quiet_since.elapsed() < CONSOLE_QUIET && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(150));
        let now = len();
        if now != seen {
            (seen, quiet_since) = (now, Instant::now());
        }
    }
    since_boot_mark(log)
}

/// Whether a line of Xen's log is about domain `domid` (`d5`, `d5v0`,
/// `(d5)`, `HVM5`; not `d51`), leaving out the state-record lines each
/// domain creation logs at guest_loglvl=all.
fn about_domain(line: &str, domid: u32) -> bool {
    if line.contains(" save: ") || line.contains(" restore: ") {
        return false;
    }
    let id = domid.to_string();
    ["d", "HVM"].iter().any(|p| {
        let tag = format!("{p}{id}");
        line.match_indices(&tag).any(|(i, _)| {
            let before = line[..i].chars().next_back();
            let after = line[i + tag.len()..].chars().next();
            !before.is_some_and(|c| c.is_ascii_alphanumeric()) && !after.is_some_and(|c| c.is_ascii_digit())
        })
    })
}

/// The last lines of `xl dmesg` (the hypervisor's log) that are about
/// domain `domid`: a guest that triple-faults says nothing on its console,
/// and Xen says "Triple fault" there when its guest_loglvl lets it
/// (Xen's default leaves guests' info messages out; the nested test host
/// boots with guest_loglvl=all).
pub fn hypervisor_lines(dmesg: &str, domid: u32, n: usize) -> String {
    let lines: Vec<&str> = dmesg.lines().filter(|l| about_domain(l, domid)).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

impl XenRuntime {
    /// Checks that this is a Xen dom0 with a working toolstack, installs the
    /// appliance, checks a generated config with `xl`'s own parser, and sets
    /// up the network table.
    pub fn probe(cfg: XenConfig, isolate: bool, state_dir: &Path, advertise: std::net::IpAddr) -> Result<Self, RuntimeError> {
        let unavailable = |missing: String| RuntimeError::Unavailable { runtime: NAME, missing };
        let mut cfg = cfg;
        let caps = std::fs::read_to_string("/proc/xen/capabilities");
        if !caps.as_deref().unwrap_or("").contains("control_d") {
            return Err(unavailable(format!(
                "this host is not a Xen control domain ({}): boot it under Xen (Debian's xen-system-amd64) \
                 and run the manager in dom0, or use the microvm backend",
                match caps {
                    Err(e) => format!("/proc/xen/capabilities: {e}"),
                    Ok(_) => "/proc/xen/capabilities does not say control_d: this is a guest, not dom0".into(),
                }
            )));
        }
        cfg.xl = which(&cfg.xl)
            .ok_or_else(|| unavailable(format!("{} is missing (the Xen toolstack: Debian's xen-utils)", cfg.xl.display())))?;
        if !isolate {
            return Err(unavailable("the xen backend needs root (xl, vifs, nftables)".into()));
        }
        let info = run_xl(&cfg.xl, &["info"], cfg.xl_timeout).map_err(unavailable)?;
        if !info.ok {
            return Err(unavailable(format!("`xl info` failed (is xenstored running?): {}", info.stderr.trim())));
        }
        let free_mib = info
            .stdout
            .lines()
            .find_map(|l| l.strip_prefix("free_memory"))
            .and_then(|v| v.trim_start_matches([' ', ':']).trim().parse::<u64>().ok());
        let net = VmNet::new(cfg.net.clone(), state_dir, advertise, NAME)?;
        let appliance = Appliance::find(&cfg.appliance_dir, NAME)?.install(state_dir, NAME)?;
        let run_dir = PathBuf::from(format!("/run/{}", net.link_prefix.trim_end_matches('-')));
        std::fs::create_dir_all(&run_dir).map_err(|e| unavailable(format!("{}: {e}", run_dir.display())))?;
        let vif_script = run_dir.join("ec-vif-route");
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::write(&vif_script, VIF_SCRIPT)
                .and_then(|()| std::fs::set_permissions(&vif_script, std::fs::Permissions::from_mode(0o755)))
                .map_err(|e| unavailable(format!("{}: {e}", vif_script.display())))?;
        }
        let mut me = Self { cfg, appliance, net, vif_script, run_dir, probe_boot_s: 0.0, listing: Default::default() };
        // The toolstack's own parser checks what this backend writes.
        let sample = me.guest_config_for("ec-config-check", 0, 64, 1000, &me.run_dir.join("boot.cpio"), &me.run_dir.join("store.img"))?;
        let path = me.run_dir.join("config-check.cfg");
        std::fs::write(&path, sample).map_err(|e| unavailable(format!("{}: {e}", path.display())))?;
        let dry = run_xl(&me.cfg.xl, &["-N", "create", &path.to_string_lossy()], me.cfg.xl_timeout).map_err(unavailable)?;
        if !dry.ok {
            return Err(unavailable(format!("`xl -N create` refused the generated config: {}", dry.stderr.trim())));
        }
        // The image boots, or the backend is not offered (nothing set up yet).
        me.probe_boot_s = me.probe_boot().map_err(unavailable)?;
        me.net.setup()?;
        let (k, i) = me.appliance.sizes();
        tracing::info!(
            runtime = NAME,
            kernel_bytes = k,
            initramfs_bytes = i,
            free_memory_mib = free_mib,
            boot_to_init_ms = (me.probe_boot_s * 1000.0) as u64,
            "xen toolstack ready; the appliance boots"
        );
        Ok(me)
    }

    fn guest_mib(&self, spec: &InstanceSpec) -> u64 {
        (spec.limits.memory_bytes >> 20) + self.cfg.guest_extra_mib
    }

    fn console_log(&self, name: &str) -> PathBuf {
        self.cfg.console_dir.join(format!("guest-{name}.log"))
    }

    /// The xl config of a guest (see the module's documentation).
    fn guest_config_for(
        &self,
        name: &str,
        slot: u32,
        mem_mib: u64,
        cpu_millis: u32,
        boot: &Path,
        disk: &Path,
    ) -> Result<String, RuntimeError> {
        let guest = self.net.guest(slot)?;
        let cmdline = appliance::kernel_cmdline("hvc0", &guest, "/dev/xvda", None, "");
        let mac = format!("00:16:3e:{:02x}:{:02x}:{:02x}", (slot >> 16) & 0x7f, (slot >> 8) & 0xff, slot & 0xff);
        // A cap of 0 means "none" to Xen: at least 1 % of a CPU.
        let cap = (cpu_millis / 10).max(1);
        Ok(format!(
            r#"# Written by ec-edge (xen backend) at each start; `xl -N create` checks it.
name = "{name}"
type = "pvh"
kernel = "{kernel}"
ramdisk = "{boot}"
cmdline = "{cmdline}"
memory = {mem_mib}
maxmem = {mem_mib}
vcpus = 1
cap = {cap}
vif = [ "mac={mac},ip={ip},vifname={link},script={script}" ]
disk = [ "format=raw,vdev=xvda,access=rw,target={disk}" ]
on_poweroff = "preserve"
on_reboot = "preserve"
on_crash = "preserve"
on_watchdog = "preserve"
"#,
            kernel = xl_string(&self.appliance.kernel),
            boot = xl_string(boot),
            ip = guest.ip,
            link = self.net.link(slot),
            script = xl_string(&self.vif_script),
            disk = xl_string(disk),
        ))
    }

    /// The xl config of an instance.
    pub fn guest_config(&self, spec: &InstanceSpec) -> Result<String, RuntimeError> {
        self.guest_config_for(
            &domain_name(spec),
            spec.slot,
            self.guest_mib(spec),
            spec.limits.cpu_millis,
            &spec.state_dir.join("boot.cpio"),
            &spec.state_dir.join("store.img"),
        )
    }

    /// `xl <args>`, retried when `xl` died of a signal.
    fn xl(&self, args: &[&str]) -> Result<XlOut, RuntimeError> {
        let failed = |what: String| RuntimeError::Failed { runtime: NAME, what };
        let mut last = None;
        for attempt in 0..3 {
            let out = run_xl(&self.cfg.xl, args, self.cfg.xl_timeout).map_err(failed)?;
            if out.ok || !out.signalled {
                return Ok(out);
            }
            tracing::warn!(runtime = NAME, attempt, "`xl {}` died of a signal; trying again: {}", args.join(" "), out.stderr.trim());
            last = Some(out);
        }
        Ok(last.expect("three attempts"))
    }

    /// The domain of this name, if Xen has one (asked now).
    fn info(&self, name: &str) -> Option<DomainInfo> {
        let out = self.xl(&["list", "-v", name]).ok()?;
        out.ok.then(|| parse_list(&out.stdout, name)).flatten()
    }

    /// The domain of this name, from a listing of every domain at most
    /// [`LIST_MAX_AGE`] old (one `xl list` for all the watcher's readings).
    /// `None` also when `xl` could not list: the caller sees what it would
    /// have seen from [`Self::info`].
    fn info_listed(&self, name: &str) -> Option<DomainInfo> {
        let mut cached = self.listing.lock().unwrap_or_else(|p| p.into_inner());
        let fresh = cached.as_ref().is_some_and(|(at, _)| at.elapsed() < LIST_MAX_AGE);
        if !fresh {
            // Held while `xl` runs: concurrent readers wait for this listing instead of starting their own.
            *cached = self.xl(&["list", "-v"]).ok().filter(|o| o.ok).map(|o| (Instant::now(), o.stdout));
        }
        cached.as_ref().and_then(|(_, out)| parse_list(out, name))
    }

    /// Drops the shared listing after a change of ours (create, shutdown, destroy).
    fn relist(&self) {
        *self.listing.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }

    fn destroy(&self, name: &str) {
        self.relist();
        if self.info(name).is_some() {
            match self.xl(&["destroy", name]) {
                Ok(o) if !o.ok => tracing::warn!(runtime = NAME, "xl destroy {name}: {}", o.stderr.trim()),
                Err(e) => tracing::warn!(runtime = NAME, "xl destroy {name}: {e}"),
                _ => {}
            }
        }
    }

    /// Everything after the last boot marker of this instance's console.
    fn console_since_boot(&self, spec: &InstanceSpec) -> String {
        since_boot_mark(&self.console_log(&domain_name(spec)))
    }

    /// Watches a guest's console until it says `want` (the init's first
    /// words), the domain ends, or `timeout`.
    fn watch_boot(&self, name: &str, uuid: Option<&str>, want: &str, timeout: Duration) -> Boot {
        let log = self.console_log(name);
        let deadline = Instant::now() + timeout;
        loop {
            if since_boot_mark(&log).contains(want) {
                return Boot::Init;
            }
            let info = self.info(name);
            let why = match &info {
                None => Some("is gone".to_owned()),
                Some(d) if uuid.is_some_and(|u| u != d.uuid) => Some("is gone".to_owned()),
                Some(d) if d.state.contains('c') => Some("crashed".to_owned()),
                Some(d) if d.state.contains('s') => Some(shutdown_reason(d.reason).to_owned()),
                Some(_) => None,
            };
            if let Some(why) = why {
                // The init may have printed its line just before the end, and
                // xenconsoled may not have copied the last words yet.
                let console = settled_console(&log);
                if console.contains(want) {
                    return Boot::Init;
                }
                let said_why = console.contains("Kernel panic") || console.contains("ec-init: ");
                let xen_log = match (&info, said_why) {
                    (Some(d), false) => self.xl(&["dmesg"]).map(|o| hypervisor_lines(&o.stdout, d.domid, 8)).unwrap_or_default(),
                    _ => String::new(),
                };
                return Boot::Died { why, said_why, console, xen_log };
            }
            if Instant::now() >= deadline {
                return Boot::Timeout;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    /// Writes the boot marker into a guest's console log (and the instance's own log).
    fn mark_boot(&self, name: &str, extra: Option<&Path>, what: &str) {
        let _ = std::fs::create_dir_all(&self.cfg.console_dir);
        for log in std::iter::once(self.console_log(name)).chain(extra.map(Path::to_path_buf)) {
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(&log) {
                let _ = writeln!(f, "{BOOT_MARK} {what}");
            }
        }
    }

    /// The check boot (see the module's documentation): seconds from `xl
    /// create` to the init's `probe ok`, or why it did not get there with the
    /// console's last lines.
    fn probe_boot(&self) -> Result<f64, String> {
        let name = format!("{}probe", self.net.link_prefix);
        let cfg = format!(
            r#"# Written by ec-edge (xen backend): the check boot of the appliance.
name = "{name}"
type = "pvh"
kernel = "{kernel}"
ramdisk = "{initramfs}"
cmdline = "console=hvc0 quiet loglevel=1 panic=-1 ec.probe"
memory = 64
vcpus = 1
on_poweroff = "preserve"
on_reboot = "preserve"
on_crash = "preserve"
"#,
            kernel = xl_string(&self.appliance.kernel),
            initramfs = xl_string(&self.appliance.initramfs),
        );
        let path = self.run_dir.join("probe.cfg");
        std::fs::write(&path, cfg).map_err(|e| format!("{}: {e}", path.display()))?;
        let log = self.console_log(&name);
        let timeout = self.cfg.probe_timeout;
        let mut last = String::new();
        for attempt in 0..BOOT_ATTEMPTS {
            self.destroy(&name);
            self.mark_boot(&name, None, &format!("the appliance's check boot ({NAME}, attempt {})", attempt + 1));
            let t0 = Instant::now();
            let out = self.xl(&["create", &path.to_string_lossy()]).map_err(|e| e.to_string())?;
            if !out.ok {
                last = format!("`xl create` of the check guest failed: {}", out.stderr.trim());
                self.destroy(&name);
                if out.signalled {
                    continue;
                }
                break;
            }
            let boot = self.watch_boot(&name, None, "ec-init: probe ok", timeout);
            self.destroy(&name);
            match boot {
                Boot::Init => return Ok(t0.elapsed().as_secs_f64()),
                Boot::Timeout => {
                    let console = since_boot_mark(&log);
                    let hint = if log.is_file() {
                        String::new()
                    } else {
                        format!(
                            " ({} was not written: is xenconsoled logging guests' consoles there? Debian: XENCONSOLED_TRACE=guest)",
                            log.display()
                        )
                    };
                    last = format!(
                        "the appliance did not reach its init within {timeout:?}{hint}; the console's last lines:\n{}",
                        last_lines(&console, 15)
                    );
                    break;
                }
                Boot::Died { why, said_why, console, xen_log } => {
                    last = Boot::died_message(&format!("the check guest {why} before its init said `probe ok`"), &console, &xen_log);
                    if said_why {
                        break;
                    }
                    tracing::warn!(runtime = NAME, attempt, "the check guest {why} before its init started; booting it again");
                }
            }
        }
        Err(last)
    }

    fn ended(&self, spec: &InstanceSpec, xen_says: Option<&str>) -> Observed {
        let console = self.console_since_boot(spec);
        let why = appliance::exit_reason_from_console(&console);
        let reason = match (xen_says, why) {
            (Some(x), Some(w)) => format!("the guest {x}: {w}"),
            (Some(x), None) => {
                let last = console.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_owned();
                format!("the guest {x}: {last}")
            }
            (None, Some(w)) => format!("the domain is gone; the guest said: {w}"),
            (None, None) => return Observed::Gone,
        };
        Observed::Exited { reason }
    }
}

impl Runtime for XenRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Xen
    }

    fn start(&self, spec: &InstanceSpec) -> Result<Handle, RuntimeError> {
        let failed = |what: String| RuntimeError::Failed { runtime: NAME, what };
        let name = domain_name(spec);
        // A domain of an earlier run (preserved after it ended) holds the name.
        self.destroy(&name);
        appliance::ensure_state_disk(&spec.state_dir.join("store.img"), self.cfg.disk_mib, NAME)?;
        self.appliance.write_boot_initramfs(&spec.state_dir).map_err(|e| failed(format!("the boot initramfs: {e}")))?;
        let cfg_path = spec.state_dir.join("xl.cfg");
        std::fs::write(&cfg_path, self.guest_config(spec)?).map_err(|e| failed(format!("{}: {e}", cfg_path.display())))?;
        let guest = self.net.guest(spec.slot)?;
        let mut last = String::new();
        for attempt in 0..BOOT_ATTEMPTS {
            self.mark_boot(&name, Some(&spec.log_path), &format!("{} ({NAME}, guest {}, {} MiB)", spec.id, guest.ip, self.guest_mib(spec)));
            let out = self.xl(&["create", &cfg_path.to_string_lossy()])?;
            self.relist();
            if let (true, Some(info)) = (out.ok, self.info(&name)) {
                // The vif exists now (libxl waited for its hotplug script).
                let link = self
                    .net
                    .link_up(spec.slot)
                    .and_then(|()| self.net.forward(spec.slot, spec.device_addr.port(), spec.management_addr.port()));
                if let Err(e) = link {
                    self.destroy(&name);
                    return Err(e);
                }
                let handle = Handle { id: info.domid.to_string(), started: info.uuid };
                match self.watch_boot(&name, Some(&handle.started), "ec-init: ", self.cfg.init_timeout) {
                    Boot::Init => return Ok(handle),
                    Boot::Timeout => {
                        let console = self.console_since_boot(spec);
                        self.destroy(&name);
                        return Err(failed(format!(
                            "the guest {name} did not reach the appliance's init within {:?}; the console's last lines:\n{}",
                            self.cfg.init_timeout,
                            last_lines(&console, 15)
                        )));
                    }
                    Boot::Died { why, said_why, console, xen_log } => {
                        // Died before its init ran: the EPS never ran. Nested
                        // emulation has been seen to triple-fault a booting
                        // guest: boot it again, unless its kernel said why.
                        self.destroy(&name);
                        last = Boot::died_message(&format!("the guest {why} before the appliance's init started"), &console, &xen_log);
                        if said_why || attempt + 1 == BOOT_ATTEMPTS {
                            return Err(failed(last));
                        }
                        tracing::warn!(runtime = NAME, instance = %spec.id, attempt, "the guest {why} before its init started; booting it again");
                        continue;
                    }
                }
            }
            last = out.stderr.trim().to_owned();
            // A failed create may leave a half-built domain behind.
            self.destroy(&name);
            if !out.signalled {
                break;
            }
            tracing::warn!(runtime = NAME, attempt, "xl create {name} failed; trying again: {last}");
        }
        Err(failed(format!("xl create {name}: {last}")))
    }

    fn observe_period(&self) -> Duration {
        // Observations read a listing of every domain (`xl list`, a process talking to xenstored), shared and at most LIST_MAX_AGE old.
        Duration::from_secs(1)
    }

    fn observe(&self, spec: &InstanceSpec, handle: &Handle) -> Observed {
        match self.info_listed(&domain_name(spec)) {
            Some(d) if d.uuid != handle.started => Observed::Gone,
            Some(d) if d.state.contains('s') || d.state.contains('c') => {
                self.ended(spec, Some(if d.state.contains('c') { "crashed" } else { shutdown_reason(d.reason) }))
            }
            Some(_) => Observed::Running,
            None => self.ended(spec, None),
        }
    }

    fn stop(&self, spec: &InstanceSpec, handle: &Handle, grace: Duration) -> Result<(), RuntimeError> {
        let name = domain_name(spec);
        if self.observe(spec, handle) == Observed::Running {
            // A clean power-off first: the guest's kernel runs /sbin/poweroff (its init).
            let _ = self.xl(&["shutdown", &name]);
            self.relist();
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline && self.observe(spec, handle) == Observed::Running {
                std::thread::sleep(Duration::from_millis(250));
            }
            if self.observe(spec, handle) == Observed::Running {
                tracing::warn!(instance = %spec.id, "the guest did not power off within {grace:?}: destroying it");
            }
        }
        self.destroy(&name);
        match self.info(&name) {
            Some(d) if d.uuid == handle.started => {
                Err(RuntimeError::Failed { runtime: NAME, what: format!("xl destroy {name} did not remove it") })
            }
            _ => Ok(()),
        }
    }

    fn release(&self, spec: &InstanceSpec, _handle: Option<&Handle>) -> Result<(), RuntimeError> {
        self.destroy(&domain_name(spec));
        self.net.unforward(spec.device_addr.port(), spec.management_addr.port());
        let _ = std::fs::remove_file(spec.state_dir.join("boot.cpio"));
        let _ = std::fs::remove_file(spec.state_dir.join("xl.cfg"));
        Ok(())
    }

    fn adopt(&self, spec: &InstanceSpec, handle: &Handle) -> Option<Handle> {
        let running = self.observe(spec, handle) == Observed::Running;
        if running
            && self
                .net
                .link_up(spec.slot)
                .and_then(|()| self.net.forward(spec.slot, spec.device_addr.port(), spec.management_addr.port()))
                .is_ok()
        {
            Some(handle.clone())
        } else {
            let _ = self.release(spec, Some(handle));
            None
        }
    }

    fn memory_bytes(&self, spec: &InstanceSpec, handle: &Handle) -> Option<u64> {
        self.info_listed(&domain_name(spec)).filter(|d| d.uuid == handle.started).map(|d| d.mem_mib << 20)
    }

    fn shutdown(&self) {
        // The table forwards and isolates running guests: it goes only with the last of them.
        if !self.net.any_link() {
            self.net.teardown();
        }
    }

    fn eps_listen(&self, _spec: &InstanceSpec) -> (std::net::SocketAddr, std::net::SocketAddr) {
        (std::net::SocketAddr::from(([0, 0, 0, 0], GUEST_DEVICE_PORT)), std::net::SocketAddr::from(([0, 0, 0, 0], GUEST_MANAGEMENT_PORT)))
    }

    fn log_tail(&self, spec: &InstanceSpec, _handle: Option<&Handle>, lines: usize) -> String {
        // The guest's console is the EPS's log.
        tail_file(&self.console_log(&domain_name(spec)), lines)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_xl_list_verbose() {
        let out = "Name                                        ID   Mem VCPUs\tState\tTime(s)   UUID                            Reason-Code\tSecurity Label\n\
                   ec-alice-dropbox                             7    96     1     -b----       3.1 2f6c1a9e-0b6c-4d4e-9a51-7c1e2f3a4b5c        -                -\n\
                   ec-bob-default                               8    96     1     ---s--       9.0 11111111-2222-3333-4444-555555555555        0                -\n";
        let a = parse_list(out, "ec-alice-dropbox").unwrap();
        assert_eq!((a.domid, a.mem_mib, a.state.as_str(), a.reason), (7, 96, "-b----", None));
        assert_eq!(a.uuid, "2f6c1a9e-0b6c-4d4e-9a51-7c1e2f3a4b5c");
        let b = parse_list(out, "ec-bob-default").unwrap();
        assert_eq!((b.state.as_str(), b.reason), ("---s--", Some(0)));
        assert_eq!(shutdown_reason(b.reason), "powered off");
        assert!(parse_list(out, "ec-alice").is_none(), "a prefix is not a name");
    }

    #[test]
    fn the_generated_config() {
        let dir = tempfile::tempdir().unwrap();
        let app = Appliance { kernel: dir.path().join("vmlinux"), initramfs: dir.path().join("initramfs.cpio.lz4"), key: "k".into() };
        let net = VmNet::new(VmNetConfig::default(), dir.path(), "127.0.0.1".parse().unwrap(), NAME).unwrap();
        let x = XenRuntime {
            cfg: XenConfig::default(),
            appliance: app,
            vif_script: dir.path().join("ec-vif-route"),
            run_dir: dir.path().into(),
            net,
            probe_boot_s: 0.0,
            listing: Default::default(),
        };
        let c = x.guest_config_for("ec-alice-dropbox", 5, 96, 250, Path::new("/s/boot.cpio"), Path::new("/s/store.img")).unwrap();
        for want in [
            "name = \"ec-alice-dropbox\"",
            "type = \"pvh\"",
            "memory = 96",
            "cap = 25",
            "ramdisk = \"/s/boot.cpio\"",
            "ip=10.208.0.22,vifname=",
            "target=/s/store.img",
            "on_crash = \"preserve\"",
        ] {
            assert!(c.contains(want), "{want} missing from:\n{c}");
        }
        assert!(c.contains("console=hvc0") && c.contains("ec.ip=10.208.0.22/30 ec.gw=10.208.0.21 ec.disk=/dev/xvda"), "{c}");
        assert!(c.contains(&format!("vifname={}5,", x.net.link_prefix)), "{c}");
    }

    #[test]
    fn the_hypervisors_words_on_one_domain() {
        let dmesg = "(XEN) HVM d5v0 save: CPU\n\
                     (XEN) HVM5 restore: CPU 0\n\
                     (XEN) d5v0: upcall vector f3\n\
                     (XEN) d51v0 Triple fault - invoking HVM shutdown action 1\n\
                     (XEN) d5v0 Triple fault - invoking HVM shutdown action 1\n\
                     (XEN) *** Dumping CPU0 guest state (d5v0): ***\n\
                     (XEN) RIP:    0000:[<ffffffff8100002a>]\n\
                     (XEN) (d15) a line of another guest\n\
                     (XEN) (d5) the guest's own debug port\n";
        let got = hypervisor_lines(dmesg, 5, 8);
        assert_eq!(
            got,
            "(XEN) d5v0: upcall vector f3\n\
             (XEN) d5v0 Triple fault - invoking HVM shutdown action 1\n\
             (XEN) *** Dumping CPU0 guest state (d5v0): ***\n\
             (XEN) (d5) the guest's own debug port"
        );
        assert_eq!(hypervisor_lines(dmesg, 5, 1), "(XEN) (d5) the guest's own debug port");
        assert_eq!(hypervisor_lines(dmesg, 7, 8), "");
        let m = Boot::died_message("the guest asked for a reboot before the appliance's init started", "", &got);
        assert!(
            m.contains("last lines:\n(nothing)\nXen's log on the domain (xl dmesg):\n(XEN) d5v0: upcall") && m.contains("Triple fault"),
            "{m}"
        );
        assert!(!Boot::died_message("x", "ec-init: started", "").contains("Xen's log"));
    }

    #[test]
    fn a_console_is_read_once_it_has_stopped_growing() {
        // xenconsoled still copies a dead guest's last words into the log.
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("guest-ec-x.log");
        std::fs::write(&log, format!("old boot\n{BOOT_MARK} x\n")).unwrap();
        let writer = {
            let log = log.clone();
            std::thread::spawn(move || {
                for line in ["[    0.3] early", "Kernel panic - not syncing: Attempted to kill init!"] {
                    std::thread::sleep(Duration::from_millis(300));
                    let mut f = std::fs::OpenOptions::new().append(true).open(&log).unwrap();
                    writeln!(f, "{line}").unwrap();
                }
            })
        };
        let t0 = Instant::now();
        let console = settled_console(&log);
        writer.join().unwrap();
        assert!(console.starts_with(BOOT_MARK) && console.contains("Kernel panic"), "{console}");
        assert!(t0.elapsed() < CONSOLE_SETTLE + Duration::from_millis(500));
        // A log that does not grow is read after the quiet time alone.
        let t0 = Instant::now();
        assert!(settled_console(&log).contains("Kernel panic"));
        assert!(t0.elapsed() < CONSOLE_QUIET * 2, "{:?}", t0.elapsed());
    }

    #[test]
    fn the_vif_script_is_the_test_hosts() {
        assert!(VIF_SCRIPT.starts_with("#!/bin/sh") && VIF_SCRIPT.contains("hotplug-status"));
    }
}
