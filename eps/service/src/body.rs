//! Reading a request body with bounds (spec §5.1, §14; issue 8).
//!
//! Before a request is authenticated the EPS reads at most `max_envelope`
//! bytes of it (plus one network read), within `envelope_timeout`, and
//! all unauthenticated requests together may buffer only a fixed budget
//! beyond the first [`FREE_PREAUTH`] bytes of each connection: one request
//! of a connection at a time has them (HTTP/2 streams of one connection
//! share them; before, each of a connection's 32 streams had its own). The
//! other requests of a connection that authenticated a request (a device's)
//! draw on a budget of their own, the device's ([`PreAuthBudget::new`]), so
//! that a flood of unauthenticated requests cannot make them `busy`. After the MAC verified, the
//! payloads are read into one buffer of exactly the declared size (reserved
//! fallibly, so a size the allocator cannot give is an answer, not an
//! abort), each read waiting at most `body_read_timeout` for bytes.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body_util::combinators::BoxBody;
use http_body_util::BodyExt;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

/// Bytes an unauthenticated request may buffer without drawing on the shared
/// budget: one request of a connection at a time ([`ConnAllowance`]).
pub const FREE_PREAUTH: usize = 16 << 10;
const UNIT: usize = 16 << 10;

/// The boxed error of a body.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Why a body could not be read.
#[derive(Debug)]
pub enum BodyError {
    /// No bytes within the read timeout (`body`) or the structured part not complete in time (`envelope`).
    Timeout(&'static str),
    /// The peer went away or broke the framing.
    Cut(String),
    /// Over a bound (the declared or the read size).
    TooLarge(u64),
    /// The shared budget of unauthenticated buffers is used up, or the allocator refused.
    Busy(&'static str),
}

/// The budgets of bytes unauthenticated requests may buffer beyond [`FREE_PREAUTH`].
#[derive(Debug, Clone)]
pub struct PreAuthBudget {
    /// Shared by all requests but those of `devices`.
    shared: Arc<Semaphore>,
    /// Shared by the requests of connections that authenticated a request
    /// before these began: the device's own, which nobody without a key
    /// can send, so no flood of others can use this up.
    devices: Arc<Semaphore>,
}

impl PreAuthBudget {
    /// `bytes` shared by unauthenticated requests, and `device_bytes` by
    /// those of connections that authenticated a request (a device's
    /// connections; the EPS gives them what `max_inflight` requests of
    /// `max_envelope` need), each rounded down to 16 KiB units.
    pub fn new(bytes: u64, device_bytes: u64) -> Self {
        let units = |b: u64| (b as usize / UNIT).max(1);
        PreAuthBudget { shared: Arc::new(Semaphore::new(units(bytes))), devices: Arc::new(Semaphore::new(units(device_bytes))) }
    }
}

/// A connection's [`FREE_PREAUTH`]: held by one of its unauthenticated
/// requests at a time (an HTTP/1.1 connection runs one request at a time;
/// the streams of an HTTP/2 connection draw on the shared budget while
/// another holds it).
#[derive(Debug, Clone)]
pub struct ConnAllowance(Arc<Semaphore>);

impl ConnAllowance {
    /// A connection's allowance.
    pub fn new() -> Self {
        ConnAllowance(Arc::new(Semaphore::new(1)))
    }
}

impl Default for ConnAllowance {
    fn default() -> Self {
        Self::new()
    }
}

/// A request body being read.
#[derive(Debug)]
pub struct RequestBody {
    inner: Option<BoxBody<Bytes, BoxError>>,
    buf: BytesMut,
    ended: bool,
    read_timeout: Duration,
    /// Bytes received so far.
    pub received: u64,
    budget: Option<PreAuthBudget>,
    /// Whether this request draws on the devices' budget (chosen at its first bytes).
    device: bool,
    permit: Option<OwnedSemaphorePermit>,
    /// The connection's allowance, until this request tried to take it.
    allowance: Option<ConnAllowance>,
    /// The connection's allowance, while this request holds it.
    free: Option<OwnedSemaphorePermit>,
    trusted: Option<Arc<AtomicBool>>,
}

impl RequestBody {
    /// A body arriving from the network.
    pub fn streaming(
        body: BoxBody<Bytes, BoxError>,
        read_timeout: Duration,
        budget: PreAuthBudget,
        allowance: ConnAllowance,
        trusted: Arc<AtomicBool>,
    ) -> Self {
        RequestBody {
            inner: Some(body),
            buf: BytesMut::new(),
            ended: false,
            read_timeout,
            received: 0,
            budget: Some(budget),
            device: false,
            permit: None,
            allowance: Some(allowance),
            free: None,
            trusted: Some(trusted),
        }
    }

    /// A body already in memory (tests, tools).
    pub fn from_bytes(b: Bytes) -> Self {
        RequestBody {
            inner: None,
            received: b.len() as u64,
            buf: BytesMut::from(&b[..]),
            ended: true,
            read_timeout: Duration::from_secs(30),
            budget: None,
            device: false,
            permit: None,
            allowance: None,
            free: None,
            trusted: None,
        }
    }

    /// Whether the whole body was read and consumed (the connection may be reused).
    pub fn finished(&self) -> bool {
        self.ended && self.buf.is_empty()
    }

    /// The bytes read and not taken yet.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Whether the body has ended.
    pub fn ended(&self) -> bool {
        self.ended
    }

    /// The request authenticated: its connection is a device's, and its
    /// buffer no longer counts against the unauthenticated budget.
    pub fn authenticated(&mut self) {
        self.permit = None;
        self.free = None;
        self.allowance = None;
        self.budget = None;
        if let Some(t) = &self.trusted {
            t.store(true, Ordering::Relaxed);
        }
    }

    async fn next(&mut self, deadline: Option<Instant>) -> Result<Option<Bytes>, BodyError> {
        let Some(inner) = self.inner.as_mut() else {
            return Ok(None);
        };
        loop {
            let mut wait = Instant::now() + self.read_timeout;
            let mut kind = "body";
            if let Some(d) = deadline {
                if d < wait {
                    wait = d;
                    kind = "envelope";
                }
            }
            match tokio::time::timeout_at(wait, inner.frame()).await {
                Err(_) => return Err(BodyError::Timeout(kind)),
                Ok(None) => {
                    self.ended = true;
                    return Ok(None);
                }
                Ok(Some(Err(e))) => return Err(BodyError::Cut(e.to_string())),
                Ok(Some(Ok(frame))) => {
                    if let Ok(data) = frame.into_data() {
                        self.received += data.len() as u64;
                        return Ok(Some(data));
                    }
                }
            }
        }
    }

    /// Before authentication: counts the buffer against the shared budget.
    fn charge(&mut self) -> Result<(), BodyError> {
        let Some(budget) = self.budget.as_ref() else {
            return Ok(());
        };
        if self.buf.is_empty() {
            return Ok(());
        }
        // The connection's free bytes, if no other request of it holds them,
        // and the budget for the rest: the devices' on a connection that
        // authenticated a request already (chosen once, at the request's
        // first bytes).
        if let Some(a) = self.allowance.take() {
            self.free = a.0.try_acquire_owned().ok();
            self.device = self.trusted.as_ref().is_some_and(|t| t.load(Ordering::Relaxed));
        }
        let free = if self.free.is_some() { FREE_PREAUTH } else { 0 };
        if self.buf.len() <= free {
            return Ok(());
        }
        let units = (self.buf.len() - free).div_ceil(UNIT) as u32;
        let held = self.permit.as_ref().map_or(0, |p| p.num_permits() as u32);
        if units > held {
            let pool = if self.device { &budget.devices } else { &budget.shared };
            let more = pool
                .clone()
                .try_acquire_many_owned(units - held)
                .map_err(|_| BodyError::Busy("unauthenticated requests use the read budget"))?;
            match self.permit.as_mut() {
                Some(p) => p.merge(more),
                None => self.permit = Some(more),
            }
        }
        Ok(())
    }

    /// Before authentication: waits for the next bytes (or the end), then
    /// takes every chunk that is ready at once, while fewer than `limit`
    /// bytes are buffered. Parsing after each such read keeps the work per
    /// byte bounded however the peer cuts its body.
    pub async fn fill_more(&mut self, limit: usize, deadline: Instant) -> Result<(), BodyError> {
        use futures_util::FutureExt;
        if self.ended || self.buf.len() >= limit {
            return Ok(());
        }
        if let Some(d) = self.next(Some(deadline)).await? {
            self.buf.extend_from_slice(&d);
            self.charge()?;
        }
        while !self.ended && self.buf.len() < limit {
            let Some(inner) = self.inner.as_mut() else { break };
            match inner.frame().now_or_never() {
                None => break,
                Some(None) => self.ended = true,
                Some(Some(Err(e))) => return Err(BodyError::Cut(e.to_string())),
                Some(Some(Ok(frame))) => {
                    if let Ok(d) = frame.into_data() {
                        self.received += d.len() as u64;
                        self.buf.extend_from_slice(&d);
                        self.charge()?;
                    }
                }
            }
        }
        Ok(())
    }

    /// Reads the whole body (at most `limit` bytes) before authentication.
    pub async fn read_small(&mut self, limit: u64, deadline: Instant) -> Result<Bytes, BodyError> {
        loop {
            self.fill_more(limit as usize + 1, deadline).await?;
            if self.buf.len() as u64 > limit {
                return Err(BodyError::TooLarge(self.buf.len() as u64));
            }
            if self.ended {
                return Ok(self.take(self.buf.len()));
            }
        }
    }

    /// Takes the first `n` buffered bytes.
    pub fn take(&mut self, n: usize) -> Bytes {
        self.buf.split_to(n.min(self.buf.len())).freeze()
    }

    /// After authentication: the rest of the body, which must be exactly `total` bytes.
    pub async fn read_exact_rest(&mut self, total: u64) -> Result<Bytes, BodyError> {
        let total_us = usize::try_from(total).map_err(|_| BodyError::TooLarge(total))?;
        if self.buf.len() > total_us {
            return Err(BodyError::TooLarge(self.buf.len() as u64));
        }
        let mut v: Vec<u8> = Vec::new();
        v.try_reserve_exact(total_us).map_err(|_| BodyError::Busy("cannot reserve memory for the payloads"))?;
        v.extend_from_slice(&self.buf);
        self.buf.clear();
        while !self.ended {
            match self.next(None).await? {
                Some(d) if v.len() + d.len() <= total_us => v.extend_from_slice(&d),
                Some(d) => return Err(BodyError::TooLarge((v.len() + d.len()) as u64)),
                None => break,
            }
        }
        if v.len() != total_us {
            return Err(BodyError::Cut(format!("the payloads end early: {} bytes where the items declare {total}", v.len())));
        }
        Ok(Bytes::from(v))
    }
}
