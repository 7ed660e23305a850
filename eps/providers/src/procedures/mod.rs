//! The procedures of §6, one module per provider; this module holds what
//! they share: running one step, judging its status, inheriting fields.
//!
//! Every step names the statuses it expects. A status of 400 or more
//! stops the sequence and becomes the answer ([`Step::Stop`]); any other
//! unexpected status is `provider_protocol` (stage 1). Provider-given
//! URLs are checked against the allowlist when they arrive.

mod drive;
mod dropbox;
mod graph;
mod nextcloud;

use bytes::Bytes;

use crate::error::ProcError;
use crate::hashes;
use crate::transport::{BodyLimit, Ledger, Outgoing, StreamedFile};
use crate::types::{Body, Procedure, Provider, ProviderRequest, ProviderResponse};
use crate::upstream::Upstream;

/// One procedure run: where to send and what to count.
pub(crate) struct Run<'a> {
    pub(crate) up: &'a Upstream,
    pub(crate) provider: Provider,
    pub(crate) procedure: &'static str,
    pub(crate) ledger: &'a Ledger,
}

/// A procedure's result before accounting is added.
pub(crate) struct Outcome {
    pub(crate) response: ProviderResponse,
    pub(crate) succeeded_items: Vec<bool>,
    pub(crate) hash_disagreement: bool,
}

/// A step's response, judged.
pub(crate) enum Step {
    /// An expected status: go on.
    Go(ProviderResponse),
    /// 400 or more: the sequence stops and this is the answer.
    Stop(ProviderResponse),
}

impl Run<'_> {
    pub(crate) async fn send(
        &self,
        step: &'static str,
        request: &ProviderRequest,
        mid_failpoint: bool,
    ) -> Result<ProviderResponse, ProcError> {
        self.send_fed(step, request, mid_failpoint, None).await
    }

    /// Sends the one request of a streamed SINGLE (§5.6).
    pub(crate) async fn send_streamed(
        &self,
        step: &'static str,
        request: &ProviderRequest,
        feed: StreamedFile,
    ) -> Result<ProviderResponse, ProcError> {
        self.send_fed(step, request, true, Some(feed)).await
    }

    async fn send_fed(
        &self,
        step: &'static str,
        request: &ProviderRequest,
        mid_failpoint: bool,
        feed: Option<StreamedFile>,
    ) -> Result<ProviderResponse, ProcError> {
        let limit = BodyLimit { ok_200: self.up.cfg.max_response_body, other: self.up.cfg.max_response_body };
        let s = Outgoing { provider: self.provider, procedure: self.procedure, step, request, mid_failpoint };
        self.up.transport.send_with(self.ledger, s, limit, feed).await
    }

    /// Sends and judges against `expected`.
    pub(crate) async fn step(&self, step: &'static str, request: &ProviderRequest, expected: &[u16]) -> Result<Step, ProcError> {
        let resp = self.send(step, request, false).await?;
        judge(step, resp, expected)
    }

    /// Checks a provider-given URL (stage 1: something was sent already).
    pub(crate) fn check_given_url(&self, url: &str) -> Result<(), ProcError> {
        self.up.check_url(self.provider, url, 1).map(|_| ())
    }

    /// The configured chunk size of this procedure's provider, as usize.
    pub(crate) fn chunk(&self, size: u64) -> usize {
        usize::try_from(size).unwrap_or(usize::MAX)
    }
}

pub(crate) fn judge(step: &'static str, resp: ProviderResponse, expected: &[u16]) -> Result<Step, ProcError> {
    if expected.contains(&resp.status) {
        Ok(Step::Go(resp))
    } else if resp.status >= 400 {
        Ok(Step::Stop(resp))
    } else {
        Err(ProcError::protocol(format!("{step}: status {} where {expected:?} was due", resp.status)))
    }
}

/// Evaluated once per procedure, after the first chunk or fragment's response.
pub(crate) fn mid_upload_failpoint() -> Result<(), ProcError> {
    fail::fail_point!("providers::mid_upload", |_| {
        Err(ProcError::new(crate::error::ProcErrorKind::Truncated, 1, "fail point providers::mid_upload"))
    });
    Ok(())
}

/// The named request's fields minus `drop` and minus the fields being
/// set, then the set fields: "inherit except what the procedure sets" (§6.0).
pub(crate) fn inherit(named: &ProviderRequest, drop: &[&str], set: Vec<(&str, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    let mut out: Vec<(String, Vec<u8>)> =
        named.headers.iter().filter(|(n, _)| !drop.contains(&n.as_str()) && !set.iter().any(|(s, _)| s == n)).cloned().collect();
    out.extend(set.into_iter().map(|(n, v)| (n.to_owned(), v)));
    out
}

/// Splits `file` into chunks of `size` bytes; an empty file is one empty chunk.
pub(crate) fn chunks(file: &Bytes, size: usize) -> Vec<(u64, Bytes)> {
    if file.is_empty() {
        return vec![(0, Bytes::new())];
    }
    (0..file.len()).step_by(size).map(|a| (a as u64, file.slice(a..(a + size).min(file.len())))).collect()
}

/// `scheme://authority` of `url` (validated before use).
pub(crate) fn origin(url: &str) -> Result<(String, String), ProcError> {
    let uri: http::Uri = url.parse().map_err(|_| ProcError::invalid("URL does not parse"))?;
    match (uri.scheme_str(), uri.authority()) {
        (Some(s), Some(a)) => Ok((s.to_owned(), a.as_str().to_owned())),
        _ => Err(ProcError::invalid("URL is not absolute")),
    }
}

pub(crate) fn header_str<'r>(r: &'r ProviderRequest, name: &str) -> Result<Option<&'r str>, ProcError> {
    r.header(name).map(|v| std::str::from_utf8(v).map_err(|_| ProcError::invalid(format!("{name} is not UTF-8")))).transpose()
}

/// The shape rules of §6 (`invalid_request`, stage 0).
pub(crate) fn validate(procedure: &Procedure) -> Result<(), ProcError> {
    for r in procedure.app_requests() {
        origin(&r.url)?;
    }
    match procedure {
        Procedure::Single { request } => match request.body {
            Body::File(_) | Body::Wrapped { .. } => Ok(()),
            _ => Err(ProcError::invalid("SINGLE needs a FILE or WRAPPED body")),
        },
        Procedure::DropboxSession { finish, binding, .. } => dropbox::validate_session(finish, binding),
        Procedure::DropboxBatch { batch, items } => dropbox::validate_batch(batch, items).map(|_| ()),
        Procedure::GraphSession { create, file } => graph::validate(create, file),
        Procedure::DriveResumable { initiate, file } => drive::validate(initiate, file),
        Procedure::NextcloudChunked { mkcol, mv, .. } => nextcloud::validate(mkcol, mv),
    }
}

/// URLs the procedure will address that are derived, not given: checked
/// against the allowlist before anything is sent.
pub(crate) fn derived_urls(procedure: &Procedure) -> Result<Vec<String>, ProcError> {
    Ok(match procedure {
        Procedure::DropboxSession { finish: named, .. } | Procedure::DropboxBatch { batch: named, .. } => {
            dropbox::session_urls(named)?.to_vec()
        }
        _ => vec![],
    })
}

pub(crate) async fn perform(run: &Run<'_>, procedure: &Procedure) -> Result<Outcome, ProcError> {
    match procedure {
        Procedure::Single { request } => {
            let response = run.send("single", request, true).await?;
            let file = request.body.file().cloned().unwrap_or_default();
            Ok(one_file(run.provider, &[request], &file, response))
        }
        Procedure::DropboxSession { finish, file, .. } => dropbox::session(run, finish, file).await,
        Procedure::DropboxBatch { batch, items } => dropbox::batch(run, batch, items).await,
        Procedure::GraphSession { create, file } => graph::session(run, create, file).await,
        Procedure::DriveResumable { initiate, file } => drive::resumable(run, initiate, file).await,
        Procedure::NextcloudChunked { mkcol, mv, file } => nextcloud::chunked(run, mkcol, mv, file).await,
    }
}

/// The outcome of a streamed SINGLE whose provider answered before the file
/// was complete: nothing to compare hashes with; success follows the status.
pub(crate) fn one_file_unseen(response: ProviderResponse) -> Outcome {
    let ok = (200..300).contains(&response.status);
    Outcome { response, succeeded_items: vec![ok], hash_disagreement: false }
}

/// The outcome of a one-file procedure: success follows the status.
pub(crate) fn one_file(provider: Provider, app: &[&ProviderRequest], file: &Bytes, response: ProviderResponse) -> Outcome {
    let hash_disagreement = hashes::upload_disagrees(provider, app, file, &response);
    let ok = (200..300).contains(&response.status);
    Outcome { response, succeeded_items: vec![ok], hash_disagreement }
}
