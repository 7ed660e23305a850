//! The HTTP side: listeners, TLS, routing and body limits.
//!
//! This layer only translates: it turns an HTTP request into a call of
//! [`crate::service::Service`] and its answer back into HTTP. The
//! protocol's own errors travel as ERROR messages with the status §10 gives
//! them; this module adds nothing but `content-length` (and `connection:
//! close` when it stops reading a body early).

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;

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

/// Answers one HTTP request.
pub async fn route(svc: Arc<Service>, which: Listener, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
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
        _ => return Ok(protocol(svc.unsupported_path(&path), false)),
    };
    if which != Listener::Device {
        return Ok(plain(StatusCode::NOT_FOUND, "the protocol is served on the device listener\n"));
    }
    if method != Method::POST {
        return Ok(protocol(svc.wrong_method(endpoint), false));
    }
    // §5.1 step 1: the declared length against the request's total bound.
    let bound = svc.body_bound(endpoint);
    let declared = req.headers().get(http::header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()).and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > bound) {
        return Ok(protocol(svc.too_large(endpoint, declared.unwrap_or(0), bound), true));
    }
    let body = match Limited::new(req.into_body(), bound as usize).collect().await {
        Ok(c) => c.to_bytes(),
        Err(e) => {
            if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() {
                return Ok(protocol(svc.too_large(endpoint, bound + 1, bound), true));
            }
            // The device went away mid-body: nothing to answer, nothing done.
            tracing::info!(endpoint = endpoint.name(), "request body ended early: {e}");
            return Ok(protocol(svc.body_cut(endpoint), true));
        }
    };
    let (status, bytes) = svc.handle_detached(endpoint, body).await;
    Ok(protocol((status, bytes), false))
}

fn protocol((status, body): (u16, Vec<u8>), close: bool) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if close {
        r.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
    }
    r
}

/// Serves `listener` until the process ends; TLS when `tls` is given.
pub async fn serve(svc: Arc<Service>, which: Listener, listener: TcpListener, tls: Option<TlsAcceptor>) {
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let svc = svc.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let service = hyper::service::service_fn(move |req| route(svc.clone(), which, req));
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            // Spec §2.2: no `date` on protocol answers (37 bytes a save; the device ignores it).
            builder.http1().auto_date_header(false).http2().auto_date_header(false);
            // Spec §2.2: keep idle connections at least 120 s (hyper's default keeps them until the peer closes).
            let result = match tls {
                Some(acceptor) => match acceptor.accept(stream).await {
                    Ok(s) => builder.serve_connection(TokioIo::new(s), service).await,
                    Err(e) => {
                        tracing::info!(%peer, "TLS handshake failed: {e}");
                        return;
                    }
                },
                None => builder.serve_connection(TokioIo::new(stream), service).await,
            };
            if let Err(e) = result {
                tracing::debug!(%peer, "connection ended: {e}");
            }
        });
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
