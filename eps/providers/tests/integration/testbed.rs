//! One save and one download per provider against the project's provider
//! test servers (`testbed/providers`, Python), over TLS with their test CA
//! and the providers' real host names resolved to the local server: the
//! same code path as real-cloud mode, only the trust store and name
//! resolution differ. Needs the repository's `.venv` (aiohttp; `make build`); fails, never
//! skips, when the testbed cannot start.

use crate::common;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bytes::Bytes;
use common::{file, hdrs};
use ec_providers::{Body, Procedure, Provider, ProviderRequest, Upstream, UpstreamConfig};

struct Testbed {
    child: Child,
    addr: SocketAddr,
    ca: Vec<u8>,
    _dir: tempfile::TempDir,
}

impl Drop for Testbed {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn start_testbed() -> Testbed {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    let python = root.join(".venv/bin/python");
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(&python)
        .current_dir(&root)
        .args(["-m", "testbed.providers", "serve", "--quiet", "--listen", "127.0.0.1:0", "--nextcloud-min-chunk", "0"])
        .arg("--state")
        .arg(dir.path().join("state"))
        .arg("--certs")
        .arg(dir.path().join("certs"))
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {}: {e} (the testbed needs the project venv)", python.display()));
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap()).read_line(&mut line).unwrap();
    let ready: serde_json::Value =
        serde_json::from_str(line.strip_prefix("ready ").unwrap_or_else(|| panic!("testbed did not start: {line:?}"))).unwrap();
    let addr: SocketAddr = ready["https"].as_str().unwrap().parse().unwrap();
    let ca = std::fs::read(ready["ca"].as_str().unwrap()).unwrap();
    Testbed { child, addr, ca, _dir: dir }
}

/// Real-cloud configuration plus the lab's two changes.
fn config(tb: &Testbed) -> UpstreamConfig {
    let names = [
        "content.dropboxapi.com",
        "api.dropboxapi.com",
        "graph.microsoft.com",
        "api.onedrive.com",
        "testbed.files.1drv.com",
        "www.googleapis.com",
        "cloud.example.com",
    ];
    UpstreamConfig {
        extra_root_ca_pem: vec![tb.ca.clone()],
        resolve: names.iter().map(|n| (n.to_string(), tb.addr)).collect(),
        webdav_hosts: vec![ec_providers::HostPattern::parse("cloud.example.com").unwrap()],
        dropbox_chunk: 4 * 1024 * 1024,
        graph_fragment: 327_680,
        drive_chunk: 262_144,
        nc_chunk: 100_000,
        allow_small_nc_chunk: true,
        op_timeout: Duration::from_secs(60),
        ..UpstreamConfig::default()
    }
}

fn docish(n: usize, seed: u8) -> Bytes {
    let mut v = file(n).to_vec();
    v[0] = seed;
    v.into()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_every_provider_over_tls() {
    let tb = start_testbed();
    let up = Upstream::new(config(&tb)).unwrap();

    // Dropbox: a single upload, then an upload session over it, then a download.
    let first = docish(3000, 1);
    let upload = ProviderRequest {
        method: http::Method::POST,
        url: "https://content.dropboxapi.com/2/files/upload".into(),
        headers: hdrs(&[
            ("authorization", "Bearer alice"),
            ("dropbox-api-arg", r#"{"path":"/Dokumente/Ünï.docx","mode":"overwrite"}"#),
            ("content-type", "application/octet-stream"),
        ]),
        body: Body::File(first),
    };
    let done = up.perform(Provider::Dropbox, Procedure::Single { request: upload }).await.unwrap();
    assert_eq!(done.response.status, 200, "{:?}", String::from_utf8_lossy(&done.response.body));
    assert!(!done.hash_disagreement);

    let second = docish(5_000_000, 2);
    let finish = ProviderRequest {
        method: http::Method::POST,
        url: "https://content.dropboxapi.com/2/files/upload_session/finish".into(),
        headers: hdrs(&[
            ("authorization", "Bearer alice"),
            (
                "dropbox-api-arg",
                r#"{"cursor": {"session_id": "dev-1", "offset": 0}, "commit": {"path": "/Dokumente/Ünï.docx", "mode": "overwrite"}}"#,
            ),
            ("content-type", "application/octet-stream"),
        ]),
        body: Body::Empty,
    };
    let done =
        up.perform(Provider::Dropbox, Procedure::DropboxSession { finish, file: second.clone(), binding: "dev-1".into() }).await.unwrap();
    assert_eq!(done.response.status, 200, "{:?}", String::from_utf8_lossy(&done.response.body));
    assert_eq!((done.calls, done.hash_disagreement), (3, false));
    let download = ProviderRequest {
        method: http::Method::POST,
        url: "https://content.dropboxapi.com/2/files/download".into(),
        headers: hdrs(&[("authorization", "Bearer alice"), ("dropbox-api-arg", r#"{"path":"/Dokumente/Ünï.docx"}"#)]),
        body: Body::Empty,
    };
    let got = up.fetch(Provider::Dropbox, download, false).await.unwrap();
    assert_eq!((got.response.status, got.body_checked), (200, true));
    assert!(got.response.body == second);

    // Graph: an upload session (three fragments, the testbed refuses
    // authorization on them), then the download through its redirect.
    let g = docish(700_000, 3);
    let create = ProviderRequest {
        method: http::Method::POST,
        url: "https://graph.microsoft.com/v1.0/me/drive/root:/Docs/Plan.docx:/createUploadSession".into(),
        headers: hdrs(&[("authorization", "Bearer alice"), ("content-type", "application/json")]),
        body: Body::Bytes(Bytes::from_static(br#"{"item":{"@microsoft.graph.conflictBehavior":"replace"}}"#)),
    };
    let done = up.perform(Provider::Graph, Procedure::GraphSession { create, file: g.clone() }).await.unwrap();
    assert!(matches!(done.response.status, 200 | 201), "{:?}", String::from_utf8_lossy(&done.response.body));
    assert_eq!((done.calls, done.hash_disagreement), (4, false));
    let get = ProviderRequest {
        method: http::Method::GET,
        url: "https://graph.microsoft.com/v1.0/me/drive/root:/Docs/Plan.docx:/content".into(),
        headers: hdrs(&[("authorization", "Bearer alice")]),
        body: Body::Empty,
    };
    let got = up.fetch(Provider::Graph, get, true).await.unwrap();
    assert_eq!(got.redirect.as_ref().map(|r| r.status), Some(302));
    assert_eq!((got.response.status, got.body_checked), (200, true));
    assert!(got.response.body == g);

    // Drive: a resumable create in three chunks; md5Checksum compared.
    let d = docish(600_000, 4);
    let initiate = ProviderRequest {
        method: http::Method::POST,
        url: "https://www.googleapis.com/upload/drive/v3/files?uploadType=resumable&fields=id,md5Checksum".into(),
        headers: hdrs(&[
            ("authorization", "Bearer alice"),
            ("content-type", "application/json; charset=UTF-8"),
            ("x-upload-content-type", "application/vnd.openxmlformats-officedocument.wordprocessingml.document"),
            ("x-upload-content-length", "600000"),
        ]),
        body: Body::Bytes(Bytes::from_static(br#"{"name":"Plan.docx"}"#)),
    };
    let done = up.perform(Provider::Drive, Procedure::DriveResumable { initiate, file: d.clone() }).await.unwrap();
    assert_eq!(done.response.status, 200, "{:?}", String::from_utf8_lossy(&done.response.body));
    let resource: serde_json::Value = serde_json::from_slice(&done.response.body).unwrap();
    assert!(resource["md5Checksum"].is_string());
    assert_eq!((done.calls, done.hash_disagreement), (4, false));
    let id = resource["id"].as_str().unwrap();
    let get = ProviderRequest {
        method: http::Method::GET,
        url: format!("https://www.googleapis.com/drive/v3/files/{id}?alt=media"),
        headers: hdrs(&[("authorization", "Bearer alice")]),
        body: Body::Empty,
    };
    let got = up.fetch(Provider::Drive, get, false).await.unwrap();
    assert_eq!((got.response.status, got.body_checked), (200, true));
    assert!(got.response.body == d);

    // Nextcloud chunking v2, with the app's OC-Checksum, then a GET.
    let w = docish(250_000, 5);
    let sha1 = ec_provider_hashes::OcChecksum::compute(ec_provider_hashes::OcAlgorithm::Sha1, &w).to_string();
    let transfer = "https://cloud.example.com/remote.php/dav/uploads/alice/ec-t1";
    let dest = "https://cloud.example.com/remote.php/dav/files/alice/Plan.docx"; // Nextcloud: the parent must exist
    let auth = ("authorization", "Basic YWxpY2U6cHc=");
    let mkcol = ProviderRequest {
        method: http::Method::from_bytes(b"MKCOL").unwrap(),
        url: transfer.into(),
        headers: hdrs(&[auth, ("destination", dest)]),
        body: Body::Empty,
    };
    let mv = ProviderRequest {
        method: http::Method::from_bytes(b"MOVE").unwrap(),
        url: format!("{transfer}/.file"),
        headers: hdrs(&[auth, ("destination", dest), ("oc-checksum", &sha1)]),
        body: Body::Empty,
    };
    let done = up.perform(Provider::WebDav, Procedure::NextcloudChunked { mkcol, mv, file: w.clone() }).await.unwrap();
    assert!(matches!(done.response.status, 201 | 204), "{:?}", String::from_utf8_lossy(&done.response.body));
    assert_eq!((done.calls, done.hash_disagreement), (5, false));
    let get = ProviderRequest { method: http::Method::GET, url: dest.into(), headers: hdrs(&[auth]), body: Body::Empty };
    let got = up.fetch(Provider::WebDav, get, false).await.unwrap();
    assert_eq!((got.response.status, got.body_checked), (200, true));
    assert!(got.response.body == w);
}

/// The Dropbox Python SDK (12.x) sends, on its `finish`, the `content_hash`
/// of that call's own body (issue 11). The EPS sends the finish with an
/// empty body, so forwarding the app's hash would make Dropbox answer
/// `content_hash_mismatch`: the EPS drops it, and a per-call hash is no
/// disagreement with the file.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn testbed_dropbox_finish_with_the_apps_per_call_content_hash() {
    let tb = start_testbed();
    let up = Upstream::new(config(&tb)).unwrap();
    let data = docish(300_000, 7);
    // The app sent 200,000 bytes in start/append and the rest in its finish.
    let tail_hash = ec_provider_hashes::dropbox_content_hash(&data[200_000..]);
    let arg = format!(
        r#"{{"cursor": {{"session_id": "dev-9", "offset": 200000}}, "commit": {{"path": "/sdk.docx", "mode": {{".tag": "overwrite"}}}}, "content_hash": "{tail_hash}"}}"#
    );
    let finish = ProviderRequest {
        method: http::Method::POST,
        url: "https://content.dropboxapi.com/2/files/upload_session/finish".into(),
        headers: hdrs(&[("authorization", "Bearer sdk"), ("dropbox-api-arg", arg.as_str()), ("content-type", "application/octet-stream")]),
        body: Body::Empty,
    };
    let done =
        up.perform(Provider::Dropbox, Procedure::DropboxSession { finish, file: data.clone(), binding: "dev-9".into() }).await.unwrap();
    assert_eq!(done.response.status, 200, "{:?}", String::from_utf8_lossy(&done.response.body));
    assert!(!done.hash_disagreement);
    let meta: serde_json::Value = serde_json::from_slice(&done.response.body).unwrap();
    assert_eq!(meta["content_hash"], ec_provider_hashes::dropbox_content_hash(&data));
}
