"""``accord-cassandra sidecar`` with a bad config: a non-zero exit and ONE line on stderr that
names the field and the problem, never a traceback. Run as the operator runs it."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

TABLES = {"bank.accounts": {"partition_key": [["id", "text"]], "columns": [["b", "bigint"]]}}
# A busy fixed port is retried (bind_retry_seconds, 10 s by default) before the sidecar gives
# up; the message and the exit are the same after one second of retries as after ten.
BIND_RETRY_SECONDS = 1.0


def _base(tmp_path: Path) -> dict[str, Any]:
    return {
        "node_id": 1,
        "listen": "127.0.0.1:1",  # never bound: every case fails before
        "peers": {1: "127.0.0.1:1", 2: "127.0.0.1:2", 3: "127.0.0.1:3"},
        "journal_dir": str(tmp_path / "journal"),
        "tables": TABLES,
        "drain_seconds": 0,
    }


def run_sidecar(
    tmp_path: Path, config: dict[str, Any], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump(config))
    environ = {k: v for k, v in os.environ.items() if not k.startswith("ACCORD_SIDECAR_")}
    return subprocess.run(
        [sys.executable, "-m", "accord_cassandra", "sidecar", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**environ, **(env or {})},
    )


@pytest.fixture
def busy_port() -> Iterator[str]:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield f"127.0.0.1:{held.getsockname()[1]}"


def _file(tmp_path: Path) -> Path:
    path = tmp_path / "a-file"
    path.write_text("x")
    return path


Change = Callable[[Path, dict[str, Any]], None]


def _table(columns: Any = None, **spec: Any) -> Change:
    def change(tmp_path: Path, config: dict[str, Any]) -> None:
        table = {"partition_key": [["id", "text"]], "columns": [["b", "bigint"]], **spec}
        if columns is not None:
            table["columns"] = columns
        config["tables"] = {"bank.accounts": table}

    return change


def _set(**values: Any) -> Change:
    def change(tmp_path: Path, config: dict[str, Any]) -> None:
        config.update(values)

    return change


def _journal(make: Callable[[Path], Path]) -> Change:
    def change(tmp_path: Path, config: dict[str, Any]) -> None:
        config["journal_dir"] = str(make(tmp_path))

    return change


def _tls(**tls: Any) -> Change:
    def change(tmp_path: Path, config: dict[str, Any]) -> None:
        cert = _file(tmp_path)
        config["tls"] = {"certificate": str(cert), "private_key": str(cert), **tls}

    return change


CASES: list[Any] = [
    pytest.param(
        _table([["b", "list<int>"]]), ["tables", "non-frozen list", "not served"], id="non-frozen"
    ),
    pytest.param(
        lambda t, c: c.update(tables={"accounts": TABLES["bank.accounts"]}),
        ["tables", "keyspace.table"],
        id="no-dot",
    ),
    pytest.param(_table(partition_key=[]), ["tables", "partition key"], id="no-partition-key"),
    pytest.param(_table([["balance"]]), ["tables", "[name, CQL type]"], id="one-element"),
    pytest.param(_journal(_file), ["journal_dir", "not a directory"], id="journal-is-file"),
    pytest.param(
        _journal(lambda t: _file(t) / "journal"), ["journal_dir", "is a file"], id="parent-file"
    ),
    pytest.param(
        _journal(lambda t: Path("/proc/accord-journal")), ["journal_dir", "/proc"], id="proc"
    ),
    pytest.param(
        lambda t, c: c.update(tls={"certificate": str(t / "no.pem"), "private_key": str(t / "k")}),
        ["tls.certificate", "cannot read"],
        id="tls-missing-cert",
    ),
    pytest.param(
        lambda t, c: c.update(
            tls={"certificate": str(_file(t)), "private_key": str(t / "missing.key")}
        ),
        ["tls.private_key", "cannot read"],
        id="tls-missing-key",
    ),
    pytest.param(
        _tls(require_client_certificate=True), ["tls", "needs ca"], id="client-certs-no-ca"
    ),
    pytest.param(
        _set(listen="no-such-host.invalid:50051"), ["listen", "cannot resolve"], id="unresolvable"
    ),
    pytest.param(
        _set(metrics_listen="127.0.0.1:1"), ["metrics_listen", "is the listen"], id="metrics=listen"
    ),
    pytest.param(_set(client_token=""), ["client_token", "non-empty"], id="empty-token"),
    pytest.param(
        _set(peers={1: "127.0.0.1:1", 2: "not an address", 3: "127.0.0.1:3"}),
        ["peers", "not an address", "host:port"],
        id="peer-address",
    ),
]


@pytest.mark.parametrize(("change", "fragments"), CASES)
def test_a_bad_config_exits_with_one_line_naming_the_field(
    tmp_path: Path, change: Change, fragments: list[str]
) -> None:
    config = _base(tmp_path)
    change(tmp_path, config)
    done = run_sidecar(tmp_path, config)
    lines = done.stderr.strip().splitlines()
    assert done.returncode != 0
    assert len(lines) == 1, done.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.mark.skipif(os.geteuid() == 0, reason="root may write anywhere")
def test_a_journal_dir_that_is_not_writable(tmp_path: Path) -> None:
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    config = _base(tmp_path)
    config["journal_dir"] = str(locked / "journal")
    done = run_sidecar(tmp_path, config)
    assert done.returncode != 0
    assert "journal_dir" in done.stderr and "not writable" in done.stderr


@pytest.mark.parametrize("which", ["listen", "metrics_listen"])
def test_a_port_in_use_exits_with_one_line(tmp_path: Path, busy_port: str, which: str) -> None:
    config = _base(tmp_path)
    config["bind_retry_seconds"] = BIND_RETRY_SECONDS
    if which == "listen":
        config["listen"] = busy_port
        config["peers"][1] = busy_port
    else:
        # listen on port 0: the kernel picks a free one, no probed port handed on
        config["listen"] = "127.0.0.1:0"
        config["peers"][1] = "127.0.0.1:0"
        config["metrics_listen"] = busy_port
    done = run_sidecar(tmp_path, config)
    # Startup logs (and gRPC's own line about the bind) come first; the error is one line.
    errors = [line for line in done.stderr.splitlines() if line.startswith("accord-cassandra:")]
    assert done.returncode != 0
    assert "Traceback" not in done.stderr
    assert len(errors) == 1 and errors[0].startswith(f"accord-cassandra: {which}: cannot bind"), (
        done.stderr
    )
    # Refused after the configured retries, not at the first attempt.
    assert f"still in use after {BIND_RETRY_SECONDS:.0f} s of retries" in errors[0], errors[0]


def test_a_misspelt_environment_variable_is_warned_about(tmp_path: Path) -> None:
    config = _base(tmp_path)
    config["client_token"] = ""  # fail after the warning, so the process exits
    done = run_sidecar(tmp_path, config, env={"ACCORD_SIDECAR_NODEID": "2"})
    assert "ACCORD_SIDECAR_NODEID sets no config field" in done.stderr
    assert done.returncode != 0
