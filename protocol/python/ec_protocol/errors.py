"""Protocol errors (spec §10) as one exception class.

Every failure the codec detects, and every ERROR message the EPS sends, is a
`ProtocolError` carrying the code's name, its HTTP status and stage, the item
or context list and a human detail. The table below is the contract of §10:
code numbers, names, HTTP statuses and default stages.
"""

from __future__ import annotations

from dataclasses import dataclass

#: number -> (name, http status, default stage). Stage "0/1" codes default to 0.
ERROR_TABLE: dict[int, tuple[str, int, int]] = {
    1: ("malformed", 400, 0),
    2: ("unsupported_version", 400, 0),
    3: ("auth_failed", 401, 0),
    4: ("session_unknown", 401, 0),
    5: ("replayed", 409, 0),
    6: ("too_large", 413, 0),
    7: ("limit_exceeded", 400, 0),
    8: ("invalid_request", 422, 0),
    9: ("unsupported", 422, 0),
    10: ("host_forbidden", 403, 0),
    11: ("key_forbidden", 403, 0),
    12: ("context_unknown", 409, 0),
    13: ("base_unknown", 409, 0),
    14: ("patch_failed", 422, 0),
    15: ("target_mismatch", 422, 0),
    16: ("request_id_conflict", 409, 0),
    17: ("in_progress", 503, 1),
    18: ("busy", 503, 0),
    19: ("storage_error", 500, 0),
    20: ("provider_unreachable", 502, 0),
    21: ("provider_timeout", 504, 1),
    22: ("provider_truncated", 502, 1),
    23: ("provider_protocol", 502, 1),
    24: ("internal", 500, 0),
}

CODE_NUMBER: dict[str, int] = {name: num for num, (name, _, _) in ERROR_TABLE.items()}


@dataclass(frozen=True)
class _Info:
    number: int
    http: int
    stage: int


def code_info(code: str) -> _Info:
    """Number, HTTP status and default stage of a code name (KeyError if unknown)."""
    num = CODE_NUMBER[code]
    _, http, stage = ERROR_TABLE[num]
    return _Info(num, http, stage)


class ProtocolError(Exception):
    """A protocol failure of §10.

    `code` is the name (``"malformed"``), `http` the HTTP status of §10,
    `stage` 0 (no provider contacted) or 1, `list` the item indexes or
    context ids the code concerns, `detail` text for people, `cause` the
    edit-patch code for ``patch_failed``, `retry_after_ms` the wait an
    ``in_progress``/``busy`` asks for. `authenticated` is False for an ERROR
    whose MAC was zero or failed (§3.2): it may cause a fallback, never a
    change of state.
    """

    def __init__(
        self,
        code: str,
        detail: str = "",
        *,
        stage: int | None = None,
        list: tuple[int, ...] | list[int] = (),  # noqa: A002 - the spec's field name
        cause: str = "",
        retry_after_ms: int = 0,
        authenticated: bool = True,
    ) -> None:
        info = code_info(code)
        self.code = code
        self.number = info.number
        self.http = info.http
        self.stage = info.stage if stage is None else stage
        self.list = tuple(list)
        self.detail = detail
        self.cause = cause
        self.retry_after_ms = retry_after_ms
        self.authenticated = authenticated
        text = f"{code}: {detail}" if detail else code
        if self.list:
            text += f" (list {list_text(self.list)})"
        super().__init__(text)


def list_text(values: tuple[int, ...]) -> str:
    return ", ".join(str(v) for v in values)


def malformed(detail: str) -> ProtocolError:
    return ProtocolError("malformed", detail)
