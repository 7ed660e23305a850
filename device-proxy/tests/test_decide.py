"""Tests of ec_proxy.decide: the patch-or-whole table over slow and fast links,
the pre-check, and what the link estimator learns from observed exchanges."""

from __future__ import annotations

import pytest

import ec_patch
from ec_proxy.decide import (
    MAX_DIFF_SIZE,
    MIN_DIFF_SIZE,
    Decision,
    LinkEstimator,
    SMALL_WINDOW,
    decide,
    precheck,
)

MBIT = 1e6 / 8


def link(mbit: float, rtt_ms: float, *, diff_mb_s: float = 20, miss: float = 0.05,
         rebuild_mb_s: float = 1000, overhead_ms: float = 0) -> LinkEstimator:
    """A learnt link; the EPS's rebuild and its own overhead are negligible
    unless `rebuild_mb_s` and `overhead_ms` say otherwise."""
    return LinkEstimator(bandwidth=mbit * MBIT, rtt=rtt_ms / 1e3, diff_rate=diff_mb_s * 1e6, miss_rate=miss,
                         rebuild_rate=rebuild_mb_s * 1e6, eps_overhead=overhead_ms / 1e3)


# file size, patch size, link, expected send, expected reason
CASES = [
    # the issue's .docx files (1 KB / 100 KB / 1 MB of text) on the default Wi-Fi
    (5_000, 300, link(20, 5), "patch", "patch_pays"),
    (80_000, 400, link(20, 5), "patch", "patch_pays"),
    (760_000, 600, link(20, 5), "patch", "patch_pays"),
    # a slow, distant link: everything smaller pays
    (5_000, 4_000, link(1, 80), "patch", "patch_pays"),
    # a patch that saves little while base misses are frequent does not
    (100_000, 95_000, link(20, 5, miss=0.2), "direct", "does_not_pay"),
    (100_000, 95_000, link(20, 5, miss=0.0), "patch", "patch_pays"),
    # an EPS that never has the base: patches are pure waste
    (760_000, 600, link(20, 5, miss=1.0), "direct", "does_not_pay"),
    # not smaller, none, over the EPS's limit
    (5_000, 5_000, link(20, 5), "full", "patch_not_smaller"),
    (5_000, 9_000, link(1, 80), "full", "patch_not_smaller"),
    (5_000, None, link(20, 5), "full", "no_patch"),
    (200 * 2**20, 65 * 2**20, link(1, 80), "full", "patch_over_limit"),
    # issue 13: the 1 MB-text .docx (381 kB) whose rebuild takes the EPS 70 ms:
    # at 100 Mbit/s the whole file (30 ms) beats the patch's wait; at 20 and 5 Mbit/s it does not
    (381_000, 180, link(100, 5, rebuild_mb_s=5.4), "direct", "does_not_pay"),
    (381_000, 180, link(20, 10, rebuild_mb_s=5.4), "patch", "patch_pays"),
    (381_000, 180, link(5, 20, rebuild_mb_s=5.4), "patch", "patch_pays"),
    # the same EPS once the rebuild copies the unchanged blocks (10 ms): the patch pays at 100 Mbit/s too
    (381_000, 180, link(100, 5, rebuild_mb_s=38), "patch", "patch_pays"),
    # the EPS's own overhead per save (store, hashing; 5-10 ms here) against the whole file sent directly:
    # a 5 kB file saves 1.9 ms of air time at 20 Mbit/s, less than it; a 43 kB one saves 17 ms, more
    (5_000, 300, link(20, 5, overhead_ms=5), "direct", "does_not_pay"),
    (43_000, 500, link(20, 10, overhead_ms=10), "patch", "patch_pays"),
    (43_000, 500, link(100, 5, overhead_ms=10), "direct", "does_not_pay"),
]


@pytest.mark.parametrize("size,patch,est,send,reason", CASES)
def test_decision_table(size, patch, est, send, reason):
    d = decide(size, patch, 0.001, est)
    assert (d.send, d.reason) == (send, reason), d.describe()


# file size, has base, link, expected: None (diff it) or the reason to skip
PRECHECKS = [
    (5_000, True, link(20, 5), None),
    (5_000, False, link(20, 5), "no_base"),
    (MIN_DIFF_SIZE - 1, True, link(1, 80), "too_small"),
    (MAX_DIFF_SIZE + 1, True, link(1, 80), "too_large"),
    # gigabit wired link, slow diff: sending 100 KB takes 0.8 ms, diffing it 5 ms
    (100_000, True, link(1000, 0.5), "cannot_pay"),
    # a fast diff pays on a 500 Mbit/s link (1.6 ms of air time against 0.4 ms of diff and 0.6 ms of rebuild)
    (100_000, True, link(500, 0.5, diff_mb_s=1000), None),
    # the same file on a crowded 2 Mbit/s Wi-Fi: 400 ms of air time at stake
    (100_000, True, link(2, 20), None),
    # a fast link and a slow EPS: no patch can make up for the rebuild, so no diff is made
    (381_000, True, link(300, 2, diff_mb_s=1000, rebuild_mb_s=5.4), "cannot_pay"),
    (381_000, True, link(300, 2, diff_mb_s=1000, rebuild_mb_s=1000), None),
]


@pytest.mark.parametrize("size,has_base,est,reason", PRECHECKS)
def test_precheck_table(size, has_base, est, reason):
    d = precheck(size, has_base, est)
    assert (d.reason if d else None) == reason, d and d.describe()
    if d:
        # Whole because a patch cannot pay here (or never diffed): straight to the provider;
        # whole because there is nothing to diff against yet: through the EPS, which keeps it.
        assert d.send == ("full" if reason == "no_base" else "direct"), d.describe()


@pytest.mark.parametrize("mode", ["metered", "bytes"])
def test_metered_mode_patches_whenever_smaller_even_on_a_fast_link(mode):
    fast = link(10_000, 0.05, rebuild_mb_s=1)
    assert precheck(100_000, True, fast) is not None
    assert precheck(100_000, True, fast, mode=mode) is None
    assert decide(100_000, 99_999, 0.01, fast, mode=mode) == Decision(
        "patch", "patch_smaller", "patch 99999 bytes, file 100000")
    assert decide(381_000, 180, 0.01, fast, mode=mode).send == "patch"
    assert decide(381_000, 180, 0.01, fast).send == "direct"
    assert precheck(100, True, fast, mode=mode) == Decision("full", "too_small", "100 bytes, under 1024")
    assert precheck(100, True, fast).send == "direct"


def test_the_rule_on_a_real_patch():
    """A one-character edit of a .docx-shaped file with 100 KB of text, diffed by the real core."""
    import io
    import random
    import zipfile
    rng = random.Random(7)
    words = [rng.choice(["lorem", "ipsum", "dolor", "sit", "amet", "edge", "courier", "patch"])
             for _ in range(17_000)]

    def docx(text: str) -> bytes:
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("[Content_Types].xml", "<Types/>")
            z.writestr("word/document.xml", f"<w:document><w:t>{text}</w:t></w:document>")
        return buf.getvalue()

    base = docx(" ".join(words))
    words[8_000] = "X" + words[8_000]
    new = docx(" ".join(words))
    # 12 kB compressed: on a 5 Mbit/s link a patch saves 18 ms of air time, more than
    # the diff, the EPS's rebuild and its overhead by default (on 20 Mbit/s it would not: direct).
    est = LinkEstimator(bandwidth=5 * MBIT)
    assert precheck(len(new), True, est) is None
    assert precheck(len(new), True, LinkEstimator()).send == "direct"
    patch = ec_patch.diff(base, new)
    d = decide(len(new), len(patch), 0.002, est)
    assert d.send == "patch" and len(patch) < len(new) / 10, d.describe()
    assert est.samples["diff"] == 1


# ----- the estimator -----------------------------------------------------------------

def test_defaults_before_any_measurement():
    est = LinkEstimator()
    assert est.bandwidth == pytest.approx(20 * MBIT)
    assert est.rtt == pytest.approx(0.005)


def test_small_exchanges_measure_rtt_and_large_ones_bandwidth():
    est = LinkEstimator()
    est.observe(300, 200, 0.030)          # a HELLO on a 30 ms link
    assert est.rtt == pytest.approx(0.030, rel=0.01)  # the first sample replaces the default
    assert est.samples["bandwidth"] == 0
    est.observe(1_000_000, 200, 0.030 + 1_000_200 / (4 * MBIT))   # 1 MB at 4 Mbit/s
    assert est.bandwidth == pytest.approx(4 * MBIT, rel=0.05)
    for _ in range(30):                   # the link gets faster: the average follows
        est.observe(1_000_000, 200, 0.030 + 1_000_200 / (40 * MBIT))
    assert est.bandwidth == pytest.approx(40 * MBIT, rel=0.05)
    assert est.rtt == pytest.approx(0.030, rel=0.01)


def test_one_odd_sample_moves_the_average_only_by_alpha():
    est = LinkEstimator()
    est.observe(200, 200, 0.010)
    est.observe(200, 200, 0.010)
    est.observe(200, 200, 1.010)          # one stall
    assert est.rtt == pytest.approx(0.75 * 0.010 + 0.25 * 1.010, rel=0.01)


def test_absurd_samples_are_clamped_or_ignored():
    est = LinkEstimator()
    est.observe(10**9, 0, 1e-9)
    assert est.bandwidth <= 1.25e9
    before = (est.bandwidth, est.rtt)
    est.observe(100, 100, 0.0)
    est.observe(100, 100, -1.0)
    assert (est.bandwidth, est.rtt) == before
    with pytest.raises(ValueError):
        LinkEstimator(alpha=0)


def test_base_misses_and_diff_speed_are_learnt():
    from ec_proxy.decide import MISS_PRIOR, MISS_WINDOW
    est = LinkEstimator()
    assert est.miss_rate == 0.05
    # One miss is evidence, weighed against the prior's MISS_PRIOR saves at 5 %: not the new rate.
    est.observe_base(False)
    assert est.miss_rate == pytest.approx((1 + MISS_PRIOR * 0.05) / (1 + MISS_PRIOR))
    for _ in range(MISS_WINDOW):
        est.observe_base(False)
    assert est.miss_rate > 0.7                      # an EPS that keeps losing its state
    for _ in range(MISS_WINDOW):
        est.observe_base(True)
    # The window forgets the bad period; the prior keeps q above 0.
    assert est.miss_rate == pytest.approx(MISS_PRIOR * 0.05 / (MISS_WINDOW + MISS_PRIOR))
    assert est.samples["base"] == 2 * MISS_WINDOW + 1
    est.observe_diff(10_000_000, 1.0003)
    assert est.diff_rate == pytest.approx(10e6, rel=0.01)
    assert est.diff_seconds(9_000_000) == pytest.approx(0.9003, rel=0.01)


def test_one_base_miss_does_not_stop_the_patches_that_pay():
    """Regression (2026-11-28): with q's first sample replacing its default,
    one `base_unknown` made q 100 %, after which no patch paid and none was
    sent to lower it again: at 5 Mbit/s the 1 MB-text document went directly,
    646 ms against 76 ms patched."""
    est = link(5, 20, diff_mb_s=40, rebuild_mb_s=30)
    size = 381_000
    est.observe_base(False)
    assert precheck(size, True, est) is None
    d = decide(size, 600, 0.011, est)
    assert (d.send, d.reason) == ("patch", "patch_pays"), d.describe()
    assert "base misses 10%" in d.detail, d.detail


def test_the_measured_rule_charges_the_base_miss_risk():
    """A patched save measured a little quicker than a direct one is not
    worth it when the EPS often lacks the base: each miss costs one more
    round trip and the whole file (the measured patched saves are those
    answered in one exchange)."""
    from ec_proxy.decide import MISS_WINDOW
    size = 381_000
    est = link(100, 5, diff_mb_s=1000)
    _saves(est, size, patch_ms=40, direct_ms=42)
    assert decide(size, 160, 0.010, est).reason == "patch_faster"
    for _ in range(MISS_WINDOW):
        est.observe_base(False)                     # q about 0.76: risk 0.76 x (5 + 30.5) ms
    pre = precheck(size, True, est)
    assert (pre.send, pre.reason) == ("direct", "direct_faster"), pre.describe()


def test_diff_and_rebuild_costs_are_learnt_per_size_class_from_the_quickest_recent():
    """A 5 kB document's diff costs the call's fixed part: its rate must not
    price a 381 kB one (the size class's prior does until one is seen); a
    cold first diff or rebuild (nothing known of the base) must not price the
    saves after a warm one; the quickest of the last COST_WINDOW counts, so
    a document that got slower is priced slower once the quick ones age out."""
    from ec_proxy.decide import COST_WINDOW, DIFF_OVERHEAD, REBUILD_OVERHEAD
    est = LinkEstimator()
    prior = est.diff_seconds(381_000), est.rebuild_seconds(381_000)
    for _ in range(20):
        est.observe_diff(5_550, 0.0015)
        est.observe_rebuild(5_550, 0.0020)
    assert (est.diff_seconds(381_000), est.rebuild_seconds(381_000)) == prior
    assert est.diff_seconds(5_550) == pytest.approx(0.0015, rel=0.01)
    est.observe_diff(381_000, 0.017)       # cold
    est.observe_rebuild(381_000, 0.025)
    assert est.diff_seconds(381_000) == pytest.approx(0.017, rel=0.01)
    assert est.diff_seconds(400_000) == pytest.approx(DIFF_OVERHEAD + 400_000 * (0.017 - DIFF_OVERHEAD) / 381_000, rel=0.01)
    est.observe_diff(381_000, 0.0033)      # warm
    est.observe_rebuild(381_000, 0.011)
    est.observe_diff(381_000, 0.017)       # cold again (the next document of that size)
    assert est.diff_seconds(381_000) == pytest.approx(0.0033, rel=0.01)
    assert est.rebuild_seconds(381_000) == pytest.approx(0.011, rel=0.01)
    for _ in range(COST_WINDOW):
        est.observe_rebuild(381_000, 0.020)
    assert est.rebuild_seconds(381_000) == pytest.approx(0.020, rel=0.01)
    assert est.rebuild_seconds(381_000) > REBUILD_OVERHEAD
    assert "diff 40 MB/s" in est.describe(2_000_000) and "EPS rebuild 30 MB/s" in est.describe(2_000_000)


def test_small_documents_do_not_keep_a_large_one_from_being_patched():
    """proxy_bench's 100 Mbit/s profile: the 1 kB and 100 kB documents go
    directly, and their diffs are slow per byte; the 1 MB-text one, whose
    patch saves 30 ms of air time, is still diffed and patched."""
    est = link(100, 5, diff_mb_s=40, rebuild_mb_s=30, overhead_ms=1.3)  # the priors, DEFAULT_*_RATE
    for size, diff_s, rebuild_s in ((5_550, 0.0015, 0.002), (43_400, 0.003, 0.004)):
        for _ in range(4):
            est.observe_diff(size, diff_s)
            est.observe_rebuild(size, rebuild_s)
    assert precheck(381_000, True, est) is None
    d = decide(381_000, 610, 0.0033, est)
    assert (d.send, d.reason) == ("patch", "patch_pays"), d.describe()


def test_the_eps_rebuild_time_is_learnt_from_its_reports():
    est = LinkEstimator()
    assert est.samples["rebuild"] == 0
    est.observe_rebuild(381_000, 0.0705)          # the EPS said rb;dur=70.5 for a 381 kB file
    assert est.rebuild_seconds(381_000) == pytest.approx(0.0705, rel=0.01)
    for _ in range(30):                           # it got faster (blocks copied): the average follows
        est.observe_rebuild(381_000, 0.0105)
    assert est.rebuild_seconds(381_000) == pytest.approx(0.0105, rel=0.05)
    est.observe_rebuild(381_000, 0.0)             # nonsense is ignored
    est.observe_rebuild(0, 1.0)
    assert est.samples["rebuild"] == 31


def test_the_eps_own_time_is_taken_off_a_save_to_measure_the_link():
    est = LinkEstimator()
    # a 600-byte save that took 45 ms, 40 of them in the EPS (provider upload and rebuild): a 5 ms link
    est.observe_exchange(450, 150, 0.045, 0.040)
    assert est.rtt == pytest.approx(0.005, rel=0.05)
    # a 381 kB FULL save over 20 Mbit/s whose EPS part took 30 ms
    est.observe_exchange(381_000, 150, 0.030 + 0.005 + 381_150 / (20 * MBIT), 0.030)
    assert est.bandwidth == pytest.approx(20 * MBIT, rel=0.05)
    before = (est.bandwidth, est.rtt, dict(est.samples))
    est.observe_exchange(450, 150, 0.040, 0.045)  # an EPS time longer than the exchange: no sample
    assert (est.bandwidth, est.rtt, est.samples) == before


def test_a_slow_diff_teaches_the_precheck_to_skip_the_next_one():
    est = link(100, 1, diff_mb_s=1000)
    assert precheck(200_000, True, est) is None
    d = decide(200_000, 1_000, 0.5, est)   # this diff took half a second
    assert d.send == "patch"               # spent anyway: the patch still goes
    assert precheck(200_000, True, est).reason == "cannot_pay"


def test_a_first_high_round_trip_does_not_hide_the_bandwidth():
    """A slow first HELLO (a busy EPS) must not make a 44 kB save count as a round trip."""
    est = LinkEstimator()
    est.observe(300, 200, 0.120)
    est.observe(44_000, 500, 0.020 + 44_500 / (5 * MBIT))   # a FULL save's link time at 5 Mbit/s
    assert est.samples["bandwidth"] == 1
    assert 4 * MBIT < est.bandwidth < 10 * MBIT   # not the 20 Mbit/s default; half the duration at least is transfer


def test_pessimistic_rates_are_measured_again_after_some_whole_saves():
    """A cold first diff and rebuild (nothing learnt about the base yet) make
    the rule send whole; every EXPLORE_EVERY-th such save is diffed and sent as
    a patch, whose diff and rebuild times correct the estimates."""
    from ec_proxy.decide import EXPLORE_EVERY
    est = link(5, 20, diff_mb_s=0.5, rebuild_mb_s=1)
    size = 43_000
    reasons = []
    for _ in range(2 * EXPLORE_EVERY + 2):
        pre = precheck(size, True, est)
        if pre is not None:
            reasons.append(pre.reason)
            continue
        d = decide(size, 170, 0.002, est)          # the diff, warm now, took 2 ms
        reasons.append(d.reason)
        if d.send == "patch":
            est.observe_rebuild(size, 0.003)        # and the EPS rebuilt it in 3 ms
    assert reasons[:EXPLORE_EVERY] == ["cannot_pay"] * EXPLORE_EVERY
    assert reasons[EXPLORE_EVERY] in ("explore", "patch_pays"), reasons   # diffed and patched anyway
    assert reasons[-1] == "patch_pays", reasons      # the estimates followed the measurements


def test_the_eps_overhead_is_learnt_from_its_reported_times():
    """Spec §7.3: `eps` - `rb` - `pv` is what the EPS adds on its own; the first
    sample replaces the default, later ones are averaged; nonsense is ignored."""
    est = LinkEstimator()
    assert est.eps_overhead == pytest.approx(0.005)
    est.observe_eps_overhead(0.012)
    assert est.eps_overhead == pytest.approx(0.012)
    est.observe_eps_overhead(0.004)
    assert est.eps_overhead == pytest.approx(0.75 * 0.012 + 0.25 * 0.004)
    est.observe_eps_overhead(-1)
    assert est.eps_overhead == pytest.approx(0.75 * 0.012 + 0.25 * 0.004)
    est.observe_eps_overhead(50)
    assert est.eps_overhead <= 1.0


def test_small_saves_alone_teach_the_bandwidth():
    """A link whose exchanges are all small (a 5.5 kB document: HELLO, its
    FULL, then patches) still measures its bandwidth: the line through the
    small exchanges' and the larger ones' averages. Before, every exchange
    under 16 kB counted as a round trip and the bandwidth stayed at its
    20 Mbit/s default, so on a 5 Mbit/s link the 5.5 kB file went directly
    although its 516-byte patch saved more air time than it cost."""
    est = LinkEstimator()
    rtt, b = 0.020, 5 * MBIT
    est.observe(300, 200, rtt + 500 / b)             # HELLO
    est.observe(5_550 + 150, 150, rtt + 5_850 / b)   # the first save: FULL
    assert est.bandwidth == pytest.approx(b, rel=0.01)
    assert est.rtt == pytest.approx(rtt, rel=0.01)
    assert precheck(5_550, True, est) is None        # worth a diff
    assert decide(5_550, 516, 0.0005, est).send == "patch"
    est.observe(516 + 150, 150, rtt + 816 / b)       # the patch's exchange
    assert est.bandwidth == pytest.approx(b, rel=0.01) and est.rtt == pytest.approx(rtt, rel=0.01)


def test_a_first_round_trip_measured_high_is_forgotten_at_the_next_small_exchange():
    """The first HELLO on a fresh connection took 27 ms on a 20 ms / 5 Mbit/s
    hop (proxy_bench's link part, 2 of 3 runs): with the small exchanges'
    average, the line through it said 10-18 Mbit/s and kept saying too fast
    a link for several more small exchanges, so a 5.5 kB document went
    directly although its patch was faster. The least delayed small
    exchange is the line's small point: one normal exchange corrects it."""
    est = LinkEstimator()
    rtt, b = 0.020, 5 * MBIT
    est.observe(300, 200, 0.027)                     # HELLO, slow
    est.observe(5_550 + 150, 150, rtt + 5_850 / b)   # FULL
    assert est.bandwidth > 1.5 * b                   # misled, as measured
    est.observe(516 + 150, 150, rtt + 816 / b)       # one patch's exchange
    assert est.bandwidth == pytest.approx(b, rel=0.02) and est.rtt == pytest.approx(rtt, rel=0.05)
    assert decide(5_550, 516, 0.0005, est).send == "patch"


def test_a_longer_round_trip_is_learnt():
    """A hop that became slower (5 to 40 ms: a farther access point): the
    least delayed small exchange comes from the last SMALL_WINDOW only, so
    the new round trip and the unchanged bandwidth are learnt again. (While
    the two classes catch up, the line may say a wrong bandwidth for a few
    saves, as the small exchanges' average did.)"""
    est = LinkEstimator()
    b = 5 * MBIT
    est.observe(5_550 + 150, 150, 0.005 + 5_850 / b)
    for _ in range(3):
        est.observe(666, 150, 0.005 + 816 / b)
    for _ in range(2 * SMALL_WINDOW):                     # a save whole, three as patches
        est.observe(5_550 + 150, 150, 0.040 + 5_850 / b)
        for _ in range(3):
            est.observe(666, 150, 0.040 + 816 / b)
    assert est.rtt == pytest.approx(0.040, rel=0.05) and est.bandwidth == pytest.approx(b, rel=0.1)


def test_on_a_fast_link_the_line_says_fast():
    est = LinkEstimator()
    rtt, b = 0.002, 300 * MBIT
    est.observe(300, 200, rtt + 500 / b)
    est.observe(5_700, 150, rtt + 5_850 / b)
    assert est.bandwidth == pytest.approx(b, rel=0.01)
    assert precheck(5_550, True, est).send == "direct"


def test_a_larger_exchange_that_was_not_slower_teaches_no_line():
    """Jitter can make the larger exchange the faster one: no line through
    the two (it would say an infinite or negative bandwidth); the one-sample
    rule goes on."""
    est = LinkEstimator()
    est.observe(300, 200, 0.010)
    est.observe(5_700, 150, 0.009)
    assert 0 < est.bandwidth < 1.25e9 and est.rtt > 0
    assert est.samples["bandwidth"] == 0


def _saves(est: LinkEstimator, size: int, *, patch_ms: float | None = None, direct_ms: float | None = None, n: int = 3):
    """n measured saves each way; `patch_ms`: a patched save after its diff (the diff is priced apart)."""
    for _ in range(n):
        if patch_ms is not None:
            est.observe_save("patch", size, patch_ms / 1e3)
        if direct_ms is not None:
            est.observe_save("direct", size, direct_ms / 1e3)


def test_measured_saves_overrule_a_model_that_says_patch():
    """proxy_bench's 300 Mbit/s hop, versions new to every process: the
    link was estimated at 100 Mbit/s from the base's one FULL upload, so the
    model said a patch saves 31 ms for 15 ms of rebuild; measured, patched
    saves took 45 ms (35 after a 10 ms diff) and direct ones 30 ms. The
    measurement decides."""
    est = link(100, 3.4, diff_mb_s=40, rebuild_mb_s=36, overhead_ms=2.4)
    size = 381_000
    assert decide(size, 160, 0.010, est).reason == "patch_pays"       # the model alone
    _saves(est, size, patch_ms=35, direct_ms=30)
    pre = precheck(size, True, est)
    assert (pre.send, pre.reason) == ("direct", "direct_faster"), pre.describe()
    assert "then 35.00 ms, base-miss risk 1.69 ms), a direct one 30.00 ms" in pre.detail, pre.detail
    # Another size class (files within a factor of 4) is not priced by these saves: the model decides.
    assert precheck(40_000, True, est).reason == "cannot_pay"


def test_measured_saves_overrule_a_model_that_says_direct():
    """The other way: the model says even an empty patch cannot pay (a link
    measured too fast), the app's saves say a patch is quicker."""
    est = link(1000, 0.5, diff_mb_s=40, rebuild_mb_s=30)
    size = 381_000
    assert precheck(size, True, est).reason == "cannot_pay"
    _saves(est, size, patch_ms=20, direct_ms=50)
    assert precheck(size, True, est) is None
    d = decide(size, 160, 0.011, est)
    assert (d.send, d.reason) == ("patch", "patch_faster"), d.describe()


def test_a_size_class_with_patched_saves_only_measures_a_direct_one_when_it_is_cheap():
    """After a patched save, one save goes directly to measure that path,
    unless the link makes the whole file far slower than the patch measured
    (a 381 kB file at 5 Mbit/s: 610 ms against a 66 ms patch)."""
    size = 381_000
    slow = link(5, 20)
    _saves(slow, size, patch_ms=66, n=1)
    assert precheck(size, True, slow) is None                        # the model decides: no measuring
    fast = link(100, 3.4)
    _saves(fast, size, patch_ms=45, n=1)
    pre = precheck(size, True, fast)
    assert (pre.send, pre.reason) == ("direct", "explore_direct"), pre.describe()
    _saves(fast, size, direct_ms=30, n=1)
    assert precheck(size, True, fast).reason == "direct_faster"


def test_the_losing_way_is_measured_again_less_often_while_the_rule_keeps_its_way():
    """Measured decisions age: after EXPLORE_EVERY saves in a row that the
    measurement sends one way, one goes the other way (within the cost
    bound); each such exploration after which the rule keeps its way doubles
    the count before the next, up to EXPLORE_EVERY_MAX; a change of way
    starts it again from EXPLORE_EVERY."""
    from ec_proxy.decide import COST_WINDOW, EXPLORE_EVERY, EXPLORE_EVERY_MAX
    size = 381_000

    def explorations(reasons, mark):
        at = [i for i, r in enumerate(reasons) if r == mark]
        return at, [b - a for a, b in zip(at, at[1:])]

    spacing = [2 * EXPLORE_EVERY + 1, 4 * EXPLORE_EVERY + 1, EXPLORE_EVERY_MAX + 1, EXPLORE_EVERY_MAX + 1]
    # Patched saves measured quicker (a patched save: its 10 ms diff, learnt at the
    # first decide, 40 ms after it and the base-miss risk; a direct one 55 ms).
    est = link(100, 3.4, diff_mb_s=1000)
    _saves(est, size, patch_ms=40, direct_ms=55)
    reasons = [(precheck(size, True, est) or decide(size, 160, 0.010, est)).reason for _ in range(300)]
    at, gaps = explorations(reasons, "explore_direct")
    assert at[0] == EXPLORE_EVERY and gaps[:4] == spacing, (at, gaps)
    assert set(reasons) == {"patch_faster", "explore_direct"}, set(reasons)
    # Direct saves measured quicker: every so often one is diffed and patched anyway.
    est = link(100, 3.4, diff_mb_s=1000)
    _saves(est, size, patch_ms=50, direct_ms=30)
    reasons = []
    for _ in range(300):
        pre = precheck(size, True, est)
        reasons.append(pre.reason if pre is not None else decide(size, 160, 0.010, est).reason)
    at, gaps = explorations(reasons, "explore")
    assert at[0] == EXPLORE_EVERY and gaps[:4] == spacing, (at, gaps)
    assert set(reasons) == {"direct_faster", "explore"}, set(reasons)
    assert est.whole_every == EXPLORE_EVERY_MAX
    # The link changes: patched saves are quicker now. The rule patches, and the
    # next run of direct saves is explored after EXPLORE_EVERY again.
    _saves(est, size, patch_ms=5, n=COST_WINDOW)
    assert precheck(size, True, est) is None
    assert decide(size, 160, 0.010, est).reason == "patch_faster"
    assert est.whole_every == EXPLORE_EVERY
    # Never when the other way was measured far slower.
    est = link(100, 3.4, diff_mb_s=1000)
    _saves(est, size, patch_ms=40, direct_ms=200)
    assert all((precheck(size, True, est) or decide(size, 160, 0.010, est)).reason == "patch_faster"
               for _ in range(3 * EXPLORE_EVERY))
