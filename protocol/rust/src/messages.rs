//! The messages of spec §4: structs, `encode` and `decode`.
//!
//! Decoding is defensive and purely structural (§5.1 step 2): every count
//! and length is checked against [`Limits`] and the bytes left before
//! anything is allocated; reserved bits, unknown enumerated values,
//! non-shortest varints, truncation and trailing bytes are `malformed`, a
//! wrong version byte is `unsupported_version`, and the codes the field
//! tables name (`limit_exceeded`, `too_large`) are used where they apply.
//! Decoding neither verifies MACs nor resolves contexts: that needs the
//! EPS's session state (see [`crate::resolve`] and [`crate::mac`]). Each
//! `decode` returns a [`Framing`]: where *S* (the MACed span) ends, the MAC,
//! and where payloads start.
//!
//! Encoding writes *S* with `to_s` and appends the MAC with `encode`.

use crate::cb::Cb;
use crate::error::{ErrorCode, ProtoError, Result};
use crate::limits::{Limits, MAX_LIMIT_PAIRS};
use crate::mac::{request_mac, response_mac, MAC_LEN, ZERO_MAC};
use crate::wire::{Reader, Writer};

/// Path of HELLO.
pub const PATH_HELLO: &str = "/ec/hello";
/// Path of SAVE.
pub const PATH_SAVE: &str = "/ec/1/save";
/// Path of FETCH.
pub const PATH_FETCH: &str = "/ec/1/fetch";

/// The `version` byte of HELLO and HELLO_OK.
pub const HELLO_VERSION: u8 = 0;
/// The `version` byte of every other message of protocol version 1.
pub const PROTOCOL_VERSION: u8 = 1;

/// Message types (§4.1).
pub mod msg_type {
    pub const HELLO: u8 = 0x01;
    pub const HELLO_OK: u8 = 0x81;
    pub const SAVE: u8 = 0x02;
    pub const SAVE_RESULT: u8 = 0x82;
    pub const FETCH: u8 = 0x03;
    pub const FETCH_RESULT: u8 = 0x83;
    pub const ERROR: u8 = 0xE0;
    /// Every type of version 1.
    pub const ALL: [u8; 7] = [HELLO, HELLO_OK, SAVE, SAVE_RESULT, FETCH, FETCH_RESULT, ERROR];
}

/// Flag bits (§4.1, §4.8).
pub mod flags {
    /// SAVE, FETCH: `resp_ref` follows.
    pub const RESP_REF: u8 = 0x01;
    /// SAVE_RESULT: answered from an idempotency record.
    pub const REPLAYED: u8 = 0x01;
    /// Results: the CBs are coded against the referenced response.
    pub const REF_USED: u8 = 0x02;
    /// Results: a provider hash disagreed (§6.7).
    pub const HASH_DISAGREEMENT: u8 = 0x04;
    /// FETCH `fetch_flags`: follow a redirect (§6.8).
    pub const FOLLOW_REDIRECT: u8 = 0x01;
}

/// Longest `label` of a HELLO.
pub const MAX_LABEL: u64 = 64;
/// Longest `binding` of an item.
pub const MAX_BINDING: u64 = 128;
/// Longest `account` of a document key.
pub const MAX_ACCOUNT: u64 = 256;
/// Longest `ref` of a document key.
pub const MAX_REF: u64 = 4096;
/// Longest `cause` of an ERROR.
pub const MAX_CAUSE: u64 = 32;
/// Longest `detail` of an ERROR.
pub const MAX_DETAIL: u64 = 256;
/// The most request specifications a SAVE may carry: the most any procedure takes (§4.5, §6).
pub const MAX_REQUESTS: u64 = 2;

/// Where the parts of a decoded message lie in its bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Framing {
    /// *S* is `bytes[..s_len]`; the MAC follows it.
    pub s_len: usize,
    /// The message's MAC.
    pub mac: [u8; MAC_LEN],
    /// Where payloads start (`s_len + 16`).
    pub payload_offset: usize,
}

impl Framing {
    /// The span the MAC covers.
    pub fn s<'a>(&self, bytes: &'a [u8]) -> &'a [u8] {
        &bytes[..self.s_len]
    }
}

/// The type byte of a message, if it has one (to pick a decoder for an answer).
pub fn peek_type(bytes: &[u8]) -> Option<u8> {
    bytes.get(1).copied()
}

fn append_mac(mut s: Vec<u8>, mac: [u8; MAC_LEN]) -> Vec<u8> {
    s.extend_from_slice(&mac);
    s
}

/// Reads the common header and returns the flags, rejecting reserved bits.
fn read_header(r: &mut Reader<'_>, version: &[u8], ty: u8, allowed_flags: u8) -> Result<u8> {
    let v = r.u8("version")?;
    if !version.contains(&v) {
        return Err(ProtoError::new(ErrorCode::UnsupportedVersion, format!("version byte {v}, expected {}", version[0])));
    }
    let t = r.u8("type")?;
    if !msg_type::ALL.contains(&t) {
        return Err(ProtoError::malformed(format!("unknown message type 0x{t:02x}")));
    }
    if t != ty {
        return Err(ProtoError::malformed(format!("message type 0x{t:02x} where 0x{ty:02x} belongs")));
    }
    let f = r.u8("flags")?;
    if f & !allowed_flags != 0 {
        return Err(ProtoError::malformed(format!("reserved flag bits 0x{:02x} set", f & !allowed_flags)));
    }
    Ok(f)
}

/// Decodes the structured part with `body`, bounded by `max_envelope`
/// (`too_large` when the structured part does not fit), then the MAC, then
/// requires the end of the message unless `payloads` is set.
fn decode_framed<T>(
    bytes: &[u8],
    max_envelope: u64,
    payloads: bool,
    body: impl FnOnce(&mut Reader<'_>) -> Result<T>,
) -> Result<(T, Framing)> {
    let cap = usize::try_from(max_envelope).unwrap_or(usize::MAX).min(bytes.len());
    let mut r = Reader::new(&bytes[..cap]);
    let msg = match body(&mut r) {
        Ok(m) => m,
        Err(e) if r.ran_out() && cap < bytes.len() => {
            return Err(ProtoError::new(
                ErrorCode::TooLarge,
                format!("the structured part is longer than max_envelope {max_envelope} ({})", e.detail),
            ))
        }
        Err(e) => return Err(e),
    };
    let s_len = r.pos();
    let mut rest = Reader::new(&bytes[s_len..]);
    let mac: [u8; MAC_LEN] =
        rest.array("mac").map_err(|_| ProtoError::malformed(format!("the message ends inside mac at byte {s_len}")))?;
    if !payloads && !rest.is_at_end() {
        return Err(ProtoError::malformed(format!("{} bytes after the mac", rest.remaining())));
    }
    Ok((msg, Framing { s_len, mac, payload_offset: s_len + MAC_LEN }))
}

fn read_versions(r: &mut Reader<'_>, what: &str) -> Result<Vec<u8>> {
    let v = r.blob_max(what, 256, ErrorCode::Malformed)?;
    if v.is_empty() || v.windows(2).any(|w| w[0] <= w[1]) {
        return Err(ProtoError::malformed(format!("{what} is empty or not strictly descending")));
    }
    Ok(v.to_vec())
}

fn read_flag_byte(r: &mut Reader<'_>, what: &str) -> Result<bool> {
    match r.u8(what)? {
        0 => Ok(false),
        1 => Ok(true),
        v => Err(ProtoError::malformed(format!("{what} is {v}, not 0 or 1"))),
    }
}

fn read_text(r: &mut Reader<'_>, what: &str, max: u64, over: ErrorCode, ascii: bool) -> Result<String> {
    let b = r.blob_max(what, max, over)?;
    if ascii && !b.is_ascii() {
        return Err(ProtoError::malformed(format!("{what} is not ASCII")));
    }
    String::from_utf8(b.to_vec()).map_err(|_| ProtoError::malformed(format!("{what} is not UTF-8")))
}

// ---------------------------------------------------------------- HELLO

/// HELLO (§4.2): opens a session.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hello {
    /// Which instance key the MAC uses.
    pub key_id: u64,
    /// Random; makes the answer's MAC fresh.
    pub device_nonce: [u8; 16],
    /// Protocol versions, strictly descending.
    pub versions: Vec<u8>,
    /// Edit-patch versions the device can apply, strictly descending.
    pub patch_versions: Vec<u8>,
    /// Capability bits wanted (§11).
    pub caps: u64,
    /// Device name for logs, at most 64 bytes.
    pub label: String,
}

impl Hello {
    /// *S*.
    pub fn to_s(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(&[HELLO_VERSION, msg_type::HELLO, 0]);
        w.varint(self.key_id);
        w.bytes(&self.device_nonce);
        w.blob(&self.versions);
        w.blob(&self.patch_versions);
        w.varint(self.caps);
        w.blob(self.label.as_bytes());
        w.into_bytes()
    }
    /// The message, MACed for [`PATH_HELLO`].
    pub fn encode(&self, secret: &[u8]) -> Vec<u8> {
        let s = self.to_s();
        let mac = request_mac(secret, PATH_HELLO, &s);
        append_mac(s, mac)
    }
    /// Decodes a HELLO.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<(Hello, Framing)> {
        decode_framed(bytes, limits.max_envelope, false, |r| {
            read_header(r, &[HELLO_VERSION], msg_type::HELLO, 0)?;
            Ok(Hello {
                key_id: r.varint("key_id")?,
                device_nonce: r.array("device_nonce")?,
                versions: read_versions(r, "versions")?,
                patch_versions: read_versions(r, "patch_versions")?,
                caps: r.varint("caps")?,
                label: read_text(r, "label", MAX_LABEL, ErrorCode::LimitExceeded, false)?,
            })
        })
    }
}

/// HELLO_OK (§4.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HelloOk {
    /// The highest version both sides speak.
    pub chosen_version: u8,
    /// The new session.
    pub session_id: [u8; 8],
    /// The EPS's capability bits.
    pub caps: u64,
    /// Edit-patch versions the EPS can apply, strictly descending.
    pub patch_versions: Vec<u8>,
    /// (id, value) pairs of §9, at most 64.
    pub limits: Vec<(u64, u64)>,
}

impl HelloOk {
    /// *S*.
    pub fn to_s(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(&[HELLO_VERSION, msg_type::HELLO_OK, 0, self.chosen_version]);
        w.bytes(&self.session_id);
        w.varint(self.caps);
        w.blob(&self.patch_versions);
        w.varint(self.limits.len() as u64);
        for &(id, v) in &self.limits {
            w.varint(id);
            w.varint(v);
        }
        w.into_bytes()
    }
    /// The message, MACed as the answer to the request MAC `req_mac`.
    pub fn encode(&self, secret: &[u8], req_mac: &[u8; MAC_LEN]) -> Vec<u8> {
        let s = self.to_s();
        let mac = response_mac(secret, req_mac, &s);
        append_mac(s, mac)
    }
    /// Decodes a HELLO_OK.
    pub fn decode(bytes: &[u8]) -> Result<(HelloOk, Framing)> {
        decode_framed(bytes, u64::MAX, false, |r| {
            read_header(r, &[HELLO_VERSION], msg_type::HELLO_OK, 0)?;
            let chosen_version = r.u8("chosen_version")?;
            let session_id = r.array("session_id")?;
            let caps = r.varint("caps")?;
            let patch_versions = read_versions(r, "patch_versions")?;
            let n = r.count("limit_count", MAX_LIMIT_PAIRS, ErrorCode::Malformed, 2)?;
            let mut limits = Vec::with_capacity(n);
            for _ in 0..n {
                limits.push((r.varint("limit id")?, r.varint("limit value")?));
            }
            Ok(HelloOk { chosen_version, session_id, caps, patch_versions, limits })
        })
    }
    /// The limits advertised, defaults for ids not listed.
    pub fn limits(&self) -> Limits {
        Limits::from_pairs(&self.limits)
    }
}

// ---------------------------------------------------------------- shared parts

/// Providers of a document key (§4.4.1).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Provider {
    Dropbox = 1,
    Graph = 2,
    Drive = 3,
    WebDav = 4,
}

impl Provider {
    /// The provider with this wire number.
    pub fn from_u8(v: u8) -> Option<Provider> {
        [Provider::Dropbox, Provider::Graph, Provider::Drive, Provider::WebDav].get(usize::from(v).wrapping_sub(1)).copied()
    }
    /// Lower-case name, for vectors and metrics labels.
    pub fn name(self) -> &'static str {
        match self {
            Provider::Dropbox => "dropbox",
            Provider::Graph => "graph",
            Provider::Drive => "drive",
            Provider::WebDav => "webdav",
        }
    }
}

/// A document key (§4.4.1): opaque bytes, never a file name.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DocKey {
    pub provider: Provider,
    /// 1–256 bytes.
    pub account: Vec<u8>,
    /// 1–4,096 bytes.
    pub reference: Vec<u8>,
}

impl DocKey {
    fn write(&self, w: &mut Writer) {
        w.u8(self.provider as u8);
        w.blob(&self.account);
        w.blob(&self.reference);
    }
    fn read(r: &mut Reader<'_>) -> Result<DocKey> {
        let p = r.u8("provider")?;
        let provider = Provider::from_u8(p).ok_or_else(|| ProtoError::malformed(format!("unknown provider {p}")))?;
        let account = r.blob_max("account", MAX_ACCOUNT, ErrorCode::LimitExceeded)?;
        let reference = r.blob_max("ref", MAX_REF, ErrorCode::LimitExceeded)?;
        if account.is_empty() || reference.is_empty() {
            return Err(ProtoError::malformed("a document key with an empty account or ref"));
        }
        Ok(DocKey { provider, account: account.to_vec(), reference: reference.to_vec() })
    }
    /// The encoded key (its wire form), as the store key and the operation
    /// digest use it.
    pub fn encode(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.write(&mut w);
        w.into_bytes()
    }
    /// SHA-256 of the encoded key: the EPS's store key (§4.4.1).
    pub fn store_key(&self) -> [u8; 32] {
        use sha2::Digest;
        sha2::Sha256::digest(self.encode()).into()
    }
}

fn write_opt_doc(w: &mut Writer, doc: &Option<DocKey>) {
    match doc {
        None => w.u8(0),
        Some(d) => {
            w.u8(1);
            d.write(w);
        }
    }
}

fn read_opt_doc(r: &mut Reader<'_>) -> Result<Option<DocKey>> {
    Ok(if read_flag_byte(r, "has_doc")? { Some(DocKey::read(r)?) } else { None })
}

/// A context definition (§4.3.2). The head is kept as bytes: it is checked
/// against §4.3.1 after the MAC (see [`crate::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CtxDef {
    pub ctx_id: u64,
    pub head: Vec<u8>,
    pub body: Vec<u8>,
    pub doc: Option<DocKey>,
}

fn write_defs(w: &mut Writer, defs: &[CtxDef]) {
    w.varint(defs.len() as u64);
    for d in defs {
        w.varint(d.ctx_id);
        w.blob(&d.head);
        w.blob(&d.body);
        write_opt_doc(w, &d.doc);
    }
}

fn read_defs(r: &mut Reader<'_>, limits: &Limits) -> Result<Vec<CtxDef>> {
    let n = r.count("ctx_def_count", limits.max_contexts, ErrorCode::LimitExceeded, 4)?;
    let mut defs = Vec::with_capacity(n);
    for _ in 0..n {
        defs.push(CtxDef {
            ctx_id: r.varint("ctx_id")?,
            head: r.blob_max("context head", limits.max_head, ErrorCode::LimitExceeded)?.to_vec(),
            body: r.blob_max("context body", limits.max_body_ref, ErrorCode::LimitExceeded)?.to_vec(),
            doc: read_opt_doc(r)?,
        });
    }
    Ok(defs)
}

/// The body of a request specification (§4.3.3), as it travels.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BodySpec {
    /// 0: no body.
    Empty,
    /// 1: the file of item `item`.
    File { item: u64 },
    /// 2: the decoded `bytes`.
    Bytes { bytes: Cb },
    /// 3: `bytes[..split]` ‖ file of `item` ‖ `bytes[split..]`.
    Wrapped { item: u64, bytes: Cb, split: u64 },
}

impl BodySpec {
    /// The `body_kind` byte.
    pub fn kind(&self) -> u8 {
        match self {
            BodySpec::Empty => 0,
            BodySpec::File { .. } => 1,
            BodySpec::Bytes { .. } => 2,
            BodySpec::Wrapped { .. } => 3,
        }
    }
    /// The item whose file is (in) the body.
    pub fn item(&self) -> Option<u64> {
        match self {
            BodySpec::File { item } | BodySpec::Wrapped { item, .. } => Some(*item),
            _ => None,
        }
    }
}

/// A request specification (§4.3.3).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestSpec {
    /// A context, or 0 for none.
    pub ctx_id: u64,
    /// The head against the context's head.
    pub head: Cb,
    pub body: BodySpec,
}

impl RequestSpec {
    fn write(&self, w: &mut Writer) {
        w.varint(self.ctx_id);
        self.head.write(w);
        w.u8(self.body.kind());
        match &self.body {
            BodySpec::Empty => {}
            BodySpec::File { item } => w.varint(*item),
            BodySpec::Bytes { bytes } => bytes.write(w),
            BodySpec::Wrapped { item, bytes, split } => {
                w.varint(*item);
                bytes.write(w);
                w.varint(*split);
            }
        }
    }
    fn read(r: &mut Reader<'_>, limits: &Limits) -> Result<RequestSpec> {
        let ctx_id = r.varint("ctx_id")?;
        let head = Cb::read(r, "head", limits.max_head, ErrorCode::LimitExceeded)?;
        let at = r.pos();
        let body = match r.u8("body_kind")? {
            0 => BodySpec::Empty,
            1 => BodySpec::File { item: r.varint("item")? },
            2 => BodySpec::Bytes { bytes: Cb::read(r, "bytes", limits.max_body_ref, ErrorCode::LimitExceeded)? },
            3 => {
                let item = r.varint("item")?;
                let bytes = Cb::read(r, "bytes", limits.max_body_ref, ErrorCode::LimitExceeded)?;
                BodySpec::Wrapped { item, bytes, split: r.varint("split")? }
            }
            k => return Err(ProtoError::malformed(format!("unknown body_kind {k} at byte {at}"))),
        };
        Ok(RequestSpec { ctx_id, head, body })
    }
}

/// The fields SAVE and FETCH share after the first three bytes (§4.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHeader {
    pub session_id: [u8; 8],
    /// ≥ 1.
    pub seq: u64,
    pub request_id: [u8; 8],
    /// The digest of a response the device holds (flag RESP_REF).
    pub resp_ref: Option<[u8; 8]>,
}

impl RequestHeader {
    fn write(&self, w: &mut Writer, version: u8, ty: u8) {
        w.bytes(&[version, ty, if self.resp_ref.is_some() { flags::RESP_REF } else { 0 }]);
        w.bytes(&self.session_id);
        w.varint(self.seq);
        w.bytes(&self.request_id);
        if let Some(rr) = &self.resp_ref {
            w.bytes(rr);
        }
    }
    fn read(r: &mut Reader<'_>, ty: u8) -> Result<RequestHeader> {
        let f = read_header(r, &[PROTOCOL_VERSION], ty, flags::RESP_REF)?;
        let session_id = r.array("session_id")?;
        let at = r.pos();
        let seq = r.varint("seq")?;
        if seq == 0 {
            return Err(ProtoError::malformed(format!("seq is zero at byte {at}")));
        }
        let request_id = r.array("request_id")?;
        let resp_ref = if f & flags::RESP_REF != 0 { Some(r.array("resp_ref")?) } else { None };
        Ok(RequestHeader { session_id, seq, request_id, resp_ref })
    }
}

// ---------------------------------------------------------------- SAVE

/// Procedures (§6).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Procedure {
    Single = 0,
    DropboxSession = 1,
    DropboxBatch = 2,
    GraphSession = 3,
    DriveResumable = 4,
    NextcloudChunked = 5,
}

impl Procedure {
    /// The procedure with this wire number.
    pub fn from_u8(v: u8) -> Option<Procedure> {
        use Procedure::*;
        [Single, DropboxSession, DropboxBatch, GraphSession, DriveResumable, NextcloudChunked].get(usize::from(v)).copied()
    }
    /// Upper-case name as in the spec.
    pub fn name(self) -> &'static str {
        use Procedure::*;
        match self {
            Single => "SINGLE",
            DropboxSession => "DROPBOX_SESSION",
            DropboxBatch => "DROPBOX_BATCH",
            GraphSession => "GRAPH_SESSION",
            DriveResumable => "DRIVE_RESUMABLE",
            NextcloudChunked => "NEXTCLOUD_CHUNKED",
        }
    }
    /// Its capability bit (§11).
    pub fn cap_bit(self) -> u64 {
        1 << (self as u8)
    }
}

/// How an item's file travels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Payload {
    /// An edit patch of `payload_len` bytes.
    Patch { payload_len: u64 },
    /// The whole file (`target_size` bytes).
    Full,
}

/// An item (§4.4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Item {
    /// `None`: the key of the context of the save's first request.
    pub doc: Option<DocKey>,
    /// At most 128 bytes; empty when unused.
    pub binding: Vec<u8>,
    pub payload: Payload,
    pub target_size: u64,
    pub target_sha256: [u8; 32],
}

impl Item {
    /// Bytes of its payload.
    pub fn payload_len(&self) -> u64 {
        match self.payload {
            Payload::Patch { payload_len } => payload_len,
            Payload::Full => self.target_size,
        }
    }
    fn write(&self, w: &mut Writer) {
        write_opt_doc(w, &self.doc);
        w.blob(&self.binding);
        w.u8(match self.payload {
            Payload::Patch { .. } => 0,
            Payload::Full => 1,
        });
        w.varint(self.target_size);
        w.bytes(&self.target_sha256);
        if let Payload::Patch { payload_len } = self.payload {
            w.varint(payload_len);
        }
    }
    fn read(r: &mut Reader<'_>, limits: &Limits) -> Result<Item> {
        let doc = read_opt_doc(r)?;
        let binding = r.blob_max("binding", MAX_BINDING, ErrorCode::LimitExceeded)?.to_vec();
        let at = r.pos();
        let kind = r.u8("payload_kind")?;
        if kind > 1 {
            return Err(ProtoError::malformed(format!("unknown payload_kind {kind} at byte {at}")));
        }
        let target_size = r.varint_max("target_size", limits.max_item_size, ErrorCode::TooLarge)?;
        let target_sha256 = r.array("target_sha256")?;
        let payload = if kind == 0 {
            Payload::Patch { payload_len: r.varint_max("payload_len", limits.max_patch_size, ErrorCode::TooLarge)? }
        } else {
            Payload::Full
        };
        Ok(Item { doc, binding, payload, target_size, target_sha256 })
    }
}

/// SAVE (§4.5).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Save {
    pub header: RequestHeader,
    pub procedure: Procedure,
    pub ctx_defs: Vec<CtxDef>,
    pub requests: Vec<RequestSpec>,
    /// 1 … `max_items`.
    pub items: Vec<Item>,
}

impl Save {
    /// *S*.
    pub fn to_s(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.header.write(&mut w, PROTOCOL_VERSION, msg_type::SAVE);
        w.u8(self.procedure as u8);
        write_defs(&mut w, &self.ctx_defs);
        w.varint(self.requests.len() as u64);
        for q in &self.requests {
            q.write(&mut w);
        }
        w.varint(self.items.len() as u64);
        for i in &self.items {
            i.write(&mut w);
        }
        w.into_bytes()
    }
    /// *S* and the MAC for [`PATH_SAVE`]; the caller appends the payloads.
    pub fn encode(&self, secret: &[u8]) -> Vec<u8> {
        let s = self.to_s();
        let mac = request_mac(secret, PATH_SAVE, &s);
        append_mac(s, mac)
    }
    /// The whole message: [`Save::encode`] and the payloads in item order.
    pub fn encode_with_payloads(&self, secret: &[u8], payloads: &[&[u8]]) -> Vec<u8> {
        let mut out = self.encode(secret);
        for p in payloads {
            out.extend_from_slice(p);
        }
        out
    }
    /// Decodes the structured part and the MAC; `bytes` may hold the
    /// payloads too (they are not read: see [`Save::split_payloads`]).
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<(Save, Framing)> {
        decode_framed(bytes, limits.max_envelope, true, |r| {
            let header = RequestHeader::read(r, msg_type::SAVE)?;
            let p = r.u8("procedure")?;
            let procedure = Procedure::from_u8(p).ok_or_else(|| ProtoError::malformed(format!("unknown procedure {p}")))?;
            let ctx_defs = read_defs(r, limits)?;
            let n = r.count("request_count", MAX_REQUESTS, ErrorCode::LimitExceeded, 3)?;
            let mut requests = Vec::with_capacity(n);
            for _ in 0..n {
                requests.push(RequestSpec::read(r, limits)?);
            }
            let at = r.pos();
            let n = r.count("item_count", limits.max_items, ErrorCode::LimitExceeded, 36)?;
            if n == 0 {
                return Err(ProtoError::malformed(format!("item_count is zero at byte {at}")));
            }
            let mut items = Vec::with_capacity(n);
            for _ in 0..n {
                items.push(Item::read(r, limits)?);
            }
            Ok(Save { header, procedure, ctx_defs, requests, items })
        })
    }
    /// Total bytes of the payloads the items declare.
    pub fn payload_total(&self) -> u64 {
        self.items.iter().fold(0u64, |a, i| a.saturating_add(i.payload_len()))
    }
    /// Cuts `payloads` (everything after the MAC) into one slice per item;
    /// `malformed` unless they are exactly as long as the items declare.
    pub fn split_payloads<'a>(&self, payloads: &'a [u8]) -> Result<Vec<&'a [u8]>> {
        let total = self.payload_total();
        if total != payloads.len() as u64 {
            let how = if (payloads.len() as u64) < total { "end early" } else { "run on" };
            return Err(ProtoError::malformed(format!("the payloads {how}: {} bytes where the items declare {total}", payloads.len())));
        }
        let mut at = 0usize;
        Ok(self
            .items
            .iter()
            .map(|i| {
                let n = i.payload_len() as usize;
                let s = &payloads[at..at + n];
                at += n;
                s
            })
            .collect())
    }
}

// ---------------------------------------------------------------- FETCH

/// FETCH (§4.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fetch {
    pub header: RequestHeader,
    /// FOLLOW_REDIRECT.
    pub follow_redirect: bool,
    pub ctx_defs: Vec<CtxDef>,
    pub request: RequestSpec,
    /// `None`: the request's context's key.
    pub doc: Option<DocKey>,
    /// The version the device holds.
    pub have_sha256: Option<[u8; 32]>,
}

impl Fetch {
    /// *S*.
    pub fn to_s(&self) -> Vec<u8> {
        let mut w = Writer::new();
        self.header.write(&mut w, PROTOCOL_VERSION, msg_type::FETCH);
        w.u8(if self.follow_redirect { flags::FOLLOW_REDIRECT } else { 0 });
        write_defs(&mut w, &self.ctx_defs);
        self.request.write(&mut w);
        write_opt_doc(&mut w, &self.doc);
        match &self.have_sha256 {
            None => w.u8(0),
            Some(h) => {
                w.u8(1);
                w.bytes(h);
            }
        }
        w.into_bytes()
    }
    /// The message, MACed for [`PATH_FETCH`].
    pub fn encode(&self, secret: &[u8]) -> Vec<u8> {
        let s = self.to_s();
        let mac = request_mac(secret, PATH_FETCH, &s);
        append_mac(s, mac)
    }
    /// Decodes a FETCH (nothing may follow the MAC).
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<(Fetch, Framing)> {
        decode_framed(bytes, limits.max_envelope, false, |r| {
            let header = RequestHeader::read(r, msg_type::FETCH)?;
            let ff = r.u8("fetch_flags")?;
            if ff & !flags::FOLLOW_REDIRECT != 0 {
                return Err(ProtoError::malformed(format!("reserved fetch_flags bits 0x{:02x} set", ff & !flags::FOLLOW_REDIRECT)));
            }
            let ctx_defs = read_defs(r, limits)?;
            let request = RequestSpec::read(r, limits)?;
            let doc = read_opt_doc(r)?;
            let have_sha256 = if read_flag_byte(r, "has_have")? { Some(r.array("have_sha256")?) } else { None };
            Ok(Fetch { header, follow_redirect: ff & flags::FOLLOW_REDIRECT != 0, ctx_defs, request, doc, have_sha256 })
        })
    }
}

// ---------------------------------------------------------------- results

/// The flags of SAVE_RESULT and FETCH_RESULT.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ResultFlags {
    /// SAVE_RESULT only.
    pub replayed: bool,
    pub ref_used: bool,
    pub hash_disagreement: bool,
}

impl ResultFlags {
    fn byte(&self) -> u8 {
        u8::from(self.replayed) * flags::REPLAYED
            + u8::from(self.ref_used) * flags::REF_USED
            + u8::from(self.hash_disagreement) * flags::HASH_DISAGREEMENT
    }
    fn from_byte(f: u8) -> Self {
        ResultFlags {
            replayed: f & flags::REPLAYED != 0,
            ref_used: f & flags::REF_USED != 0,
            hash_disagreement: f & flags::HASH_DISAGREEMENT != 0,
        }
    }
}

/// SAVE_RESULT (§4.7): the provider response, head and body as CBs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SaveResult {
    pub flags: ResultFlags,
    pub head: Cb,
    pub body: Cb,
}

impl SaveResult {
    /// *S*.
    pub fn to_s(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(&[PROTOCOL_VERSION, msg_type::SAVE_RESULT, self.flags.byte()]);
        self.head.write(&mut w);
        self.body.write(&mut w);
        w.into_bytes()
    }
    /// The message, MACed as the answer to `req_mac`.
    pub fn encode(&self, secret: &[u8], req_mac: &[u8; MAC_LEN]) -> Vec<u8> {
        let s = self.to_s();
        let mac = response_mac(secret, req_mac, &s);
        append_mac(s, mac)
    }
    /// Decodes a SAVE_RESULT.
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<(SaveResult, Framing)> {
        decode_framed(bytes, u64::MAX, false, |r| {
            let f =
                read_header(r, &[PROTOCOL_VERSION], msg_type::SAVE_RESULT, flags::REPLAYED | flags::REF_USED | flags::HASH_DISAGREEMENT)?;
            Ok(SaveResult {
                flags: ResultFlags::from_byte(f),
                head: Cb::read(r, "response head", limits.max_head, ErrorCode::LimitExceeded)?,
                body: Cb::read(r, "response body", limits.max_response_body, ErrorCode::LimitExceeded)?,
            })
        })
    }
}

/// The body of a FETCH_RESULT part (§4.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FetchBody {
    /// 0: the body as a CB.
    Inline(Cb),
    /// 1: an edit patch against `have_sha256`, as payload.
    Patch { target_size: u64, target_sha256: [u8; 32], payload_len: u64 },
    /// 2: the whole file, as payload.
    Full { target_size: u64, target_sha256: [u8; 32] },
}

impl FetchBody {
    /// Bytes of payload this body puts after the MAC.
    pub fn payload_len(&self) -> u64 {
        match self {
            FetchBody::Inline(_) => 0,
            FetchBody::Patch { payload_len, .. } => *payload_len,
            FetchBody::Full { target_size, .. } => *target_size,
        }
    }
}

/// One part of a FETCH_RESULT.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPart {
    pub head: Cb,
    pub body: FetchBody,
}

/// FETCH_RESULT (§4.8).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchResult {
    /// `replayed` is always false.
    pub flags: ResultFlags,
    /// 1 or 2 parts; only the last may be PATCH or FULL.
    pub parts: Vec<FetchPart>,
}

impl FetchResult {
    /// *S*.
    pub fn to_s(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(&[PROTOCOL_VERSION, msg_type::FETCH_RESULT, self.flags.byte()]);
        w.u8(self.parts.len() as u8);
        for p in &self.parts {
            p.head.write(&mut w);
            match &p.body {
                FetchBody::Inline(cb) => {
                    w.u8(0);
                    cb.write(&mut w);
                }
                FetchBody::Patch { target_size, target_sha256, payload_len } => {
                    w.u8(1);
                    w.varint(*target_size);
                    w.bytes(target_sha256);
                    w.varint(*payload_len);
                }
                FetchBody::Full { target_size, target_sha256 } => {
                    w.u8(2);
                    w.varint(*target_size);
                    w.bytes(target_sha256);
                }
            }
        }
        w.into_bytes()
    }
    /// *S* and the MAC; the caller appends the payload.
    pub fn encode(&self, secret: &[u8], req_mac: &[u8; MAC_LEN]) -> Vec<u8> {
        let s = self.to_s();
        let mac = response_mac(secret, req_mac, &s);
        append_mac(s, mac)
    }
    /// Decodes the structured part and the MAC (see [`FetchResult::payload`]).
    pub fn decode(bytes: &[u8], limits: &Limits) -> Result<(FetchResult, Framing)> {
        decode_framed(bytes, u64::MAX, true, |r| {
            let f = read_header(r, &[PROTOCOL_VERSION], msg_type::FETCH_RESULT, flags::REF_USED | flags::HASH_DISAGREEMENT)?;
            let n = r.u8("part_count")?;
            if !(1..=2).contains(&n) {
                return Err(ProtoError::malformed(format!("part_count is {n}, not 1 or 2")));
            }
            let mut parts = Vec::with_capacity(usize::from(n));
            for i in 0..n {
                let head = Cb::read(r, "response head", limits.max_head, ErrorCode::LimitExceeded)?;
                let at = r.pos();
                let body = match r.u8("body_kind")? {
                    0 => FetchBody::Inline(Cb::read(r, "response body", limits.max_response_body, ErrorCode::LimitExceeded)?),
                    k @ (1 | 2) if i + 1 == n => {
                        let target_size = r.varint_max("target_size", limits.max_item_size, ErrorCode::TooLarge)?;
                        let target_sha256 = r.array("target_sha256")?;
                        if k == 1 {
                            FetchBody::Patch {
                                target_size,
                                target_sha256,
                                payload_len: r.varint_max("payload_len", limits.max_patch_size, ErrorCode::TooLarge)?,
                            }
                        } else {
                            FetchBody::Full { target_size, target_sha256 }
                        }
                    }
                    1 | 2 => return Err(ProtoError::malformed(format!("part {i} is not the last and not INLINE"))),
                    k => return Err(ProtoError::malformed(format!("unknown body_kind {k} at byte {at}"))),
                };
                parts.push(FetchPart { head, body });
            }
            Ok(FetchResult { flags: ResultFlags::from_byte(f), parts })
        })
    }
    /// The payload after the MAC; `malformed` unless it is exactly as long
    /// as the last part declares.
    pub fn payload<'a>(&self, after_mac: &'a [u8]) -> Result<&'a [u8]> {
        let want = self.parts.last().map_or(0, |p| p.body.payload_len());
        if want != after_mac.len() as u64 {
            return Err(ProtoError::malformed(format!("the payload is {} bytes where the result declares {want}", after_mac.len())));
        }
        Ok(after_mac)
    }
}

// ---------------------------------------------------------------- ERROR

/// ERROR (§4.9).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ErrorMessage {
    /// The version of the request's path: 0 for `/ec/hello`, 1 otherwise.
    pub version: u8,
    pub code: ErrorCode,
    /// 0 or 1.
    pub stage: u8,
    pub retry_after_ms: u64,
    /// Item indexes or context ids.
    pub list: Vec<u64>,
    /// ASCII, at most 32 bytes.
    pub cause: String,
    /// UTF-8, at most 256 bytes.
    pub detail: String,
}

impl ErrorMessage {
    /// The ERROR answering `e` on a path of `version`, with the code's
    /// default stage and a detail cut to 256 bytes.
    pub fn from_error(e: &ProtoError, version: u8) -> Self {
        let mut detail = e.detail.clone();
        if detail.len() > MAX_DETAIL as usize {
            let mut cut = MAX_DETAIL as usize;
            while !detail.is_char_boundary(cut) {
                cut -= 1;
            }
            detail.truncate(cut);
        }
        ErrorMessage {
            version,
            code: e.code,
            stage: e.code.default_stage(),
            retry_after_ms: 0,
            list: e.list.clone(),
            cause: String::new(),
            detail,
        }
    }
    /// *S*.
    pub fn to_s(&self) -> Vec<u8> {
        let mut w = Writer::new();
        w.bytes(&[self.version, msg_type::ERROR, 0, self.code.number(), self.stage]);
        w.varint(self.retry_after_ms);
        w.varint(self.list.len() as u64);
        for v in &self.list {
            w.varint(*v);
        }
        w.blob(self.cause.as_bytes());
        w.blob(self.detail.as_bytes());
        w.into_bytes()
    }
    /// The message, MACed as the answer to `req_mac`, or with the zero MAC
    /// when the request did not authenticate (`key` = `None`).
    pub fn encode(&self, key: Option<(&[u8], &[u8; MAC_LEN])>) -> Vec<u8> {
        let s = self.to_s();
        let mac = key.map_or(ZERO_MAC, |(secret, req_mac)| response_mac(secret, req_mac, &s));
        append_mac(s, mac)
    }
    /// Decodes an ERROR answering a request on a path of `version`.
    pub fn decode(bytes: &[u8], version: u8) -> Result<(ErrorMessage, Framing)> {
        decode_framed(bytes, u64::MAX, false, |r| {
            read_header(r, &[version], msg_type::ERROR, 0)?;
            let c = r.u8("code")?;
            let code = ErrorCode::from_number(c).ok_or_else(|| ProtoError::malformed(format!("unknown error code {c}")))?;
            let stage = r.u8("stage")?;
            if stage > 1 {
                return Err(ProtoError::malformed(format!("stage {stage}")));
            }
            let retry_after_ms = r.varint("retry_after_ms")?;
            let n = r.count("list_count", u64::MAX, ErrorCode::Malformed, 1)?;
            let mut list = Vec::with_capacity(n);
            for _ in 0..n {
                list.push(r.varint("list entry")?);
            }
            let cause = read_text(r, "cause", MAX_CAUSE, ErrorCode::LimitExceeded, true)?;
            let detail = read_text(r, "detail", MAX_DETAIL, ErrorCode::LimitExceeded, false)?;
            Ok(ErrorMessage { version, code, stage, retry_after_ms, list, cause, detail })
        })
    }
}
