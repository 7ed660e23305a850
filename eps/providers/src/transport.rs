//! The one HTTP client every provider request goes through: building the
//! wire request from a [`ProviderRequest`], streaming the body, enforcing
//! the timeouts of §6.0, reading the response within its size bound, and
//! turning transport failures into [`ProcError`]s with the right stage.
//!
//! It is hyper's client (pooled, HTTP/1.1 and HTTP/2 by ALPN) over rustls
//! with the webpki roots plus configured CAs, and a resolver that answers
//! lab host overrides first and asks hickory-dns otherwise. Design
//! decisions:
//!
//! - hyper rather than reqwest: reqwest adds `accept: */*` to every
//!   request without one, and the EPS may add nothing but `Host` and
//!   `Content-Length` (§4.3.1). hyper adds only `Host` (HTTP/1) and the
//!   `Content-Length` we set. Nothing follows redirects or decompresses.
//! - `Content-Length` is set by us for every non-empty body and for
//!   `POST`/`PUT`/`PATCH` (some front ends answer 411 to a body-less POST
//!   without it), so no request is ever sent chunked.
//! - Header order: fields go out in the app's order, except that a
//!   repeated name is sent together with its first occurrence (hyper's
//!   `HeaderMap` groups values by name). Responses come back the same way.
//! - The only retry is hyper's own for a request that failed before a
//!   single byte of it was written on a reused pooled connection; that is
//!   not a provider request being sent twice.
//! - Timeouts: `idle_timeout` between body frames sent (256 KiB each) and
//!   received, `response_timeout` from the end of the body to the response
//!   head; connect covers TCP, and TLS is bounded by the idle timeout.

use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::dns::Name;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioTimer};
use tokio::time::Instant;

use crate::config::UpstreamConfig;
use crate::error::{ConfigError, ProcError, ProcErrorKind};
use crate::redact::{header_for_log, url_for_log};
use crate::types::{Body, Feed, FileFeed, Provider, ProviderRequest, ProviderResponse};

type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Body frames are at most this long, so sending progress is observable
/// (idle timeout, the mid-upload fail point) without copying the file.
const FRAME: usize = 256 * 1024;

/// Response fields §4.6.1 leaves out.
const DROPPED_RESPONSE_FIELDS: &[&str] =
    &["connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "content-length"];

/// Resolves lab overrides first, then DNS through hickory (built on first
/// use: a lab run with overrides only needs no resolv.conf).
#[derive(Clone)]
struct Resolver {
    overrides: Arc<HashMap<String, SocketAddr>>,
    dns: Arc<tokio::sync::OnceCell<hickory_resolver::TokioResolver>>,
}

impl tower_service::Service<Name> for Resolver {
    type Response = std::vec::IntoIter<SocketAddr>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, name: Name) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let host = name.as_str().to_ascii_lowercase();
            if let Some(addr) = this.overrides.get(&host) {
                return Ok(vec![*addr].into_iter());
            }
            let dns = this.dns.get_or_try_init(|| async { hickory_resolver::TokioResolver::builder_tokio().map(|b| b.build()) }).await?;
            let ips = dns.lookup_ip(host.as_str()).await?;
            // Port 0: the connector puts in the URL's port.
            Ok(ips.iter().map(|ip| SocketAddr::new(ip, 0)).collect::<Vec<_>>().into_iter())
        })
    }
}

/// Sending progress of one request body, shared with the watchdog.
#[derive(Debug)]
struct Progress {
    last: Instant,
    done: Option<Instant>,
}

/// A request body streamed from shared `Bytes` in frames of [`FRAME`], or,
/// for a streamed save, from a [`FileFeed`] between the parts before and
/// after the file.
struct SendBody {
    frames: std::collections::VecDeque<Bytes>,
    total: u64,
    sent: u64,
    progress: Arc<Mutex<Progress>>,
    /// Evaluate `providers::mid_upload` half-way (SINGLE only).
    mid_failpoint: bool,
    /// A streamed file: the frames above are the bytes before it.
    feed: Option<FeedState>,
}

/// The file of a streamed body while it arrives.
struct FeedState {
    rx: tokio::sync::mpsc::Receiver<Feed>,
    /// The file's declared size and how much of it came as `Data`.
    len: u64,
    got: u64,
    /// The frames after the file (a multipart body's closing part).
    after: std::collections::VecDeque<Bytes>,
    /// Where `Done` leaves the whole file.
    file: Arc<Mutex<Option<Bytes>>>,
}

fn frames_of(parts: Vec<Bytes>) -> std::collections::VecDeque<Bytes> {
    let mut frames = std::collections::VecDeque::new();
    for part in parts {
        let mut at = 0;
        while at < part.len() {
            let end = (at + FRAME).min(part.len());
            frames.push_back(part.slice(at..end));
            at = end;
        }
    }
    frames
}

impl SendBody {
    fn new(parts: Vec<Bytes>, mid_failpoint: bool) -> (Self, Arc<Mutex<Progress>>) {
        let frames = frames_of(parts);
        let total = frames.iter().map(|f| f.len() as u64).sum();
        let now = Instant::now();
        let progress = Arc::new(Mutex::new(Progress { last: now, done: (total == 0).then_some(now) }));
        (Self { frames, total, sent: 0, progress: progress.clone(), mid_failpoint, feed: None }, progress)
    }

    /// `before` ‖ the fed file ‖ `after`; the file lands in `file` once `Done` came.
    fn streamed(before: Vec<Bytes>, feed: FileFeed, after: Vec<Bytes>, file: Arc<Mutex<Option<Bytes>>>) -> (Self, Arc<Mutex<Progress>>) {
        let frames = frames_of(before);
        let after = frames_of(after);
        let total = frames.iter().chain(after.iter()).map(|f| f.len() as u64).sum::<u64>() + feed.len;
        let progress = Arc::new(Mutex::new(Progress { last: Instant::now(), done: None }));
        let state = FeedState { rx: feed.rx, len: feed.len, got: 0, after, file };
        (Self { frames, total, sent: 0, progress: progress.clone(), mid_failpoint: true, feed: Some(state) }, progress)
    }

    /// The next frame of a streamed file (`None`: the file is complete, go on with what follows it).
    fn poll_feed(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<Bytes, BoxError>>> {
        let Some(feed) = self.feed.as_mut() else { return Poll::Ready(None) };
        if feed.got == feed.len {
            return Poll::Ready(None);
        }
        match feed.rx.poll_recv(cx) {
            Poll::Pending => Poll::Pending,
            // The producer gave up (the rebuild or its verification failed):
            // the body fails, hyper closes the connection short of its Content-Length.
            Poll::Ready(None) => Poll::Ready(Some(Err("the streamed file was not verified; upload aborted".into()))),
            Poll::Ready(Some(Feed::Data(b))) => {
                // At least one byte of the file waits for `Done`.
                if feed.got + b.len() as u64 >= feed.len {
                    return Poll::Ready(Some(Err("the streamed file's data reached its end before it was verified".into())));
                }
                feed.got += b.len() as u64;
                Poll::Ready(Some(Ok(b)))
            }
            Poll::Ready(Some(Feed::Done { tail, file })) => {
                if feed.got + tail.len() as u64 != feed.len || file.len() as u64 != feed.len {
                    return Poll::Ready(Some(Err("the streamed file does not have its declared size".into())));
                }
                feed.got = feed.len;
                *feed.file.lock().expect("file lock") = Some(file);
                let after = std::mem::take(&mut feed.after);
                self.frames.extend(after);
                Poll::Ready(Some(Ok(tail)))
            }
        }
    }
}

fn mid_upload_abort() -> bool {
    fail::fail_point!("providers::mid_upload", |_| true);
    false
}

impl http_body::Body for SendBody {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        if self.mid_failpoint && self.sent * 2 >= self.total && self.sent > 0 {
            self.mid_failpoint = false;
            if mid_upload_abort() {
                return Poll::Ready(Some(Err("upload aborted by the providers::mid_upload fail point".into())));
            }
        }
        // The bytes before the file (or the whole body), then the fed file,
        // then what follows it (queued when `Done` arrives).
        let frame = match self.frames.pop_front() {
            Some(f) => f,
            None => match self.poll_feed(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(b))) => b,
                Poll::Ready(None) => return Poll::Ready(None),
            },
        };
        self.sent += frame.len() as u64;
        let now = Instant::now();
        let mut p = self.progress.lock().expect("progress lock");
        p.last = now;
        if self.sent == self.total {
            p.done = Some(now);
        }
        drop(p);
        Poll::Ready(Some(Ok(Frame::data(frame))))
    }

    fn is_end_stream(&self) -> bool {
        self.sent == self.total
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::with_exact(self.total - self.sent)
    }
}

/// Per-procedure accounting, shared by the requests of a procedure that
/// run at once (a Dropbox batch's sessions), and the stage.
///
/// Stage 0 means no provider can have seen a byte: every request handed
/// to the client so far failed to connect. A request in flight counts as
/// possibly sent, so concurrent failures err towards stage 1.
#[derive(Debug, Default)]
pub(crate) struct Ledger {
    calls: AtomicU32,
    connect_failures: AtomicU32,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    /// Each request's status (`None`: it got no response), in completion order.
    statuses: Mutex<Vec<Option<u16>>>,
}

impl Ledger {
    pub(crate) fn statuses(&self) -> Vec<Option<u16>> {
        self.statuses.lock().map(|s| s.clone()).unwrap_or_default()
    }
    fn record(&self, status: Option<u16>) {
        if let Ok(mut s) = self.statuses.lock() {
            s.push(status);
        }
    }
    pub(crate) fn stage(&self) -> u8 {
        u8::from(self.calls.load(Ordering::SeqCst) > self.connect_failures.load(Ordering::SeqCst))
    }
    pub(crate) fn calls(&self) -> u32 {
        self.calls.load(Ordering::SeqCst)
    }
    pub(crate) fn bytes_sent(&self) -> u64 {
        self.bytes_sent.load(Ordering::SeqCst)
    }
    pub(crate) fn bytes_received(&self) -> u64 {
        self.bytes_received.load(Ordering::SeqCst)
    }
}

/// How large a response body may be, by status.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BodyLimit {
    pub(crate) ok_200: u64,
    pub(crate) other: u64,
}

/// What to do with one request.
pub(crate) struct Outgoing<'a> {
    pub(crate) provider: Provider,
    pub(crate) procedure: &'static str,
    pub(crate) step: &'static str,
    pub(crate) request: &'a ProviderRequest,
    pub(crate) mid_failpoint: bool,
}

type Built = (http::Request<SendBody>, Arc<Mutex<Progress>>, u64);

/// A fed file and the slot its `Done` fills with the whole file.
pub(crate) type StreamedFile = (FileFeed, Arc<Mutex<Option<Bytes>>>);

pub(crate) struct Transport {
    client: Client<HttpsConnector<HttpConnector<Resolver>>, SendBody>,
    cfg: Arc<UpstreamConfig>,
}

impl std::fmt::Debug for Transport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Transport").finish_non_exhaustive()
    }
}

fn tls_config(cfg: &UpstreamConfig) -> Result<rustls::ClientConfig, ConfigError> {
    let mut roots = rustls::RootCertStore { roots: webpki_roots::TLS_SERVER_ROOTS.to_vec() };
    for (index, pem) in cfg.extra_root_ca_pem.iter().enumerate() {
        let bad = |reason: String| ConfigError::BadRootCa { index, reason };
        let certs: Vec<_> = rustls_pemfile::certs(&mut pem.as_slice()).collect::<Result<_, _>>().map_err(|e| bad(e.to_string()))?;
        if certs.is_empty() {
            return Err(bad("no CERTIFICATE block".into()));
        }
        for cert in certs {
            roots.add(cert).map_err(|e| bad(e.to_string()))?;
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    Ok(rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| ConfigError::Tls(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth())
}

impl Transport {
    pub(crate) fn new(cfg: Arc<UpstreamConfig>) -> Result<Self, ConfigError> {
        let resolver = Resolver {
            overrides: Arc::new(cfg.resolve.iter().map(|(h, a)| (h.to_ascii_lowercase(), *a)).collect()),
            dns: Arc::new(tokio::sync::OnceCell::new()),
        };
        let mut http = HttpConnector::new_with_resolver(resolver);
        http.enforce_http(false);
        http.set_nodelay(true);
        http.set_connect_timeout(Some(cfg.connect_timeout));
        let https = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(tls_config(&cfg)?)
            .https_or_http()
            .enable_http1()
            .enable_http2()
            .wrap_connector(http);
        let client = Client::builder(TokioExecutor::new())
            .timer(TokioTimer::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(std::time::Duration::from_secs(60))
            .build(https);
        Ok(Self { client, cfg })
    }

    /// Whether `uri`'s scheme may be used: `https`, or `http` for the
    /// configured lab hosts.
    pub(crate) fn scheme_allowed(&self, uri: &http::Uri) -> bool {
        match uri.scheme_str() {
            Some("https") => true,
            Some("http") => {
                let host = uri.host().unwrap_or("");
                self.cfg.allow_plain_http_hosts.iter().any(|p| p.matches(host))
            }
            _ => false,
        }
    }

    /// The wire request, its body's progress, and the bytes it will send.
    fn build(&self, s: &Outgoing<'_>, stage: u8, feed: Option<StreamedFile>) -> Result<Built, ProcError> {
        let r = s.request;
        let invalid = |what: &str| ProcError::new(ProcErrorKind::Invalid, stage, format!("{} request: {what}", s.step));
        let uri: http::Uri = r.url.parse().map_err(|_| invalid("URL does not parse"))?;
        if !self.scheme_allowed(&uri) {
            return Err(ProcError::new(
                ProcErrorKind::HostForbidden,
                stage,
                format!("{} request: scheme {} not allowed for this host", s.step, uri.scheme_str().unwrap_or("none")),
            ));
        }
        let mut headers = http::HeaderMap::with_capacity(r.headers.len() + 1);
        let mut head_len = r.method.as_str().len() + r.url.len() + 2;
        for (name, value) in &r.headers {
            let n = http::HeaderName::from_bytes(name.as_bytes()).map_err(|_| invalid("bad header name"))?;
            let v = http::HeaderValue::from_bytes(value).map_err(|_| invalid("bad header value"))?;
            head_len += name.len() + value.len() + 3;
            headers.append(n, v);
        }
        // A streamed file stands in for the (empty) file of the request's body:
        // the Content-Length is declared up front all the same (§5.6), so a
        // body cut short is never a complete request.
        let (body, progress, body_len) = match feed {
            None => {
                let (body, progress) = SendBody::new(r.body.parts(), s.mid_failpoint);
                (body, progress, r.body.len())
            }
            Some((feed, slot)) => {
                let (before, after) = match &r.body {
                    Body::File(f) if f.is_empty() => (vec![], vec![]),
                    Body::Wrapped { prefix, file, suffix } if file.is_empty() => (vec![prefix.clone()], vec![suffix.clone()]),
                    _ => return Err(invalid("a streamed file needs a FILE or WRAPPED body without the file")),
                };
                if feed.len == 0 {
                    return Err(invalid("an empty file is not streamed"));
                }
                let (body, progress) = SendBody::streamed(before, feed, after, slot);
                let len = body.total;
                (body, progress, len)
            }
        };
        if body_len > 0 || matches!(r.method, http::Method::POST | http::Method::PUT | http::Method::PATCH) {
            headers.insert(http::header::CONTENT_LENGTH, http::HeaderValue::from(body_len));
        }
        let mut req = http::Request::new(body);
        *req.method_mut() = r.method.clone();
        *req.uri_mut() = uri;
        *req.headers_mut() = headers;
        Ok((req, progress, head_len as u64 + body_len))
    }

    /// Sends one request, once, and reads its whole response.
    pub(crate) async fn send(&self, ledger: &Ledger, s: Outgoing<'_>, limit: BodyLimit) -> Result<ProviderResponse, ProcError> {
        self.send_with(ledger, s, limit, None).await
    }

    /// [`Transport::send`]; with `feed`, the request's file is fed as it is
    /// produced (§5.6), and `Done` leaves the whole file in the feed's slot.
    pub(crate) async fn send_with(
        &self,
        ledger: &Ledger,
        s: Outgoing<'_>,
        limit: BodyLimit,
        feed: Option<StreamedFile>,
    ) -> Result<ProviderResponse, ProcError> {
        let (req, progress, out_bytes) = self.build(&s, ledger.stage(), feed)?;
        let started = Instant::now();
        let url = url_for_log(&s.request.url);
        ledger.calls.fetch_add(1, Ordering::SeqCst);
        ledger.bytes_sent.fetch_add(out_bytes, Ordering::SeqCst);
        let mut result = self.exchange(req, &progress, limit).await;
        if let Err(e) = &mut result {
            if e.kind == ProcErrorKind::Unreachable {
                // This request never left; the stage is whatever the others made it.
                ledger.connect_failures.fetch_add(1, Ordering::SeqCst);
                e.stage = ledger.stage();
            }
        }
        let ms = started.elapsed().as_millis() as u64;
        ledger.record(result.as_ref().ok().map(|(resp, _)| resp.status));
        match &result {
            Ok((resp, _)) => {
                let logged: Vec<String> = resp
                    .headers
                    .iter()
                    .filter(|(n, _)| matches!(n.as_str(), "retry-after" | "x-dropbox-request-id" | "request-id" | "x-request-id"))
                    .map(|(n, v)| format!("{n}={}", header_for_log(n, v)))
                    .collect();
                tracing::info!(provider = s.provider.name(), procedure = s.procedure, step = s.step,
                    method = %s.request.method, url = %url, status = resp.status, ms, headers = ?logged, "provider request");
            }
            Err(e) => tracing::warn!(provider = s.provider.name(), procedure = s.procedure, step = s.step,
                method = %s.request.method, url = %url, error = e.kind.code(), stage = e.stage, ms, "provider request failed"),
        }
        let (resp, in_bytes) = result?;
        ledger.bytes_received.fetch_add(in_bytes, Ordering::SeqCst);
        Ok(resp)
    }

    async fn exchange(
        &self,
        req: http::Request<SendBody>,
        progress: &Mutex<Progress>,
        limit: BodyLimit,
    ) -> Result<(ProviderResponse, u64), ProcError> {
        let fut = self.client.request(req);
        tokio::pin!(fut);
        // Watchdog: idle timeout while the body is being sent, response
        // timeout once it has been.
        let response = loop {
            let deadline = {
                let p = progress.lock().expect("progress lock");
                match p.done {
                    Some(done) => done.max(p.last) + self.cfg.response_timeout,
                    None => p.last + self.cfg.idle_timeout,
                }
            };
            tokio::select! {
                r = &mut fut => break r.map_err(|e| map_send_error(&e))?,
                () = tokio::time::sleep_until(deadline) => {
                    let p = progress.lock().expect("progress lock");
                    let now = Instant::now();
                    let expired = match p.done {
                        Some(done) => now >= done.max(p.last) + self.cfg.response_timeout,
                        None => now >= p.last + self.cfg.idle_timeout,
                    };
                    if expired {
                        let what = if p.done.is_some() { "no response head in time" } else { "request body stalled" };
                        return Err(ProcError::new(ProcErrorKind::Timeout, 1, what));
                    }
                }
            }
        };
        let (parts, mut body) = response.into_parts();
        let status = parts.status.as_u16();
        let reason = match parts.extensions.get::<hyper::ext::ReasonPhrase>() {
            Some(r) => String::from_utf8_lossy(r.as_bytes()).into_owned(),
            None if parts.version < http::Version::HTTP_2 => parts.status.canonical_reason().unwrap_or("").to_owned(),
            None => String::new(),
        };
        let mut in_bytes = 4 + reason.len() as u64;
        let mut headers = Vec::with_capacity(parts.headers.len());
        for (name, value) in &parts.headers {
            in_bytes += (name.as_str().len() + value.len() + 3) as u64;
            if !DROPPED_RESPONSE_FIELDS.contains(&name.as_str()) {
                headers.push((name.as_str().to_owned(), value.as_bytes().to_vec()));
            }
        }
        let max = if status == 200 { limit.ok_200 } else { limit.other };
        let mut buf = bytes::BytesMut::new();
        loop {
            let frame = match tokio::time::timeout(self.cfg.idle_timeout, body.frame()).await {
                Err(_) => return Err(ProcError::new(ProcErrorKind::Timeout, 1, "response body stalled")),
                Ok(None) => break,
                Ok(Some(Err(e))) => return Err(map_body_error(&e)),
                Ok(Some(Ok(frame))) => frame,
            };
            if let Ok(data) = frame.into_data() {
                if buf.len() as u64 + data.len() as u64 > max {
                    return Err(ProcError::protocol(format!("response body over {max} bytes (status {status})")));
                }
                buf.extend_from_slice(&data);
            }
        }
        in_bytes += buf.len() as u64;
        Ok((ProviderResponse { status, reason, headers, body: buf.freeze() }, in_bytes))
    }
}

fn hyper_source<'e>(e: &'e (dyn std::error::Error + 'static)) -> Option<&'e hyper::Error> {
    let mut cur: Option<&'e (dyn std::error::Error + 'static)> = Some(e);
    while let Some(err) = cur {
        if let Some(h) = err.downcast_ref::<hyper::Error>() {
            return Some(h);
        }
        cur = err.source();
    }
    None
}

fn map_send_error(e: &hyper_util::client::legacy::Error) -> ProcError {
    if e.is_connect() {
        // DNS, TCP or TLS: this request never left (stage set by the caller).
        return ProcError::new(ProcErrorKind::Unreachable, 1, "could not connect to the provider (DNS, TCP or TLS)");
    }
    match hyper_source(e) {
        Some(h) if h.is_parse() || h.is_parse_status() => ProcError::protocol("unreadable provider response head"),
        Some(h) if h.is_timeout() => ProcError::new(ProcErrorKind::Timeout, 1, "provider timed out"),
        Some(h) if h.is_user() => ProcError::new(ProcErrorKind::Truncated, 1, "request aborted while sending"),
        _ => ProcError::new(ProcErrorKind::Truncated, 1, "connection closed before a complete response"),
    }
}

fn map_body_error(e: &hyper::Error) -> ProcError {
    if e.is_timeout() {
        ProcError::new(ProcErrorKind::Timeout, 1, "response body timed out")
    } else {
        ProcError::new(ProcErrorKind::Truncated, 1, "response body ended early")
    }
}
