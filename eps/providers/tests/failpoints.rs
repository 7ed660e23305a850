//! The fail points the EPS's crash tests use, exercised with `return`
//! (run with `--features failpoints`). The fail registry is global, so
//! the scenarios run one after another in a single test.
#![cfg(feature = "failpoints")]

mod common;

use common::{file, hdrs, json, lab_config, Server};
use ec_providers::{Body, ProcErrorKind, Procedure, Provider, ProviderRequest, Upstream};

fn single(base: &str) -> Procedure {
    Procedure::Single {
        request: ProviderRequest {
            method: http::Method::PUT,
            url: format!("{base}/dav/a"),
            headers: hdrs(&[]),
            body: Body::File(file(2_000_000)),
        },
    }
}

fn nextcloud(base: &str) -> Procedure {
    let url = format!("{base}/remote.php/dav/uploads/u/t");
    let dest = hdrs(&[("destination", "x")]);
    Procedure::NextcloudChunked {
        mkcol: ProviderRequest {
            method: http::Method::from_bytes(b"MKCOL").unwrap(),
            url: url.clone(),
            headers: dest.clone(),
            body: Body::Empty,
        },
        mv: ProviderRequest {
            method: http::Method::from_bytes(b"MOVE").unwrap(),
            url: format!("{url}/.file"),
            headers: dest,
            body: Body::Empty,
        },
        file: file(2500),
    }
}

#[tokio::test]
async fn fail_points() {
    let scenario = fail::FailScenario::setup();
    let server = Server::start(|r, _, _| match r.method.as_str() {
        "MKCOL" | "MOVE" => json(201, ""),
        _ => json(201, "{}"),
    })
    .await;
    let up = Upstream::new(lab_config()).unwrap();

    fail::cfg("providers::before_first_request", "return").unwrap();
    let err = up.perform(Provider::WebDav, single(&server.base())).await.unwrap_err();
    assert_eq!(err.stage, 0);
    assert!(server.requests().is_empty());
    fail::remove("providers::before_first_request");

    // Half-way through a single body: the provider never gets the whole request.
    fail::cfg("providers::mid_upload", "return").unwrap();
    let err = up.perform(Provider::WebDav, single(&server.base())).await.unwrap_err();
    assert_eq!(err.stage, 1);
    assert!(server.requests().is_empty(), "the cut request never completed");

    // After the first chunk of a sequence.
    let err = up.perform(Provider::WebDav, nextcloud(&server.base())).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ProcErrorKind::Truncated, 1));
    let methods: Vec<String> = server.requests().iter().map(|r| r.method.clone()).collect();
    assert_eq!(methods, ["MKCOL", "PUT", "DELETE"]);
    fail::remove("providers::mid_upload");

    fail::cfg("providers::after_response", "return").unwrap();
    let before = server.requests().len();
    let err = up.perform(Provider::WebDav, nextcloud(&server.base())).await.unwrap_err();
    assert_eq!(err.stage, 1);
    assert_eq!(server.requests().len(), before + 5, "the whole sequence ran");
    fail::remove("providers::after_response");
    scenario.teardown();
}
