//! The HTTP side: listeners, TLS, routing and body limits.
//!
//! This layer only translates: it turns an HTTP request into a call of
//! [`crate::service::Service`] and its answer back into HTTP. The
//! protocol's own errors travel as ERROR messages with the status §10 gives
//! them; this module adds nothing but `content-length` (and `connection:
//! close` when it stops reading a body early).

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Body as _;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

use crate::body::{BoxError, RequestBody};
use crate::conns::{Conn, Tracked, Tracker};
use crate::service::{Endpoint, Service};

/// Which listener a request arrived on: `/metrics` exists only on the management one.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// Faces the devices (Wi-Fi side).
    Device,
    /// Faces the edge-manager and monitoring.
    Management,
}

fn plain(status: StatusCode, text: &'static str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from_static(text.as_bytes())));
    *r.status_mut() = status;
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; charset=utf-8"));
    r
}

/// A request that gets no answer: its task failed inside the EPS. hyper
/// then closes the connection (HTTP/1.1) or resets the stream (HTTP/2).
#[derive(Debug)]
pub struct NoAnswer;

impl std::fmt::Display for NoAnswer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("the request's task failed inside the EPS: no answer")
    }
}

impl std::error::Error for NoAnswer {}

/// Answers one HTTP request arriving on connection `conn`.
pub async fn route(svc: Arc<Service>, which: Listener, conn: Arc<Conn>, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, NoAnswer> {
    let _running = conn.request();
    let path = req.uri().path().to_owned();
    let method = req.method().clone();
    let endpoint = match path.as_str() {
        "/healthz" => {
            if method != Method::GET && method != Method::HEAD {
                return Ok(plain(StatusCode::METHOD_NOT_ALLOWED, "method not allowed\n"));
            }
            return Ok(if svc.healthy() { plain(StatusCode::OK, "ok\n") } else { plain(StatusCode::SERVICE_UNAVAILABLE, "unavailable\n") });
        }
        "/metrics" if which == Listener::Management => {
            let mut r = Response::new(Full::new(Bytes::from(svc.render_metrics())));
            r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"));
            return Ok(r);
        }
        "/ec/hello" => Endpoint::Hello,
        "/ec/1/save" => Endpoint::Save,
        "/ec/1/fetch" => Endpoint::Fetch,
        _ => return Ok(protocol(svc.unsupported_path(&path), !req.body().is_end_stream())),
    };
    if which != Listener::Device {
        return Ok(plain(StatusCode::NOT_FOUND, "the protocol is served on the device listener\n"));
    }
    if method != Method::POST {
        return Ok(protocol(svc.wrong_method(endpoint), !req.body().is_end_stream()));
    }
    // §5.1 step 1: the declared length against the request's total bound.
    let bound = svc.body_bound(endpoint);
    let declared = req.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > bound) {
        return Ok(protocol(svc.too_large(endpoint, declared.unwrap_or(0), bound), true));
    }
    // The body is read by the service as it needs it: the structured part
    // first (at most max_envelope before the MAC is checked, §14), the
    // payloads only after.
    let body = RequestBody::streaming(
        req.into_body().map_err(|e| -> BoxError { Box::new(e) }).boxed(),
        svc.timeouts().body_read,
        svc.preauth(),
        conn.allowance.clone(),
        conn.trusted.clone(),
    );
    let started = std::time::Instant::now();
    let Some((status, bytes, finished, timing)) = svc.handle_detached(endpoint, body).await else {
        // No answer is the true one (see `handle_detached`): hyper closes the connection.
        return Err(NoAnswer);
    };
    let mut r = protocol((status, bytes), !finished);
    if endpoint == Endpoint::Save {
        let own = timing.body_read.unwrap_or(started).elapsed();
        r.headers_mut().insert(
            http::header::HeaderName::from_static("server-timing"),
            server_timing(own, timing.rebuild, timing.provider, timing.overlap),
        );
    }
    Ok(r)
}

/// Spec §7.3: the EPS's own time on a save (`eps`: from the last byte of the
/// request read, or from its head when the EPS answered before reading it
/// all, to the answer; the body's arrival is the link's time) and the part
/// of it spent rebuilding patched items (`rb`) and in provider exchanges
/// (`pv`), in milliseconds, so that the device can tell its link's time from
/// the EPS's, charge the rebuild to the next patch-or-whole decision, and
/// know what the EPS adds beyond both (its store, its hashing) when a whole
/// file could go to the provider directly. A streamed save (§5.6) rebuilds
/// while its upload is sent: `ov` is the part of `rb` inside `pv`, so that
/// `eps` - `rb` - `pv` + `ov` stays the EPS's own addition.
fn server_timing(
    total: std::time::Duration,
    rebuild: Option<std::time::Duration>,
    provider: Option<std::time::Duration>,
    overlap: Option<std::time::Duration>,
) -> http::HeaderValue {
    let ms = |d: std::time::Duration| d.as_secs_f64() * 1e3;
    let mut v = format!("eps;dur={:.1}", ms(total));
    if let Some(r) = rebuild {
        v += &format!(", rb;dur={:.1}", ms(r));
    }
    if let Some(p) = provider {
        v += &format!(", pv;dur={:.1}", ms(p));
    }
    if let Some(o) = overlap {
        v += &format!(", ov;dur={:.1}", ms(o));
    }
    http::HeaderValue::from_str(&v).expect("digits, letters, ';', '=', ',', '.' and spaces")
}

fn protocol((status, body): (u16, Vec<u8>), close: bool) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if close {
        r.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    r
}

/// Serves `listener` until the process ends; TLS when `tls` is given. At
/// most `tracker.max()` connections are held (see [`crate::conns`]).
pub async fn serve(svc: Arc<Service>, which: Listener, listener: TcpListener, tls: Option<TlsAcceptor>, tracker: Arc<Tracker>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                // Out of files or memory: wait, without a log line per attempt.
                crate::limited!(warn, "accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let Some(admitted) = tracker.admit() else {
            // Over the cap and every held connection is a device's: close at once.
            crate::limited!(info, "connection refused: over the cap of {} connections", tracker.max());
            drop(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let svc = svc.clone();
        let tls = tls.clone();
        let tracker = tracker.clone();
        tokio::spawn(async move {
            let conn = admitted.conn.clone();
            let t = svc.timeouts();
            match tls {
                Some(acceptor) => {
                    let handshake = tokio::time::timeout(t.tls_handshake, acceptor.accept(stream));
                    tokio::select! {
                        r = handshake => match r {
                            Ok(Ok(s)) => serve_io(svc, which, s, &tracker, &conn).await,
                            Ok(Err(e)) => crate::limited!(info, %peer, "TLS handshake failed: {e}"),
                            Err(_) => tracker.timed_out("tls_handshake"),
                        },
                        _ = conn.evicted() => {}
                    }
                }
                None => serve_io(svc, which, stream, &tracker, &conn).await,
            }
            drop(admitted);
        });
    }
}

async fn serve_io<S>(svc: Arc<Service>, which: Listener, io: S, tracker: &Tracker, conn: &Arc<Conn>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let t = svc.timeouts();
    let c2 = conn.clone();
    let service = hyper::service::service_fn(move |req| route(svc.clone(), which, c2.clone(), req));
    let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
    // Spec §2.2: no `date` on protocol answers (37 bytes a save; the device ignores it).
    // Header and idle timeouts are the connection's watchdog's (hyper's
    // header timer would also end idle keep-alive connections, which §2.2
    // keeps 120 s). HTTP/2 windows and streams are bounded so that a peer
    // cannot make hyper buffer more than the EPS reads.
    builder.http1().auto_date_header(false).max_buf_size(256 << 10);
    builder
        .http2()
        .auto_date_header(false)
        .max_concurrent_streams(32)
        .initial_stream_window_size(256 << 10)
        .initial_connection_window_size(1 << 20)
        .max_header_list_size(64 << 10)
        .max_send_buf_size(256 << 10);
    let served = builder.serve_connection(TokioIo::new(Tracked::new(io, conn.clone())), service);
    tokio::select! {
        r = served => if let Err(e) = r {
            tracing::debug!("connection ended: {e}");
        },
        kind = conn.watchdog(t) => tracker.timed_out(kind),
        _ = conn.evicted() => {}
    }
}

/// Builds the TLS acceptor of the device listener from PEM files.
pub fn tls_acceptor(cert_pem: &std::path::Path, key_pem: &std::path::Path) -> Result<TlsAcceptor, String> {
    let read = |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("cannot read {}: {e}", p.display()));
    let certs: Vec<_> = rustls_pemfile::certs(&mut &read(cert_pem)?[..])
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{}: not a PEM certificate chain: {e}", cert_pem.display()))?;
    let key = rustls_pemfile::private_key(&mut &read(key_pem)?[..])
        .map_err(|e| format!("{}: not a PEM private key: {e}", key_pem.display()))?
        .ok_or_else(|| format!("{}: no private key in the file", key_pem.display()))?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| format!("the certificate and key do not fit together: {e}"))?;
    cfg.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(cfg)))
}

/// Binds a listener with a clear message on failure.
pub async fn bind(addr: SocketAddr, what: &str) -> Result<TcpListener, String> {
    TcpListener::bind(addr).await.map_err(|e| format!("cannot listen on {addr} for the {what}: {e}"))
}
