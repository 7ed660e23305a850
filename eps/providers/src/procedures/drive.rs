//! Google Drive resumable uploads (§6.5 DRIVE_RESUMABLE).
//!
//! The app's initiation (`uploadType=resumable`, create or update) goes out
//! as sent; the file then goes to the session URI in `location` in chunks
//! of `drive_chunk` bytes (a multiple of 256 KiB), each with
//! `content-range`, `content-type` from the initiation's
//! `x-upload-content-type`, and the initiation's other fields except
//! `content-type` and `x-upload-content-*`. A session URI on a host other
//! than the initiation's gets no `authorization` or `cookie` (§8).

use bytes::Bytes;

use super::{chunks, header_str, inherit, mid_upload_failpoint, one_file, origin, Outcome, Run, Step};
use crate::error::ProcError;
use crate::types::{Body, Provider, ProviderRequest};

pub(super) fn validate(initiate: &ProviderRequest, file: &Bytes) -> Result<(), ProcError> {
    if !matches!(initiate.body, Body::Empty | Body::Bytes(_)) {
        return Err(ProcError::invalid("DRIVE_RESUMABLE: the initiation carries no file"));
    }
    if let Some(len) = header_str(initiate, "x-upload-content-length")? {
        if len.trim().parse::<u64>().ok() != Some(file.len() as u64) {
            return Err(ProcError::invalid("DRIVE_RESUMABLE: x-upload-content-length differs from the file size"));
        }
    }
    Ok(())
}

pub(super) async fn resumable(run: &Run<'_>, initiate: &ProviderRequest, file: &Bytes) -> Result<Outcome, ProcError> {
    let started = match run.step("initiate", initiate, &[200]).await? {
        Step::Go(resp) => resp,
        Step::Stop(resp) => return Ok(one_file(Provider::Drive, &[initiate], file, resp)),
    };
    let location = started
        .header("location")
        .and_then(|v| std::str::from_utf8(v).ok())
        .map(|v| v.trim().to_owned())
        .ok_or_else(|| ProcError::protocol("initiate: no location in the response"))?;
    run.check_given_url(&location)?;

    let same_host = origin(&location)?.1.eq_ignore_ascii_case(&origin(&initiate.url)?.1);
    let mut dropped: Vec<&str> = vec!["content-type"];
    dropped.extend(initiate.headers.iter().map(|(n, _)| n.as_str()).filter(|n| n.starts_with("x-upload-content-")));
    if !same_host {
        dropped.extend(["authorization", "cookie"]);
    }
    let content_type = initiate.header("x-upload-content-type").map(<[u8]>::to_vec);

    let pieces = chunks(file, run.chunk(run.up.cfg.drive_chunk));
    let last = pieces.len() - 1;
    let size = file.len();
    for (i, (offset, data)) in pieces.into_iter().enumerate() {
        let range = if size == 0 { "bytes */0".to_owned() } else { format!("bytes {offset}-{}/{size}", offset + data.len() as u64 - 1) };
        let mut set = vec![("content-range", range.into_bytes())];
        if let Some(ct) = &content_type {
            set.insert(0, ("content-type", ct.clone()));
        }
        let request = ProviderRequest {
            method: http::Method::PUT,
            url: location.clone(),
            headers: inherit(initiate, &dropped, set),
            body: Body::File(data),
        };
        let expected: &[u16] = if i == last { &[200, 201] } else { &[308] };
        match run.step("upload chunk", &request, expected).await? {
            Step::Go(resp) if i == last => return Ok(one_file(Provider::Drive, &[initiate], file, resp)),
            Step::Go(_) => {}
            Step::Stop(resp) => return Ok(one_file(Provider::Drive, &[initiate], file, resp)),
        }
        if i == 0 {
            mid_upload_failpoint()?;
        }
    }
    unreachable!("the last chunk returns")
}
