//! Writes the codec-level test vectors of the device-to-edge protocol to
//! protocol/vectors/ (manifest.json, valid/, invalid/, files/).
//!
//! Run: `cargo run -p ec-protocol --example make_protocol_vectors`
//! The vectors are committed; `tests/integration/vectors.rs` fails when this output
//! differs from them, so rerun it after any change to the codec or the
//! generator and review the diff.

#[path = "../tests/support/gen.rs"]
mod gen;

use std::path::Path;

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../vectors");
    for sub in ["valid", "invalid", "files"] {
        let dir = root.join(sub);
        if dir.exists() {
            std::fs::remove_dir_all(&dir).expect("remove the old vectors");
        }
    }
    let files = gen::generate();
    for (rel, bytes) in &files {
        let p = root.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(&p, bytes).unwrap();
    }
    println!("wrote {} files to {}", files.len(), root.display());
}
