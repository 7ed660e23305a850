//! ec-providers' integration tests against a scripted server and the Python testbed (the fail-point tests are tests/failpoints.rs: the fail registry is global to a process).
//!
//! One test executable for the crate's integration tests (each file of this
//! folder is a module): one link instead of one per file (docs/benchmarks.md,
//! "The Rust tests' compile time"). A test is `<file>::<name>`, e.g.
//! `cargo test -p <crate> --test integration failures::`.

#[path = "../common/mod.rs"]
mod common;

mod failures;
mod fetch;
mod procedures;
mod streamed;
mod testbed;
