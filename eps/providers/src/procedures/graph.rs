//! Microsoft Graph upload sessions (§6.4 GRAPH_SESSION).
//!
//! The app's `createUploadSession` goes out as sent; the file then goes to
//! the returned `uploadUrl` in fragments of `graph_fragment` bytes (a
//! multiple of 320 KiB). Quirk: the `uploadUrl` is pre-authenticated and
//! Graph refuses a token there, so fragments carry no `authorization`:
//! only `content-range` and the app's `user-agent`. After a failure past
//! creation, the session is deleted (best effort, same rule).

use bytes::Bytes;
use serde_json::Value;

use super::{chunks, mid_upload_failpoint, one_file, Outcome, Run, Step};
use crate::error::ProcError;
use crate::types::{Body, Provider, ProviderRequest};

pub(super) fn validate(create: &ProviderRequest, file: &Bytes) -> Result<(), ProcError> {
    if file.is_empty() {
        return Err(ProcError::invalid("GRAPH_SESSION: a Graph upload session cannot carry an empty file"));
    }
    match create.body {
        Body::Empty | Body::Bytes(_) => Ok(()),
        _ => Err(ProcError::invalid("GRAPH_SESSION: createUploadSession carries no file")),
    }
}

fn fragment_headers(create: &ProviderRequest, range: Option<String>) -> Vec<(String, Vec<u8>)> {
    let mut h: Vec<(String, Vec<u8>)> = create.headers.iter().filter(|(n, _)| n == "user-agent").cloned().collect();
    if let Some(range) = range {
        h.push(("content-range".into(), range.into_bytes()));
    }
    h
}

pub(super) async fn session(run: &Run<'_>, create: &ProviderRequest, file: &Bytes) -> Result<Outcome, ProcError> {
    let created = match run.step("createUploadSession", create, &[200]).await? {
        Step::Go(resp) => resp,
        Step::Stop(resp) => return Ok(one_file(Provider::Graph, &[create], file, resp)),
    };
    let upload_url = serde_json::from_slice::<Value>(&created.body)
        .ok()
        .and_then(|v| v.get("uploadUrl")?.as_str().map(str::to_owned))
        .ok_or_else(|| ProcError::protocol("createUploadSession: no uploadUrl in the response"))?;
    run.check_given_url(&upload_url)?;

    let result = fragments(run, create, file, &upload_url).await;
    let failed = match &result {
        Ok(outcome) => !(200..300).contains(&outcome.response.status),
        Err(_) => true,
    };
    if failed {
        let delete = ProviderRequest {
            method: http::Method::DELETE,
            url: upload_url.clone(),
            headers: fragment_headers(create, None),
            body: Body::Empty,
        };
        // Best effort: its outcome changes nothing that is returned.
        let _ = tokio::time::timeout(run.up.cfg.connect_timeout * 2, run.send("delete uploadUrl", &delete, false)).await;
    }
    result
}

async fn fragments(run: &Run<'_>, create: &ProviderRequest, file: &Bytes, upload_url: &str) -> Result<Outcome, ProcError> {
    let pieces = chunks(file, run.chunk(run.up.cfg.graph_fragment));
    let last = pieces.len() - 1;
    let size = file.len();
    for (i, (offset, data)) in pieces.into_iter().enumerate() {
        let end = offset + data.len() as u64 - 1;
        let request = ProviderRequest {
            method: http::Method::PUT,
            url: upload_url.to_owned(),
            headers: fragment_headers(create, Some(format!("bytes {offset}-{end}/{size}"))),
            body: Body::File(data),
        };
        let expected: &[u16] = if i == last { &[200, 201] } else { &[202] };
        match run.step("upload fragment", &request, expected).await? {
            Step::Go(resp) if i == last => return Ok(one_file(Provider::Graph, &[create], file, resp)),
            Step::Go(_) => {}
            Step::Stop(resp) => return Ok(one_file(Provider::Graph, &[create], file, resp)),
        }
        if i == 0 {
            mid_upload_failpoint()?;
        }
    }
    unreachable!("the last fragment returns")
}
