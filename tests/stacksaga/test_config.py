"""Configuration: the seed's Properties Reference (names, defaults), YAML + environment, the
DataStax HOCON driver file, and errors that name the property.

Reference: seed 000, "Properties Reference" and Part 1 Step 3 (stacksaga-cassandra.conf).
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stacksaga_store.config.driver import DEFAULT_DRIVER_FILE, build_cluster, parse_driver_config
from stacksaga_store.config.durations import format_duration, parse_duration
from stacksaga_store.config.hocon import HoconError, parse_hocon
from stacksaga_store.config.settings import (
    ConsistencyMode,
    SagaSupportConsistencyLevel,
    load_settings,
)
from stacksaga_store.errors import ConfigError

SEED_DRIVER_FILE = """
datastax-java-driver {
  basic {
    contact-points = ["cassandra-host-1:9042", "cassandra-host-2:9042"]
    load-balancing-policy.local-datacenter = datacenter1
    session-keyspace = stacksaga_event_store
  }
  advanced {
    auth-provider {
      class = PlainTextAuthProvider
      username = cassandra
      password = cassandra
    }
    reconnection-policy {
      class = ExponentialReconnectionPolicy
      base-delay = 1 second
      max-delay = 60 seconds
    }
  }
}
"""

SEED_YAML = """
stacksaga:
  cassandra:
    read-consistency-level: LOCAL_QUORUM
    write-consistency-level: LOCAL_QUORUM
    config: classpath:stacksaga-cassandra.conf

    transaction:
      lifetime: 24h

    write-protection:
      default-mode: RELAXED_WITH_DEDUP
      default-lease-duration: 5s
      domains:
        payment-saga:
          mode: STRICT
          lease-duration: 10s
        notification-saga:
          mode: RELAXED_WITH_DEDUP

    recovery:
      window-interval-minutes: 1          # 1440 windows per day
      bucket-size: 50000                  # ~5MB max per partition
      concurrency: 100                    # parallel re-invocations

      retry:
        lookback-days: 2                  # scan back 2 days on startup

      restore:
        delay-windows: 600                # watchdog 600 min ahead
"""


@pytest.fixture(autouse=True)
def _no_stacksaga_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    for name in list(os.environ):
        if name.startswith("STACKSAGA_"):
            monkeypatch.delenv(name)


def test_defaults_are_the_seeds() -> None:
    cassandra = load_settings().cassandra
    assert cassandra.read_consistency_level is SagaSupportConsistencyLevel.LOCAL_QUORUM
    assert cassandra.write_consistency_level is SagaSupportConsistencyLevel.LOCAL_QUORUM
    assert cassandra.config == "classpath:stacksaga-cassandra.conf"
    assert cassandra.write_protection.default_mode is ConsistencyMode.RELAXED_WITH_DEDUP
    assert cassandra.write_protection.default_lease_duration == timedelta(seconds=5)
    assert cassandra.write_protection.domains == {}
    assert cassandra.transaction.lifetime == timedelta(hours=24)
    assert cassandra.recovery.window_interval_minutes == 1
    assert cassandra.recovery.bucket_size == 50_000
    assert cassandra.recovery.concurrency == 100
    assert cassandra.recovery.retry.lookback_days == 2
    assert cassandra.recovery.restore.delay_windows == 600


def test_seed_example_yaml_loads_with_domain_overrides(tmp_path: Path) -> None:
    path = tmp_path / "application.yaml"
    path.write_text(SEED_YAML)
    protection = load_settings(path).cassandra.write_protection
    payment = protection.policy_for("payment-saga")
    assert (payment.mode, payment.lease_duration) == (ConsistencyMode.STRICT, timedelta(seconds=10))
    notification = protection.policy_for("notification-saga")
    assert notification.mode is ConsistencyMode.RELAXED_WITH_DEDUP
    # lease-duration is null there: falls back to default-lease-duration.
    assert notification.lease_duration == timedelta(seconds=5)
    other = protection.policy_for("unknown-saga")
    assert (other.mode, other.lease_seconds) == (ConsistencyMode.RELAXED_WITH_DEDUP, 5)


def test_environment_overrides_yaml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "application.yaml"
    path.write_text(SEED_YAML)
    monkeypatch.setenv("STACKSAGA_CASSANDRA__WRITE_PROTECTION__DEFAULT_MODE", "STRICT")
    monkeypatch.setenv(
        "STACKSAGA_CASSANDRA__WRITE_PROTECTION__DOMAINS__PAYMENT_SAGA__LEASE_DURATION", "7s"
    )
    monkeypatch.setenv("STACKSAGA_INSTANCE__SERVICE_NAME", "order-service")
    settings = load_settings(path)
    protection = settings.cassandra.write_protection
    assert protection.default_mode is ConsistencyMode.STRICT
    assert protection.policy_for("payment-saga").lease_duration == timedelta(seconds=7)
    assert protection.policy_for("payment-saga").mode is ConsistencyMode.STRICT  # from YAML
    assert settings.instance.service_name == "order-service"


@pytest.mark.parametrize(
    ("overrides", "property_name", "fragment"),
    [
        (
            {"cassandra": {"recovery": {"window-interval-minutes": 7}}},
            "stacksaga.cassandra.recovery.window-interval-minutes",
            "divide 1440",
        ),
        (
            {"cassandra": {"recovery": {"window-interval-minutes": 0}}},
            "stacksaga.cassandra.recovery.window-interval-minutes",
            "greater than or equal to 1",
        ),
        (
            {"cassandra": {"transaction": {"lifetime": "5 fortnights"}}},
            "stacksaga.cassandra.transaction.lifetime",
            "unknown duration unit",
        ),
        (
            {"cassandra": {"write-protection": {"default-lease-duration": "1500ms"}}},
            "stacksaga.cassandra.write-protection.default-lease-duration",
            "whole number of seconds",
        ),
        (
            {"cassandra": {"write-protection": {"domains": {"pay": {"mode": "FAST"}}}}},
            "stacksaga.cassandra.write-protection.domains.pay.mode",
            "STRICT",
        ),
        (
            {"cassandra": {"write-protection": {"domains": {"pay": {"lease-duration": "2d"}}}}},
            "stacksaga.cassandra.write-protection.domains.pay.lease-duration",
            "between 1s and 1d",
        ),
        (
            {"cassandra": {"read-consistency-level": "ONE"}},
            "stacksaga.cassandra.read-consistency-level",
            "LOCAL_QUORUM",
        ),
        (
            {"cassandra": {"recovery": {"bucket-size": 0}}},
            "stacksaga.cassandra.recovery.bucket-size",
            "greater than or equal to 1",
        ),
        (
            {"cassandra": {"recovery": {"concurrency": 10**6}}},
            "stacksaga.cassandra.recovery.concurrency",
            "less than or equal to 10000",
        ),
        (
            {"cassandra": {"recovery": {"retry": {"lookback-days": -1}}}},
            "stacksaga.cassandra.recovery.retry.lookback-days",
            "greater than or equal to 0",
        ),
        (
            {"cassandra": {"recovery": {"restore": {"delay-windows": 10**6}}}},
            "stacksaga.cassandra.recovery",
            "delay-windows",
        ),
        (
            {"cassandra": {"lease-duration": "5s"}},
            "stacksaga.cassandra.lease-duration",
            "unknown property",
        ),
        ({"instance": {"region": ""}}, "stacksaga.instance.region", "at least 1 character"),
    ],
)
def test_bad_values_name_the_property(
    overrides: dict[str, Any], property_name: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(**overrides)
    names = [name for name, _ in caught.value.problems]
    assert property_name in names, caught.value
    message = dict(caught.value.problems)[property_name]
    assert fragment in message, message


def test_every_bad_value_is_reported_at_once() -> None:
    with pytest.raises(ConfigError) as caught:
        load_settings(
            cassandra={"recovery": {"window-interval-minutes": 7, "bucket-size": 0}},
            instance={"cluster": ""},
        )
    assert len(caught.value.problems) == 3


def test_bad_environment_value_names_the_property(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STACKSAGA_CASSANDRA__RECOVERY__WINDOW_INTERVAL_MINUTES", "7")
    with pytest.raises(ConfigError, match="window-interval-minutes: must evenly divide 1440"):
        load_settings()


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("stacksaga: [unclosed\n")
    with pytest.raises(ConfigError, match=r"broken\.yaml"):
        load_settings(path)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("5s", timedelta(seconds=5)),
        ("24h", timedelta(hours=24)),
        ("1 second", timedelta(seconds=1)),
        ("60 seconds", timedelta(seconds=60)),
        ("500ms", timedelta(milliseconds=500)),
        ("PT1H30M", timedelta(hours=1, minutes=30)),
        ("P1D", timedelta(days=1)),
        ("2d", timedelta(days=2)),
        ("250", timedelta(milliseconds=250)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert parse_duration(text) == expected


@given(st.integers(min_value=0, max_value=10**9))
def test_duration_format_round_trips(milliseconds: int) -> None:
    value = timedelta(milliseconds=milliseconds)
    assert parse_duration(format_duration(value)) == value


def test_seed_driver_file_maps_onto_cassandra_driver() -> None:
    config = parse_driver_config(SEED_DRIVER_FILE, "stacksaga-cassandra.conf")
    assert config.contact_points == (("cassandra-host-1", 9042), ("cassandra-host-2", 9042))
    assert config.local_datacenter == "datacenter1"
    assert config.keyspace == "stacksaga_event_store"
    assert config.credentials is not None and config.credentials.username == "cassandra"
    assert config.reconnection_policy == "exponential"
    assert (config.reconnection_base_delay, config.reconnection_max_delay) == (
        timedelta(seconds=1),
        timedelta(seconds=60),
    )
    with pytest.raises(ConfigError, match="no contact point resolves: cassandra-host-1:9042"):
        build_cluster(config, load_settings())
    local = replace(config, contact_points=(("127.0.0.1", 9042),))
    cluster = build_cluster(local, load_settings())
    try:
        assert cluster.reconnection_policy.base_delay == 1.0
        assert cluster.reconnection_policy.max_delay == 60.0
        assert type(cluster.auth_provider).__name__ == "PlainTextAuthProvider"
        profile = cluster.profile_manager.default
        assert profile.load_balancing_policy._child_policy.local_dc == "datacenter1"
    finally:
        cluster.shutdown()


def test_built_in_default_driver_file_parses() -> None:
    config = parse_driver_config(DEFAULT_DRIVER_FILE)
    assert config.contact_points == (("127.0.0.1", 9042),)


@pytest.mark.parametrize(
    ("text", "key", "fragment"),
    [
        (
            'datastax-java-driver.basic.contact-points = ["db:99999"]',
            "datastax-java-driver.basic.contact-points",
            "host:port",
        ),
        (
            "datastax-java-driver.basic.session-keyspace = 1bad",
            "datastax-java-driver.basic.session-keyspace",
            "CQL identifier",
        ),
        (
            "datastax-java-driver.basic.request.timeout = soon",
            "datastax-java-driver.basic.request.timeout",
            "duration",
        ),
        (
            "datastax-java-driver.advanced.auth-provider.class = KerberosAuthProvider",
            "datastax-java-driver.advanced.auth-provider.class",
            "PlainTextAuthProvider",
        ),
        (
            "datastax-java-driver.advanced.auth-provider.class = PlainTextAuthProvider",
            "datastax-java-driver.advanced.auth-provider.username",
            "username and password",
        ),
        (
            "datastax-java-driver.advanced.reconnection-policy.class = Fancy",
            "datastax-java-driver.advanced.reconnection-policy.class",
            "Exponential",
        ),
        (
            "datastax-java-driver.advanced.protocol.version = V9",
            "datastax-java-driver.advanced.protocol.version",
            "V5",
        ),
        (
            "datastax-java-driver.advanced.ssl-engine-factory.class = DefaultSslEngineFactory",
            "datastax-java-driver.advanced.ssl-engine-factory",
            "TLS",
        ),
    ],
)
def test_bad_driver_values_name_the_key(text: str, key: str, fragment: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_driver_config(text, "app.conf")
    problems = dict(caught.value.problems)
    assert key in problems, caught.value
    assert fragment in problems[key]


def test_unknown_driver_keys_are_reported_not_fatal() -> None:
    config = parse_driver_config("datastax-java-driver.advanced.metrics.session.enabled = [a]")
    assert config.ignored == ("advanced.metrics.session.enabled",)


def test_missing_root_block_is_an_error() -> None:
    with pytest.raises(ConfigError, match="datastax-java-driver"):
        parse_driver_config("basic.session-keyspace = x", "app.conf")


def test_hocon_subset() -> None:
    parsed = parse_hocon(
        """
        # comment
        a { b.c = 1, d = "x y" }   // trailing comment
        a.e = [1, 2,
               3,]
        a { b { f = true } }
        g: 2 seconds
        """
    )
    assert parsed == {"a": {"b": {"c": 1, "f": True}, "d": "x y", "e": [1, 2, 3]}, "g": "2 seconds"}


@pytest.mark.parametrize(
    ("text", "position", "fragment"),
    [
        ("a = ${b}", "1:5", "${b} is not set"),
        ("a = ${b", "1:5", "unterminated substitution"),
        ("a = ${b c}", "1:5", "bad substitution"),
        ("${a} = 1", "1:1", "substitutions in keys"),
        ("a = ${a}x", "1:5", "refers to itself"),
        ("a = ${b}\nb = ${a}", "1:5", "cycle"),
        ("a { x = 1 }\nb = q${a}", "2:6", "cannot be joined"),
        ('include "other.conf"', "1:1", "include"),
        ("a = [1, 2", "1:5", "never closed"),
        ("a {\n b = 1\n", "1:3", "never closed"),
        ("a { b = 1", "1:5", "missing '}'"),
        ("a = host:9042", "1:9", "quote"),
        ('a = "unterminated', "1:5", "unterminated"),
        ("a += 1", "1:3", "+="),
    ],
)
def test_hocon_errors_name_line_and_column(text: str, position: str, fragment: str) -> None:
    with pytest.raises(HoconError) as caught:
        parse_hocon(text, "app.conf")
    name, message = caught.value.problems[0]
    assert name == f"app.conf:{position}"
    assert fragment in message


def test_hocon_substitutions_read_the_file_then_the_environment() -> None:
    env = {"CASSANDRA_PASSWORD": "s3cret", "PORT": "9042", "HOST": "db1"}
    parsed = parse_hocon(
        """
        defaults { user = cassandra }
        auth {
          username = ${defaults.user}
          password = ${?CASSANDRA_PASSWORD}
          port = ${PORT}
        }
        url = "cql://"${HOST}":"${PORT}/ks
        copy = ${defaults}
        hosts = [${HOST}, ${?OTHER_HOST}, h3]
        """,
        env=env,
    )
    assert parsed["auth"] == {"username": "cassandra", "password": "s3cret", "port": "9042"}
    assert parsed["url"] == "cql://db1:9042/ks"
    assert parsed["copy"] == {"user": "cassandra"}
    assert parsed["hosts"] == ["db1", "h3"]


def test_an_unset_optional_substitution_leaves_the_field_as_it_was() -> None:
    parsed = parse_hocon(
        """
        a { password = ${?CASSANDRA_PASSWORD} }
        b { password = fallback
            password = ${?CASSANDRA_PASSWORD} }
        c = "x"${?UNSET}"y"
        """,
        env={},
    )
    assert parsed == {"a": {}, "b": {"password": "fallback"}, "c": "xy"}


def test_a_required_substitution_that_is_unset_names_the_variable() -> None:
    with pytest.raises(HoconError) as caught:
        parse_hocon("a {\n  password = ${CASSANDRA_PASSWORD}\n}", "app.conf", env={})
    name, message = caught.value.problems[0]
    assert name == "app.conf:2:14"
    assert "CASSANDRA_PASSWORD" in message and "not set" in message


def test_environment_values_stay_strings() -> None:
    # A numeric-looking secret must reach the driver as text, exactly as set.
    assert parse_hocon("p = ${P}", env={"P": "007"}) == {"p": "007"}


def test_driver_password_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    text = """
    datastax-java-driver {
      basic.contact-points = ["127.0.0.1:9042"]
      basic.load-balancing-policy.local-datacenter = datacenter1
      advanced.auth-provider {
        class = PlainTextAuthProvider
        username = cassandra
        password = ${?CASSANDRA_PASSWORD}
      }
    }
    """
    monkeypatch.setenv("CASSANDRA_PASSWORD", "from-env")
    credentials = parse_driver_config(text, "app.conf").credentials
    assert credentials is not None and credentials.password == "from-env"
    monkeypatch.delenv("CASSANDRA_PASSWORD")
    with pytest.raises(ConfigError, match="username and password"):
        parse_driver_config(text, "app.conf")
