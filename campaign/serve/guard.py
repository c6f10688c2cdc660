"""Who may read the dashboard, and what a browser may do with its pages.

- **Token.** Off the loopback interface every request needs the server's
  token: ``?token=`` once (the printed URL, as Jupyter does; the server then
  sets an HttpOnly, SameSite=Strict cookie named after its port and
  redirects to the URL without it, so it stays out of history and Referer),
  the cookie, or an ``Authorization: Bearer`` header. Otherwise 401.
  Compared in constant time. WebSocket connections are refused.
- **Host.** On loopback, a request naming another host is refused (400): a
  page on some web site cannot reach the dashboard by pointing its own name
  at 127.0.0.1 (DNS rebinding).
- **Headers.** A Content-Security-Policy that allows scripts, styles and
  requests only from the server itself (no inline script, no CDN), no
  framing, no Referer, no MIME sniffing, and no caching of ledger data.
"""

from __future__ import annotations

import secrets
from http.cookies import CookieError, SimpleCookie
from urllib.parse import parse_qsl, urlencode

from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, RedirectResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

COOKIE = "campaign_serve_token"
POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
)
SECURITY_HEADERS = (
    (b"content-security-policy", POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cache-control", b"no-store"),
)
LOOPBACK_NAMES = ("127.0.0.1", "localhost", "::1", "[::1]")


class Guard:
    """ASGI middleware: the token (when the server has one), the Host check, the headers."""

    def __init__(self, app: ASGIApp, *, token: str | None, hosts: tuple[str, ...] | None) -> None:
        self.app = app
        self.token = token
        self.hosts = hosts  # None: any Host (a token protects the server instead)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "websocket":  # the dashboard has none: refused before any check
            await send({"type": "websocket.close", "code": 1008})
            return
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        if self.hosts is not None and _host_name(headers.get("host", "")) not in self.hosts:
            await _secured(PlainTextResponse("400: unknown Host header", 400), scope, receive,
                           send)
            return
        if self.token is not None:
            query = parse_qsl(scope.get("query_string", b"").decode("latin-1"))
            offered = [value for name, value in query if name == "token"]
            if offered and _same(offered[-1], self.token):
                await _secured(self._enter(scope, query), scope, receive, send)
                return
            if not self._carries_token(scope, headers):
                response = PlainTextResponse(
                    "401: this dashboard needs its token: open the URL `campaign serve` "
                    "printed (it ends in ?token=...)", 401,
                    headers={"www-authenticate": "Bearer"},
                )
                await _secured(response, scope, receive, send)
                return
        await self.app(scope, receive, _with_headers(send))

    def _carries_token(self, scope: Scope, headers: Headers) -> bool:
        assert self.token is not None
        try:
            cookie = SimpleCookie(headers.get("cookie", ""))
        except CookieError:
            cookie = SimpleCookie()
        name = _cookie_name(scope)
        if name in cookie and _same(cookie[name].value, self.token):
            return True
        bearer = headers.get("authorization", "")
        return bearer.startswith("Bearer ") and _same(bearer[7:], self.token)

    def _enter(self, scope: Scope, query: list[tuple[str, str]]) -> RedirectResponse:
        """The token arrived in the URL: keep it in a cookie, and go to the URL without it
        (same server: a path that starts with one slash)."""
        rest = urlencode([(k, v) for k, v in query if k != "token"])
        path = "/" + scope["path"].lstrip("/")
        response = RedirectResponse(path + (f"?{rest}" if rest else ""), 303)
        response.set_cookie(_cookie_name(scope), self.token or "", httponly=True,
                            samesite="strict")
        return response


def _same(offered: str, token: str) -> bool:
    """Constant-time comparison that any offered text can go through (bytes, not str:
    ``compare_digest`` refuses non-ASCII strings)."""
    return secrets.compare_digest(offered.encode("utf-8", "surrogateescape"), token.encode())


def _cookie_name(scope: Scope) -> str:
    """One cookie per port: two dashboards on one host never overwrite each other's token
    (cookies are not scoped by port)."""
    server = scope.get("server") or ("", 0)
    return f"{COOKIE}_{server[1]}"


def _host_name(host: str) -> str:
    """The name of a Host header without its port (``[::1]:8321`` -> ``[::1]``)."""
    if host.startswith("["):
        return host[: host.find("]") + 1]
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def _with_headers(send: Send) -> Send:
    async def sending(message: Message) -> None:
        if message["type"] == "http.response.start":
            message["headers"] = [*message.get("headers", []), *SECURITY_HEADERS]
        await send(message)

    return sending


async def _secured(response: PlainTextResponse | RedirectResponse, scope: Scope,
                   receive: Receive, send: Send) -> None:
    await response(scope, receive, _with_headers(send))
