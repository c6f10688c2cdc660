"""Starting and stopping the dashboard: the address, the token, the socket, uvicorn.

The socket is bound here, before uvicorn starts, so a busy port is one
clear error (and ``--port 0`` picks a free one and prints it). Off the
loopback interface a token is required: generated when none is given and
printed in the URL, as Jupyter does. uvicorn handles Ctrl-C and SIGTERM: it
stops taking requests, finishes the ones in flight, and returns.
"""

from __future__ import annotations

import copy
import ipaddress
import logging
import re
import secrets
import signal
import socket
import sys
from typing import TextIO

from campaign.errors import ServeError
from campaign.ledger import LedgerReader
from campaign.serve.guard import LOOPBACK_NAMES


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def choose_token(host: str, token: str | None) -> str | None:
    """The token the server will ask for: the one given; else none on loopback, a new one
    elsewhere. An empty token off loopback is refused."""
    if token is not None and token.strip() == "":
        if is_loopback(host):
            return None
        raise ServeError(f"--host {host} is not a loopback address: the dashboard needs a "
                         "token there (leave --token out to have one generated)")
    if token is None and not is_loopback(host):
        return secrets.token_urlsafe(24)
    return token


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port); :class:`ServeError` naming what is wrong."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host.strip("[]"), port, type=socket.SOCK_STREAM)[0]
    except socket.gaierror as error:
        raise ServeError(f"--host {host}: not an address of this machine ({error})") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(128)
    except OSError as error:
        sock.close()
        if error.errno == 98:  # EADDRINUSE
            raise ServeError(f"port {port} on {host} is already in use: pass --port N "
                             "(--port 0 takes any free port)") from None
        raise ServeError(f"cannot listen on {host}:{port}: {error.strerror}") from None
    return sock


def serve(
    reader: LedgerReader,
    host: str,
    port: int,
    token: str | None,
    *,
    access_log: bool = False,
    out: TextIO | None = None,
) -> None:
    """Serve the dashboard over ``reader`` until Ctrl-C or SIGTERM."""
    import uvicorn

    from campaign.serve.app import create_app

    token = choose_token(host, token)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    shown = socket.gethostname() if host in ("0.0.0.0", "::", "[::]") else host  # reachable
    shown = f"[{shown.strip('[]')}]" if ":" in shown else shown
    url = f"http://{shown}:{bound}/" + (f"?token={token}" if token else "")
    hosts = (*LOOPBACK_NAMES, host.lower()) if is_loopback(host) else None
    app = create_app(reader, token=token, hosts=hosts)
    logs = copy.deepcopy(uvicorn.config.LOGGING_CONFIG)
    logs["handlers"]["access"]["stream"] = "ext://sys.stderr"  # stdout holds the URL only
    config = uvicorn.Config(app, log_level="info" if access_log else "warning",
                            access_log=access_log, log_config=logs, lifespan="off",
                            timeout_graceful_shutdown=5)
    logging.getLogger("uvicorn.access").addFilter(_HideToken())
    # Ctrl-C and SIGTERM stop it from the moment the URL is out (whoever reads it may signal
    # at once), even where SIGINT came ignored (a background job, nohup): uvicorn shuts down
    # gracefully on them, then raises the signal again for the handler that was there before
    # it, ours, whose KeyboardInterrupt ends the call.
    previous = {number: signal.signal(number, _interrupted)
                for number in (signal.SIGINT, signal.SIGTERM)}
    try:
        print(url, file=out or sys.stdout, flush=True)
        print(f"campaign serve: read-only dashboard of {reader.url} at {url} (Ctrl-C stops "
              "it)", file=sys.stderr, flush=True)
        uvicorn.Server(config).run(sockets=[sock])
    except KeyboardInterrupt:
        pass
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        sock.close()
    print("campaign serve: stopped", file=sys.stderr, flush=True)


class _HideToken(logging.Filter):
    """``--access-log`` lines never show a token (the first request carries it in its URL)."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(re.sub(r"token=[^&\s]*", "token=***", a) if isinstance(a, str)
                                else a for a in record.args)
        return True


def _interrupted(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt
