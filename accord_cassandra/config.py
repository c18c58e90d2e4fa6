"""Sidecar configuration: a YAML file, overridable by environment variables.

Environment variables are ``ACCORD_SIDECAR_<FIELD>``, nested fields joined by ``__`` (for
example ``ACCORD_SIDECAR_CASSANDRA__PASSWORD``). Every error names the offending field.

Example::

    node_id: 1
    listen: 127.0.0.1:50051
    peers: {1: 127.0.0.1:50051, 2: 127.0.0.1:50052, 3: 127.0.0.1:50053}
    replication_factor: 3
    journal_dir: /var/lib/accord/node1
    store: cassandra
    cassandra: {contact_points: [127.0.0.1], keyspaces: [bank], consistency: QUORUM}
    client_token: change-me
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from accord_cassandra.datastore import MAX_NODE_ID


class ConfigError(ValueError):
    """The configuration is invalid; the message names the field."""


class CassandraSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    contact_points: list[str] = Field(default_factory=lambda: ["127.0.0.1"])
    port: int = Field(default=9042, ge=1, le=65535)
    keyspaces: list[str] = Field(default_factory=list)
    consistency: Literal["QUORUM", "LOCAL_QUORUM", "ALL"] = "QUORUM"
    local_datacenter: str | None = None
    username: str | None = None
    password: str | None = None
    connect_timeout_seconds: float = Field(default=10.0, gt=0)


class TlsSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    certificate: Path
    private_key: Path
    ca: Path | None = None
    require_client_certificate: bool = False


class TimingSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    retry_ms: int = Field(default=200, ge=1)
    recover_delay_ms: int = Field(default=1000, ge=1)
    preaccept_timeout_ms: int = Field(default=10_000, ge=1)
    client_timeout_ms: int = Field(default=10_000, ge=1)
    reorder_buffer_ms: int = Field(default=0, ge=0)


class SidecarConfig(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix="ACCORD_SIDECAR_", env_nested_delimiter="__", extra="forbid"
    )

    node_id: int = Field(ge=1, le=MAX_NODE_ID)
    listen: str = "127.0.0.1:50051"
    peers: dict[int, str]
    replication_factor: int = Field(default=3, ge=1)
    shards_per_node: int = Field(default=4, ge=1, le=256)
    # Fast-path voters per shard (n - f <= e <= n); fewer voters mean a nearer fast quorum.
    electorate_size: int | None = Field(default=None, ge=1)
    topology: Literal["static", "cassandra"] = "static"
    # With topology: cassandra, the Cassandra node (address) each sidecar runs beside.
    cassandra_hosts: dict[int, str] = Field(default_factory=dict)
    journal_dir: Path
    journal_fsync: bool = True
    store: Literal["memory", "cassandra"] = "memory"
    cassandra: CassandraSettings = Field(default_factory=CassandraSettings)
    # Tables for the memory store: {"ks.t": {"partition_key": [[name, type]], "columns": [...]}}
    tables: dict[str, dict[str, list[list[str]]]] = Field(default_factory=dict)
    client_token: str | None = None
    tls: TlsSettings | None = None
    metrics_listen: str | None = None
    timing: TimingSettings = Field(default_factory=TimingSettings)
    drain_seconds: float = Field(default=5.0, ge=0)
    # How far ahead of this node's clock a peer's timestamps may be; beyond it a message is
    # refused, since the HLC would follow it for good.
    max_clock_skew_seconds: float = Field(default=60.0, gt=0, le=3600)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The environment overrides the YAML file (which arrives as init arguments).
        return (env_settings, init_settings)

    @field_validator("listen", "metrics_listen")
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            host, sep, port = value.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{value!r} is not host:port")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> SidecarConfig:
        if self.node_id not in self.peers:
            raise ValueError(f"peers must include this node ({self.node_id})")
        if self.replication_factor > len(self.peers):
            raise ValueError(
                f"replication_factor {self.replication_factor} exceeds the {len(self.peers)} peers"
            )
        if self.store == "cassandra" and not self.cassandra.keyspaces:
            raise ValueError("store: cassandra needs cassandra.keyspaces (the keyspaces to serve)")
        if self.electorate_size is not None:
            lowest = self.replication_factor - (self.replication_factor - 1) // 2
            if not lowest <= self.electorate_size <= self.replication_factor:
                raise ValueError(
                    f"electorate_size must be within [{lowest}, {self.replication_factor}] "
                    f"for replication_factor {self.replication_factor}"
                )
        if self.topology == "cassandra":
            if self.store != "cassandra":
                raise ValueError("topology: cassandra needs store: cassandra")
            missing = sorted(set(self.peers) - set(self.cassandra_hosts))
            if missing:
                raise ValueError(
                    f"cassandra_hosts must name the Cassandra node beside sidecars {missing}"
                )
        if self.store == "memory" and not self.tables:
            raise ValueError("store: memory needs tables (their columns and types)")
        return self


def load(path: Path | None = None, **overrides: Any) -> SidecarConfig:
    """Read ``path`` (YAML) merged with keyword ``overrides``; ``ACCORD_SIDECAR_*``
    environment variables beat both (pydantic-settings ranks the environment above
    constructor arguments, see ``settings_customise_sources``)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            loaded = yaml.safe_load(path.read_text())
        except (OSError, yaml.YAMLError) as error:
            raise ConfigError(f"cannot read config {path}: {error}") from None
        if loaded is not None and not isinstance(loaded, dict):
            raise ConfigError(f"config {path} must be a mapping at the top level")
        data.update(loaded or {})
    data.update(overrides)
    try:
        return SidecarConfig(**data)
    except ValidationError as error:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(config)'}: {e['msg']}"
            for e in error.errors()
        )
        raise ConfigError(f"invalid sidecar config: {problems}") from None
