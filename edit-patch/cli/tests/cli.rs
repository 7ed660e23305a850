//! The `ecsync` command as a user runs it: outputs, exit codes, messages
//! that name the file, and no partial or wrong file left behind on failure.

#[path = "../../core/tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn ecsync(args: &[&Path]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ecsync")).args(args).output().expect("ecsync runs")
}

fn corpus(rel: &str) -> PathBuf {
    // The shared folder: EC_SHARED, else ../shared beside the repository (testbed/shared.py).
    let shared =
        std::env::var_os("EC_SHARED").map(PathBuf::from).unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared"));
    shared.join("corpus/real").join(rel)
}

fn tmpdir(name: &str) -> PathBuf {
    let d = std::env::temp_dir().join(format!("ecsync-cli-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&d);
    std::fs::create_dir_all(&d).unwrap();
    d
}

fn listing(d: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(d).unwrap().flatten().map(|e| e.file_name().to_string_lossy().into_owned()).collect();
    v.sort();
    v
}

#[test]
fn diff_apply_inspect_round_trip() {
    let d = tmpdir("roundtrip");
    let (base, new) = (corpus("docx/word2016-win_example.docx"), corpus("docx/word2010-win_bug59058.docx"));
    let patch = d.join("edit.ecp");
    let out = ecsync(&[Path::new("diff"), &base, &new, Path::new("-o"), &patch]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("patch of"));
    let rebuilt = d.join("rebuilt.docx");
    let out = ecsync(&[Path::new("apply"), &base, &patch, Path::new("-o"), &rebuilt]);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(std::fs::read(&rebuilt).unwrap(), std::fs::read(&new).unwrap());
    let out = ecsync(&[Path::new("inspect"), &patch, Path::new("--base"), &base]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success() && text.contains("kind zip") && text.contains("word/document.xml"), "{text}");
    let out = ecsync(&[Path::new("inspect"), &patch, Path::new("--json")]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("inspect --json prints JSON");
    assert_eq!(json["kind"], "zip");
    assert_eq!(json["target_size"], std::fs::metadata(&new).unwrap().len());
    assert!(json["sections"]["header_stream"].as_u64().unwrap() > 0);
    assert_eq!(listing(&d), ["edit.ecp", "rebuilt.docx"]);
}

#[test]
fn wrong_base_fails_names_the_base_and_writes_nothing() {
    let d = tmpdir("wrongbase");
    let (base, new, other) =
        (corpus("xlsx/excel2008-mac_47504.xlsx"), corpus("xlsx/excel2007-win_WithDrawing.xlsx"), corpus("xlsx/gnumeric_issue_174.xlsx"));
    let patch = d.join("p.ecp");
    assert!(ecsync(&[Path::new("diff"), &base, &new, Path::new("-o"), &patch]).status.success());
    let out = ecsync(&[Path::new("apply"), &other, &patch, Path::new("-o"), &d.join("out.xlsx")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("gnumeric_issue_174.xlsx") && err.contains("wrong base") && err.contains("[wrong_base]"), "{err}");
    assert_eq!(listing(&d), ["p.ecp"], "no output and no temporary file left");
}

#[test]
fn corrupt_patch_fails_and_leaves_no_file() {
    let d = tmpdir("corrupt");
    let base = corpus("odt/pandoc3.1_simple.odt");
    let bad = d.join("bad.ecp");
    std::fs::write(&bad, b"\x89ECP\x01\x01\x00garbage").unwrap();
    let out = ecsync(&[Path::new("apply"), &base, &bad, Path::new("-o"), &d.join("out.odt")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bad.ecp") && err.contains("truncated"), "{err}");
    assert_eq!(listing(&d), ["bad.ecp"]);
}

#[test]
fn missing_files_and_usage_errors_are_clear() {
    let out = ecsync(&[Path::new("diff"), Path::new("/nonexistent/a.docx"), Path::new("b.docx"), Path::new("-o"), Path::new("p")]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("/nonexistent/a.docx") && err.contains("No such file"), "{err}");
    let out = ecsync(&[Path::new("frobnicate")]);
    assert_eq!(out.status.code(), Some(2));
    let out = ecsync(&[Path::new("--help")]);
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(help.contains("diff") && help.contains("apply") && help.contains("inspect") && help.contains("Examples"), "{help}");
}

/// A .docx whose `word/document.xml` is block-parallel (LibreOffice's
/// writer), block `odd` deflated at zlib level 1 instead of 6 when given.
fn block_docx(body: &[u8], odd: Option<usize>) -> Vec<u8> {
    let data = common::blocks_with_odd(body, odd);
    common::zip_with_data(
        &[common::Member::new(b"word/document.xml", body.to_vec()), common::Member::new(b"word/styles.xml", &b"<w:styles/>"[..])],
        &[Some(data), None],
    )
}

#[test]
fn apply_is_exact_when_the_base_layout_it_claims_is_wrong() {
    // The base's blocks end where LibreOffice's do, but one was written at
    // another level: the layout apply claims from those boundaries is wrong,
    // the file it makes fails its SHA-256 check, and it is made again from
    // zlib alone. With --no-claim it is made that way at once.
    let d = tmpdir("claim");
    let body = common::document_xml(300_000, 21);
    let count = body.len().div_ceil(128 << 10);
    let mut edited = body.clone();
    edited.insert(100, b'x');
    for (name, base) in [("right", block_docx(&body, None)), ("wrong", block_docx(&body, Some(count - 2)))] {
        let (b, n, p) = (d.join(format!("{name}-base.docx")), d.join(format!("{name}-new.docx")), d.join(format!("{name}.ecp")));
        std::fs::write(&b, base).unwrap();
        std::fs::write(&n, block_docx(&edited, None)).unwrap();
        let out = ecsync(&[Path::new("diff"), &b, &n, Path::new("-o"), &p]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        for flags in [&[][..], &[Path::new("--no-claim")][..]] {
            let rebuilt = d.join(format!("{name}-rebuilt.docx"));
            let args: Vec<&Path> =
                [Path::new("apply")].into_iter().chain(flags.iter().copied()).chain([&*b, &*p, Path::new("-o"), &*rebuilt]).collect();
            let out = ecsync(&args);
            assert!(out.status.success(), "{name} {flags:?}: {}", String::from_utf8_lossy(&out.stderr));
            assert!(std::fs::read(&rebuilt).unwrap() == std::fs::read(&n).unwrap(), "{name} {flags:?}");
        }
    }
    assert_eq!(listing(&d).len(), 8, "{:?}", listing(&d));
}

#[test]
fn inspect_into_a_reader_that_has_gone_ends_quietly() {
    // `ecsync inspect p | head -3`: the reader stops reading; before, the
    // next print panicked ("failed printing to stdout: Broken pipe") with
    // a backtrace and exit code 101.
    let d = tmpdir("pipe");
    let (base, new) = (corpus("docx/word2016-win_example.docx"), corpus("docx/word2010-win_bug59058.docx"));
    let patch = d.join("edit.ecp");
    assert!(ecsync(&[Path::new("diff"), &base, &new, Path::new("-o"), &patch]).status.success());
    for json in [false, true] {
        let (reader, writer) = std::io::pipe().expect("a pipe");
        drop(reader); // gone before the first line
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ecsync"));
        cmd.args([Path::new("inspect"), &patch, Path::new("--base"), &base]);
        if json {
            cmd.arg("--json");
        }
        let out = cmd.stdout(writer).stderr(std::process::Stdio::piped()).output().expect("ecsync runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success() && err.is_empty(), "json={json}: {:?} {err}", out.status);
    }
    // A stdout that refuses the bytes for another reason is an error that says so.
    let full = std::fs::OpenOptions::new().write(true).open("/dev/full").expect("/dev/full");
    let out = Command::new(env!("CARGO_BIN_EXE_ecsync")).args([Path::new("inspect"), &patch]).stdout(full).output().expect("ecsync runs");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains("stdout") && !err.contains("panicked"), "{err}");
}
