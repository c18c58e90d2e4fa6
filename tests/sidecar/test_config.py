"""Sidecar configuration: YAML plus ACCORD_SIDECAR_* environment, errors naming the field."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from accord_cassandra.config import ConfigError, SidecarConfig, load

BASE: dict[str, Any] = {
    "node_id": 1,
    "listen": "127.0.0.1:50051",
    "peers": {1: "127.0.0.1:50051", 2: "127.0.0.1:50052", 3: "127.0.0.1:50053"},
    "journal_dir": "/tmp/accord-test-journal",
    "tables": {"bank.accounts": {"partition_key": [["id", "text"]], "columns": [["b", "bigint"]]}},
}


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # The developer's own ACCORD_SIDECAR_* variables must not leak into these tests.
    for name in list(os.environ):
        if name.startswith("ACCORD_SIDECAR_"):
            monkeypatch.delenv(name)


def write(tmp_path: Path, **changes: Any) -> Path:
    data = {**BASE, **changes}
    data = {k: v for k, v in data.items() if v is not None}
    path = tmp_path / "sidecar.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def error_of(tmp_path: Path, **changes: Any) -> str:
    with pytest.raises(ConfigError) as caught:
        load(write(tmp_path, **changes))
    return str(caught.value)


def test_a_valid_file_loads(tmp_path: Path) -> None:
    config = load(write(tmp_path))
    assert isinstance(config, SidecarConfig)
    assert config.node_id == 1 and config.peers[3] == "127.0.0.1:50053"
    assert config.store == "memory" and config.journal_fsync
    # Each memory store is private, so every replica writes its own.
    assert not config.shared_storage_enabled and config.planted_bugs == []


@pytest.mark.parametrize(
    ("changes", "fragments"),
    [
        pytest.param({"listen": "nowhere"}, ["listen", "'nowhere' is not host:port"], id="listen"),
        pytest.param({"listen": "127.0.0.1:70000"}, ["listen", "host:port"], id="listen-port"),
        pytest.param({"metrics_listen": ":9"}, ["metrics_listen", "host:port"], id="metrics"),
        pytest.param({"node_id": 4}, ["peers must include this node (4)"], id="peers-entry"),
        pytest.param({"node_id": 2000}, ["node_id", "1023"], id="node-id-range"),
        pytest.param({"peers": None}, ["peers", "required"], id="peers-missing"),
        pytest.param(
            {"replication_factor": 5}, ["replication_factor 5 exceeds the 3 peers"], id="rf"
        ),
        pytest.param(
            {"store": "cassandra"}, ["store: cassandra needs cassandra.keyspaces"], id="keyspaces"
        ),
        pytest.param({"store": "sqlite"}, ["store", "'memory' or 'cassandra'"], id="store-kind"),
        pytest.param({"tables": {}}, ["store: memory needs tables"], id="memory-tables"),
        pytest.param({"bogus": 1}, ["bogus", "Extra inputs are not permitted"], id="unknown"),
        pytest.param(
            {"cassandra": {"keyspaces": ["bank"], "colour": "red"}},
            ["cassandra.colour", "Extra inputs"],
            id="unknown-nested",
        ),
        pytest.param(
            {"cassandra": {"consistency": "ONE"}}, ["cassandra.consistency", "QUORUM"], id="cl"
        ),
        pytest.param({"timing": {"retry_ms": 0}}, ["timing.retry_ms"], id="timing"),
        pytest.param(
            {"timing": {"recover_delay": "learned"}},
            ["timing.recover_delay", "'adaptive' or 'fixed'"],
            id="recover-delay-mode",
        ),
        pytest.param(
            {"timing": {"recover_delay_ms": 9000}},
            ["recover_delay_max_ms (8000) must be at least recover_delay_ms (9000)"],
            id="recover-delay-cap",
        ),
        pytest.param(
            {"timing": {"recover_delay_latency_factor": 0.5}},
            ["timing.recover_delay_latency_factor"],
            id="recover-delay-factor",
        ),
        pytest.param(
            {"timing": {"recover_delay_percentile": 0}},
            ["timing.recover_delay_percentile"],
            id="recover-delay-percentile",
        ),
        pytest.param(
            {"timing": {"recover_delay_window": 0}},
            ["timing.recover_delay_window"],
            id="recover-delay-window",
        ),
        pytest.param({"admission": {"per_key": 0}}, ["admission.per_key"], id="per-key"),
        pytest.param(
            {"admission": {"waiting_per_key": -1}}, ["admission.waiting_per_key"], id="waiting"
        ),
        pytest.param(
            {"admission": {"max_waiting": 20_000}},
            ["admission.max_waiting", "10000"],
            id="max-waiting",
        ),
        pytest.param(
            {"admission": {"per_keys": 3}}, ["admission.per_keys", "Extra inputs"], id="typo"
        ),
        pytest.param(
            {"max_progress_coordinators": 0}, ["max_progress_coordinators"], id="progress"
        ),
        pytest.param(
            {"peer_frame_max_connections": 0},
            ["peer_frame_max_connections", "greater than or equal to 1"],
            id="frame-connections-none",
        ),
        pytest.param(
            {"peer_frames_listen": "127.0.0.1:0", "peer_frame_max_connections": 1},
            ["peer_frame_max_connections (1) must be at least 2: each other peer holds"],
            id="frame-connections-below-peers",
        ),
        pytest.param(
            {"peer_frame_auth_timeout_seconds": 0},
            ["peer_frame_auth_timeout_seconds", "greater than 0"],
            id="frame-auth-timeout",
        ),
        pytest.param(
            {"peer_dead_seconds": 1},
            ["peer_dead_seconds", "greater than or equal to 2"],
            id="frame-dead-peer-too-soon",
        ),
        pytest.param(
            {"cql_max_connections": 0},
            ["cql_max_connections", "greater than or equal to 1"],
            id="cql-no-connections",
        ),
        pytest.param(
            {"cql_dead_client_seconds": 0.5},
            ["cql_dead_client_seconds", "greater than or equal to 2"],
            id="cql-dead-client-too-soon",
        ),
        pytest.param({"batch_max_parts": 0}, ["batch_max_parts"], id="batch-none"),
        pytest.param({"batch_max_parts": 257}, ["batch_max_parts", "256"], id="batch-many"),
        pytest.param({"batch_max_keys": 2000}, ["batch_max_keys", "1024"], id="batch-keys"),
        pytest.param(
            {"shared_storage": True},
            ["shared_storage: true needs store: cassandra"],
            id="shared-memory",
        ),
        pytest.param(
            {"electorate_preference": [1, 4]},
            ["electorate_preference names sidecars [4] not in peers"],
            id="voter-unknown",
        ),
        pytest.param(
            {"coordinate_via": 1},
            ["coordinate_via 1 must be another sidecar in peers"],
            id="via-self",
        ),
        pytest.param(
            {"coordinate_via": 9},
            ["coordinate_via 9 must be another sidecar in peers"],
            id="via-unknown",
        ),
        pytest.param(
            {"electorate_preference": [2, 2]},
            ["electorate_preference names a sidecar twice"],
            id="voter-twice",
        ),
        pytest.param(
            {
                "store": "cassandra",
                "cassandra": {"keyspaces": ["bank"], "consistency": "LOCAL_QUORUM"},
            },
            ["cassandra.consistency LOCAL_QUORUM needs shared_storage: false"],
            id="local-shared",
        ),
        pytest.param(
            {"planted_bugs": ["write_early"]},
            ["planted_bugs", "unknown ['write_early']", "write_before_durable"],
            id="bugs",
        ),
    ],
)
def test_errors_name_the_field(
    tmp_path: Path, changes: dict[str, Any], fragments: list[str]
) -> None:
    message = error_of(tmp_path, **changes)
    assert message.startswith("invalid sidecar config:")
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


def test_admission_and_progress_limits_reach_the_node(tmp_path: Path) -> None:
    from accord_cassandra.server import admission_control, node_config

    defaults = load(write(tmp_path))
    assert node_config(defaults).max_progress_coordinators == 32
    assert admission_control(defaults).per_key == 8
    config = load(
        write(
            tmp_path,
            admission={"per_key": 3, "waiting_per_key": 5, "max_waiting": 7},
            max_progress_coordinators=4,
        )
    )
    assert node_config(config).max_progress_coordinators == 4
    admission = admission_control(config)
    assert (admission.per_key, admission.max_waiting_per_key, admission.max_waiting) == (3, 5, 7)


def test_the_batch_limits_reach_the_node(tmp_path: Path) -> None:
    from accord_cassandra.server import node_config

    defaults = node_config(load(write(tmp_path)))
    assert (defaults.batch_max_parts, defaults.batch_max_keys) == (32, 256)
    config = node_config(load(write(tmp_path, batch_max_parts=1, batch_max_keys=8)))
    assert (config.batch_max_parts, config.batch_max_keys) == (1, 8)


def test_the_recover_delay_settings_reach_the_node(tmp_path: Path) -> None:
    from accord_cassandra.server import node_config

    defaults = node_config(load(write(tmp_path)))
    assert defaults.recover_delay_adaptive
    assert (defaults.recover_delay_micros, defaults.recover_delay_other_micros) == (
        1_000_000,
        3_000_000,
    )
    assert defaults.recover_delay_max_micros == 8_000_000
    assert defaults.recover_backoff_max_micros == 8_000_000
    timing = {
        "recover_delay_ms": 500,
        "recover_delay_max_ms": 20_000,
        "recover_delay_latency_factor": 3,
        "recover_delay_percentile": 95,
        "recover_delay_window": 64,
    }
    tuned = node_config(load(write(tmp_path, timing=timing)))
    assert tuned.recover_delay_adaptive and tuned.recover_delay_micros == 500_000
    assert tuned.recover_delay_max_micros == 20_000_000
    # The backoff caps every delay, so it rises with the cap.
    assert tuned.recover_backoff_max_micros == 20_000_000
    assert tuned.recover_delay_latency_factor == 3.0
    assert tuned.recover_delay_percentile == 95.0
    assert tuned.recover_delay_window == 64
    # Fixed: the old behaviour, whatever the cap (a floor above it is no error then).
    fixed = node_config(
        load(write(tmp_path, timing={"recover_delay": "fixed", "recover_delay_ms": 9000}))
    )
    assert not fixed.recover_delay_adaptive and fixed.recover_delay_micros == 9_000_000


def test_unreadable_and_non_mapping_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load(tmp_path / "absent.yaml")
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load(path)
    path.write_text("node_id: [unclosed\n")
    with pytest.raises(ConfigError, match="cannot read config"):
        load(path)


def test_environment_beats_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = write(
        tmp_path,
        store="cassandra",
        cassandra={"keyspaces": ["bank"], "username": "yaml-user", "password": "yaml-secret"},
    )
    monkeypatch.setenv("ACCORD_SIDECAR_LISTEN", "127.0.0.1:6000")
    monkeypatch.setenv("ACCORD_SIDECAR_CASSANDRA__PASSWORD", "env-secret")
    monkeypatch.setenv("ACCORD_SIDECAR_CLIENT_TOKEN", "env-token")
    config = load(path)
    assert config.listen == "127.0.0.1:6000"
    assert config.client_token == "env-token"
    # A nested variable replaces one field and keeps the file's siblings.
    assert config.cassandra.password == "env-secret"
    assert config.cassandra.username == "yaml-user"
    assert config.cassandra.keyspaces == ["bank"]
    # Keyword overrides merge with the file; the environment still wins over them.
    assert load(path, listen="127.0.0.1:7000", drain_seconds=1).listen == "127.0.0.1:6000"
    assert load(path, drain_seconds=1).drain_seconds == 1


def test_a_bad_environment_value_names_the_field(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ACCORD_SIDECAR_NODE_ID", "one")
    message = error_of(tmp_path)
    assert "node_id" in message and "integer" in message


def test_a_cassandra_store_is_shared_unless_told_otherwise(tmp_path: Path) -> None:
    cassandra = {"store": "cassandra", "cassandra": {"keyspaces": ["bank"]}}
    assert load(write(tmp_path, **cassandra)).shared_storage_enabled
    assert not load(write(tmp_path, **cassandra, shared_storage=False)).shared_storage_enabled


def test_local_quorum_loads_with_every_replica_writing(tmp_path: Path) -> None:
    config = load(
        write(
            tmp_path,
            store="cassandra",
            shared_storage=False,
            cassandra={"keyspaces": ["bank"], "consistency": "LOCAL_QUORUM"},
            electorate_size=2,
            electorate_preference=[2, 1],
        )
    )
    assert config.cassandra.consistency == "LOCAL_QUORUM" and not config.shared_storage_enabled
    from accord_cassandra.server import static_topology

    assert {s.electorate for s in static_topology(config).shards} == {frozenset({1, 2})}


@pytest.mark.parametrize("batch_max_keys", [None, 129, 1024])
def test_peers_accept_the_largest_batch_a_coordinator_forms(
    tmp_path: Path, batch_max_keys: int | None
) -> None:
    # Group commit merges disjoint client transactions into one Accord transaction of up to
    # batch_max_keys keys, more than one client transaction may name. A peer limit below it
    # refused every such PreAccept and BeginRecovery: 48 concurrent 16-key transactions
    # formed batches of 144-256 keys that no replica accepted, so each one stalled until
    # its client deadline and could not be recovered either (BeginRecovery carries it too).
    from accord.messages import Envelope, PreAccept
    from accord.messages.validate import validate
    from accord.primitives import Const, Key, Put, Route, Timestamp, Txn, Update
    from accord_cassandra.server import message_limits, node_config, static_topology

    config = load(write(tmp_path, batch_max_keys=batch_max_keys))
    keys_max = node_config(config).batch_max_keys
    # 16-key client transactions (the last one smaller) filling the batch to its limit.
    parts = tuple(
        Txn(
            reads=(),
            update=Update(
                tuple(
                    Put(Key(k, f"k{k}"), Const(1)) for k in range(start, min(start + 16, keys_max))
                )
            ),
        )
        for start in range(0, keys_max, 16)
    )
    batch = Txn.batch(parts)
    keys = tuple(sorted(batch.keys))
    assert len(keys) == keys_max
    now = 1_800_000_000_000_000
    txn_id = Timestamp(1, now, int(batch.kind), 2)
    preaccept = PreAccept(1, txn_id, batch, Route(keys[0], keys))
    # Whatever the receiving sidecar's own batch_max_keys (settings may differ in a cluster).
    receiver = load(write(tmp_path, batch_max_keys=1))
    for peer in (config, receiver):
        validate(Envelope(2, 1, preaccept), static_topology(peer), now, message_limits(peer))
