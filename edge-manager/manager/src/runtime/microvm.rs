//! The `microvm` backend: each EPS instance is the appliance (`unikernel/`:
//! a minimal kernel and an initramfs whose only programs are `/init` and
//! the static EPS) in its own QEMU microVM.
//!
//! # The VM
//! `qemu-system-x86_64 -M microvm` boots the uncompressed kernel through its
//! PVH entry (no firmware, no PCI: virtio over MMIO), with one vCPU and the
//! instance's memory. The accelerator is KVM where it works and TCG where it
//! does not, **decided by trying** when the backend starts: a probe boot
//! with KVM (a nested host may have `/dev/kvm` and still hang), then the
//! chosen accelerator boots the image once more, so that a broken image
//! makes the backend unavailable with the console's last lines instead of
//! failing every instance. Each QEMU process is started through
//! `ec-launcher` like an EPS process: its own cgroup (the guest's memory
//! plus QEMU's own overhead, the instance's CPU share and process count), its
//! own uid (the instance's files and tap belong to it), `setsid`.
//!
//! Devices: the state disk `store.img` (virtio-blk; flushes reach the host
//! file, so the store's fsyncs hold across a crash of either side); a tap
//! (virtio-net) routed by [`super::vmnet`]; the serial console (`ttyS0`),
//! which is the instance's log; a second serial port (`ttyS1`) on a unix
//! socket, the control line: `stop` asks the guest's init for a clean
//! power-off (the EPS gets SIGTERM, the disk is synced and unmounted); and
//! QEMU's monitor (QMP) on `qmp.sock` beside it, for an operator (the folder
//! is the instance uid's, mode 0700): its `inject-nmi` makes the guest's
//! kernel panic with a trace in the log (see `appliance::kernel_cmdline`
//! for the two settings that make it so), which the manager records as
//! a crash (`the guest's kernel crashed: Kernel panic - ...`) and restarts
//! as the instance's restart policy says.
//!
//! # Revocation
//! A clean power-off keeps the state disk; restore boots it again. QEMU's
//! own snapshot (savevm) is not used: a cold boot of the appliance takes
//! about 0.85 s under TCG and well under a second with KVM, and a snapshot
//! would hold the user's keys and documents in a second place.

use std::ffi::OsString;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::appliance::{self, Appliance};
use super::launcher::{Launch, Launcher};
use super::vmnet::{VmNet, VmNetConfig, GUEST_DEVICE_PORT, GUEST_MANAGEMENT_PORT};
use super::{tail_file, which, Handle, InstanceSpec, Observed, Runtime, RuntimeError, RuntimeKind};

const NAME: &str = "microvm";

/// Which accelerator to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AccelChoice {
    /// KVM if a probe boot with it works, else TCG.
    Auto,
    /// KVM only (the backend is unavailable without it).
    Kvm,
    /// TCG only.
    Tcg,
}

impl std::str::FromStr for AccelChoice {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "kvm" => Ok(Self::Kvm),
            "tcg" => Ok(Self::Tcg),
            other => Err(format!("{other}: auto, kvm or tcg")),
        }
    }
}

/// Whether identical pages of different guests share host memory, through
/// the kernel's samepage merging (KSM; QEMU marks guest RAM mergeable).
/// Every guest holds the same kernel and EPS binary: merged, they cost the
/// host once, not once per instance (docs/edge-manager.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryMerge {
    /// Turn KSM on when the host has it and it is off; go on without it otherwise.
    Auto,
    /// The same, but a host where KSM cannot be turned on makes the backend unavailable.
    On,
    /// Leave the host's KSM setting as it is.
    Off,
}

impl std::str::FromStr for MemoryMerge {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "on" => Ok(Self::On),
            "off" => Ok(Self::Off),
            other => Err(format!("{other}: auto, on or off")),
        }
    }
}

/// The kernel's KSM controls.
pub const KSM_DIR: &str = "/sys/kernel/mm/ksm";
/// The kernel's default scan rate (pages per 20 ms wake-up), and ours: 200 MB/s,
/// so that a few hundred guests are merged in minutes, not an hour (ksmd used
/// about 2 % of a core while 20 guests were being merged here).
const KSM_DEFAULT_PAGES: &str = "100";
const KSM_PAGES: &str = "1000";

/// Applies `choice` to the KSM controls under `dir`; what was done, for the log.
pub fn merge_memory(choice: MemoryMerge, dir: &Path) -> Result<String, String> {
    if choice == MemoryMerge::Off {
        return Ok("memory merging (KSM) left as the host has it (--vm-ksm off)".into());
    }
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).map(|s| s.trim().to_owned());
    let missing = |why: String| match choice {
        MemoryMerge::On => Err(format!("--vm-ksm on: {why}")),
        _ => Ok(format!("memory merging (KSM) is not used: {why}; every guest holds its own copy of the kernel and EPS")),
    };
    let run = match read("run") {
        Ok(r) => r,
        Err(e) => return missing(format!("{}: {e} (a kernel without CONFIG_KSM)", dir.join("run").display())),
    };
    if run == "1" {
        return Ok("memory merging (KSM) is on: identical guest pages are shared".into());
    }
    if let Err(e) = std::fs::write(dir.join("run"), "1") {
        return missing(format!("turning it on ({}): {e}", dir.join("run").display()));
    }
    let mut rate = String::new();
    if read("pages_to_scan").ok().as_deref() == Some(KSM_DEFAULT_PAGES) && std::fs::write(dir.join("pages_to_scan"), KSM_PAGES).is_ok() {
        rate = format!(", scanning {KSM_PAGES} pages per wake-up instead of {KSM_DEFAULT_PAGES}");
    }
    Ok(format!(
        "memory merging (KSM) turned on (it was {run}){rate}: identical guest pages (kernel, EPS binary) are shared; --vm-ksm off leaves the host's setting"
    ))
}

/// The accelerator in use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation.
    Kvm,
    /// QEMU's software emulation.
    Tcg,
}

impl Accel {
    /// Its name in logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }
}

/// Settings of the backend.
#[derive(Debug, Clone)]
pub struct MicrovmConfig {
    /// `qemu-system-x86_64`.
    pub qemu: PathBuf,
    /// Where `vmlinux` and `initramfs.cpio.lz4` are (`make appliance`).
    pub appliance_dir: PathBuf,
    /// The guests' network.
    pub net: VmNetConfig,
    /// Size of a new state disk, MiB (sparse: it costs what the store holds).
    pub disk_mib: u64,
    /// Accelerator.
    pub accel: AccelChoice,
    /// Guest memory beyond the instance's limit: the appliance's kernel and
    /// files (the EPS binary lives in the guest's memory).
    pub guest_extra_mib: u64,
    /// Host memory of the QEMU process beyond the guest's (its code, TCG's
    /// translation cache): the cgroup limit is guest + this.
    pub qemu_overhead_mib: u64,
    /// How long a probe boot may take.
    pub probe_timeout: Duration,
    /// TCG's translation cache per guest, MiB (host memory of every guest under TCG).
    pub tcg_cache_mib: u64,
    /// Whether guests share identical pages (KSM).
    pub memory_merge: MemoryMerge,
}

impl Default for MicrovmConfig {
    fn default() -> Self {
        Self {
            qemu: PathBuf::from("qemu-system-x86_64"),
            appliance_dir: PathBuf::new(),
            net: VmNetConfig::default(),
            disk_mib: 1536,
            accel: AccelChoice::Auto,
            guest_extra_mib: 32,
            qemu_overhead_mib: 64,
            probe_timeout: Duration::from_secs(30),
            tcg_cache_mib: 16,
            memory_merge: MemoryMerge::Auto,
        }
    }
}

/// The microvm backend.
#[derive(Debug)]
pub struct MicrovmRuntime {
    cfg: MicrovmConfig,
    launcher: Launcher,
    appliance: Appliance,
    net: VmNet,
    accel: Accel,
    /// Why KVM is not used (when it is not).
    pub accel_note: String,
    kvm_gid: Option<u32>,
    tsc_khz: Option<u64>,
    run_dir: PathBuf,
    /// Boot-to-init of the probe boot, seconds.
    pub probe_boot_s: f64,
}

/// Boots the image once with `ec.probe` and waits for `ec-init: probe ok`.
/// Returns the seconds it took, or the console's last lines.
fn probe_boot(qemu: &Path, app: &Appliance, accel: Accel, tsc: Option<u64>, timeout: Duration, tcg_cache_mib: u64) -> Result<f64, String> {
    let mut args = machine_args(accel, 64, tcg_cache_mib);
    let mut cmdline = "console=ttyS0 quiet loglevel=1 8250.nr_uarts=2 nokaslr mitigations=off no_timer_check panic=-1 ec.probe".to_owned();
    if let (Accel::Tcg, Some(k)) = (accel, tsc) {
        cmdline.push_str(&format!(" tsc=reliable tsc_early_khz={k}"));
    }
    args.extend(
        ["-kernel", &app.kernel.to_string_lossy(), "-initrd", &app.initramfs.to_string_lossy(), "-append", &cmdline]
            .iter()
            .map(|s| s.to_string()),
    );
    args.extend(["-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con"].iter().map(|s| s.to_string()));
    let t0 = Instant::now();
    let mut child = Command::new(qemu)
        .args(&args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", qemu.display()))?;
    // Read the console on a thread; the deadline is kept here.
    let mut out = child.stdout.take().expect("piped");
    let mut err = child.stderr.take().expect("piped");
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let tx2 = tx.clone();
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut out, &mut buf) {
            if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n) = std::io::Read::read(&mut err, &mut buf) {
            if n == 0 || tx2.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    });
    let mut console = Vec::new();
    let deadline = t0 + timeout;
    let mut ok_at = None;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left.min(Duration::from_millis(200))) {
            Ok(b) => console.extend_from_slice(&b),
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if ok_at.is_none() && console.windows(17).any(|w| w == b"ec-init: probe ok") {
            ok_at = Some(t0.elapsed().as_secs_f64());
        }
        if let Ok(Some(_)) = child.try_wait() {
            // Drain what is left.
            while let Ok(b) = rx.recv_timeout(Duration::from_millis(50)) {
                console.extend_from_slice(&b);
            }
            break;
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break;
        }
    }
    let text = String::from_utf8_lossy(&console);
    if text.contains("ec-init: probe ok") {
        return Ok(ok_at.unwrap_or_else(|| t0.elapsed().as_secs_f64()));
    }
    let last: Vec<&str> = text.lines().rev().take(15).collect::<Vec<_>>().into_iter().rev().collect();
    Err(format!(
        "the appliance did not reach its init within {:?} with {}; the console's last lines:\n{}",
        timeout,
        accel.name(),
        if last.is_empty() { "(nothing)".to_owned() } else { last.join("\n") }
    ))
}

/// Whether KVM boots the appliance on this host, decided by trying once per
/// host boot: a nested host may have `/dev/kvm` and still hang, which costs
/// the probe's whole timeout, so the verdict is remembered in
/// `/run/edgecourier/kvm-<boot id>-<image>` (tmpfs: forgotten at reboot).
fn kvm_verdict(qemu: &Path, app: &Appliance, tsc: Option<u64>) -> Result<f64, String> {
    std::fs::OpenOptions::new().read(true).write(true).open("/dev/kvm").map_err(|e| format!("/dev/kvm: {e}"))?;
    let boot_id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap_or_default();
    let memo = PathBuf::from("/run/edgecourier").join(format!("kvm-{}-{}", boot_id.trim(), app.key));
    if let Ok(text) = std::fs::read_to_string(&memo) {
        return match text.strip_prefix("ok ") {
            Some(t) => Ok(t.trim().parse().unwrap_or(0.0)),
            None => Err(format!("{} (remembered from an earlier probe since this host booted)", text.trim())),
        };
    }
    let verdict = probe_boot(qemu, app, Accel::Kvm, tsc, Duration::from_secs(10), MicrovmConfig::default().tcg_cache_mib);
    let _ = std::fs::create_dir_all("/run/edgecourier");
    let line = match &verdict {
        Ok(t) => format!("ok {t}"),
        Err(e) => e.lines().next().unwrap_or("KVM did not boot the appliance").to_owned(),
    };
    let _ = std::fs::write(&memo, line);
    verdict
}

/// What `ec-edge appliance check` reports: the accelerator that works, the
/// boot-to-init time, why KVM is not used, and the image's sizes.
#[derive(Debug)]
pub struct CheckReport {
    /// The accelerator chosen.
    pub accel: Accel,
    /// Seconds from QEMU's start to the init's first line.
    pub boot_s: f64,
    /// Why KVM is not used ("" when it is).
    pub note: String,
    /// Kernel and initramfs, bytes.
    pub sizes: (u64, u64),
}

/// Boots the appliance in `cfg.appliance_dir` once, as the backend's probe does.
pub fn check(cfg: &MicrovmConfig) -> Result<CheckReport, String> {
    let app = Appliance::find(&cfg.appliance_dir, NAME).map_err(|e| e.to_string())?;
    let (accel, boot_s, note) = decide_accel(cfg, &app, appliance::host_tsc_khz())?;
    Ok(CheckReport { accel, boot_s, note, sizes: app.sizes() })
}

/// Decides the accelerator by trying (see [`kvm_verdict`]) and boots the
/// image once with it: the accelerator, the boot-to-init seconds, and why
/// KVM is not used ("" when it is). Errors carry the console's last lines.
fn decide_accel(cfg: &MicrovmConfig, app: &Appliance, tsc: Option<u64>) -> Result<(Accel, f64, String), String> {
    let note = match cfg.accel {
        AccelChoice::Tcg => "TCG chosen by configuration".to_owned(),
        AccelChoice::Kvm => {
            let t = kvm_verdict(&cfg.qemu, app, tsc).map_err(|e| format!("KVM was required and does not work: {e}"))?;
            return Ok((Accel::Kvm, t, String::new()));
        }
        AccelChoice::Auto => match kvm_verdict(&cfg.qemu, app, tsc) {
            Ok(t) => return Ok((Accel::Kvm, t, String::new())),
            Err(e) => format!("KVM does not work here ({}): using TCG, QEMU's software emulation", e.lines().next().unwrap_or("")),
        },
    };
    let t = probe_boot(&cfg.qemu, app, Accel::Tcg, tsc, cfg.probe_timeout, cfg.tcg_cache_mib)?;
    Ok((Accel::Tcg, t, note))
}

fn machine_args(accel: Accel, mem_mib: u64, tcg_cache_mib: u64) -> Vec<String> {
    let mut a: Vec<String> = vec!["-M".into(), "microvm,rtc=on".into()];
    match accel {
        Accel::Kvm => a.extend(["-accel", "kvm", "-cpu", "host"].map(String::from)),
        // A small translation cache: hundreds of idle guests share the host.
        Accel::Tcg => a.extend(["-accel".into(), format!("tcg,tb-size={tcg_cache_mib}"), "-cpu".into(), "max".into()]),
    }
    a.extend(
        ["-m", &mem_mib.to_string(), "-smp", "1", "-nodefaults", "-no-user-config", "-display", "none", "-no-reboot"].map(String::from),
    );
    a
}

fn group_id(name: &str) -> Option<u32> {
    let text = std::fs::read_to_string("/etc/group").ok()?;
    text.lines().find_map(|l| {
        let mut f = l.split(':');
        (f.next()? == name).then(|| f.nth(1)?.parse().ok())?
    })
}

impl MicrovmRuntime {
    /// Checks QEMU, root, the network tools and the appliance, decides the
    /// accelerator by trying, and sets up the network table.
    pub fn probe(
        cfg: MicrovmConfig,
        launcher: &Path,
        isolate: bool,
        state_dir: &Path,
        advertise: std::net::IpAddr,
    ) -> Result<Self, RuntimeError> {
        let unavailable = |missing: String| RuntimeError::Unavailable { runtime: NAME, missing };
        let mut cfg = cfg;
        // The launcher execs without a PATH search: the absolute path.
        cfg.qemu = which(&cfg.qemu).ok_or_else(|| unavailable(format!("{} is missing (Debian's qemu-system-x86)", cfg.qemu.display())))?;
        if !isolate {
            return Err(unavailable("the microvm backend needs isolation (root: taps, nftables, cgroups)".into()));
        }
        let launcher = Launcher::probe(launcher, isolate, NAME)?;
        let net = VmNet::new(cfg.net.clone(), state_dir, advertise, NAME)?;
        let appliance = Appliance::find(&cfg.appliance_dir, NAME)?.install(state_dir, NAME)?;
        let tsc_khz = appliance::host_tsc_khz();
        let (accel, probe_boot_s, note) = decide_accel(&cfg, &appliance, tsc_khz).map_err(unavailable)?;
        if !note.is_empty() {
            tracing::warn!(runtime = NAME, "{note}");
        }
        let (k, i) = appliance.sizes();
        tracing::info!(
            runtime = NAME,
            accel = accel.name(),
            boot_ms = (probe_boot_s * 1000.0) as u64,
            kernel_bytes = k,
            initramfs_bytes = i,
            "appliance boots"
        );
        let merge = merge_memory(cfg.memory_merge, Path::new(KSM_DIR)).map_err(unavailable)?;
        tracing::info!(runtime = NAME, "{merge}");
        net.setup()?;
        let run_dir = PathBuf::from(format!("/run/{}", net.link_prefix.trim_end_matches('-')));
        std::fs::create_dir_all(&run_dir).map_err(|e| unavailable(format!("{}: {e}", run_dir.display())))?;
        let kvm_gid = if accel == Accel::Kvm { group_id("kvm") } else { None };
        Ok(Self { cfg, launcher, appliance, net, accel, accel_note: note, kvm_gid, tsc_khz, run_dir, probe_boot_s })
    }

    /// The accelerator in use.
    pub fn accel(&self) -> Accel {
        self.accel
    }

    /// The installed appliance.
    pub fn appliance(&self) -> &Appliance {
        &self.appliance
    }

    fn ctl_socket(&self, spec: &InstanceSpec) -> PathBuf {
        self.run_dir.join(spec.slot.to_string()).join("ctl.sock")
    }

    fn qmp_socket(&self, spec: &InstanceSpec) -> PathBuf {
        self.run_dir.join(spec.slot.to_string()).join("qmp.sock")
    }

    fn guest_mib(&self, spec: &InstanceSpec) -> u64 {
        (spec.limits.memory_bytes >> 20) + self.cfg.guest_extra_mib
    }

    /// Everything after the last boot marker of this instance's log.
    fn console_since_boot(&self, spec: &InstanceSpec) -> String {
        let tail = tail_file(&spec.log_path, 200);
        match tail.rfind(BOOT_MARK) {
            Some(i) => tail[i..].to_owned(),
            None => tail,
        }
    }

    /// The QEMU command line of an instance.
    fn qemu_args(&self, spec: &InstanceSpec, boot: &Path, guest: &appliance::GuestNet) -> Vec<OsString> {
        let mut extra = String::new();
        if let (Accel::Tcg, Some(k)) = (self.accel, self.tsc_khz) {
            extra = format!("tsc=reliable tsc_early_khz={k}");
        }
        // Report freed blocks from 128 KiB up (the default waits for whole 2 MiB blocks).
        extra.push_str(" page_reporting.page_reporting_order=5");
        let cmdline = appliance::kernel_cmdline("ttyS0", guest, "/dev/vda", Some("/dev/ttyS1"), &extra);
        let mac = format!("52:54:00:{:02x}:{:02x}:{:02x}", (spec.slot >> 16) & 0xff, (spec.slot >> 8) & 0xff, spec.slot & 0xff);
        let mut a: Vec<OsString> = vec![self.cfg.qemu.clone().into_os_string(), "-name".into(), format!("ec-{}", spec.id).into()];
        a.extend(machine_args(self.accel, self.guest_mib(spec), self.cfg.tcg_cache_mib).into_iter().map(OsString::from));
        a.extend(["-kernel".into(), self.appliance.kernel.clone().into_os_string(), "-initrd".into(), boot.as_os_str().to_owned()]);
        a.extend(["-append".into(), cmdline.into()]);
        a.extend(["-chardev", "stdio,id=con,signal=off", "-serial", "chardev:con"].map(OsString::from));
        a.extend([
            "-chardev".into(),
            format!("socket,id=ctl,path={},server=on,wait=off", self.ctl_socket(spec).display()).into(),
            "-device".into(),
            "isa-serial,chardev=ctl,index=1".into(),
        ]);
        a.extend(["-qmp".into(), format!("unix:{},server=on,wait=off", self.qmp_socket(spec).display()).into()]);
        a.extend([
            "-drive".into(),
            format!("id=store,file={},format=raw,if=none,cache=writeback,discard=unmap", spec.state_dir.join("store.img").display()).into(),
            "-device".into(),
            "virtio-blk-device,drive=store".into(),
        ]);
        // Pages the guest frees go back to the host (an idle guest costs
        // what it holds, not the most it ever touched).
        a.extend(["-device", "virtio-balloon-device,free-page-reporting=on"].map(OsString::from));
        a.extend([
            "-netdev".into(),
            // The tap, opened by the manager, arrives as fd 3 (see Launch::fd3).
            "tap,id=n0,fd=3".into(),
            "-device".into(),
            format!("virtio-net-device,netdev=n0,mac={mac}").into(),
        ]);
        a
    }
}

/// The line the manager writes into the log before each boot.
const BOOT_MARK: &str = "--- ec-edge: booting";

impl Runtime for MicrovmRuntime {
    fn kind(&self) -> RuntimeKind {
        RuntimeKind::Microvm
    }

    fn start(&self, spec: &InstanceSpec) -> Result<Handle, RuntimeError> {
        let failed = |what: String| RuntimeError::Failed { runtime: NAME, what };
        appliance::ensure_state_disk(&spec.state_dir.join("store.img"), self.cfg.disk_mib, NAME)?;
        let boot = self.appliance.write_boot_initramfs(&spec.state_dir).map_err(|e| failed(format!("the boot initramfs: {e}")))?;
        let slot_dir = self.run_dir.join(spec.slot.to_string());
        let _ = std::fs::remove_dir_all(&slot_dir);
        std::fs::create_dir_all(&slot_dir).map_err(|e| failed(format!("{}: {e}", slot_dir.display())))?;
        {
            use std::os::unix::fs::PermissionsExt;
            let c = std::ffi::CString::new(slot_dir.as_os_str().as_encoded_bytes()).map_err(|e| failed(e.to_string()))?;
            // SAFETY: a valid path; the folder becomes the instance's own.
            unsafe { libc::chown(c.as_ptr(), spec.uid, spec.gid) };
            let _ = std::fs::set_permissions(&slot_dir, std::fs::Permissions::from_mode(0o700));
        }
        let guest = self.net.tap_up(spec.slot, spec.uid, spec.gid, spec.device_addr.port(), spec.management_addr.port())?;
        if let Ok(mut log) = std::fs::OpenOptions::new().create(true).append(true).open(&spec.log_path) {
            let _ =
                writeln!(log, "{BOOT_MARK} {} ({NAME}, {}, guest {}, {} MiB)", spec.id, self.accel.name(), guest.ip, self.guest_mib(spec));
        }
        let program = self.qemu_args(spec, &boot, &guest);
        let memory_bytes = (self.guest_mib(spec) + self.cfg.qemu_overhead_mib) << 20;
        let tap = match self.net.open_tap(spec.slot) {
            Ok(t) => t,
            Err(e) => {
                self.net.tap_down(spec.slot, spec.device_addr.port(), spec.management_addr.port());
                return Err(e);
            }
        };
        use std::os::fd::AsRawFd;
        let launched = self
            .launcher
            .spawn(spec, Launch { program, env: vec![], memory_bytes, extra_gid: self.kvm_gid, fd3: Some(tap.as_raw_fd()), no_thp: true });
        drop(tap); // QEMU holds its own copy now
        match launched {
            Ok(h) => Ok(h),
            Err(e) => {
                self.net.tap_down(spec.slot, spec.device_addr.port(), spec.management_addr.port());
                Err(e)
            }
        }
    }

    fn observe(&self, spec: &InstanceSpec, handle: &Handle) -> Observed {
        match self.launcher.observe(spec, handle) {
            Observed::Exited { reason } => {
                let console = self.console_since_boot(spec);
                let why = appliance::exit_reason_from_console(&console);
                Observed::Exited {
                    reason: match (reason.as_str(), why) {
                        // panic=-1 reboots, and -no-reboot ends QEMU with code 0.
                        ("exited with code 0", Some(w)) if w.starts_with("Kernel panic") => format!("the guest's kernel crashed: {w}"),
                        ("exited with code 0", Some(w)) => format!("the guest powered off: {w}"),
                        ("exited with code 0", None) => "the guest powered off".into(),
                        (_, Some(w)) => format!("QEMU {reason}; the guest said: {w}"),
                        (_, None) => {
                            let last = console.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_owned();
                            format!("QEMU {reason}: {last}")
                        }
                    },
                }
            }
            o => o,
        }
    }

    fn stop(&self, spec: &InstanceSpec, handle: &Handle, grace: Duration) -> Result<(), RuntimeError> {
        if self.launcher.observe(spec, handle) != Observed::Running {
            return Ok(());
        }
        // A clean power-off through the guest's init first.
        if let Ok(mut s) = std::os::unix::net::UnixStream::connect(self.ctl_socket(spec)) {
            let _ = s.set_write_timeout(Some(Duration::from_secs(1)));
            let _ = s.write_all(b"stop\n");
            if self.launcher.wait_ended(spec, handle, grace) {
                return Ok(());
            }
            tracing::warn!(instance = %spec.id, "the guest did not power off within {grace:?}: stopping QEMU");
        }
        self.launcher.terminate(spec, handle, Duration::from_secs(2))
    }

    fn release(&self, spec: &InstanceSpec, _handle: Option<&Handle>) -> Result<(), RuntimeError> {
        self.net.tap_down(spec.slot, spec.device_addr.port(), spec.management_addr.port());
        let _ = std::fs::remove_dir_all(self.run_dir.join(spec.slot.to_string()));
        let _ = std::fs::remove_file(spec.state_dir.join("boot.cpio"));
        self.launcher.release(spec)
    }

    fn adopt(&self, spec: &InstanceSpec, handle: &Handle) -> Option<Handle> {
        if self.launcher.alive(handle) && self.net.forward(spec.slot, spec.device_addr.port(), spec.management_addr.port()).is_ok() {
            Some(handle.clone())
        } else {
            let _ = self.launcher.terminate(spec, handle, Duration::from_secs(1));
            let _ = self.release(spec, Some(handle));
            None
        }
    }

    fn memory_bytes(&self, spec: &InstanceSpec, handle: &Handle) -> Option<u64> {
        self.launcher.memory_bytes(spec, handle)
    }

    fn shutdown(&self) {
        // The table forwards and isolates running guests: it goes only with the last of them.
        if !self.net.any_link() {
            self.net.teardown();
            let _ = std::fs::remove_dir_all(&self.run_dir);
        }
    }

    fn eps_listen(&self, _spec: &InstanceSpec) -> (std::net::SocketAddr, std::net::SocketAddr) {
        (std::net::SocketAddr::from(([0, 0, 0, 0], GUEST_DEVICE_PORT)), std::net::SocketAddr::from(([0, 0, 0, 0], GUEST_MANAGEMENT_PORT)))
    }
}

#[cfg(test)]
mod tests {
    use super::{merge_memory, MemoryMerge};
    use std::fs::{read_to_string, write};

    fn ksm_dir(run: Option<&str>, pages: &str) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        if let Some(r) = run {
            write(d.path().join("run"), r).unwrap();
        }
        write(d.path().join("pages_to_scan"), pages).unwrap();
        d
    }

    #[test]
    fn ksm_is_turned_on_and_scans_faster_than_the_default() {
        let d = ksm_dir(Some("0\n"), "100\n");
        let note = merge_memory(MemoryMerge::Auto, d.path()).unwrap();
        assert_eq!(read_to_string(d.path().join("run")).unwrap(), "1");
        assert_eq!(read_to_string(d.path().join("pages_to_scan")).unwrap(), "1000");
        assert!(note.contains("turned on (it was 0)"), "{note}");
    }

    #[test]
    fn ksm_that_is_on_or_tuned_by_the_host_is_left_alone() {
        let d = ksm_dir(Some("1\n"), "100\n");
        assert!(merge_memory(MemoryMerge::On, d.path()).unwrap().contains("is on"));
        assert_eq!(read_to_string(d.path().join("pages_to_scan")).unwrap(), "100\n");
        let d = ksm_dir(Some("0\n"), "5000\n");
        merge_memory(MemoryMerge::Auto, d.path()).unwrap();
        assert_eq!(read_to_string(d.path().join("pages_to_scan")).unwrap(), "5000\n", "the host's own rate is kept");
        let d = ksm_dir(Some("0\n"), "100\n");
        assert!(merge_memory(MemoryMerge::Off, d.path()).unwrap().contains("left as the host has it"));
        assert_eq!(read_to_string(d.path().join("run")).unwrap(), "0\n");
    }

    #[test]
    fn a_host_without_ksm_is_an_error_only_when_it_was_asked_for() {
        let d = ksm_dir(None, "100");
        let note = merge_memory(MemoryMerge::Auto, d.path()).unwrap();
        assert!(note.contains("not used") && note.contains("CONFIG_KSM"), "{note}");
        let err = merge_memory(MemoryMerge::On, d.path()).unwrap_err();
        assert!(err.starts_with("--vm-ksm on:") && err.contains("CONFIG_KSM"), "{err}");
    }
}
