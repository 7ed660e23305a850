//! Downloads (§6.8): identity encoding, one redirect hop without
//! credentials, body checks against the provider's hash.

use crate::common;

use common::{file, hdrs, lab_config, resp, Reply, Server};
use ec_providers::{Body, ProcErrorKind, Provider, ProviderRequest, Upstream};

fn get(url: String, headers: &[(&str, &str)]) -> ProviderRequest {
    ProviderRequest { method: http::Method::GET, url, headers: hdrs(headers), body: Body::Empty }
}

#[tokio::test]
async fn dropbox_download_is_checked_against_content_hash() {
    let data = file(9000);
    let good = ec_provider_hashes::dropbox_content_hash(&data);
    for (stated, disagrees) in [(good.clone(), false), ("00".repeat(32), true)] {
        let d = data.clone();
        let result = format!(r#"{{"name":"a.docx","content_hash":"{stated}"}}"#);
        let server = Server::start(move |_, _, _| resp(200, "OK", &[("dropbox-api-result", &result)], &d)).await;
        let request = ProviderRequest {
            method: http::Method::POST,
            url: format!("{}/2/files/download", server.base()),
            headers: hdrs(&[("authorization", "Bearer MARKER"), ("dropbox-api-arg", r#"{"path":"/a.docx"}"#)]),
            body: Body::Empty,
        };
        let got = Upstream::new(lab_config()).unwrap().fetch(Provider::Dropbox, request, false).await.unwrap();
        assert_eq!(&got.response.body[..], &data[..]);
        assert_eq!((got.hash_disagreement, got.body_checked), (disagrees, !disagrees));
        let sent = &server.requests()[0];
        assert_eq!(
            sent.app_headers(),
            hdrs(&[("authorization", "Bearer MARKER"), ("dropbox-api-arg", r#"{"path":"/a.docx"}"#), ("accept-encoding", "identity")])
        );
    }
}

#[tokio::test]
async fn graph_redirect_is_followed_once_without_credentials() {
    let data = file(4000);
    let d = data.clone();
    let server = Server::start(move |r, _, base| match r.target.as_str() {
        "/v1.0/me/drive/items/X/content" => resp(302, "Found", &[("location", &format!("{base}/dl/abc?tempauth=SECRET"))], b""),
        _ => resp(200, "OK", &[("content-type", "application/octet-stream")], &d),
    })
    .await;
    let request = get(
        format!("{}/v1.0/me/drive/items/X/content", server.base()),
        &[("authorization", "Bearer MARKER"), ("cookie", "c=1"), ("user-agent", "OneDrive"), ("accept-encoding", "gzip")],
    );
    let got = Upstream::new(lab_config()).unwrap().fetch(Provider::Graph, request, true).await.unwrap();
    assert_eq!(got.redirect.as_ref().unwrap().status, 302);
    assert_eq!((got.response.status, &got.response.body[..]), (200, &data[..]));
    assert!(got.body_checked && !got.hash_disagreement);
    let sent = server.requests();
    assert_eq!(sent.len(), 2);
    assert_eq!(
        sent[0].app_headers(),
        hdrs(&[("authorization", "Bearer MARKER"), ("cookie", "c=1"), ("user-agent", "OneDrive"), ("accept-encoding", "identity")])
    );
    assert_eq!((sent[1].method.as_str(), sent[1].target.as_str()), ("GET", "/dl/abc?tempauth=SECRET"));
    assert_eq!(sent[1].app_headers(), hdrs(&[("user-agent", "OneDrive"), ("accept-encoding", "identity")]));
}

#[tokio::test]
async fn redirects_are_not_followed_unless_asked_and_never_off_the_allowlist() {
    let server = Server::start(|_, _, _| resp(302, "Found", &[("location", "https://evil.example/dl")], b"")).await;
    let up = Upstream::new(lab_config()).unwrap();
    let got = up.fetch(Provider::Graph, get(format!("{}/x/content", server.base()), &[]), false).await.unwrap();
    assert_eq!((got.response.status, got.redirect.is_none(), got.body_checked), (302, true, false));
    let err = up.fetch(Provider::Graph, get(format!("{}/x/content", server.base()), &[]), true).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::HostForbidden, 1));
    assert_eq!(server.requests().len(), 2);
}

#[tokio::test]
async fn encoded_or_cut_bodies_are_not_checked() {
    let server = Server::start(|_, _, _| resp(200, "OK", &[("content-encoding", "gzip")], b"\x1f\x8b...")).await;
    let up = Upstream::new(lab_config()).unwrap();
    let got = up.fetch(Provider::Drive, get(format!("{}/drive/v3/files/1?alt=media", server.base()), &[]), false).await.unwrap();
    assert!(!got.body_checked);

    let server = Server::start(|_, _, _| Reply::RawThenClose(b"HTTP/1.1 200 OK\r\ncontent-length: 5000\r\n\r\nPK\x03\x04".to_vec())).await;
    let err = up.fetch(Provider::Drive, get(format!("{}/drive/v3/files/1?alt=media", server.base()), &[]), false).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Truncated, 1));
}

#[tokio::test]
async fn webdav_download_oc_checksum() {
    // ADLER32 of "abc" is 024d0127.
    for (value, disagrees) in [("ADLER32:024d0127", false), ("ADLER32:00000001", true), ("SHA256:whatever", false)] {
        let server = Server::start(move |_, _, _| resp(200, "OK", &[("oc-checksum", value)], b"abc")).await;
        let got = Upstream::new(lab_config())
            .unwrap()
            .fetch(Provider::WebDav, get(format!("{}/dav/a.txt", server.base()), &[]), false)
            .await
            .unwrap();
        assert_eq!(got.hash_disagreement, disagrees, "{value}");
    }
}
