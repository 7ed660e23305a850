//! Failures: provider errors pass through unchanged, transport failures
//! become the right error code and stage, and nothing is sent twice.

use crate::common;

use std::time::{Duration, Instant};

use bytes::Bytes;
use common::{file, hdrs, json, lab_config, resp, Reply, Server};
use ec_providers::{Body, HostPattern, ProcErrorKind, Procedure, Provider, ProviderRequest, Upstream, UpstreamConfig};

fn put(url: String) -> Procedure {
    Procedure::Single {
        request: ProviderRequest {
            method: http::Method::PUT,
            url,
            headers: hdrs(&[("authorization", "Bearer MARKER"), ("content-type", "application/octet-stream")]),
            body: Body::File(file(2000)),
        },
    }
}

async fn perform(cfg: UpstreamConfig, provider: Provider, p: Procedure) -> Result<ec_providers::Performed, ec_providers::ProcError> {
    Upstream::new(cfg).unwrap().perform(provider, p).await
}

#[tokio::test]
async fn provider_errors_pass_through_unchanged() {
    type Case = (u16, &'static str, Vec<(&'static str, &'static str)>, &'static [u8]);
    let cases: Vec<Case> = vec![
        (
            409,
            "Conflict",
            vec![("content-type", "application/json"), ("x-dropbox-request-id", "r1")],
            br#"{"error_summary":"path/conflict/file/.."}"#,
        ),
        (
            429,
            "Too Many Requests",
            vec![("retry-after", "12"), ("content-type", "application/json")],
            br#"{"error_summary":"too_many_requests/"}"#,
        ),
        (503, "Service Unavailable", vec![("retry-after", "3")], b"overloaded"),
    ];
    for (status, reason, headers, body) in cases {
        let h = headers.clone();
        let server = Server::start(move |_, _, _| resp(status, reason, &h, body)).await;
        let done = perform(lab_config(), Provider::WebDav, put(format!("{}/dav/a.docx", server.base()))).await.unwrap();
        assert_eq!((done.response.status, done.response.reason.as_str()), (status, reason));
        assert_eq!(done.response.headers, hdrs(&headers));
        assert_eq!(&done.response.body[..], body);
        assert_eq!((done.calls, done.succeeded_items), (1, vec![false]));
        assert_eq!(server.requests().len(), 1, "no retry of a {status}");
    }
}

#[tokio::test]
async fn connection_refused_is_unreachable_stage_0() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    drop(listener);
    let err = perform(lab_config(), Provider::WebDav, put(format!("http://{addr}/dav/a.docx"))).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Unreachable, 0));
}

#[tokio::test]
async fn unreachable_after_a_first_request_is_stage_1() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = listener.local_addr().unwrap();
    drop(listener);
    let server = Server::start(move |_, _, _| json(200, &format!(r#"{{"uploadUrl":"http://{dead}/up"}}"#))).await;
    let create = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/v1.0/me/drive/items/X:/a.docx:/createUploadSession", server.base()),
        headers: vec![],
        body: Body::Empty,
    };
    let err = perform(lab_config(), Provider::Graph, Procedure::GraphSession { create, file: file(10) }).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Unreachable, 1));
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let server = Server::start(|_, _, _| Reply::Hang).await;
    let started = Instant::now();
    let err = perform(lab_config(), Provider::WebDav, put(format!("{}/dav/a.docx", server.base()))).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Timeout, 1));
    assert!(started.elapsed() < Duration::from_secs(3), "response_timeout is 500 ms");
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn op_timeout_bounds_a_slow_sequence() {
    // Each answer takes 300 ms (under the response timeout); the whole
    // procedure is allowed 700 ms.
    let server = Server::start(|r, _, _| {
        std::thread::sleep(Duration::from_millis(300));
        match r.target.as_str() {
            "/2/files/upload_session/start" => json(200, r#"{"session_id":"s"}"#),
            _ => json(200, "null"),
        }
    })
    .await;
    let cfg = UpstreamConfig { op_timeout: Duration::from_millis(700), ..lab_config() };
    let finish = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/2/files/upload_session/finish", server.base()),
        headers: hdrs(&[("dropbox-api-arg", r#"{"cursor":{"session_id":"d","offset":0},"commit":{"path":"/a"}}"#)]),
        body: Body::Empty,
    };
    let err =
        perform(cfg, Provider::Dropbox, Procedure::DropboxSession { finish, file: file(5000), binding: "d".into() }).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Timeout, 1));
}

#[tokio::test]
async fn a_cut_body_is_truncated() {
    let server = Server::start(|_, _, _| Reply::RawThenClose(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"id\":".to_vec())).await;
    let err = perform(lab_config(), Provider::WebDav, put(format!("{}/dav/a.docx", server.base()))).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Truncated, 1));
    assert_eq!(server.requests().len(), 1, "not resent");
}

#[tokio::test]
async fn a_connection_closed_without_answer_is_truncated_and_not_resent() {
    let server = Server::start(|_, _, _| Reply::Close).await;
    let err = perform(lab_config(), Provider::WebDav, put(format!("{}/dav/a.docx", server.base()))).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Truncated, 1));
    assert_eq!(server.requests().len(), 1);
}

#[tokio::test]
async fn an_oversized_response_body_is_protocol() {
    let server = Server::start(|_, _, _| resp(200, "OK", &[], &vec![b'x'; 5000])).await;
    let cfg = UpstreamConfig { max_response_body: 4096, ..lab_config() };
    let err = perform(cfg, Provider::WebDav, put(format!("{}/dav/a.docx", server.base()))).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Protocol, 1));
}

#[tokio::test]
async fn hosts_off_the_allowlist_are_refused_before_sending() {
    let server = Server::start(|_, _, _| json(200, "{}")).await;
    // The server is fine, but Dropbox may only go to dropbox hosts.
    let cfg = UpstreamConfig { dropbox_hosts: vec![HostPattern::parse("content.dropboxapi.com").unwrap()], ..lab_config() };
    let err = perform(cfg, Provider::Dropbox, put(format!("{}/2/files/upload", server.base()))).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::HostForbidden, 0));
    // Plain http to a host not listed for it.
    let cfg = UpstreamConfig { allow_plain_http_hosts: vec![], ..lab_config() };
    let err = perform(cfg, Provider::WebDav, put(format!("{}/dav/a.docx", server.base()))).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::HostForbidden, 0));
    assert!(server.requests().is_empty());
}

#[tokio::test]
async fn a_foreign_upload_url_is_host_forbidden_stage_1() {
    let server = Server::start(|_, _, _| json(200, r#"{"uploadUrl":"https://evil.example/up?sig=1"}"#)).await;
    let create = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/v1.0/me/drive/root:/a.docx:/createUploadSession", server.base()),
        headers: hdrs(&[("authorization", "Bearer MARKER")]),
        body: Body::Empty,
    };
    let err = perform(lab_config(), Provider::Graph, Procedure::GraphSession { create, file: file(10) }).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::HostForbidden, 1));
    assert_eq!(server.requests().len(), 1, "nothing is sent to the foreign host, and no cleanup either");
    assert!(!err.detail.contains("sig=") && !err.detail.contains("MARKER"));
}

#[tokio::test]
async fn an_unexpected_status_is_protocol_and_cleans_up() {
    // A 200 where a 202 was due, on the first of three fragments.
    let server = Server::start(|r, _, base| match r.method.as_str() {
        "POST" => json(200, &format!(r#"{{"uploadUrl":"{base}/up"}}"#)),
        "PUT" => json(200, "{}"),
        _ => resp(204, "No Content", &[], b""),
    })
    .await;
    let create = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/v1.0/x:/createUploadSession", server.base()),
        headers: vec![],
        body: Body::Empty,
    };
    let err = perform(lab_config(), Provider::Graph, Procedure::GraphSession { create, file: file(700_000) }).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Protocol, 1));
    let methods: Vec<String> = server.requests().iter().map(|r| r.method.clone()).collect();
    assert_eq!(methods, ["POST", "PUT", "DELETE"]);
}

#[tokio::test]
async fn shape_errors_are_invalid_stage_0() {
    let server = Server::start(|_, _, _| json(200, "{}")).await;
    let base = server.base();
    let finish = |arg: &str| ProviderRequest {
        method: http::Method::POST,
        url: format!("{base}/2/files/upload_session/finish"),
        headers: hdrs(&[("dropbox-api-arg", arg)]),
        body: Body::Empty,
    };
    let cases = vec![
        // binding differs from cursor.session_id
        (
            Provider::Dropbox,
            Procedure::DropboxSession { finish: finish(r#"{"cursor":{"session_id":"a","offset":0}}"#), file: file(3), binding: "b".into() },
        ),
        // duplicate cursor key: which one would Dropbox read?
        (
            Provider::Dropbox,
            Procedure::DropboxSession {
                finish: finish(r#"{"cursor":{"session_id":"a","session_id":"a","offset":0}}"#),
                file: file(3),
                binding: "a".into(),
            },
        ),
        // batch entry without an item
        (
            Provider::Dropbox,
            Procedure::DropboxBatch {
                batch: ProviderRequest {
                    method: http::Method::POST,
                    url: format!("{base}/2/files/upload_session/finish_batch_v2"),
                    headers: vec![],
                    body: Body::Bytes(Bytes::from_static(br#"{"entries":[{"cursor":{"session_id":"x","offset":0}}]}"#)),
                },
                items: vec![("y".into(), file(3))],
            },
        ),
        // a field the EPS derives
        (
            Provider::WebDav,
            Procedure::Single {
                request: ProviderRequest {
                    method: http::Method::PUT,
                    url: format!("{base}/a"),
                    headers: hdrs(&[("content-length", "3")]),
                    body: Body::File(file(3)),
                },
            },
        ),
        // empty file in a Graph session
        (
            Provider::Graph,
            Procedure::GraphSession {
                create: ProviderRequest { method: http::Method::POST, url: format!("{base}/c"), headers: vec![], body: Body::Empty },
                file: Bytes::new(),
            },
        ),
    ];
    for (provider, p) in cases {
        let err = perform(lab_config(), provider, p).await.unwrap_err();
        assert_eq!((err.kind, err.stage), (ProcErrorKind::Invalid, 0), "{err}");
    }
    assert!(server.requests().is_empty());
}
