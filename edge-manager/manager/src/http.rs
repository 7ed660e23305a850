//! The HTTP side: two listeners, authentication, and the translation of a
//! request into one [`Action`]. Nothing here decides anything: `translate`
//! maps method and path to an action, `answer` maps the reply to JSON.
//!
//! - The **operator listener** (plain HTTP, loopback by default): `GET /`
//!   (the status page), `/metrics`, `/healthz` for whoever can reach it;
//!   `/v1/*` with `Authorization: Bearer <operator token>`.
//! - The **device listener** (TLS with the manager's own certificate, whose
//!   pin is in every user credential): `/healthz`; `/v1/*` with HTTP Basic
//!   `<user>:<credential secret>`. Another user's instance is 404.
//!
//! Bodies are bounded (64 KiB) and read with a timeout; connections are
//! capped per listener; header reads time out.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use bytes::Bytes;
use http::{HeaderMap, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use tokio::net::TcpListener;
use tokio::sync::Semaphore;

use crate::api::*;
use crate::manager::Manager;

const MAX_BODY: usize = 64 << 10;
const MAX_CONNECTIONS: usize = 256;

/// Which listener a request came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listener {
    /// Loopback, the operator.
    Operator,
    /// The Wi-Fi side, devices.
    Device,
}

fn json(status: u16, value: &impl serde::Serialize) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(serde_json::to_vec_pretty(value).unwrap_or_default())));
    *r.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
    r
}

fn text(status: StatusCode, content_type: &'static str, body: String) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::from(body)));
    *r.status_mut() = status;
    r.headers_mut().insert(http::header::CONTENT_TYPE, http::HeaderValue::from_static(content_type));
    r
}

fn error(e: &ApiError) -> Response<Full<Bytes>> {
    let mut body = serde_json::json!({"error": {"code": e.code(), "message": e.to_string()}});
    if let ApiError::OverLimit { limit, .. } = e {
        body["error"]["limit"] = serde_json::Value::String((*limit).to_owned());
    }
    let mut r = json(e.status(), &body);
    if let ApiError::MethodNotAllowed { allow } = e {
        r.headers_mut().insert(http::header::ALLOW, http::HeaderValue::from_static(allow));
    }
    if e.status() == 401 {
        let scheme = if e.to_string().contains("operator") { "Bearer realm=\"ec-edge operator\"" } else { "Basic realm=\"ec-edge\"" };
        r.headers_mut().insert(http::header::WWW_AUTHENTICATE, http::HeaderValue::from_static(scheme));
    }
    r
}

/// Who is calling, from the listener and the `Authorization` header.
fn authenticate(m: &Manager, which: Listener, headers: &HeaderMap) -> Result<Caller, ApiError> {
    let auth = headers.get(http::header::AUTHORIZATION).and_then(|v| v.to_str().ok()).unwrap_or("");
    match which {
        Listener::Operator => match auth.strip_prefix("Bearer ") {
            Some(token) => m.operator(token.trim()),
            None => Err(ApiError::Unauthenticated(
                "the operator API needs Authorization: Bearer <operator token> (in <state>/operator.token)".into(),
            )),
        },
        Listener::Device => {
            let decoded = auth
                .strip_prefix("Basic ")
                .and_then(|b| base64::engine::general_purpose::STANDARD.decode(b.trim()).ok())
                .and_then(|b| String::from_utf8(b).ok());
            match decoded.as_deref().and_then(|s| s.split_once(':')) {
                Some((user, secret)) => m.device(user, secret),
                None => Err(ApiError::Unauthenticated(
                    "a device authenticates with HTTP Basic: the user and the secret of its credential".into(),
                )),
            }
        }
    }
}

fn body_json<T: serde::de::DeserializeOwned>(body: &[u8]) -> Result<T, ApiError> {
    let body = if body.iter().all(u8::is_ascii_whitespace) { b"{}".as_slice() } else { body };
    serde_json::from_slice(body).map_err(|e| ApiError::BadRequest(format!("request body: {e}")))
}

/// Method, path and body → one action. The manager's whole surface.
pub fn translate(method: &Method, path: &str, query: Option<&str>, body: &[u8]) -> Result<Action, ApiError> {
    let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
    let not_found = || ApiError::NotFound(format!("no route {method} {path}"));
    let action = match (method, segs.as_slice()) {
        (&Method::POST, ["v1", "users"]) => Action::AddUser(body_json(body)?),
        (&Method::GET, ["v1", "users"]) => Action::ListUsers,
        (&Method::DELETE, ["v1", "users", u]) => Action::RemoveUser((*u).to_owned()),
        (&Method::GET, ["v1", "instances"]) => Action::List,
        (&Method::POST, ["v1", "instances"]) => Action::Create(body_json(body)?),
        (&Method::GET, ["v1", "instances", id]) => Action::Status((*id).to_owned()),
        (&Method::DELETE, ["v1", "instances", id]) => Action::Delete((*id).to_owned()),
        (&Method::POST, ["v1", "instances", id, op]) => {
            let id = (*id).to_owned();
            match *op {
                "start" => Action::Start(id),
                "stop" => Action::Stop(id),
                "revoke" => Action::Revoke(id),
                "restore" => Action::Restore(id),
                _ => return Err(not_found()),
            }
        }
        (&Method::GET, ["v1", "instances", id, "logs"]) => {
            let lines = match query.unwrap_or("").split('&').find_map(|kv| kv.strip_prefix("lines=")) {
                None => 50,
                Some(n) => n
                    .parse::<usize>()
                    .ok()
                    .filter(|n| (1..=1000).contains(n))
                    .ok_or_else(|| ApiError::BadRequest(format!("lines={n}: a number from 1 to 1000")))?,
            };
            Action::Logs { id: (*id).to_owned(), lines }
        }
        (&Method::GET, ["v1", "instances", id, "enrolment"]) => Action::Enrolment((*id).to_owned()),
        (&Method::POST, ["v1", "join"]) => Action::Join(body_json(body)?),
        (&Method::POST, ["v1", "leave"]) => Action::Leave(body_json(body)?),
        _ => {
            return Err(match allowed(&segs) {
                Some(allow) => ApiError::MethodNotAllowed { allow },
                None => not_found(),
            })
        }
    };
    Ok(action)
}

/// The methods of a known path (for 405 and `Allow`), `None` for an unknown one.
fn allowed(segs: &[&str]) -> Option<&'static str> {
    Some(match segs {
        ["v1", "users"] | ["v1", "instances"] => "GET, POST",
        ["v1", "users", _] => "DELETE",
        ["v1", "instances", _] => "GET, DELETE",
        ["v1", "instances", _, "start" | "stop" | "revoke" | "restore"] | ["v1", "join"] | ["v1", "leave"] => "POST",
        ["v1", "instances", _, "logs" | "enrolment"] | ["healthz"] | ["metrics"] | [""] => "GET",
        _ => return None,
    })
}

fn answer(reply: Reply) -> Response<Full<Bytes>> {
    match reply {
        Reply::Instance(v, created) => json(if created { 201 } else { 200 }, &v),
        Reply::Instances(v) => json(200, &serde_json::json!({"instances": v})),
        Reply::User(v, created) => json(if created { 201 } else { 200 }, &v),
        Reply::Users(v) => json(200, &serde_json::json!({"users": v})),
        Reply::Logs(t) => json(200, &serde_json::json!({"lines": t})),
        Reply::Enrolment(e) => json(200, &e),
        Reply::Joined(j) => json(200, &j),
        Reply::Done => {
            let mut r = Response::new(Full::new(Bytes::new()));
            *r.status_mut() = StatusCode::NO_CONTENT;
            r
        }
    }
}

/// Answers one request.
pub async fn route(m: Arc<Manager>, which: Listener, req: Request<Incoming>) -> Result<Response<Full<Bytes>>, Infallible> {
    let (parts, body) = req.into_parts();
    let path = parts.uri.path().to_owned();
    match (&parts.method, path.as_str(), which) {
        (&Method::GET, "/healthz", _) => return Ok(text(StatusCode::OK, "text/plain; charset=utf-8", "ok\n".into())),
        (&Method::GET, "/metrics", Listener::Operator) => {
            return Ok(text(StatusCode::OK, "text/plain; version=0.0.4; charset=utf-8", m.metrics.render(&m.list(&Caller::Operator))));
        }
        (&Method::GET, "/", Listener::Operator) => {
            let (have, missing) = m.backends();
            let have: Vec<String> = have.iter().map(|k| k.name().to_owned()).collect();
            let missing: Vec<(String, String)> = missing.into_iter().map(|(k, v)| (k.name().to_owned(), v)).collect();
            return Ok(text(
                StatusCode::OK,
                "text/html; charset=utf-8",
                crate::status_page::render(&m.list(&Caller::Operator), &have, &missing),
            ));
        }
        _ => {}
    }
    if !path.starts_with("/v1/") {
        let segs: Vec<&str> = path.trim_end_matches('/').split('/').skip(1).collect();
        let known = matches!((which, segs.as_slice()), (_, ["healthz"]) | (Listener::Operator, ["metrics"] | [] | [""]));
        return Ok(error(&if known {
            ApiError::MethodNotAllowed { allow: "GET" }
        } else {
            ApiError::NotFound(format!("no route {} {path}", parts.method))
        }));
    }
    let caller = match authenticate(&m, which, &parts.headers) {
        Ok(c) => c,
        Err(e) => return Ok(error(&e)),
    };
    let body = match tokio::time::timeout(Duration::from_secs(10), Limited::new(body, MAX_BODY).collect()).await {
        Ok(Ok(b)) => b.to_bytes(),
        Ok(Err(_)) => return Ok(error(&ApiError::BadRequest(format!("request body over {MAX_BODY} bytes, or cut")))),
        Err(_) => return Ok(error(&ApiError::BadRequest("request body not received within 10 s".into()))),
    };
    let action = match translate(&parts.method, &path, parts.uri.query(), &body) {
        Ok(a) => a,
        Err(e) => return Ok(error(&e)),
    };
    Ok(match m.handle(&caller, action).await {
        Ok(r) => answer(r),
        Err(e) => error(&e),
    })
}

/// Serves one listener forever.
pub async fn serve(m: Arc<Manager>, which: Listener, listener: TcpListener, tls: Option<tokio_rustls::TlsAcceptor>) {
    let permits = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer): (tokio::net::TcpStream, SocketAddr) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("accept: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let m = m.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let _permit = permit;
            let svc = hyper::service::service_fn(move |req| route(m.clone(), which, req));
            let mut builder = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new());
            builder.http1().timer(TokioTimer::new()).header_read_timeout(Duration::from_secs(10));
            let result = match tls {
                Some(acceptor) => match tokio::time::timeout(Duration::from_secs(10), acceptor.accept(stream)).await {
                    Ok(Ok(s)) => builder.serve_connection(TokioIo::new(s), svc).await,
                    _ => return,
                },
                None => builder.serve_connection(TokioIo::new(stream), svc).await,
            };
            if let Err(e) = result {
                tracing::debug!(%peer, "connection: {e}");
            }
        });
    }
}
