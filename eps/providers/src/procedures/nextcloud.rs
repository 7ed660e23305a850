//! Nextcloud chunking v2 (§6.6 NEXTCLOUD_CHUNKED).
//!
//! The app's `MKCOL` of its transfer folder goes out as sent (the transfer
//! name is the app's own, so nothing is rewritten), then numbered chunk
//! `PUT`s (`00001`, `00002`, …) with the `MKCOL`'s fields and
//! `oc-total-length`, then the app's `MOVE …/.file` with `oc-total-length`
//! set. An empty file is sent as one empty chunk. After a failure past
//! `MKCOL`, the transfer folder is deleted (best effort).

use bytes::Bytes;

use super::{chunks, header_str, inherit, mid_upload_failpoint, one_file, Outcome, Run, Step};
use crate::error::ProcError;
use crate::types::{Body, Provider, ProviderRequest};
use crate::upstream::set_field;

pub(super) fn validate(mkcol: &ProviderRequest, mv: &ProviderRequest) -> Result<(), ProcError> {
    if !mkcol.body.is_empty() || !mv.body.is_empty() {
        return Err(ProcError::invalid("NEXTCLOUD_CHUNKED: MKCOL and MOVE carry no body"));
    }
    if mv.url != format!("{}/.file", mkcol.url) {
        return Err(ProcError::invalid("NEXTCLOUD_CHUNKED: the MOVE URL is not the MKCOL URL + /.file"));
    }
    let (a, b) = (header_str(mkcol, "destination")?, header_str(mv, "destination")?);
    if a.is_none() || a != b {
        return Err(ProcError::invalid("NEXTCLOUD_CHUNKED: MKCOL and MOVE need the same destination"));
    }
    Ok(())
}

pub(super) async fn chunked(run: &Run<'_>, mkcol: &ProviderRequest, mv: &ProviderRequest, file: &Bytes) -> Result<Outcome, ProcError> {
    match run.step("MKCOL", mkcol, &[201]).await? {
        Step::Go(_) => {}
        Step::Stop(resp) => return Ok(one_file(Provider::WebDav, &[mkcol, mv], file, resp)),
    }
    let result = upload(run, mkcol, mv, file).await;
    let failed = match &result {
        Ok(outcome) => !(200..300).contains(&outcome.response.status),
        Err(_) => true,
    };
    if failed {
        let delete = ProviderRequest {
            method: http::Method::DELETE,
            url: mkcol.url.clone(),
            headers: inherit(mkcol, &["destination", "oc-total-length"], vec![]),
            body: Body::Empty,
        };
        let _ = tokio::time::timeout(run.up.cfg.connect_timeout * 2, run.send("delete transfer", &delete, false)).await;
    }
    result
}

async fn upload(run: &Run<'_>, mkcol: &ProviderRequest, mv: &ProviderRequest, file: &Bytes) -> Result<Outcome, ProcError> {
    let total = file.len().to_string().into_bytes();
    let base = mkcol.url.trim_end_matches('/');
    for (n, (_, data)) in chunks(file, run.chunk(run.up.cfg.nc_chunk)).into_iter().enumerate() {
        let request = ProviderRequest {
            method: http::Method::PUT,
            url: format!("{base}/{:05}", n + 1),
            headers: inherit(mkcol, &[], vec![("oc-total-length", total.clone())]),
            body: Body::File(data),
        };
        match run.step("upload chunk", &request, &[201, 204]).await? {
            Step::Go(_) => {}
            Step::Stop(resp) => return Ok(one_file(Provider::WebDav, &[mkcol, mv], file, resp)),
        }
        if n == 0 {
            mid_upload_failpoint()?;
        }
    }
    let mut real = mv.clone();
    set_field(&mut real.headers, "oc-total-length", total);
    let resp = match run.step("MOVE", &real, &[201, 204]).await? {
        Step::Go(resp) | Step::Stop(resp) => resp,
    };
    Ok(one_file(Provider::WebDav, &[mkcol, mv], file, resp))
}
