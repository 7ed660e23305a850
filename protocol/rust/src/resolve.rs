//! The pure helpers the EPS runs after a request's MAC verified (§5.1
//! steps 4–5): checking and applying context definitions, resolving request
//! specifications into concrete heads and bodies, resolving items' document
//! keys, and the two digests of the protocol (operation, §5.4; response,
//! §4.6.2).
//!
//! Nothing here holds session state: the caller passes the contexts it has
//! (a [`ContextTable`] is a plain map the EPS may wrap in its own eviction
//! and TTL logic).

use std::collections::BTreeMap;

use sha2::{Digest, Sha256};

use crate::error::{ErrorCode, ProtoError, Result};
use crate::head::{Head, HeadRules};
use crate::limits::Limits;
use crate::messages::{BodySpec, CtxDef, DocKey, Fetch, Item, Procedure, RequestSpec, Save};
use crate::wire::put_varint;

/// A defined context (§4.3.2): reference head and body, optional key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Context {
    pub head: Vec<u8>,
    pub body: Vec<u8>,
    pub doc: Option<DocKey>,
}

impl Context {
    /// Bytes this context counts toward `max_context_bytes`.
    pub fn size(&self) -> u64 {
        (self.head.len() + self.body.len() + self.doc.as_ref().map_or(0, |d| d.encode().len())) as u64
    }
}

/// The contexts of one session, by id.
pub type ContextTable = BTreeMap<u64, Context>;

/// Checks one definition: `ctx_id` in 1 ..= `max_contexts` and a head that
/// follows §4.3.1 (`invalid_request`, or `limit_exceeded` for its size).
pub fn validate_definition(def: &CtxDef, limits: &Limits, rules: &HeadRules) -> Result<()> {
    if def.ctx_id == 0 || def.ctx_id > limits.max_contexts {
        return Err(ProtoError::invalid(format!("ctx_id {} is outside 1..={}", def.ctx_id, limits.max_contexts)));
    }
    Head::parse(&def.head, rules).map(|_| ()).map_err(|e| ProtoError::new(e.code, format!("context {}: {}", def.ctx_id, e.detail)))
}

/// Checks every definition of a message and, only if all are valid, enters
/// them into `table` (a later definition of an id replaces an earlier one).
pub fn apply_definitions(table: &mut ContextTable, defs: &[CtxDef], limits: &Limits, rules: &HeadRules) -> Result<()> {
    for d in defs {
        validate_definition(d, limits, rules)?;
    }
    for d in defs {
        table.insert(d.ctx_id, Context { head: d.head.clone(), body: d.body.clone(), doc: d.doc.clone() });
    }
    Ok(())
}

/// A resolved body (§4.3.3), before the item's file is known.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResolvedBody {
    Empty,
    /// The file of item `item`.
    File {
        item: usize,
    },
    /// These bytes.
    Bytes(Vec<u8>),
    /// `bytes[..split]` ‖ file of `item` ‖ `bytes[split..]`.
    Wrapped {
        item: usize,
        bytes: Vec<u8>,
        split: usize,
    },
}

impl ResolvedBody {
    /// The `body_kind` byte.
    pub fn kind(&self) -> u8 {
        match self {
            ResolvedBody::Empty => 0,
            ResolvedBody::File { .. } => 1,
            ResolvedBody::Bytes(_) => 2,
            ResolvedBody::Wrapped { .. } => 3,
        }
    }
    /// The item whose file is (in) the body.
    pub fn item(&self) -> Option<usize> {
        match self {
            ResolvedBody::File { item } | ResolvedBody::Wrapped { item, .. } => Some(*item),
            _ => None,
        }
    }
    /// The body the provider gets, given the item files.
    pub fn assemble(&self, files: &[&[u8]]) -> Vec<u8> {
        match self {
            ResolvedBody::Empty => Vec::new(),
            ResolvedBody::File { item } => files[*item].to_vec(),
            ResolvedBody::Bytes(b) => b.clone(),
            ResolvedBody::Wrapped { item, bytes, split } => [&bytes[..*split], files[*item], &bytes[*split..]].concat(),
        }
    }
}

/// A request made concrete: its head (parsed and as bytes) and body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedRequest {
    pub head: Head,
    /// The canonical head bytes, as the operation digest uses them.
    pub head_bytes: Vec<u8>,
    pub body: ResolvedBody,
}

/// Resolves one request specification against its context (`None` when
/// `ctx_id` is 0). A nonzero `ctx_id` without a context is
/// `context_unknown` listing it; a head or body that decodes over its limit
/// is `limit_exceeded`; a DELTA that does not apply is `malformed`; a head
/// that breaks §4.3.1, a SAME head without a context, an item index
/// ≥ `item_count` or a `split` past the bytes is `invalid_request`.
pub fn resolve_request(
    spec: &RequestSpec,
    ctx: Option<&Context>,
    item_count: usize,
    limits: &Limits,
    rules: &HeadRules,
) -> Result<ResolvedRequest> {
    let ctx = match (spec.ctx_id, ctx) {
        (0, _) => None,
        (id, None) => return Err(ProtoError::with_list(ErrorCode::ContextUnknown, format!("context {id} is not defined"), vec![id])),
        (_, Some(c)) => Some(c),
    };
    if ctx.is_none() && spec.head == crate::cb::Cb::Same {
        return Err(ProtoError::invalid("a SAME head with ctx_id 0"));
    }
    let (ref_head, ref_body) = ctx.map_or((&[][..], &[][..]), |c| (&c.head[..], &c.body[..]));
    let head_bytes = spec.head.decode(ref_head, "head", rules.max_head, ErrorCode::LimitExceeded)?;
    let head = Head::parse(&head_bytes, rules)?;
    let item = |i: u64| {
        usize::try_from(i)
            .ok()
            .filter(|&i| i < item_count)
            .ok_or_else(|| ProtoError::invalid(format!("item index {i} with {item_count} items")))
    };
    let body = match &spec.body {
        BodySpec::Empty => ResolvedBody::Empty,
        BodySpec::File { item: i } => ResolvedBody::File { item: item(*i)? },
        BodySpec::Bytes { bytes } => ResolvedBody::Bytes(bytes.decode(ref_body, "bytes", limits.max_body_ref, ErrorCode::LimitExceeded)?),
        BodySpec::Wrapped { item: i, bytes, split } => {
            let i = item(*i)?;
            let bytes = bytes.decode(ref_body, "bytes", limits.max_body_ref, ErrorCode::LimitExceeded)?;
            let split = usize::try_from(*split)
                .ok()
                .filter(|&s| s <= bytes.len())
                .ok_or_else(|| ProtoError::invalid(format!("split {split} past the {} bytes", bytes.len())))?;
            ResolvedBody::Wrapped { item: i, bytes, split }
        }
    };
    Ok(ResolvedRequest { head, head_bytes, body })
}

/// The ids of the contexts `specs` name that `table` lacks, ascending.
pub fn missing_contexts<'a>(specs: impl IntoIterator<Item = &'a RequestSpec>, table: &ContextTable) -> Vec<u64> {
    let mut ids: Vec<u64> = specs.into_iter().map(|s| s.ctx_id).filter(|&id| id != 0 && !table.contains_key(&id)).collect();
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// A SAVE with every request and item key resolved.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedSave {
    pub requests: Vec<ResolvedRequest>,
    /// The document key of each item.
    pub docs: Vec<DocKey>,
}

/// Resolves a SAVE against `table` (which already holds the SAVE's own
/// definitions, see [`apply_definitions`]): missing contexts
/// (`context_unknown`, listing all), each request, each item's document key
/// (`invalid_request` if it defaults to a context without one), and that
/// every item is used by a FILE or WRAPPED body or a binding
/// (`invalid_request`). Procedure shapes (§6) are the EPS's to check.
pub fn resolve_save(save: &Save, table: &ContextTable, limits: &Limits, rules: &HeadRules) -> Result<ResolvedSave> {
    let missing = missing_contexts(&save.requests, table);
    if !missing.is_empty() {
        return Err(ProtoError::with_list(ErrorCode::ContextUnknown, format!("{} contexts are not defined", missing.len()), missing));
    }
    let requests = save
        .requests
        .iter()
        .map(|q| resolve_request(q, table.get(&q.ctx_id), save.items.len(), limits, rules))
        .collect::<Result<Vec<_>>>()?;
    let first_ctx = save.requests.first().and_then(|q| table.get(&q.ctx_id).filter(|_| q.ctx_id != 0));
    let docs = save
        .items
        .iter()
        .enumerate()
        .map(|(i, item)| match (&item.doc, first_ctx.and_then(|c| c.doc.as_ref())) {
            (Some(d), _) | (None, Some(d)) => Ok(d.clone()),
            (None, None) => Err(ProtoError::invalid(format!("item {i} has no document key and the first request's context has none"))),
        })
        .collect::<Result<Vec<_>>>()?;
    // GRAPH_SESSION, DRIVE_RESUMABLE and NEXTCLOUD_CHUNKED upload their one
    // item's file in requests the EPS makes itself (§4.5, §6.4-§6.6).
    let procedure_owns_item = matches!(save.procedure, Procedure::GraphSession | Procedure::DriveResumable | Procedure::NextcloudChunked);
    for (i, item) in save.items.iter().enumerate() {
        if item.binding.is_empty() && !(procedure_owns_item && i == 0) && !requests.iter().any(|q| q.body.item() == Some(i)) {
            return Err(ProtoError::invalid(format!("item {i} is not used by any request or binding")));
        }
    }
    Ok(ResolvedSave { requests, docs })
}

/// A FETCH resolved: the download request and the document key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResolvedFetch {
    pub request: ResolvedRequest,
    pub doc: DocKey,
}

/// Resolves a FETCH against `table` (holding its definitions): the request
/// (body EMPTY or BYTES, else `invalid_request`; a `range` or `if-range`
/// field is `unsupported`) and its document key (`invalid_request` when
/// neither the FETCH nor the context has one).
pub fn resolve_fetch(fetch: &Fetch, table: &ContextTable, limits: &Limits, rules: &HeadRules) -> Result<ResolvedFetch> {
    let ctx = table.get(&fetch.request.ctx_id).filter(|_| fetch.request.ctx_id != 0);
    if !matches!(fetch.request.body, BodySpec::Empty | BodySpec::Bytes { .. }) {
        return Err(ProtoError::invalid("a FETCH request body must be EMPTY or BYTES"));
    }
    let request = resolve_request(&fetch.request, ctx, 0, limits, rules)?;
    if request.head.fields.iter().any(|(n, _)| n == "range" || n == "if-range") {
        return Err(ProtoError::new(ErrorCode::Unsupported, "a ranged FETCH"));
    }
    let doc = match (&fetch.doc, ctx.and_then(|c| c.doc.as_ref())) {
        (Some(d), _) | (None, Some(d)) => d.clone(),
        (None, None) => return Err(ProtoError::invalid("the FETCH has no document key and its context has none")),
    };
    Ok(ResolvedFetch { request, doc })
}

fn blob(h: &mut Sha256, b: &[u8]) {
    let mut v = Vec::with_capacity(10);
    put_varint(&mut v, b.len() as u64);
    h.update(&v);
    h.update(b);
}

fn varint(h: &mut Sha256, x: u64) {
    let mut v = Vec::with_capacity(10);
    put_varint(&mut v, x);
    h.update(&v);
}

/// The operation digest of a save (§5.4): SHA-256 over `procedure`,
/// varint(request count), per request blob(head) ‖ `body_kind` ‖ the item
/// index (varint), blob(decoded bytes) and `split` (varint) as present,
/// varint(item count), per item the encoded document key ‖ blob(binding) ‖
/// varint(`target_size`) ‖ `target_sha256`.
pub fn operation_digest(procedure: Procedure, requests: &[ResolvedRequest], items: &[Item], docs: &[DocKey]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update([procedure as u8]);
    varint(&mut h, requests.len() as u64);
    for q in requests {
        blob(&mut h, &q.head_bytes);
        h.update([q.body.kind()]);
        match &q.body {
            ResolvedBody::Empty => {}
            ResolvedBody::File { item } => varint(&mut h, *item as u64),
            ResolvedBody::Bytes(b) => blob(&mut h, b),
            ResolvedBody::Wrapped { item, bytes, split } => {
                varint(&mut h, *item as u64);
                blob(&mut h, bytes);
                varint(&mut h, *split as u64);
            }
        }
    }
    varint(&mut h, items.len() as u64);
    for (item, doc) in items.iter().zip(docs) {
        h.update(doc.encode());
        blob(&mut h, &item.binding);
        varint(&mut h, item.target_size);
        h.update(item.target_sha256);
    }
    h.finalize().into()
}

/// The digest of a response (§4.6.2): the first 8 bytes of
/// SHA-256(varint(|H|) ‖ H ‖ B), B empty when the body was a payload.
pub fn response_digest(head: &[u8], body: &[u8]) -> [u8; 8] {
    let mut h = Sha256::new();
    blob(&mut h, head);
    h.update(body);
    h.finalize()[..8].try_into().expect("32 bytes")
}
