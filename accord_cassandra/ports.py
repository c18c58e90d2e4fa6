"""Binding ports without races, and telling others what was bound.

A server that is handed a port somebody probed free earlier (bind, close, pass the number
on) races every other process on the machine for it. Servers here bind port 0 instead, so the
kernel picks a port nobody holds, and report the address they got: in an address file
(``write_json_atomically``) that whoever started them reads (``wait_for_json``).

A fixed, non-zero port is the other case: a process that restarts on the address its peers
already know. The port was just released by the process before it, and may still be held for
a moment (an outgoing connection of another process that happened to get it as its
ephemeral port, say), so binding it is retried for ``BIND_RETRY_SECONDS`` before giving up.

And a connection's other end may vanish without a word (powered off, cut off by the network:
no FIN, no RST); :func:`keep_alive` has the kernel end such a connection instead of keeping
it, and whatever it holds, for good.
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

from accord_cassandra.errors import AccordCassandraError

T = TypeVar("T")

BIND_RETRY_SECONDS = 10.0
BIND_RETRY_PAUSE_SECONDS = 0.2
KEEPALIVE_PROBES = 3
POLL_SECONDS = 0.05


class AddressInUse(AccordCassandraError, OSError):
    """A fixed port stayed taken for the whole retry period."""


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` into its parts (the port may be 0: any free port)."""
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{address!r} is not host:port")
    return host, int(port)


def _in_use(error: BaseException) -> bool:
    if isinstance(error, OSError) and error.errno == errno.EADDRINUSE:
        return True
    # grpc's add_*_port raises RuntimeError("Failed to bind to address ...") and logs the
    # errno only; a bind failure on a port that is not 0 is treated as "in use".
    return isinstance(error, RuntimeError) and "Failed to bind" in str(error)


async def bind_retrying(
    bind: Callable[[], Awaitable[T]],
    address: str,
    *,
    retry_seconds: float = BIND_RETRY_SECONDS,
) -> T:
    """Run ``bind`` (which binds ``address``); on "address in use" for a fixed port, retry
    until ``retry_seconds`` have passed, then raise :class:`AddressInUse` naming it. Port 0
    is never retried: the kernel only hands out ports that are free."""
    _, port = split_address(address)
    deadline = time.monotonic() + retry_seconds
    while True:
        try:
            return await bind()
        except (OSError, RuntimeError) as error:
            if port == 0 or not _in_use(error):
                raise
            if time.monotonic() >= deadline:
                raise AddressInUse(
                    errno.EADDRINUSE,
                    f"{address} is still in use after {retry_seconds:.0f} s of retries "
                    "(another process holds the port)",
                ) from error
        await asyncio.sleep(BIND_RETRY_PAUSE_SECONDS)


def write_json_atomically(path: Path, data: Any) -> None:
    """Write ``data`` as JSON so a reader sees the old file, no file, or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    partial.write_text(json.dumps(data, sort_keys=True))
    os.replace(partial, path)


def read_json(path: Path) -> Any | None:
    """The JSON in ``path``, or None while it does not exist yet."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None


async def wait_for_json(path: Path, timeout: float) -> Any:
    """Wait up to ``timeout`` seconds for ``path`` (written with ``write_json_atomically``)."""
    deadline = time.monotonic() + timeout
    while (found := read_json(path)) is None:
        if time.monotonic() >= deadline:
            raise TimeoutError(f"{path} did not appear within {timeout:.0f} s")
        await asyncio.sleep(POLL_SECONDS)
    return found


def check_dead_seconds(seconds: float, name: str = "dead_peer_seconds") -> None:
    if not 2 <= seconds <= 3600:
        raise ValueError(f"{name} must be 2..3600, not {seconds}")


def keep_alive(sock: Any, dead_peer_seconds: float) -> None:
    """Have the kernel end the TCP connection ``sock`` once its peer has acknowledged nothing
    for about ``dead_peer_seconds``: keepalive probes from half that long idle on (the peer
    answers them as long as it is there, whether or not its process reads), and
    ``TCP_USER_TIMEOUT`` for data sent and not acknowledged, which keepalive alone never
    ends. The reader then fails with ``TimeoutError``. Where the platform lacks an option
    (``TCP_USER_TIMEOUT`` is Linux's), keepalive is left at the system's timing."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    idle = max(1, int(dead_peer_seconds / 2))
    interval = max(1, int(dead_peer_seconds / 2 / KEEPALIVE_PROBES))
    for name, value in (
        ("TCP_KEEPIDLE", idle),
        ("TCP_KEEPINTVL", interval),
        ("TCP_KEEPCNT", KEEPALIVE_PROBES),
        ("TCP_USER_TIMEOUT", int(dead_peer_seconds * 1000)),
    ):
        option = getattr(socket, name, None)
        if option is not None:
            sock.setsockopt(socket.IPPROTO_TCP, option, value)


__all__ = [
    "BIND_RETRY_SECONDS",
    "AddressInUse",
    "bind_retrying",
    "check_dead_seconds",
    "keep_alive",
    "read_json",
    "split_address",
    "wait_for_json",
    "write_json_atomically",
]
