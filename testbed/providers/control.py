"""Injectable faults and the request log: the state behind the admin API.

A fault is armed for one provider (or `*`) and one route name (or `*`, see
`GET /__testbed/routes`) and fires on the next `count` matching requests:

- `status`: answer `status` (default 503) with the provider's own error shape.
- `throttle`: answer 429 with `Retry-After: retry_after` in the provider's shape.
- `delay`: wait `delay` seconds, then handle the request normally.
- `drop`: close the connection without an answer; `when: "before"` (default)
  drops before the request is handled (nothing stored), `when: "after"`
  handles it (the file is stored) and then drops, like a lost response.
- `truncate`: handle the request, send the head with the full Content-Length,
  then only `truncate_at` body bytes (default: half), then close.

The log records, per request: provider, route, method, host, path with query,
every header except `Authorization` and `Cookie` (with `authorization_present`
saying whether one was sent), body size and SHA-256, the status sent and the
fault applied, so tests can assert exactly what the provider received.
"""

from __future__ import annotations

import itertools
from dataclasses import asdict, dataclass, field
from typing import Any

FAULT_KINDS = ("status", "throttle", "delay", "drop", "truncate")
PROVIDERS = ("dropbox", "graph", "drive", "webdav")


class FaultSpecError(ValueError):
    """An admin request that does not describe a valid fault."""


@dataclass
class Fault:
    id: int
    kind: str
    provider: str = "*"
    route: str = "*"
    method: str = "*"
    count: int = 1
    status: int = 503
    retry_after: int = 1
    delay: float = 0.0
    when: str = "before"
    truncate_at: int | None = None
    fired: int = 0

    def matches(self, provider: str, route: str, method: str) -> bool:
        return (
            self.count > 0
            and self.provider in ("*", provider)
            and self.route in ("*", route)
            and self.method in ("*", method.upper())
        )


@dataclass
class Control:
    faults: list[Fault] = field(default_factory=list)
    log: list[dict[str, Any]] = field(default_factory=list)
    _ids: Any = field(default_factory=lambda: itertools.count(1))
    _seq: Any = field(default_factory=lambda: itertools.count(1))

    def add_fault(self, spec: dict[str, Any]) -> Fault:
        if not isinstance(spec, dict):
            raise FaultSpecError("a fault is a JSON object")
        kind = spec.get("kind")
        if kind not in FAULT_KINDS:
            raise FaultSpecError(f"kind must be one of {FAULT_KINDS}, got {kind!r}")
        provider = spec.get("provider", "*")
        if provider != "*" and provider not in PROVIDERS:
            raise FaultSpecError(f"provider must be '*' or one of {PROVIDERS}, got {provider!r}")
        allowed = {"kind", "provider", "route", "method", "count", "status", "retry_after", "delay", "when", "truncate_at"}
        unknown = set(spec) - allowed
        if unknown:
            raise FaultSpecError(f"unknown fields {sorted(unknown)}; allowed: {sorted(allowed)}")
        when = spec.get("when", "before")
        if when not in ("before", "after"):
            raise FaultSpecError("when must be 'before' or 'after'")
        try:
            fault = Fault(
                id=next(self._ids),
                kind=kind,
                provider=provider,
                route=str(spec.get("route", "*")),
                method=str(spec.get("method", "*")).upper(),
                count=int(spec.get("count", 1)),
                status=int(spec.get("status", 503)),
                retry_after=int(spec.get("retry_after", 1)),
                delay=float(spec.get("delay", 0.0)),
                when=when,
                truncate_at=None if spec.get("truncate_at") is None else int(spec["truncate_at"]),
            )
        except (TypeError, ValueError) as e:
            raise FaultSpecError(f"bad number in fault: {e}") from e
        if kind == "status" and not 400 <= fault.status <= 599:
            raise FaultSpecError("status must be 400..599")
        self.faults.append(fault)
        return fault

    def take(self, provider: str, route: str, method: str) -> Fault | None:
        for fault in self.faults:
            if fault.matches(provider, route, method):
                fault.count -= 1
                fault.fired += 1
                return fault
        return None

    def faults_json(self) -> list[dict[str, Any]]:
        return [asdict(f) for f in self.faults]

    def record(self, entry: dict[str, Any]) -> dict[str, Any]:
        entry["seq"] = next(self._seq)
        self.log.append(entry)
        return entry

    def reset(self) -> None:
        self.faults.clear()
        self.log.clear()
