"""``stacksaga-store console`` as a process: port 0 bound and printed, pages served from the
store, an admin restore through it with the token from the environment, SIGTERM exits 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from accord_cassandra.launcher import CassandraHandle
from tests.console._server import RunningConsole
from tests.recovery._processes import REPO_ROOT, Child, write_config
from tests.stacksaga.conftest import SIMPLE_SCHEMA, driver_text

pytestmark = pytest.mark.cassandra

TOKEN = "cli-test-admin-token-abcdefghijkl"


def _config(tmp_path: Path, node: CassandraHandle, keyspace: str, service: str) -> Path:
    overrides = {
        "cassandra": {"schema": SIMPLE_SCHEMA, "recovery": {"restore": {"delay-windows": 5}}},
        "instance": {
            "region": "console-region",
            "cluster": "console-cluster",
            "service-name": service,
        },
    }
    return write_config(tmp_path, overrides, driver_text(node, keyspace))


def test_console_process_serves_and_restores(
    tmp_path: Path,
    cassandra_node: CassandraHandle,
    console_keyspace: str,
    console: RunningConsole,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = _config(tmp_path, cassandra_node, console_keyspace, console.service)
    monkeypatch.setenv("STACKSAGA_CONSOLE_ADMIN_TOKEN", TOKEN)
    argv = [
        sys.executable,
        "-m",
        "stacksaga_store",
        "--config",
        str(config),
        "console",
        "--listen",
        "127.0.0.1:0",
        "--sagas",
        "stacksaga_store.console.sample:sagas",
    ]
    child = Child("console", argv, tmp_path / "console.log")
    try:
        address = child.wait_for_address(120).removeprefix("http://")
        assert address.startswith("127.0.0.1:") and not address.endswith(":0")
        with httpx.Client(base_url=f"http://{address}", timeout=30) as client:
            assert client.get("/healthz").text == "ok\n"
            found = client.get("/api/sagas", params={"status": "FROZEN"}).json()
            assert str(console.ids["frozen"]) in {r["transaction_id"] for r in found["results"]}
            tid = console.ids["frozen"]
            refused = client.post(
                f"/api/sagas/{tid}/restore", headers={"Authorization": "Bearer wrong-token-xxxxxx"}
            )
            assert refused.status_code == 403
            done = client.post(
                f"/api/sagas/{tid}/restore", headers={"Authorization": f"Bearer {TOKEN}"}
            )
            assert done.status_code == 200, done.text
            assert done.json()["status"] == "REVERT_COMPLETED"
        assert child.terminate() == 0
        assert TOKEN not in child.output()
    finally:
        if child.alive():
            child.kill()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--listen", "localhost"], "--listen"),
        (["--listen", "127.0.0.1:99999"], "--listen"),
        (["--live-interval", "0"], "--live-interval"),
    ],
)
def test_bad_console_options_exit_2_naming_them(args: list[str], message: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "stacksaga_store", "console", *args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
