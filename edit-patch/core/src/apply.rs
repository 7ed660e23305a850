//! Applying a patch: (base file, patch) → the new file, byte for byte.
//!
//! The output is streamed to a writer through a SHA-256 hasher that refuses
//! to go past the declared size; at the end size and hash must match the
//! patch or the call fails with [`PatchError::TargetMismatch`]. Callers that
//! write to a file must therefore write to a temporary file and rename it
//! only on success ([`apply_to_vec`] does the equivalent in memory).
//!
//! Memory: the base (the caller's), the output (if it is a `Vec`), and for
//! the rebuilt member being written, and at most one started ahead of it
//! (made beside it on other threads, [`ZipApplier::run`]), its base
//! content, new content and compressed data.

use crate::deflate;
use crate::delta;
use crate::diff::{descriptor_lens, sha256, CheckedStreams, NO_STREAMS};
use crate::error::{PatchError, Result};
use crate::format::{self, Body, ContentMode, Member, Patch, Recipe, Segment, ZipBody};
use crate::guids;
use crate::headers::{base_reference, declared, Computed, Direction, Normaliser};
use crate::limits::Limits;
use crate::png;
use crate::rows;
use crate::wire::le16;
use crate::zip::{self, ZipLayout, CENTRAL_FIXED, EOCD_FIXED, LOCAL_FIXED};
use sha2::{Digest, Sha256};
use std::io::Write;

/// What apply did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ApplyStats {
    /// Bytes written (the target size).
    pub written: u64,
    /// Members copied from the base unchanged.
    pub copied_members: u64,
    /// Members rebuilt from content.
    pub rebuilt_members: u64,
    /// Compressed blocks of block-parallel members copied from the base
    /// instead of recomputed (their input was unchanged; see [`crate::deflate::BlockLayout`]).
    pub reused_blocks: u64,
    /// Block-parallel base members whose layout this process did not know
    /// and claimed from their block boundaries ([`ApplyOptions::claim_layouts`]).
    pub claimed_layouts: u64,
}

/// How [`apply_with`] may work.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ApplyOptions {
    /// A block-parallel member whose base member's layout this process does
    /// not know (it neither made nor checked that member) takes the layout
    /// the base member's block boundaries claim ([`deflate::claim_layout`]):
    /// its unchanged blocks are copied and the others made from the base's
    /// parse, as when the layout is known, instead of deflating every block
    /// with zlib. A claim is not a proof: a base member that was not zlib's
    /// output with the recipe's parameters gives other bytes, which fail the
    /// size or SHA-256 check ([`PatchError::TargetMismatch`], or a
    /// malformed-patch error for more bytes than declared), never a wrong
    /// file accepted. The caller then applies again without claims
    /// ([`apply_to_vec`] and `ecsync apply` do), so a wrong claim costs time.
    pub claim_layouts: bool,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

struct Sink<'w> {
    out: &'w mut dyn Write,
    hasher: Sha256,
    written: u64,
    limit: u64,
}

impl Sink<'_> {
    fn put(&mut self, b: &[u8]) -> Result<()> {
        self.written += b.len() as u64;
        if self.written > self.limit {
            return Err(PatchError::malformed("patch", 0, format!("rebuilds more than the declared {} bytes", self.limit)));
        }
        self.hasher.update(b);
        self.out.write_all(b).map_err(|source| PatchError::Io { path: "output".into(), source })
    }
}

/// Applies `patch` to `base`, writing the new file to `out`. On error, what
/// was written must be discarded.
pub fn apply(base: &[u8], patch: &[u8], out: &mut dyn Write, limits: &Limits) -> Result<ApplyStats> {
    apply_with(base, patch, out, limits, ApplyOptions::default())
}

/// [`apply`] with options. With [`ApplyOptions::claim_layouts`], an error
/// may come from a wrong claim: apply again without claims before reporting it.
pub fn apply_with(base: &[u8], patch: &[u8], out: &mut dyn Write, limits: &Limits, opts: ApplyOptions) -> Result<ApplyStats> {
    let p = format::decode(patch, limits)?;
    apply_inner(base, &p, out, limits, None, opts, &std::cell::Cell::new(0))
}

/// Checks that `patch` rebuilds `expected` from `base` (the differ's self-check),
/// writing nothing. The same work as [`apply`], except that a block-parallel
/// member may copy a block from `expected`'s member at the same place where
/// this process checked `expected`'s layout (the differ remembered it once
/// every block was deflated and compared, or copied from a checked base and
/// compared, [`deflate::recall`]) and the block's input, with the window
/// before it, is the same: the bytes deflate makes for it, exactly as blocks
/// are copied from the base. The block where the content first differs from
/// the base's and the last block are deflated all the same, so the check
/// still runs the recipe itself. A patch that is wrong anywhere still fails:
/// what is copied depends only on the rebuilt content, and the size and
/// SHA-256 are checked as always (and must be `expected`'s).
pub fn verify(base: &[u8], patch: &[u8], expected: &[u8], limits: &Limits) -> Result<ApplyStats> {
    verify_checked(base, patch, expected, limits, &NO_STREAMS)
}

/// [`verify`] after the diff that made the patch, which hands over the single
/// zlib streams its search made and compared: a member whose recipe gives
/// one of them, from the very input it was made of, takes that stream
/// instead of deflating again (its framing, the rest of the file and the
/// SHA-256 are checked as always).
pub(crate) fn verify_checked(base: &[u8], patch: &[u8], expected: &[u8], limits: &Limits, checked: &CheckedStreams) -> Result<ApplyStats> {
    let p = format::decode(patch, limits)?;
    let got = sha256(expected);
    if p.target_size != expected.len() as u64 || p.target_sha256 != got {
        return Err(PatchError::TargetMismatch {
            expected: hex(&got),
            expected_size: expected.len() as u64,
            actual: hex(&p.target_sha256),
            actual_size: p.target_size,
        });
    }
    apply_inner(base, &p, &mut std::io::sink(), limits, Some((expected, checked)), ApplyOptions::default(), &std::cell::Cell::new(0))
}

/// Applies and returns the new file only if it matches the patch's hash.
/// Base layouts this process does not know are claimed
/// ([`ApplyOptions::claim_layouts`]); if the file then fails its check, it
/// is made again without claims.
pub fn apply_to_vec(base: &[u8], patch: &[u8], limits: &Limits) -> Result<Vec<u8>> {
    let p = format::decode(patch, limits)?;
    check_base(base, &p)?;
    let mut out = Vec::with_capacity(initial_capacity(&p, base.len(), patch.len(), limits));
    let claimed = std::cell::Cell::new(0);
    match apply_inner(base, &p, &mut out, limits, None, ApplyOptions { claim_layouts: true }, &claimed) {
        Ok(_) => Ok(out),
        Err(_) if claimed.get() > 0 => {
            out.clear();
            apply_decoded(base, &p, &mut out, limits)?;
            Ok(out)
        }
        Err(e) => Err(e),
    }
}

/// Room reserved for the output before any byte is rebuilt: the declared
/// target size only as far as the input can justify it (the base, plus the
/// patch at the largest expansion the limits allow, plus 64 KiB). A forged
/// patch of 100 bytes that declares 2 GiB therefore reserves about the base
/// plus 170 KiB; a real target past this bound (a file that grew by much
/// more than its patch) is grown as its bytes are produced.
fn initial_capacity(p: &Patch, base_len: usize, patch_len: usize, limits: &Limits) -> usize {
    let justified =
        (base_len as u64).saturating_add((patch_len as u64).saturating_mul(limits.max_expansion_ratio)).saturating_add(64 << 10);
    usize::try_from(p.target_size.min(justified)).unwrap_or(usize::MAX)
}

/// The base must be the one the patch names, by size and SHA-256 (or its prefix).
fn check_base(base: &[u8], p: &Patch) -> Result<()> {
    if base.len() as u64 != p.base_size {
        return Err(PatchError::WrongBase {
            expected: hex(p.base_hash.bytes()),
            expected_size: p.base_size,
            actual: hex(&sha256(base)),
            actual_size: base.len() as u64,
        });
    }
    let actual = sha256(base);
    if !p.base_hash.names(&actual) {
        return Err(PatchError::WrongBase {
            expected: hex(p.base_hash.bytes()),
            expected_size: p.base_size,
            actual: hex(&actual),
            actual_size: base.len() as u64,
        });
    }
    Ok(())
}

/// Applies an already decoded patch.
pub fn apply_decoded(base: &[u8], p: &Patch, out: &mut dyn Write, limits: &Limits) -> Result<ApplyStats> {
    apply_inner(base, p, out, limits, None, ApplyOptions::default(), &std::cell::Cell::new(0))
}

fn apply_inner(
    base: &[u8],
    p: &Patch,
    out: &mut dyn Write,
    limits: &Limits,
    expected: Option<(&[u8], &CheckedStreams)>,
    opts: ApplyOptions,
    claimed: &std::cell::Cell<u64>,
) -> Result<ApplyStats> {
    check_base(base, p)?;
    let mut sink = Sink { out, hasher: Sha256::new(), written: 0, limit: p.target_size };
    let mut stats = ApplyStats { written: 0, copied_members: 0, rebuilt_members: 0, reused_blocks: 0, claimed_layouts: 0 };
    match &p.body {
        Body::Identity => sink.put(base)?,
        Body::Binary { frame } => sink.put(&delta::zstd_decompress(frame, base, p.target_size as usize, "binary delta")?)?,
        Body::Zip(z) => {
            let layout = scan_base(base)?;
            // Member runs (version 2) are applied as the segments they stand for.
            let expanded;
            let z = match z.segments.iter().any(|s| matches!(s, Segment::MemberRun { .. })) {
                true => {
                    expanded = expand_with(&layout, z);
                    &expanded
                }
                false => z,
            };
            ZipApplier::new(base, layout, z, limits, expected, opts, claimed)?.run(&mut sink, &mut stats)?
        }
    }
    let got: [u8; 32] = sink.hasher.finalize().into();
    if sink.written != p.target_size || got != p.target_sha256 {
        return Err(PatchError::TargetMismatch {
            expected: hex(&p.target_sha256),
            expected_size: p.target_size,
            actual: hex(&got),
            actual_size: sink.written,
        });
    }
    stats.written = sink.written;
    Ok(stats)
}

/// `z` with its member runs replaced by the segments they stand for
/// ([`Segment::expand`]), which need the base's data descriptors: the
/// patch's segments as version 1 spells them, for `base`.
pub fn expand_runs(base: &[u8], z: &ZipBody) -> Result<ZipBody> {
    Ok(expand_with(&scan_base(base)?, z))
}

/// [`expand_runs`] for a base already scanned.
fn expand_with(layout: &ZipLayout, z: &ZipBody) -> ZipBody {
    let lens = descriptor_lens(layout);
    let segments = z.segments.iter().cloned().flat_map(|s| s.expand(&lens)).collect();
    ZipBody { segments, ..z.clone() }
}

/// The base's members (§5), or why a ZIP patch cannot apply to it.
fn scan_base(base: &[u8]) -> Result<ZipLayout> {
    zip::scan(base).map_err(|e| PatchError::malformed("zip patch", 0, format!("the base is not a ZIP this patch can apply to ({e})")))
}

struct ZipApplier<'a> {
    base: &'a [u8],
    /// Bytes inflated from base members so far (bounded by `max_total_inflated`).
    inflated: std::cell::Cell<u64>,
    /// What the patch's mode 9 and 10 members so far taught (edit-patch-v2.md
    /// §4.9, and §4.11 with flag bit 5): members are prepared in their order,
    /// so each sees its predecessors'.
    learnt: std::cell::RefCell<guids::Learning>,
    /// Compressed blocks copied from the base so far.
    reused_blocks: std::cell::Cell<u64>,
    /// Whether unknown base layouts are claimed ([`ApplyOptions::claim_layouts`]; never when verifying).
    claims: bool,
    /// Base layouts claimed so far (the caller's counter: it outlives an error).
    claimed_layouts: &'a std::cell::Cell<u64>,
    layout: ZipLayout,
    body: &'a ZipBody,
    stream: Vec<u8>,
    at: usize,
    limits: &'a Limits,
    /// [`verify`]'s expected file and its layout (`None` when it is not a ZIP).
    expected: Option<(&'a [u8], ZipLayout)>,
    /// Local headers read so far: the target member being rebuilt is the one before.
    locals: usize,
    /// [`verify_checked`]'s streams (none otherwise).
    checked: &'a CheckedStreams,
}

impl<'a> ZipApplier<'a> {
    fn new(
        base: &'a [u8],
        layout: ZipLayout,
        body: &'a ZipBody,
        limits: &'a Limits,
        expected: Option<(&'a [u8], &'a CheckedStreams)>,
        opts: ApplyOptions,
        claimed: &'a std::cell::Cell<u64>,
    ) -> Result<Self> {
        if layout.entries.len() as u64 != body.base_entries {
            return Err(PatchError::malformed(
                "base entry count",
                0,
                format!("the patch expects {} base members, the base has {}", body.base_entries, layout.entries.len()),
            ));
        }
        let base_stream =
            base_reference(base, &layout, body.fresh_times, &body.renamed, limits.max_part_size).ok_or(PatchError::LimitExceeded {
                what: "growth of the reference's names renumbered (flag bit 4)",
                value: limits.max_part_size.saturating_add(1),
                limit: limits.max_part_size,
            })?;
        let stream = delta::zstd_decompress(&body.header_frame, &base_stream, body.header_len as usize, "header stream")?;
        Ok(ZipApplier {
            base,
            inflated: std::cell::Cell::new(0),
            learnt: std::cell::RefCell::new(guids::Learning::new(body.learnt_amounts)),
            reused_blocks: std::cell::Cell::new(0),
            claims: opts.claim_layouts && expected.is_none(),
            claimed_layouts: claimed,
            layout,
            body,
            stream,
            at: 0,
            limits,
            expected: expected.and_then(|(e, _)| zip::scan(e).ok().map(|l| (e, l))),
            locals: 0,
            checked: expected.map_or(&NO_STREAMS, |(_, c)| c),
        })
    }

    /// [`verify`]: the expected file's member at the place of the member being
    /// rebuilt, as a source of blocks, when this process checked its layout.
    fn expected_blocks(
        &self,
        params: deflate::ZlibParams,
        block: usize,
    ) -> Option<(Vec<u8>, &'a [u8], std::sync::Arc<deflate::BlockLayout>)> {
        let (file, layout) = self.expected.as_ref()?;
        let e = layout.entries.get(self.locals.checked_sub(1)?)?;
        let data = file.get(e.data_offset as usize..(e.data_offset + e.data_len) as usize)?;
        let known = deflate::recall(data).filter(|l| l.params == params && l.block == block)?;
        let content = deflate::inflate(data, self.limits.inflate_bound(data.len() as u64)).ok()?;
        Some((content, data, known))
    }

    /// The next `n` bytes of the header stream.
    fn take(&mut self, n: usize, what: &'static str) -> Result<Vec<u8>> {
        if n > self.stream.len() - self.at {
            return Err(PatchError::malformed(
                what,
                0,
                format!("needs {n} bytes but the header stream has {} left", self.stream.len() - self.at),
            ));
        }
        let v = self.stream[self.at..self.at + n].to_vec();
        self.at += n;
        Ok(v)
    }

    /// The next record whose length is given by `fixed` bytes and the u16 length fields at `fields`.
    fn record(&mut self, fixed: usize, fields: &[usize], what: &'static str) -> Result<Vec<u8>> {
        let head = self
            .stream
            .get(self.at..self.at + fixed)
            .ok_or_else(|| PatchError::malformed(what, 0, "header stream ends inside the record"))?;
        let var: usize = fields.iter().map(|&f| le16(head, f) as usize).sum();
        self.take(fixed + var, what)
    }

    fn base_data(&self, e: u64) -> &'a [u8] {
        let e = &self.layout.entries[e as usize];
        &self.base[e.data_offset as usize..(e.data_offset + e.data_len) as usize]
    }

    /// Writes the new file. A member whose data is one zlib stream (or
    /// another single-threaded recipe) is made on a thread of its own while
    /// the next member is started beside it: its content made, and its
    /// blocks deflated if it is block-parallel ([`ZipApplier::start`]), so
    /// that both CPUs work where one stream would run alone (an .odt's
    /// thumbnail before its `content.xml`). Output is still written in
    /// archive order, each byte as soon as every byte before it is made:
    /// a block-parallel member started ahead is written block by block
    /// once the member before it is written. At most one member is
    /// started ahead of the one being written.
    fn run(mut self, sink: &mut Sink<'_>, stats: &mut ApplyStats) -> Result<()> {
        let desc_lens = descriptor_lens(&self.layout);
        let mut st = Rebuild { n: Normaliser::with_times(Direction::Restore, self.body.fresh_times), pending_local: None, last: None };
        // Verifying makes every member in turn (its block-parallel members copy from the expected file).
        let overlap = self.expected.is_none() && std::thread::available_parallelism().is_ok_and(|n| n.get() > 1);
        std::thread::scope(|s| self.segments(sink, stats, &mut st, &desc_lens, overlap, s))?;
        st.flush(sink, None)?;
        stats.reused_blocks = self.reused_blocks.get();
        stats.claimed_layouts = self.claimed_layouts.get();
        if self.at != self.stream.len() {
            return Err(PatchError::malformed("header stream", 0, format!("{} bytes left unused", self.stream.len() - self.at)));
        }
        Ok(())
    }

    /// [`ZipApplier::run`]'s walk over the segments, in the thread scope
    /// that members made beside it run in.
    fn segments<'s>(
        &mut self,
        sink: &mut Sink<'_>,
        stats: &mut ApplyStats,
        st: &mut Rebuild,
        desc_lens: &[u64],
        overlap: bool,
        s: &'s std::thread::Scope<'s, '_>,
    ) -> Result<()>
    where
        'a: 's,
    {
        let body = self.body;
        // The next member (its index in the segments), started while the one
        // before it is made; an error starting it is its own, raised in turn.
        let mut ahead: Option<(usize, Result<Making<'s, 'a>>)> = None;
        for (i, seg) in body.segments.iter().enumerate() {
            match seg {
                Segment::Local => self.local(st, sink)?,
                Segment::CopyData { base_entry } => self.copy(st, sink, stats, *base_entry)?,
                Segment::Member(m) => {
                    let next = match overlap {
                        true => body.segments[i + 1..].iter().enumerate().find_map(|(k, g)| match g {
                            Segment::Member(n) => Some((i + 1 + k, n)),
                            _ => None,
                        }),
                        false => None,
                    };
                    let making = match ahead.take() {
                        Some((at, made)) => {
                            debug_assert_eq!(at, i, "the member started ahead is the next one");
                            made?
                        }
                        None => self.start(m, sink.limit - sink.written, next.is_some(), s)?,
                    };
                    if let (Making::Thread { .. }, Some((j, n))) = (&making, next) {
                        ahead = Some((j, self.start(n, sink.limit - sink.written, true, s)));
                    }
                    let c = self.finish(m, making, st, sink)?;
                    st.last = Some(c);
                    stats.rebuilt_members += 1;
                }
                Segment::Descriptor { len } => self.descriptor(st, sink, *len as usize)?,
                Segment::Central { count } => {
                    st.flush(sink, None)?;
                    for _ in 0..*count {
                        let mut rec = self.record(CENTRAL_FIXED, &[28, 30, 32], "central record")?;
                        check_sig(&rec, zip::SIG_CENTRAL, "central record")?;
                        st.n.central(&mut rec, sink.written);
                        sink.put(&rec)?;
                    }
                }
                Segment::Eocd => {
                    st.flush(sink, None)?;
                    let mut rec = self.record(EOCD_FIXED, &[20], "end record")?;
                    check_sig(&rec, zip::SIG_EOCD, "end record")?;
                    st.n.eocd(&mut rec);
                    sink.put(&rec)?;
                }
                Segment::Raw { len } => {
                    st.flush(sink, None)?;
                    let rec = self.take(*len as usize, "raw bytes")?;
                    sink.put(&rec)?;
                }
                Segment::EntryRun { base_start, count } => {
                    for b in *base_start..base_start + count {
                        self.local(st, sink)?;
                        self.copy(st, sink, stats, b)?;
                        let d = desc_lens[b as usize];
                        if d > 0 {
                            self.descriptor(st, sink, d as usize)?;
                        }
                    }
                }
                Segment::MemberRun { .. } => return Err(PatchError::malformed("member run", 0, "a member run left unexpanded")),
            }
        }
        Ok(())
    }

    fn local(&mut self, st: &mut Rebuild, sink: &mut Sink<'_>) -> Result<()> {
        self.locals += 1;
        st.flush(sink, None)?;
        let rec = self.record(LOCAL_FIXED, &[26, 28], "local header")?;
        check_sig(&rec, zip::SIG_LOCAL, "local header")?;
        st.pending_local = Some((rec, sink.written));
        Ok(())
    }

    fn copy(&mut self, st: &mut Rebuild, sink: &mut Sink<'_>, stats: &mut ApplyStats, base_entry: u64) -> Result<()> {
        let declared = declared(&self.layout.entries[base_entry as usize]);
        st.flush(sink, Some(declared))?;
        sink.put(self.base_data(base_entry))?;
        st.last = Some(declared);
        stats.copied_members += 1;
        Ok(())
    }

    fn descriptor(&mut self, st: &mut Rebuild, sink: &mut Sink<'_>, len: usize) -> Result<()> {
        st.flush(sink, None)?;
        let mut rec = self.take(len, "data descriptor")?;
        st.n.descriptor(&mut rec, st.last);
        sink.put(&rec)
    }

    /// Member `m`'s content: its base member's content (raw, inflated, or
    /// kept by this process), the delta applied, the content form undone;
    /// with what its recipe may copy blocks from.
    fn prepare(&self, m: &Member) -> Result<Prepared<'a>> {
        // A block-parallel member over a base member whose layout is known
        // (this process made or checked it) copies the unchanged blocks; if
        // this process made that base member, it may still hold its content.
        // Otherwise, with claims, the base member's layout is claimed from its block boundaries.
        let (layout, known_content) = match (&m.recipe, m.base) {
            (Recipe::ZlibBlocks { params, block }, Some((e, ContentMode::Inflate))) => match deflate::recall_content(self.base_data(e)) {
                Some((l, c)) => (Some(Layout { member: e, blocks: l, claimed: false }), c),
                None if self.claims => self.claim(e, *params, *block as usize),
                None => (None, None),
            },
            _ => (None, None),
        };
        let base_content = match m.base {
            None => BaseContent::Made(Vec::new()),
            Some((e, ContentMode::Raw)) => BaseContent::Base(self.base_data(e)),
            Some((_, ContentMode::Inflate)) if known_content.is_some() => {
                let content = known_content.expect("checked");
                self.inflated.set(self.inflated.get() + content.len() as u64);
                Limits::check("total inflated size", self.inflated.get(), self.limits.max_total_inflated)?;
                BaseContent::Kept(content)
            }
            Some((
                e,
                mode @ (ContentMode::Inflate
                | ContentMode::InflateRows
                | ContentMode::InflateOffsets
                | ContentMode::InflateGuids
                | ContentMode::InflateGuidSet
                | ContentMode::InflateDrift
                | ContentMode::InflateRenumbered
                | ContentMode::InflateMapped
                | ContentMode::InflateMappedDelta),
            )) => {
                let data = self.base_data(e);
                let bound = self.limits.inflate_bound(data.len() as u64);
                let content = deflate::inflate(data, bound).map_err(|err| match err {
                    deflate::InflateError::TooLarge => PatchError::ZipBomb {
                        member: String::from_utf8_lossy(&self.layout.entries[e as usize].name).into_owned(),
                        file: "the base file",
                        limit: bound,
                    },
                    deflate::InflateError::Corrupt(why) => {
                        PatchError::malformed("member base reference", 0, format!("base member {e} cannot be inflated: {why}"))
                    }
                })?;
                self.inflated.set(self.inflated.get() + content.len() as u64);
                Limits::check("total inflated size", self.inflated.get(), self.limits.max_total_inflated)?;
                BaseContent::Made(if mode == ContentMode::InflateOffsets {
                    rows::offsets_forward(&content)
                } else if mode.is_guid_form() {
                    guids::forward(&content)
                } else if mode == ContentMode::InflateRows {
                    rows::forward(&content).ok_or_else(|| {
                        PatchError::malformed(
                            "member base reference",
                            0,
                            format!("base member {e} holds byte 0x01 and cannot be made row-relative"),
                        )
                    })?
                } else {
                    content
                })
            }
            Some((e, ContentMode::Png)) => {
                let data = self.base_data(e);
                let content = png::canonicalize(data, self.limits.inflate_bound(data.len() as u64))
                    .ok_or_else(|| {
                        PatchError::malformed("member base reference", 0, format!("base member {e} is not a PNG this patch can use"))
                    })?
                    .content;
                // Image data is inflated too: it counts towards the total.
                self.inflated.set(self.inflated.get() + content.len() as u64);
                Limits::check("total inflated size", self.inflated.get(), self.limits.max_total_inflated)?;
                BaseContent::Made(content)
            }
        };
        // Verifying keeps the base content too: see the zlib-blocks case of `make_here`.
        let keep_base = layout.is_some() || self.expected.is_some();
        let (mut content, base) = match &m.delta.middle {
            // Mode 9: what the members before taught, kept here, in their order.
            delta::Middle::Mapped(drift) => {
                let bound = self.limits.max_part_size.saturating_mul(2);
                let t = guids::apply_learning(base_content.bytes(), drift, &mut self.learnt.borrow_mut(), bound)
                    .map_err(|e| delta::changed_tokens_error(e, bound))?;
                (t, keep_base.then_some(base_content))
            }
            // Mode 10: mode 9's numbers and changes, then the content delta.
            delta::Middle::MappedDelta(drift, then) => {
                let bound = self.limits.max_part_size.saturating_mul(2);
                let t = guids::apply_learning(base_content.bytes(), drift, &mut self.learnt.borrow_mut(), bound)
                    .map_err(|e| delta::changed_tokens_error(e, bound))?;
                (delta::apply_owned(t, then, self.limits)?, keep_base.then_some(base_content))
            }
            _ if keep_base => (delta::apply(base_content.bytes(), &m.delta, self.limits)?, Some(base_content)),
            _ => (delta::apply_owned(base_content.into_vec(), &m.delta, self.limits)?, None),
        };
        if matches!(m.base, Some((_, ContentMode::InflateOffsets))) {
            content = rows::offsets_inverse(&content, self.limits.max_part_size).map_err(|e| match e {
                rows::OffsetsError::TooLong => PatchError::LimitExceeded {
                    what: "part size after the row-offset inverse",
                    value: self.limits.max_part_size + 1,
                    limit: self.limits.max_part_size,
                },
                rows::OffsetsError::Invalid(at, why) => PatchError::malformed("row-offset content", at, why),
            })?;
        }
        if m.base.is_some_and(|(_, mode)| mode.is_guid_form()) {
            content = guids::inverse(&content, self.limits.max_part_size).map_err(|e| match e {
                guids::GuidsError::TooLong => PatchError::LimitExceeded {
                    what: "part size after the GUID-form inverse",
                    value: self.limits.max_part_size + 1,
                    limit: self.limits.max_part_size,
                },
                guids::GuidsError::Invalid(at, why) => PatchError::malformed("GUID-form content", at, why),
            })?;
        }
        if matches!(m.base, Some((_, ContentMode::InflateRows))) {
            content = rows::inverse(&content, self.limits.max_part_size).ok_or(PatchError::LimitExceeded {
                what: "part size after the row-relative inverse",
                value: self.limits.max_part_size + 1,
                limit: self.limits.max_part_size,
            })?;
        }
        Ok(Prepared { content, base, layout })
    }

    /// Base member `e`'s content, and the layout its block boundaries claim
    /// for the block-parallel recipe (`params`, `block`), if they claim one
    /// ([`deflate::claim_layout`]). (None, None) where it cannot be inflated
    /// within the limits: [`ZipApplier::prepare`] then inflates it again,
    /// and reports why.
    fn claim(&self, e: u64, params: deflate::ZlibParams, block: usize) -> (Option<Layout>, Option<deflate::KeptContent>) {
        let data = self.base_data(e);
        let Ok((content, marks)) = deflate::inflate_marking(data, self.limits.inflate_bound(data.len() as u64), block) else {
            return (None, None);
        };
        let claimed = deflate::claim_layout(data, content.len(), &marks, params, block);
        if claimed.is_some() {
            self.claimed_layouts.set(self.claimed_layouts.get() + 1);
        }
        let layout = claimed.map(|l| Layout { member: e, blocks: std::sync::Arc::new(l), claimed: true });
        (layout, Some(std::sync::Arc::new(content)))
    }

    /// Starts member `m`: makes its content ([`ZipApplier::prepare`]), then
    /// sets its recipe running on other threads where that can overlap
    /// other work: a block-parallel member's blocks always (when not
    /// verifying), a single-stream recipe of a large enough content only
    /// when `beside` (another member is started next to it). `room`: what
    /// is left of the declared target before this member (or before the
    /// member being made when this one is started ahead of it: more than
    /// will be left, which [`ZipApplier::finish`] accounts for).
    ///
    /// Memory: a member started ahead holds its content and what its recipe
    /// made so far (for a block-parallel member, at most its compressed
    /// data) until its turn; its base content was inflated, and counted
    /// towards `max_total_inflated`, before it started.
    fn start<'s>(&self, m: &'a Member, room: u64, beside: bool, s: &'s std::thread::Scope<'s, '_>) -> Result<Making<'s, 'a>>
    where
        'a: 's,
    {
        let p = self.prepare(m)?;
        if self.expected.is_some() {
            return Ok(Making::Here(p));
        }
        match &m.recipe {
            Recipe::ZlibBlocks { params, block } => {
                let (params, block) = (*params, *block as usize);
                let Prepared { content, base, layout } = p;
                let claimed = layout.as_ref().is_some_and(|l| l.claimed);
                let (copied, from) = match (layout, base) {
                    (Some(Layout { member: e, blocks: l, .. }), Some(b)) => {
                        let data = self.base_data(e);
                        let from = deflate::BlockBase { content: b.bytes(), data, layout: &l };
                        let copied = from.reusable(&content, params, block).into_iter().map(|r| r.map(|r| &data[r])).collect();
                        // The workers make the other blocks from the base's (a character typed shifts them):
                        // its content is held until they are done.
                        (copied, Some(deflate::JobBase { content: std::sync::Arc::new(b), data, layout: l }))
                    }
                    _ => (vec![None; deflate::block_count(content.len(), params, block).unwrap_or(0)], None),
                };
                let content = std::sync::Arc::new(content);
                let job = deflate::BlockJob::start(s, content.clone(), params, block, copied, from);
                Ok(Making::Blocks { job, content, params, block, claimed })
            }
            Recipe::Zlib(_) | Recipe::Png { .. } | Recipe::Preflate(_) | Recipe::Known(_) if beside && p.content.len() >= BESIDE_MIN => {
                let Prepared { content, base, layout } = p;
                let content = std::sync::Arc::new(content);
                let (recipe, limits, checked, mine) = (&m.recipe, self.limits, self.checked, content.clone());
                let made = std::thread::Builder::new().spawn_scoped(s, move || {
                    make_data(&mine, recipe, limits, room, checked).map(|data| {
                        let c = computed(&mine, &data, recipe);
                        (data, c)
                    })
                });
                match made {
                    Ok(made) => Ok(Making::Thread { made, content, room }),
                    // No thread to be had: made here in its turn (the closure, and its share of the content, are gone).
                    Err(_) => {
                        let content = std::sync::Arc::try_unwrap(content).unwrap_or_else(|c| c.to_vec());
                        Ok(Making::Here(Prepared { content, base, layout }))
                    }
                }
            }
            _ => Ok(Making::Here(p)),
        }
    }

    /// Finishes member `m`'s data, of at most what is left of the declared
    /// target, and writes it after its pending local header; returns its
    /// computed values. A block-parallel member whose local header defers
    /// its sizes to a data descriptor (LibreOffice's) is written block by
    /// block as its blocks are made ([`deflate::BlockJob::hand_on`]).
    fn finish(&self, m: &Member, making: Making<'_, 'a>, st: &mut Rebuild, sink: &mut Sink<'_>) -> Result<Computed> {
        let room = sink.limit - sink.written;
        match making {
            Making::Here(p) => self.make_here(m, p, st, sink, room),
            Making::Thread { made, content, room: given } => {
                let made = made.join().unwrap_or_else(|panic| std::panic::resume_unwind(panic));
                // A member started ahead was given the room left before the
                // member before it was written: its data past what is left
                // now, or its refusal, is made again with the room of now,
                // which gives exactly the refusal of a member made in turn
                // (errors only).
                let (data, c) = match made {
                    Ok((data, c)) if data.len() as u64 <= room => (data, c),
                    Err(e) if given == room => return Err(e),
                    _ => {
                        let data = make_data(&content, &m.recipe, self.limits, room, self.checked)?;
                        let c = computed(&content, &data, &m.recipe);
                        (data, c)
                    }
                };
                drop(content);
                st.flush(sink, Some(c))?;
                sink.put(&data)?;
                Ok(c)
            }
            Making::Blocks { job, content, params, block, claimed } => {
                let refused = || PatchError::codec("zlib-blocks recipe", format!("zlib refused {params:?} with {block}-byte blocks"));
                let crc = crc32fast::hash(&content);
                // LibreOffice's members: the local header does not wait for the sizes.
                let deferred = st.pending_local.as_ref().is_none_or(|(rec, _)| le16(rec, 6) & 0x0008 != 0);
                if deferred {
                    st.flush(sink, None)?;
                    let mut failed = None;
                    let made = job.and_then(|job| {
                        job.hand_on(|b| match sink.put(b) {
                            Ok(()) => true,
                            Err(e) => {
                                failed = Some(e);
                                false
                            }
                        })
                    });
                    if let Some(e) = failed {
                        return Err(e);
                    }
                    let (made, reused, key) = made.ok_or_else(refused)?;
                    let c = Computed { crc, csize: made.ends.last().map_or(0, |&n| n as u64), usize: content.len() as u64 };
                    self.reused_blocks.set(self.reused_blocks.get() + reused as u64);
                    deflate::remember_made_as(key, made, content, !claimed);
                    return Ok(c);
                }
                let mut data = Vec::new();
                let (made, reused, _) = job
                    .and_then(|job| {
                        job.hand_on(|b| {
                            data.extend_from_slice(b);
                            true
                        })
                    })
                    .ok_or_else(refused)?;
                self.reused_blocks.set(self.reused_blocks.get() + reused as u64);
                deflate::remember_as(&data, made, !claimed);
                let c = Computed { crc, csize: data.len() as u64, usize: content.len() as u64 };
                st.flush(sink, Some(c))?;
                sink.put(&data)?;
                Ok(c)
            }
        }
    }

    /// Makes a prepared member's data on this thread and writes it: every
    /// member when verifying, and a member with nothing to overlap.
    fn make_here(&self, m: &Member, p: Prepared<'a>, st: &mut Rebuild, sink: &mut Sink<'_>, room: u64) -> Result<Computed> {
        let Prepared { content, base, layout } = p;
        let base_content = base.as_ref().map(BaseContent::bytes);
        let data = match &m.recipe {
            Recipe::ZlibBlocks { params, block } => {
                let expected = self.expected_blocks(*params, *block as usize);
                let base = match &expected {
                    // Verifying: the expected member has every block, changed or not.
                    Some((c, data, l)) => Some(deflate::BlockBase { content: c, data, layout: l }),
                    None => layout.as_ref().zip(base_content).map(|(l, c)| deflate::BlockBase {
                        content: c,
                        data: self.base_data(l.member),
                        layout: &l.blocks,
                    }),
                };
                let (data, made, reused) = deflate::deflate_blocks_reusing(&content, *params, *block as usize, base)
                    .ok_or_else(|| PatchError::codec("zlib-blocks recipe", format!("zlib refused {params:?} with {block}-byte blocks")))?;
                if let (Some(_), Some(b)) = (&expected, base_content) {
                    // Blocks copied from the expected file rest on the layout the same
                    // diff remembered: the block where the content first differs from
                    // the base's and the last block are deflated again all the same,
                    // so that the self-check still runs the recipe where it matters.
                    let first = content.iter().zip(b.iter()).position(|(x, y)| x != y).unwrap_or(content.len().min(b.len()));
                    let last = made.ends.len() - 1;
                    for k in [(first / *block as usize).min(last), last] {
                        let range = made.data_range(k).expect("one end per block");
                        if !deflate::block_is(&content, *params, *block as usize, k, &data[range]) {
                            return Err(PatchError::codec(
                                "zlib-blocks recipe",
                                format!("block {k}, copied from the expected file, is not what zlib makes of its input"),
                            ));
                        }
                    }
                }
                self.reused_blocks.set(self.reused_blocks.get() + reused as u64);
                deflate::remember_as(&data, made, !layout.is_some_and(|l| l.claimed));
                data
            }
            _ => make_data(&content, &m.recipe, self.limits, room, self.checked)?,
        };
        let c = computed(&content, &data, &m.recipe);
        st.flush(sink, Some(c))?;
        sink.put(&data)?;
        Ok(c)
    }
}

/// A single-stream recipe runs on a thread of its own beside the next
/// member only for a content of at least this many bytes (a smaller one
/// deflates in about the time a thread takes to start).
const BESIDE_MIN: usize = 16 << 10;

/// A base member's content: the base file's own bytes, made here (inflated,
/// maybe put in a content form), or kept by this process since it made
/// that member ([`deflate::recall_content`]).
enum BaseContent<'a> {
    Base(&'a [u8]),
    Made(Vec<u8>),
    Kept(deflate::KeptContent),
}

impl AsRef<[u8]> for BaseContent<'_> {
    fn as_ref(&self) -> &[u8] {
        self.bytes()
    }
}

impl BaseContent<'_> {
    fn bytes(&self) -> &[u8] {
        match self {
            BaseContent::Base(b) => b,
            BaseContent::Made(v) => v,
            BaseContent::Kept(k) => k,
        }
    }

    fn into_vec(self) -> Vec<u8> {
        match self {
            BaseContent::Base(b) => b.to_vec(),
            BaseContent::Made(v) => v,
            BaseContent::Kept(k) => std::sync::Arc::try_unwrap(k).unwrap_or_else(|k| k.to_vec()),
        }
    }
}

/// A member's content ready for its recipe ([`ZipApplier::prepare`]): the
/// base content it was made from is kept where the recipe may copy blocks
/// (with the base member's index and block layout) or verifies.
struct Prepared<'a> {
    content: Vec<u8>,
    base: Option<BaseContent<'a>>,
    layout: Option<Layout>,
}

/// The block layout of a base member: remembered by this process (it made
/// or checked that member) or claimed ([`ZipApplier::claim`]).
struct Layout {
    member: u64,
    blocks: std::sync::Arc<deflate::BlockLayout>,
    claimed: bool,
}

/// A member's data and its computed values.
type MadeData = (Vec<u8>, Computed);

/// A member on its way to the output ([`ZipApplier::start`], then [`ZipApplier::finish`]).
enum Making<'s, 'a> {
    /// To be made on this thread in its turn.
    Here(Prepared<'a>),
    /// A single-stream recipe on a thread of its own, made of `content`
    /// with `room`; it hands back the data and its computed values.
    Thread { made: std::thread::ScopedJoinHandle<'s, Result<MadeData>>, content: std::sync::Arc<Vec<u8>>, room: u64 },
    /// A block-parallel member, its blocks being made (`None`: zlib cannot make it).
    Blocks {
        job: Option<deflate::BlockJob<'s, 'a>>,
        content: std::sync::Arc<Vec<u8>>,
        params: deflate::ZlibParams,
        block: usize,
        /// Made over a claimed base layout: what it made is remembered as a claim.
        claimed: bool,
    },
}

/// A member's computed values from its content and data: the content's,
/// except for a stored PNG, whose uncompressed bytes are its data.
fn computed(content: &[u8], data: &[u8], recipe: &Recipe) -> Computed {
    let plain = if matches!(recipe, Recipe::Png { .. }) { data } else { content };
    Computed { crc: crc32fast::hash(plain), csize: data.len() as u64, usize: plain.len() as u64 }
}

/// The error for member data that would not fit in what is left of the target.
fn past_target(room: u64) -> PatchError {
    PatchError::malformed("patch", 0, format!("a member rebuilds more than the {room} bytes left of the declared target"))
}

/// Runs a recipe: member data from content, of at most `room` bytes. Data
/// that would be larger is refused before it is made where its size is
/// known in advance (stored, PNG framing), and as it is made by preflate;
/// zlib's output is bounded by the content (deflate does not expand by more
/// than a few bytes per 16 KiB).
/// `checked`: streams a diff's search made ([`verify_checked`]).
fn make_data(content: &[u8], recipe: &Recipe, limits: &Limits, room: u64, checked: &CheckedStreams) -> Result<Vec<u8>> {
    Ok(match recipe {
        Recipe::Stored => {
            if content.len() as u64 > room {
                return Err(past_target(room));
            }
            content.to_vec()
        }
        Recipe::Zlib(p) => match checked.stream(content, *p) {
            Some(made) => made.to_vec(),
            None => deflate::deflate(content, *p).ok_or_else(|| PatchError::codec("zlib recipe", format!("zlib refused {p:?}")))?,
        },
        Recipe::ZlibBlocks { params, block } => deflate::deflate_blocks(content, *params, *block as usize)
            .ok_or_else(|| PatchError::codec("zlib-blocks recipe", format!("zlib refused {params:?} with {block}-byte blocks")))?,
        Recipe::Preflate(c) => crate::deflate::preflate_recreate(content, c, limits, room)?,
        // Bounded as it is made: a rebuild past what is left of the target stops there.
        Recipe::Known(k) => crate::deflaters::deflate(content, *k, room).map_err(|f| match f {
            crate::deflaters::Failure::TooLong => past_target(room),
            crate::deflaters::Failure::Codec => PatchError::codec("deflater recipe", format!("{} refused level {}", k.name(), k.level)),
        })?,
        Recipe::Raw(b) => b.clone(),
        Recipe::Png { frame, inner } => {
            let bad = || PatchError::malformed("PNG recipe", 0, "frame does not fit the content");
            let image = png::image_of(content, frame).ok_or_else(bad)?;
            // Head, tail and 12 bytes of framing per IDAT chunk of the zlib stream (2 + data + 4 bytes).
            let framing = frame.head_len.saturating_add(frame.tail_len).saturating_add(6);
            let stream = make_data(image, inner, limits, room.saturating_sub(framing), checked)?;
            let z_len = stream.len() as u64 + 6;
            let png_len = framing - 6 + z_len + frame.chunks_for(z_len) * 12;
            if png_len > room {
                return Err(past_target(room));
            }
            png::rebuild(content, frame, &stream).ok_or_else(bad)?
        }
    })
}

/// Restoration state: a local header waits for its data, whose computed
/// values it needs, before it is written.
struct Rebuild {
    n: Normaliser,
    pending_local: Option<(Vec<u8>, u64)>,
    last: Option<Computed>,
}

impl Rebuild {
    fn flush(&mut self, sink: &mut Sink<'_>, c: Option<Computed>) -> Result<()> {
        if let Some((mut rec, off)) = self.pending_local.take() {
            self.n.local(&mut rec, off, c);
            sink.put(&rec)?;
        }
        Ok(())
    }
}

fn check_sig(rec: &[u8], sig: u32, what: &'static str) -> Result<()> {
    if crate::wire::le32(rec, 0) != sig {
        return Err(PatchError::malformed(what, 0, "the header stream does not hold a record of this kind here"));
    }
    Ok(())
}
