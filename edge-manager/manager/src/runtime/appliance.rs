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
///
/// `panic=-1` reboots at once after a panic (QEMU's `-no-reboot` and Xen's
/// `on_reboot` then end the guest, and the manager sees a crash);
/// `unknown_nmi_panic` and `panic_on_unrecovered_nmi` make an NMI from
/// outside (QMP `inject-nmi`, `xl trigger <domain> nmi`) a kernel panic,
/// with its trace on the console: an operator's way to end a wedged guest
/// with a record of where it was. (Both: on microvm the NMI reason port
/// reads 0xff, so the kernel takes the NMI for a PCI system error, not an
/// unknown one.)
pub fn kernel_cmdline(console: &str, net: &GuestNet, disk: &str, ctl: Option<&str>, extra: &str) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut s = format!(
        "console={console} quiet loglevel=1 8250.nr_uarts=2 nokaslr mitigations=off no_timer_check random.trust_cpu=on panic=-1 unknown_nmi_panic \
         sysctl.kernel.panic_on_unrecovered_nmi=1 \
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
///
/// A panic that reboots may print the same line twice (`Kernel panic - not
/// syncing: X` and `---[ end Kernel panic - not syncing: X ]---`): both give
/// the same reason.
pub fn exit_reason_from_console(tail: &str) -> Option<String> {
    tail.lines().rev().find_map(|l| {
        if let Some(i) = l.find("ec-init: powering off: ") {
            Some(l[i + "ec-init: powering off: ".len()..].trim().to_owned())
        } else {
            l.find("Kernel panic").map(|i| l[i..].trim().trim_end_matches("]---").trim_end().to_owned())
        }
    })
}

/// Rewrites an x86-64 kernel ELF (`vmlinux`) with its loadable segments
/// packed at page alignment in the file.
///
/// The kernel links with 2 MiB alignment (`-z max-page-size=0x200000`), so
/// its file puts up to 2 MiB of zeros before and between segments: 14.2 MB
/// of file for 9.2 MB of content. The loaders that boot it through its PVH
/// entry (QEMU's `-kernel`, Xen's libelf) place each segment at its
/// physical address from its file offset and size; neither asks the file
/// offset to be aligned beyond a page. So the segments are laid out
/// back to back, each at an offset congruent to its address modulo 4 KiB
/// (`p_align` = 4 KiB); notes and sections move with the segment that holds
/// them; sections outside any segment (`.comment`, the section names)
/// follow, then the section headers.
///
/// The first segment also holds 2 MiB of zeros of its own: x86-64 aligns
/// `.rodata` to 2 MiB after `.text`. No section holds them and the kernel
/// never reads them (it hands that range to its page allocator as "unused
/// kernel image (text/rodata gap)"), so a segment is cut in two around any
/// page-aligned run of zeros of at least 64 KiB that no section holds: the
/// loader leaves that memory as the VM got it. Every byte of every section
/// is placed as before.
pub fn pack_kernel(elf: &[u8]) -> Result<Vec<u8>, String> {
    const PAGE: u64 = 4096;
    const PT_LOAD: u32 = 1;
    const SHT_NOBITS: u32 = 8;
    let u16_at = |o: usize| elf.get(o..o + 2).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |o: usize| elf.get(o..o + 4).map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")));
    let u64_at = |o: usize| elf.get(o..o + 8).map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")));
    let bad = |what: &str| format!("not a kernel this can pack: {what}");
    if elf.get(..4) != Some(b"\x7fELF") || elf.get(4) != Some(&2) || elf.get(5) != Some(&1) {
        return Err(bad("not a 64-bit little-endian ELF file"));
    }
    let field = |v: Option<u64>, what: &str| v.ok_or_else(|| bad(what));
    let phoff = field(u64_at(32), "truncated header")? as usize;
    let shoff = field(u64_at(40), "truncated header")? as usize;
    let (phentsize, phnum) = (field(u16_at(54).map(u64::from), "header")? as usize, field(u16_at(56).map(u64::from), "header")? as usize);
    let (shentsize, shnum) = (field(u16_at(58).map(u64::from), "header")? as usize, field(u16_at(60).map(u64::from), "header")? as usize);
    if phentsize != 56 || (shnum > 0 && shentsize != 64) || phoff != 64 {
        return Err(bad("unexpected header layout"));
    }
    // The file ranges of the sections that hold bytes: a split never cuts one.
    let mut held: Vec<(u64, u64)> = Vec::new();
    if shnum > 0 {
        for i in 0..shnum {
            let h = shoff + i * shentsize;
            let kind = field(u32_at(h + 4).map(u64::from), "truncated section headers")? as u32;
            let (off, size) = (field(u64_at(h + 24), "sh")?, field(u64_at(h + 32), "sh")?);
            if kind != SHT_NOBITS && kind != 0 && size > 0 {
                held.push((off, off.saturating_add(size)));
            }
        }
    }
    // Each program header becomes one or more: a loadable segment is cut
    // around the page-aligned runs of zeros inside it that no section
    // holds (at least MIN_GAP), which no loader needs to place.
    struct Piece {
        load: bool,
        off: u64,
        filesz: u64,
        memsz: u64,
        vaddr: u64,
        paddr: u64,
        header: [u8; 56],
    }
    const MIN_GAP: u64 = 64 * 1024;
    let mut pieces: Vec<Piece> = Vec::new();
    for i in 0..phnum {
        let h = phoff + i * phentsize;
        let header: [u8; 56] = elf.get(h..h + 56).ok_or_else(|| bad("truncated program headers"))?.try_into().expect("56 bytes");
        let kind = field(u32_at(h).map(u64::from), "truncated program headers")? as u32;
        let (off, vaddr, paddr, filesz, memsz) = (
            field(u64_at(h + 8), "ph")?,
            field(u64_at(h + 16), "ph")?,
            field(u64_at(h + 24), "ph")?,
            field(u64_at(h + 32), "ph")?,
            field(u64_at(h + 40), "ph")?,
        );
        if kind != PT_LOAD {
            pieces.push(Piece { load: false, off, filesz, memsz, vaddr, paddr, header });
            continue;
        }
        if off.checked_add(filesz).is_none_or(|end| end > elf.len() as u64) {
            return Err(bad("a segment runs past the end of the file"));
        }
        if memsz < filesz {
            return Err(bad("a segment smaller in memory than in the file"));
        }
        // The parts of the segment that no section holds, then the zero runs in them.
        let mut free: Vec<(u64, u64)> = vec![(off, off + filesz)];
        for &(a, b) in &held {
            free = free.into_iter().flat_map(|(x, y)| [(x, y.min(a)), (x.max(b), y)]).filter(|(x, y)| x < y).collect();
        }
        let mut cuts: Vec<(u64, u64)> = Vec::new(); // ranges left out, page-aligned, relative to the segment
        for (x, y) in free {
            let mut at = x;
            while at < y {
                let run = at;
                while at < y && elf[at as usize] == 0 {
                    at += 1;
                }
                let (a, b) = ((run - off).div_ceil(PAGE) * PAGE, (at - off) / PAGE * PAGE);
                if b > a && b - a >= MIN_GAP && b < filesz {
                    cuts.push((a, b));
                }
                at += 1;
            }
        }
        cuts.sort_unstable();
        let mut from = 0;
        for (a, b) in cuts.into_iter().chain(std::iter::once((filesz, filesz))) {
            let last = a == filesz;
            let size = a - from;
            pieces.push(Piece {
                load: true,
                off: off + from,
                filesz: size,
                memsz: if last { memsz - from } else { size },
                vaddr: vaddr + from,
                paddr: paddr + from,
                header,
            });
            from = b;
        }
    }
    if !pieces.iter().any(|p| p.load) {
        return Err(bad("no loadable segment"));
    }
    let mut loads: Vec<usize> = (0..pieces.len()).filter(|&i| pieces[i].load).collect();
    loads.sort_by_key(|&i| pieces[i].off);
    if loads.windows(2).any(|w| pieces[w[0]].off + pieces[w[0]].filesz > pieces[w[1]].off) {
        return Err(bad("segments overlap in the file"));
    }
    let phnum_out = pieces.len();
    let mut out = elf[..phoff].to_vec();
    out[56..58].copy_from_slice(&u16::try_from(phnum_out).map_err(|_| bad("too many program headers"))?.to_le_bytes());
    for p in &pieces {
        let mut h = p.header;
        h[16..24].copy_from_slice(&p.vaddr.to_le_bytes());
        h[24..32].copy_from_slice(&p.paddr.to_le_bytes());
        h[32..40].copy_from_slice(&p.filesz.to_le_bytes());
        h[40..48].copy_from_slice(&p.memsz.to_le_bytes());
        out.extend_from_slice(&h);
    }
    // Where each piece goes: (old offset, size, new offset).
    let mut moved: Vec<(u64, u64, u64)> = Vec::new();
    for &i in &loads {
        let p = &pieces[i];
        let cursor = out.len() as u64;
        let mut new = cursor.div_ceil(PAGE) * PAGE + p.vaddr % PAGE;
        if new >= cursor + PAGE {
            new -= PAGE;
        }
        out.resize(new as usize, 0);
        out.extend_from_slice(&elf[p.off as usize..(p.off + p.filesz) as usize]);
        moved.push((p.off, p.filesz, new));
        let h = phoff + i * phentsize;
        out[h + 8..h + 16].copy_from_slice(&new.to_le_bytes());
        out[h + 48..h + 56].copy_from_slice(&PAGE.to_le_bytes());
    }
    let map = |old: u64, size: u64| moved.iter().find(|m| old >= m.0 && old + size <= m.0 + m.1).map(|m| m.2 + (old - m.0));
    // Other program headers (the PVH note) move with their segment.
    for (i, p) in pieces.iter().enumerate() {
        let h = phoff + i * phentsize;
        if p.load {
            continue;
        }
        let (off, filesz) = (p.off, p.filesz);
        if filesz > 0 {
            let new = map(off, filesz).ok_or_else(|| bad("a program header outside the loadable segments"))?;
            out[h + 8..h + 16].copy_from_slice(&new.to_le_bytes());
        }
    }
    if shnum == 0 {
        out[40..48].copy_from_slice(&0u64.to_le_bytes());
        return Ok(out);
    }
    // Sections: inside a segment, they move with it; the others are copied after.
    let mut shdrs = elf.get(shoff..shoff + shnum * shentsize).ok_or_else(|| bad("section headers past the end of the file"))?.to_vec();
    for i in 0..shnum {
        let h = i * shentsize;
        let rd = |o: usize| u64::from_le_bytes(shdrs[h + o..h + o + 8].try_into().expect("8 bytes"));
        let kind = u32::from_le_bytes(shdrs[h + 4..h + 8].try_into().expect("4 bytes"));
        let (off, size, align) = (rd(24), rd(32), rd(48).max(1));
        let in_file = if kind == SHT_NOBITS { 0 } else { size };
        let new = match map(off, in_file) {
            Some(n) => n,
            None if in_file == 0 => out.len() as u64,
            None => {
                let at = (out.len() as u64).div_ceil(align) * align;
                out.resize(at as usize, 0);
                out.extend_from_slice(
                    elf.get(off as usize..(off + size) as usize).ok_or_else(|| bad("a section past the end of the file"))?,
                );
                at
            }
        };
        shdrs[h + 24..h + 32].copy_from_slice(&new.to_le_bytes());
    }
    let at = out.len().div_ceil(8) * 8;
    out.resize(at, 0);
    out.extend_from_slice(&shdrs);
    out[40..48].copy_from_slice(&(at as u64).to_le_bytes());
    Ok(out)
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

    /// A small ELF laid out as the kernel's: two loadable segments at 2 MiB
    /// file offsets, a note inside the first, a section outside any segment.
    fn kernel_like() -> Vec<u8> {
        let mut f = vec![0u8; 0x40_0000 + 0x3000];
        f[..4].copy_from_slice(b"\x7fELF");
        f[4] = 2;
        f[5] = 1;
        let put = |f: &mut Vec<u8>, o: usize, v: &[u8]| f[o..o + v.len()].copy_from_slice(v);
        put(&mut f, 32, &64u64.to_le_bytes());
        put(&mut f, 54, &56u16.to_le_bytes());
        put(&mut f, 56, &3u16.to_le_bytes());
        put(&mut f, 58, &64u16.to_le_bytes());
        // Program headers: LOAD 0x200000 (vaddr ..81000000, 0x1800), LOAD 0x400000 (vaddr ..81200010, 0x20), NOTE in the first.
        let ph = |f: &mut Vec<u8>, i: usize, kind: u32, off: u64, vaddr: u64, size: u64| {
            let h = 64 + i * 56;
            put(f, h, &kind.to_le_bytes());
            put(f, h + 8, &off.to_le_bytes());
            put(f, h + 16, &vaddr.to_le_bytes());
            put(f, h + 24, &(vaddr - 0xffff_ffff_8000_0000).to_le_bytes());
            put(f, h + 32, &size.to_le_bytes());
            put(f, h + 40, &size.to_le_bytes());
            put(f, h + 48, &0x20_0000u64.to_le_bytes());
        };
        ph(&mut f, 0, 1, 0x20_0000, 0xffff_ffff_8100_0000, 0x1800);
        ph(&mut f, 1, 1, 0x40_0010, 0xffff_ffff_8120_0010, 0x20);
        ph(&mut f, 2, 4, 0x20_1000, 0xffff_ffff_8100_1000, 0x10);
        for (i, b) in f[0x20_0000..0x20_1800].iter_mut().enumerate() {
            *b = (i % 251) as u8 + 1;
        }
        f[0x40_0010..0x40_0030].fill(0xab);
        f[0x40_0100..0x40_0105].copy_from_slice(b"hello");
        // Sections: null, .text (in segment 0), .comment (outside any segment).
        let sh = 0x40_1000;
        put(&mut f, 40, &(sh as u64).to_le_bytes());
        put(&mut f, 60, &3u16.to_le_bytes());
        put(&mut f, sh + 64 + 4, &1u32.to_le_bytes());
        put(&mut f, sh + 64 + 24, &0x20_0000u64.to_le_bytes());
        put(&mut f, sh + 64 + 32, &0x1800u64.to_le_bytes());
        put(&mut f, sh + 128 + 4, &1u32.to_le_bytes());
        put(&mut f, sh + 128 + 24, &0x40_0100u64.to_le_bytes());
        put(&mut f, sh + 128 + 32, &5u64.to_le_bytes());
        f
    }

    #[test]
    fn a_packed_kernel_keeps_every_loaded_byte_at_a_page_congruent_offset() {
        let elf = kernel_like();
        let packed = pack_kernel(&elf).unwrap();
        assert!(packed.len() < 0x5000, "{} bytes", packed.len());
        let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        for i in 0..3 {
            let h = 64 + i * 56;
            let (old, new, size, vaddr) = (u64_at(&elf, h + 8), u64_at(&packed, h + 8), u64_at(&elf, h + 32), u64_at(&elf, h + 16));
            assert_eq!(&elf[old as usize..(old + size) as usize], &packed[new as usize..(new + size) as usize], "segment {i}");
            assert_eq!(new % 4096, vaddr % 4096, "segment {i}: offset congruent to its address");
            assert_eq!(&packed[h + 16..h + 48], &elf[h + 16..h + 48], "addresses and sizes unchanged");
        }
        assert_eq!(u64_at(&packed, 64 + 48), 4096);
        // The sections point at the same bytes.
        let (sh_old, sh_new) = (u64_at(&elf, 40) as usize, u64_at(&packed, 40) as usize);
        for i in 1..3 {
            let (o, n, size) =
                (u64_at(&elf, sh_old + i * 64 + 24), u64_at(&packed, sh_new + i * 64 + 24), u64_at(&elf, sh_old + i * 64 + 32));
            assert_eq!(&elf[o as usize..(o + size) as usize], &packed[n as usize..(n + size) as usize], "section {i}");
        }
        // Packing twice changes nothing more.
        assert_eq!(pack_kernel(&packed).unwrap(), packed);
    }

    #[test]
    fn a_run_of_zeros_that_no_section_holds_is_left_out_of_the_file() {
        // Segment 0 grows to 0x40000: bytes, 0x30000 of zeros outside any section
        // (the text/rodata gap), then a section with bytes and zeros of its own.
        let mut elf = kernel_like();
        elf.resize(0x50_0000, 0);
        let put = |f: &mut Vec<u8>, o: usize, b: &[u8]| f[o..o + b.len()].copy_from_slice(b);
        put(&mut elf, 64 + 32, &0x4_0000u64.to_le_bytes());
        put(&mut elf, 64 + 40, &0x4_1000u64.to_le_bytes()); // memsz: a page of bss after
        put(&mut elf, 0x23_2000, b"rodata");
        // Section 2 (.comment before) becomes ".rodata": 0x23_2000.. the segment's end, zeros inside.
        let sh = 0x40_1000;
        put(&mut elf, sh + 128 + 24, &0x23_2000u64.to_le_bytes());
        put(&mut elf, sh + 128 + 32, &0xe000u64.to_le_bytes());
        let packed = pack_kernel(&elf).unwrap();
        let u64_at = |b: &[u8], o: usize| u64::from_le_bytes(b[o..o + 8].try_into().unwrap());
        let u16_at = |b: &[u8], o: usize| u16::from_le_bytes(b[o..o + 2].try_into().unwrap());
        assert_eq!(u16_at(&packed, 56), 4, "the first segment is cut in two");
        assert!(packed.len() < 0x2_0000, "{} bytes", packed.len());
        // Piece 0: the text, ending on the page after its bytes; piece 1: from the gap's end, with the bss.
        let (h0, h1) = (64, 64 + 56);
        assert_eq!((u64_at(&packed, h0 + 16), u64_at(&packed, h0 + 32), u64_at(&packed, h0 + 40)), (0xffff_ffff_8100_0000, 0x2000, 0x2000));
        assert_eq!(u64_at(&packed, h1 + 16), 0xffff_ffff_8103_2000);
        assert_eq!(u64_at(&packed, h1 + 24), 0x0103_2000, "the physical address moves with it");
        assert_eq!((u64_at(&packed, h1 + 32), u64_at(&packed, h1 + 40)), (0xe000, 0xf000));
        // Every section's bytes are where the headers say, at page-congruent offsets.
        let (o0, o1) = (u64_at(&packed, h0 + 8) as usize, u64_at(&packed, h1 + 8) as usize);
        assert_eq!(&packed[o0..o0 + 0x1800], &elf[0x20_0000..0x20_1800]);
        assert_eq!(&packed[o1..o1 + 0xe000], &elf[0x23_2000..0x24_0000]);
        assert_eq!((o0 % 4096, o1 % 4096), (0, 0x2000 % 4096));
        let sh_new = u64_at(&packed, 40) as usize;
        assert_eq!(u64_at(&packed, sh_new + 128 + 24) as usize, o1);
        // The note (in the text) moved with it; packing again changes nothing.
        assert_eq!(&packed[u64_at(&packed, 64 + 3 * 56 + 8) as usize..][..0x10], &elf[0x20_1000..0x20_1010]);
        assert_eq!(pack_kernel(&packed).unwrap(), packed);
    }

    #[test]
    fn what_is_not_a_kernel_is_refused() {
        assert!(pack_kernel(b"MZ\x90\x00").unwrap_err().contains("not a 64-bit little-endian ELF"));
        let mut elf = kernel_like();
        elf[64 + 32..64 + 40].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(pack_kernel(&elf).unwrap_err().contains("past the end"));
        let mut elf = kernel_like();
        elf[64 + 40..64 + 48].copy_from_slice(&0x10u64.to_le_bytes()); // memsz 0x10 < filesz 0x1800
        assert!(pack_kernel(&elf).unwrap_err().contains("smaller in memory"));
    }

    #[test]
    fn exit_reason() {
        let tail = "x\nec-init: powering off: the EPS ended by itself: exited with code 1\n[ 1.0] reboot: Power down";
        assert_eq!(exit_reason_from_console(tail).as_deref(), Some("the EPS ended by itself: exited with code 1"));
        assert_eq!(exit_reason_from_console("[0.5] Kernel panic - not syncing: VFS").as_deref(), Some("Kernel panic - not syncing: VFS"));
        assert_eq!(
            exit_reason_from_console("[9.1] ---[ end Kernel panic - not syncing: NMI: Not continuing ]---").as_deref(),
            Some("Kernel panic - not syncing: NMI: Not continuing")
        );
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
