//! The codec-level test vectors of protocol/vectors/: how they are made
//! (shared by `examples/make_protocol_vectors.rs`, which writes them, and
//! `tests/integration/vectors.rs`, which checks that the committed files equal this
//! output) and how they are checked (the same pipeline a second
//! implementation follows, described in the manifest's `how_to_check`).
#![allow(dead_code)]

use std::collections::BTreeMap;

use ec_protocol::cb::Cb;
use ec_protocol::head::HeadRules;
use ec_protocol::mac::{verify_request_mac, verify_response_mac, ZERO_MAC};
use ec_protocol::resolve::{
    self, apply_definitions, resolve_fetch, resolve_save, response_digest, ContextTable, ResolvedBody, ResolvedRequest,
};
use ec_protocol::*;
use serde_json::{json, Value};
use sha2::{Digest, Sha256};

pub const SECRET: [u8; 32] = {
    let mut s = [0u8; 32];
    let mut i = 0;
    while i < 32 {
        s[i] = i as u8;
        i += 1;
    }
    s
};
pub const KEY_ID: u64 = 1;
pub const SESSION_ID: [u8; 8] = [0xa3, 0x5c, 0x0e, 0x91, 0x7b, 0x22, 0xd4, 0x08];
pub const DEVICE_NONCE: [u8; 16] = [0; 16];
pub const MARKER: &str = "Bearer EC-TEST-CREDENTIAL-0f1e2d3c";
/// Protocol versions the reference EPS speaks.
pub const EPS_VERSIONS: [u8; 1] = [1];

pub fn hx(b: &[u8]) -> String {
    hex::encode(b)
}
fn sha(b: &[u8]) -> [u8; 32] {
    Sha256::digest(b).into()
}
fn unhex(v: &Value) -> Vec<u8> {
    hex::decode(v.as_str().expect("hex string")).expect("valid hex")
}

// ------------------------------------------------------------ documents

fn crc32(data: &[u8]) -> u32 {
    let mut h = crc32fast::Hasher::new();
    h.update(data);
    h.finalize()
}

/// A small .docx-shaped ZIP: deflated members written by zlib level 6.
pub fn docx(body_text: &str) -> Vec<u8> {
    let params = ec_patch::ZlibParams { level: 6, mem_level: 8, window_bits: 15, strategy: 0 };
    let members: Vec<(&str, Vec<u8>)> = vec![
        ("[Content_Types].xml", br#"<?xml version="1.0" encoding="UTF-8"?><Types xmlns="http://schemas.openxmlformats.org/package/2006/content-types"><Default Extension="xml" ContentType="application/xml"/><Override PartName="/word/document.xml" ContentType="application/vnd.openxmlformats-officedocument.wordprocessingml.document.main+xml"/></Types>"#.to_vec()),
        ("word/document.xml", {
            let paras: String = (0..40).map(|i| format!("<w:p><w:r><w:t>Paragraph {i}: {body_text}</w:t></w:r></w:p>")).collect();
            format!(r#"<?xml version="1.0" encoding="UTF-8"?><w:document xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"><w:body>{paras}</w:body></w:document>"#).into_bytes()
        }),
    ];
    let (mut out, mut central) = (Vec::new(), Vec::new());
    for (name, data) in &members {
        let offset = out.len() as u32;
        let body = ec_patch::deflate::deflate(data, params).expect("zlib accepts level 6");
        let crc = crc32(data);
        let fixed = |v: &mut Vec<u8>| {
            v.extend(20u16.to_le_bytes());
            v.extend(0x0800u16.to_le_bytes());
            v.extend(8u16.to_le_bytes());
            v.extend(0x5b2a_6000u32.to_le_bytes());
            v.extend(crc.to_le_bytes());
            v.extend((body.len() as u32).to_le_bytes());
            v.extend((data.len() as u32).to_le_bytes());
            v.extend((name.len() as u16).to_le_bytes());
        };
        out.extend(0x0403_4b50u32.to_le_bytes());
        fixed(&mut out);
        out.extend(0u16.to_le_bytes());
        out.extend(name.as_bytes());
        out.extend(&body);
        central.extend(0x0201_4b50u32.to_le_bytes());
        central.extend(20u16.to_le_bytes());
        fixed(&mut central);
        central.extend([0u8; 12]);
        central.extend(offset.to_le_bytes());
        central.extend(name.as_bytes());
    }
    let cd_offset = out.len() as u32;
    out.extend(&central);
    out.extend(0x0605_4b50u32.to_le_bytes());
    out.extend([0u8; 4]);
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((members.len() as u16).to_le_bytes());
    out.extend((central.len() as u32).to_le_bytes());
    out.extend(cd_offset.to_le_bytes());
    out.extend(0u16.to_le_bytes());
    out
}

pub struct Docs {
    pub v1: Vec<u8>,
    pub v2: Vec<u8>,
    pub v3: Vec<u8>,
    pub patch12: Vec<u8>,
    pub patch23: Vec<u8>,
}

pub fn docs() -> Docs {
    let v1 = docx("the quick brown fox jumps over the lazy dog");
    let v2 = docx("the quick brown fox jumps over the lazy dogs");
    let v3 = docx("the quick brown cat jumps over the lazy dogs");
    // The vectors' sessions list edit-patch version 1 only (HELLO's and
    // HELLO_OK's `patch_versions`): their patches are version 1 patches.
    let opts = ec_patch::DiffOptions { max_version: Some(1), ..Default::default() };
    let patch12 = ec_patch::diff_verified(&v1, &v2, &opts).expect("diff v1 -> v2");
    let patch23 = ec_patch::diff_verified(&v2, &v3, &opts).expect("diff v2 -> v3");
    Docs { v1, v2, v3, patch12, patch23 }
}

// ------------------------------------------------------------ heads and keys

pub fn dropbox_head(rev: &str, modified: &str) -> Vec<u8> {
    format!(
        "POST https://content.dropboxapi.com/2/files/upload\nauthorization: {MARKER}\nuser-agent: rclone/v1.66.0\ndropbox-api-arg: {{\"path\":\"/Docs/report.docx\",\"mode\":{{\".tag\":\"update\",\"update\":\"{rev}\"}},\"autorename\":false,\"client_modified\":\"{modified}\",\"mute\":false,\"strict_conflict\":false}}\ncontent-type: application/octet-stream\naccept-encoding: gzip\n"
    )
    .into_bytes()
}

pub fn dropbox_key() -> DocKey {
    DocKey {
        provider: Provider::Dropbox,
        account: b"dbid:AAH4f99T0taONIb-OurWxbNQ6ywGRopQngc".to_vec(),
        reference: b"/docs/report.docx".to_vec(),
    }
}

fn drive_key() -> DocKey {
    DocKey { provider: Provider::Drive, account: b"09876543210987654321".to_vec(), reference: b"1AbCdEfGhIjKlMnOpQrStUvWxYz".to_vec() }
}

fn drive_head() -> Vec<u8> {
    format!("POST https://www.googleapis.com/upload/drive/v3/files?uploadType=multipart\nauthorization: {MARKER}\ncontent-type: multipart/related; boundary=ec_boundary_0001\n").into_bytes()
}

fn drive_body() -> (Vec<u8>, usize) {
    let before = b"--ec_boundary_0001\r\ncontent-type: application/json; charset=UTF-8\r\n\r\n{\"name\":\"report.docx\"}\r\n--ec_boundary_0001\r\ncontent-type: application/vnd.openxmlformats-officedocument.wordprocessingml.document\r\n\r\n";
    let after = b"\r\n--ec_boundary_0001--\r\n";
    ([&before[..], &after[..]].concat(), before.len())
}

fn download_head() -> Vec<u8> {
    format!("POST https://content.dropboxapi.com/2/files/download\nauthorization: {MARKER}\ndropbox-api-arg: {{\"path\":\"/Docs/report.docx\"}}\n").into_bytes()
}

fn literal_head(fields: &str) -> Vec<u8> {
    format!("PUT https://graph.microsoft.com/v1.0/me/drive/root:/report.docx:/content\nauthorization: {MARKER}\n{fields}").into_bytes()
}

fn header(seq: u64, request_id: u8, resp_ref: Option<[u8; 8]>) -> RequestHeader {
    RequestHeader { session_id: SESSION_ID, seq, request_id: [request_id; 8], resp_ref }
}

fn save_response_head(date: &str, request_id: &str) -> Vec<u8> {
    format!("200 OK\ncontent-type: application/json\ndate: {date}\nx-dropbox-request-id: {request_id}\nx-server-response-time: 412\n")
        .into_bytes()
}

fn save_response_body(rev: &str, size: usize, hash: &str) -> Vec<u8> {
    format!("{{\"name\":\"report.docx\",\"path_lower\":\"/docs/report.docx\",\"path_display\":\"/Docs/report.docx\",\"id\":\"id:a4ayc_80_OEAAAAAAAAAXw\",\"client_modified\":\"2026-11-22T09:14:02Z\",\"server_modified\":\"2026-11-22T09:14:03Z\",\"rev\":\"{rev}\",\"size\":{size},\"is_downloadable\":true,\"content_hash\":\"{hash}\"}}").into_bytes()
}

// ------------------------------------------------------------ JSON views

fn doc_json(d: &Option<DocKey>) -> Value {
    match d {
        None => Value::Null,
        Some(d) => json!({"provider": d.provider as u8, "account": hx(&d.account), "ref": hx(&d.reference)}),
    }
}

fn doc_from_json(v: &Value) -> Option<DocKey> {
    if v.is_null() {
        return None;
    }
    Some(DocKey { provider: Provider::from_u8(v["provider"].as_u64()? as u8)?, account: unhex(&v["account"]), reference: unhex(&v["ref"]) })
}

fn cb_json(cb: &Cb) -> Value {
    match cb {
        Cb::Same => json!({"mode": 0}),
        Cb::Delta(d) => json!({"mode": 1, "data": hx(d)}),
        Cb::Literal(d) => json!({"mode": 2, "data": hx(d)}),
    }
}

fn header_json(h: &RequestHeader) -> Value {
    json!({"session_id": hx(&h.session_id), "seq": h.seq, "request_id": hx(&h.request_id), "resp_ref": h.resp_ref.map(|r| hx(&r))})
}

fn defs_json(defs: &[CtxDef]) -> Value {
    defs.iter().map(|d| json!({"ctx_id": d.ctx_id, "head": hx(&d.head), "body": hx(&d.body), "doc": doc_json(&d.doc)})).collect()
}

fn spec_json(q: &RequestSpec) -> Value {
    let mut v = json!({"ctx_id": q.ctx_id, "head": cb_json(&q.head), "body_kind": q.body.kind()});
    match &q.body {
        BodySpec::Empty => {}
        BodySpec::File { item } => v["item"] = json!(item),
        BodySpec::Bytes { bytes } => v["bytes"] = cb_json(bytes),
        BodySpec::Wrapped { item, bytes, split } => {
            v["item"] = json!(item);
            v["bytes"] = cb_json(bytes);
            v["split"] = json!(split);
        }
    }
    v
}

fn flags_json(f: &ResultFlags) -> Value {
    json!({"replayed": f.replayed, "ref_used": f.ref_used, "hash_disagreement": f.hash_disagreement})
}

fn resolved_json(q: &ResolvedRequest) -> Value {
    let mut v = json!({"head": hx(&q.head_bytes), "head_text": String::from_utf8_lossy(&q.head_bytes), "host": q.head.host(), "body_kind": q.body.kind()});
    match &q.body {
        ResolvedBody::Empty => {}
        ResolvedBody::File { item } => v["item"] = json!(item),
        ResolvedBody::Bytes(b) => v["bytes"] = json!(hx(b)),
        ResolvedBody::Wrapped { item, bytes, split } => {
            v["item"] = json!(item);
            v["bytes"] = json!(hx(bytes));
            v["split"] = json!(split);
        }
    }
    v
}

fn contexts_from_state(state: &Value) -> ContextTable {
    let mut t = ContextTable::new();
    if let Some(m) = state.get("contexts").and_then(Value::as_object) {
        for (id, c) in m {
            t.insert(id.parse().unwrap(), Context { head: unhex(&c["head"]), body: unhex(&c["body"]), doc: doc_from_json(&c["doc"]) });
        }
    }
    t
}

fn contexts_json(t: &ContextTable) -> Value {
    Value::Object(
        t.iter().map(|(id, c)| (id.to_string(), json!({"head": hx(&c.head), "body": hx(&c.body), "doc": doc_json(&c.doc)}))).collect(),
    )
}

// ------------------------------------------------------------ the check pipeline

/// What the codec makes of a vector: the decoded fields and the results of
/// the pure helpers, or the first error.
pub fn check(path_or_kind: &str, bytes: &[u8], state: &Value, files: &dyn Fn(&str) -> Vec<u8>) -> Result<Value, ProtoError> {
    let limits = Limits::default();
    let rules = HeadRules::from_limits(&limits);
    let auth = || ProtoError::new(ErrorCode::AuthFailed, "the MAC does not verify");
    match path_or_kind {
        PATH_HELLO => {
            let (h, f) = Hello::decode(bytes, &limits)?;
            if h.key_id != KEY_ID || !verify_request_mac(&SECRET, PATH_HELLO, f.s(bytes), &f.mac) {
                return Err(auth());
            }
            let chosen = h
                .versions
                .iter()
                .copied()
                .find(|v| EPS_VERSIONS.contains(v))
                .ok_or_else(|| ProtoError::new(ErrorCode::UnsupportedVersion, "no common version"))?;
            Ok(json!({
                "decoded": {"key_id": h.key_id, "device_nonce": hx(&h.device_nonce), "versions": h.versions, "patch_versions": h.patch_versions, "caps": h.caps, "label": h.label},
                "mac": hx(&f.mac), "chosen_version": chosen,
            }))
        }
        PATH_SAVE | PATH_FETCH => {
            let is_save = path_or_kind == PATH_SAVE;
            let (header, defs, mac, s_end) = if is_save {
                let (m, f) = Save::decode(bytes, &limits)?;
                (m.header.clone(), m.ctx_defs.clone(), f.mac, f.s_len)
            } else {
                let (m, f) = Fetch::decode(bytes, &limits)?;
                (m.header.clone(), m.ctx_defs.clone(), f.mac, f.s_len)
            };
            if header.session_id != SESSION_ID {
                return Err(if verify_request_mac(&SECRET, path_or_kind, &bytes[..s_end], &mac) {
                    ProtoError::new(ErrorCode::SessionUnknown, "unknown session")
                } else {
                    auth()
                });
            }
            if !verify_request_mac(&SECRET, path_or_kind, &bytes[..s_end], &mac) {
                return Err(auth());
            }
            let mut table = contexts_from_state(state);
            apply_definitions(&mut table, &defs, &limits, &rules)?;
            if is_save {
                let (m, f) = Save::decode(bytes, &limits)?;
                let r = resolve_save(&m, &table, &limits, &rules)?;
                let payloads = m.split_payloads(&bytes[f.payload_offset..])?;
                let digest = resolve::operation_digest(m.procedure, &r.requests, &m.items, &r.docs);
                let mut items = Vec::new();
                for (i, (item, p)) in m.items.iter().zip(&payloads).enumerate() {
                    let mut v = json!({"doc": doc_json(&item.doc), "binding": hx(&item.binding), "payload_kind": if matches!(item.payload, Payload::Full) {1} else {0},
                        "target_size": item.target_size, "target_sha256": hx(&item.target_sha256), "payload_sha256": hx(&sha(p))});
                    if let Payload::Patch { payload_len } = item.payload {
                        v["payload_len"] = json!(payload_len);
                    }
                    // A PATCH item rebuilds against the base the state names; the target hash must match.
                    let file = match item.payload {
                        Payload::Full => p.to_vec(),
                        Payload::Patch { .. } => {
                            let base = files(state["bases"][i].as_str().expect("a base for every PATCH item"));
                            ec_patch::apply_to_vec(&base, p, &ec_patch::Limits::default()).expect("the vector's patch applies")
                        }
                    };
                    assert_eq!((file.len() as u64, sha(&file)), (item.target_size, item.target_sha256), "item {i} rebuilds its target");
                    items.push(v);
                }
                Ok(json!({
                    "decoded": {"header": header_json(&m.header), "procedure": m.procedure as u8, "ctx_defs": defs_json(&m.ctx_defs),
                        "requests": m.requests.iter().map(spec_json).collect::<Vec<_>>(), "items": items},
                    "mac": hx(&f.mac), "s_len": f.s_len, "payload_offset": f.payload_offset,
                    "resolved": {"requests": r.requests.iter().map(resolved_json).collect::<Vec<_>>(),
                        "docs": r.docs.iter().map(|d| doc_json(&Some(d.clone()))).collect::<Vec<_>>(),
                        "store_keys": r.docs.iter().map(|d| hx(&d.store_key())).collect::<Vec<_>>(),
                        "operation_digest": hx(&digest)},
                    "contexts_after": contexts_json(&table),
                }))
            } else {
                let (m, f) = Fetch::decode(bytes, &limits)?;
                let r = resolve_fetch(&m, &table, &limits, &rules)?;
                Ok(json!({
                    "decoded": {"header": header_json(&m.header), "follow_redirect": m.follow_redirect, "ctx_defs": defs_json(&m.ctx_defs),
                        "request": spec_json(&m.request), "doc": doc_json(&m.doc), "have_sha256": m.have_sha256.map(|h| hx(&h))},
                    "mac": hx(&f.mac), "s_len": f.s_len,
                    "resolved": {"request": resolved_json(&r.request), "doc": doc_json(&Some(r.doc.clone())), "store_key": hx(&r.doc.store_key())},
                    "contexts_after": contexts_json(&table),
                }))
            }
        }
        kind => check_response(kind, bytes, state, files, &limits),
    }
}

fn check_response(kind: &str, bytes: &[u8], state: &Value, files: &dyn Fn(&str) -> Vec<u8>, limits: &Limits) -> Result<Value, ProtoError> {
    let req_mac: [u8; 16] = unhex(&state["request_mac"]).try_into().expect("16-byte request_mac");
    let (ref_head, ref_body) = match state.get("reference") {
        Some(r) => (unhex(&r["head"]), unhex(&r["body"])),
        None => (Vec::new(), Vec::new()),
    };
    let verify = |s: &[u8], mac: &[u8; 16]| {
        if verify_response_mac(&SECRET, &req_mac, s, mac) {
            Ok(())
        } else {
            Err(ProtoError::new(ErrorCode::AuthFailed, "the response MAC does not verify"))
        }
    };
    let decode_head = |cb: &Cb, reference: &[u8]| -> Result<Vec<u8>, ProtoError> {
        let h = cb.decode(reference, "response head", limits.max_head, ErrorCode::LimitExceeded)?;
        ResponseHead::parse(&h, limits.max_head, limits.max_headers)?;
        Ok(h)
    };
    match kind {
        "HELLO_OK" => {
            let (m, f) = HelloOk::decode(bytes)?;
            verify(f.s(bytes), &f.mac)?;
            Ok(
                json!({"decoded": {"chosen_version": m.chosen_version, "session_id": hx(&m.session_id), "caps": m.caps, "patch_versions": m.patch_versions,
                "limits": m.limits.iter().map(|(i, v)| json!([i, v])).collect::<Vec<_>>()}, "mac": hx(&f.mac)}),
            )
        }
        "SAVE_RESULT" => {
            let (m, f) = SaveResult::decode(bytes, limits)?;
            verify(f.s(bytes), &f.mac)?;
            let (rh, rb) = if m.flags.ref_used { (&ref_head[..], &ref_body[..]) } else { (&[][..], &[][..]) };
            let head = decode_head(&m.head, rh)?;
            let body = m.body.decode(rb, "response body", limits.max_response_body, ErrorCode::LimitExceeded)?;
            Ok(json!({"decoded": {"flags": flags_json(&m.flags), "head": cb_json(&m.head), "body": cb_json(&m.body)}, "mac": hx(&f.mac),
                "resolved": {"head": hx(&head), "head_text": String::from_utf8_lossy(&head), "body": hx(&body), "digest": hx(&response_digest(&head, &body))}}))
        }
        "FETCH_RESULT" => {
            let (m, f) = FetchResult::decode(bytes, limits)?;
            verify(f.s(bytes), &f.mac)?;
            let payload = m.payload(&bytes[f.payload_offset..])?;
            let (rh, rb) = if m.flags.ref_used { (&ref_head[..], &ref_body[..]) } else { (&[][..], &[][..]) };
            let mut parts = Vec::new();
            let mut resolved = Vec::new();
            for p in &m.parts {
                let head = decode_head(&p.head, rh)?;
                let mut d = json!({"head": cb_json(&p.head), "body_kind": match p.body { FetchBody::Inline(_) => 0, FetchBody::Patch { .. } => 1, FetchBody::Full { .. } => 2 }});
                let mut r = json!({"head": hx(&head), "head_text": String::from_utf8_lossy(&head)});
                match &p.body {
                    FetchBody::Inline(cb) => {
                        d["body"] = cb_json(cb);
                        let body = cb.decode(rb, "response body", limits.max_response_body, ErrorCode::LimitExceeded)?;
                        r["body"] = json!(hx(&body));
                        r["digest"] = json!(hx(&response_digest(&head, &body)));
                    }
                    FetchBody::Patch { target_size, target_sha256, payload_len } => {
                        d["target_size"] = json!(target_size);
                        d["target_sha256"] = json!(hx(target_sha256));
                        d["payload_len"] = json!(payload_len);
                        let have = files(state["have"].as_str().expect("a have file for a PATCH"));
                        let file =
                            ec_patch::apply_to_vec(&have, payload, &ec_patch::Limits::default()).expect("the vector's patch applies");
                        assert_eq!((file.len() as u64, sha(&file)), (*target_size, *target_sha256));
                        r["digest"] = json!(hx(&response_digest(&head, b"")));
                    }
                    FetchBody::Full { target_size, target_sha256 } => {
                        d["target_size"] = json!(target_size);
                        d["target_sha256"] = json!(hx(target_sha256));
                        assert_eq!((payload.len() as u64, sha(payload)), (*target_size, *target_sha256));
                        r["digest"] = json!(hx(&response_digest(&head, b"")));
                    }
                }
                parts.push(d);
                resolved.push(r);
            }
            Ok(json!({"decoded": {"flags": flags_json(&m.flags), "parts": parts}, "mac": hx(&f.mac), "payload_offset": f.payload_offset,
                "payload_sha256": hx(&sha(payload)), "resolved": {"parts": resolved}}))
        }
        "ERROR" => {
            let version = state["version"].as_u64().expect("ERROR vectors name the path's version") as u8;
            let (m, f) = ErrorMessage::decode(bytes, version)?;
            let authenticated = f.mac != ZERO_MAC;
            if authenticated {
                verify(f.s(bytes), &f.mac)?;
            }
            Ok(
                json!({"decoded": {"version": m.version, "code": m.code.name(), "code_number": m.code.number(), "stage": m.stage, "retry_after_ms": m.retry_after_ms,
                "list": m.list, "cause": m.cause, "detail": m.detail}, "mac": hx(&f.mac), "authenticated": authenticated,
                "http": m.code.http_status()}),
            )
        }
        other => panic!("unknown vector kind {other}"),
    }
}

/// Re-encodes a valid vector from its decoded form and MAC inputs; the
/// result must equal the vector's bytes.
pub fn reencode(path_or_kind: &str, bytes: &[u8], state: &Value) -> Vec<u8> {
    let limits = Limits::default();
    let req_mac = || -> [u8; 16] { unhex(&state["request_mac"]).try_into().unwrap() };
    match path_or_kind {
        PATH_HELLO => Hello::decode(bytes, &limits).unwrap().0.encode(&SECRET),
        PATH_SAVE => {
            let (m, f) = Save::decode(bytes, &limits).unwrap();
            let payloads = m.split_payloads(&bytes[f.payload_offset..]).unwrap();
            m.encode_with_payloads(&SECRET, &payloads)
        }
        PATH_FETCH => Fetch::decode(bytes, &limits).unwrap().0.encode(&SECRET),
        "HELLO_OK" => HelloOk::decode(bytes).unwrap().0.encode(&SECRET, &req_mac()),
        "SAVE_RESULT" => SaveResult::decode(bytes, &limits).unwrap().0.encode(&SECRET, &req_mac()),
        "FETCH_RESULT" => {
            let (m, f) = FetchResult::decode(bytes, &limits).unwrap();
            [m.encode(&SECRET, &req_mac()), bytes[f.payload_offset..].to_vec()].concat()
        }
        "ERROR" => {
            let (m, f) = ErrorMessage::decode(bytes, state["version"].as_u64().unwrap() as u8).unwrap();
            let rm = req_mac();
            m.encode(if f.mac == ZERO_MAC { None } else { Some((&SECRET, &rm)) })
        }
        other => panic!("unknown vector kind {other}"),
    }
}

// ------------------------------------------------------------ the vectors

struct Out {
    files: BTreeMap<String, Vec<u8>>,
    entries: Vec<Value>,
}

impl Out {
    fn file(&mut self, rel: String, bytes: &[u8]) -> String {
        self.files.insert(rel.clone(), bytes.to_vec());
        rel
    }
    fn get(&self) -> impl Fn(&str) -> Vec<u8> + '_ {
        |rel: &str| self.files[rel].clone()
    }
    fn push(&mut self, name: &str, description: &str, kind: &str, bytes: &[u8], state: Value, expect_error: Option<ErrorCode>) {
        let sub = if expect_error.is_some() { "invalid" } else { "valid" };
        let file = self.file(format!("{sub}/{name}.bin"), bytes);
        let outcome = check(kind, bytes, &state, &self.get());
        let expect = match (outcome, expect_error) {
            (Ok(v), None) => {
                assert_eq!(reencode(kind, bytes, &state), bytes, "{name}: re-encoding gives the same bytes");
                let mut e = v;
                e["ok"] = json!(true);
                e
            }
            (Err(e), Some(code)) => {
                assert_eq!(e.code, code, "{name}: {e}");
                json!({"error": code.name(), "http": code.http_status(), "list": e.list})
            }
            (got, want) => panic!("{name}: expected {want:?}, got {got:?}"),
        };
        let (direction, path, message) = match kind {
            PATH_HELLO => ("request", Some(kind), "HELLO"),
            PATH_SAVE => ("request", Some(kind), "SAVE"),
            PATH_FETCH => ("request", Some(kind), "FETCH"),
            k => ("response", None, k),
        };
        let mut entry = json!({"name": name, "description": description, "direction": direction, "message": message, "file": file, "state": state, "expect": expect});
        if let Some(p) = path {
            entry["path"] = json!(p);
        }
        self.entries.push(entry);
    }
}

fn flip(bytes: &[u8], at: usize, mask: u8) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at] ^= mask;
    b
}

fn with_byte(bytes: &[u8], at: usize, v: u8) -> Vec<u8> {
    let mut b = bytes.to_vec();
    b[at] = v;
    b
}

/// Every vector file and the manifest, by path relative to protocol/vectors/.
pub fn generate() -> BTreeMap<String, Vec<u8>> {
    let d = docs();
    let mut out = Out { files: BTreeMap::new(), entries: Vec::new() };
    let f_v1 = out.file("files/report-v1.docx".into(), &d.v1);
    let f_v2 = out.file("files/report-v2.docx".into(), &d.v2);
    let none = json!({});
    let secret2: Vec<u8> = (0u8..32).map(|b| b ^ 0x5a).collect();

    // HELLO and HELLO_OK.
    let hello = Hello {
        key_id: KEY_ID,
        device_nonce: DEVICE_NONCE,
        versions: vec![1],
        patch_versions: vec![1],
        caps: 0x1ff,
        label: "test-device".into(),
    };
    let hello_bytes = hello.encode(&SECRET);
    let hello_mac: [u8; 16] = hello_bytes[hello_bytes.len() - 16..].try_into().unwrap();
    out.push(
        "hello-v1",
        "HELLO: key 1, zero nonce, versions [1], patch versions [1], caps 0x1ff (every procedure, FETCH, redirects, response references)",
        PATH_HELLO,
        &hello_bytes,
        none.clone(),
        None,
    );
    let hello21 = Hello { versions: vec![2, 1], ..hello.clone() };
    out.push(
        "hello-picks-highest-common",
        "HELLO listing versions [2, 1]: the common version is 1",
        PATH_HELLO,
        &hello21.encode(&SECRET),
        none.clone(),
        None,
    );
    let ok =
        HelloOk { chosen_version: 1, session_id: SESSION_ID, caps: 0x1ff, patch_versions: vec![1], limits: Limits::default().to_pairs() };
    out.push(
        "hello-ok-v1",
        "HELLO_OK answering hello-v1: version 1, the test session, caps 0x1ff, all 18 default limits; MAC bound to hello-v1's MAC",
        "HELLO_OK",
        &ok.encode(&SECRET, &hello_mac),
        json!({"request_mac": hx(&hello_mac)}),
        None,
    );

    // SAVE with a context defined inline and a DELTA head.
    let ctx_head = dropbox_head("62a1c3e5f0a8e0b200000002c9a7d40", "2026-11-21T10:02:11Z");
    let new_head = dropbox_head("62a1c3e5f0a8e0b200000002c9a7d41", "2026-11-22T09:14:02Z");
    let head_cb = Cb::best(&ctx_head, &new_head);
    assert!(matches!(head_cb, Cb::Delta(_)), "a small head change codes as a DELTA");
    let def1 = CtxDef { ctx_id: 1, head: ctx_head.clone(), body: Vec::new(), doc: Some(dropbox_key()) };
    let patch_item = |patch: &[u8], target: &[u8]| Item {
        doc: None,
        binding: Vec::new(),
        payload: Payload::Patch { payload_len: patch.len() as u64 },
        target_size: target.len() as u64,
        target_sha256: sha(target),
    };
    let save1 = Save {
        header: header(1, 0x11, None),
        procedure: Procedure::Single,
        ctx_defs: vec![def1.clone()],
        requests: vec![RequestSpec { ctx_id: 1, head: head_cb.clone(), body: BodySpec::File { item: 0 } }],
        items: vec![patch_item(&d.patch12, &d.v2)],
    };
    let save1_bytes = save1.encode_with_payloads(&SECRET, &[&d.patch12]);
    let save1_mac: [u8; 16] = save1_bytes[save1.to_s().len()..][..16].try_into().unwrap();
    let bases1 = json!({"bases": [f_v1]});
    out.push("save-ctx-defined-inline", "SAVE (SINGLE, Dropbox upload): context 1 defined inline with the key; the request's head is a DELTA against it; one PATCH item (a real edit patch of a small .docx) rebuilding against files/report-v1.docx", PATH_SAVE, &save1_bytes, bases1.clone(), None);

    // The next save in that session: context 1 held by the EPS, head SAME, response reference.
    let ctx_state = json!({"contexts": {"1": {"head": hx(&ctx_head), "body": "", "doc": doc_json(&Some(dropbox_key()))}}, "bases": [f_v2]});
    let rr_head = save_response_head("Sun, 22 Nov 2026 09:14:03 GMT", "9f1c5e2a7b8d4f60");
    let rr_body = save_response_body("62a1c3e5f0a8e0b200000002c9a7d42", d.v2.len(), &hx(&sha(&d.v2)));
    let save2 = Save {
        header: header(2, 0x22, Some(response_digest(&rr_head, &rr_body))),
        procedure: Procedure::Single,
        ctx_defs: vec![],
        requests: vec![RequestSpec { ctx_id: 1, head: Cb::Same, body: BodySpec::File { item: 0 } }],
        items: vec![patch_item(&d.patch23, &d.v3)],
    };
    let save2_bytes = save2.encode_with_payloads(&SECRET, &[&d.patch23]);
    out.push(
        "save-ctx-same-head",
        "SAVE using context 1 (held in the session state) with a SAME head, RESP_REF set, one PATCH item against files/report-v2.docx",
        PATH_SAVE,
        &save2_bytes,
        ctx_state.clone(),
        None,
    );

    // No context: a LITERAL head and a FULL item with its own key.
    let lit = literal_head("content-type: application/octet-stream\n");
    let full_item = Item {
        doc: Some(DocKey { provider: Provider::Graph, account: b"b!x9Yt2v".to_vec(), reference: b"/report.docx".to_vec() }),
        binding: Vec::new(),
        payload: Payload::Full,
        target_size: d.v1.len() as u64,
        target_sha256: sha(&d.v1),
    };
    let save3 = Save {
        header: header(3, 0x33, None),
        procedure: Procedure::Single,
        ctx_defs: vec![],
        requests: vec![RequestSpec { ctx_id: 0, head: Cb::Literal(lit.clone()), body: BodySpec::File { item: 0 } }],
        items: vec![full_item.clone()],
    };
    let save3_bytes = save3.encode_with_payloads(&SECRET, &[&d.v1]);
    out.push(
        "save-head-literal-no-ctx",
        "SAVE (Graph simple upload) with ctx_id 0, a LITERAL head and one FULL item carrying its own document key",
        PATH_SAVE,
        &save3_bytes,
        none.clone(),
        None,
    );

    // WRAPPED: a Drive multipart body with the file cut out.
    let (mp, split) = drive_body();
    let def2 = CtxDef { ctx_id: 2, head: drive_head(), body: mp.clone(), doc: Some(drive_key()) };
    let save4 = Save {
        header: header(4, 0x44, None),
        procedure: Procedure::Single,
        ctx_defs: vec![def2.clone()],
        requests: vec![RequestSpec {
            ctx_id: 2,
            head: Cb::Same,
            body: BodySpec::Wrapped { item: 0, bytes: Cb::Same, split: split as u64 },
        }],
        items: vec![Item { doc: None, ..full_item.clone() }],
    };
    let save4_bytes = save4.encode_with_payloads(&SECRET, &[&d.v1]);
    out.push("save-drive-multipart-wrapped", "SAVE (Drive multipart) with context 2 holding head and multipart frame; body WRAPPED: bytes SAME as the context body, the FULL file inserted at split", PATH_SAVE, &save4_bytes, none.clone(), None);

    // FETCH.
    let def3 = CtxDef { ctx_id: 3, head: download_head(), body: Vec::new(), doc: Some(dropbox_key()) };
    let fetch = Fetch {
        header: header(5, 0x55, None),
        follow_redirect: false,
        ctx_defs: vec![def3.clone()],
        request: RequestSpec { ctx_id: 3, head: Cb::Same, body: BodySpec::Empty },
        doc: None,
        have_sha256: Some(sha(&d.v2)),
    };
    let fetch_bytes = fetch.encode(&SECRET);
    let fetch_mac: [u8; 16] = fetch_bytes[fetch_bytes.len() - 16..].try_into().unwrap();
    out.push(
        "fetch-dropbox",
        "FETCH (Dropbox download) defining context 3 inline, head SAME, body EMPTY, holding report-v2 (have_sha256)",
        PATH_FETCH,
        &fetch_bytes,
        none.clone(),
        None,
    );
    let fetch_redirect = Fetch {
        header: header(6, 0x66, None),
        follow_redirect: true,
        ctx_defs: vec![],
        request: RequestSpec {
            ctx_id: 0,
            head: Cb::Literal(
                format!("GET https://graph.microsoft.com/v1.0/me/drive/items/01ABC/content\nauthorization: {MARKER}\n").into_bytes(),
            ),
            body: BodySpec::Empty,
        },
        doc: Some(DocKey { provider: Provider::Graph, account: b"b!x9Yt2v".to_vec(), reference: b"01ABC".to_vec() }),
        have_sha256: None,
    };
    let fetch_redirect_bytes = fetch_redirect.encode(&SECRET);
    let fetch_redirect_mac: [u8; 16] = fetch_redirect_bytes[fetch_redirect_bytes.len() - 16..].try_into().unwrap();
    out.push(
        "fetch-graph-follow-redirect",
        "FETCH (Graph download) with FOLLOW_REDIRECT, a LITERAL head, its own key, no have_sha256",
        PATH_FETCH,
        &fetch_redirect_bytes,
        none.clone(),
        None,
    );

    // SAVE_RESULT: coded against nothing, then against that response.
    let sr1 = SaveResult { flags: ResultFlags::default(), head: Cb::best(b"", &rr_head), body: Cb::best(b"", &rr_body) };
    out.push(
        "save-result-no-ref",
        "SAVE_RESULT answering save-ctx-defined-inline: a 200 with FileMetadata, CBs coded against empty references",
        "SAVE_RESULT",
        &sr1.encode(&SECRET, &save1_mac),
        json!({"request_mac": hx(&save1_mac)}),
        None,
    );
    let save2_mac: [u8; 16] = save2_bytes[save2.to_s().len()..][..16].try_into().unwrap();
    let rr2_head = save_response_head("Sun, 22 Nov 2026 09:20:41 GMT", "0b7e3d9c2a1f5e84");
    let rr2_body = save_response_body("62a1c3e5f0a8e0b200000002c9a7d43", d.v3.len(), &hx(&sha(&d.v3)));
    let sr2 = SaveResult {
        flags: ResultFlags { ref_used: true, ..Default::default() },
        head: Cb::best(&rr_head, &rr2_head),
        body: Cb::best(&rr_body, &rr2_body),
    };
    out.push("save-result-ref-used", "SAVE_RESULT answering save-ctx-same-head with REF_USED: head and body DELTAs against the response of save-result-no-ref (its digest is that SAVE's resp_ref)", "SAVE_RESULT", &sr2.encode(&SECRET, &save2_mac), json!({"request_mac": hx(&save2_mac), "reference": {"head": hx(&rr_head), "body": hx(&rr_body)}}), None);

    // FETCH_RESULT.
    let dl_head = format!("200 OK\ncontent-type: application/octet-stream\ndropbox-api-result: {{\"name\":\"report.docx\",\"rev\":\"62a1c3e5f0a8e0b200000002c9a7d43\",\"size\":{}}}\n", d.v3.len()).into_bytes();
    let fr1 = FetchResult {
        flags: ResultFlags::default(),
        parts: vec![FetchPart {
            head: Cb::best(b"", &dl_head),
            body: FetchBody::Patch { target_size: d.v3.len() as u64, target_sha256: sha(&d.v3), payload_len: d.patch23.len() as u64 },
        }],
    };
    let fr1_bytes = [fr1.encode(&SECRET, &fetch_mac), d.patch23.clone()].concat();
    out.push(
        "fetch-result-patch",
        "FETCH_RESULT answering fetch-dropbox: one part, 200, body PATCH against files/report-v2.docx rebuilding report-v3",
        "FETCH_RESULT",
        &fr1_bytes,
        json!({"request_mac": hx(&fetch_mac), "have": f_v2}),
        None,
    );
    let redirect = b"302 Found\nlocation: https://public.files.1drv.com/y4mAbCdEf/report.docx\ncache-control: no-cache\n".to_vec();
    let final_head = b"200 OK\ncontent-type: application/vnd.openxmlformats-officedocument.wordprocessingml.document\n".to_vec();
    let fr2 = FetchResult {
        flags: ResultFlags::default(),
        parts: vec![
            FetchPart { head: Cb::Literal(redirect), body: FetchBody::Inline(Cb::Literal(Vec::new())) },
            FetchPart {
                head: Cb::Literal(final_head),
                body: FetchBody::Full { target_size: d.v1.len() as u64, target_sha256: sha(&d.v1) },
            },
        ],
    };
    let fr2_bytes = [fr2.encode(&SECRET, &fetch_redirect_mac), d.v1.clone()].concat();
    out.push("fetch-result-two-parts", "FETCH_RESULT answering fetch-graph-follow-redirect: part 0 the 302 (INLINE, empty body), part 1 the 200 with the FULL file as payload", "FETCH_RESULT", &fr2_bytes, json!({"request_mac": hx(&fetch_redirect_mac)}), None);

    // ERROR.
    let err = ErrorMessage {
        version: 1,
        code: ErrorCode::BaseUnknown,
        stage: 0,
        retry_after_ms: 0,
        list: vec![0],
        cause: String::new(),
        detail: "base of item 0 is not in the store".into(),
    };
    out.push(
        "error-base-unknown",
        "ERROR base_unknown answering save-ctx-defined-inline, listing item 0, MACed",
        "ERROR",
        &err.encode(Some((&SECRET, &save1_mac))),
        json!({"request_mac": hx(&save1_mac), "version": 1}),
        None,
    );
    let err2 = ErrorMessage {
        version: 1,
        code: ErrorCode::PatchFailed,
        stage: 0,
        retry_after_ms: 0,
        list: vec![0],
        cause: "codec".into(),
        detail: "patch of item 0 does not apply".into(),
    };
    out.push(
        "error-patch-failed-cause",
        "ERROR patch_failed with cause \"codec\", MACed",
        "ERROR",
        &err2.encode(Some((&SECRET, &save1_mac))),
        json!({"request_mac": hx(&save1_mac), "version": 1}),
        None,
    );
    let err3 = ErrorMessage {
        version: 0,
        code: ErrorCode::AuthFailed,
        stage: 0,
        retry_after_ms: 0,
        list: vec![],
        cause: String::new(),
        detail: "authentication failed".into(),
    };
    out.push(
        "error-unauthenticated",
        "ERROR auth_failed answering a HELLO (version 0), with the zero MAC: unauthenticated, may only cause a fallback",
        "ERROR",
        &err3.encode(None),
        json!({"request_mac": hx(&hello_mac), "version": 0}),
        None,
    );

    // ---------------- invalid
    use ErrorCode::*;
    let s1_len = save1.to_s().len();
    let bad = |out: &mut Out, name: &str, what: &str, kind: &str, bytes: &[u8], state: &Value, code: ErrorCode| {
        out.push(name, what, kind, bytes, state.clone(), Some(code))
    };
    bad(
        &mut out,
        "bad-version-byte",
        "save-ctx-defined-inline with version byte 2",
        PATH_SAVE,
        &with_byte(&save1_bytes, 0, 2),
        &bases1,
        UnsupportedVersion,
    );
    bad(
        &mut out,
        "hello-version-byte-1",
        "hello-v1 with version byte 1 (HELLO's layout is version 0)",
        PATH_HELLO,
        &with_byte(&hello_bytes, 0, 1),
        &none,
        UnsupportedVersion,
    );
    bad(
        &mut out,
        "hello-no-common-version",
        "HELLO listing only version 2",
        PATH_HELLO,
        &Hello { versions: vec![2], ..hello.clone() }.encode(&SECRET),
        &none,
        UnsupportedVersion,
    );
    bad(
        &mut out,
        "hello-versions-not-descending",
        "HELLO listing versions [1, 2]",
        PATH_HELLO,
        &Hello { versions: vec![1, 2], ..hello.clone() }.encode(&SECRET),
        &none,
        Malformed,
    );
    bad(
        &mut out,
        "hello-versions-empty",
        "HELLO with an empty versions list",
        PATH_HELLO,
        &Hello { versions: vec![], ..hello.clone() }.encode(&SECRET),
        &none,
        Malformed,
    );
    bad(
        &mut out,
        "unknown-type",
        "save-ctx-defined-inline with type 0x04",
        PATH_SAVE,
        &with_byte(&save1_bytes, 1, 0x04),
        &bases1,
        Malformed,
    );
    bad(&mut out, "type-path-mismatch", "fetch-dropbox sent to /ec/1/save", PATH_SAVE, &fetch_bytes, &none, Malformed);
    bad(
        &mut out,
        "reserved-flag",
        "save-ctx-defined-inline with flag bit 1 set",
        PATH_SAVE,
        &flip(&save1_bytes, 2, 0x02),
        &bases1,
        Malformed,
    );
    bad(
        &mut out,
        "fetch-reserved-fetch-flag",
        "fetch-dropbox with fetch_flags bit 1 set",
        PATH_FETCH,
        &flip(&fetch_bytes, 20, 0x02),
        &none,
        Malformed,
    );
    // seq is at offset 11 (one byte, 0x01): 0x81 0x00 is its non-shortest form.
    let nonshort = [&save1_bytes[..11], &[0x81, 0x00], &save1_bytes[12..]].concat();
    bad(&mut out, "non-shortest-varint", "save-ctx-defined-inline with seq 1 written as 81 00", PATH_SAVE, &nonshort, &bases1, Malformed);
    bad(
        &mut out,
        "truncated-in-field",
        "save-ctx-defined-inline cut inside the item's target_sha256",
        PATH_SAVE,
        &save1_bytes[..s1_len - 10],
        &bases1,
        Malformed,
    );
    bad(
        &mut out,
        "truncated-in-mac",
        "save-ctx-defined-inline cut 5 bytes into the MAC",
        PATH_SAVE,
        &save1_bytes[..s1_len + 5],
        &bases1,
        Malformed,
    );
    bad(
        &mut out,
        "payload-short",
        "save-ctx-defined-inline with the patch's last byte missing",
        PATH_SAVE,
        &save1_bytes[..save1_bytes.len() - 1],
        &bases1,
        Malformed,
    );
    bad(
        &mut out,
        "trailing-bytes",
        "save-ctx-defined-inline with one byte after the payload",
        PATH_SAVE,
        &[&save1_bytes[..], &[0]].concat(),
        &bases1,
        Malformed,
    );
    bad(
        &mut out,
        "fetch-trailing-bytes",
        "fetch-dropbox with one byte after the MAC",
        PATH_FETCH,
        &[&fetch_bytes[..], &[0]].concat(),
        &none,
        Malformed,
    );
    let seq0 = Save { header: header(0, 0x11, None), ..save1.clone() }.encode_with_payloads(&SECRET, &[&d.patch12]);
    bad(&mut out, "seq-zero", "save-ctx-defined-inline with seq 0 (MAC valid)", PATH_SAVE, &seq0, &bases1, Malformed);
    let bad_cb = Save { requests: vec![RequestSpec { ctx_id: 1, head: Cb::Same, body: BodySpec::File { item: 0 } }], ..save1.clone() }
        .encode_with_payloads(&SECRET, &[&d.patch12]);
    // The request spec starts right after request_count; its head CB's mode follows ctx_id (one byte each).
    let at = Save { requests: vec![], items: vec![], ..save1.clone() }.to_s().len();
    assert_eq!(&bad_cb[at..at + 3], &[0x00, 0x01, 0x00], "SAME head, FILE, item 0");
    bad(&mut out, "bad-cb-mode", "a SAVE whose head CB has mode 3", PATH_SAVE, &with_byte(&bad_cb, at, 3), &bases1, Malformed);
    let bad_kind = with_byte(&bad_cb, at + 1, 4);
    bad(&mut out, "bad-body-kind", "a SAVE whose request has body_kind 4", PATH_SAVE, &bad_kind, &bases1, Malformed);
    bad(
        &mut out,
        "mac-bit-flipped",
        "save-ctx-defined-inline with one MAC bit flipped",
        PATH_SAVE,
        &flip(&save1_bytes, s1_len, 0x01),
        &bases1,
        AuthFailed,
    );
    bad(
        &mut out,
        "structured-bit-flipped",
        "save-ctx-defined-inline with one bit of request_id flipped (still well-formed)",
        PATH_SAVE,
        &flip(&save1_bytes, 12, 0x01),
        &bases1,
        AuthFailed,
    );
    bad(
        &mut out,
        "wrong-secret",
        "save-ctx-defined-inline MACed with another secret",
        PATH_SAVE,
        &save1.encode_with_payloads(&secret2, &[&d.patch12]),
        &bases1,
        AuthFailed,
    );
    bad(&mut out, "hello-wrong-secret", "hello-v1 MACed with another secret", PATH_HELLO, &hello.encode(&secret2), &none, AuthFailed);
    bad(
        &mut out,
        "unknown-key-id",
        "hello-v1 naming key_id 2",
        PATH_HELLO,
        &Hello { key_id: 2, ..hello.clone() }.encode(&SECRET),
        &none,
        AuthFailed,
    );
    let other_session = Save { header: RequestHeader { session_id: [0xee; 8], ..save1.header.clone() }, ..save1.clone() };
    bad(
        &mut out,
        "unknown-session",
        "save-ctx-defined-inline naming another session (MAC valid)",
        PATH_SAVE,
        &other_session.encode_with_payloads(&SECRET, &[&d.patch12]),
        &bases1,
        SessionUnknown,
    );
    let empty_full =
        Item { doc: Some(dropbox_key()), binding: b"sess".to_vec(), payload: Payload::Full, target_size: 0, target_sha256: sha(b"") };
    let many = Save { items: vec![empty_full.clone(); 101], ..save3.clone() };
    bad(&mut out, "too-many-items", "a SAVE with 101 items (max_items 100)", PATH_SAVE, &many.encode(&SECRET), &none, LimitExceeded);
    let three_requests = Save { requests: vec![save3.requests[0].clone(); 3], ..save3.clone() };
    bad(
        &mut out,
        "too-many-requests",
        "a SAVE with 3 request specifications (at most 2, the most any procedure takes)",
        PATH_SAVE,
        &three_requests.encode(&SECRET),
        &none,
        LimitExceeded,
    );
    let zero_items = Save { items: vec![], ..save3.clone() };
    bad(&mut out, "zero-items", "a SAVE with item_count 0", PATH_SAVE, &zero_items.encode(&SECRET), &none, Malformed);
    let with_head = |h: Vec<u8>| {
        Save { requests: vec![RequestSpec { ctx_id: 0, head: Cb::Literal(h), body: BodySpec::File { item: 0 } }], ..save3.clone() }
            .encode_with_payloads(&SECRET, &[&d.v1])
    };
    bad(
        &mut out,
        "too-many-headers",
        "a LITERAL head with 101 field lines (max_headers 100)",
        PATH_SAVE,
        &with_head(literal_head(&"x-a: 1\n".repeat(100))),
        &none,
        LimitExceeded,
    );
    let big_head = [&ctx_head[..], b"x-pad: ", &vec![b'a'; 65_536], b"\n"].concat();
    let over = Save { ctx_defs: vec![CtxDef { head: big_head.clone(), ..def1.clone() }], ..save1.clone() };
    bad(
        &mut out,
        "head-over-max",
        "a context definition whose head is over max_head (64 KiB)",
        PATH_SAVE,
        &over.encode_with_payloads(&SECRET, &[&d.patch12]),
        &bases1,
        LimitExceeded,
    );
    bad(
        &mut out,
        "head-literal-over-max",
        "a LITERAL head over max_head (64 KiB)",
        PATH_SAVE,
        &with_head(big_head.clone()),
        &none,
        LimitExceeded,
    );
    let head_delta_big = Save {
        requests: vec![RequestSpec { ctx_id: 1, head: Cb::best(&ctx_head, &big_head), body: BodySpec::File { item: 0 } }],
        ..save1.clone()
    };
    bad(
        &mut out,
        "head-delta-over-max",
        "a DELTA head that decodes to more than max_head (checked from the ec-diff header before zstd)",
        PATH_SAVE,
        &head_delta_big.encode_with_payloads(&SECRET, &[&d.patch12]),
        &bases1,
        LimitExceeded,
    );
    bad(
        &mut out,
        "label-too-long",
        "HELLO with a 65-byte label",
        PATH_HELLO,
        &Hello { label: "l".repeat(65), ..hello.clone() }.encode(&SECRET),
        &none,
        LimitExceeded,
    );
    let huge = Save {
        requests: vec![RequestSpec {
            ctx_id: 0,
            head: Cb::Literal(lit.clone()),
            body: BodySpec::Bytes { bytes: Cb::Delta(vec![0; 1 << 20]) },
        }],
        ..save3.clone()
    };
    bad(
        &mut out,
        "envelope-over-max",
        "a SAVE whose structured part is over max_envelope (1 MiB)",
        PATH_SAVE,
        &huge.encode(&SECRET),
        &none,
        TooLarge,
    );
    let item_big = Save { items: vec![Item { target_size: (2 << 30) + 1, ..full_item.clone() }], ..save3.clone() };
    bad(&mut out, "item-over-max-size", "a FULL item of target_size 2 GiB + 1", PATH_SAVE, &item_big.encode(&SECRET), &none, TooLarge);
    let patch_big =
        Save { items: vec![Item { payload: Payload::Patch { payload_len: (64 << 20) + 1 }, ..save1.items[0].clone() }], ..save1.clone() };
    bad(&mut out, "patch-over-max", "a PATCH item with payload_len 64 MiB + 1", PATH_SAVE, &patch_big.encode(&SECRET), &none, TooLarge);
    bad(
        &mut out,
        "head-forbidden-host",
        "a LITERAL head carrying host",
        PATH_SAVE,
        &with_head(literal_head("host: graph.microsoft.com\n")),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "head-forbidden-content-length",
        "a LITERAL head carrying content-length",
        PATH_SAVE,
        &with_head(literal_head("content-length: 5549\n")),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "head-forbidden-transfer-encoding",
        "a LITERAL head carrying transfer-encoding",
        PATH_SAVE,
        &with_head(literal_head("transfer-encoding: chunked\n")),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "head-pseudo-header",
        "a LITERAL head carrying :authority",
        PATH_SAVE,
        &with_head(literal_head(":authority: graph.microsoft.com\n")),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "head-uppercase-name",
        "a LITERAL head with the name Content-Type",
        PATH_SAVE,
        &with_head(literal_head("Content-Type: application/octet-stream\n")),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "head-value-with-cr",
        "a LITERAL head whose value holds CR",
        PATH_SAVE,
        &with_head(literal_head("x-a: 1\r\n")),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "head-value-trailing-space",
        "a LITERAL head whose value ends with a space",
        PATH_SAVE,
        &with_head(literal_head("x-a: 1 \n")),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "head-empty-line",
        "a LITERAL head with an empty line",
        PATH_SAVE,
        &with_head([&literal_head("")[..], b"\n"].concat()),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "head-no-final-lf",
        "a LITERAL head whose last line lacks LF",
        PATH_SAVE,
        &with_head(literal_head("x-a: 1")),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "head-lowercase-method",
        "a LITERAL head with method put",
        PATH_SAVE,
        &with_head(b"put https://graph.microsoft.com/v1.0/me/drive/root:/r.docx:/content\n".to_vec()),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "url-http-scheme",
        "a LITERAL head with an http URL (lab mode off)",
        PATH_SAVE,
        &with_head(b"PUT http://graph.microsoft.com/v1.0/me/drive/root:/r.docx:/content\n".to_vec()),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "url-with-userinfo",
        "a LITERAL head whose URL has userinfo",
        PATH_SAVE,
        &with_head(b"PUT https://user:pw@graph.microsoft.com/v1.0/me/drive/root:/r.docx:/content\n".to_vec()),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "url-with-fragment",
        "a LITERAL head whose URL has a fragment",
        PATH_SAVE,
        &with_head(b"PUT https://graph.microsoft.com/v1.0/me/drive/root:/r.docx:/content#x\n".to_vec()),
        &none,
        InvalidRequest,
    );
    bad(
        &mut out,
        "url-over-max",
        "a LITERAL head whose URL is over max_url (8 KiB)",
        PATH_SAVE,
        &with_head([&b"PUT https://graph.microsoft.com/"[..], &vec![b'a'; 8192], b"\n"].concat()),
        &none,
        InvalidRequest,
    );
    let same0 = Save { requests: vec![RequestSpec { ctx_id: 0, head: Cb::Same, body: BodySpec::File { item: 0 } }], ..save3.clone() };
    bad(
        &mut out,
        "same-head-without-ctx",
        "a SAME head with ctx_id 0",
        PATH_SAVE,
        &same0.encode_with_payloads(&SECRET, &[&d.v1]),
        &none,
        InvalidRequest,
    );
    let ctx0 = Save { ctx_defs: vec![CtxDef { ctx_id: 0, ..def1.clone() }], ..save1.clone() };
    bad(
        &mut out,
        "ctx-id-zero",
        "a context definition with ctx_id 0",
        PATH_SAVE,
        &ctx0.encode_with_payloads(&SECRET, &[&d.patch12]),
        &bases1,
        InvalidRequest,
    );
    let ctx65 = Save { ctx_defs: vec![CtxDef { ctx_id: 65, ..def1.clone() }], ..save1.clone() };
    bad(
        &mut out,
        "ctx-id-over-max",
        "a context definition with ctx_id 65 (max_contexts 64)",
        PATH_SAVE,
        &ctx65.encode_with_payloads(&SECRET, &[&d.patch12]),
        &bases1,
        InvalidRequest,
    );
    let bad_def_head = Save {
        ctx_defs: vec![CtxDef { head: b"POST https://content.dropboxapi.com/2/files/upload\nHost: x\n".to_vec(), ..def1.clone() }],
        ..save1.clone()
    };
    bad(
        &mut out,
        "ctx-head-invalid",
        "a context definition whose head breaks the canonical rules",
        PATH_SAVE,
        &bad_def_head.encode_with_payloads(&SECRET, &[&d.patch12]),
        &bases1,
        InvalidRequest,
    );
    let no_ctx = Save {
        ctx_defs: vec![],
        requests: vec![RequestSpec { ctx_id: 5, head: Cb::Same, body: BodySpec::File { item: 0 } }],
        ..save1.clone()
    };
    bad(
        &mut out,
        "context-unknown",
        "a SAVE naming context 5, which neither the state nor the message defines",
        PATH_SAVE,
        &no_ctx.encode_with_payloads(&SECRET, &[&d.patch12]),
        &bases1,
        ContextUnknown,
    );
    // A DELTA that keeps more bytes than the reference has.
    let mut nonapply = Vec::new();
    ec_protocol::wire::put_varint(&mut nonapply, ctx_head.len() as u64);
    nonapply.extend([0x01, 0x00, 0x01, b'x']);
    let nd =
        Save { requests: vec![RequestSpec { ctx_id: 1, head: Cb::Delta(nonapply), body: BodySpec::File { item: 0 } }], ..save1.clone() };
    bad(
        &mut out,
        "head-delta-does-not-apply",
        "a DELTA head that replaces bytes past the end of the context head",
        PATH_SAVE,
        &nd.encode_with_payloads(&SECRET, &[&d.patch12]),
        &bases1,
        Malformed,
    );
    let idx = Save { requests: vec![RequestSpec { ctx_id: 1, head: head_cb.clone(), body: BodySpec::File { item: 1 } }], ..save1.clone() };
    bad(
        &mut out,
        "item-index-out-of-range",
        "a FILE body naming item 1 of 1",
        PATH_SAVE,
        &idx.encode_with_payloads(&SECRET, &[&d.patch12]),
        &bases1,
        InvalidRequest,
    );
    let unused = Save { items: vec![full_item.clone(), full_item.clone()], ..save3.clone() };
    bad(
        &mut out,
        "item-unused",
        "two items, only item 0 used by the request and item 1 without a binding",
        PATH_SAVE,
        &unused.encode_with_payloads(&SECRET, &[&d.v1, &d.v1]),
        &none,
        InvalidRequest,
    );
    let nodoc = Save { items: vec![Item { doc: None, ..full_item.clone() }], ..save3.clone() };
    bad(
        &mut out,
        "item-without-doc-key",
        "an item with has_doc 0 while the first request has no context",
        PATH_SAVE,
        &nodoc.encode_with_payloads(&SECRET, &[&d.v1]),
        &none,
        InvalidRequest,
    );
    let split_past = Save {
        requests: vec![RequestSpec {
            ctx_id: 2,
            head: Cb::Same,
            body: BodySpec::Wrapped { item: 0, bytes: Cb::Same, split: mp.len() as u64 + 1 },
        }],
        ..save4.clone()
    };
    bad(
        &mut out,
        "wrapped-split-past-bytes",
        "a WRAPPED body whose split is past the decoded bytes",
        PATH_SAVE,
        &split_past.encode_with_payloads(&SECRET, &[&d.v1]),
        &none,
        InvalidRequest,
    );
    let bad_provider = {
        let mut b = save3.clone();
        b.items[0].doc = Some(dropbox_key());
        let mut bytes = b.encode_with_payloads(&SECRET, &[&d.v1]);
        // The item starts right after item_count: has_doc, then the provider byte.
        let at = Save { items: vec![], ..b.clone() }.to_s().len() + 1;
        assert_eq!(bytes[at], 1);
        bytes[at] = 5;
        bytes
    };
    bad(&mut out, "doc-key-unknown-provider", "an item's document key with provider 5", PATH_SAVE, &bad_provider, &none, Malformed);
    let ranged = Fetch {
        request: RequestSpec {
            ctx_id: 3,
            head: Cb::best(&download_head(), &[&download_head()[..], b"range: bytes=0-99\n"].concat()),
            body: BodySpec::Empty,
        },
        ..fetch.clone()
    };
    bad(&mut out, "fetch-with-range", "a FETCH whose head carries range", PATH_FETCH, &ranged.encode(&SECRET), &none, Unsupported);
    let fetch_file = Fetch { request: RequestSpec { ctx_id: 3, head: Cb::Same, body: BodySpec::File { item: 0 } }, ..fetch.clone() };
    bad(&mut out, "fetch-body-file", "a FETCH whose request body is FILE", PATH_FETCH, &fetch_file.encode(&SECRET), &none, InvalidRequest);

    // Responses a device must refuse.
    let sr1_bytes = sr1.encode(&SECRET, &save1_mac);
    let req1 = json!({"request_mac": hx(&save1_mac)});
    bad(
        &mut out,
        "save-result-mac-bit-flipped",
        "save-result-no-ref with one MAC bit flipped",
        "SAVE_RESULT",
        &flip(&sr1_bytes, sr1_bytes.len() - 1, 0x80),
        &req1,
        AuthFailed,
    );
    bad(
        &mut out,
        "save-result-other-request",
        "save-result-no-ref checked against another request's MAC (responses are bound to their request)",
        "SAVE_RESULT",
        &sr1_bytes,
        &json!({"request_mac": hx(&fetch_mac)}),
        AuthFailed,
    );
    bad(
        &mut out,
        "save-result-reserved-flag",
        "a SAVE_RESULT with flag bit 3 set",
        "SAVE_RESULT",
        &flip(&sr1_bytes, 2, 0x08),
        &req1,
        Malformed,
    );
    let part0_full = FetchResult { flags: ResultFlags::default(), parts: vec![fr2.parts[1].clone(), fr2.parts[0].clone()] };
    bad(
        &mut out,
        "fetch-result-part0-not-inline",
        "a two-part FETCH_RESULT whose part 0 is FULL",
        "FETCH_RESULT",
        &[part0_full.encode(&SECRET, &fetch_redirect_mac), d.v1.clone()].concat(),
        &json!({"request_mac": hx(&fetch_redirect_mac)}),
        Malformed,
    );
    bad(
        &mut out,
        "fetch-result-payload-short",
        "fetch-result-patch with the payload's last byte missing",
        "FETCH_RESULT",
        &fr1_bytes[..fr1_bytes.len() - 1],
        &json!({"request_mac": hx(&fetch_mac), "have": f_v2}),
        Malformed,
    );
    let fr_replayed = flip(&fr1_bytes, 2, flags::REPLAYED);
    bad(
        &mut out,
        "fetch-result-replayed-flag",
        "a FETCH_RESULT with REPLAYED (reserved there) set",
        "FETCH_RESULT",
        &fr_replayed,
        &json!({"request_mac": hx(&fetch_mac), "have": f_v2}),
        Malformed,
    );
    let err_bytes = err.encode(Some((&SECRET, &save1_mac)));
    bad(
        &mut out,
        "error-unknown-code",
        "an ERROR with code 25",
        "ERROR",
        &with_byte(&err_bytes, 3, 25),
        &json!({"request_mac": hx(&save1_mac), "version": 1}),
        Malformed,
    );
    bad(
        &mut out,
        "error-stage-2",
        "an ERROR with stage 2",
        "ERROR",
        &with_byte(&err_bytes, 4, 2),
        &json!({"request_mac": hx(&save1_mac), "version": 1}),
        Malformed,
    );

    let manifest = json!({
        "protocol": "EdgeCourier device-to-edge protocol",
        "protocol_version": 1,
        "spec": "docs/spec/device-edge-protocol-v1.md",
        "constants": {"secret": hx(&SECRET), "key_id": KEY_ID, "session_id": hx(&SESSION_ID), "device_nonce": hx(&DEVICE_NONCE), "marker_credential": MARKER, "eps_versions": EPS_VERSIONS},
        "limits": Limits::default().to_pairs().iter().map(|(i, v)| json!([i, v])).collect::<Vec<_>>(),
        "how_to_check": HOW_TO_CHECK,
        "vectors": out.entries,
    });
    let mut text = serde_json::to_string_pretty(&manifest).unwrap();
    text.push('\n');
    out.files.insert("manifest.json".into(), text.into_bytes());
    out.files
}

pub const HOW_TO_CHECK: &str = "Codec-level vectors: no EPS, no provider. Paths are relative to this folder; byte strings are lower-case hex. \
Requests (direction request, sent to `path`): (1) decode the message for that path with the default limits (§4; structural checks only; a structured part over max_envelope is too_large); \
(2) HELLO: key_id must be constants.key_id and the MAC must verify with constants.secret, else auth_failed; then the chosen version is the highest of `versions` in constants.eps_versions, else unsupported_version. \
SAVE/FETCH: a session_id other than constants.session_id is session_unknown if the MAC verifies, else auth_failed; then the MAC must verify (auth_failed); \
(3) check every context definition (ctx_id 1..max_contexts, head per §4.3.1) and only then add them to state.contexts; \
(4) resolve: contexts named but not defined (context_unknown, listing them), each request spec (CB decoding with the length checked before zstd, head rules, item indexes, split), each item's document key, every item used (by a FILE/WRAPPED body or a non-empty binding); FETCH: body EMPTY or BYTES, no range/if-range (unsupported); \
(5) SAVE: the payloads after the MAC must be exactly as long as the items declare (malformed). The first failure gives expect.error (and expect.list for context_unknown). \
Valid requests: compare expect.decoded field by field, expect.mac, expect.s_len, the resolved heads/bodies, document keys, store keys (SHA-256 of the encoded key) and the operation digest (§5.4); re-encoding the decoded message (with the constants' secret) must give the file's bytes; a PATCH item's payload applied to the file state.bases[i] gives target_size bytes with target_sha256. \
Responses (direction response, message named): decode, verify the response MAC against state.request_mac (ERROR: a zero MAC means unauthenticated, expect.authenticated false); decode the CBs against state.reference when REF_USED is set, else against empty; compare expect.resolved (decoded heads, bodies and response digests, §4.6.2); a FETCH_RESULT PATCH payload applied to state.have gives its target. Re-encoding must give the same bytes.";
