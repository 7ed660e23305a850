//! Streamed SINGLE uploads (spec §5.6): the request goes out with the whole
//! body's `Content-Length` while the file is still being fed, and its last
//! bytes only with the feed's `Done`; a feed that ends without `Done`
//! aborts the request short of its length, which the server never sees as
//! a request.

use crate::common;

use bytes::Bytes;
use common::{file, hdrs, json, lab_config, resp};
use ec_providers::{Body, Feed, FileFeed, ProcErrorKind, Procedure, Provider, ProviderRequest, Upstream};

fn dropbox_upload(base: &str) -> ProviderRequest {
    ProviderRequest {
        method: http::Method::POST,
        url: format!("{base}/2/files/upload"),
        headers: hdrs(&[("dropbox-api-arg", r#"{"path":"/a.docx"}"#), ("content-type", "application/octet-stream")]),
        body: Body::File(Bytes::new()),
    }
}

/// Feeds `data` in pieces of `piece` bytes, all but the last `hold`, then
/// `Done` (or, with `abort`, drops the sender instead).
fn feed(data: Bytes, piece: usize, hold: usize, abort: bool) -> FileFeed {
    let (tx, rx) = tokio::sync::mpsc::channel(4);
    let len = data.len() as u64;
    tokio::spawn(async move {
        let cut = data.len() - hold;
        let mut at = 0;
        while at < cut {
            let end = (at + piece).min(cut);
            if tx.send(Feed::Data(data.slice(at..end))).await.is_err() {
                return;
            }
            at = end;
            tokio::task::yield_now().await;
        }
        if !abort {
            let _ = tx.send(Feed::Done { tail: data.slice(cut..), file: data.clone() }).await;
        }
    });
    FileFeed { len, rx }
}

#[tokio::test]
async fn a_fed_file_arrives_whole_with_its_length_declared() {
    let data = file(300_000);
    let hash = ec_provider_hashes::dropbox_content_hash(&data);
    let body = format!(r#"{{"content_hash":"{hash}"}}"#);
    let server = common::Server::start(move |_, _, _| json(200, &body)).await;
    let up = Upstream::new(lab_config()).unwrap();
    let done = up
        .perform_streamed(
            Provider::Dropbox,
            Procedure::Single { request: dropbox_upload(&server.base()) },
            feed(data.clone(), 20_000, 65_536, false),
        )
        .await
        .unwrap();
    let got = server.requests();
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].header_str("content-length").unwrap(), "300000");
    assert_eq!(got[0].body, data.to_vec());
    assert_eq!((done.response.status, done.calls, done.succeeded_items.clone()), (200, 1, vec![true]));
    assert!(!done.hash_disagreement, "the provider hash is compared with the fed file");
}

#[tokio::test]
async fn a_fed_file_inside_a_multipart_body() {
    let server = common::Server::start(|_, _, _| resp(200, "OK", &[], b"{}")).await;
    let data = file(100_000);
    let (prefix, suffix) = (Bytes::from_static(b"--b\r\n\r\n"), Bytes::from_static(b"\r\n--b--\r\n"));
    let request = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/upload/drive/v3/files?uploadType=multipart", server.base()),
        headers: hdrs(&[("content-type", "multipart/related; boundary=b")]),
        body: Body::Wrapped { prefix: prefix.clone(), file: Bytes::new(), suffix: suffix.clone() },
    };
    let up = Upstream::new(lab_config()).unwrap();
    up.perform_streamed(Provider::Drive, Procedure::Single { request }, feed(data.clone(), 7_000, 1, false)).await.unwrap();
    assert_eq!(server.requests()[0].body, [&prefix[..], &data[..], &suffix[..]].concat());
}

#[tokio::test]
async fn a_feed_that_ends_without_done_aborts_the_request() {
    let server = common::Server::start(|_, _, _| json(200, "{}")).await;
    let up = Upstream::new(lab_config()).unwrap();
    let err = up
        .perform_streamed(
            Provider::Dropbox,
            Procedure::Single { request: dropbox_upload(&server.base()) },
            feed(file(300_000), 20_000, 65_536, true),
        )
        .await
        .unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Truncated, 1), "{err:?}");
    // The server read the head and most of the body, then the connection closed: no request.
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn data_that_would_end_the_file_without_done_is_refused() {
    let server = common::Server::start(|_, _, _| json(200, "{}")).await;
    let up = Upstream::new(lab_config()).unwrap();
    let data = file(50_000);
    // Every byte as Data, no byte left for Done: the body must not end.
    let err = up
        .perform_streamed(Provider::Dropbox, Procedure::Single { request: dropbox_upload(&server.base()) }, feed(data, 10_000, 0, true))
        .await
        .unwrap_err();
    assert_eq!(err.stage, 1);
    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    assert!(server.requests().is_empty());
}
