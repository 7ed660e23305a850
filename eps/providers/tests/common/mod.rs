//! A scripted HTTP/1.1 provider stand-in for the integration tests: a raw
//! TCP server that records every request exactly as it arrived (request
//! line, header lines in order with their original bytes, body) and
//! answers each one with whatever the test's script says, including
//! answers no well-behaved server gives (never answering, cutting a body).
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use ec_providers::{HostPattern, UpstreamConfig};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// One request as received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub method: String,
    pub target: String,
    /// Header lines in order, names as sent.
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

impl Recorded {
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_slice())
    }
    pub fn header_str(&self, name: &str) -> Option<String> {
        self.header(name).map(|v| String::from_utf8(v.to_vec()).unwrap())
    }
    pub fn names(&self) -> Vec<String> {
        self.headers.iter().map(|(n, _)| n.to_ascii_lowercase()).collect()
    }
    /// Header lines other than host and content-length.
    pub fn app_headers(&self) -> Vec<(String, Vec<u8>)> {
        self.headers.iter().filter(|(n, _)| !n.eq_ignore_ascii_case("host") && !n.eq_ignore_ascii_case("content-length")).cloned().collect()
    }
}

/// What the server does with a request.
pub enum Reply {
    /// Write these bytes, keep the connection.
    Raw(Vec<u8>),
    /// Write these bytes, then close the connection.
    RawThenClose(Vec<u8>),
    /// Never answer (keep the connection open).
    Hang,
    /// Close the connection without answering.
    Close,
}

/// A complete response with a correct content-length.
pub fn resp(status: u16, reason: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    let mut out = format!("HTTP/1.1 {status} {reason}\r\n").into_bytes();
    for (n, v) in headers {
        out.extend_from_slice(format!("{n}: {v}\r\n").as_bytes());
    }
    out.extend_from_slice(format!("content-length: {}\r\n\r\n", body.len()).as_bytes());
    out.extend_from_slice(body);
    Reply::Raw(out)
}

pub fn json(status: u16, body: &str) -> Reply {
    resp(status, "", &[("content-type", "application/json")], body.as_bytes())
}

type Script = dyn Fn(&Recorded, usize, &str) -> Reply + Send + Sync;

pub struct Server {
    pub addr: SocketAddr,
    log: Arc<Mutex<Vec<Recorded>>>,
}

impl Server {
    /// `script(request, index, base_url)` answers the `index`-th request.
    pub async fn start(script: impl Fn(&Recorded, usize, &str) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let log = Arc::new(Mutex::new(Vec::new()));
        let script: Arc<Script> = Arc::new(script);
        let base = format!("http://{addr}");
        let l = log.clone();
        tokio::spawn(async move {
            loop {
                let Ok((conn, _)) = listener.accept().await else { return };
                tokio::spawn(serve(conn, l.clone(), script.clone(), base.clone()));
            }
        });
        Self { addr, log }
    }

    pub fn base(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.log.lock().unwrap().clone()
    }
}

async fn serve(mut conn: TcpStream, log: Arc<Mutex<Vec<Recorded>>>, script: Arc<Script>, base: String) {
    let mut buf = Vec::new();
    loop {
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i;
            }
            let mut chunk = [0u8; 65536];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
        let raw_head = buf[..head_end].to_vec();
        buf.drain(..head_end + 4);
        let mut lines = raw_head.split(|b| *b == b'\n').map(|l| l.strip_suffix(b"\r").unwrap_or(l));
        let request_line = String::from_utf8_lossy(lines.next().unwrap()).into_owned();
        let mut parts = request_line.split(' ');
        let method = parts.next().unwrap().to_owned();
        let target = parts.next().unwrap().to_owned();
        let headers: Vec<(String, Vec<u8>)> = lines
            .map(|l| {
                let colon = l.iter().position(|b| *b == b':').unwrap();
                let value = l[colon + 1..].strip_prefix(b" ").unwrap_or(&l[colon + 1..]).to_vec();
                (String::from_utf8_lossy(&l[..colon]).into_owned(), value)
            })
            .collect();
        assert!(!head.to_ascii_lowercase().contains("transfer-encoding"), "the EPS sent a chunked request");
        let len: usize = headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
            .map(|(_, v)| std::str::from_utf8(v).unwrap().parse().unwrap())
            .unwrap_or(0);
        while buf.len() < len {
            let mut chunk = [0u8; 65536];
            match conn.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let body: Vec<u8> = buf.drain(..len).collect();
        let rec = Recorded { method, target, headers, body };
        let index = {
            let mut log = log.lock().unwrap();
            log.push(rec.clone());
            log.len() - 1
        };
        match script(&rec, index, &base) {
            Reply::Raw(bytes) => {
                if conn.write_all(&bytes).await.is_err() {
                    return;
                }
            }
            Reply::RawThenClose(bytes) => {
                let _ = conn.write_all(&bytes).await;
                let _ = conn.shutdown().await;
                return;
            }
            Reply::Hang => {
                tokio::time::sleep(Duration::from_secs(3600)).await;
                return;
            }
            Reply::Close => return,
        }
    }
}

/// A configuration that sends everything to 127.0.0.1 over plain HTTP,
/// with small chunks and short timeouts.
pub fn lab_config() -> UpstreamConfig {
    let local = vec![HostPattern::parse("127.0.0.1").unwrap()];
    UpstreamConfig {
        dropbox_hosts: local.clone(),
        graph_hosts: local.clone(),
        drive_hosts: local.clone(),
        webdav_hosts: local.clone(),
        allow_plain_http_hosts: local,
        dropbox_chunk: 1000,
        graph_fragment: 327_680,
        drive_chunk: 262_144,
        nc_chunk: 1000,
        allow_small_nc_chunk: true,
        connect_timeout: Duration::from_secs(2),
        response_timeout: Duration::from_millis(500),
        idle_timeout: Duration::from_millis(500),
        op_timeout: Duration::from_secs(10),
        ..UpstreamConfig::default()
    }
}

pub fn hdrs(list: &[(&str, &str)]) -> Vec<(String, Vec<u8>)> {
    list.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect()
}

/// A deterministic file of `n` bytes.
pub fn file(n: usize) -> bytes::Bytes {
    (0..n).map(|i| (i * 31 % 251) as u8).collect::<Vec<u8>>().into()
}
