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
    peer_auth: hmac                 # or mtls (with peer_listen, peer_tls); see docs/sidecars.md
    peer_keys: {current: {id: k1, secret: <openssl rand -hex 32>}}
    admission: {per_key: 8, waiting_per_key: 64, max_waiting: 2000}   # the defaults
    max_progress_coordinators: 32                                     # the default
    batch_max_parts: 32                   # group commit: client txns per Accord txn (default)
"""

from __future__ import annotations

import dataclasses
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from accord import MAX_BATCH_PARTS
from accord.testing import Bugs
from accord_cassandra.datastore import MAX_NODE_ID
from accord_cassandra.errors import AccordCassandraError
from accord_cassandra.frames import AUTH_TIMEOUT_SECONDS as FRAME_AUTH_TIMEOUT_SECONDS
from accord_cassandra.frames import DEAD_PEER_SECONDS as FRAME_DEAD_PEER_SECONDS
from accord_cassandra.frames import MAX_CONNECTIONS as MAX_FRAME_CONNECTIONS
from accord_cassandra.host import (
    MAX_IN_FLIGHT_PER_KEY,
    MAX_PENDING_CLIENTS,
    MAX_WAITING,
    WAITING_PER_SLOT,
)
from accord_cassandra.native.endpoint import DEAD_CLIENT_SECONDS as CQL_DEAD_CLIENT_SECONDS
from accord_cassandra.native.endpoint import MAX_CONNECTIONS as CQL_MAX_CONNECTIONS
from accord_cassandra.peerauth import PeerAuthMode, is_loopback
from accord_cassandra.ports import BIND_RETRY_SECONDS
from accord_cassandra.schema import Catalog, SchemaError

ENV_PREFIX = "ACCORD_SIDECAR_"
# bench throughput, conditional set on 2,000 keys (docs/sidecars.md, "Group commit").
DEFAULT_BATCH_MAX_PARTS = 32
# The most keys batch_max_keys may be set to, and so what a sidecar accepts in one peer
# transaction whatever its own batch_max_keys (peers' settings may differ).
BATCH_MAX_KEYS_LIMIT = 1024
# Where a journal can never be kept, whatever the permissions say.
PSEUDO_FILESYSTEMS = (Path("/proc"), Path("/sys"), Path("/dev"))


class ConfigError(AccordCassandraError, ValueError):
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

    @field_validator("certificate", "private_key", "ca")
    @classmethod
    def _readable(cls, value: Path | None) -> Path | None:
        if value is not None:
            try:
                with open(value, "rb") as handle:
                    handle.read(1)
            except OSError as error:
                raise ValueError(f"cannot read {value}: {error.strerror}") from None
        return value

    @model_validator(mode="after")
    def _client_certificates_need_a_ca(self) -> TlsSettings:
        if self.require_client_certificate and self.ca is None:
            raise ValueError("require_client_certificate needs ca (the CA that signs them)")
        return self


class PeerKeySettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9._-]+$")
    # 32 characters at least (``openssl rand -hex 32`` makes 64): a guessable key is no key.
    secret: SecretStr = Field(min_length=32, max_length=1024)


class PeerKeys(BaseModel):
    """Batches are signed with ``current``; ``current`` and ``previous`` are accepted."""

    model_config = ConfigDict(extra="forbid")

    current: PeerKeySettings
    previous: PeerKeySettings | None = None

    @model_validator(mode="after")
    def _distinct(self) -> PeerKeys:
        if self.previous is not None and self.previous.id == self.current.id:
            raise ValueError(f"previous.id must differ from current.id ({self.current.id!r})")
        return self


class PeerTlsSettings(BaseModel):
    """Mutual TLS on the peer port: every peer presents a certificate signed by ``ca``
    whose common name or a subject alternative name is ``identity`` of its node id."""

    model_config = ConfigDict(extra="forbid")

    certificate: Path
    private_key: Path
    ca: Path
    identity: str = "accord-node-{node_id}"

    @field_validator("certificate", "private_key", "ca")
    @classmethod
    def _readable(cls, value: Path) -> Path:
        # Here, so that a missing file is one line naming the field, not a gRPC traceback.
        try:
            with value.open("rb"):
                pass
        except OSError as error:
            raise ValueError(f"cannot read {value}: {error.strerror or error}") from None
        return value

    @field_validator("identity")
    @classmethod
    def _identity(cls, value: str) -> str:
        try:
            one, two = value.format(node_id=1), value.format(node_id=2)
        except (KeyError, IndexError, ValueError) as error:
            raise ValueError(f"{value!r} is not a pattern of {{node_id}}: {error}") from None
        if one == two:
            raise ValueError(f"{value!r} must contain {{node_id}}")
        return value


# Bound on timing.recover_delay_max_ms: a learned delay that long leaves a crashed
# coordinator's transactions (and their keys) waiting 10 minutes.
MAX_RECOVER_DELAY_MS = 600_000


class TimingSettings(BaseModel):
    """Protocol timing (docs/sidecars.md, "Timing")."""

    model_config = ConfigDict(extra="forbid")

    # The first re-send of an unanswered message. Sidecar streams lose a message only when a
    # batch fails (the peer is down or refused it) or is dropped stale; at 200 ms a
    # saturated cluster's replies, slower than that, were re-sent and re-handled instead
    # (docs/sidecars.md, "Timing": 1.6 more messages and 0.7 more Cassandra reads per txn).
    retry_ms: int = Field(default=1000, ge=1)
    # The idle time after which a replica recovers a txn (3x for other shards' replicas):
    # fixed, or the floor of a delay learned from the PreAccept->Apply latency seen here
    # (accord/local/recover_delay.py), so that slow healthy txns are not recovered.
    recover_delay_ms: int = Field(default=1000, ge=1, le=MAX_RECOVER_DELAY_MS)
    recover_delay: Literal["adaptive", "fixed"] = "adaptive"
    recover_delay_max_ms: int = Field(default=8000, ge=1, le=MAX_RECOVER_DELAY_MS)
    recover_delay_latency_factor: float = Field(default=2.0, ge=1.0, le=100.0)
    recover_delay_percentile: float = Field(default=99.0, gt=0.0, le=100.0)
    recover_delay_window: int = Field(default=512, ge=1, le=100_000)
    preaccept_timeout_ms: int = Field(default=10_000, ge=1)
    client_timeout_ms: int = Field(default=10_000, ge=1)
    reorder_buffer_ms: int = Field(default=0, ge=0)

    @model_validator(mode="after")
    def _recover_delay_range(self) -> TimingSettings:
        if self.recover_delay == "adaptive" and self.recover_delay_max_ms < self.recover_delay_ms:
            raise ValueError(
                f"recover_delay_max_ms ({self.recover_delay_max_ms}) must be at least "
                f"recover_delay_ms ({self.recover_delay_ms}) with recover_delay: adaptive"
            )
        return self


class AdmissionSettings(BaseModel):
    """Admission control of client transactions (accord_cassandra/host.py ``Admission``)."""

    model_config = ConfigDict(extra="forbid")

    # Client transactions in the protocol at once per key, on this sidecar.
    per_key: int = Field(default=MAX_IN_FLIGHT_PER_KEY, ge=1, le=1024)
    # Transactions that may wait for a slot on one key; beyond it they are refused at once.
    waiting_per_key: int = Field(
        default=WAITING_PER_SLOT * MAX_IN_FLIGHT_PER_KEY, ge=0, le=MAX_PENDING_CLIENTS
    )
    # Transactions that may wait for a slot on this sidecar, over all keys.
    max_waiting: int = Field(default=MAX_WAITING, ge=0, le=MAX_PENDING_CLIENTS)


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
    # Which replicas vote when electorate_size is below the shard's: these sidecars first, in
    # this order (the rest after, in ring order). Put the nodes nearest the clients first; any
    # choice is safe (docs/accord.md, "Fast-path electorates").
    electorate_preference: list[int] = Field(default_factory=list)
    # Another sidecar (peer id) that coordinates this one's client transactions, called at
    # its client API (its `peers` address, with this client_token and tls): for a sidecar far
    # from every fast quorum, whose nearest peer coordinates sooner than it could itself
    # (docs/sidecars.md, "Coordinating through a nearer sidecar").
    coordinate_via: int | None = None
    topology: Literal["static", "cassandra"] = "static"
    # With topology: cassandra, the Cassandra node (address) each sidecar runs beside.
    cassandra_hosts: dict[int, str] = Field(default_factory=dict)
    journal_dir: Path
    journal_fsync: bool = True
    store: Literal["memory", "cassandra"] = "memory"
    # One replica per shard writes each transaction (the others learn it did) when every
    # replica's store is the same Cassandra; unset means: yes for store cassandra, no for
    # memory (each embedded sidecar has its own). See docs/sidecars.md, "One writer".
    shared_storage: bool | None = None
    cassandra: CassandraSettings = Field(default_factory=CassandraSettings)
    # Tables for the memory store (docs/sidecars.md, "The memory store's tables"):
    # {"ks.t": {"partition_key": [[name, type]], "clustering": [[name, type, "asc"|"desc"]],
    #           "columns": [[name, type]], "static": [[name, type]]},
    #  "ks.udt": {"fields": [[name, type]]}}  (a user-defined type of keyspace ks)
    tables: dict[str, dict[str, list[list[str]]]] = Field(default_factory=dict)
    client_token: str | None = None
    tls: TlsSettings | None = None
    # Peer authentication (accord_cassandra/peerauth.py). "none" only on loopback, unless
    # allow_insecure_peers says that anyone able to reach the peer port may be trusted.
    peer_auth: PeerAuthMode = "none"
    peer_keys: PeerKeys | None = None
    peer_tls: PeerTlsSettings | None = None
    # A port for Peer.Deliver alone (and every node's, in peer_addresses): mutual TLS there
    # leaves application clients free of client certificates.
    peer_listen: str | None = None
    peer_addresses: dict[int, str] = Field(default_factory=dict)
    # The framed peer link (accord_cassandra/frames.py; docs/sidecars.md "Peer transport"):
    # a port of its own (0: any free one, reported in address_file) where peers' batches
    # arrive as length-prefixed frames, with the TLS of the gRPC peer port (peer_tls, else
    # tls). ``peer_frame_addresses`` says where each peer's is (or a peers_file's
    # "peer_frames"); a peer without one gets gRPC's Peer.Stream, which is always served.
    peer_frames_listen: str | None = None
    peer_frame_addresses: dict[int, str] = Field(default_factory=dict)
    # The largest frame accepted; a longer one closes the connection, its body unread.
    peer_frame_max_bytes: int = Field(default=8 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024)
    # Frame connections open at once (each peer holds one); one more is closed on arrival.
    # A connection without a whole first frame (TLS handshake and opening included) this
    # long after it arrived is closed: only authenticated peers may sit idle.
    peer_frame_max_connections: int = Field(default=MAX_FRAME_CONNECTIONS, ge=1, le=65_536)
    peer_frame_auth_timeout_seconds: float = Field(default=FRAME_AUTH_TIMEOUT_SECONDS, gt=0, le=600)
    # A peer connection (either end, framed or gRPC) whose peer acknowledged nothing, data
    # or keepalive probe, for about this long is ended: a peer gone without a word (power,
    # network) holds no slot and swallows no batch for longer (frames.py, "Dead peers";
    # transport.keepalive_options).
    peer_dead_seconds: float = Field(default=FRAME_DEAD_PEER_SECONDS, ge=2, le=3600)
    peer_replay_window_seconds: float = Field(default=60.0, gt=0, le=3600)
    allow_insecure_peers: bool = False
    metrics_listen: str | None = None
    # The CQL native-protocol endpoint (docs/sidecars.md, "The CQL endpoint"): drivers and
    # cqlsh connect here as to Cassandra; BEGIN TRANSACTION runs through Accord, every other
    # frame goes to ``cql_upstream`` (default: the first cassandra.contact_points at
    # cassandra.port). ``cql_plain_writes``: Accord-managed tables ("ks.table") that plain
    # INSERT/UPDATE/DELETE may still write through the endpoint.
    cql_listen: str | None = None
    cql_upstream: str | None = None
    cql_plain_writes: list[str] = Field(default_factory=list)
    cql_max_frame_bytes: int = Field(default=16 * 1024 * 1024, ge=64 * 1024, le=256 * 1024 * 1024)
    cql_prepared_cache: int = Field(default=1024, ge=1, le=1_000_000)
    # Client connections open at once (one more is closed on arrival; each holds one to
    # Cassandra), and how long a client that acknowledges nothing keeps its connection.
    cql_max_connections: int = Field(default=CQL_MAX_CONNECTIONS, ge=1, le=65_536)
    cql_dead_client_seconds: float = Field(default=CQL_DEAD_CLIENT_SECONDS, ge=2, le=3600)
    # What drivers learn of the cluster through the endpoint (docs/sidecars.md, "Drivers
    # find the other sidecars"): every sidecar's CQL endpoint {node_id: host:port} as
    # drivers are to reach it, each standing for the Cassandra node in cassandra_hosts;
    # ``cql_peers_file`` (JSON, the same mapping) overrides it and is re-read when it
    # changes. After a schema change the endpoint holds the RESULT until the Cassandra
    # nodes agree, at most ``cql_schema_agreement_seconds``.
    cql_peers: dict[int, str] = Field(default_factory=dict)
    cql_peers_file: Path | None = None
    cql_schema_agreement_seconds: float = Field(default=60.0, gt=0, le=3600)
    # Port 0 in ``listen``/``metrics_listen`` lets the kernel pick a free port (no race with
    # other processes); the addresses actually bound are then written to ``address_file``
    # (JSON, atomically) as soon as both are bound, before anything else starts.
    address_file: Path | None = None
    # Peers' addresses that are not known when the process starts (they bind port 0 too):
    # the sidecar waits up to ``peers_wait_seconds`` after writing ``address_file`` for this
    # file (a mapping {node_id: host:port}, written atomically by whoever starts the cluster)
    # and uses it instead of the addresses in ``peers``.
    peers_file: Path | None = None
    peers_wait_seconds: float = Field(default=60.0, gt=0)
    # A fixed port found in use at start is retried this long before the sidecar gives up
    # (accord_cassandra/ports.py: a restart may find its old port briefly held).
    bind_retry_seconds: float = Field(default=BIND_RETRY_SECONDS, ge=0, le=3600)
    timing: TimingSettings = Field(default_factory=TimingSettings)
    admission: AdmissionSettings = Field(default_factory=AdmissionSettings)
    # Recoveries and outcome re-sends the progress log runs at once on this node.
    max_progress_coordinators: int = Field(default=32, ge=1, le=10_000)
    # Group commit: client transactions submitted while the sidecar awaits its journal are
    # coordinated as one Accord transaction of at most this many (disjoint) parts and
    # batch_max_keys keys (NodeConfig.batch_max_parts; 1: each alone). docs/sidecars.md.
    batch_max_parts: int = Field(default=DEFAULT_BATCH_MAX_PARTS, ge=1, le=MAX_BATCH_PARTS)
    batch_max_keys: int = Field(default=256, ge=1, le=BATCH_MAX_KEYS_LIMIT)
    drain_seconds: float = Field(default=5.0, ge=0)
    # How far ahead of this node's clock a peer's timestamps may be; beyond it a message is
    # refused, since the HLC would follow it for good.
    max_clock_skew_seconds: float = Field(default=60.0, gt=0, le=3600)
    # Deliberately broken protocol variants (names of accord.testing.Bugs fields), for proving that
    # tests catch them. Never set outside tests: each one breaks strict serializability.
    planted_bugs: list[str] = Field(default_factory=list)

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

    @field_validator(
        "listen",
        "metrics_listen",
        "peer_listen",
        "peer_frames_listen",
        "cql_listen",
        "cql_upstream",
    )
    @classmethod
    def _address(cls, value: str | None) -> str | None:
        if value is not None:
            host = _host_of(value)
            try:
                socket.getaddrinfo(host.strip("[]"), None)
            except (OSError, UnicodeError) as error:
                raise ValueError(f"cannot resolve host {host!r}: {error}") from None
        return value

    @field_validator("peers", "peer_addresses", "peer_frame_addresses", "cql_peers")
    @classmethod
    def _peer_addresses(cls, value: dict[int, str]) -> dict[int, str]:
        for node, address in value.items():
            try:
                _host_of(address)
            except ValueError as error:
                raise ValueError(f"peer {node}: {error}") from None
        return value

    @property
    def cql_upstream_address(self) -> str:
        """Where the CQL endpoint forwards what is not a transaction."""
        if self.cql_upstream is not None:
            return self.cql_upstream
        host = self.cassandra.contact_points[0]
        return f"[{host}]:{self.cassandra.port}" if ":" in host else f"{host}:{self.cassandra.port}"

    @property
    def shared_storage_enabled(self) -> bool:
        return self.store == "cassandra" if self.shared_storage is None else self.shared_storage

    @field_validator("planted_bugs")
    @classmethod
    def _bugs(cls, value: list[str]) -> list[str]:
        known = {f.name for f in dataclasses.fields(Bugs)}
        unknown = sorted(set(value) - known)
        if unknown:
            raise ValueError(f"unknown {unknown}; known: {sorted(known)}")
        return value

    @field_validator("client_token")
    @classmethod
    def _token(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or value != value.strip()):
            raise ValueError("must be a non-empty token without surrounding whitespace")
        if value is not None and not value.isprintable():
            raise ValueError("must be printable (it travels in a gRPC header)")
        return value

    @field_validator("journal_dir")
    @classmethod
    def _journal_dir(cls, value: Path) -> Path:
        path = value.absolute()
        for pseudo in PSEUDO_FILESYSTEMS:
            if path == pseudo or pseudo in path.parents:
                raise ValueError(f"{value} is under {pseudo}, which cannot hold files")
        if path.exists() and not path.is_dir():
            raise ValueError(f"{value} exists and is not a directory")
        existing = path
        while not existing.exists():
            existing = existing.parent
        if not existing.is_dir():
            raise ValueError(f"{value}: {existing} is a file, not a directory")
        if not os.access(existing, os.W_OK | os.X_OK):
            raise ValueError(f"{value}: {existing} is not writable by this user")
        return value

    @field_validator("tables")
    @classmethod
    def _tables(cls, value: dict[str, dict[str, list[list[str]]]]) -> dict[str, Any]:
        for name, spec in value.items():
            for part, columns in spec.items():
                if part not in ("partition_key", "clustering", "columns", "static", "fields"):
                    raise ValueError(
                        f"{name}: unknown part {part!r} "
                        "(partition_key, clustering, columns, static; fields for a user type)"
                    )
                for column in columns:
                    if part == "clustering" and len(column) in (2, 3):
                        continue
                    if len(column) != 2:
                        raise ValueError(f"{name}.{part}: {column!r} must be [name, CQL type]")
        try:
            Catalog.from_mapping(value)
        except SchemaError as error:
            raise ValueError(str(error)) from None
        return value

    @model_validator(mode="after")
    def _peer_security(self) -> SidecarConfig:
        if self.peer_auth == "hmac" and self.peer_keys is None:
            raise ValueError("peer_auth: hmac needs peer_keys (at least peer_keys.current)")
        if self.peer_auth == "mtls":
            if self.peer_tls is None:
                raise ValueError("peer_auth: mtls needs peer_tls (certificate, private_key, ca)")
            if self.peer_listen is None:
                raise ValueError(
                    "peer_auth: mtls needs peer_listen: a peer port of its own, so that "
                    "application clients need no client certificate"
                )
        if self.peer_tls is not None and self.peer_listen is None:
            raise ValueError("peer_tls is the TLS of the peer port: it needs peer_listen")
        if self.peer_listen is not None:
            if self.peer_listen == self.listen and not self.listen.endswith(":0"):
                raise ValueError(f"peer_listen must differ from listen ({self.listen})")
            missing = sorted(set(self.peers) - set(self.peer_addresses))
            # With a peers_file the peer ports arrive in it (every sidecar binds first).
            if missing and self.peers_file is None:
                raise ValueError(f"peer_addresses must give the peer port of nodes {missing}")
        unknown = sorted(set(self.peer_addresses) - set(self.peers))
        if unknown:
            raise ValueError(f"peer_addresses names nodes {unknown} that are not in peers")
        unknown = sorted(set(self.peer_frame_addresses) - set(self.peers))
        if unknown:
            raise ValueError(f"peer_frame_addresses names nodes {unknown} that are not in peers")
        others = len(self.peers) - 1
        if self.peer_frames_listen is not None and self.peer_frame_max_connections < others:
            raise ValueError(
                f"peer_frame_max_connections ({self.peer_frame_max_connections}) must be at "
                f"least {others}: each other peer holds a connection to the frame listener"
            )
        frames = self.peer_frames_listen
        shared = frames is not None and frames in (self.listen, self.peer_listen)
        if shared and not str(frames).endswith(":0"):
            raise ValueError("peer_frames_listen must differ from listen and peer_listen")
        for serving in (self.peer_listen or self.listen, self.peer_frames_listen):
            if serving is None or self.peer_auth != "none" or self.allow_insecure_peers:
                continue
            if is_loopback(serving):
                continue
            raise ValueError(
                f"peer_auth: none while the peer service listens on {serving}, beyond "
                "loopback: anyone who reaches it can forge replica messages. Set peer_auth "
                "to hmac or mtls, or allow_insecure_peers: true if the network is trusted"
            )
        return self

    @model_validator(mode="after")
    def _consistent(self) -> SidecarConfig:
        if self.node_id not in self.peers:
            raise ValueError(f"peers must include this node ({self.node_id})")
        unknown = sorted(n for n, a in self.peers.items() if n != self.node_id and a.endswith(":0"))
        if unknown and self.peers_file is None:
            raise ValueError(
                f"peers {unknown} have port 0 (not yet known): peers_file must supply them"
            )
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
        if self.coordinate_via is not None and (
            self.coordinate_via == self.node_id or self.coordinate_via not in self.peers
        ):
            raise ValueError(
                f"coordinate_via {self.coordinate_via} must be another sidecar in peers"
            )
        unknown_voters = sorted(set(self.electorate_preference) - set(self.peers))
        if unknown_voters:
            raise ValueError(f"electorate_preference names sidecars {unknown_voters} not in peers")
        if len(set(self.electorate_preference)) != len(self.electorate_preference):
            raise ValueError("electorate_preference names a sidecar twice")
        if self.cassandra.consistency.startswith("LOCAL_") and self.shared_storage_enabled:
            # One writer per shard writes at LOCAL_QUORUM in *its* datacenter; a replica in
            # another reading at LOCAL_QUORUM in its own would not meet that write.
            raise ValueError(
                f"cassandra.consistency {self.cassandra.consistency} needs shared_storage: "
                "false (every replica then writes and reads its own datacenter)"
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
        if self.store == "memory" and self.shared_storage:
            raise ValueError(
                "shared_storage: true needs store: cassandra (each memory store is private)"
            )
        if self.cql_listen is not None:
            if self.store != "cassandra" and self.cql_upstream is None:
                raise ValueError(
                    "cql_listen needs a Cassandra node to forward plain CQL to: store: "
                    "cassandra (its first contact point) or cql_upstream"
                )
            for name, other in (
                ("listen", self.listen),
                ("peer_listen", self.peer_listen),
                ("metrics_listen", self.metrics_listen),
            ):
                if other is not None and _same_port(self.cql_listen, other):
                    raise ValueError(f"cql_listen {self.cql_listen} is the {name} address")
        unknown_cql = sorted(set(self.cql_peers) - set(self.peers))
        if unknown_cql:
            raise ValueError(f"cql_peers names nodes {unknown_cql} that are not in peers")
        for name in self.cql_plain_writes:
            keyspace, dot, table = name.partition(".")
            if not dot or not keyspace or not table:
                raise ValueError(f"cql_plain_writes: {name!r} is not keyspace.table")
        if self.metrics_listen is not None:
            for name, other in (("listen", self.listen), ("peer_listen", self.peer_listen)):
                if other is not None and _same_port(self.metrics_listen, other):
                    raise ValueError(f"metrics_listen {self.metrics_listen} is the {name} address")
        return self


def _host_of(address: str) -> str:
    host, sep, port = address.rpartition(":")
    # Port 0 is allowed: a server binds any free port, a peer's arrives in peers_file.
    if not sep or not host or not port.isdigit() or not 0 <= int(port) < 65536 or " " in host:
        raise ValueError(f"{address!r} is not host:port")
    return host


def _same_port(a: str, b: str) -> bool:
    # Two sockets on one port conflict when either is a wildcard or both name one host;
    # port 0 is any free port, a different one for each.
    host_a, _, port_a = a.rpartition(":")
    host_b, _, port_b = b.rpartition(":")
    wildcard = {"0.0.0.0", "[::]", "::", ""}
    return port_a == port_b != "0" and (
        host_a == host_b or host_a in wildcard or host_b in wildcard
    )


def unknown_environment(environ: Mapping[str, str]) -> list[str]:
    """``ACCORD_SIDECAR_*`` variables that set no field (a typo is otherwise ignored)."""
    fields = SidecarConfig.model_fields
    unknown = []
    for name in sorted(environ):
        if not name.startswith(ENV_PREFIX):
            continue
        top = name[len(ENV_PREFIX) :].split("__", 1)[0].lower()
        if top not in fields:
            unknown.append(name)
    return unknown


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
