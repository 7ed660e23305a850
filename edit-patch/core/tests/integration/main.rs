//! ec-patch's integration tests: corpus, vectors, known deflaters, hostile input.
//!
//! One test executable for the crate's integration tests (each file of this
//! folder is a module): one link instead of one per file (docs/benchmarks.md,
//! "The Rust tests' compile time"). A test is `<file>::<name>`, e.g.
//! `cargo test -p <crate> --test integration bad_input::`.

#[path = "../common/mod.rs"]
mod common;

mod apply_overlap;
mod bad_input;
mod block_reuse;
mod corpus;
mod flate2_recipes;
mod fresh_times;
mod go_recipe;
mod goflate;
mod guids;
mod hostile_deflate;
mod infozip;
mod renamed;
mod renumbered;
mod row_offsets;
mod sevenzip;
mod vectors;
mod zport;
mod zstd_bound;
