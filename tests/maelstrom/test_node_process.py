"""``python -m maelstrom.node`` as Maelstrom runs it: a process on stdin/stdout.

Reference: Maelstrom ``doc/protocol.md`` (one JSON message per line; stdout carries only
messages; init_ok within 10 s, ``db.clj``).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import IO, Any

import pytest

from maelstrom.protocol import MAX_LINE_BYTES, ErrorCode

REPLY_TIMEOUT_SECONDS = 10.0


class NodeUnderTest:
    """A node child process; :meth:`call` sends a line and reads the next reply line."""

    def __init__(self, *args: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "maelstrom.node", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )

    @property
    def stdin(self) -> IO[bytes]:
        assert self.process.stdin is not None
        return self.process.stdin

    def send(self, line: bytes) -> None:
        self.stdin.write(line)
        self.stdin.flush()

    def read(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        line = self.process.stdout.readline()
        assert line, "node closed stdout"
        return dict(json.loads(line))

    def call(self, body: dict[str, Any], *, src: str = "c1") -> dict[str, Any]:
        self.send(json.dumps({"src": src, "dest": "n0", "body": body}).encode() + b"\n")
        return self.read()

    def close(self) -> int:
        self.stdin.close()
        try:
            return self.process.wait(timeout=REPLY_TIMEOUT_SECONDS)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()
            for stream in (self.process.stdout, self.process.stderr):
                if stream is not None:
                    stream.close()


@pytest.fixture
def node() -> Iterator[NodeUnderTest]:
    started = NodeUnderTest()
    try:
        yield started
    finally:
        started.close()


def _init(node: NodeUnderTest) -> float:
    began = time.monotonic()
    reply = node.call({"type": "init", "msg_id": 1, "node_id": "n0", "node_ids": ["n0"]})
    assert reply["body"] == {"type": "init_ok", "in_reply_to": 1, "msg_id": 1}
    return time.monotonic() - began


def test_init_ok_within_maelstroms_ten_seconds(node: NodeUnderTest) -> None:
    # Maelstrom fails a node that has not answered init within 10 s: that is the contract
    # asserted. (About 0.1 s on a quiet machine; the old 2 s bound failed at 3.0 s when
    # several suites shared the two cores.)
    assert _init(node) < 10.0


def test_single_node_serves_every_workload_and_exits_on_eof(node: NodeUnderTest) -> None:
    _init(node)
    assert node.call({"type": "write", "msg_id": 2, "key": 1, "value": 4})["body"]["type"] == (
        "write_ok"
    )
    read = node.call({"type": "read", "msg_id": 3, "key": 1})
    assert read["src"] == "n0" and read["dest"] == "c1"
    assert read["body"]["value"] == 4 and read["body"]["in_reply_to"] == 3
    txn = node.call({"type": "txn", "msg_id": 4, "txn": [["append", 2, 9], ["r", 2, None]]})
    assert txn["body"]["txn"] == [["append", 2, 9], ["r", 2, [9]]]
    assert node.close() == 0


def test_malformed_line_then_normal_service(node: NodeUnderTest) -> None:
    _init(node)
    node.send(b'{"src": "c2", "dest": "n0", "body": {"type": "cas", "msg_id": 5, "key": 1}}\n')
    error = node.read()["body"]
    assert error["code"] == ErrorCode.MALFORMED_REQUEST and "from" in error["text"]
    node.send(b"this is not json\n")
    assert node.call({"type": "read", "msg_id": 6, "key": 1})["body"]["code"] == 20


def test_oversized_line_is_skipped_whole(node: NodeUnderTest) -> None:
    _init(node)
    node.send(b'{"src": "c1", "dest": "n0", "body": {"type": "read", "pad": "')
    node.send(b"x" * (MAX_LINE_BYTES + 10) + b'"}}\n')
    # The next line is read as a message of its own, not as the tail of the long one.
    reply = node.call({"type": "echo", "msg_id": 7})
    assert reply["body"]["code"] == ErrorCode.NOT_SUPPORTED and reply["body"]["in_reply_to"] == 7
