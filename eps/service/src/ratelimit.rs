//! Rate-limited logging: one token bucket per log site, so that a peer who
//! repeats a bad request (or a flood of connections) cannot make the EPS
//! write its log at disk speed (issue 8: 245 KB/s from one client). A
//! suppressed line is counted; the site's next line that passes carries
//! `suppressed = N`.
//!
//! Use [`limited!`](crate::limited) in place of `tracing::info!` (etc.) at
//! sites a peer can trigger at will.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// Lines per second each site may write; the burst is ten times this.
static RATE: AtomicU32 = AtomicU32::new(5);
/// Lines suppressed by every site since the start (for `/metrics`).
pub static SUPPRESSED_TOTAL: AtomicU64 = AtomicU64::new(0);

/// Sets the per-site rate (from the configuration's `log_lines_per_s`).
pub fn set_rate(per_s: u32) {
    RATE.store(per_s.max(1), Ordering::Relaxed);
}

/// The bucket of one log site.
#[derive(Debug)]
pub struct Site {
    state: Mutex<Option<(f64, Instant, u64)>>,
}

impl Site {
    /// An empty bucket (filled on first use).
    pub const fn new() -> Self {
        Site { state: Mutex::new(None) }
    }

    /// `Some(suppressed since the last admitted line)` when a line may be written now.
    pub fn admit(&self) -> Option<u64> {
        let rate = f64::from(RATE.load(Ordering::Relaxed));
        let burst = rate * 10.0;
        let now = Instant::now();
        let mut g = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let (tokens, last, suppressed) = g.get_or_insert((burst, now, 0));
        *tokens = (*tokens + now.duration_since(*last).as_secs_f64() * rate).min(burst);
        *last = now;
        if *tokens >= 1.0 {
            *tokens -= 1.0;
            Some(std::mem::take(suppressed))
        } else {
            *suppressed += 1;
            SUPPRESSED_TOTAL.fetch_add(1, Ordering::Relaxed);
            None
        }
    }
}

impl Default for Site {
    fn default() -> Self {
        Self::new()
    }
}

/// `limited!(info, field = value, "message {}", x)`: a `tracing` event
/// limited per call site (see the module documentation).
#[macro_export]
macro_rules! limited {
    ($level:ident, $($arg:tt)+) => {{
        static SITE: $crate::ratelimit::Site = $crate::ratelimit::Site::new();
        if let Some(suppressed) = SITE.admit() {
            if suppressed > 0 {
                tracing::$level!(suppressed, $($arg)+);
            } else {
                tracing::$level!($($arg)+);
            }
        }
    }};
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_site_admits_its_burst_then_counts() {
        let site = Site::new();
        let admitted = (0..1000).filter(|_| site.admit().is_some()).count();
        assert!((50..=52).contains(&admitted), "{admitted}");
        std::thread::sleep(std::time::Duration::from_millis(250));
        assert!(site.admit().unwrap() >= 900);
    }
}
