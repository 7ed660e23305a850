//! Every procedure of §6 against a scripted provider: the exact sequence
//! of requests (method, target, header lines, body bytes), the rewritten
//! fields, chunking, and what comes back.

use crate::common;

use bytes::Bytes;
use common::{file, hdrs, json, lab_config, resp, Recorded, Server};
use ec_providers::{Body, Procedure, Provider, ProviderRequest, Upstream};

fn upstream() -> Upstream {
    Upstream::new(lab_config()).unwrap()
}

#[tokio::test]
async fn single_goes_out_exactly_as_sent() {
    let data = file(5000);
    let hash = ec_provider_hashes::dropbox_content_hash(&data);
    let meta = format!(r#"{{"name":"Ünï.docx","content_hash":"{hash}"}}"#);
    let server = Server::start(move |_, _, _| {
        resp(
            200,
            "OK",
            &[
                ("x-dropbox-request-id", "abc"),
                ("content-type", "application/json"),
                ("connection", "keep-alive"),
                ("set-cookie", "a=1"),
                ("set-cookie", "b=2"),
            ],
            meta.as_bytes(),
        )
    })
    .await;
    let arg = r#"{"path": "/Dokumente/Ünï.docx", "mode": "overwrite", "content_hash": "HASH"}"#.replace("HASH", &hash);
    let headers = hdrs(&[
        ("authorization", "Bearer sl.MARKER-CREDENTIAL"),
        ("dropbox-api-arg", &arg),
        ("content-type", "application/octet-stream"),
        ("user-agent", "TestApp/1.0"),
    ]);
    let request = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/2/files/upload", server.base()),
        headers: headers.clone(),
        body: Body::File(data.clone()),
    };
    let done = upstream().perform(Provider::Dropbox, Procedure::Single { request }).await.unwrap();

    let got = server.requests();
    assert_eq!(got.len(), 1);
    assert_eq!((got[0].method.as_str(), got[0].target.as_str()), ("POST", "/2/files/upload"));
    assert_eq!(got[0].app_headers(), headers, "app fields in order, raw UTF-8 kept, nothing added");
    assert_eq!(got[0].header_str("content-length").unwrap(), "5000");
    assert_eq!(got[0].header_str("host").unwrap(), server.addr.to_string());
    assert_eq!(got[0].headers.len(), headers.len() + 2, "only host and content-length are added");
    assert_eq!(got[0].body, data.to_vec());

    assert_eq!(done.response.status, 200);
    assert_eq!(done.response.reason, "OK");
    assert_eq!(
        done.response.headers,
        hdrs(&[("x-dropbox-request-id", "abc"), ("content-type", "application/json"), ("set-cookie", "a=1"), ("set-cookie", "b=2")]),
        "order kept, hop-by-hop and content-length left out"
    );
    assert!(std::str::from_utf8(&done.response.body).unwrap().contains("Ünï"));
    assert_eq!((done.calls, done.succeeded_items.clone(), done.hash_disagreement), (1, vec![true], false));
    assert!(done.bytes_sent >= 5000 && done.bytes_received >= done.response.body.len() as u64);
}

#[tokio::test]
async fn single_reports_a_hash_disagreement_without_changing_the_response() {
    let server = Server::start(|_, _, _| json(200, r#"{"content_hash":"0000"}"#)).await;
    let request = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/2/files/upload", server.base()),
        headers: hdrs(&[("dropbox-api-arg", r#"{"path":"/a.docx"}"#)]),
        body: Body::File(file(10)),
    };
    let done = upstream().perform(Provider::Dropbox, Procedure::Single { request }).await.unwrap();
    assert!(done.hash_disagreement);
    assert_eq!(&done.response.body[..], br#"{"content_hash":"0000"}"#);
}

#[tokio::test]
async fn wrapped_multipart_body_and_non_canonical_reason() {
    let server = Server::start(|_, _, _| resp(200, "Fine Thanks", &[], b"{}")).await;
    let data = file(3000);
    let prefix =
        Bytes::from_static(b"--b\r\ncontent-type: application/json\r\n\r\n{}\r\n--b\r\ncontent-type: application/octet-stream\r\n\r\n");
    let suffix = Bytes::from_static(b"\r\n--b--\r\n");
    let request = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/upload/drive/v3/files?uploadType=multipart", server.base()),
        headers: hdrs(&[("authorization", "Bearer ya29.x"), ("content-type", "multipart/related; boundary=b")]),
        body: Body::Wrapped { prefix: prefix.clone(), file: data.clone(), suffix: suffix.clone() },
    };
    let done = upstream().perform(Provider::Drive, Procedure::Single { request }).await.unwrap();
    let got = server.requests();
    assert_eq!(got[0].target, "/upload/drive/v3/files?uploadType=multipart");
    assert_eq!(got[0].body, [&prefix[..], &data[..], &suffix[..]].concat());
    assert_eq!(done.response.reason, "Fine Thanks");
}

const FINISH_ARG: &str = r#"{"cursor": {"session_id": "dev-sess-1", "offset": 0}, "commit": {"path": "/Dokumente/Ünï.docx", "mode": {".tag": "update", "update": "a1c10ce0dd78"}, "autorename": false}}"#;

#[tokio::test]
async fn dropbox_session_chunks_then_finish_with_rewritten_cursor() {
    let data = file(2500);
    let server = Server::start(|r, _, _| match r.target.as_str() {
        "/2/files/upload_session/start" => json(200, r#"{"session_id": "real-\"123\""}"#),
        "/2/files/upload_session/append_v2" => json(200, "null"),
        _ => json(200, r#"{"name":"Ünï.docx"}"#),
    })
    .await;
    let finish = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/2/files/upload_session/finish", server.base()),
        headers: hdrs(&[
            ("authorization", "Bearer sl.MARKER"),
            ("dropbox-api-arg", FINISH_ARG),
            ("content-type", "application/octet-stream"),
            ("dropbox-api-path-root", r#"{".tag": "home"}"#),
        ]),
        body: Body::Empty,
    };
    let proc = Procedure::DropboxSession { finish, file: data.clone(), binding: "dev-sess-1".into() };
    let done = upstream().perform(Provider::Dropbox, proc).await.unwrap();
    let got = server.requests();
    let targets: Vec<&str> = got.iter().map(|r| r.target.as_str()).collect();
    assert_eq!(
        targets,
        [
            "/2/files/upload_session/start",
            "/2/files/upload_session/append_v2",
            "/2/files/upload_session/append_v2",
            "/2/files/upload_session/finish"
        ]
    );
    let inherited = hdrs(&[("authorization", "Bearer sl.MARKER"), ("dropbox-api-path-root", r#"{".tag": "home"}"#)]);
    let args = [
        r#"{"close":false}"#.to_owned(),
        r#"{"cursor":{"session_id":"real-\"123\"","offset":1000},"close":false}"#.to_owned(),
        r#"{"cursor":{"session_id":"real-\"123\"","offset":2000},"close":true}"#.to_owned(),
    ];
    for (i, arg) in args.iter().enumerate() {
        let mut want = inherited.clone();
        want.push(("dropbox-api-arg".into(), arg.clone().into_bytes()));
        want.push(("content-type".into(), b"application/octet-stream".to_vec()));
        assert_eq!(got[i].app_headers(), want, "request {i}");
        assert_eq!(got[i].body, data[i * 1000..(i * 1000 + 1000).min(2500)].to_vec());
    }
    let rewritten = FINISH_ARG.replace(r#""dev-sess-1", "offset": 0"#, r#""real-\"123\"", "offset": 2500"#);
    assert_eq!(got[3].header_str("dropbox-api-arg").unwrap(), rewritten, "only the two cursor fields change");
    assert_eq!(got[3].names(), ["authorization", "dropbox-api-arg", "content-type", "dropbox-api-path-root", "content-length", "host"]);
    assert_eq!(got[3].header_str("content-length").unwrap(), "0");
    assert!(got[3].body.is_empty());
    assert_eq!((done.calls, done.response.status, done.succeeded_items), (4, 200, vec![true]));
}

#[tokio::test]
async fn dropbox_session_start_error_is_the_answer() {
    let server = Server::start(|_, _, _| {
        resp(
            429,
            "Too Many Requests",
            &[("retry-after", "7"), ("content-type", "application/json")],
            br#"{"error_summary":"too_many_requests/"}"#,
        )
    })
    .await;
    let finish = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/2/files/upload_session/finish", server.base()),
        headers: hdrs(&[("dropbox-api-arg", FINISH_ARG)]),
        body: Body::Empty,
    };
    let proc = Procedure::DropboxSession { finish, file: file(2500), binding: "dev-sess-1".into() };
    let done = upstream().perform(Provider::Dropbox, proc).await.unwrap();
    assert_eq!(server.requests().len(), 1, "the sequence stops at the first error");
    assert_eq!((done.response.status, done.response.reason.as_str()), (429, "Too Many Requests"));
    assert_eq!(done.response.header("retry-after"), Some(&b"7"[..]));
    assert_eq!(done.succeeded_items, vec![false]);
}

#[tokio::test]
async fn dropbox_batch_runs_sessions_and_rewrites_every_entry() {
    let a = file(1500);
    let b: Bytes = vec![7u8; 700].into();
    let hash_b = ec_provider_hashes::dropbox_content_hash(&b);
    // The results come back in entry order; entry 0 is item 1 (b).
    let results = format!(
        r#"{{"entries":[{{".tag":"success","content_hash":"{hash_b}"}},{{".tag":"failure","failure":{{".tag":"too_many_write_operations"}}}}]}}"#
    );
    let server = Server::start(move |r, _, _| match r.target.as_str() {
        // Session ids follow the file: first byte 7 is b.
        "/2/files/upload_session/start" => json(200, &format!(r#"{{"session_id":"real-{}"}}"#, if r.body[0] == 7 { "b" } else { "a" })),
        "/2/files/upload_session/append_v2" => json(200, "null"),
        _ => json(200, &results),
    })
    .await;
    let body = r#"{"entries": [{"cursor": {"session_id": "dev-b", "offset": 0}, "commit": {"path": "/b.xlsx"}}, {"cursor": {"offset": 0, "session_id": "dev-a"}, "commit": {"path": "/ä.docx"}}]}"#;
    let batch = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/2/files/upload_session/finish_batch_v2", server.base()),
        headers: hdrs(&[("authorization", "Bearer X"), ("content-type", "application/json")]),
        body: Body::Bytes(body.into()),
    };
    let proc = Procedure::DropboxBatch { batch, items: vec![("dev-a".into(), a.clone()), ("dev-b".into(), b.clone())] };
    let done = upstream().perform(Provider::Dropbox, proc).await.unwrap();
    let got = server.requests();
    // a: start + append; b: start; then the batch.
    assert_eq!(got.len(), 4);
    let last = got.last().unwrap();
    assert_eq!(last.target, "/2/files/upload_session/finish_batch_v2");
    let want = r#"{"entries": [{"cursor": {"session_id": "real-b", "offset": 700}, "commit": {"path": "/b.xlsx"}}, {"cursor": {"offset": 1500, "session_id": "real-a"}, "commit": {"path": "/ä.docx"}}]}"#;
    assert_eq!(String::from_utf8(last.body.clone()).unwrap(), want);
    let append: Vec<&Recorded> = got.iter().filter(|r| r.target.ends_with("append_v2")).collect();
    assert_eq!(append.len(), 1);
    assert_eq!(append[0].header_str("dropbox-api-arg").unwrap(), r#"{"cursor":{"session_id":"real-a","offset":1000},"close":true}"#);
    assert_eq!(append[0].body, a[1000..].to_vec());
    for r in &got[..3] {
        assert_eq!(r.header_str("authorization").unwrap(), "Bearer X", "inherited from the batch request");
        assert_eq!(r.header_str("content-type").unwrap(), "application/octet-stream");
    }
    assert_eq!(done.succeeded_items, vec![false, true], "per item, mapped from the entries");
    assert!(!done.hash_disagreement);
}

fn graph_create(base: &str) -> ProviderRequest {
    ProviderRequest {
        method: http::Method::POST,
        url: format!("{base}/v1.0/me/drive/root:/Doc.docx:/createUploadSession"),
        headers: hdrs(&[("authorization", "Bearer eyJ.MARKER"), ("user-agent", "OneDriveApp/2"), ("content-type", "application/json")]),
        body: Body::Bytes(Bytes::from_static(br#"{"item":{"@microsoft.graph.conflictBehavior":"replace"}}"#)),
    }
}

#[tokio::test]
async fn graph_session_fragments_without_authorization() {
    let data = file(700_000);
    let qx = ec_provider_hashes::quick_xor_hash(&data);
    let server = Server::start(move |r, _, base| match (r.method.as_str(), r.target.as_str()) {
        ("POST", _) => json(200, &format!(r#"{{"uploadUrl":"{base}/up/s1?sig=secret","expirationDateTime":"2030-01-01T00:00:00Z"}}"#)),
        ("PUT", _) if r.header_str("content-range").unwrap().ends_with("-699999/700000") => {
            json(201, &format!(r#"{{"id":"X","file":{{"hashes":{{"quickXorHash":"{qx}"}}}}}}"#))
        }
        _ => json(202, r#"{"nextExpectedRanges":["0-"]}"#),
    })
    .await;
    let create = graph_create(&server.base());
    let done = upstream().perform(Provider::Graph, Procedure::GraphSession { create: create.clone(), file: data.clone() }).await.unwrap();
    let got = server.requests();
    assert_eq!(got.len(), 4);
    assert_eq!(got[0].app_headers(), create.headers);
    assert_eq!(
        got[0].body,
        create.body.file().map_or(br#"{"item":{"@microsoft.graph.conflictBehavior":"replace"}}"#.to_vec(), |f| f.to_vec())
    );
    let ranges = ["bytes 0-327679/700000", "bytes 327680-655359/700000", "bytes 655360-699999/700000"];
    for (i, range) in ranges.iter().enumerate() {
        let r = &got[i + 1];
        assert_eq!((r.method.as_str(), r.target.as_str()), ("PUT", "/up/s1?sig=secret"));
        assert_eq!(r.app_headers(), hdrs(&[("user-agent", "OneDriveApp/2"), ("content-range", range)]), "no authorization on fragments");
        let start = i * 327_680;
        assert_eq!(r.body, data[start..(start + 327_680).min(700_000)].to_vec());
    }
    assert_eq!((done.response.status, done.calls, done.hash_disagreement), (201, 4, false));
}

#[tokio::test]
async fn graph_fragment_error_stops_and_deletes_the_session() {
    let server = Server::start(|r, i, base| match (r.method.as_str(), i) {
        ("POST", _) => json(200, &format!(r#"{{"uploadUrl":"{base}/up/s2"}}"#)),
        ("PUT", 1) => json(202, r#"{"nextExpectedRanges":["327680-"]}"#),
        ("PUT", _) => resp(503, "Service Unavailable", &[("retry-after", "30")], b"busy"),
        _ => resp(204, "No Content", &[], b""),
    })
    .await;
    let done = upstream()
        .perform(Provider::Graph, Procedure::GraphSession { create: graph_create(&server.base()), file: file(700_000) })
        .await
        .unwrap();
    let got = server.requests();
    let seq: Vec<(&str, &str)> = got.iter().map(|r| (r.method.as_str(), r.target.as_str())).collect();
    assert_eq!(
        seq,
        [("POST", "/v1.0/me/drive/root:/Doc.docx:/createUploadSession"), ("PUT", "/up/s2"), ("PUT", "/up/s2"), ("DELETE", "/up/s2")]
    );
    assert_eq!(got[3].header("authorization"), None);
    assert_eq!((done.response.status, &done.response.body[..]), (503, &b"busy"[..]));
    assert_eq!(done.response.header("retry-after"), Some(&b"30"[..]));
    assert_eq!((done.calls, done.succeeded_items), (4, vec![false]));
}

#[tokio::test]
async fn drive_resumable_chunks_with_ranges() {
    let data = file(600_000);
    let md5 = ec_provider_hashes::md5_hex(&data);
    let server = Server::start(move |r, _, base| match r.method.as_str() {
        "POST" => resp(200, "OK", &[("location", &format!("{base}/upload/drive/v3/files?uploadType=resumable&upload_id=XYZ"))], b""),
        _ if r.header_str("content-range").unwrap().ends_with("-599999/600000") => {
            json(200, &format!(r#"{{"id":"f1","md5Checksum":"{md5}"}}"#))
        }
        _ => resp(308, "Resume Incomplete", &[("range", "bytes=0-262143")], b""),
    })
    .await;
    let initiate = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/upload/drive/v3/files?uploadType=resumable", server.base()),
        headers: hdrs(&[
            ("authorization", "Bearer ya29.MARKER"),
            ("content-type", "application/json; charset=UTF-8"),
            ("x-upload-content-type", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
            ("x-upload-content-length", "600000"),
            ("user-agent", "DriveApp"),
        ]),
        body: Body::Bytes(Bytes::from_static(br#"{"name":"Doc.docx"}"#)),
    };
    let done =
        upstream().perform(Provider::Drive, Procedure::DriveResumable { initiate: initiate.clone(), file: data.clone() }).await.unwrap();
    let got = server.requests();
    assert_eq!(got.len(), 4);
    assert_eq!(got[0].app_headers(), initiate.headers);
    let ranges = ["bytes 0-262143/600000", "bytes 262144-524287/600000", "bytes 524288-599999/600000"];
    for (i, range) in ranges.iter().enumerate() {
        let r = &got[i + 1];
        assert_eq!((r.method.as_str(), r.target.as_str()), ("PUT", "/upload/drive/v3/files?uploadType=resumable&upload_id=XYZ"));
        assert_eq!(
            r.app_headers(),
            hdrs(&[
                ("authorization", "Bearer ya29.MARKER"),
                ("user-agent", "DriveApp"),
                ("content-type", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
                ("content-range", range),
            ])
        );
        let start = i * 262_144;
        assert_eq!(r.body, data[start..(start + 262_144).min(600_000)].to_vec());
    }
    assert_eq!((done.response.status, done.hash_disagreement, done.calls), (200, false, 4));
}

#[tokio::test]
async fn drive_size_mismatch_is_invalid_before_sending() {
    let server = Server::start(|_, _, _| json(200, "{}")).await;
    let initiate = ProviderRequest {
        method: http::Method::POST,
        url: format!("{}/upload/drive/v3/files?uploadType=resumable", server.base()),
        headers: hdrs(&[("x-upload-content-length", "5")]),
        body: Body::Empty,
    };
    let err = upstream().perform(Provider::Drive, Procedure::DriveResumable { initiate, file: file(6) }).await.unwrap_err();
    assert_eq!((err.kind, err.stage), (ec_providers::ProcErrorKind::Invalid, 0));
    assert!(server.requests().is_empty());
}

fn nc_requests(base: &str) -> (ProviderRequest, ProviderRequest) {
    let url = format!("{base}/remote.php/dav/uploads/alice/ec-transfer-1");
    let dest = format!("{base}/remote.php/dav/files/alice/Docs/Ünï.docx");
    let mkcol = ProviderRequest {
        method: http::Method::from_bytes(b"MKCOL").unwrap(),
        url: url.clone(),
        headers: hdrs(&[("authorization", "Basic YWxpY2U6cHc="), ("destination", &dest), ("user-agent", "Nextcloud-client")]),
        body: Body::Empty,
    };
    let mv = ProviderRequest {
        method: http::Method::from_bytes(b"MOVE").unwrap(),
        url: format!("{url}/.file"),
        headers: hdrs(&[
            ("authorization", "Basic YWxpY2U6cHc="),
            ("destination", &dest),
            ("oc-checksum", "SHA1:0000000000000000000000000000000000000000"),
            ("x-oc-mtime", "1700000000"),
        ]),
        body: Body::Empty,
    };
    (mkcol, mv)
}

#[tokio::test]
async fn nextcloud_chunked_mkcol_chunks_move() {
    let data = file(2500);
    let server = Server::start(|r, _, _| match r.method.as_str() {
        "MKCOL" | "PUT" => resp(201, "Created", &[], b""),
        _ => resp(201, "Created", &[("oc-etag", "\"e1\""), ("oc-fileid", "00000042oc"), ("etag", "\"e1\"")], b""),
    })
    .await;
    let (mkcol, mv) = nc_requests(&server.base());
    let done = upstream()
        .perform(Provider::WebDav, Procedure::NextcloudChunked { mkcol: mkcol.clone(), mv: mv.clone(), file: data.clone() })
        .await
        .unwrap();
    let got = server.requests();
    let seq: Vec<(&str, &str)> = got.iter().map(|r| (r.method.as_str(), r.target.as_str())).collect();
    assert_eq!(
        seq,
        [
            ("MKCOL", "/remote.php/dav/uploads/alice/ec-transfer-1"),
            ("PUT", "/remote.php/dav/uploads/alice/ec-transfer-1/00001"),
            ("PUT", "/remote.php/dav/uploads/alice/ec-transfer-1/00002"),
            ("PUT", "/remote.php/dav/uploads/alice/ec-transfer-1/00003"),
            ("MOVE", "/remote.php/dav/uploads/alice/ec-transfer-1/.file"),
        ]
    );
    assert_eq!(got[0].app_headers(), mkcol.headers);
    for (i, r) in got[1..4].iter().enumerate() {
        let mut want = mkcol.headers.clone();
        want.push(("oc-total-length".into(), b"2500".to_vec()));
        assert_eq!(r.app_headers(), want);
        assert_eq!(r.body, data[i * 1000..(i * 1000 + 1000).min(2500)].to_vec());
    }
    let mut want = mv.headers.clone();
    want.push(("oc-total-length".into(), b"2500".to_vec()));
    assert_eq!(got[4].app_headers(), want);
    assert_eq!(done.response.header("oc-fileid"), Some(&b"00000042oc"[..]));
    assert!(done.hash_disagreement, "the app's oc-checksum does not match the file");
    assert_eq!(done.succeeded_items, vec![true]);
}

#[tokio::test]
async fn nextcloud_chunk_error_deletes_the_transfer() {
    let server = Server::start(|r, _, _| match r.method.as_str() {
        "MKCOL" => resp(201, "Created", &[], b""),
        "PUT" => resp(507, "Insufficient Storage", &[("content-type", "application/xml")], b"<d:error/>"),
        _ => resp(204, "No Content", &[], b""),
    })
    .await;
    let (mkcol, mv) = nc_requests(&server.base());
    let done = upstream().perform(Provider::WebDav, Procedure::NextcloudChunked { mkcol, mv, file: file(2500) }).await.unwrap();
    let got = server.requests();
    let seq: Vec<&str> = got.iter().map(|r| r.method.as_str()).collect();
    assert_eq!(seq, ["MKCOL", "PUT", "DELETE"]);
    assert_eq!(got[2].target, "/remote.php/dav/uploads/alice/ec-transfer-1");
    assert_eq!(got[2].header("destination"), None);
    assert_eq!((done.response.status, &done.response.body[..]), (507, &b"<d:error/>"[..]));
}
