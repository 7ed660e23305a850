//! `/init` of the EdgeCourier appliance: the only program besides the EPS.
//!
//! Boot, in order (each step prints one `ec-init:` line on the console, which
//! the manager keeps as the instance's log):
//! 1. mount `/dev` (devtmpfs), `/proc`, `/sys`;
//! 2. read the kernel command line (`ec.*` keys, see [`Boot`]) and set the
//!    clock from `ec.time` if the guest has no better one (TLS needs it);
//! 3. bring up `lo` and `eth0` with `ec.ip` / `ec.gw`, write `ec.dns` into
//!    `/etc/resolv.conf`;
//! 4. mount the state disk `ec.disk` (ext4) on `/state/store`, owned by the
//!    EPS's uid (`ec.uid`); `/state/eps.json` and `/state/tls/` come from
//!    the per-instance part of the initramfs;
//! 5. run `/ec-eps serve --config /state/eps.json` as `ec.uid`.
//!
//! Shutdown: SIGTERM / SIGINT / SIGPWR to pid 1, `stop` on the control line
//! `ec.ctl` (QEMU: a serial port the manager writes to), or this same
//! binary called as `poweroff` (Xen's shutdown request runs
//! `/sbin/poweroff`): the EPS gets SIGTERM, then SIGKILL after `ec.grace`
//! seconds; the disk is synced and unmounted; the guest powers off. If the
//! EPS ends by itself, its status is printed and the guest powers off too:
//! the manager sees the instance end and reads why from the console.
//!
//! `ec.probe`: print `ec-init: probe ok` and power off at once (the manager's
//! boot test of an image and of an accelerator).
//!
//! `ec.reach=A:P,B:Q,...`: a network check instead of the EPS: once the
//! network is up, try a TCP connection to each (2 s each), print
//! `ec-init: reach A:P open|refused|timeout|unreachable (...)`, and power
//! off. The tests use it to show what a guest can and cannot reach; an
//! operator can use it to diagnose a guest's network.

use std::ffi::CString;
use std::io::{Read, Write};
use std::net::Ipv4Addr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

static STOP: AtomicBool = AtomicBool::new(false);

fn say(msg: &str) {
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "ec-init: {msg}");
    let _ = out.flush();
}

/// The `ec.*` keys of the kernel command line.
#[derive(Debug, Default)]
struct Boot {
    /// `ec.ip=A.B.C.D/len`
    ip: Option<(Ipv4Addr, u8)>,
    /// `ec.gw=A.B.C.D`
    gw: Option<Ipv4Addr>,
    /// `ec.dns=A.B.C.D[,E.F.G.H]`
    dns: Vec<Ipv4Addr>,
    /// `ec.disk=/dev/vda` (default) or `/dev/xvda`
    disk: Option<String>,
    /// `ec.uid=N` the EPS runs as (default 1000)
    uid: u32,
    /// `ec.ctl=/dev/ttyS1`: the control line
    ctl: Option<String>,
    /// `ec.time=<unix seconds>`: a lower bound for the clock
    time: Option<i64>,
    /// `ec.grace=<seconds>` between SIGTERM and SIGKILL of the EPS (default 10)
    grace: u64,
    /// `ec.probe`
    probe: bool,
    /// `ec.reach=A:P,...`
    reach: Vec<std::net::SocketAddrV4>,
}

fn parse_cmdline(text: &str) -> Result<Boot, String> {
    let mut b = Boot { uid: 1000, grace: 10, ..Boot::default() };
    for word in text.split_whitespace() {
        let (k, v) = word.split_once('=').unwrap_or((word, ""));
        let bad = |what: &str| format!("{k}={v}: {what}");
        match k {
            "ec.ip" => {
                let (a, l) = v.split_once('/').ok_or_else(|| bad("expected A.B.C.D/len"))?;
                let len: u8 = l.parse().map_err(|_| bad("bad prefix length"))?;
                if len > 32 {
                    return Err(bad("prefix length over 32"));
                }
                b.ip = Some((a.parse().map_err(|_| bad("bad address"))?, len));
            }
            "ec.gw" => b.gw = Some(v.parse().map_err(|_| bad("bad address"))?),
            "ec.dns" => {
                for a in v.split(',').filter(|s| !s.is_empty()) {
                    b.dns.push(a.parse().map_err(|_| bad("bad address"))?);
                }
            }
            "ec.disk" => b.disk = Some(v.to_owned()),
            "ec.uid" => b.uid = v.parse().map_err(|_| bad("not a number"))?,
            "ec.ctl" => b.ctl = Some(v.to_owned()),
            "ec.time" => b.time = Some(v.parse().map_err(|_| bad("not a number"))?),
            "ec.grace" => b.grace = v.parse().map_err(|_| bad("not a number"))?,
            "ec.probe" => b.probe = true,
            "ec.reach" => {
                for a in v.split(',').filter(|s| !s.is_empty()) {
                    b.reach.push(a.parse().map_err(|_| bad("expected A.B.C.D:PORT,..."))?);
                }
            }
            _ => {}
        }
    }
    Ok(b)
}

fn cstr(s: &str) -> CString {
    CString::new(s).expect("no NUL in a path")
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn mount(src: &str, target: &str, fstype: &str, flags: libc::c_ulong, data: &str) -> Result<(), String> {
    let _ = std::fs::create_dir_all(target);
    let (s, t, f, d) = (cstr(src), cstr(target), cstr(fstype), cstr(data));
    // SAFETY: valid NUL-terminated strings that outlive the call.
    let rc = unsafe { libc::mount(s.as_ptr(), t.as_ptr(), f.as_ptr(), flags, d.as_ptr().cast()) };
    if rc == 0 {
        Ok(())
    } else {
        Err(format!("mount {src} on {target} ({fstype}): {}", errno()))
    }
}

// ---- network, by ioctl (no netlink library in pid 1) ----

#[repr(C)]
struct IfReqAddr {
    name: [u8; libc::IFNAMSIZ],
    addr: libc::sockaddr_in,
    _pad: [u8; 8],
}

#[repr(C)]
struct IfReqFlags {
    name: [u8; libc::IFNAMSIZ],
    flags: libc::c_short,
    _pad: [u8; 22],
}

fn ifname(name: &str) -> [u8; libc::IFNAMSIZ] {
    let mut n = [0u8; libc::IFNAMSIZ];
    n[..name.len()].copy_from_slice(name.as_bytes());
    n
}

fn sockaddr(a: Ipv4Addr) -> libc::sockaddr_in {
    libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: 0,
        sin_addr: libc::in_addr { s_addr: u32::from(a).to_be() },
        sin_zero: [0; 8],
    }
}

struct Sock(libc::c_int);
impl Drop for Sock {
    fn drop(&mut self) {
        // SAFETY: our own descriptor.
        unsafe { libc::close(self.0) };
    }
}

fn sock() -> Result<Sock, String> {
    // SAFETY: plain syscall.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(format!("socket: {}", errno()));
    }
    Ok(Sock(fd))
}

fn ioctl<T>(s: &Sock, req: libc::c_ulong, arg: &mut T, what: &str) -> Result<(), String> {
    // SAFETY: `arg` is the structure the request expects (ifreq / rtentry layouts).
    let rc = unsafe { libc::ioctl(s.0, req as _, arg as *mut T) };
    if rc < 0 {
        Err(format!("{what}: {}", errno()))
    } else {
        Ok(())
    }
}

fn link_up(s: &Sock, name: &str) -> Result<(), String> {
    let mut r = IfReqFlags { name: ifname(name), flags: 0, _pad: [0; 22] };
    ioctl(s, libc::SIOCGIFFLAGS, &mut r, &format!("{name}: get flags"))?;
    r.flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
    ioctl(s, libc::SIOCSIFFLAGS, &mut r, &format!("{name}: up"))
}

fn network(b: &Boot) -> Result<(), String> {
    let s = sock()?;
    link_up(&s, "lo")?;
    let Some((ip, len)) = b.ip else {
        say("no ec.ip on the command line: only lo is up");
        return Ok(());
    };
    let mask = if len == 0 { 0 } else { u32::MAX << (32 - u32::from(len)) };
    let mut r = IfReqAddr { name: ifname("eth0"), addr: sockaddr(ip), _pad: [0; 8] };
    ioctl(&s, libc::SIOCSIFADDR, &mut r, "eth0: address")?;
    let mut r = IfReqAddr { name: ifname("eth0"), addr: sockaddr(Ipv4Addr::from(mask)), _pad: [0; 8] };
    ioctl(&s, libc::SIOCSIFNETMASK, &mut r, "eth0: netmask")?;
    // Announce the address (a gratuitous ARP) when eth0 comes up. The host
    // asks for it as soon as the manager polls /healthz, before the guest
    // can answer, and asks again only after a second (ARP's retransmit
    // time): the announcement answers the pending question at once
    // (0.29 -> 0.02 s from the EPS's ready line to the first /healthz under TCG).
    if let Err(e) = std::fs::write("/proc/sys/net/ipv4/conf/eth0/arp_notify", "1") {
        say(&format!("eth0: no gratuitous ARP (arp_notify: {e}): the host may wait up to a second to reach the guest"));
    }
    link_up(&s, "eth0")?;
    if let Some(gw) = b.gw {
        // SAFETY: rtentry is plain old data; zero is a valid value for every field.
        let mut rt: libc::rtentry = unsafe { std::mem::zeroed() };
        let any = sockaddr(Ipv4Addr::UNSPECIFIED);
        // SAFETY: sockaddr_in and sockaddr have the same size; the kernel reads them as sockaddr_in.
        unsafe {
            rt.rt_dst = std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(any);
            rt.rt_genmask = std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(any);
            rt.rt_gateway = std::mem::transmute::<libc::sockaddr_in, libc::sockaddr>(sockaddr(gw));
        }
        rt.rt_flags = (libc::RTF_UP | libc::RTF_GATEWAY) as libc::c_ushort;
        ioctl(&s, libc::SIOCADDRT, &mut rt, "default route")?;
    }
    if !b.dns.is_empty() {
        let text: String = b.dns.iter().map(|a| format!("nameserver {a}\n")).collect();
        let _ = std::fs::create_dir_all("/etc");
        std::fs::write("/etc/resolv.conf", text).map_err(|e| format!("/etc/resolv.conf: {e}"))?;
    }
    say(&format!("eth0 {ip}/{len} gateway {}", b.gw.map_or("none".into(), |g| g.to_string())));
    Ok(())
}

/// `ec.reach`: what a TCP connection to each address does.
fn reach(targets: &[std::net::SocketAddrV4]) {
    for t in targets {
        let verdict = match std::net::TcpStream::connect_timeout(&std::net::SocketAddr::V4(*t), Duration::from_secs(2)) {
            Ok(_) => "open".to_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => "refused".to_owned(),
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut || e.kind() == std::io::ErrorKind::WouldBlock => "timeout".to_owned(),
            Err(e) => format!("unreachable ({e})"),
        };
        say(&format!("reach {t} {verdict}"));
    }
}

fn set_clock(b: &Boot) {
    let Some(t) = b.time else { return };
    // SAFETY: plain syscalls with valid pointers.
    unsafe {
        let mut now: libc::timespec = std::mem::zeroed();
        libc::clock_gettime(libc::CLOCK_REALTIME, &mut now);
        if now.tv_sec < t {
            let ts = libc::timespec { tv_sec: t, tv_nsec: 0 };
            if libc::clock_settime(libc::CLOCK_REALTIME, &ts) == 0 {
                say(&format!("clock set from ec.time ({t}): the guest had no wall clock"));
            }
        }
    }
}

fn state_disk(b: &Boot) -> Result<(), String> {
    let disk = b.disk.as_deref().unwrap_or("/dev/vda");
    let deadline = Instant::now() + Duration::from_secs(5);
    while !std::path::Path::new(disk).exists() {
        if Instant::now() > deadline {
            return Err(format!("the state disk {disk} did not appear within 5 s"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // noinit_itable: the manager makes the disk a sparse file with lazily initialised inode
    // tables, whose unwritten blocks already read as zeros; the kernel's background zeroing would
    // only write 24 MiB of zeros per 1.5 GiB disk into the host's file (and spend the guest's CPU).
    mount(disk, "/state/store", "ext4", libc::MS_NOATIME | libc::MS_NODEV | libc::MS_NOSUID | libc::MS_NOEXEC, "noinit_itable")?;
    let p = cstr("/state/store");
    // SAFETY: valid path.
    if unsafe { libc::chown(p.as_ptr(), b.uid, b.uid) } != 0 {
        return Err(format!("chown /state/store: {}", errno()));
    }
    say(&format!("state disk {disk} on /state/store"));
    Ok(())
}

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// SIGALRM only interrupts the blocking wait (pid 1 ignores signals it has no handler for).
extern "C" fn on_alarm(_: libc::c_int) {}

fn handle_signals() {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGPWR, libc::SIGUSR1, libc::SIGALRM] {
        let handler: extern "C" fn(libc::c_int) = if sig == libc::SIGALRM { on_alarm } else { on_signal };
        // SAFETY: installing an async-signal-safe handler (it stores an atomic, or nothing).
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = handler as *const () as usize;
            sa.sa_flags = 0; // no SA_RESTART: a blocking waitpid returns EINTR
            libc::sigaction(sig, &sa, std::ptr::null_mut());
        }
    }
}

/// Reads the control line; `stop` asks pid 1 to shut down.
fn control_line(path: String) {
    std::thread::spawn(move || {
        let Ok(mut f) = std::fs::OpenOptions::new().read(true).open(&path) else {
            say(&format!("control line {path} cannot be opened: stop the guest by signal only"));
            return;
        };
        // SAFETY: raw mode on our own tty descriptor (no echo, no line editing).
        unsafe {
            use std::os::fd::AsRawFd;
            let mut t: libc::termios = std::mem::zeroed();
            if libc::tcgetattr(f.as_raw_fd(), &mut t) == 0 {
                libc::cfmakeraw(&mut t);
                libc::tcsetattr(f.as_raw_fd(), libc::TCSANOW, &t);
            }
        }
        let mut line = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            match f.read(&mut buf) {
                Ok(0) => std::thread::sleep(Duration::from_millis(200)),
                Ok(n) => {
                    line.extend_from_slice(&buf[..n]);
                    if line.windows(4).any(|w| w == b"stop") {
                        say("stop requested on the control line");
                        // SAFETY: signalling ourselves.
                        unsafe { libc::kill(1, libc::SIGTERM) };
                        return;
                    }
                    if line.len() > 256 {
                        line.drain(..line.len() - 8);
                    }
                }
                Err(_) => std::thread::sleep(Duration::from_millis(200)),
            }
        }
    });
}

fn spawn_eps(uid: u32) -> Result<libc::pid_t, String> {
    let prog = cstr("/ec-eps");
    let args = [cstr("/ec-eps"), cstr("serve"), cstr("--config"), cstr("/state/eps.json")];
    let mut argv: Vec<*const libc::c_char> = args.iter().map(|a| a.as_ptr()).collect();
    argv.push(std::ptr::null());
    // NO_COLOR: the console is a tty in here but a log file on the host.
    let env = [cstr("EC_EPS_LOG=info"), cstr("HOME=/state"), cstr("PATH=/"), cstr("NO_COLOR=1")];
    let mut envp: Vec<*const libc::c_char> = env.iter().map(|a| a.as_ptr()).collect();
    envp.push(std::ptr::null());
    // SAFETY: fork in a process whose other thread (the control line) holds no
    // lock the child needs: the child only calls async-signal-safe functions.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(format!("fork: {}", errno()));
    }
    if pid == 0 {
        // SAFETY: async-signal-safe calls only, then exec or _exit.
        unsafe {
            let mut sa: libc::sigaction = std::mem::zeroed();
            sa.sa_sigaction = libc::SIG_DFL;
            for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGPWR, libc::SIGUSR1, libc::SIGALRM] {
                libc::sigaction(sig, &sa, std::ptr::null_mut());
            }
            libc::setsid();
            if libc::setgroups(0, std::ptr::null()) != 0 || libc::setgid(uid) != 0 || libc::setuid(uid) != 0 {
                libc::_exit(126);
            }
            let dir = c"/state".as_ptr();
            libc::chdir(dir);
            libc::execve(prog.as_ptr(), argv.as_ptr(), envp.as_ptr());
            libc::_exit(127);
        }
    }
    Ok(pid)
}

fn describe(status: libc::c_int) -> String {
    if libc::WIFEXITED(status) {
        match libc::WEXITSTATUS(status) {
            126 => "could not drop to its uid (exit 126)".into(),
            127 => "could not be executed (exit 127)".into(),
            c => format!("exited with code {c}"),
        }
    } else if libc::WIFSIGNALED(status) {
        format!("killed by signal {}", libc::WTERMSIG(status))
    } else {
        format!("ended (status {status})")
    }
}

fn power_off(why: &str) -> ! {
    say(&format!("powering off: {why}"));
    // SAFETY: plain syscalls.
    unsafe {
        libc::sync();
        let p = cstr("/state/store");
        libc::umount2(p.as_ptr(), 0);
        libc::sync();
        libc::reboot(libc::RB_POWER_OFF);
    }
    // reboot() returned: nothing else to do but wait for the hypervisor.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn main() {
    // Called as `poweroff` (Xen's shutdown request, `orderly_poweroff`): ask pid 1.
    let argv0 = std::env::args().next().unwrap_or_default();
    if argv0.ends_with("poweroff") || argv0.ends_with("halt") {
        // SAFETY: plain syscall.
        unsafe { libc::kill(1, libc::SIGTERM) };
        return;
    }
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != 1 {
        eprintln!("ec-init is the appliance's pid 1 (and `poweroff` inside it); it does nothing elsewhere");
        std::process::exit(2);
    }
    let uptime = std::fs::read_to_string("/proc/uptime").ok();
    for (src, target, fs) in [("devtmpfs", "/dev", "devtmpfs"), ("proc", "/proc", "proc"), ("sysfs", "/sys", "sysfs")] {
        if let Err(e) = mount(src, target, fs, libc::MS_NOSUID | libc::MS_NOEXEC, "") {
            say(&e);
        }
    }
    let uptime = uptime.or_else(|| std::fs::read_to_string("/proc/uptime").ok()).unwrap_or_default();
    say(&format!("started {} s after the kernel", uptime.split_whitespace().next().unwrap_or("?")));
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let boot = match parse_cmdline(&cmdline) {
        Ok(b) => b,
        Err(e) => power_off(&format!("bad kernel command line: {e}")),
    };
    if boot.probe {
        say("probe ok");
        power_off("probe");
    }
    handle_signals();
    set_clock(&boot);
    if let Err(e) = network(&boot) {
        power_off(&format!("network: {e}"));
    }
    if !boot.reach.is_empty() {
        reach(&boot.reach);
        power_off("network check done");
    }
    if let Err(e) = state_disk(&boot) {
        power_off(&e);
    }
    if let Some(ctl) = boot.ctl.clone() {
        control_line(ctl);
    }
    let eps = match spawn_eps(boot.uid) {
        Ok(p) => p,
        Err(e) => power_off(&format!("the EPS could not start: {e}")),
    };
    say(&format!("the EPS runs as uid {} (pid {eps})", boot.uid));
    let mut stopping: Option<Instant> = None;
    loop {
        if STOP.load(Ordering::SeqCst) && stopping.is_none() {
            say("stopping the EPS (SIGTERM)");
            // SAFETY: signalling our child.
            unsafe { libc::kill(eps, libc::SIGTERM) };
            stopping = Some(Instant::now());
        }
        if let Some(t) = stopping {
            if t.elapsed() > Duration::from_secs(boot.grace) {
                say("the EPS did not stop in time: SIGKILL");
                // SAFETY: as above.
                unsafe { libc::kill(eps, libc::SIGKILL) };
            }
            // SAFETY: alarm only interrupts the wait below, so the grace is checked.
            unsafe { libc::alarm(1) };
        }
        let mut status = 0;
        // SAFETY: plain syscall; blocks until a child ends or a signal arrives.
        let pid = unsafe { libc::waitpid(-1, &mut status, 0) };
        if pid == eps {
            let why = describe(status);
            if stopping.is_some() {
                power_off(&format!("the EPS stopped ({why})"));
            }
            power_off(&format!("the EPS ended by itself: {why}"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn command_line() {
        let b = parse_cmdline("console=ttyS0 quiet ec.ip=10.208.0.6/30 ec.gw=10.208.0.5 ec.dns=1.1.1.1,9.9.9.9 ec.uid=4242 ec.ctl=/dev/ttyS1 ec.time=1800000000 ec.probe").unwrap();
        assert_eq!(b.ip, Some(("10.208.0.6".parse().unwrap(), 30)));
        assert_eq!(b.gw, Some("10.208.0.5".parse().unwrap()));
        assert_eq!(b.dns.len(), 2);
        assert_eq!(b.uid, 4242);
        assert_eq!(b.ctl.as_deref(), Some("/dev/ttyS1"));
        assert_eq!(b.time, Some(1_800_000_000));
        assert!(b.probe);
        assert_eq!(b.grace, 10);
        let r = parse_cmdline("ec.reach=10.208.0.6:8443,127.0.0.1:8440").unwrap();
        assert_eq!(r.reach.len(), 2);
        assert!(parse_cmdline("ec.reach=nowhere").is_err());
        assert!(parse_cmdline("ec.ip=10.0.0.1").unwrap_err().contains("A.B.C.D/len"));
        assert!(parse_cmdline("ec.ip=10.0.0.1/33").is_err());
        assert!(parse_cmdline("ec.uid=root").unwrap_err().starts_with("ec.uid=root"));
    }
}
