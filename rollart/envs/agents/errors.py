"""OpenAI-style errors of the gateway: one exception, rendered as `{"error": {message, type, param, code}}`.

`retryable` errors (a generation that failed on the inference plane, too many concurrent calls) let the
`openai` client retry; every other error carries `x-should-retry: false`, so a refused request is refused
once and the agent sees it at once. `close` errors end their connection (the request's body was not read to
its end: too slow or too large).
"""

from __future__ import annotations

from typing import Any


class GatewayError(Exception):
    def __init__(
        self,
        status: int,
        message: str,
        *,
        code: str,
        param: str | None = None,
        kind: str = "invalid_request_error",
        retryable: bool = False,
        close: bool = False,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind
        self.retryable, self.close = retryable, close

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.kind, "param": self.param, "code": self.code}}

    def headers(self) -> dict[str, str]:
        """`close`: the connection ends after this answer (a body left unread: too slow or too large)."""
        return ({} if self.retryable else {"x-should-retry": "false"}) | ({"connection": "close"} if self.close else {})


def bad_request(message: str, param: str | None = None, code: str = "invalid_value") -> GatewayError:
    return GatewayError(400, message, code=code, param=param)


def unsupported(param: str, value: Any, supported: str) -> GatewayError:
    """A parameter (or value) the gateway does not implement, refused by name."""
    return GatewayError(
        400, f"'{param}'={value!r:.80} is not supported by the rollart gateway ({supported})",
        code="unsupported_parameter", param=param,
    )
