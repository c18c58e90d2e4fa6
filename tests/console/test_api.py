"""The console's JSON API and pages against a real uvicorn server (port 0) on a real
Cassandra keyspace holding sagas in every state (tests/console/_server.py)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from prometheus_client import CollectorRegistry, Counter

from accord_cassandra.metrics_http import MetricsServer
from stacksaga_store.console.sample import SAMPLE_STATES
from stacksaga_store.recovery.windows import WindowMath
from tests.console._server import RunningConsole

pytestmark = pytest.mark.cassandra

DEADLINE = 60.0


@pytest.fixture
def client(console: RunningConsole) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=console.url, timeout=30, follow_redirects=False) as c:
        yield c


def _csrf(client: httpx.Client, path: str) -> str:
    page = client.get(path)
    assert page.status_code == 200, page.text[:500]
    match = re.search(r'name="csrf_token" value="([0-9a-f]{64})"', page.text)
    assert match, "the form carries a CSRF token"
    return match.group(1)


def _saga(client: httpx.Client, tid: uuid.UUID) -> dict:
    response = client.get(f"/api/sagas/{tid}")
    assert response.status_code == 200, response.text[:500]
    return response.json()


# -- search and counts -----------------------------------------------------------------------


def test_search_finds_every_state_with_counts(
    console: RunningConsole, client: httpx.Client
) -> None:
    found = client.get("/api/sagas", params={"service": console.service}).json()
    by_id = {r["transaction_id"]: r["status"] for r in found["results"]}
    assert found["total"] == len(console.ids) == len(by_id)
    for label, tid in console.ids.items():
        expected = SAMPLE_STATES[label.split("-")[0]]
        assert by_id[str(tid)] == expected, label
    assert found["by_status"]["FROZEN"] == 3
    assert found["by_status"]["PROCESS_COMPLETED"] == 1

    frozen = client.get("/api/sagas", params={"service": console.service, "status": "FROZEN"})
    assert {r["transaction_id"] for r in frozen.json()["results"]} == {
        str(console.ids[k]) for k in ("frozen", "frozen-2", "frozen-3")
    }
    one = client.get("/api/sagas", params={"transaction_id": str(console.ids["running"])}).json()
    assert [r["status"] for r in one["results"]] == ["IN_PROGRESS"]
    # the page's form with an exact id goes to the saga's page
    jump = client.get("/sagas", params={"transaction_id": str(console.ids["running"])})
    assert (
        jump.status_code == 303 and jump.headers["location"] == f"/sagas/{console.ids['running']}"
    )


def test_time_range_and_paging(console: RunningConsole, client: httpx.Client) -> None:
    future = (datetime.now(UTC) + timedelta(days=1)).date().isoformat()
    none = client.get("/api/sagas", params={"service": console.service, "since": future}).json()
    assert none["total"] == 0
    past = (datetime.now(UTC) - timedelta(days=1)).isoformat()
    some = client.get(
        "/api/sagas", params={"service": console.service, "since": past, "until": future}
    ).json()
    assert some["total"] == len(console.ids)
    page2 = client.get("/api/sagas", params={"service": console.service, "page": 2}).json()
    assert page2["pages"] == 1 and page2["results"] == []
    html = client.get("/sagas", params={"service": console.service})
    assert f'data-total="{len(console.ids)}"' in html.text
    assert html.text.count('data-testid="result-row"') == len(console.ids)


# -- one saga --------------------------------------------------------------------------------


def test_frozen_saga_timeline_has_compensation_error_watchdog_and_markers(
    console: RunningConsole, client: httpx.Client
) -> None:
    saga = _saga(client, console.ids["frozen-3"])
    assert saga["status"] == "FROZEN"
    steps = [(t["step"], t["kind"], t["outcome"]) for t in saga["tryouts"]]
    assert steps == [
        ("inventory", "EXECUTE", "SUCCESS"),
        ("payment", "EXECUTE", "SUCCESS"),
        ("shipping", "EXECUTE", "NON_RETRYABLE_ERROR"),
        ("payment", "COMPENSATE", "NON_RETRYABLE_ERROR"),
    ]
    assert saga["compensation_path"] == ["payment"]
    assert "refund endpoint returned 500" in saga["tryouts"][-1]["error"]
    assert saga["frozen"]["reason"].startswith("COMPENSATION_FAILED step=payment")
    assert all(t["duration_ms"] >= 0 for t in saga["tryouts"])
    markers = {m["step_id"]: m["state"] for m in saga["markers"]}
    assert markers["payment:COMPENSATE"] == "FAILED"
    assert markers["inventory:EXECUTE"] == "COMMITTED"
    assert saga["watchdog"] is not None and saga["watchdog"]["released"] is True
    assert saga["restore_available"] is True
    page = client.get(f"/sagas/{console.ids['frozen-3']}").text
    assert 'id="saga-timeline"' in page and "<svg" in page
    assert page.count('data-testid="timeline-tryout-') == 4
    assert 'id="restore-button"' in page
    svg = client.get(f"/api/sagas/{console.ids['frozen-3']}/timeline.svg")
    assert svg.headers["content-type"].startswith("image/svg+xml")


def test_retrying_saga_shows_its_retry_window_and_live_watchdog(
    console: RunningConsole, client: httpx.Client
) -> None:
    saga = _saga(client, console.ids["retrying"])
    assert saga["status"] == "FAILED_WITH_RETRYABLE_ERROR"
    failed = saga["tryouts"][-1]
    assert (failed["step"], failed["outcome"]) == ("payment", "RETRYABLE_ERROR")
    windows = WindowMath(1)
    expected = windows.shift(windows.window_at(datetime.fromisoformat(failed["at"])), 1)
    assert saga["retries"][0]["minute_of_day"] == windows.minute_of_day(expected)
    assert saga["retries"][0]["date"] == expected.date_of_year
    due = datetime.fromisoformat(saga["retries"][0]["due_at"])
    assert due > datetime.fromisoformat(failed["at"])
    watchdog = saga["watchdog"]
    assert watchdog["released"] is False
    created = datetime.fromisoformat(saga["created_at"])
    # delay-windows 5 of 1 minute: the watchdog sits 5 windows after the start's window
    assert watchdog["minute_of_day"] == windows.minute_of_day(
        windows.shift(windows.window_at(created), 5)
    )
    assert "payment provider: HTTP 503" in (failed["error"] or "")
    assert 'data-testid="timeline-retry-' in client.get(f"/sagas/{console.ids['retrying']}").text


def test_running_and_restoring_sagas(console: RunningConsole, client: httpx.Client) -> None:
    running = _saga(client, console.ids["running"])
    assert running["status"] == "IN_PROGRESS"
    assert [t["step"] for t in running["tryouts"]] == ["inventory"]
    restoring = _saga(client, console.ids["restoring"])
    assert restoring["status"] == "REVERT_FAILED_WITH_RETRYABLE_ERROR"
    assert restoring["retries"] and restoring["retries"][0]["step"] == "payment"
    assert restoring["restorable"] is False
    assert 'id="restore-button"' not in client.get(f"/sagas/{console.ids['restoring']}").text


# -- admin restore -----------------------------------------------------------------------------


def test_admin_restore_through_the_form_runs_the_saga_to_the_end(
    console: RunningConsole, client: httpx.Client
) -> None:
    tid = console.ids["frozen"]
    csrf = _csrf(client, f"/sagas/{tid}/restore")
    response = client.post(
        f"/sagas/{tid}/restore",
        data={"csrf_token": csrf, "admin_token": console.token, "confirm": str(tid)},
    )
    assert response.status_code == 303, response.text[:500]
    page = client.get(response.headers["location"])
    assert 'data-testid="restore-result" data-ok="true" data-status="REVERT_COMPLETED"' in page.text
    saga = _saga(client, tid)
    assert saga["status"] == "REVERT_COMPLETED"
    outcomes = [(t["step"], t["kind"], t["outcome"]) for t in saga["tryouts"][-3:]]
    assert outcomes == [
        ("stacksaga", "ADMIN_RESTORE", "RESTORED"),
        ("payment", "COMPENSATE", "SUCCESS"),
        ("inventory", "COMPENSATE", "SUCCESS"),
    ]
    assert f"refund {tid}" in console.world.calls


def test_admin_restore_through_the_api(console: RunningConsole, client: httpx.Client) -> None:
    tid = console.ids["frozen-2"]
    response = client.post(
        f"/api/sagas/{tid}/restore", headers={"Authorization": f"Bearer {console.token}"}
    )
    assert response.status_code == 200, response.text
    assert response.json()["ok"] is True and response.json()["status"] == "REVERT_COMPLETED"
    assert _saga(client, tid)["status"] == "REVERT_COMPLETED"
    again = client.post(
        f"/api/sagas/{tid}/restore", headers={"Authorization": f"Bearer {console.token}"}
    )
    assert again.status_code == 409 and "only FROZEN or QUARANTINED" in again.json()["message"]


def test_restore_refused_without_token_csrf_or_confirmation(
    console: RunningConsole, client: httpx.Client
) -> None:
    tid = console.ids["frozen-3"]
    api = f"/api/sagas/{tid}/restore"
    assert client.post(api).status_code == 401
    assert (
        client.post(api, headers={"Authorization": "Bearer wrong-token-but-long"}).status_code
        == 403
    )
    assert client.post(api, headers={"Authorization": f"Basic {console.token}"}).status_code == 401
    form = f"/sagas/{tid}/restore"
    csrf = _csrf(client, form)
    good = {"csrf_token": csrf, "admin_token": console.token, "confirm": str(tid)}
    # no CSRF token, a forged one, and no cookie at all: 403 before the token is looked at
    assert client.post(form, data={**good, "csrf_token": ""}).status_code == 403
    assert client.post(form, data={**good, "csrf_token": "0" * 64}).status_code == 403
    with httpx.Client(base_url=console.url) as fresh:
        assert fresh.post(form, data=good).status_code == 403
    assert client.post(form, data={**good, "admin_token": ""}).status_code == 401
    wrong = client.post(form, data={**good, "admin_token": "not-the-admin-token"})
    assert wrong.status_code == 403 and 'id="error-title"' in wrong.text
    missing_confirm = client.post(form, data={k: v for k, v in good.items() if k != "confirm"})
    assert (
        missing_confirm.status_code == 400
        and 'id="error-field" data-testid="error-field">confirm' in missing_confirm.text
    )
    assert _saga(client, tid)["status"] == "FROZEN"
    # a token in the URL is never read
    url = client.post(f"{api}?admin_token={console.token}")
    assert url.status_code == 401


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "field"),
    [
        ("/sagas/not-a-uuid", "transaction_id"),
        ("/api/sagas/1234", "transaction_id"),
        ("/api/sagas?status=NOPE", "status"),
        ("/api/sagas?since=yesterday", "since"),
        ("/api/sagas?since=2026-12-02&until=2026-12-01", "until"),
        ("/api/sagas?page=0", "page"),
        ("/api/sagas?page=abc", "page"),
        ("/api/sagas?service=a%20b", "service"),
        ("/api/sagas?transaction_id=xyz", "transaction_id"),
        ("/api/sagas?bogus=1", "bogus"),
        ("/api/frozen?page=-1", "page"),
        ("/sagas?since=2026-13-45", "since"),
    ],
)
def test_bad_input_is_a_400_naming_the_field(client: httpx.Client, path: str, field: str) -> None:
    response = client.get(path)
    assert response.status_code == 400, response.text[:300]
    assert "Traceback" not in response.text
    if path.startswith("/api/"):
        assert field in response.json()["error"]
    else:
        assert f'data-testid="error-field">{field}<' in response.text


def test_unknown_saga_is_404(client: httpx.Client) -> None:
    unknown = uuid.uuid4()
    assert client.get(f"/api/sagas/{unknown}").status_code == 404
    page = client.get(f"/sagas/{unknown}")
    assert page.status_code == 404 and str(unknown) in page.text
    assert client.post(
        f"/api/sagas/{unknown}/restore", headers={"Authorization": "Bearer x" * 1}
    ).status_code in (401, 403)


def test_a_foreign_host_name_is_refused(client: httpx.Client) -> None:
    """DNS rebinding: a page on evil.example rebound to 127.0.0.1 sends Host: evil.example."""
    for host in ("evil.example", "evil.example:4545", "127.0.0.1.evil.example"):
        assert client.get("/api/sagas", headers={"Host": host}).status_code == 400
    for host in ("localhost", "127.0.0.1:4545", "[::1]:4545", "127.9.9.9"):
        assert client.get("/healthz", headers={"Host": host}).status_code == 200


def test_security_headers_and_cookie(client: httpx.Client) -> None:
    page = client.get("/sagas")
    assert "default-src 'self'" in page.headers["content-security-policy"]
    cookie = page.headers["set-cookie"].lower()
    assert "httponly" in cookie and "samesite=strict" in cookie


# -- frozen list, directory, sidecars, live -----------------------------------------------------


def test_frozen_list_names_the_failure(console: RunningConsole, client: httpx.Client) -> None:
    frozen = client.get("/api/frozen").json()
    row = next(r for r in frozen["results"] if r["transaction_id"] == str(console.ids["frozen-3"]))
    assert row["reason"].startswith("COMPENSATION_FAILED step=payment")
    assert 'data-testid="frozen-row"' in client.get("/frozen").text


def test_directory_shows_retry_pointers_and_watchdogs(
    console: RunningConsole, client: httpx.Client
) -> None:
    found = client.get("/api/directory", params={"service": console.service}).json()
    (service,) = found["services"]
    kinds: dict[str, int] = {}
    for day in service["days"]:
        for window in day["windows"]:
            for instance in window["instances"]:
                for bucket in instance["buckets"]:
                    kinds[bucket["kind"]] = kinds.get(bucket["kind"], 0) + bucket["rows"]
    # retry pointers of the two sagas waiting for a retry; watchdogs of the unfinished ones
    assert kinds.get("RETRY", 0) >= 2
    active = sum(
        1
        for label in console.ids
        if SAMPLE_STATES[label.split("-")[0]]
        in {
            "STARTED",
            "IN_PROGRESS",
            "FAILED_WITH_RETRYABLE_ERROR",
            "COMPENSATING",
            "REVERT_FAILED_WITH_RETRYABLE_ERROR",
        }
    )
    assert kinds.get("RESTORE", 0) >= active
    assert found["ring"]["coordinators"] == []
    assert (
        f'id="directory-service-{console.service}"'
        in client.get("/directory", params={"service": console.service}).text
    )


def test_sidecar_and_retry_node_metrics_are_scraped(
    console: RunningConsole, client: httpx.Client
) -> None:
    registry = CollectorRegistry()
    fast = Counter("accord_fast_path", "fast", registry=registry)
    slow = Counter("accord_slow_path", "slow", registry=registry)
    syncs = Counter("accord_journal_syncs", "syncs", registry=registry)
    sync_seconds = Counter("accord_journal_sync_seconds", "secs", registry=registry)
    outcomes = Counter("accord_transactions", "by outcome", ["outcome"], registry=registry)
    outcomes.labels("ok").inc(10)
    outcomes.labels("aborted").inc(2)
    fast.inc(3)
    slow.inc(1)
    syncs.inc(4)
    sync_seconds.inc(0.02)
    server = MetricsServer("127.0.0.1:0", registry)
    console.call(server.start)
    try:
        up = f"http://{server.bound}/metrics"
        down = "http://127.0.0.1:9/metrics"
        console.backend.sidecars = (up, down)
        result = client.get("/api/sidecars").json()
        first, second = result["sidecars"]
        assert first["healthy"] is True and first["fast_path_share"] == pytest.approx(0.75)
        assert first["journal_sync_mean_ms"] == pytest.approx(5.0)
        assert first["transactions"] == 12 and first["commits"] == 10
        outcomes.labels("ok").inc(50)
        time.sleep(0.2)
        again = client.get("/api/sidecars").json()["sidecars"][0]
        assert again["commits"] == 60 and again["commit_rate_per_second"] > 0
        assert second["healthy"] is False and second["error"]
        assert 'data-testid="sidecar"' in client.get("/sidecars").text
    finally:
        console.backend.sidecars = ()
        console.call(server.stop)


def test_live_counters_move_when_a_saga_starts(
    console: RunningConsole, client: httpx.Client
) -> None:
    before = client.get("/api/live").json()["totals"]
    started = console.call(lambda: console.orchestrator.start("order", {"address": "1 Main St"}))
    assert started.status.value == "PROCESS_COMPLETED"
    deadline = time.monotonic() + DEADLINE
    while True:
        after = client.get("/api/live").json()["totals"]
        if after["starts"] > before["starts"] and after["completions"] > before["completions"]:
            break
        assert time.monotonic() < deadline, (before, after)
        time.sleep(0.2)
    with client.stream("GET", "/api/live/stream") as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        for line in stream.iter_lines():
            if line.startswith("data: "):
                event = json.loads(line[6:])
                assert event["totals"]["starts"] >= after["starts"]
                break
    page = client.get("/live").text
    assert 'id="live-starts"' in page and "/static/live.js" in page
    assert client.get("/static/live.js").status_code == 200


def test_directory_shows_the_coordinator_leader_and_the_leases(
    console: RunningConsole, client: httpx.Client
) -> None:
    from stacksaga_store.recovery.lease_client import CoordinatorLeaseClient
    from stacksaga_store.ring.server import Leadership, RingCoordinator

    runtime = console.backend.engine.runtime
    instance = runtime.settings.instance

    async def start() -> tuple[RingCoordinator, CoordinatorLeaseClient, str]:
        leadership = Leadership(
            runtime.cql,
            runtime.driver_config.keyspace,
            region=instance.region,
            cluster=instance.cluster,
            holder="coord-console-test",
            ttl_seconds=10,
        )
        coordinator = RingCoordinator(
            leadership=leadership, coordinator_id="coord-console-test", lease_seconds=5
        )
        port = await coordinator.start("127.0.0.1:0")
        address = f"127.0.0.1:{port}"
        node = CoordinatorLeaseClient(
            [address], node_id="retry-console", service_name=console.service
        )
        node.start()
        await node.wait_for_lease(DEADLINE)
        return coordinator, node, address

    coordinator, node, address = console.call(start)
    try:
        console.backend.coordinators = (address,)
        ring = client.get("/api/directory", params={"service": console.service}).json()["ring"]
        assert ring["leader"]["holder"] == "coord-console-test"
        lease = node.current()
        assert lease is not None
        assert ring["epochs"][console.service] == lease.epoch
        (status,) = ring["coordinators"]
        assert status["error"] is None and status["leader"] is True
        (service_ring,) = [r for r in status["rings"] if r["service"] == console.service]
        (held,) = service_ring["leases"]
        assert held["holder"] == "retry-console" and held["epoch"] == lease.epoch
        assert held["node_zero"] is True
        page = client.get("/directory", params={"service": console.service}).text
        assert 'data-testid="ring-lease"' in page and "retry-console" in page
        # a coordinator that is not there is shown as an error, not a failed page
        console.backend.coordinators = (address, "127.0.0.1:9")
        ring = client.get("/api/directory", params={"service": console.service}).json()["ring"]
        assert ring["coordinators"][1]["error"]
    finally:
        console.backend.coordinators = None

        async def stop() -> None:
            await node.stop()
            await coordinator.stop(resign=True)

        console.call(stop)


def test_search_pages_through_many_sagas(console: RunningConsole, client: httpx.Client) -> None:
    """Last in this module: it adds 30 sagas the counts above do not expect."""

    async def create() -> None:
        for _ in range(30):
            await console.orchestrator.create("order", {"address": "1 Main St"})

    console.call(create)
    params = {"service": console.service, "status": "STARTED"}
    first = client.get("/api/sagas", params=params).json()
    assert first["total"] == 31 and first["pages"] == 2 and len(first["results"]) == 25
    second = client.get("/api/sagas", params={**params, "page": 2}).json()
    assert len(second["results"]) == 6
    seen = {r["transaction_id"] for r in first["results"] + second["results"]}
    assert len(seen) == 31
    page = client.get("/sagas", params=params).text
    assert 'id="page-next"' in page and "page=2" in page and 'id="page-prev"' not in page
    page2 = client.get("/sagas", params={**params, "page": 2}).text
    assert 'id="page-prev"' in page2 and 'id="page-next"' not in page2
