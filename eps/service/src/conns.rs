//! The connection cap and the timeouts of a listener (issue 8, spec §14).
//!
//! - **Cap.** A listener holds at most `max` connections. A connection over
//!   the cap takes the place of the oldest connection that has not
//!   authenticated a request; when every held connection
//!   has, the new one is closed at once. A device's connection (one whose
//!   request's MAC verified) is therefore never closed to make room, and a
//!   device can always get in past peers that do not hold the key.
//! - **Timeouts.** The TLS handshake; a connection's first request head
//!   (from its start), any later request head (from its first byte); idle
//!   keep-alive (from the last byte in or out). Body reads are bounded in
//!   [`crate::body`].

use std::collections::BTreeMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

use crate::metrics::{ListenerLabel, Metrics, TimeoutLabels};

/// Timeouts of one listener.
#[derive(Debug, Clone, Copy)]
pub struct Timeouts {
    /// TLS handshake.
    pub tls_handshake: Duration,
    /// A request head.
    pub header: Duration,
    /// The structured part of a request (before its MAC is checked).
    pub envelope: Duration,
    /// One read of a body.
    pub body_read: Duration,
    /// Idle keep-alive.
    pub idle: Duration,
}

#[derive(Debug)]
struct Times {
    start: Instant,
    last_io: Instant,
    /// First byte of a request head while no request runs.
    pending_since: Option<Instant>,
    served: u64,
}

/// One connection.
#[derive(Debug)]
pub struct Conn {
    id: u64,
    /// A request on this connection was authenticated.
    pub trusted: Arc<AtomicBool>,
    /// The bytes one unauthenticated request of this connection at a time
    /// may buffer beyond the shared budget ([`crate::body::FREE_PREAUTH`]).
    pub allowance: crate::body::ConnAllowance,
    active: AtomicU32,
    kill: Notify,
    times: Mutex<Times>,
}

impl Conn {
    fn times(&self) -> std::sync::MutexGuard<'_, Times> {
        self.times.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A request head arrived: the request runs until the guard drops.
    pub fn request(self: &Arc<Self>) -> RequestGuard {
        self.active.fetch_add(1, Ordering::SeqCst);
        self.times().pending_since = None;
        RequestGuard(self.clone())
    }

    /// Resolves when the connection is to be closed to make room for another.
    pub async fn evicted(&self) {
        self.kill.notified().await
    }

    /// Resolves with the kind of timeout when the connection has waited too long.
    pub async fn watchdog(&self, t: Timeouts) -> &'static str {
        loop {
            let now = Instant::now();
            let (deadline, kind) = if self.active.load(Ordering::SeqCst) > 0 {
                (now + t.header.max(Duration::from_secs(1)), "")
            } else {
                let g = self.times();
                let (mut d, mut k) = if g.served == 0 { (g.start + t.header, "headers") } else { (g.last_io + t.idle, "idle") };
                if let Some(p) = g.pending_since {
                    if p + t.header < d {
                        (d, k) = (p + t.header, "headers");
                    }
                }
                (d, k)
            };
            if !kind.is_empty() && deadline <= now {
                return kind;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// Ends a request on drop.
#[derive(Debug)]
pub struct RequestGuard(Arc<Conn>);

impl Drop for RequestGuard {
    fn drop(&mut self) {
        let mut g = self.0.times();
        g.served += 1;
        g.last_io = Instant::now();
        drop(g);
        self.0.active.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The connections of one listener.
#[derive(Debug)]
pub struct Tracker {
    listener: &'static str,
    max: usize,
    next: AtomicU64,
    conns: Mutex<BTreeMap<u64, Arc<Conn>>>,
    open: Gauge,
    refused: Counter,
    evicted: Counter,
    timeouts: Family<TimeoutLabels, Counter>,
}

impl Tracker {
    /// A tracker for `listener` (`device` or `management`) holding at most `max` connections.
    pub fn new(listener: &'static str, max: usize, metrics: &Metrics) -> Arc<Tracker> {
        let l = ListenerLabel { listener };
        metrics.connections_max.get_or_create(&l).set(max as i64);
        Arc::new(Tracker {
            listener,
            max: max.max(1),
            next: AtomicU64::new(1),
            conns: Mutex::new(BTreeMap::new()),
            open: metrics.connections.get_or_create(&l).clone(),
            refused: metrics.connections_refused.get_or_create(&l).clone(),
            evicted: metrics.connections_evicted.get_or_create(&l).clone(),
            timeouts: metrics.connection_timeouts.clone(),
        })
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Admits a new connection, making room if it can; `None`: close it at once.
    pub fn admit(self: &Arc<Self>) -> Option<Admitted> {
        let mut conns = self.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.len() >= self.max {
            // The oldest unauthenticated one, busy or not: a device's new
            // connection, the newest, authenticates long before `max` more
            // connections arrive, whereas preferring idle ones would close
            // it first when the others are slow bodies.
            let victim = conns.values().find(|c| !c.trusted.load(Ordering::Relaxed)).map(|c| c.id);
            match victim.and_then(|id| conns.remove(&id)) {
                Some(v) => {
                    v.kill.notify_one();
                    self.evicted.inc();
                    self.open.dec();
                }
                None => {
                    self.refused.inc();
                    return None;
                }
            }
        }
        let id = self.next.fetch_add(1, Ordering::Relaxed);
        let now = Instant::now();
        let conn = Arc::new(Conn {
            id,
            trusted: Arc::new(AtomicBool::new(false)),
            allowance: crate::body::ConnAllowance::new(),
            active: AtomicU32::new(0),
            kill: Notify::new(),
            times: Mutex::new(Times { start: now, last_io: now, pending_since: None, served: 0 }),
        });
        conns.insert(id, conn.clone());
        self.open.inc();
        Some(Admitted { tracker: self.clone(), conn })
    }

    /// Counts a timeout of `kind`.
    pub fn timed_out(&self, kind: &'static str) {
        self.timeouts.get_or_create(&TimeoutLabels { listener: self.listener, kind }).inc();
    }
}

/// A held connection; leaves the tracker on drop.
#[derive(Debug)]
pub struct Admitted {
    tracker: Arc<Tracker>,
    /// The connection.
    pub conn: Arc<Conn>,
}

impl Drop for Admitted {
    fn drop(&mut self) {
        let mut conns = self.tracker.conns.lock().unwrap_or_else(|e| e.into_inner());
        if conns.remove(&self.conn.id).is_some() {
            self.tracker.open.dec();
        }
    }
}

/// A stream that notes its connection's activity (for the header and idle timeouts).
#[derive(Debug)]
pub struct Tracked<S> {
    inner: S,
    conn: Arc<Conn>,
}

impl<S> Tracked<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, conn: Arc<Conn>) -> Self {
        Tracked { inner, conn }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Tracked<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(r, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            let now = Instant::now();
            let idle = self.conn.active.load(Ordering::SeqCst) == 0;
            let mut g = self.conn.times();
            g.last_io = now;
            if idle && g.pending_since.is_none() {
                g.pending_since = Some(now);
            }
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Tracked<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, data);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.conn.times().last_io = Instant::now();
        }
        r
    }
    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[std::io::IoSlice<'_>]) -> Poll<std::io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(r, Poll::Ready(Ok(n)) if n > 0) {
            self.conn.times().last_io = Instant::now();
        }
        r
    }
    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

/// Raises the soft limit of open files to the hard limit; returns the soft limit in force.
pub fn raise_nofile() -> u64 {
    // SAFETY: plain system calls with a valid struct pointer.
    unsafe {
        let mut l = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) != 0 {
            return 1024;
        }
        if l.rlim_cur < l.rlim_max {
            let want = libc::rlimit { rlim_cur: l.rlim_max, rlim_max: l.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &want) == 0 {
                l.rlim_cur = l.rlim_max;
            }
        }
        l.rlim_cur
    }
}

/// Files kept free of connections: the store, provider connections, listeners, logs.
pub const FD_RESERVE: u64 = 128;

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn over_the_cap_the_oldest_unauthenticated_connection_makes_room() {
        let m = Metrics::new();
        let t = Tracker::new("device", 3, &m);
        let a = t.admit().unwrap();
        let b = t.admit().unwrap();
        let c = t.admit().unwrap();
        a.conn.trusted.store(true, Ordering::Relaxed); // a device's
        let _busy = b.conn.request(); // b is reading a request
        let d = t.admit().unwrap(); // b goes: the oldest unauthenticated, busy or not; never a
        assert!(tokio::time::timeout(Duration::from_millis(10), b.conn.evicted()).await.is_ok());
        let e = t.admit().unwrap(); // then c
        assert!(tokio::time::timeout(Duration::from_millis(10), c.conn.evicted()).await.is_ok());
        d.conn.trusted.store(true, Ordering::Relaxed);
        e.conn.trusted.store(true, Ordering::Relaxed);
        assert!(t.admit().is_none(), "every held connection is a device's: refuse");
        assert_eq!(t.refused.get(), 1);
        assert_eq!(t.evicted.get(), 2);
        assert_eq!(t.open.get(), 3);
        drop(a);
        assert_eq!(t.open.get(), 2);
    }
}
