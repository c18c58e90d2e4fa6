"""The Trace Window's HTTP surface: server-rendered pages and the JSON API behind each.

Security model (docs/console.md):

* read-only without a token: every GET is a read;
* the one write, the admin restore, needs the admin token, compared with
  ``hmac.compare_digest``: the page's form sends it in the POST body (never in a URL), the
  API in ``Authorization: Bearer <token>``; missing -> 401, wrong -> 403, no token
  configured -> 403 (restores are off);
* forms carry a CSRF token tied to a cookie (HMAC of the cookie's random value under a
  per-process key); a POST without a matching pair is 403 before anything else is looked at;
* every input is parsed and checked here; a bad one is a 400 naming the field, an unknown
  saga a 404, anything unexpected a 500 page without the trace (logged).
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import json
import logging
import re
import secrets
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from datetime import UTC, date, datetime, time
from hashlib import sha256
from pathlib import Path
from typing import Any

import jinja2
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.middleware.base import BaseHTTPMiddleware
from starlette.requests import Request
from starlette.responses import (
    HTMLResponse,
    JSONResponse,
    PlainTextResponse,
    RedirectResponse,
    Response,
    StreamingResponse,
)
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from stacksaga_store.console.backend import (
    PAGE_MAX,
    ConsoleBackend,
    NotFound,
    SearchQuery,
    Unavailable,
)
from stacksaga_store.errors import StackSagaError, TransactionNotFoundError
from stacksaga_store.store.states import RunningStatus

__all__ = ["BadInput", "ConsoleConfig", "build_app"]

logger = logging.getLogger(__name__)

HERE = Path(__file__).parent
CSRF_COOKIE = "stacksaga_console_csrf"
CSRF_FIELD = "csrf_token"
TOKEN_FIELD = "admin_token"
FORM_BYTES_MAX = 16 * 1024
_SERVICE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")


class BadInput(StackSagaError):
    """A request parameter that does not parse; ``field`` names it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class ConsoleConfig:
    """What the app needs besides the backend."""

    def __init__(
        self,
        *,
        admin_token: str | None,
        live_interval: float = 2.0,
        secure_cookies: bool = False,
        loopback_hosts_only: bool = True,
    ) -> None:
        if admin_token is not None and len(admin_token) < 16:
            raise ValueError("the admin token must be at least 16 characters")
        self.admin_token = admin_token
        self.live_interval = live_interval
        self.secure_cookies = secure_cookies
        # A console on loopback answers only requests naming a loopback host: a web page
        # whose name was rebound to 127.0.0.1 (DNS rebinding) cannot read it.
        self.loopback_hosts_only = loopback_hosts_only
        self.csrf_key = secrets.token_bytes(32)


# -- input parsing ------------------------------------------------------------------------------


def parse_uuid(field: str, text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text.strip())
    except (ValueError, AttributeError):
        raise BadInput(field, f"{text[:80]!r} is not a transaction id (a UUID)") from None


def parse_page(text: str | None) -> int:
    if text is None or text == "":
        return 1
    if not text.isdigit() or not 1 <= int(text) <= PAGE_MAX:
        raise BadInput("page", f"{text[:20]!r} is not a page number 1..{PAGE_MAX}")
    return int(text)


def parse_instant(field: str, text: str | None) -> datetime | None:
    """ISO 8601 date (midnight UTC) or date-time (UTC when no offset is given)."""
    if text is None or text.strip() == "":
        return None
    value = text.strip()
    try:
        if len(value) == 10:
            return datetime.combine(date.fromisoformat(value), time(0), tzinfo=UTC)
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise BadInput(
            field, f"{value[:40]!r} is not an ISO 8601 date or date-time (2026-12-01T10:00)"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def parse_status(text: str | None) -> RunningStatus | None:
    if text is None or text == "":
        return None
    try:
        return RunningStatus(text)
    except ValueError:
        names = ", ".join(s.value for s in RunningStatus)
        raise BadInput("status", f"{text[:40]!r} is not one of {names}") from None


def parse_service(text: str | None) -> str | None:
    if text is None or text == "":
        return None
    if not _SERVICE_RE.match(text):
        raise BadInput("service", f"{text[:40]!r} is not a service name ([A-Za-z0-9._-], ≤128)")
    return text


def search_query(params: Any) -> SearchQuery:
    known = {"transaction_id", "status", "service", "since", "until", "page"}
    for name in params:
        if name not in known:
            raise BadInput(name, "unknown parameter")
    tid = params.get("transaction_id") or ""
    since = parse_instant("since", params.get("since"))
    until = parse_instant("until", params.get("until"))
    if since is not None and until is not None and until <= since:
        raise BadInput("until", "must be after since")
    return SearchQuery(
        transaction_id=parse_uuid("transaction_id", tid) if tid.strip() else None,
        status=parse_status(params.get("status")),
        service=parse_service(params.get("service")),
        since=since,
        until=until,
        page=parse_page(params.get("page")),
    )


def _loopback_host(header: str) -> bool:
    host = header.strip().lower()
    if host.startswith("["):
        host = host[1 : host.find("]")] if "]" in host else ""
    else:
        host = host.rpartition(":")[0] if host.count(":") == 1 else host
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


# -- the app ------------------------------------------------------------------------------------


def build_app(backend: ConsoleBackend, config: ConsoleConfig) -> Starlette:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(HERE / "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
    )

    def csrf_for(cookie: str) -> str:
        return hmac.new(config.csrf_key, cookie.encode(), sha256).hexdigest()

    def render(
        request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        cookie = request.cookies.get(CSRF_COOKIE)
        fresh = cookie is None or not re.fullmatch(r"[0-9a-f]{64}", cookie)
        if fresh:
            cookie = secrets.token_hex(32)
        assert_str = str(cookie)
        body = env.get_template(template).render(
            request_path=request.url.path,
            csrf_token=csrf_for(assert_str),
            admin_enabled=config.admin_token is not None,
            statuses=[s.value for s in RunningStatus],
            live_interval=config.live_interval,
            **context,
        )
        response = HTMLResponse(body, status_code=status_code)
        if fresh:
            response.set_cookie(
                CSRF_COOKIE,
                assert_str,
                httponly=True,
                samesite="strict",
                secure=config.secure_cookies,
                path="/",
            )
        return response

    def wants_json(request: Request) -> bool:
        return request.url.path.startswith("/api/")

    def error(
        request: Request, status_code: int, title: str, message: str, **extra: Any
    ) -> Response:
        if wants_json(request):
            return JSONResponse({"error": title, "message": message, **extra}, status_code)
        return render(
            request,
            "error.html",
            status_code=status_code,
            title=title,
            message=message,
            field=extra.get("field"),
        )

    def check_csrf(request: Request, form: Any) -> None:
        cookie = request.cookies.get(CSRF_COOKIE)
        sent = form.get(CSRF_FIELD)
        if (
            not cookie
            or not isinstance(sent, str)
            or not hmac.compare_digest(csrf_for(cookie), sent)
        ):
            raise HTTPException(403, "CSRF check failed: reload the page and submit its form")

    def check_token(sent: str | None) -> None:
        """401 when no token was sent, 403 when it is wrong or restores are off."""
        if sent is None or sent == "":
            raise HTTPException(401, "the admin token is required")
        expected = config.admin_token
        if expected is None:
            raise HTTPException(403, "admin actions are off: no admin token is configured")
        if not hmac.compare_digest(sent.encode(), expected.encode()):
            raise HTTPException(403, "wrong admin token")

    async def read_form(request: Request) -> Any:
        size = request.headers.get("content-length")
        if size is not None and (not size.isdigit() or int(size) > FORM_BYTES_MAX):
            raise BadInput("body", f"larger than {FORM_BYTES_MAX} bytes")
        kind = request.headers.get("content-type", "")
        if not kind.startswith("application/x-www-form-urlencoded"):
            raise BadInput("body", "expected a form (application/x-www-form-urlencoded)")
        return await request.form(max_files=0, max_fields=20)

    # -- pages -------------------------------------------------------------------------------

    async def home(request: Request) -> Response:
        return RedirectResponse("/sagas", 302)

    async def search_page(request: Request) -> Response:
        query = search_query(request.query_params)
        if query.transaction_id is not None and not any(
            request.query_params.get(k) for k in ("status", "service", "since", "until")
        ):
            # An exact id goes straight to its page (404 there if it does not exist).
            return RedirectResponse(f"/sagas/{query.transaction_id}", 303)
        result = await backend.search(query)
        return render(
            request, "search.html", result=result, query=dict(request.query_params), title="Sagas"
        )

    async def saga_page(request: Request) -> Response:
        tid = parse_uuid("transaction_id", request.path_params["transaction_id"])
        service = parse_service(request.query_params.get("service"))
        saga = await backend.saga(tid, service)
        restored = request.query_params.get("restored")
        return render(request, "saga.html", saga=saga, restored=restored, title=f"Saga {tid}")

    async def restore_confirm_page(request: Request) -> Response:
        tid = parse_uuid("transaction_id", request.path_params["transaction_id"])
        saga = await backend.saga(tid, None)
        return render(request, "restore.html", saga=saga, title=f"Restore {tid}")

    async def restore_post(request: Request) -> Response:
        tid = parse_uuid("transaction_id", request.path_params["transaction_id"])
        form = await read_form(request)
        check_csrf(request, form)
        check_token(form.get(TOKEN_FIELD) or None)
        if form.get("confirm") != str(tid):
            raise BadInput("confirm", "tick the confirmation for this saga to restore it")
        await backend.restore(tid)
        return RedirectResponse(f"/sagas/{tid}?restored=1", 303)

    async def frozen_page(request: Request) -> Response:
        page = parse_page(request.query_params.get("page"))
        result = await backend.frozen(page)
        return render(request, "frozen.html", result=result, title="Frozen sagas")

    async def directory_page(request: Request) -> Response:
        service = parse_service(request.query_params.get("service"))
        result = await backend.directory(service)
        return render(request, "directory.html", result=result, title="Recovery directory")

    async def sidecars_page(request: Request) -> Response:
        result = await backend.sidecar_metrics()
        return render(request, "sidecars.html", result=result, title="Sidecars")

    async def live_page(request: Request) -> Response:
        result = await backend.live(refresh=False)
        return render(request, "live.html", result=result, title="Live")

    # -- API -----------------------------------------------------------------------------------

    async def api_search(request: Request) -> Response:
        return JSONResponse(await backend.search(search_query(request.query_params)))

    async def api_saga(request: Request) -> Response:
        tid = parse_uuid("transaction_id", request.path_params["transaction_id"])
        saga = await backend.saga(tid, parse_service(request.query_params.get("service")))
        saga.pop("timeline_svg", None)
        return JSONResponse(saga)

    async def api_timeline_svg(request: Request) -> Response:
        tid = parse_uuid("transaction_id", request.path_params["transaction_id"])
        saga = await backend.saga(tid, parse_service(request.query_params.get("service")))
        return Response(saga["timeline_svg"], media_type="image/svg+xml")

    async def api_restore(request: Request) -> Response:
        tid = parse_uuid("transaction_id", request.path_params["transaction_id"])
        header = request.headers.get("authorization", "")
        token = header[7:] if header.lower().startswith("bearer ") else None
        check_token(token)
        return JSONResponse(await backend.restore(tid))

    async def api_frozen(request: Request) -> Response:
        return JSONResponse(await backend.frozen(parse_page(request.query_params.get("page"))))

    async def api_directory(request: Request) -> Response:
        service = parse_service(request.query_params.get("service"))
        return JSONResponse(await backend.directory(service))

    async def api_sidecars(request: Request) -> Response:
        return JSONResponse(await backend.sidecar_metrics())

    async def api_live(request: Request) -> Response:
        return JSONResponse(await backend.live(refresh=False))

    async def api_live_stream(request: Request) -> Response:
        async def events() -> AsyncIterator[bytes]:
            yield b"retry: 2000\n\n"
            while not await request.is_disconnected():
                snapshot = await backend.live(refresh=False)
                yield f"event: live\ndata: {json.dumps(snapshot)}\n\n".encode()
                async with backend.census.changed:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(
                            backend.census.changed.wait(), timeout=config.live_interval * 2
                        )

        return StreamingResponse(
            events(),
            media_type="text/event-stream",
            headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
        )

    async def health(request: Request) -> Response:
        return PlainTextResponse("ok\n")

    # -- errors --------------------------------------------------------------------------------

    async def on_bad_input(request: Request, exc: Exception) -> Response:
        assert_bad = exc if isinstance(exc, BadInput) else BadInput("?", str(exc))
        return error(
            request, 400, f"bad {assert_bad.field}", assert_bad.message, field=assert_bad.field
        )

    async def on_not_found(request: Request, exc: Exception) -> Response:
        return error(request, 404, "not found", str(exc))

    async def on_unavailable(request: Request, exc: Exception) -> Response:
        return error(request, 409, "not possible", str(exc))

    async def on_http(request: Request, exc: Exception) -> Response:
        status = exc.status_code if isinstance(exc, HTTPException) else 500
        detail = exc.detail if isinstance(exc, HTTPException) else "error"
        titles = {
            401: "unauthorized",
            403: "forbidden",
            404: "not found",
            405: "method not allowed",
        }
        response = error(request, status, titles.get(status, "error"), str(detail))
        if status == 401:
            response.headers["WWW-Authenticate"] = 'Bearer realm="stacksaga-console"'
        return response

    async def on_error(request: Request, exc: Exception) -> Response:
        logger.exception("console: %s %s failed", request.method, request.url.path)
        return error(request, 500, "internal error", "the console failed; see its log")

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async def refresh() -> None:
            while True:
                try:
                    await backend.census.fresh(0.0, backend.now)
                except Exception:
                    logger.exception("console: census failed")
                await asyncio.sleep(config.live_interval)

        task = asyncio.get_running_loop().create_task(refresh(), name="console census")
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def headers(
        request: Request, call_next: Callable[[Request], Awaitable[Response]]
    ) -> Response:
        if config.loopback_hosts_only and not _loopback_host(request.headers.get("host", "")):
            return PlainTextResponse(
                "bad Host header: this console answers loopback names only\n", 400
            )
        response = await call_next(request)
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
            "frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
        )
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("X-Frame-Options", "DENY")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        if request.url.path.startswith("/api/") and "Cache-Control" not in response.headers:
            response.headers["Cache-Control"] = "no-store"
        return response

    routes = [
        Route("/", home),
        Route("/sagas", search_page),
        Route("/sagas/{transaction_id}", saga_page),
        Route("/sagas/{transaction_id}/restore", restore_confirm_page, methods=["GET"]),
        Route("/sagas/{transaction_id}/restore", restore_post, methods=["POST"]),
        Route("/frozen", frozen_page),
        Route("/directory", directory_page),
        Route("/sidecars", sidecars_page),
        Route("/live", live_page),
        Route("/healthz", health),
        Route("/api/sagas", api_search),
        Route("/api/sagas/{transaction_id}", api_saga),
        Route("/api/sagas/{transaction_id}/timeline.svg", api_timeline_svg),
        Route("/api/sagas/{transaction_id}/restore", api_restore, methods=["POST"]),
        Route("/api/frozen", api_frozen),
        Route("/api/directory", api_directory),
        Route("/api/sidecars", api_sidecars),
        Route("/api/live", api_live),
        Route("/api/live/stream", api_live_stream),
        Mount("/static", StaticFiles(directory=HERE / "static"), name="static"),
    ]
    app = Starlette(
        routes=routes,
        middleware=[Middleware(BaseHTTPMiddleware, dispatch=headers)],
        lifespan=lifespan,
        exception_handlers={
            BadInput: on_bad_input,
            NotFound: on_not_found,
            TransactionNotFoundError: on_not_found,
            Unavailable: on_unavailable,
            HTTPException: on_http,
            Exception: on_error,
        },
    )
    return app
