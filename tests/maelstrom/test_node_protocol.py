"""The node's Maelstrom protocol, in process: init, replies, errors, the three workloads.

Reference: Maelstrom ``doc/protocol.md`` (envelopes, msg_id/in_reply_to, error codes) and
``doc/workloads.md`` (lin-kv, txn-rw-register, txn-list-append).
"""

from __future__ import annotations

import json

import pytest

from maelstrom.node import MaelstromNode, NodeOptions
from maelstrom.protocol import DEFINITE_CODES, ErrorCode, is_definite

from .helpers import LocalCluster


@pytest.fixture
def cluster() -> LocalCluster:
    return LocalCluster(3)


def _line(body: dict[str, object], *, src: str = "c1", dest: str = "n0") -> str:
    return json.dumps({"src": src, "dest": dest, "body": body})


def test_init_ok_replies_to_the_init_msg_id() -> None:
    node = MaelstromNode()
    node.handle_line(
        _line({"type": "init", "msg_id": 7, "node_id": "n1", "node_ids": ["n0", "n1"]}, dest="n1")
    )
    [out] = [json.loads(line) for line in node.take_output()]
    assert out["src"] == "n1" and out["dest"] == "c1"
    assert out["body"]["type"] == "init_ok" and out["body"]["in_reply_to"] == 7
    assert isinstance(out["body"]["msg_id"], int)


def test_message_ids_increase_per_sender(cluster: LocalCluster) -> None:
    first = cluster.request("n0", {"type": "write", "key": 1, "value": 1})
    second = cluster.request("n0", {"type": "write", "key": 1, "value": 2})
    assert first["msg_id"] < second["msg_id"]


@pytest.mark.parametrize(
    "body",
    [
        {"type": "init", "msg_id": 1, "node_id": "n9", "node_ids": ["n0", "n1"]},
        {"type": "init", "msg_id": 1, "node_id": "n0", "node_ids": "n0"},
        {"type": "init", "msg_id": 1, "node_id": "n0", "node_ids": ["n0", "n0"]},
        {"type": "init", "msg_id": 1},
    ],
)
def test_bad_init_is_malformed(body: dict[str, object]) -> None:
    node = MaelstromNode()
    node.handle_line(_line(body))
    [out] = [json.loads(line)["body"] for line in node.take_output()]
    assert out["type"] == "error" and out["code"] == ErrorCode.MALFORMED_REQUEST
    assert out["in_reply_to"] == 1 and "node_ids" in out["text"]


def test_request_before_init_is_temporarily_unavailable() -> None:
    node = MaelstromNode()
    node.handle_line(_line({"type": "read", "msg_id": 3, "key": 1}))
    [out] = [json.loads(line)["body"] for line in node.take_output()]
    assert out["code"] == ErrorCode.TEMPORARILY_UNAVAILABLE and out["in_reply_to"] == 3


def test_unknown_type_is_not_supported(cluster: LocalCluster) -> None:
    reply = cluster.request("n0", {"type": "frobnicate"})
    assert reply["type"] == "error" and reply["code"] == 10
    assert "frobnicate" in reply["text"]


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        ({"type": "read"}, "missing field 'key'"),
        ({"type": "write", "key": 1}, "missing field 'value'"),
        ({"type": "write", "key": 1, "value": 1.5}, "integer or a string"),
        ({"type": "write", "key": True, "value": 1}, "integer or a string"),
        ({"type": "write", "key": 1, "value": 2**64}, "64 bits"),
        ({"type": "cas", "key": 1, "from": 1}, "missing field 'to'"),
        ({"type": "txn", "txn": []}, "non-empty array"),
        ({"type": "txn", "txn": [["r", 1]]}, "[f, key, value]"),
        ({"type": "txn", "txn": [["r", 1, 5]]}, "read's value must be null"),
        ({"type": "txn", "txn": [["x", 1, 5]]}, "unknown micro-op"),
        ({"type": "txn", "txn": [["r", 1, None]] * 65}, "MAX_TXN_MICRO_OPS"),
    ],
)
def test_malformed_requests_get_error_12_with_a_reason(
    cluster: LocalCluster, body: dict[str, object], needle: str
) -> None:
    reply = cluster.request("n1", body)
    assert reply["type"] == "error" and reply["code"] == ErrorCode.MALFORMED_REQUEST
    assert needle in reply["text"]


@pytest.mark.parametrize(
    ("line", "needle"),
    [
        ('{"src": "c1", "dest": "n0", "body": {"type": "read", "msg_id": "7"}}', "msg_id"),
        ('{"src": "c1", "dest": "n0", "body": {"msg_id": 7}}', "body.type"),
        ('{"src": "c1", "dest": "n0", "body": [1]}', "body must be a JSON object"),
        ('{"src": "c1", "body": {"type": "read", "msg_id": 7}}', "dest"),
    ],
)
def test_malformed_envelopes_are_answered_when_the_sender_is_known(line: str, needle: str) -> None:
    node = MaelstromNode()
    node.handle_line(line)
    [out] = [json.loads(x) for x in node.take_output()]
    assert out["dest"] == "c1"
    assert out["body"]["code"] == ErrorCode.MALFORMED_REQUEST and needle in out["body"]["text"]


@pytest.mark.parametrize("line", [b"{not json", b"[1, 2]", b'{"dest": "n0"}', b"\xff\xfe"])
def test_unaddressable_garbage_is_logged_not_answered(line: bytes) -> None:
    node = MaelstromNode()
    node.handle_line(line)
    assert node.take_output() == []
    assert node.counters.malformed == 1


def test_replies_to_us_are_ignored(cluster: LocalCluster) -> None:
    cluster.send_line("n0", _line({"type": "read_ok", "in_reply_to": 99, "value": 1}))
    assert cluster.client_inbox.get("c1", []) == []


def test_lin_kv_read_write_cas(cluster: LocalCluster) -> None:
    missing = cluster.request("n0", {"type": "read", "key": 5})
    assert missing["code"] == 20
    assert cluster.request("n1", {"type": "write", "key": 5, "value": 3})["type"] == "write_ok"
    assert cluster.request("n2", {"type": "read", "key": 5})["value"] == 3
    assert cluster.request("n0", {"type": "cas", "key": 5, "from": 3, "to": 4})["type"] == "cas_ok"
    mismatch = cluster.request("n1", {"type": "cas", "key": 5, "from": 3, "to": 0})
    assert mismatch["code"] == 22
    no_key = cluster.request("n2", {"type": "cas", "key": 6, "from": 0, "to": 1})
    assert no_key["code"] == ErrorCode.KEY_DOES_NOT_EXIST
    assert cluster.request("n0", {"type": "read", "key": 5})["value"] == 4


def test_keys_and_values_may_be_strings_and_stay_distinct_from_ints(
    cluster: LocalCluster,
) -> None:
    cluster.request("n0", {"type": "write", "key": "1", "value": "a"})
    cluster.request("n0", {"type": "write", "key": 1, "value": 2})
    assert cluster.request("n1", {"type": "read", "key": "1"})["value"] == "a"
    assert cluster.request("n2", {"type": "read", "key": 1})["value"] == 2


def test_txn_list_append_reads_see_earlier_appends_of_the_same_txn(
    cluster: LocalCluster,
) -> None:
    first = cluster.request(
        "n0",
        {
            "type": "txn",
            "txn": [["r", 1, None], ["append", 1, 1], ["append", 1, 2], ["r", 1, None]],
        },
    )
    assert first["txn"] == [["r", 1, None], ["append", 1, 1], ["append", 1, 2], ["r", 1, [1, 2]]]
    second = cluster.request("n2", {"type": "txn", "txn": [["append", 1, 3], ["r", 1, None]]})
    assert second["txn"] == [["append", 1, 3], ["r", 1, [1, 2, 3]]]


def test_txn_rw_register_reads_own_writes_and_null_for_absent(cluster: LocalCluster) -> None:
    reply = cluster.request(
        "n1", {"type": "txn", "txn": [["r", 8, None], ["w", 8, 6], ["r", 8, None], ["w", 9, 1]]}
    )
    assert reply["type"] == "txn_ok"
    assert reply["txn"] == [["r", 8, None], ["w", 8, 6], ["r", 8, 6], ["w", 9, 1]]
    later = cluster.request("n0", {"type": "txn", "txn": [["r", 8, None], ["r", 9, None]]})
    assert later["txn"] == [["r", 8, 6], ["r", 9, 1]]


def test_type_mismatch_inside_a_txn_is_a_definite_abort(cluster: LocalCluster) -> None:
    cluster.request("n0", {"type": "txn", "txn": [["w", 3, 7]]})
    reply = cluster.request("n1", {"type": "txn", "txn": [["append", 3, 1]]})
    assert reply["type"] == "error" and reply["code"] == ErrorCode.ABORT
    assert is_definite(reply["code"])
    assert cluster.request("n2", {"type": "txn", "txn": [["r", 3, None]]})["txn"] == [["r", 3, 7]]


def test_definite_codes_match_maelstrom() -> None:
    assert {int(c) for c in DEFINITE_CODES} == {1, 10, 11, 12, 14, 20, 21, 22, 30}
    assert not is_definite(0) and not is_definite(13) and not is_definite(1000)


def test_unsafe_local_reads_answer_without_consensus() -> None:
    cluster = LocalCluster(3, NodeOptions(unsafe_local_reads=True))
    cluster.request("n0", {"type": "write", "key": 1, "value": 1})
    node = cluster.nodes["n1"]
    node.handle_line(_line({"type": "read", "msg_id": 50, "key": 1}, dest="n1"))
    # Answered in the same step, with no message to any peer: that is the bug.
    [out] = [json.loads(x) for x in node.take_output()]
    assert out["dest"] == "c1" and out["body"]["in_reply_to"] == 50
