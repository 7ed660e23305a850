//! `ec-delayline`: the delay and loss of the experiments' emulated links.
//!
//! The kernels the testbed runs on have no netem, so the testbed shapes
//! rates in the kernel (tbf) and adds delay and loss here, in user space: a
//! router namespace sends every packet of a link into a TUN device (policy
//! routing by input interface); this program reads it, drops it with the
//! link's loss probability, holds it for the link's one-way delay and writes
//! it back to the same TUN device, from where the kernel forwards it on.
//!
//! One reader and one writer thread per TUN device; packets leave in the
//! order they came (no reordering, a fixed delay), and a queue longer than
//! `--limit` packets drops at the tail, as a router's buffer would. A Python
//! version of the same loop tops out near 117 Mbit/s; this one sustains
//! several hundred (docs/experiments.md has the measurement).
//!
//! ```text
//! ec-delayline --tun dl-up:10ms:0.01 --tun dl-down:10ms [--limit 20000] [--seed 1]
//! ```
//!
//! It prints one line `ready` once every device exists (the caller then
//! brings them up and routes into them); a line `NAME DELAY` on standard
//! input changes a device's delay while it runs; on SIGTERM or SIGINT it
//! prints one JSON line of counters per device on stdout, then exits; the
//! devices vanish with the process.

use std::collections::VecDeque;
use std::ffi::CString;
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

static STOP: AtomicBool = AtomicBool::new(false);

/// One emulated direction of a link: a TUN device with a delay and a loss rate.
#[derive(Debug, Clone)]
struct LinkSpec {
    name: String,
    delay: Duration,
    loss: f64,
}

/// The delay in force, in microseconds: changed while running by a line
/// `NAME DELAY` on standard input (the testbed calibrates with it).
#[derive(Debug)]
struct Delay(AtomicU64);

#[derive(Debug, Default)]
struct Counters {
    packets_in: AtomicU64,
    bytes_in: AtomicU64,
    packets_out: AtomicU64,
    bytes_out: AtomicU64,
    lost: AtomicU64,
    overflow: AtomicU64,
    max_queue: AtomicU64,
}

#[derive(Debug)]
struct Queue {
    packets: Mutex<VecDeque<(Instant, Vec<u8>)>>,
    ready: Condvar,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    let (number, scale) = if let Some(v) = text.strip_suffix("us") {
        (v, 1e-6)
    } else if let Some(v) = text.strip_suffix("ms") {
        (v, 1e-3)
    } else if let Some(v) = text.strip_suffix('s') {
        (v, 1.0)
    } else {
        (text, 1e-3)
    };
    let value: f64 = number.parse().map_err(|_| format!("bad delay {text:?} (e.g. 10ms, 250us)"))?;
    if !(0.0..=60.0).contains(&(value * scale)) {
        return Err(format!("delay {text:?} out of range (0 to 60 s)"));
    }
    Ok(Duration::from_secs_f64(value * scale))
}

fn parse_spec(text: &str) -> Result<LinkSpec, String> {
    let mut parts = text.split(':');
    let name = parts.next().unwrap_or_default().to_string();
    if name.is_empty() || name.len() > 15 {
        return Err(format!("bad device name in {text:?} (1 to 15 characters)"));
    }
    let delay = parse_duration(parts.next().ok_or(format!("{text:?}: expected NAME:DELAY[:LOSS]"))?)?;
    let loss = match parts.next() {
        Some(v) => v.parse::<f64>().map_err(|_| format!("bad loss {v:?} in {text:?} (a probability, 0 to 1)"))?,
        None => 0.0,
    };
    if !(0.0..=1.0).contains(&loss) || parts.next().is_some() {
        return Err(format!("bad link {text:?}: NAME:DELAY[:LOSS], loss between 0 and 1"));
    }
    Ok(LinkSpec { name, delay, loss })
}

/// Creates (or attaches to) the TUN device `name`: IP packets, no packet-info header.
fn open_tun(name: &str) -> std::io::Result<OwnedFd> {
    let path = CString::new("/dev/net/tun").expect("no NUL");
    // SAFETY: a plain open(2) of a NUL-terminated path; the fd is owned below.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: fd is a fresh, valid descriptor that nothing else owns.
    let owned = unsafe { OwnedFd::from_raw_fd(fd) };
    // SAFETY: ifreq is plain old data; zeroed is a valid value.
    let mut request: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in request.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src as libc::c_char;
    }
    request.ifr_ifru.ifru_flags = (libc::IFF_TUN | libc::IFF_NO_PI) as libc::c_short;
    // SAFETY: TUNSETIFF takes a pointer to an ifreq that outlives the call.
    let rc = unsafe { libc::ioctl(owned.as_raw_fd(), libc::TUNSETIFF, &mut request) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(owned)
}

/// xorshift64*: the loss decisions need speed and a seed, not cryptography.
struct Rng(u64);

impl Rng {
    fn next_f64(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        (self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 / (1u64 << 53) as f64
    }
}

fn reader(fd: Arc<OwnedFd>, spec: LinkSpec, delay: Arc<Delay>, queue: Arc<Queue>, counters: Arc<Counters>, limit: usize, seed: u64) {
    let mut rng = Rng(seed | 1);
    let mut buffer = vec![0u8; 65_536];
    let mut poll = libc::pollfd { fd: fd.as_raw_fd(), events: libc::POLLIN, revents: 0 };
    while !STOP.load(Ordering::Relaxed) {
        // SAFETY: one valid pollfd; the timeout lets the thread see STOP.
        let ready = unsafe { libc::poll(&mut poll, 1, 100) };
        if ready <= 0 {
            continue;
        }
        // SAFETY: reads at most buffer.len() bytes into the buffer.
        let n = unsafe { libc::read(fd.as_raw_fd(), buffer.as_mut_ptr().cast(), buffer.len()) };
        if n <= 0 {
            continue;
        }
        let n = n as usize;
        counters.packets_in.fetch_add(1, Ordering::Relaxed);
        counters.bytes_in.fetch_add(n as u64, Ordering::Relaxed);
        if spec.loss > 0.0 && rng.next_f64() < spec.loss {
            counters.lost.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        let due = Instant::now() + Duration::from_micros(delay.0.load(Ordering::Relaxed));
        let mut packets = queue.packets.lock().expect("queue lock");
        if packets.len() >= limit {
            counters.overflow.fetch_add(1, Ordering::Relaxed);
            continue;
        }
        packets.push_back((due, buffer[..n].to_vec()));
        counters.max_queue.fetch_max(packets.len() as u64, Ordering::Relaxed);
        if packets.len() == 1 {
            queue.ready.notify_one();
        }
    }
}

fn writer(fd: Arc<OwnedFd>, queue: Arc<Queue>, counters: Arc<Counters>) {
    let mut packets = queue.packets.lock().expect("queue lock");
    while !STOP.load(Ordering::Relaxed) {
        let Some(&(due, _)) = packets.front() else {
            packets = queue.ready.wait_timeout(packets, Duration::from_millis(100)).expect("queue lock").0;
            continue;
        };
        let now = Instant::now();
        if due > now {
            packets = queue.ready.wait_timeout(packets, due - now).expect("queue lock").0;
            continue;
        }
        // Everything due goes out in one pass, outside the lock.
        let mut batch = Vec::new();
        while packets.front().is_some_and(|(d, _)| *d <= now) {
            batch.push(packets.pop_front().expect("front exists").1);
        }
        drop(packets);
        for packet in batch {
            // SAFETY: writes one whole packet from a live buffer.
            let n = unsafe { libc::write(fd.as_raw_fd(), packet.as_ptr().cast(), packet.len()) };
            if n > 0 {
                counters.packets_out.fetch_add(1, Ordering::Relaxed);
                counters.bytes_out.fetch_add(n as u64, Ordering::Relaxed);
            }
        }
        packets = queue.packets.lock().expect("queue lock");
    }
}

extern "C" fn on_signal(_: libc::c_int) {
    STOP.store(true, Ordering::Relaxed);
}

const USAGE: &str = "usage: ec-delayline --tun NAME:DELAY[:LOSS] [--tun ...] [--limit PACKETS] [--seed N]

Creates one TUN device per --tun (IP packets, no header) and writes every
packet read from it back to it DELAY later (10ms, 250us, 0.5s; a bare
number is milliseconds), dropping each with probability LOSS (0 to 1).
--limit: packets held per device at most, the rest dropped (default 20000).
Prints `ready` when the devices exist. A line `NAME DELAY` on standard
input changes that device's delay. On SIGTERM/SIGINT prints one JSON line
of counters per device and exits.";

fn main() {
    let mut specs = Vec::new();
    let mut limit = 20_000usize;
    let mut seed = 0x9E37_79B9_7F4A_7C15u64;
    let mut args = std::env::args().skip(1);
    let fail = |message: String| -> ! {
        eprintln!("ec-delayline: {message}\n{USAGE}");
        std::process::exit(2)
    };
    while let Some(arg) = args.next() {
        let mut value = || args.next().unwrap_or_else(|| fail(format!("{arg} needs a value")));
        match arg.as_str() {
            "--tun" => specs.push(parse_spec(&value()).unwrap_or_else(|e| fail(e))),
            "--limit" => limit = value().parse().unwrap_or_else(|_| fail("bad --limit".into())),
            "--seed" => seed = value().parse().unwrap_or_else(|_| fail("bad --seed".into())),
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            other => fail(format!("unknown argument {other:?}")),
        }
    }
    if specs.is_empty() {
        fail("no --tun given".into());
    }
    // SAFETY: the handler only stores to an atomic.
    unsafe {
        libc::signal(libc::SIGTERM, on_signal as *const () as libc::sighandler_t);
        libc::signal(libc::SIGINT, on_signal as *const () as libc::sighandler_t);
    }
    // Sleeps end within a microsecond of the due time instead of the default
    // 50 us slack: at a 2 ms round trip that slack alone would be 5%. Threads
    // inherit it.
    // SAFETY: PR_SET_TIMERSLACK takes an integer argument only.
    unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong) };
    let mut threads = Vec::new();
    let mut all = Vec::new();
    for (i, spec) in specs.iter().enumerate() {
        let fd = Arc::new(open_tun(&spec.name).unwrap_or_else(|e| {
            eprintln!("ec-delayline: cannot create TUN device {}: {e} (root and /dev/net/tun needed)", spec.name);
            std::process::exit(1)
        }));
        let queue = Arc::new(Queue { packets: Mutex::new(VecDeque::new()), ready: Condvar::new() });
        let counters = Arc::new(Counters::default());
        let delay = Arc::new(Delay(AtomicU64::new(spec.delay.as_micros() as u64)));
        all.push((spec.clone(), counters.clone(), delay.clone()));
        let (f, q, c, s, d) = (fd.clone(), queue.clone(), counters.clone(), spec.clone(), delay);
        let seed = seed.wrapping_add(i as u64 * 0x1000_0000_01b3);
        threads.push(std::thread::spawn(move || reader(f, s, d, q, c, limit, seed)));
        threads.push(std::thread::spawn(move || writer(fd, queue, counters)));
    }
    println!("ready");
    std::io::stdout().flush().ok();
    let delays: Vec<(String, Arc<Delay>)> = all.iter().map(|(s, _, d)| (s.name.clone(), d.clone())).collect();
    // Not joined: it blocks in read(2) on standard input until the process exits.
    std::thread::spawn(move || {
        let mut line = String::new();
        while std::io::stdin().read_line(&mut line).is_ok_and(|n| n > 0) {
            let mut words = line.split_whitespace();
            if let (Some(name), Some(value)) = (words.next(), words.next()) {
                match (delays.iter().find(|(n, _)| n == name), parse_duration(value)) {
                    (Some((_, delay)), Ok(d)) => delay.0.store(d.as_micros() as u64, Ordering::Relaxed),
                    _ => eprintln!("ec-delayline: ignored {:?} (expected NAME DELAY)", line.trim()),
                }
            }
            line.clear();
        }
    });
    for thread in threads {
        thread.join().ok();
    }
    let mut out = std::io::stdout().lock();
    for (spec, c, delay) in all {
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        writeln!(
            out,
            "{{\"tun\":\"{}\",\"delay_us\":{},\"loss\":{},\"packets_in\":{},\"bytes_in\":{},\"packets_out\":{},\"bytes_out\":{},\"lost\":{},\"overflow\":{},\"max_queue\":{}}}",
            spec.name,
            delay.0.load(Ordering::Relaxed),
            spec.loss,
            get(&c.packets_in),
            get(&c.bytes_in),
            get(&c.packets_out),
            get(&c.bytes_out),
            get(&c.lost),
            get(&c.overflow),
            get(&c.max_queue)
        )
        .ok();
    }
}
