"""The dashboard as an ASGI application (Starlette): three pages, two JSON reads, static files.

Read-only by construction: the ledger is opened through
:meth:`LedgerReader.open`, whose connections the database itself keeps from
writing (SQLite ``mode=ro``, PostgreSQL ``default_transaction_read_only``),
and every route answers GET (and HEAD) only. Endpoints are plain functions:
Starlette runs them in its thread pool, so a slow read never blocks a poll.

    /                      campaigns: name, question, runs by status, last activity
    /c/NAME                one campaign: live status and curves, conclusion, flags, tables
    /r/RUN_ID              one run: stop, config and its difference to the control, ...
    /api/campaigns         the campaigns' rows (the first page polls it)
    /api/live?campaign=NAME[&run=ID][&key=K ...][&cursor=C]   see campaign.serve.watch
"""

from __future__ import annotations

from importlib import resources
from typing import Any

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from campaign.errors import LedgerError, LedgerInputError, NotFound
from campaign.ledger import LedgerReader
from campaign.serve import pages
from campaign.serve.guard import Guard
from campaign.serve.watch import Cursor, Watcher


def create_app(
    reader: LedgerReader, *, token: str | None = None, hosts: tuple[str, ...] | None = None
) -> Guard:
    """The dashboard over ``reader`` (opened read-only by the caller); ``token``: required on
    every request; ``hosts``: the Host names accepted (None: any)."""
    watcher = Watcher(reader)

    def page(render: Any) -> Any:
        def endpoint(request: Request) -> Response:
            return _answer(lambda: HTMLResponse(render(request)), html=True)

        return endpoint

    def live(request: Request) -> Response:
        params = request.query_params
        campaign = params.get("campaign")
        if not campaign:
            return JSONResponse({"error": "campaign=NAME is required"}, 400)
        keys = [k for k in params.getlist("key") if k] or None  # repeated: keys may hold ","

        def reply() -> Response:
            cursor = Cursor.decode(params["cursor"]) if params.get("cursor") else None
            return JSONResponse(watcher.poll(campaign, cursor, keys, params.get("run")))

        return _answer(reply)

    def campaigns(_request: Request) -> Response:
        return _answer(lambda: JSONResponse(_jsonable(reader.campaign_overview())))

    static = resources.files("campaign.serve") / "static"
    routes = [
        Route("/", page(lambda _r: pages.campaigns_page(reader))),
        Route("/c/{name:path}",
              page(lambda r: pages.campaign_page(watcher, r.path_params["name"]))),
        Route("/r/{run_id}", page(lambda r: pages.run_page(reader, r.path_params["run_id"]))),
        Route("/api/campaigns", campaigns),
        Route("/api/live", live),
        Mount("/static", StaticFiles(directory=str(static)), name="static"),
    ]
    return Guard(Starlette(routes=routes), token=token, hosts=hosts)


def _answer(make: Any, html: bool = False) -> Response:
    """Run ``make``; a ledger error becomes one line with its status code, never a traceback."""
    try:
        return make()
    except NotFound as error:
        return _error(404, str(error), html)
    except LedgerInputError as error:
        return _error(400, str(error), html)
    except LedgerError as error:
        return _error(503, f"the ledger cannot be read: {error}", html)


def _error(status: int, message: str, html: bool) -> Response:
    if html:
        return HTMLResponse(pages.render("error.html", status=status, message=message,
                                         page={"kind": "error"}), status)
    return JSONResponse({"error": message}, status)


def _jsonable(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v.isoformat() if hasattr(v, "isoformat") else v for k, v in row.items()}
            for row in rows]
