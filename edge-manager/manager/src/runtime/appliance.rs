//! The EPS appliance as the VM backends (`microvm`, `xen`) boot it: a
//! kernel, the base initramfs (`/init` and `/ec-eps`, built by
//! `unikernel/build`), and per instance an initramfs segment with its
//! configuration and a state disk with its last-synced store.
//!
//! Per instance, in its state folder:
//! - `boot.cpio`: the instance's own segment (`/state/eps.json`,
//!   `/state/tls/*`), then the base initramfs; the kernel unpacks
//!   concatenated archives in order. Rewritten at every start (the listen addresses and
//!   keys live in eps.json); owner-only, like the rest of the folder.
//! - `store.img`: an ext4 image, sparse, made once (`mkfs.ext4`), mounted by
//!   the guest's init on `/state/store`. It is the instance's store: it
//!   survives revocation and is deleted only with the instance.

use std::io::Write;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;

use sha2::{Digest, Sha256};

use super::RuntimeError;

/// The uid the EPS runs as inside the guest (the guest is its own world).
pub const GUEST_UID: u32 = 1000;

/// The appliance's files, as the manager keeps them (readable by every
/// instance's uid: its own copy under the manager's state folder).
#[derive(Debug, Clone)]
pub struct Appliance {
    /// The uncompressed, PVH-bootable kernel.
    pub kernel: PathBuf,
    /// The base initramfs (newc cpio, gzip or not).
    pub initramfs: PathBuf,
    /// A digest of both (names the installed copy).
    pub key: String,
}

impl Appliance {
    /// Finds `vmlinux` and `initramfs.cpio.lz4` (or `.gz`, or uncompressed) in `dir`.
    pub fn find(dir: &Path, runtime: &'static str) -> Result<Self, RuntimeError> {
        let unavailable = |missing: String| RuntimeError::Unavailable { runtime, missing };
        let kernel = dir.join("vmlinux");
        let initramfs = ["initramfs.cpio.lz4", "initramfs.cpio.gz", "initramfs.cpio"].iter().map(|n| dir.join(n)).find(|p| p.is_file());
        let (Some(initramfs), true) = (initramfs, kernel.is_file()) else {
            return Err(unavailable(format!(
                "no appliance in {} (vmlinux and initramfs.cpio.lz4): `make appliance` builds it",
                dir.display()
            )));
        };
        let k = std::fs::read(&kernel).map_err(|e| unavailable(format!("{}: {e}", kernel.display())))?;
        let i = std::fs::read(&initramfs).map_err(|e| unavailable(format!("{}: {e}", initramfs.display())))?;
        if k.get(..4) != Some(b"\x7fELF") {
            return Err(unavailable(format!("{} is not an ELF kernel (the uncompressed vmlinux is needed)", kernel.display())));
        }
        let mut h = Sha256::new();
        h.update(&k);
        h.update(&i);
        let key = hex::encode(&h.finalize()[..8]);
        Ok(Self { kernel, initramfs, key })
    }

    /// Installs a copy under `<state>/appliance/<key>/`, readable by every
    /// instance's uid (the manager's state folder is traversable).
    pub fn install(&self, state: &Path, runtime: &'static str) -> Result<Self, RuntimeError> {
        let key = self.key.clone();
        let read = |p: &Path| std::fs::read(p).map_err(|e| RuntimeError::Failed { runtime, what: format!("{}: {e}", p.display()) });
        let (k, i) = (read(&self.kernel)?, read(&self.initramfs)?);
        let to = state.join("appliance").join(&key);
        let name = self.initramfs.file_name().expect("a file name").to_owned();
        if !to.join("vmlinux").is_file() || !to.join(&name).is_file() {
            let tmp = state.join("appliance").join(format!(".{key}.tmp"));
            let _ = std::fs::remove_dir_all(&tmp);
            let copy = || -> std::io::Result<()> {
                std::fs::create_dir_all(&tmp)?;
                std::fs::write(tmp.join("vmlinux"), &k)?;
                std::fs::write(tmp.join(&name), &i)?;
                use std::os::unix::fs::PermissionsExt;
                for p in [state.join("appliance"), tmp.clone()] {
                    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755))?;
                }
                for f in [tmp.join("vmlinux"), tmp.join(&name)] {
                    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644))?;
                }
                let _ = std::fs::remove_dir_all(&to);
                std::fs::rename(&tmp, &to)
            };
            copy().map_err(|e| RuntimeError::Failed { runtime, what: format!("installing the appliance into {}: {e}", to.display()) })?;
        }
        Ok(Self { kernel: to.join("vmlinux"), initramfs: to.join(name), key })
    }

    /// Sizes of the kernel and the base initramfs, bytes.
    pub fn sizes(&self) -> (u64, u64) {
        let size = |p: &Path| std::fs::metadata(p).map(|m| m.len()).unwrap_or(0);
        (size(&self.kernel), size(&self.initramfs))
    }

    /// Writes `<state_dir>/boot.cpio`: a segment with the instance's
    /// `eps.json` and `tls/` (owned by [`GUEST_UID`], owner-only), then the
    /// base initramfs.
    pub fn write_boot_initramfs(&self, state_dir: &Path) -> std::io::Result<PathBuf> {
        let mut c = Cpio::default();
        // The EPS's state folder (it makes its own sub-folders there).
        c.dir("state", 0o700, GUEST_UID);
        c.file("state/eps.json", 0o400, GUEST_UID, &std::fs::read(state_dir.join("eps.json"))?);
        let tls = state_dir.join("tls");
        if tls.is_dir() {
            c.dir("state/tls", 0o500, GUEST_UID);
            let mut names: Vec<_> = std::fs::read_dir(&tls)?.filter_map(Result::ok).map(|e| e.path()).collect();
            names.sort();
            for p in names.iter().filter(|p| p.is_file()) {
                let name = p.file_name().and_then(|n| n.to_str()).unwrap_or("");
                if !name.is_empty() && !name.contains('/') {
                    c.file(&format!("state/tls/{name}"), 0o400, GUEST_UID, &std::fs::read(p)?);
                }
            }
        }
        // The instance's segment first, then the base: the kernel unpacks
        // concatenated archives in order, and a compressed one must come
        // last (an lz4 stream has no end marker: it runs to the end).
        let mut out = c.finish();
        out.extend_from_slice(&std::fs::read(&self.initramfs)?);
        let path = state_dir.join("boot.cpio");
        let tmp = state_dir.join(".boot.cpio.tmp");
        {
            use std::os::unix::fs::OpenOptionsExt;
            let mut f = std::fs::OpenOptions::new().create(true).truncate(true).write(true).mode(0o600).open(&tmp)?;
            f.write_all(&out)?;
        }
        std::fs::rename(&tmp, &path)?;
        Ok(path)
    }
}

/// Makes the instance's state disk if it does not exist yet: a sparse ext4
/// image of `size_mib`, its root owned by the guest's EPS uid.
pub fn ensure_state_disk(path: &Path, size_mib: u64, runtime: &'static str) -> Result<(), RuntimeError> {
    if path.is_file() {
        return Ok(());
    }
    let failed = |what: String| RuntimeError::Failed { runtime, what };
    let tmp = path.with_extension("img.tmp");
    let _ = std::fs::remove_file(&tmp);
    let out = Command::new("mkfs.ext4")
        .args(["-q", "-F", "-m", "0", "-L", "ec-store", "-E"])
        .arg(format!("root_owner={GUEST_UID}:{GUEST_UID},lazy_itable_init=1,lazy_journal_init=1"))
        .arg(&tmp)
        .arg(format!("{size_mib}M"))
        .output()
        .map_err(|e| failed(format!("mkfs.ext4 (Debian's e2fsprogs) could not run: {e}")))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(failed(format!("mkfs.ext4 {}: {}", tmp.display(), String::from_utf8_lossy(&out.stderr).trim())));
    }
    std::fs::rename(&tmp, path).map_err(|e| failed(format!("{}: {e}", path.display())))
}

/// The `ec.*` part of the kernel command line (read by `unikernel/init`).
#[derive(Debug, Clone)]
pub struct GuestNet {
    /// The guest's address and prefix length.
    pub ip: Ipv4Addr,
    /// Prefix length.
    pub prefix: u8,
    /// Its gateway (the host side of its link).
    pub gw: Ipv4Addr,
}

/// The kernel command line of an instance.
pub fn kernel_cmdline(console: &str, net: &GuestNet, disk: &str, ctl: Option<&str>, extra: &str) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut s = format!(
        "console={console} quiet loglevel=1 8250.nr_uarts=2 nokaslr mitigations=off no_timer_check random.trust_cpu=on panic=-1 \
         ec.ip={}/{} ec.gw={} ec.disk={disk} ec.uid={GUEST_UID} ec.time={now}",
        net.ip, net.prefix, net.gw
    );
    if let Some(c) = ctl {
        s.push_str(&format!(" ec.ctl={c}"));
    }
    if !extra.is_empty() {
        s.push(' ');
        s.push_str(extra);
    }
    s
}

/// Why the guest ended, from the console: the last `ec-init: powering off:`
/// line, or the kernel's panic line.
pub fn exit_reason_from_console(tail: &str) -> Option<String> {
    tail.lines().rev().find_map(|l| {
        if let Some(i) = l.find("ec-init: powering off: ") {
            Some(l[i + "ec-init: powering off: ".len()..].trim().to_owned())
        } else {
            l.find("Kernel panic").map(|i| l[i..].trim().to_owned())
        }
    })
}

/// A newc ("070701") cpio archive, as the kernel's initramfs unpacker reads it.
#[derive(Debug, Default)]
pub struct Cpio {
    out: Vec<u8>,
    ino: u32,
}

impl Cpio {
    fn entry(&mut self, name: &str, mode: u32, uid: u32, data: &[u8], rdev: (u32, u32)) {
        self.ino += 1;
        let nlink = if mode & 0o170000 == 0o040000 { 2 } else { 1 };
        let header = format!(
            "070701{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}{:08X}",
            self.ino,
            mode,
            uid,
            uid,
            nlink,
            0,
            data.len(),
            0,
            0,
            rdev.0,
            rdev.1,
            name.len() + 1,
            0
        );
        self.out.extend_from_slice(header.as_bytes());
        self.out.extend_from_slice(name.as_bytes());
        self.out.push(0);
        self.pad();
        self.out.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while self.out.len() % 4 != 0 {
            self.out.push(0);
        }
    }

    /// A folder.
    pub fn dir(&mut self, name: &str, perm: u32, uid: u32) {
        self.entry(name, 0o040000 | perm, uid, &[], (0, 0));
    }

    /// A regular file.
    pub fn file(&mut self, name: &str, perm: u32, uid: u32, data: &[u8]) {
        self.entry(name, 0o100000 | perm, uid, data, (0, 0));
    }

    /// A symbolic link.
    pub fn symlink(&mut self, name: &str, target: &str) {
        self.entry(name, 0o120777, 0, target.as_bytes(), (0, 0));
    }

    /// A character device node.
    pub fn char_dev(&mut self, name: &str, perm: u32, major: u32, minor: u32) {
        self.entry(name, 0o020000 | perm, 0, &[], (major, minor));
    }

    /// The archive, with its trailer.
    pub fn finish(mut self) -> Vec<u8> {
        self.entry("TRAILER!!!", 0, 0, &[], (0, 0));
        self.out
    }
}

/// The base initramfs of the appliance: `/init` (ec-init, also
/// `/sbin/poweroff`), `/ec-eps`, `/dev/console`, and the empty folders
/// (`/state` comes with each instance's segment, owned by the EPS's uid).
pub fn base_initramfs(init: &[u8], eps: &[u8]) -> Vec<u8> {
    let mut c = Cpio::default();
    for d in ["dev", "proc", "sys", "sbin", "etc", "tmp"] {
        c.dir(d, 0o755, 0);
    }
    c.char_dev("dev/console", 0o600, 5, 1);
    c.char_dev("dev/null", 0o666, 1, 3);
    c.file("init", 0o755, 0, init);
    c.symlink("sbin/poweroff", "/init");
    c.file("ec-eps", 0o755, 0, eps);
    c.finish()
}

/// The host's TSC frequency in kHz (a TCG guest reads the host's TSC; without
/// `tsc_early_khz` a loaded host makes its calibration hang).
pub fn host_tsc_khz() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let mhz: f64 = text.lines().find(|l| l.starts_with("cpu MHz"))?.split(':').nth(1)?.trim().parse().ok()?;
    Some((mhz * 1000.0).round() as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpio_is_newc_and_aligned() {
        let mut c = Cpio::default();
        // The EPS's state folder (it makes its own sub-folders there).
        c.dir("state", 0o700, GUEST_UID);
        c.file("state/eps.json", 0o400, 1000, b"{}");
        let a = c.finish();
        assert_eq!(&a[..6], b"070701");
        assert_eq!(a.len() % 4, 0);
        // The mode and owner of the file, as cpio(1) would list them.
        let second = a.windows(6).enumerate().filter(|(_, w)| w == b"070701").nth(1).unwrap().0;
        assert_eq!(&a[second + 14..second + 22], b"00008100");
        assert_eq!(u32::from_str_radix(std::str::from_utf8(&a[second + 22..second + 30]).unwrap(), 16).unwrap(), 1000);
        assert!(a.windows(10).any(|w| w == b"TRAILER!!!"));
    }

    #[test]
    fn cpio_reads_back_with_gnu_cpio() {
        // GNU cpio comes with scripts/setup-system: missing, the test fails rather than skips.
        let out = Command::new("cpio").arg("--version").output().expect("GNU cpio (scripts/setup-system installs it)");
        assert!(out.status.success());
        let dir = tempfile::tempdir().unwrap();
        let a = base_initramfs(b"#init", b"#eps");
        let arc = dir.path().join("a.cpio");
        std::fs::write(&arc, &a).unwrap();
        let out = Command::new("sh").arg("-c").arg(format!("cpio -it < {}", arc.display())).output().unwrap();
        let list = String::from_utf8_lossy(&out.stdout);
        for want in ["init", "ec-eps", "sbin/poweroff", "dev/console", "etc"] {
            assert!(list.lines().any(|l| l == want), "{want} missing from {list}");
        }
    }

    #[test]
    fn exit_reason() {
        let tail = "x\nec-init: powering off: the EPS ended by itself: exited with code 1\n[ 1.0] reboot: Power down";
        assert_eq!(exit_reason_from_console(tail).as_deref(), Some("the EPS ended by itself: exited with code 1"));
        assert_eq!(exit_reason_from_console("[0.5] Kernel panic - not syncing: VFS").as_deref(), Some("Kernel panic - not syncing: VFS"));
        assert_eq!(exit_reason_from_console("nothing"), None);
    }

    #[test]
    fn cmdline_has_the_network() {
        let n = GuestNet { ip: "10.208.0.2".parse().unwrap(), prefix: 30, gw: "10.208.0.1".parse().unwrap() };
        let s = kernel_cmdline("ttyS0", &n, "/dev/vda", Some("/dev/ttyS1"), "tsc_early_khz=2000000");
        assert!(s.contains("ec.ip=10.208.0.2/30 ec.gw=10.208.0.1 ec.disk=/dev/vda"));
        assert!(s.contains("ec.ctl=/dev/ttyS1"));
        assert!(s.ends_with("tsc_early_khz=2000000"));
    }
}
