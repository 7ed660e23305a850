//! ec-protocol's integration tests: message round trips and hostile input, the committed vectors.
//!
//! One test executable for the crate's integration tests (each file of this
//! folder is a module): one link instead of one per file (docs/benchmarks.md,
//! "The Rust tests' compile time"). A test is `<file>::<name>`, e.g.
//! `cargo test -p <crate> --test integration messages::`.

#[path = "../support/mod.rs"]
mod support;

mod messages;
mod vectors;
