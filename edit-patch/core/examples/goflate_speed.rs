//! Speed of the Go `compress/flate` port (`ec_patch::goflate`) against Go
//! itself, on one file, best of RUNS, both in the same run:
//!
//!     cargo run --release -p ec-patch --example goflate_speed -- FILE [RUNS] [LEVEL...]
//!
//! FILE is a document part (e.g. a `word/document.xml` unzipped from the
//! shared corpus); levels default to 1 5 6 9 (archive/zip writes level 5).
//! Go's side is the reference program of the port's tests
//! (edit-patch/core/tests/goflate, `bench` mode), built here with `go build`
//! into target/goflate-ref; without `go` on PATH only the port is timed.

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

fn go_reference(target: &Path) -> Option<std::path::PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/goflate");
    let out = target.join("goflate-ref");
    let status = Command::new("go")
        .args(["build", "-o"])
        .arg(&out)
        .arg(".")
        .current_dir(&src)
        .env("GOCACHE", target.join("gocache"))
        .env("GOFLAGS", "-mod=mod")
        .status()
        .ok()?;
    status.success().then_some(out)
}

fn go_best_ns(bin: &Path, data: &[u8], level: i32, runs: usize) -> f64 {
    let mut child = Command::new(bin)
        .args(["bench", &level.to_string(), &runs.to_string()])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("the Go reference runs");
    let mut stdin = child.stdin.take().expect("stdin");
    let input = data.to_vec();
    let feeder = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().expect("the Go reference answers");
    feeder.join().expect("feeder").expect("stdin written");
    String::from_utf8_lossy(&out.stdout).trim().parse().expect("Go prints nanoseconds")
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let Some(file) = args.first() else {
        eprintln!("usage: goflate_speed FILE [RUNS] [LEVEL...]");
        std::process::exit(2);
    };
    let data = std::fs::read(file).unwrap_or_else(|e| panic!("{file}: {e}"));
    let runs: usize = args.get(1).map(|r| r.parse().expect("RUNS is a number")).unwrap_or(5);
    let levels: Vec<i32> = if args.len() > 2 { args[2..].iter().map(|l| l.parse().expect("a level")).collect() } else { vec![1, 5, 6, 9] };
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target");
    let go = go_reference(&target);
    if go.is_none() {
        eprintln!("goflate_speed: `go` not found or the build failed: timing the port only");
    }
    let mb = data.len() as f64 / 1e6;
    println!("{file}: {mb:.2} MB, best of {runs}");
    println!("level | Rust port MB/s | Go MB/s | port / Go");
    for level in levels {
        let mut best = f64::MAX;
        for _ in 0..runs {
            let t = Instant::now();
            std::hint::black_box(ec_patch::goflate::deflate(&data, level));
            best = best.min(t.elapsed().as_secs_f64());
        }
        match &go {
            Some(bin) => {
                let go_s = go_best_ns(bin, &data, level, runs) / 1e9;
                println!("{level:5} | {:14.1} | {:7.1} | {:.2}", mb / best, mb / go_s, go_s / best);
            }
            None => println!("{level:5} | {:14.1} | - | -", mb / best),
        }
    }
}
