"""Patch or whole: the device's per-save decision, and what it learns about its link.

When the app uploads a file the proxy holds a base for, it can send the EPS
an edit patch or the whole file (a FULL item, from which the EPS also learns
the base). Either way the save is **one round trip** to the EPS and the
provider leg (EPS to cloud, wired) is the same; only the bytes on the
device's link differ. So the decision weighs link time saved against what
the patch costs. Full derivation, sources and worked numbers:
docs/device-proxy-decision.md.

The rule, refitted from the hybrid rule of the PandaSync line of work
(Wu et al., "PandaSync: Network and Workload Aware Hybrid Cloud Sync
Optimization", ICDCS 2019: below a size threshold set by the link's
bandwidth and round-trip time, a whole-file upload beats delta sync, whose
extra round trips cost more than the bytes it saves), and from the spec's
informative rule (docs/spec/device-edge-protocol-v1.md §7.2: a patch pays
when (S - P)/b > t + r). With S the file size, P the patch size, b and r the
link's bandwidth and round-trip time, t the time to make the patch, and q
the rate at which the EPS lacked the base (`base_unknown`):

* Before diffing (`precheck`): diff only if even a perfect patch could pay,
  S(1 - q)/b > t_est + q r, with t_est predicted from the measured diff
  speed; never for files under `MIN_DIFF_SIZE` or over `MAX_DIFF_SIZE`, nor
  without a base.
* After diffing (`decide`): send the patch if (S - P)/b > q (r + S/b).

Where this deviates from §7.2, and why: there, every patch is charged a
round trip r. In this protocol a patch rides the same single round trip as
a whole upload, and pays an extra round trip (plus the whole file, resent
FULL) only when the EPS lacks the base, so r is charged with the measured
miss rate q. And t is charged before the diff, where it can still be
avoided; once the patch exists its time is spent on both branches.

`LinkEstimator` learns b, r, the diff speed and q from traffic that passes
anyway (no probes: the common case stays one round trip), as exponentially
weighted moving averages; the first sample of each replaces its default.
Mode "bytes" patches whenever the patch is smaller: for lab runs on one
machine, where the link to the EPS is a loopback and time says nothing
about Wi-Fi air time.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "Decision",
    "LinkEstimator",
    "decide",
    "precheck",
    "MIN_DIFF_SIZE",
    "MAX_DIFF_SIZE",
    "MAX_PATCH_SIZE",
]

DEFAULT_BANDWIDTH = 20e6 / 8   # bytes/s: 20 Mbit/s, a modest Wi-Fi link
DEFAULT_RTT = 0.005            # s: one Wi-Fi hop to the access point
DEFAULT_DIFF_RATE = 20e6       # bytes of file per second; ec_patch.diff measured 7-140 MB/s on the corpus
DIFF_OVERHEAD = 0.0003         # s: fixed cost of one diff call (ZIP parsing, verification)
DEFAULT_MISS_RATE = 0.05       # share of saves answered base_unknown before any is seen
ALPHA = 0.25                   # EWMA weight of a new sample

# Below this a patch's fixed part (headers, hashes: ~170 bytes for the
# smallest .docx edit, spec §13.4) eats most of the saving.
MIN_DIFF_SIZE = 1024
# Above this the proxy would hold base, file and patch in memory at once.
MAX_DIFF_SIZE = 256 * 1024 * 1024
# The EPS's max_patch_size (spec §9, limit 3).
MAX_PATCH_SIZE = 64 * 1024 * 1024

_BW_RANGE = (8e3, 1.25e9)      # 64 kbit/s .. 10 Gbit/s: samples outside are measurement noise
_RTT_RANGE = (50e-6, 10.0)
_RATE_RANGE = (1e5, 1e10)

Send = Literal["patch", "full"]
Mode = Literal["hybrid", "bytes"]


def _clamp(x: float, lo_hi: tuple[float, float]) -> float:
    return min(max(x, lo_hi[0]), lo_hi[1])


class LinkEstimator:
    """What the device has learnt about the path to its EPS and its own diff speed.

    Feed it link time only: an exchange's duration must not include the
    EPS's provider leg. HELLO round trips, FETCH responses and the sending
    phase of large SAVEs qualify; a SAVE's total time does not (it holds the
    provider upload), and fed anyway would under-estimate b, which biases
    towards patching: the cheap direction for the link. Thread-safe.
    """

    def __init__(self, bandwidth: float = DEFAULT_BANDWIDTH, rtt: float = DEFAULT_RTT,
                 diff_rate: float = DEFAULT_DIFF_RATE, miss_rate: float = DEFAULT_MISS_RATE,
                 alpha: float = ALPHA):
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.bandwidth = _clamp(bandwidth, _BW_RANGE)
        self.rtt = _clamp(rtt, _RTT_RANGE)
        self.diff_rate = _clamp(diff_rate, _RATE_RANGE)
        self.miss_rate = min(max(miss_rate, 0.0), 1.0)
        self.alpha = alpha
        self.samples = {"rtt": 0, "bandwidth": 0, "diff": 0, "base": 0}
        self._lock = threading.Lock()

    def _mix(self, name: str, old: float, new: float) -> float:
        n = self.samples[name]
        self.samples[name] = n + 1
        return new if n == 0 else (1 - self.alpha) * old + self.alpha * new

    def observe(self, sent_bytes: int, received_bytes: int, seconds: float) -> None:
        """One exchange with the EPS: bytes both ways (framing included) and its link time.

        An exchange whose bytes would take less than one round trip at the
        current bandwidth measures the round trip; a larger one measures
        the bandwidth (after taking one round trip off).
        """
        total = sent_bytes + received_bytes
        if seconds <= 0 or total < 0:
            return
        with self._lock:
            transfer = total / self.bandwidth
            if transfer < self.rtt:
                self.rtt = self._mix("rtt", self.rtt, _clamp(seconds - transfer, _RTT_RANGE))
            else:
                # never trust less than half the duration as transfer time: a jittery
                # round trip must not turn into an absurd bandwidth
                busy = max(seconds - self.rtt, seconds / 2)
                self.bandwidth = self._mix("bandwidth", self.bandwidth, _clamp(total / busy, _BW_RANGE))

    def observe_diff(self, file_size: int, seconds: float) -> None:
        """One diff of a `file_size`-byte file took `seconds`."""
        if seconds <= 0 or file_size <= 0:
            return
        with self._lock:
            rate = file_size / max(seconds - DIFF_OVERHEAD, seconds / 2)
            self.diff_rate = self._mix("diff", self.diff_rate, _clamp(rate, _RATE_RANGE))

    def observe_base(self, known: bool) -> None:
        """A PATCH item reached the EPS: it had the base (True) or answered base_unknown."""
        with self._lock:
            self.miss_rate = self._mix("base", self.miss_rate, 0.0 if known else 1.0)

    def diff_seconds(self, file_size: int) -> float:
        """Predicted time to diff a file of this size."""
        return DIFF_OVERHEAD + file_size / self.diff_rate

    def describe(self) -> str:
        return (f"{self.bandwidth * 8 / 1e6:.1f} Mbit/s, rtt {self.rtt * 1e3:.1f} ms, "
                f"diff {self.diff_rate / 1e6:.0f} MB/s, base misses {self.miss_rate:.0%}")


@dataclass(frozen=True)
class Decision:
    """`send`: "patch" or "full"; `reason`: a stable code (logged, counted by the
    status command); `detail`: the numbers behind it, for logs."""

    send: Send
    reason: str
    detail: str = ""

    def describe(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def precheck(file_size: int, has_base: bool, estimator: LinkEstimator, *,
             mode: Mode = "hybrid") -> Decision | None:
    """Before diffing: a "full" Decision when a patch cannot pay, None when the diff is worth making."""
    if not has_base:
        return Decision("full", "no_base", "no last-synced version of this document")
    if file_size < MIN_DIFF_SIZE:
        return Decision("full", "too_small", f"{file_size} bytes, under {MIN_DIFF_SIZE}")
    if file_size > MAX_DIFF_SIZE:
        return Decision("full", "too_large", f"{file_size} bytes, over {MAX_DIFF_SIZE}")
    if mode == "bytes":
        return None
    b, r, q = estimator.bandwidth, estimator.rtt, estimator.miss_rate
    best_gain = file_size * (1 - q) / b
    cost = estimator.diff_seconds(file_size) + q * r
    if best_gain <= cost:
        return Decision("full", "cannot_pay",
                        f"even an empty patch saves {_ms(best_gain)}, the diff and risk cost {_ms(cost)} "
                        f"({estimator.describe()})")
    return None


def decide(file_size: int, patch_size: int | None, diff_seconds: float, estimator: LinkEstimator, *,
           mode: Mode = "hybrid", max_patch_size: int = MAX_PATCH_SIZE) -> Decision:
    """After diffing: send the patch or the whole file.

    `patch_size` None means no patch could be made (the core refused the
    pair). `diff_seconds`, the time the diff took, is taught to the
    estimator (for the next precheck) and reported; it is not charged here,
    because it is spent whichever way this save goes.
    """
    if patch_size is not None:
        estimator.observe_diff(file_size, diff_seconds)
    if patch_size is None:
        return Decision("full", "no_patch", "the edit-patch core made no patch")
    if patch_size > max_patch_size:
        return Decision("full", "patch_over_limit", f"patch {patch_size} bytes, EPS limit {max_patch_size}")
    if patch_size >= file_size:
        return Decision("full", "patch_not_smaller", f"patch {patch_size} bytes, file {file_size}")
    if mode == "bytes":
        return Decision("patch", "patch_smaller", f"patch {patch_size} bytes, file {file_size}")
    b, r, q = estimator.bandwidth, estimator.rtt, estimator.miss_rate
    gain = (file_size - patch_size) / b
    risk = q * (r + file_size / b)
    numbers = (f"patch {patch_size} of {file_size} bytes saves {_ms(gain)}, base-miss risk {_ms(risk)}, "
               f"diff took {_ms(diff_seconds)} ({estimator.describe()})")
    if gain > risk:
        return Decision("patch", "patch_pays", numbers)
    return Decision("full", "does_not_pay", numbers)
