"""``accord-cassandra cqlsh``'s splitter: transactions close at COMMIT TRANSACTION, batches
still at APPLY BATCH, and anything else splits as upstream cqlsh does."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest

from accord_cassandra import cqlsh as wrapper
from tests.clients.test_cqlsh import TRANSFER

BATCH = (
    "BEGIN UNLOGGED BATCH\n"
    "  INSERT INTO ks.t (a) VALUES (1);\n"
    "  INSERT INTO ks.t (a) VALUES (2);\n"
    "APPLY BATCH;\n"
)


@pytest.fixture
def ruleset() -> Iterator[Any]:
    patched = wrapper.patch()
    yield patched
    # The patch lives on cqlsh's one rule set; the upstream test needs it gone.
    del patched.cql_split_statements


def texts(ruleset: Any, script: str) -> tuple[list[str], bool]:
    statements, still_open = ruleset.cql_split_statements(script)
    return [ruleset.cql_extract_orig(s, script) for s in statements if s], still_open


def test_the_transfer_is_one_complete_statement(ruleset: Any) -> None:
    statements, still_open = texts(ruleset, TRANSFER)
    assert not still_open
    assert statements == [TRANSFER.rstrip("\n")]


def test_a_batch_still_closes_at_apply(ruleset: Any) -> None:
    statements, still_open = texts(ruleset, BATCH)
    assert not still_open
    assert statements == [BATCH.rstrip("\n")]


def test_transaction_batch_and_plain_statements_in_one_script(ruleset: Any) -> None:
    script = (
        "-- a transfer, then a batch\n"
        + TRANSFER
        + "/* between */ SELECT 1 FROM system.local;\n"
        + BATCH
        + "BEGIN TRANSACTION SELECT 1; COMMIT TRANSACTION; SELECT 2 FROM system.local;\n"
    )
    statements, still_open = texts(ruleset, script)
    assert not still_open
    assert [s.split()[0:2] for s in statements] == [
        ["BEGIN", "TRANSACTION"],
        ["SELECT", "1"],
        ["BEGIN", "UNLOGGED"],
        ["BEGIN", "TRANSACTION"],
        ["SELECT", "2"],
    ]
    assert statements[0].endswith("END IF\nCOMMIT TRANSACTION;")
    assert statements[2].endswith("APPLY BATCH;")


def test_comments_and_end_if_do_not_close_a_transaction(ruleset: Any) -> None:
    script = (
        "BEGIN TRANSACTION -- COMMIT TRANSACTION; in a comment\n"
        "  LET a = (SELECT balance FROM ks.t WHERE id = 'x'); /* APPLY BATCH; */\n"
        "  IF a.balance > 0 THEN\n"
        "    UPDATE ks.t SET balance = 0 WHERE id = 'x';\n"
        "  END IF;\n"
    )
    statements, still_open = texts(ruleset, script)
    assert still_open, statements
    statements, still_open = texts(ruleset, script + "COMMIT TRANSACTION;\n")
    assert not still_open
    assert len(statements) == 1


def test_an_unfinished_transaction_waits_for_more_lines(ruleset: Any) -> None:
    # Interactive cqlsh keeps the continuation prompt while the block is open.
    _, still_open = texts(ruleset, TRANSFER.replace("COMMIT TRANSACTION;\n", ""))
    assert still_open


def test_an_unknown_splitter_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        from cqlshlib.cql3handling import CqlRuleSet
    monkeypatch.setattr(CqlRuleSet, "cql_split_statements", lambda text: ([], False))
    with pytest.raises(wrapper.CqlshUnavailable, match=r"does not behave as 6\.2\.2"):
        wrapper.patch()


def test_an_unknown_version_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wrapper.importlib.metadata, "version", lambda name: "7.0.0")
    with pytest.raises(wrapper.CqlshUnavailable, match=r"cqlsh 7\.0\.0"):
        wrapper.patch()
