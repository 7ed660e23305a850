"""Named link profiles of the netns testbed, with where their numbers come from.

A profile is one emulated link: a rate each way (shaped by the kernel's tbf),
a round-trip time (added by ec-delayline, half each way) and a loss rate
(ec-delayline, each way). `kind` says where it goes: `wifi` between the
device (and the two cross-traffic hosts) and the access point, `wan`
between the access point and the cloud.

Sources. Rates of the Wi-Fi profiles are practical 802.11ac TCP rates from
M. Sauter, *From GSM to LTE-Advanced Pro and 5G*, Wiley, Table 6.7
("Achievable 802.11ac datarates in practice": 300-380 Mbit/s for a 3x3
standard access point at close range; 100 Mbit/s for a 2x2 USB adapter
20 m away through walls). The FCC's broadband benchmark (25 Mbit/s down,
3 Mbit/s up; FCC 2015 Broadband Progress Report, GN Docket 14-126) gives the
slow WAN. Profiles marked `assumed` take numbers that no measurement here
backs: they are chosen to span the range (slow and lossy hotspots), and
say so. One-way Wi-Fi delays of a few milliseconds are assumed too.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class LinkProfile:
    name: str
    kind: str  # "wifi" or "wan"
    down_mbit: float  # toward the device (wifi) / toward the access point (wan)
    up_mbit: float
    rtt_ms: float
    loss: float  # probability per packet, each way
    source: str

    @property
    def one_way_ms(self) -> float:
        return self.rtt_ms / 2

    def describe(self) -> str:
        loss = f", {self.loss:.1%} loss each way" if self.loss else ""
        return (f"{self.name}: {self.down_mbit:g} Mbit/s down, {self.up_mbit:g} Mbit/s up, "
                f"RTT {self.rtt_ms:g} ms{loss}")


SAUTER = "Sauter, From GSM to LTE-Advanced Pro and 5G (Wiley), Table 6.7"
PROFILES: dict[str, LinkProfile] = {p.name: p for p in (
    LinkProfile("wifi-ac-near", "wifi", 340, 340, 2, 0.0,
                f"{SAUTER}: 300-380 Mbit/s, 3x3 802.11ac AP, close range (midpoint); RTT assumed"),
    LinkProfile("wifi-ac-far", "wifi", 100, 100, 4, 0.0,
                f"{SAUTER}: 100 Mbit/s, 2x2 adapter, 20 m through walls; RTT assumed"),
    LinkProfile("wifi-20m", "wifi", 20, 20, 10, 0.0,
                "assumed: a busy hotspot (the 20 Mbit/s / 10 ms hop of experiments/bench/proxy_bench.py)"),
    LinkProfile("wifi-5m", "wifi", 5, 5, 20, 0.0,
                "assumed: a congested hotspot (the 5 Mbit/s / 20 ms hop of experiments/bench/proxy_bench.py)"),
    LinkProfile("wifi-lossy", "wifi", 20, 20, 10, 0.01,
                "assumed: wifi-20m with 1% loss each way (interference)"),
    LinkProfile("wan-fcc25", "wan", 25, 3, 30, 0.0,
                "FCC 2015 broadband benchmark, 25 Mbit/s down / 3 Mbit/s up; RTT to a cloud region assumed"),
    LinkProfile("wan-fiber", "wan", 300, 300, 20, 0.0,
                "assumed: a symmetric fibre uplink; RTT to a cloud region assumed"),
)}

DEFAULT_WIFI = "wifi-ac-far"
DEFAULT_WAN = "wan-fiber"


def get(name: str, kind: str) -> LinkProfile:
    try:
        profile = PROFILES[name]
    except KeyError:
        raise SystemExit(f"unknown link profile {name!r}; known: {', '.join(PROFILES)}") from None
    if profile.kind != kind:
        raise SystemExit(f"profile {name} is a {profile.kind} link, not a {kind} link")
    return profile
