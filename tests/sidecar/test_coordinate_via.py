"""``coordinate_via``: a sidecar whose client transactions another sidecar coordinates."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from accord.primitives import Timestamp
from accord_cassandra.client import Client, Transaction, TransactionError
from accord_cassandra.cluster import LocalSidecars
from tests.sidecar.conftest import EMBEDDED_TABLES, TIMING, TOKEN, _stop


@pytest.fixture
def delegating(tmp_path: Path) -> Iterator[LocalSidecars]:
    cluster = LocalSidecars(
        tmp_path,
        tables=EMBEDDED_TABLES,
        client_token=TOKEN,
        extra={"timing": TIMING, "drain_seconds": 1},
    )
    cluster.write_configs()
    path = cluster.sidecars[3].config_path
    config = yaml.safe_load(path.read_text())
    config["coordinate_via"] = 1
    path.write_text(yaml.safe_dump(config, sort_keys=True))
    try:
        cluster.start(timeout=60)
        yield cluster
    finally:
        _stop(cluster)


def _transact(address: str, transaction: Transaction) -> tuple[int, bool]:
    with Client(address, token=TOKEN, timeout=20) as client:
        answer = client.transact(transaction)
    return Timestamp.parse(answer.txn_id).node, answer.applied


def test_the_named_sidecar_coordinates_and_the_answer_is_relayed(
    delegating: LocalSidecars,
) -> None:
    addresses = delegating.addresses()
    put = Transaction().update("bank", "accounts", "via", balance=7, tag=1)
    # Through sidecar 3, coordinated by sidecar 1 (its TxnId carries the coordinator's id).
    assert _transact(addresses[2], put) == (1, True)
    # Sidecar 2 still coordinates its own.
    read = Transaction()
    read.let("row", "bank", "accounts", "via")
    node, _ = _transact(addresses[1], read)
    assert node == 2
    with Client(addresses[2], token=TOKEN, timeout=20) as client:
        answer = client.transact(read)
    assert answer.rows["row"]["balance"] == 7
    # A request refused by validation never leaves sidecar 3.
    with Client(addresses[2], token=TOKEN, timeout=20) as client:
        bad = Transaction().update("bank", "nosuch", "k", balance=1)
        with pytest.raises(TransactionError) as caught:
            client.transact(bad)
    assert caught.value.code == "INVALID_ARGUMENT"
    assert "sidecar 1" not in str(caught.value)


def test_an_unreachable_delegate_leaves_the_transaction_here(delegating: LocalSidecars) -> None:
    delegating.sidecars[1].kill()
    # Nothing reached sidecar 1, so sidecar 3 coordinates (2 and 3 still make quorums).
    gone = Transaction().update("bank", "accounts", "gone", balance=1, tag=1)
    assert _transact(delegating.addresses()[2], gone) == (3, True)
