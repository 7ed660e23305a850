//! [`Upstream`]: the service's handle on the providers. It owns the one
//! pooled HTTP client and the configuration, checks a procedure before
//! anything is sent (shape, hosts: stage 0), runs it within `op_timeout`,
//! and performs downloads (§6.8).

use std::sync::Arc;

use crate::config::UpstreamConfig;
use crate::error::{ConfigError, ProcError, ProcErrorKind};
use crate::procedures::{self, Run};
use crate::transport::{BodyLimit, Ledger, Outgoing, Transport};
use crate::types::{Body, Fetched, FileFeed, Performed, Procedure, Provider, ProviderRequest, ProviderResponse};
use crate::{hashes, redact};

/// Request fields the transport derives or that are hop-by-hop (§4.3.1);
/// a request carrying one is refused before anything is sent.
const FORBIDDEN_REQUEST_FIELDS: &[&str] = &[
    "host",
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
    "expect",
];

/// Performs provider procedures and downloads over one shared client.
#[derive(Debug)]
pub struct Upstream {
    pub(crate) cfg: Arc<UpstreamConfig>,
    pub(crate) transport: Transport,
}

impl Upstream {
    /// Builds the client (trust store, resolver, pool) from `cfg`.
    pub fn new(cfg: UpstreamConfig) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let cfg = Arc::new(cfg);
        let transport = Transport::new(cfg.clone())?;
        Ok(Self { cfg, transport })
    }

    /// The configuration in use.
    pub fn config(&self) -> &UpstreamConfig {
        &self.cfg
    }

    /// Whether `url` may be sent to for `provider`: https (or lab http),
    /// and a host on the provider's allowlist.
    pub(crate) fn check_url(&self, provider: Provider, url: &str, stage: u8) -> Result<http::Uri, ProcError> {
        let forbidden = |what: &str| ProcError::new(ProcErrorKind::HostForbidden, stage, what.to_owned());
        let uri: http::Uri = url.parse().map_err(|_| forbidden("URL does not parse"))?;
        let host = uri.host().ok_or_else(|| forbidden("URL has no host"))?;
        if uri.authority().is_some_and(|a| a.as_str().contains('@')) {
            return Err(forbidden("URL carries userinfo"));
        }
        if !self.transport.scheme_allowed(&uri) {
            return Err(forbidden(&format!("scheme {} not allowed for host {host}", uri.scheme_str().unwrap_or("none"))));
        }
        if !self.cfg.hosts(provider).iter().any(|p| p.matches(host)) {
            return Err(forbidden(&format!("host {host} is not on the {} allowlist", provider.name())));
        }
        Ok(uri)
    }

    /// Stage-0 host check of every URL the procedure will address that is
    /// known before sending (provider-given URLs are checked on arrival).
    pub fn check_hosts(&self, provider: Provider, procedure: &Procedure) -> Result<(), ProcError> {
        for r in procedure.app_requests() {
            self.check_url(provider, &r.url, 0)?;
        }
        for url in procedures::derived_urls(procedure)? {
            self.check_url(provider, &url, 0)?;
        }
        Ok(())
    }

    /// Stage-0 shape check (§6.1–§6.6 `invalid_request` rules) and host check.
    pub fn check(&self, provider: Provider, procedure: &Procedure) -> Result<(), ProcError> {
        for r in procedure.app_requests() {
            check_request_fields(r)?;
        }
        procedures::validate(procedure)?;
        self.check_hosts(provider, procedure)
    }

    /// Performs `procedure` (§6) and returns the provider response to hand
    /// back to the app. Every provider request is sent at most once.
    pub async fn perform(&self, provider: Provider, procedure: Procedure) -> Result<Performed, ProcError> {
        self.check(provider, &procedure)?;
        fail::fail_point!("providers::before_first_request", |_| {
            Err(ProcError::new(ProcErrorKind::Unreachable, 0, "fail point providers::before_first_request"))
        });
        let ledger = Ledger::default();
        let run = Run { up: self, provider, procedure: procedure.name(), ledger: &ledger };
        let outcome = tokio::time::timeout(self.cfg.op_timeout, procedures::perform(&run, &procedure)).await;
        self.performed(provider, procedure.name(), &ledger, outcome)
    }

    /// Performs a SINGLE procedure whose file is still being produced (spec
    /// §5.6): its request's body holds no file (`File` or `Wrapped` with an
    /// empty file) and `feed` brings it. The request declares the whole
    /// body's `Content-Length` and goes out at once; the file's bytes follow
    /// as they are fed, and its last bytes only with the feed's `Done`, sent
    /// once the file is verified. A feed that ends without `Done` aborts the
    /// request short of its length (an error, stage 1 as any request that
    /// may have reached the provider; the caller knows the body was never
    /// completed). Checks, fail points and accounting are [`Upstream::perform`]'s.
    pub async fn perform_streamed(&self, provider: Provider, procedure: Procedure, feed: FileFeed) -> Result<Performed, ProcError> {
        self.check(provider, &procedure)?;
        let Procedure::Single { request } = procedure else {
            return Err(ProcError::invalid("only a SINGLE procedure is streamed"));
        };
        fail::fail_point!("providers::before_first_request", |_| {
            Err(ProcError::new(ProcErrorKind::Unreachable, 0, "fail point providers::before_first_request"))
        });
        let ledger = Ledger::default();
        let run = Run { up: self, provider, procedure: "single", ledger: &ledger };
        let slot = Arc::new(std::sync::Mutex::new(None));
        let fut = async {
            let response = run.send_streamed("single", &request, (feed, slot.clone())).await?;
            // The file is complete once its `Done` was sent; a provider that
            // answered before the body ended never saw it (no hash to compare).
            let file = slot.lock().expect("file lock").take();
            Ok(match file {
                Some(file) => procedures::one_file(provider, &[&request], &file, response),
                None => procedures::one_file_unseen(response),
            })
        };
        let outcome = tokio::time::timeout(self.cfg.op_timeout, fut).await;
        self.performed(provider, "single", &ledger, outcome)
    }

    fn performed(
        &self,
        provider: Provider,
        name: &'static str,
        ledger: &Ledger,
        outcome: Result<Result<procedures::Outcome, ProcError>, tokio::time::error::Elapsed>,
    ) -> Result<Performed, ProcError> {
        let outcome = match outcome {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(mut e)) => {
                e.call_statuses = ledger.statuses();
                return Err(e);
            }
            Err(_) => {
                let mut e = ProcError::new(ProcErrorKind::Timeout, 1, "procedure exceeded op_timeout");
                e.call_statuses = ledger.statuses();
                return Err(e);
            }
        };
        fail::fail_point!("providers::after_response", |_| {
            Err(ProcError::new(ProcErrorKind::Timeout, 1, "fail point providers::after_response"))
        });
        if outcome.hash_disagreement {
            tracing::warn!(provider = provider.name(), procedure = name, "provider hash disagrees with the file");
        }
        Ok(Performed {
            response: outcome.response,
            calls: ledger.calls(),
            call_statuses: ledger.statuses(),
            bytes_sent: ledger.bytes_sent(),
            bytes_received: ledger.bytes_received(),
            succeeded_items: outcome.succeeded_items,
            hash_disagreement: outcome.hash_disagreement,
        })
    }

    /// Performs a download (§6.8): the app's request with
    /// `accept-encoding: identity`, and with `follow_redirect` one redirect
    /// hop to an allowed host, as a `GET` without `authorization` or
    /// `cookie`.
    pub async fn fetch(&self, provider: Provider, request: ProviderRequest, follow_redirect: bool) -> Result<Fetched, ProcError> {
        check_request_fields(&request)?;
        if !matches!(request.body, Body::Empty | Body::Bytes(_)) {
            return Err(ProcError::invalid("a download request carries no file"));
        }
        self.check_url(provider, &request.url, 0)?;
        let ledger = Ledger::default();
        let fut = self.fetch_inner(provider, request, follow_redirect, &ledger);
        let result = match tokio::time::timeout(self.cfg.op_timeout, fut).await {
            Ok(r) => r,
            Err(_) => Err(ProcError::new(ProcErrorKind::Timeout, 1, "download exceeded op_timeout")),
        };
        result.map_err(|mut e| {
            e.call_statuses = ledger.statuses();
            e
        })
    }

    async fn fetch_inner(
        &self,
        provider: Provider,
        mut request: ProviderRequest,
        follow_redirect: bool,
        ledger: &Ledger,
    ) -> Result<Fetched, ProcError> {
        set_field(&mut request.headers, "accept-encoding", b"identity".to_vec());
        let limit = BodyLimit { ok_200: self.cfg.max_download_body, other: self.cfg.max_response_body };
        let send = |step, req| Outgoing { provider, procedure: "fetch", step, request: req, mid_failpoint: false };
        let first = self.transport.send(ledger, send("download", &request), limit).await?;
        let (redirect, response) = match redirect_target(&first, &request.url) {
            Some(target) if follow_redirect => {
                let target = target?;
                self.check_url(provider, &target, 1)?;
                let headers = request
                    .headers
                    .iter()
                    .filter(|(n, _)| !matches!(n.as_str(), "authorization" | "cookie" | "content-type"))
                    .cloned()
                    .collect();
                let hop = ProviderRequest { method: http::Method::GET, url: target, headers, body: Body::Empty };
                tracing::debug!(url = %redact::url_for_log(&hop.url), "following download redirect");
                let second = self.transport.send(ledger, send("download_redirect", &hop), limit).await?;
                (Some(first), second)
            }
            _ => (None, first),
        };
        let identity = response.header("content-encoding").is_none_or(|v| v.eq_ignore_ascii_case(b"identity"));
        let hash_disagreement = response.status == 200 && identity && hashes::download_disagrees(provider, &response) == Some(true);
        if hash_disagreement {
            tracing::warn!(provider = provider.name(), "downloaded body disagrees with the provider's hash");
        }
        let body_checked = response.status == 200 && identity && !hash_disagreement;
        Ok(Fetched { redirect, response, call_statuses: ledger.statuses(), hash_disagreement, body_checked })
    }
}

/// Where a redirect response points, resolved against the request URL
/// (absolute, or an absolute path); `None` when it is not a redirect.
fn redirect_target(resp: &ProviderResponse, request_url: &str) -> Option<Result<String, ProcError>> {
    if !matches!(resp.status, 301 | 302 | 303 | 307 | 308) {
        return None;
    }
    let Some(location) = resp.header("location") else {
        return Some(Err(ProcError::protocol("redirect without a location")));
    };
    let location = match std::str::from_utf8(location) {
        Ok(l) => l.trim(),
        Err(_) => return Some(Err(ProcError::protocol("redirect location is not text"))),
    };
    if location.starts_with('/') && !location.starts_with("//") {
        let Ok(base) = request_url.parse::<http::Uri>() else {
            return Some(Err(ProcError::protocol("request URL does not parse")));
        };
        let origin = format!("{}://{}", base.scheme_str().unwrap_or("https"), base.authority().map_or("", |a| a.as_str()));
        return Some(Ok(format!("{origin}{location}")));
    }
    if location.parse::<http::Uri>().is_ok_and(|u| u.scheme().is_some() && u.host().is_some()) {
        Some(Ok(location.to_owned()))
    } else {
        Some(Err(ProcError::protocol("redirect location is not an absolute URL")))
    }
}

/// Replaces the first field `name` in place (dropping later repeats), or
/// appends it.
pub(crate) fn set_field(headers: &mut Vec<(String, Vec<u8>)>, name: &str, value: Vec<u8>) {
    match headers.iter().position(|(n, _)| n == name) {
        Some(i) => {
            headers[i].1 = value;
            let mut seen = 0;
            headers.retain(|(n, _)| {
                n != name || {
                    seen += 1;
                    seen == 1
                }
            });
        }
        None => headers.push((name.to_owned(), value)),
    }
}

fn check_request_fields(r: &ProviderRequest) -> Result<(), ProcError> {
    for (name, _) in &r.headers {
        let lower = name.bytes().all(|b| !b.is_ascii_uppercase());
        if !lower || name.is_empty() || name.starts_with(':') || FORBIDDEN_REQUEST_FIELDS.contains(&name.as_str()) {
            return Err(ProcError::invalid("a request carries a field the EPS derives, a hop-by-hop field, or an upper-case name"));
        }
    }
    Ok(())
}
