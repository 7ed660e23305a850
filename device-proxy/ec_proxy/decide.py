"""Patch or whole: the device's per-save decision, and what it learns about its link.

When the app uploads a file the proxy holds a base for, it can send the EPS
an edit patch or the whole file (a FULL item, from which the EPS also learns
the base). Either way the save is **one round trip** to the EPS and the
provider leg (EPS to cloud, wired) is the same. What differs is the bytes on
the device's link and the EPS's rebuild of the file from the patch, which a
FULL item does not need. The rule minimises the user's wait (mode
"hybrid", the default) or the bytes on the link (mode "metered"). Full
derivation, sources and worked numbers: docs/device-proxy-decision.md.

With S the file size, P the patch size, b and r the link's bandwidth and
round-trip time, t the time to make the patch, e the EPS's rebuild time for
an S-byte file, and q the rate at which the EPS lacked the base
(`base_unknown`, which costs a round trip and the whole file resent):

* Before diffing (`precheck`): diff only if even a perfect patch could pay,
  S(1 - q)/b > t_est + e_est + o + q r, with t_est and e_est predicted from
  the measured diff and rebuild rates and o the EPS's own overhead per save
  (store, hashing: its reported time beyond the rebuild and the provider
  exchanges); never for files under `MIN_DIFF_SIZE` or over
  `MAX_DIFF_SIZE`, nor without a base.
* After diffing (`decide`): send the patch if (S - P)/b > e_est + o + q (r + S/b).
  The diff's time is spent on both branches by then and is not charged.
* Measured, when a size class has both: the app's wait for its last patched
  and direct saves (`LinkEstimator.observe_save`, the quickest of the last
  COST_WINDOW each way) decides instead of the terms above (`direct_faster`,
  `patch_faster`); each way is measured again now and then (`explore`,
  `explore_direct`, bounded by EXPLORE_DIRECT_FACTOR).
* Whole, which way: in mode "hybrid", a file the rule sends whole because a
  patch does not pay on this link (`cannot_pay`, `does_not_pay`, and files
  under `MIN_DIFF_SIZE`), and in every mode a file over `MAX_DIFF_SIZE`, goes
  **directly** to the provider, as a plain
  mitmproxy would send it (send "direct"): through the EPS the same bytes
  would cross the same link and then wait for the EPS's own upload, so the
  user would wait longer for nothing. Whole files the rule would patch if it
  could (`no_base`, `no_patch`, `patch_not_smaller`, `patch_over_limit`) and
  every whole file in mode "metered" still go through the EPS (FULL), which
  keeps the version as the base of the next patch.

This refits the hybrid rule of the PandaSync line of work (Wu et al.,
"PandaSync: Network and Workload Aware Hybrid Cloud Sync Optimization",
ICDCS 2019: below a size threshold set by the link's bandwidth and
round-trip time, a whole-file upload beats delta sync) and the spec's
rule (docs/spec/device-edge-protocol-v1.md §7.2).

`LinkEstimator` learns everything from traffic that passes anyway (no
probes: the common case stays one round trip), as exponentially weighted
moving averages; the first sample of each replaces its default:
b and r from every exchange with the EPS, the EPS's own time taken off (it
reports it in `Server-Timing`, spec §7.3): the line through the averages of
its small exchanges (HELLOs, patches) and of its larger ones (whole files),
or one exchange at a time until there are both; e from the rebuild time the EPS
reports for patched saves (`rb`); t from the device's own diffs; q from
the EPS's answers to patches (`observe_base`: misses over the last
MISS_WINDOW patches, with MISS_PRIOR saves at the default rate added, so
one `base_unknown` is evidence, not the new rate). Mode "metered" (alias "bytes") patches
whenever the patch is smaller: for links billed by the byte, and for lab
runs on one machine, where time says nothing about Wi-Fi air time.
"""

from __future__ import annotations

import collections
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
# The diff and rebuild rates before a file of the size class was diffed or
# rebuilt (`LinkEstimator.diff_seconds`), as measured on this project's
# machine for the 1 MB-text .docx (381 kB) once its base is known, which
# `ec_patch.learn` makes the usual case (save_profile.py: a spot-checked diff
# 3.3 ms, 17 ms cold; eps_bench.py: the EPS's rebuild 11 ms), rounded down.
DEFAULT_DIFF_RATE = 40e6       # bytes of file per second of the device's diff
DIFF_OVERHEAD = 0.0003         # s: fixed cost of one diff call (ZIP parsing, verification)
DEFAULT_MISS_RATE = 0.05       # share of saves answered base_unknown before any is seen
# q is learnt as the misses among the last MISS_WINDOW patches, counted with
# MISS_PRIOR patches more at DEFAULT_MISS_RATE (a Beta prior): one
# `base_unknown` among the first patches makes q 9.5 %, not 100 %. A first
# sample that replaced the default (as the other estimates' do) made q 100 %
# at the first miss, after which no patch paid and none was made to lower it
# again (docs/device-proxy-decision.md). The window lets q fall again after
# an EPS that had lost its state.
MISS_PRIOR = 20
MISS_WINDOW = 64
DEFAULT_REBUILD_RATE = 30e6    # bytes of file per second of the EPS's rebuild
REBUILD_OVERHEAD = 0.0005      # s: fixed part of a rebuild (reading the base, parsing the patch)
DEFAULT_EPS_OVERHEAD = 0.005   # s: what a save through the EPS adds beyond its rebuild and its provider exchanges (store, hashing)
_OVERHEAD_RANGE = (0.0, 1.0)
ALPHA = 0.25                   # EWMA weight of a new sample

# Below this a patch's fixed part (headers, hashes: ~170 bytes for the
# smallest .docx edit, spec §13.4) eats most of the saving.
MIN_DIFF_SIZE = 1024
# Above this the proxy would hold base, file and patch in memory at once.
MAX_DIFF_SIZE = 256 * 1024 * 1024
# The EPS's max_patch_size (spec §9, limit 3).
MAX_PATCH_SIZE = 64 * 1024 * 1024

# Exchanges this small always measure the round trip, this large always the
# bandwidth (in between, whichever their transfer time at the current
# bandwidth says): a first round trip measured high (a busy EPS, a slow
# first connection) must not make every later exchange look small.
SMALL_EXCHANGE = 4096
LARGE_EXCHANGE = 16384
# The two classes' averages must be this many bytes apart before the line
# through them is trusted (`LinkEstimator._fit`).
FIT_MIN_SPREAD = 1024
# The small class's point is the least delayed of its last this many
# exchanges, not their average: queueing, a first connection's slow start or
# a busy EPS only ever add time to a round trip, so one exchange measured
# high must not hold the line up until the average forgets it.
SMALL_WINDOW = 8
# After this many saves in a row that the rule sent whole because a patch
# would not pay, the next one is diffed and sent as a patch anyway: the
# diff and rebuild rates behind the decision are learnt only from patched
# saves, and a pessimistic first sample (the first diff and rebuild after a
# start know nothing of the base's blocks) must not stick for ever.
EXPLORE_EVERY = 8
# Each exploration after which the rule keeps its way doubles the number of
# saves before the next one, up to this many: on a link that does not
# change, one save in 65, not one in 9, pays for the rule's learning (an
# exploring patch of the 100 kB-text document: 21 against 9.5 ms directly
# at 300 Mbit/s). When the rule changes its way, the count starts again
# from EXPLORE_EVERY.
EXPLORE_EVERY_MAX = 64
# The diff and rebuild costs are learnt per size class (files within a
# factor of 4 of each other): a 5 kB file costs a diff call's fixed part, a
# 400 kB one its bytes, and a rate learnt from the first must not price the
# second. Each class's estimate is the quickest of its last COST_WINDOW
# samples, as the small exchanges' round trip is (`SMALL_WINDOW`): a cold
# diff or rebuild (nothing known of the base yet) and a busy CPU only ever
# add time, and one such sample must not price the saves after it.
COST_WINDOW = 8
# A save the rule would patch goes directly instead, to measure the direct
# path, when it is predicted (or was measured) to take at most this many
# times the patched save's measured time: the first time a size class has
# patched saves and no direct one, and after EXPLORE_EVERY patched saves in
# a row (then 16, 32, 64: EXPLORE_EVERY_MAX) after that. A link where the whole file would take far longer
# (5 Mbit/s: 640 ms against a 66 ms patch) never pays for such a measurement.
EXPLORE_DIRECT_FACTOR = 2.0

_BW_RANGE = (8e3, 1.25e9)      # 64 kbit/s .. 10 Gbit/s: samples outside are measurement noise
_RTT_RANGE = (50e-6, 10.0)
_RATE_RANGE = (1e5, 1e10)

Send = Literal["patch", "full", "direct"]
Mode = Literal["hybrid", "metered", "bytes"]
MODES = ("hybrid", "metered", "bytes")


def minimises_bytes(mode: str) -> bool:
    """Modes that minimise bytes: "metered" ("bytes" is its older name)."""
    return mode in ("metered", "bytes")


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
                 alpha: float = ALPHA, rebuild_rate: float = DEFAULT_REBUILD_RATE,
                 eps_overhead: float = DEFAULT_EPS_OVERHEAD):
        if not 0 < alpha <= 1:
            raise ValueError(f"alpha must be in (0, 1], got {alpha}")
        self.bandwidth = _clamp(bandwidth, _BW_RANGE)
        self.rtt = _clamp(rtt, _RTT_RANGE)
        self.diff_rate = _clamp(diff_rate, _RATE_RANGE)
        self.rebuild_rate = _clamp(rebuild_rate, _RATE_RANGE)
        #: the rates of a size class before its first sample
        self.prior_rates = (self.diff_rate, self.rebuild_rate)
        self.prior_miss_rate = min(max(miss_rate, 0.0), 1.0)
        #: the EPS's answers to the last MISS_WINDOW patches: True where it lacked the base
        self._misses: collections.deque[bool] = collections.deque(maxlen=MISS_WINDOW)
        self.alpha = alpha
        #: what a save through the EPS adds on the EPS beyond its rebuild and
        #: its provider exchanges (store writes, hashing): charged to a patch
        #: when the whole file would go directly (mode hybrid)
        self.eps_overhead = _clamp(eps_overhead, _OVERHEAD_RANGE)
        self.samples = {"rtt": 0, "bandwidth": 0, "diff": 0, "base": 0, "rebuild": 0, "overhead": 0}
        #: per size class (`size_class`), the rates of the last COST_WINDOW diffs and rebuilds
        self._diff_rates: dict[int, collections.deque[float]] = {}
        self._rebuild_rates: dict[int, collections.deque[float]] = {}
        #: moving averages of (bytes, link seconds) of the small exchanges
        #: (at most SMALL_EXCHANGE) and of the larger ones: the line through
        #: the two gives the round trip and the bandwidth (`_fit`)
        self._small: collections.deque[tuple[float, float]] = collections.deque(maxlen=SMALL_WINDOW)
        self._large: tuple[float, float] | None = None
        #: saves in a row sent whole because a patch would not pay (see EXPLORE_EVERY)
        self.whole_streak = 0
        #: whole saves in a row before the next exploring patch, and patched saves in
        #: a row before the next exploring direct one (EXPLORE_EVERY .. EXPLORE_EVERY_MAX)
        self.whole_every = EXPLORE_EVERY
        self.patch_every = EXPLORE_EVERY
        #: the pre-check let this diff through to measure again (after this many
        #: whole saves; 0: it did not): its patch goes as a patch
        self.exploring = 0
        #: patched saves in a row (see EXPLORE_DIRECT_FACTOR)
        self.patch_streak = 0
        #: per how ("patch", "direct") and size class, the user's wait of the last
        #: COST_WINDOW saves that went that way (`observe_save`)
        self._save_times: dict[str, dict[int, collections.deque[float]]] = {"patch": {}, "direct": {}}
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
            if self._fit(total, seconds):
                return
            transfer = total / self.bandwidth
            if total <= SMALL_EXCHANGE or (total < LARGE_EXCHANGE and transfer < self.rtt):
                self.rtt = self._mix("rtt", self.rtt, _clamp(seconds - transfer, _RTT_RANGE))
            else:
                # never trust less than half the duration as transfer time: a jittery
                # round trip must not turn into an absurd bandwidth
                busy = max(seconds - self.rtt, seconds / 2)
                self.bandwidth = self._mix("bandwidth", self.bandwidth, _clamp(total / busy, _BW_RANGE))

    def _fit(self, total: int, seconds: float) -> bool:
        """Adds the exchange to its class (small: at most SMALL_EXCHANGE
        bytes; large: more) and, once both classes have a point, FIT_MIN_SPREAD
        bytes apart and the larger slower, sets the round trip and the
        bandwidth from the line through the two points: t = r + bytes / b.
        The small point is the least delayed of the last SMALL_WINDOW small
        exchanges (`_small_point`), the large one the moving average of the
        larger. Every exchange then measures both, also the small saves of a
        link with no large ones (a 5 kB file's FULL against its 600-byte
        patches tells 5 Mbit/s from 100). False when there is no such line
        yet: the caller's one-sample rule applies."""
        point = (float(total), seconds)
        if total <= SMALL_EXCHANGE:
            self._small.append(point)
        else:
            self._large = point if self._large is None else self._mix_point(self._large, point)
        if not self._small or self._large is None:
            return False
        (xs, ts), (xl, tl) = self._small_point(), self._large
        if xl - xs < FIT_MIN_SPREAD or tl <= ts:
            return False
        bandwidth = _clamp((xl - xs) / (tl - ts), _BW_RANGE)
        self.bandwidth = bandwidth
        self.rtt = _clamp(ts - xs / bandwidth, _RTT_RANGE)
        self.samples["bandwidth"] += 1
        self.samples["rtt"] += 1
        return True

    def _small_point(self) -> tuple[float, float]:
        """The small exchange with the least time beyond its bytes' transfer
        at the current bandwidth: the one least delayed by anything but the link."""
        return min(self._small, key=lambda p: p[1] - p[0] / self.bandwidth)

    def _mix_point(self, old: tuple[float, float], new: tuple[float, float]) -> tuple[float, float]:
        a = self.alpha
        return ((1 - a) * old[0] + a * new[0], (1 - a) * old[1] + a * new[1])

    def observe_save(self, how: str, file_size: int, seconds: float) -> None:
        """A save of `file_size` bytes that went `how` ("patch": through the
        EPS as a patch answered in one exchange; "direct": whole, straight to
        the provider) kept the app waiting `seconds`, from the first byte of
        its request to the provider's answer, as the proxy saw it; for a
        patch, less its diff's time (priced apart: `diff_seconds`), for a
        direct save less the upstream connection's set-up if it was opened
        for it (most saves find it open)."""
        if how not in self._save_times or seconds <= 0 or file_size <= 0:
            return
        with self._lock:
            _window(self._save_times[how], file_size).append(seconds)

    def save_seconds(self, how: str, file_size: int) -> float | None:
        """The quickest of the last measured saves of this size class that went
        `how` (None before any): the user's wait that way, measured, whatever
        the link, the EPS or the provider cost beyond the model's terms."""
        with self._lock:
            seen = self._save_times[how].get(size_class(file_size))
            return min(seen) if seen else None

    def observe_diff(self, file_size: int, seconds: float) -> None:
        """One diff of a `file_size`-byte file took `seconds`."""
        if seconds <= 0 or file_size <= 0:
            return
        with self._lock:
            rate = _clamp(file_size / max(seconds - DIFF_OVERHEAD, seconds / 2), _RATE_RANGE)
            self.diff_rate = self._mix("diff", self.diff_rate, rate)
            _window(self._diff_rates, file_size).append(rate)

    def observe_exchange(self, sent_bytes: int, received_bytes: int, seconds: float, eps_seconds: float) -> None:
        """One exchange with the EPS that took `seconds` in all, of which the
        EPS reported `eps_seconds` of its own work (spec §7.3): the rest is
        link time (both transfers and one round trip)."""
        if eps_seconds < 0 or eps_seconds >= seconds:
            return
        self.observe(sent_bytes, received_bytes, seconds - eps_seconds)

    def observe_rebuild(self, file_size: int, seconds: float) -> None:
        """The EPS reported rebuilding `file_size` bytes of patched files in `seconds`."""
        if seconds <= 0 or file_size <= 0:
            return
        with self._lock:
            rate = _clamp(file_size / max(seconds - REBUILD_OVERHEAD, seconds / 2), _RATE_RANGE)
            self.rebuild_rate = self._mix("rebuild", self.rebuild_rate, rate)
            _window(self._rebuild_rates, file_size).append(rate)

    def rebuild_seconds(self, file_size: int) -> float:
        """Predicted time for the EPS to rebuild a file of this size from a
        patch: at the quickest rate of the last rebuilds of its size class,
        the prior before any."""
        return REBUILD_OVERHEAD + file_size / self._class_rate(self._rebuild_rates, file_size, self.prior_rates[1])

    def _class_rate(self, rates: dict[int, collections.deque[float]], file_size: int, default: float) -> float:
        with self._lock:
            seen = rates.get(size_class(file_size))
            return max(seen) if seen else default

    def observe_eps_overhead(self, seconds: float) -> None:
        """One save's EPS time beyond its rebuild and its provider exchanges
        (spec §7.3: `eps` - `rb` - `pv`)."""
        if seconds < 0:
            return
        with self._lock:
            self.eps_overhead = self._mix("overhead", self.eps_overhead, _clamp(seconds, _OVERHEAD_RANGE))

    def observe_base(self, known: bool) -> None:
        """A PATCH item reached the EPS: it had the base (True) or answered base_unknown."""
        with self._lock:
            self._misses.append(not known)
            self.samples["base"] += 1

    @property
    def miss_rate(self) -> float:
        """q: the share of patches the EPS answered `base_unknown`, over the
        last MISS_WINDOW with MISS_PRIOR more at the prior rate."""
        with self._lock:
            return self._q()

    def _q(self) -> float:
        return (sum(self._misses) + MISS_PRIOR * self.prior_miss_rate) / (len(self._misses) + MISS_PRIOR)

    # The rule's own counters (`precheck`, `decide`): each way is measured
    # again now and then (EXPLORE_EVERY, EXPLORE_DIRECT_FACTOR).

    def count_whole(self) -> int:
        """Counts a save the rule would send whole; after `whole_every` such
        saves in a row (EXPLORE_EVERY at first, doubling with each
        exploration up to EXPLORE_EVERY_MAX) this one is to be patched
        anyway to measure again: returns that count then, 0 otherwise."""
        with self._lock:
            self.whole_streak, self.whole_every, after = _count_towards(self.whole_streak, self.whole_every)
            return after

    def start_exploring(self, after: int) -> None:
        """The pre-check lets this save's diff through to measure again (after
        `after` whole saves): its patch goes as a patch."""
        with self._lock:
            self.exploring = after

    def take_exploring(self) -> int:
        """The whole saves after which the pre-check let this diff through to
        explore, 0 when it did not (and forgets it)."""
        with self._lock:
            exploring, self.exploring = self.exploring, 0
            return exploring

    def patch_pays(self) -> None:
        """The rule patches because a patch pays: the whole-save streak ends,
        and the next one explores after EXPLORE_EVERY saves again."""
        with self._lock:
            self.whole_streak = 0
            self.whole_every = EXPLORE_EVERY
            self.exploring = 0

    def went_direct(self, exploring: bool = False) -> None:
        """The rule sends this save directly (`exploring`: only to measure that
        way): the patched-save streak ends; unless exploring, the next one
        explores after EXPLORE_EVERY patched saves again."""
        with self._lock:
            self.patch_streak = 0
            if not exploring:
                self.patch_every = EXPLORE_EVERY

    def count_patch(self, direct_s: float, patch_s: float) -> int:
        """Counts a save the measurements say to patch; after `patch_every`
        such saves in a row (as `whole_every` for whole saves) this one goes
        directly to measure that way again, only while a direct save took at
        most EXPLORE_DIRECT_FACTOR times a patched one: returns that count
        then, 0 otherwise."""
        with self._lock:
            self.patch_streak, self.patch_every, after = _count_towards(
                self.patch_streak, self.patch_every, direct_s <= EXPLORE_DIRECT_FACTOR * patch_s)
            return after

    def diff_seconds(self, file_size: int) -> float:
        """Predicted time to diff a file of this size: at the quickest rate
        of the last diffs of its size class, the prior before any."""
        return DIFF_OVERHEAD + file_size / self._class_rate(self._diff_rates, file_size, self.prior_rates[0])

    def describe(self, file_size: int | None = None) -> str:
        """The estimates, with the diff and rebuild rates of `file_size`'s
        size class (the averages over every size without it)."""
        if file_size is None:
            diff, rebuild = self.diff_rate, self.rebuild_rate
        else:
            diff = self._class_rate(self._diff_rates, file_size, self.prior_rates[0])
            rebuild = self._class_rate(self._rebuild_rates, file_size, self.prior_rates[1])
        return (f"{self.bandwidth * 8 / 1e6:.1f} Mbit/s, rtt {self.rtt * 1e3:.1f} ms, "
                f"diff {diff / 1e6:.0f} MB/s, EPS rebuild {rebuild / 1e6:.0f} MB/s, "
                f"EPS overhead {self.eps_overhead * 1e3:.1f} ms, base misses {self.miss_rate:.0%}")

    def summary(self) -> dict:
        """What the rule believes now, for `ec_proxy status`: the link, the
        EPS's own time, q and how many patches it was learnt from, and the
        saves before the next exploration each way."""
        with self._lock:
            return {"mbit_s": round(self.bandwidth * 8 / 1e6, 1), "rtt_ms": round(self.rtt * 1e3, 2),
                    "eps_overhead_ms": round(self.eps_overhead * 1e3, 2),
                    "base_miss_rate": round(self._q(), 4),
                    "patches_seen": len(self._misses), "exchanges": self.samples["rtt"] + self.samples["bandwidth"],
                    "explore_after_whole": self.whole_every - self.whole_streak + 1,
                    "explore_after_patched": self.patch_every - self.patch_streak + 1}


def _count_towards(streak: int, every: int, allowed: bool = True) -> tuple[int, int, int]:
    """One more save in a row one way: (streak, every, after). After `every`
    such saves (and when `allowed`) the next explores the other way: `after`
    is then that count, the streak starts again and `every` doubles, up to
    EXPLORE_EVERY_MAX; otherwise `after` is 0."""
    streak += 1
    if streak > every and allowed:
        return 0, min(2 * every, EXPLORE_EVERY_MAX), every
    return streak, every, 0


def size_class(file_size: int) -> int:
    """Files within a factor of 4 of each other share a class (COST_WINDOW)."""
    return max(file_size, 1).bit_length() // 2


def _window(rates: dict[int, collections.deque[float]], file_size: int) -> collections.deque[float]:
    return rates.setdefault(size_class(file_size), collections.deque(maxlen=COST_WINDOW))


@dataclass(frozen=True)
class Decision:
    """`send`: "patch", "full" (the whole file through the EPS) or "direct"
    (the whole file straight to the provider, the EPS not asked); `reason`: a
    stable code (logged, counted by the status command); `detail`: the
    numbers behind it, for logs."""

    send: Send
    reason: str
    detail: str = ""
    #: the diff's time, when one was made (the caller sets it)
    diff_seconds: float = 0.0

    def describe(self) -> str:
        return f"{self.reason}: {self.detail}" if self.detail else self.reason


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms"


def precheck(file_size: int, has_base: bool, estimator: LinkEstimator, *,
             mode: Mode = "hybrid") -> Decision | None:
    """Before diffing: a whole-file Decision ("full" or "direct") when no patch is to be made, None when the diff is worth making."""
    if not has_base:
        return Decision("full", "no_base", "no last-synced version of this document")
    if file_size < MIN_DIFF_SIZE:
        return Decision("full" if minimises_bytes(mode) else "direct", "too_small", f"{file_size} bytes, under {MIN_DIFF_SIZE}")
    if file_size > MAX_DIFF_SIZE:
        return Decision("direct", "too_large", f"{file_size} bytes, over {MAX_DIFF_SIZE}: never diffed, so nothing for the EPS to keep")
    if minimises_bytes(mode):
        return None
    measured = _measured(file_size, estimator)
    if measured is not None:
        return measured if measured.send == "direct" else None
    b, r, q = estimator.bandwidth, estimator.rtt, estimator.miss_rate
    best_gain = file_size * (1 - q) / b
    cost = estimator.diff_seconds(file_size) + estimator.rebuild_seconds(file_size) + estimator.eps_overhead + q * r
    if best_gain <= cost:
        after = estimator.count_whole()
        if after:
            estimator.start_exploring(after)
            return None
        estimator.went_direct()
        return Decision("direct", "cannot_pay",
                        f"even an empty patch saves {_ms(best_gain)}, the diff, the EPS's rebuild and risk cost "
                        f"{_ms(cost)} ({estimator.describe(file_size)})")
    return None


def _miss_risk(file_size: int, estimator: LinkEstimator) -> float:
    """q (r + S/b): what a patch adds to the wait on average when the EPS
    lacks its base (one more round trip and the whole file)."""
    return estimator.miss_rate * (estimator.rtt + file_size / estimator.bandwidth)


def _measured(file_size: int, estimator: LinkEstimator) -> Decision | None:
    """The pre-check from measured saves of this size class (`observe_save`):
    None when they cannot decide (no patched save measured yet), else
    "direct" (measured faster, or sent directly to measure it) or "patch".
    A patched save is priced as its predicted diff, its measured rest (saves
    answered in one exchange) and the base-miss risk."""
    rest = estimator.save_seconds("patch", file_size)
    if rest is None:
        return None
    diff_s = estimator.diff_seconds(file_size)
    patch_s = diff_s + rest + _miss_risk(file_size, estimator)
    direct_s = estimator.save_seconds("direct", file_size)
    if direct_s is None:
        predicted = file_size / estimator.bandwidth + estimator.rtt
        if predicted > EXPLORE_DIRECT_FACTOR * patch_s:
            return None  # the model decides; measuring the direct path would cost too much
        estimator.went_direct(exploring=True)
        return Decision("direct", "explore_direct",
                        f"no direct save of this size measured yet: the link says {_ms(predicted)}, a patched save "
                        f"took {_ms(patch_s)}; sent directly once to measure it ({estimator.describe(file_size)})")
    numbers = (f"measured: a patched save {_ms(patch_s)} (diff {_ms(diff_s)}, then {_ms(rest)}, base-miss risk "
               f"{_ms(patch_s - diff_s - rest)}), a direct one {_ms(direct_s)}, at this size")
    if direct_s < patch_s:
        after = estimator.count_whole()
        if after:
            estimator.start_exploring(after)
            return Decision("patch", "explore", numbers + f"; sent as a patch to measure again after {after} whole saves")
        estimator.went_direct()
        return Decision("direct", "direct_faster", numbers)
    after = estimator.count_patch(direct_s, patch_s)
    if after:
        return Decision("direct", "explore_direct", numbers + f"; sent directly to measure again after {after} patched saves")
    return Decision("patch", "patch_faster", numbers)


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
    if minimises_bytes(mode):
        return Decision("patch", "patch_smaller", f"patch {patch_size} bytes, file {file_size}")
    rest, direct_s = estimator.save_seconds("patch", file_size), estimator.save_seconds("direct", file_size)
    risk = _miss_risk(file_size, estimator)
    if rest is not None and direct_s is not None and rest + risk <= direct_s:
        # Measured: the rest of a patched save (its diff is spent), with the
        # base-miss risk, is no slower than a direct one.
        estimator.patch_pays()
        return Decision("patch", "patch_faster", f"measured: a patched save after its diff {_ms(rest)}, base-miss "
                        f"risk {_ms(risk)} (this diff took {_ms(diff_seconds)}), a direct one {_ms(direct_s)}, at this size")
    gain = (file_size - patch_size) / estimator.bandwidth
    # Against the whole file sent directly (the hybrid rule's whole path): the EPS's rebuild and its own overhead.
    rebuild = estimator.rebuild_seconds(file_size) + estimator.eps_overhead
    numbers = (f"patch {patch_size} of {file_size} bytes saves {_ms(gain)}, the EPS's rebuild and overhead cost "
               f"{_ms(rebuild)}, base-miss risk {_ms(risk)}, diff took {_ms(diff_seconds)} ({estimator.describe(file_size)})")
    # A save the pre-check let through to explore is patched as such: it does not
    # count as the rule changing its way (which would reset the exploration's interval).
    after = estimator.take_exploring()
    if not after and gain > rebuild + risk:
        estimator.patch_pays()
        return Decision("patch", "patch_pays", numbers)
    after = after or estimator.count_whole()
    if after:
        return Decision("patch", "explore", numbers + f"; sent as a patch to measure again after {after} whole saves")
    estimator.went_direct()
    return Decision("direct", "does_not_pay", numbers)

