"""A real cqlsh session against a sidecar's CQL endpoint on Cassandra 5.0 (README, "Accord
CQL from cqlsh"): ``make cqlsh-session``, or ``python scripts/cqlsh_session.py``.

It starts one Cassandra 5.0 node on ``--cassandra-ip`` (default 127.0.60.1; or uses a
running node given by ``--contact-point host[:port]``), creates ``bank.accounts`` at
replication factor 1, starts one sidecar (store cassandra, CQL endpoint on a port the
kernel picks), then drives ``accord-cassandra cqlsh`` on a pseudo-terminal exactly as a
user would type: each line is written once the prompt for it has appeared, and the terminal
transcript (echo, prompts, results) is printed with colours and terminal controls removed.
Everything it started is stopped at the end; the node's data is deleted with it.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import select
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SESSION = [
    "BEGIN TRANSACTION\n"
    "  INSERT INTO bank.accounts (id, balance) VALUES ('alice', 100);\n"
    "  INSERT INTO bank.accounts (id, balance) VALUES ('bob', 50);\n"
    "COMMIT TRANSACTION;",
    "BEGIN TRANSACTION\n"
    "  LET src = (SELECT balance FROM bank.accounts WHERE id = 'alice');\n"
    "  LET dst = (SELECT balance FROM bank.accounts WHERE id = 'bob');\n"
    "  SELECT src.balance, dst.balance;\n"
    "  IF src.balance >= 10 THEN\n"
    "    UPDATE bank.accounts SET balance = src.balance - 10 WHERE id = 'alice';\n"
    "    UPDATE bank.accounts SET balance = dst.balance + 10 WHERE id = 'bob';\n"
    "  END IF\n"
    "COMMIT TRANSACTION;",
    # Read through Accord: a plain SELECT right after an answer may not see its writes yet
    # (docs/sidecars.md, "What a result does not promise").
    "BEGIN TRANSACTION\n"
    "  LET a = (SELECT balance FROM bank.accounts WHERE id = 'alice');\n"
    "  LET b = (SELECT balance FROM bank.accounts WHERE id = 'bob');\n"
    "  SELECT a.balance, b.balance;\n"
    "COMMIT TRANSACTION;",
    "UPDATE bank.accounts SET balance = 0 WHERE id = 'alice';",
]
PROMPTS = (b"cqlsh> ", b"   ... ")
ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]|\x1b[=>]")
PROMPT_SECONDS = 120.0


def _read_until_prompt(fd: int, process: subprocess.Popen[bytes]) -> bytes:
    """Output until it ends with a prompt (what the terminal shows before the next line)."""
    seen = b""
    deadline = time.monotonic() + PROMPT_SECONDS
    while True:
        clean = ANSI.sub(b"", seen).replace(b"\r", b"")
        if clean.endswith(PROMPTS):
            return clean
        if time.monotonic() > deadline or process.poll() is not None:
            raise RuntimeError(f"cqlsh showed no prompt within {PROMPT_SECONDS:g} s: {clean!r}")
        ready, _, _ = select.select([fd], [], [], 0.5)
        if ready:
            with contextlib.suppress(OSError):
                seen += os.read(fd, 65536)


def transcript(host: str, port: int) -> str:
    """Drive cqlsh on a pseudo-terminal through SESSION; what the terminal showed."""
    primary, secondary = os.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "accord_cassandra", "cqlsh", "--no-color", host, str(port)],
        stdin=secondary,
        stdout=secondary,
        stderr=secondary,
        start_new_session=True,
        env={**os.environ, "TERM": "dumb", "COLUMNS": "100", "HOME": tempfile.mkdtemp()},
    )
    os.close(secondary)
    shown = []
    try:
        shown.append(_read_until_prompt(primary, process))
        for statement in [*SESSION, "exit"]:
            for line in statement.split("\n"):
                os.write(primary, line.encode() + b"\n")
                if line != "exit":
                    shown.append(_read_until_prompt(primary, process))
        process.wait(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
        os.close(primary)
    text = b"".join(shown).decode(errors="replace")
    # The greeting names the version and the endpoint; the session starts at the first prompt.
    return text[text.index("cqlsh> ") :] + "exit\n"


def _note(message: str) -> None:
    sys.stderr.write(f"# {message}\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cassandra-ip", default=os.environ.get("CQLSH_SESSION_IP", "127.0.60.1"))
    parser.add_argument("--contact-point", help="a running Cassandra node (host[:port])")
    args = parser.parse_args(argv)

    from accord_cassandra.cluster import LocalSidecars
    from accord_cassandra.launcher import (
        ClusterSpec,
        LocalCluster,
        driver_cluster,
        parse_contact_points,
    )

    with tempfile.TemporaryDirectory(prefix="accord-cqlsh-session-") as folder:
        node: LocalCluster | None = None
        if args.contact_point:
            ips, native_port = parse_contact_points(args.contact_point)
        else:
            spec = ClusterSpec(nodes=1, first_ip=args.cassandra_ip, cluster_name="accord_demo")
            node = LocalCluster(spec, Path(folder) / "cassandra")
            _note(f"starting Cassandra {spec.version} on {args.cassandra_ip}")
            node.start()
            ips, native_port = spec.ips, spec.native_port
        try:
            admin = driver_cluster(ips, native_port, timeout=60.0)
            session = admin.connect()
            session.execute("DROP KEYSPACE IF EXISTS bank", timeout=120)
            session.execute(
                "CREATE KEYSPACE bank WITH replication = "
                "{'class': 'SimpleStrategy', 'replication_factor': 1}",
                timeout=120,
            )
            session.execute(
                "CREATE TABLE bank.accounts (id text PRIMARY KEY, balance bigint)", timeout=120
            )
            admin.shutdown()
            sidecars = LocalSidecars(
                Path(folder) / "sidecar",
                nodes=1,
                replication_factor=1,
                store="cassandra",
                cassandra={"contact_points": ips, "port": native_port, "keyspaces": ["bank"]},
                extra={"cql_listen": "127.0.0.1:0"},
            )
            _note("starting one sidecar with its CQL endpoint")
            with sidecars:
                address = sidecars.sidecars[1].cql_address
                host, _, port = address.rpartition(":")
                _note(f"accord-cassandra cqlsh {host} {port}")
                sys.stdout.write(transcript(host, int(port)))
        finally:
            if node is not None:
                node.stop(clean=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
