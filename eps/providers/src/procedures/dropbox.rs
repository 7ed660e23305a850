//! Dropbox upload sessions (§6.2 DROPBOX_SESSION, §6.3 DROPBOX_BATCH).
//!
//! The device answered the app's `start` and `append_v2` itself with a
//! session id of its own (the item's *binding*). Here the EPS runs the real
//! `start` / `append_v2` sequence with the file, then sends the app's
//! `finish` (or `finish_batch_v2`) with `cursor.session_id` and
//! `cursor.offset` rewritten byte-exactly and every other byte kept.
//!
//! Quirk: session requests go to the content host. It is derived from the
//! named request's URL: a host starting with `api.` gets `content.` instead
//! (`finish_batch_v2` lives on `api.dropboxapi.com`), any other host is
//! kept (the app's `finish` is already on `content.dropboxapi.com`; lab
//! servers serve both).

use std::ops::Range;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use serde_json::Value;

use super::{chunks, header_str, inherit, mid_upload_failpoint, one_file, origin, Outcome, Run, Step};
use crate::error::ProcError;
use crate::json_splice::{elements, member, remove_member, shift, splice};
use crate::types::{Body, ProviderRequest, ProviderResponse};
use crate::upstream::set_field;
use crate::{hashes, types::Provider};

/// Where `cursor.session_id` and `cursor.offset` sit in a JSON object
/// (spans relative to the whole text), and the session id it names.
struct Cursor {
    session_id: String,
    session_id_span: Range<usize>,
    offset_span: Range<usize>,
}

/// Finds the cursor of the JSON object at `json[span]`.
fn cursor(json: &str, span: Range<usize>) -> Result<Cursor, ProcError> {
    let bad = |what: &str| ProcError::invalid(format!("Dropbox arguments: {what}"));
    let object = &json[span.clone()];
    let c = member(object, "cursor").map_err(|e| bad(&e))?.ok_or_else(|| bad("no cursor"))?;
    let c = shift(c, span.start);
    let inner = &json[c.clone()];
    let sid = member(inner, "session_id").map_err(|e| bad(&e))?.ok_or_else(|| bad("no cursor.session_id"))?;
    let off = member(inner, "offset").map_err(|e| bad(&e))?.ok_or_else(|| bad("no cursor.offset"))?;
    let sid = shift(sid, c.start);
    let session_id: String = serde_json::from_str(&json[sid.clone()]).map_err(|_| bad("cursor.session_id is not a string"))?;
    Ok(Cursor { session_id, session_id_span: sid, offset_span: shift(off, c.start) })
}

fn rewrite(json: &str, cursors: &[(&Cursor, &str, u64)]) -> String {
    let mut edits = Vec::new();
    for (c, real_id, size) in cursors {
        edits.push((c.session_id_span.clone(), serde_json::to_string(real_id).expect("string")));
        edits.push((c.offset_span.clone(), size.to_string()));
    }
    splice(json, edits)
}

fn finish_arg(finish: &ProviderRequest) -> Result<&str, ProcError> {
    header_str(finish, "dropbox-api-arg")?.ok_or_else(|| ProcError::invalid("finish has no dropbox-api-arg"))
}

pub(super) fn validate_session(finish: &ProviderRequest, binding: &str) -> Result<(), ProcError> {
    if !finish.body.is_empty() {
        return Err(ProcError::invalid("DROPBOX_SESSION: finish carries a body"));
    }
    let arg = finish_arg(finish)?;
    if cursor(arg, 0..arg.len())?.session_id != binding {
        return Err(ProcError::invalid("DROPBOX_SESSION: binding differs from cursor.session_id"));
    }
    // step 3 drops `content_hash`: refuse now what it could not drop later
    remove_member(arg, "content_hash").map_err(|e| ProcError::invalid(format!("Dropbox arguments: {e}")))?;
    Ok(())
}

fn batch_json(batch: &ProviderRequest) -> Result<&str, ProcError> {
    match &batch.body {
        Body::Bytes(b) => std::str::from_utf8(b).map_err(|_| ProcError::invalid("finish_batch body is not UTF-8")),
        _ => Err(ProcError::invalid("DROPBOX_BATCH: finish_batch needs a BYTES body")),
    }
}

/// Each entry's cursor and the index of its item.
fn batch_entries(json: &str, items: &[(String, Bytes)]) -> Result<Vec<(Cursor, usize)>, ProcError> {
    let bad = |what: String| ProcError::invalid(format!("DROPBOX_BATCH: {what}"));
    let entries = member(json, "entries").map_err(bad)?.ok_or_else(|| bad("no entries".into()))?;
    let spans = elements(&json[entries.clone()]).map_err(bad)?;
    let mut used = vec![false; items.len()];
    let mut out = Vec::with_capacity(spans.len());
    for span in spans {
        let c = cursor(json, shift(span, entries.start))?;
        let mut matching = items.iter().enumerate().filter(|(_, (b, _))| *b == c.session_id);
        let (index, _) = matching.next().ok_or_else(|| bad("an entry matches no item".into()))?;
        if matching.next().is_some() || used[index] {
            return Err(bad("an entry matches more than one item, or an item more than one entry".into()));
        }
        used[index] = true;
        out.push((c, index));
    }
    if used.contains(&false) {
        return Err(bad("an item matches no entry".into()));
    }
    Ok(out)
}

pub(super) fn validate_batch(batch: &ProviderRequest, items: &[(String, Bytes)]) -> Result<Vec<usize>, ProcError> {
    Ok(batch_entries(batch_json(batch)?, items)?.into_iter().map(|(_, i)| i).collect())
}

/// `[start, append_v2]` URLs on the content host of `named`'s URL.
pub(super) fn session_urls(named: &ProviderRequest) -> Result<[String; 2], ProcError> {
    let (scheme, authority) = origin(&named.url)?;
    let authority = match authority.get(..4) {
        Some(p) if p.eq_ignore_ascii_case("api.") => format!("content.{}", &authority[4..]),
        _ => authority,
    };
    Ok([format!("{scheme}://{authority}/2/files/upload_session/start"), format!("{scheme}://{authority}/2/files/upload_session/append_v2")])
}

/// §6.2 steps 1–2 for one file: the real session id, or the response that stopped it.
async fn upload(
    run: &Run<'_>,
    named: &ProviderRequest,
    file: &Bytes,
    mid_fired: &AtomicBool,
) -> Result<Result<String, ProviderResponse>, ProcError> {
    let [start_url, append_url] = session_urls(named)?;
    let pieces = chunks(file, run.chunk(run.up.cfg.dropbox_chunk));
    let last = pieces.len() - 1;
    let mut session_id = String::new();
    for (i, (offset, data)) in pieces.into_iter().enumerate() {
        let close = i == last;
        let (url, arg, step) = if i == 0 {
            (&start_url, format!("{{\"close\":{close}}}"), "upload_session/start")
        } else {
            let sid = serde_json::to_string(&session_id).expect("string");
            (
                &append_url,
                format!("{{\"cursor\":{{\"session_id\":{sid},\"offset\":{offset}}},\"close\":{close}}}"),
                "upload_session/append_v2",
            )
        };
        let headers =
            inherit(named, &[], vec![("dropbox-api-arg", arg.into_bytes()), ("content-type", b"application/octet-stream".to_vec())]);
        let request = ProviderRequest { method: http::Method::POST, url: url.clone(), headers, body: Body::File(data) };
        let resp = match run.step(step, &request, &[200]).await? {
            Step::Go(resp) => resp,
            Step::Stop(resp) => return Ok(Err(resp)),
        };
        if i == 0 {
            session_id = serde_json::from_slice::<Value>(&resp.body)
                .ok()
                .and_then(|v| v.get("session_id")?.as_str().map(str::to_owned))
                .ok_or_else(|| ProcError::protocol("upload_session/start: no session_id in the response"))?;
        }
        if !mid_fired.swap(true, Ordering::SeqCst) {
            mid_upload_failpoint()?;
        }
    }
    Ok(Ok(session_id))
}

pub(super) async fn session(run: &Run<'_>, finish: &ProviderRequest, file: &Bytes) -> Result<Outcome, ProcError> {
    let session_id = match upload(run, finish, file, &AtomicBool::new(false)).await? {
        Ok(id) => id,
        Err(stop) => return Ok(Outcome { response: stop, succeeded_items: vec![false], hash_disagreement: false }),
    };
    let arg = finish_arg(finish)?;
    let c = cursor(arg, 0..arg.len())?;
    let new_arg = rewrite(arg, &[(&c, &session_id, file.len() as u64)]);
    // The app's `content_hash` is "a hash of the file content uploaded in
    // this call": the bytes its finish carried, which the EPS sends in its
    // own start / append_v2 instead. With the finish's new (empty) body it
    // would be a mismatch, so it is dropped (the field is optional); the
    // SHA-256 check of §5.3 already covered those bytes.
    let new_arg = remove_member(&new_arg, "content_hash").map_err(|e| ProcError::invalid(format!("Dropbox arguments: {e}")))?;
    let mut real = finish.clone();
    set_field(&mut real.headers, "dropbox-api-arg", new_arg.into_bytes());
    let response = run.send("upload_session/finish", &real, false).await?;
    // Only the provider's FileMetadata states a hash of the whole file.
    Ok(one_file(Provider::Dropbox, &[], file, response))
}

pub(super) async fn batch(run: &Run<'_>, batch: &ProviderRequest, items: &[(String, Bytes)]) -> Result<Outcome, ProcError> {
    let json = batch_json(batch)?;
    let entries = batch_entries(json, items)?;
    let mid_fired = AtomicBool::new(false);
    let mut ids = vec![String::new(); items.len()];
    // The futures are made eagerly: a lazily mapped stream keeps a closure
    // over borrowed items, whose higher-ranked type makes rustc unable to
    // prove the caller's future `Send` (the EPS serves it from hyper).
    let mid_fired = &mid_fired;
    let futures: Vec<_> =
        items.iter().enumerate().map(|(i, (_, file))| async move { (i, upload(run, batch, file, mid_fired).await) }).collect();
    let mut uploads = stream::iter(futures).buffer_unordered(run.up.cfg.batch_parallelism);
    while let Some((i, result)) = uploads.next().await {
        match result? {
            Ok(id) => ids[i] = id,
            Err(stop) => {
                // The sequence stops: the sessions still running are dropped.
                return Ok(Outcome { response: stop, succeeded_items: vec![false; items.len()], hash_disagreement: false });
            }
        }
    }
    drop(uploads);
    let rewrites: Vec<(&Cursor, &str, u64)> = entries.iter().map(|(c, i)| (c, ids[*i].as_str(), items[*i].1.len() as u64)).collect();
    let body = rewrite(json, &rewrites);
    let real = ProviderRequest { body: Body::Bytes(body.into_bytes().into()), ..batch.clone() };
    let response = run.send("upload_session/finish_batch_v2", &real, false).await?;

    let mut succeeded = vec![false; items.len()];
    if (200..300).contains(&response.status) {
        let results = serde_json::from_slice::<Value>(&response.body).ok();
        if let Some(results) = results.as_ref().and_then(|v| v.get("entries")?.as_array()) {
            if results.len() == entries.len() {
                for (result, (_, item)) in results.iter().zip(&entries) {
                    succeeded[*item] = result.get(".tag").and_then(Value::as_str) == Some("success");
                }
            } else {
                tracing::warn!(sent = entries.len(), got = results.len(), "finish_batch_v2: entry count differs");
            }
        }
    }
    let files: Vec<&[u8]> = entries.iter().map(|(_, i)| items[*i].1.as_ref()).collect();
    let hash_disagreement = hashes::batch_disagrees(json.as_bytes(), &files, &response);
    Ok(Outcome { response, succeeded_items: succeeded, hash_disagreement })
}
