//! `ec-launcher`: the only privileged step of starting an EPS instance.
//!
//! The edge manager's API process does not need root; starting an instance
//! does: a cgroup of its own (memory, CPU, process count), a uid of its own
//! (so that no instance can read another's state folder), no core dumps.
//! This program does exactly that and then `exec`s the EPS, so that it
//! costs nothing once the instance runs (no supervisor process is left).
//!
//! ```text
//! ec-launcher run --name alice-dropbox --state /var/lib/ec/instances/alice-dropbox \
//!     --memory-bytes 67108864 --cpu-millis 500 --pids 64 --uid 200001 --gid 200001 \
//!     -- /usr/local/bin/ec-eps serve --config /var/lib/ec/instances/alice-dropbox/eps.json
//! ec-launcher release --name alice-dropbox     # removes the cgroup once the EPS ended
//! ec-launcher probe                            # prints the cgroup version it would use
//! ```
//!
//! Both cgroup versions are supported: v1 (a folder per controller under
//! `/sys/fs/cgroup/{memory,cpu,pids}`, as on our build machines) and v2
//! (one unified folder, as on current edge routers). Instances live under
//! `edgecourier/<name>` in each hierarchy. Running as non-root is allowed
//! only with `--no-isolation` (a laptop demo): then nothing is limited and
//! the launcher says so on stderr.

use std::ffi::CString;
use std::fs;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::exit;

const ROOT: &str = "/sys/fs/cgroup";
const GROUP: &str = "edgecourier";
const CFS_PERIOD_US: u64 = 100_000;

/// Which cgroup hierarchy the host has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cgroups {
    V1,
    V2,
}

fn detect() -> Option<Cgroups> {
    if Path::new(ROOT).join("cgroup.controllers").exists() {
        Some(Cgroups::V2)
    } else if Path::new(ROOT).join("memory").is_dir() && Path::new(ROOT).join("pids").is_dir() && Path::new(ROOT).join("cpu").is_dir() {
        Some(Cgroups::V1)
    } else {
        None
    }
}

fn fail(msg: impl std::fmt::Display) -> ! {
    let _ = writeln!(std::io::stderr(), "ec-launcher: {msg}");
    exit(111)
}

fn write(path: &Path, value: &str) -> Result<(), String> {
    fs::write(path, value).map_err(|e| format!("writing {value:?} to {}: {e}", path.display()))
}

/// The instance's cgroup folders, one per controller (v1) or one (v2).
fn folders(kind: Cgroups, name: &str) -> Vec<(&'static str, PathBuf)> {
    match kind {
        Cgroups::V1 => ["memory", "cpu", "pids"].into_iter().map(|c| (c, Path::new(ROOT).join(c).join(GROUP).join(name))).collect(),
        Cgroups::V2 => vec![("unified", Path::new(ROOT).join(GROUP).join(name))],
    }
}

fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 64 && name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

struct Run {
    name: String,
    state: PathBuf,
    memory: u64,
    cpu_millis: u64,
    pids: u64,
    uid: u32,
    gid: u32,
    /// A supplementary group (the microvm backend's QEMU: `kvm`, for /dev/kvm).
    extra_gid: Option<u32>,
    /// No transparent huge pages (the microvm backend's QEMU: a guest that
    /// touches 4 KiB would otherwise cost the host 2 MiB).
    no_thp: bool,
    isolate: bool,
    program: Vec<String>,
}

fn parse_run(args: &[String]) -> Run {
    let mut r = Run {
        name: String::new(),
        state: PathBuf::new(),
        memory: 0,
        cpu_millis: 0,
        pids: 0,
        uid: 0,
        gid: 0,
        extra_gid: None,
        no_thp: false,
        isolate: true,
        program: vec![],
    };
    let mut i = 0;
    let num = |v: Option<&String>, what: &str| -> u64 {
        v.and_then(|s| s.parse().ok()).unwrap_or_else(|| fail(format!("{what} needs a number")))
    };
    while i < args.len() {
        let a = args[i].as_str();
        let v = args.get(i + 1);
        match a {
            "--name" => r.name = v.cloned().unwrap_or_default(),
            "--state" => r.state = PathBuf::from(v.cloned().unwrap_or_default()),
            "--memory-bytes" => r.memory = num(v, a),
            "--cpu-millis" => r.cpu_millis = num(v, a),
            "--pids" => r.pids = num(v, a),
            "--uid" => r.uid = u32::try_from(num(v, a)).unwrap_or_else(|_| fail("--uid out of range")),
            "--gid" => r.gid = u32::try_from(num(v, a)).unwrap_or_else(|_| fail("--gid out of range")),
            "--extra-gid" => r.extra_gid = Some(u32::try_from(num(v, a)).unwrap_or_else(|_| fail("--extra-gid out of range"))),
            "--no-isolation" => {
                r.isolate = false;
                i += 1;
                continue;
            }
            "--no-thp" => {
                r.no_thp = true;
                i += 1;
                continue;
            }
            "--" => {
                r.program = args[i + 1..].to_vec();
                break;
            }
            other => fail(format!("unknown argument {other:?} (see the top of edge-manager/launcher/src/main.rs)")),
        }
        i += 2;
    }
    if !valid_name(&r.name) {
        fail("--name must be 1-64 characters of [a-z0-9-]");
    }
    if r.program.is_empty() {
        fail("no program after --");
    }
    if r.isolate && (r.memory == 0 || r.cpu_millis == 0 || r.pids == 0 || r.uid == 0 || r.gid == 0) {
        fail("--memory-bytes, --cpu-millis, --pids, --uid and --gid are required and non-zero (or --no-isolation)");
    }
    r
}

/// Creates the cgroup, sets its limits and moves this process into it.
fn enter_cgroup(kind: Cgroups, r: &Run) -> Result<(), String> {
    if kind == Cgroups::V2 {
        // Controllers must be enabled from the root down to our parent.
        let parent = Path::new(ROOT).join(GROUP);
        fs::create_dir_all(&parent).map_err(|e| format!("creating {}: {e}", parent.display()))?;
        for dir in [Path::new(ROOT), parent.as_path()] {
            write(&dir.join("cgroup.subtree_control"), "+memory +cpu +pids")?;
        }
    }
    let me = std::process::id().to_string();
    for (controller, dir) in folders(kind, &r.name) {
        fs::create_dir_all(&dir).map_err(|e| format!("creating {}: {e}", dir.display()))?;
        match (kind, controller) {
            (Cgroups::V1, "memory") => {
                write(&dir.join("memory.limit_in_bytes"), &r.memory.to_string())?;
                // Swap would hide the limit; absent when the kernel has no swap accounting.
                let _ = fs::write(dir.join("memory.memsw.limit_in_bytes"), r.memory.to_string());
            }
            (Cgroups::V1, "cpu") => {
                write(&dir.join("cpu.cfs_period_us"), &CFS_PERIOD_US.to_string())?;
                write(&dir.join("cpu.cfs_quota_us"), &(r.cpu_millis * CFS_PERIOD_US / 1000).max(1000).to_string())?;
            }
            (Cgroups::V1, "pids") => write(&dir.join("pids.max"), &r.pids.to_string())?,
            (Cgroups::V2, _) => {
                write(&dir.join("memory.max"), &r.memory.to_string())?;
                let _ = fs::write(dir.join("memory.swap.max"), "0");
                write(&dir.join("cpu.max"), &format!("{} {CFS_PERIOD_US}", (r.cpu_millis * CFS_PERIOD_US / 1000).max(1000)))?;
                write(&dir.join("pids.max"), &r.pids.to_string())?;
            }
            _ => unreachable!(),
        }
        write(&dir.join("cgroup.procs"), &me)?;
    }
    Ok(())
}

fn chown_tree(path: &Path, uid: u32, gid: u32) -> Result<(), String> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|_| format!("{} has a NUL byte", path.display()))?;
    // SAFETY: `c` is a valid NUL-terminated path; lchown does not follow links.
    if unsafe { libc::lchown(c.as_ptr(), uid, gid) } != 0 {
        return Err(format!("chown {}: {}", path.display(), std::io::Error::last_os_error()));
    }
    let meta = fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
    if meta.is_dir() {
        for entry in fs::read_dir(path).map_err(|e| format!("{}: {e}", path.display()))? {
            chown_tree(&entry.map_err(|e| e.to_string())?.path(), uid, gid)?;
        }
    }
    Ok(())
}

fn drop_privileges(uid: u32, gid: u32, extra_gid: Option<u32>) -> Result<(), String> {
    let groups: Vec<libc::gid_t> = extra_gid.into_iter().collect();
    // SAFETY: plain system calls with integer arguments; a group list we own.
    unsafe {
        if libc::setgroups(groups.len(), groups.as_ptr()) != 0 {
            return Err(format!("setgroups: {}", std::io::Error::last_os_error()));
        }
        if libc::setresgid(gid, gid, gid) != 0 {
            return Err(format!("setresgid {gid}: {}", std::io::Error::last_os_error()));
        }
        if libc::setresuid(uid, uid, uid) != 0 {
            return Err(format!("setresuid {uid}: {}", std::io::Error::last_os_error()));
        }
        if libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 {
            return Err(format!("no_new_privs: {}", std::io::Error::last_os_error()));
        }
    }
    Ok(())
}

fn run(r: Run) -> ! {
    // A session of its own: the instance outlives the manager (which
    // re-adopts it after a restart) and does not get its terminal's signals.
    // SAFETY: setsid and setrlimit take no pointers we do not own.
    unsafe {
        libc::setsid();
        let zero = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        libc::setrlimit(libc::RLIMIT_CORE, &zero);
    }
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    if r.isolate {
        if !root {
            fail("isolation needs root (cgroups, uid change): run the launcher as root, setuid root, or through sudo; --no-isolation runs without limits");
        }
        let kind = detect().unwrap_or_else(|| fail(format!("no cgroup v1 (memory, cpu, pids) or v2 hierarchy under {ROOT}")));
        enter_cgroup(kind, &r).unwrap_or_else(|e| fail(format!("cgroup: {e}")));
        if !r.state.as_os_str().is_empty() {
            chown_tree(&r.state, r.uid, r.gid).unwrap_or_else(|e| fail(e));
            let c = CString::new(r.state.as_os_str().as_bytes()).unwrap_or_else(|_| fail("state path has a NUL byte"));
            // SAFETY: valid path; owner-only access keeps other instances out.
            unsafe { libc::chmod(c.as_ptr(), 0o700) };
        }
        drop_privileges(r.uid, r.gid, r.extra_gid).unwrap_or_else(|e| fail(e));
    } else {
        let _ = writeln!(std::io::stderr(), "ec-launcher: --no-isolation: {} runs without cgroup limits, as the caller's uid", r.name);
    }
    if r.no_thp {
        // SAFETY: a prctl with integer arguments; inherited across exec.
        if unsafe { libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0) } != 0 {
            let _ = writeln!(std::io::stderr(), "ec-launcher: PR_SET_THP_DISABLE: {}", std::io::Error::last_os_error());
        }
    }
    if !r.state.as_os_str().is_empty() {
        let _ = std::env::set_current_dir(&r.state);
    }
    let argv: Vec<CString> =
        r.program.iter().map(|a| CString::new(a.as_bytes()).unwrap_or_else(|_| fail("argument has a NUL byte"))).collect();
    let mut ptrs: Vec<*const libc::c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    ptrs.push(std::ptr::null());
    // SAFETY: argv is a NULL-terminated array of valid C strings that outlive the call.
    unsafe { libc::execv(argv[0].as_ptr(), ptrs.as_ptr()) };
    fail(format!("exec {}: {}", r.program[0], std::io::Error::last_os_error()))
}

fn release(name: &str) -> ! {
    if !valid_name(name) {
        fail("--name must be 1-64 characters of [a-z0-9-]");
    }
    let Some(kind) = detect() else { exit(0) };
    // The last threads of an ended process may leave the cgroup a moment
    // after its main thread (all a non-parent can watch): retry for 5 s.
    let mut errors = vec![];
    for _ in 0..250 {
        errors.clear();
        for (_, dir) in folders(kind, name) {
            if dir.exists() {
                if let Err(e) = fs::remove_dir(&dir) {
                    errors.push(format!("{}: {e}", dir.display()));
                }
            }
        }
        if errors.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    if errors.is_empty() {
        exit(0)
    }
    fail(format!("could not remove (is the instance still running?): {}", errors.join("; ")))
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("run") => run(parse_run(&args[1..])),
        Some("release") if args.get(1).map(String::as_str) == Some("--name") => release(args.get(2).map_or("", String::as_str)),
        Some("probe") => {
            match detect() {
                Some(Cgroups::V1) => println!("cgroup v1"),
                Some(Cgroups::V2) => println!("cgroup v2"),
                None => fail(format!("no usable cgroup hierarchy under {ROOT}")),
            }
            exit(0)
        }
        _ => fail("usage: ec-launcher run --name N --state DIR --memory-bytes B --cpu-millis M --pids P --uid U --gid G [--extra-gid G] [--no-thp] [--no-isolation] -- PROGRAM ARGS...\n       ec-launcher release --name N\n       ec-launcher probe"),
    }
}
