//! `ecsync`: make, apply and inspect EdgeCourier edit patches.
//!
//! Errors go to stderr, naming the file and the problem, with exit code 1
//! (2 for usage errors, from clap). Output files are written to a temporary
//! file beside the destination and renamed into place only once complete and
//! verified, so a failed run never leaves a partial or wrong file behind.

use clap::{Parser, Subcommand};
use ec_patch::{DiffOptions, Limits, PatchError};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser, Debug)]
#[command(
    name = "ecsync",
    version,
    about = "Byte-exact edit patches for office documents (.docx .xlsx .pptx .odt .ods .odp ...)",
    long_about = "Byte-exact edit patches for office documents.\n\nA patch describes a new version of a file in terms of an older one (the last-synced base), so that `apply` rebuilds the new file with the very same bytes (SHA-256 checked). ZIP-based documents get a structured patch (only changed parts travel); any other file gets a generic binary delta.\n\nExamples:\n  ecsync diff report-v1.docx report-v2.docx -o edit.ecp\n  ecsync inspect edit.ecp --base report-v1.docx\n  ecsync apply report-v1.docx edit.ecp -o rebuilt.docx"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand, Debug)]
enum Cmd {
    /// Make a patch that turns BASE into NEW.
    Diff {
        /// The last-synced version.
        base: PathBuf,
        /// The new version.
        new: PathBuf,
        /// Where to write the patch.
        #[arg(short, long)]
        output: PathBuf,
        /// Skip the self-check that the patch applies back to NEW exactly.
        #[arg(long)]
        no_verify: bool,
        /// Use the generic binary delta even for ZIP files (for comparisons).
        #[arg(long)]
        binary: bool,
        /// Spend no extra time for bytes: a large structured patch is checked against the generic delta
        /// at zstd's everyday level, not level 19 (up to ~0.5 s per MB of the two files; an edit's patch is the same).
        #[arg(long)]
        quick: bool,
        /// Check a block-parallel part's recipe on a sample of its blocks (where the edit starts, the last
        /// block, every block boundary), not on every block: faster, but the recipe is then a claim that only
        /// `apply`'s SHA-256 check confirms (with the self-check on, a refuted claim is redone in full).
        #[arg(long)]
        spot_check: bool,
        /// The newest edit-patch format version the receiver reads (1 or 2; default: the newest, 2).
        /// The patch's version byte is the lowest that carries it: without version 2's recipes and modes
        /// it is a version 1 patch.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u8).range(1..=2))]
        max_version: Option<u8>,
    },
    /// Rebuild the new version from BASE and PATCH (written only if its SHA-256 matches).
    Apply {
        /// The version the patch was made against.
        base: PathBuf,
        /// The patch.
        patch: PathBuf,
        /// Where to write the rebuilt file.
        #[arg(short, long)]
        output: PathBuf,
        /// Deflate every changed block of a block-parallel member (LibreOffice's) with zlib, instead of taking
        /// the base member's layout from its block boundaries and making the blocks from its parse (the default;
        /// a file that a wrong claim spoils fails its SHA-256 check and is made again this way).
        #[arg(long)]
        no_claim: bool,
    },
    /// Summarise a patch: kind, sizes, bytes per section, changed members and their recipes.
    Inspect {
        /// The patch.
        patch: PathBuf,
        /// The base, to show member names.
        #[arg(long)]
        base: Option<PathBuf>,
        /// Print JSON for machines.
        #[arg(long)]
        json: bool,
    },
}

/// An error with the file it concerns.
struct Failure {
    file: PathBuf,
    err: PatchError,
}

fn read(p: &Path) -> Result<Vec<u8>, Failure> {
    std::fs::read(p).map_err(|source| Failure { file: p.into(), err: PatchError::Io { path: p.display().to_string(), source } })
}

/// Removes the temporary file when dropped, unless it was renamed into
/// place: on errors and on panics alike, no partial file is left behind.
struct TmpFile(PathBuf);

impl Drop for TmpFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Writes through a temporary sibling and renames it into place on success.
fn write_atomically(dest: &Path, fill: impl FnOnce(&mut dyn Write) -> Result<(), PatchError>) -> Result<(), PatchError> {
    let dir = dest.parent().filter(|d| !d.as_os_str().is_empty()).unwrap_or(Path::new("."));
    let name = dest.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "out".into());
    let guard = TmpFile(dir.join(format!(".{name}.ecsync-{}.tmp", std::process::id())));
    let tmp = &guard.0;
    let io = |source| PatchError::Io { path: dest.display().to_string(), source };
    let file = std::fs::File::create(tmp).map_err(io)?;
    let mut w = std::io::BufWriter::new(file);
    fill(&mut w)?;
    let file = w.into_inner().map_err(|e| io(e.into_error()))?;
    file.sync_all().map_err(io)?;
    std::fs::rename(tmp, dest).map_err(io)
    // `guard` drops here: after a successful rename there is nothing left to remove.
}

fn run(cli: Cli) -> Result<(), Failure> {
    let limits = Limits::default();
    match cli.cmd {
        Cmd::Diff { base, new, output, no_verify, binary, quick, spot_check, max_version } => {
            let (b, n) = (read(&base)?, read(&new)?);
            let opts = DiffOptions { limits, force_binary: binary, quick, spot_check, max_version, ..Default::default() };
            let patch = if no_verify {
                ec_patch::diff(&b, &n, &opts).map(|p| ec_patch::encode(&p))
            } else {
                ec_patch::diff_verified(&b, &n, &opts)
            };
            let patch = patch.map_err(|err| Failure { file: new.clone(), err })?;
            write_atomically(&output, |w| {
                w.write_all(&patch).map_err(|source| PatchError::Io { path: output.display().to_string(), source })
            })
            .map_err(|err| Failure { file: output.clone(), err })?;
            eprintln!(
                "ecsync: {} -> {}: patch of {} bytes for a {}-byte file ({:.2}%)",
                base.display(),
                new.display(),
                patch.len(),
                n.len(),
                100.0 * patch.len() as f64 / n.len().max(1) as f64
            );
        }
        Cmd::Apply { base, patch, output, no_claim } => {
            let (b, p) = (read(&base)?, read(&patch)?);
            let apply = |claim_layouts| {
                let opts = ec_patch::ApplyOptions { claim_layouts };
                write_atomically(&output, |w| ec_patch::apply_with(&b, &p, w, &limits, opts).map(|_| ()))
            };
            match apply(!no_claim) {
                // A claimed layout may have been wrong: made again from zlib alone, and that error reported.
                Err(_) if !no_claim => apply(false),
                done => done,
            }
            .map_err(|err| {
                let file = match err {
                    PatchError::WrongBase { .. } => base.clone(),
                    PatchError::Io { .. } => output.clone(),
                    _ => patch.clone(),
                };
                Failure { file, err }
            })?;
        }
        Cmd::Inspect { patch, base, json } => {
            let p = read(&patch)?;
            let b = base.as_deref().map(read).transpose()?;
            let s = ec_patch::inspect(&p, b.as_deref(), &limits).map_err(|err| Failure { file: patch.clone(), err })?;
            let mut out = std::io::BufWriter::new(std::io::stdout().lock());
            let printed = if json {
                writeln!(out, "{}", serde_json::to_string_pretty(&s).expect("summary serialises"))
            } else {
                print_summary(&mut out, &s)
            };
            match printed.and_then(|()| out.flush()) {
                // The reader has read what it wanted (`ecsync inspect p | head`): not an error.
                Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
                Err(source) => {
                    drop(out.into_parts()); // what is left in the buffer cannot be written either: no second try on drop
                    return Err(Failure { file: "stdout".into(), err: PatchError::Io { path: "stdout".into(), source } });
                }
                Ok(()) => {}
            }
        }
    }
    Ok(())
}

fn print_summary(out: &mut impl Write, s: &ec_patch::Summary) -> std::io::Result<()> {
    writeln!(out, "edit patch v{}, kind {}: {} bytes", s.version, s.kind, s.patch_bytes)?;
    // A version 2 patch may name its base by the first 16 bytes of its SHA-256 (32 hex digits).
    let named = if s.base_sha256.len() < 64 { "sha256 prefix" } else { "sha256" };
    writeln!(out, "  base:   {:>12} bytes  {named} {}", s.base_size, s.base_sha256)?;
    writeln!(out, "  target: {:>12} bytes  sha256 {}", s.target_size, s.target_sha256)?;
    let sections: Vec<String> = s.sections.iter().map(|(k, v)| format!("{k} {v}")).collect();
    writeln!(out, "  bytes by section: {}", sections.join(", "))?;
    if s.kind == "zip" {
        writeln!(out, "  members: {} copied, {} rebuilt", s.copied_members, s.rebuilt_members.len())?;
        for m in &s.rebuilt_members {
            let name = m.name.clone().or(m.base_entry.map(|e| format!("(base member {e})"))).unwrap_or_else(|| "(new member)".into());
            writeln!(
                out,
                "    {name}: kept {} bytes, replaced {} base bytes by {} new ({} {} bytes), recipe {} {} bytes",
                m.kept_prefix, m.replaced_base_bytes, m.new_middle_len, m.middle, m.middle_bytes, m.recipe, m.recipe_bytes
            )?;
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    match run(Cli::parse()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure { file, err }) => {
            match err {
                // I/O errors already name their file.
                PatchError::Io { .. } => eprintln!("ecsync: {err} [{}]", err.code()),
                _ => eprintln!("ecsync: {}: {err} [{}]", file.display(), err.code()),
            }
            ExitCode::FAILURE
        }
    }
}
