"""What to launch: the cluster's shape, the Cassandra version and the launcher's errors."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from ipaddress import IPv4Address
from typing import Any

from accord_cassandra.errors import AccordCassandraError

DEFAULT_VERSION = "5.0.6"
# Measured (docs/cassandra-launch.md): 256 MiB ran the whole test suite repeatedly without
# an OOM; the reference's 512 MiB only adds RSS.
DEFAULT_HEAP_MB = 256

ENV_VERSION = "ACCORD_CASSANDRA_VERSION"
ENV_HEAP = "ACCORD_CASSANDRA_HEAP_MB"
LOOPBACK = "127.0.0.0/8"

# cassandra.yaml keys the launcher itself relies on (addresses and ports it probes, folders it
# deletes, the ring it computes): ClusterSpec's own fields set them, extra_config may not.
LAUNCHER_KEYS = frozenset(
    {
        "cluster_name",
        "listen_address",
        "rpc_address",
        "storage_port",
        "native_transport_port",
        "start_native_transport",
        "num_tokens",
        "initial_token",
        "data_file_directories",
        "commitlog_directory",
        "saved_caches_directory",
        "hints_directory",
        # The probes must log in to a node that asks for a password: ClusterSpec.password_auth.
        "authenticator",
    }
)

# The role Cassandra creates when PasswordAuthenticator is on and no role exists yet.
DEFAULT_SUPERUSER = ("cassandra", "cassandra")


class LauncherError(AccordCassandraError, RuntimeError):
    """Anything the launcher cannot do; the message says what to fix."""


class PortBusyError(LauncherError):
    """A port a node needs is already taken on its loopback address."""


class NodeStartError(LauncherError):
    """A node did not come up; the message carries the tail of its log."""


def ring_tokens(nodes: int) -> list[int]:
    """Balanced single tokens, one per node, as ccm assigns them: i*(2^64//n) - 2^63."""
    if nodes < 1:
        raise ValueError("a cluster needs at least one node")
    return [i * (2**64 // nodes) - 2**63 for i in range(nodes)]


@dataclass(frozen=True)
class ClusterSpec:
    """What to launch; node i (1-based) listens on first_ip + i - 1."""

    nodes: int = 1
    first_ip: str = "127.0.0.1"
    storage_port: int = 7000
    native_port: int = 9042
    heap_mb: int = field(default_factory=lambda: default_heap_mb())
    cluster_name: str = "accord_test"
    version: str = DEFAULT_VERSION
    # What the generated files lack, by node index (a node without an entry gets nothing):
    # cassandra.yaml keys added to or replacing the launcher's (top-level keys, except
    # LAUNCHER_KEYS), and JVM options placed after the launcher's (for -D and -XX options the
    # JVM keeps the last one given). Plain data, so the state file keeps them for attach().
    extra_config: Mapping[int, Mapping[str, Any]] = field(default_factory=dict, hash=False)
    extra_jvm_options: Mapping[int, Sequence[str]] = field(default_factory=dict, hash=False)
    # PasswordAuthenticator on every node; the launcher's own probes and connect() log in as
    # Cassandra's default superuser (credentials), created at start-up.
    password_auth: bool = False

    @property
    def credentials(self) -> tuple[str, str] | None:
        return DEFAULT_SUPERUSER if self.password_auth else None

    def __post_init__(self) -> None:
        if self.nodes < 1:
            raise LauncherError("--nodes must be at least 1")
        last = IPv4Address(self.first_ip) + (self.nodes - 1)
        if not (is_loopback(self.first_ip) and is_loopback(str(last))):
            raise LauncherError(f"node addresses must stay inside {LOOPBACK}")
        check_version(self.version)
        # Copies: a caller changing its dicts later must not change a spec already in use.
        object.__setattr__(self, "extra_config", self._checked_config(self.extra_config))
        object.__setattr__(self, "extra_jvm_options", self._checked_options(self.extra_jvm_options))

    def _checked_config(self, extra: Mapping[int, Mapping[str, Any]]) -> dict[int, dict[str, Any]]:
        checked: dict[int, dict[str, Any]] = {}
        for index, config in extra.items():
            self._check_extra_index("extra_config", index)
            owned = sorted(LAUNCHER_KEYS.intersection(config))
            if owned:
                raise LauncherError(
                    f"extra_config for node {index} sets {', '.join(owned)}: the launcher "
                    f"sets those itself (use ClusterSpec's fields)"
                )
            try:
                # Also what yaml_text writes, so an unwritable value fails here, not at start.
                checked[index] = json.loads(json.dumps(dict(config)))
            except (TypeError, ValueError) as exc:
                raise LauncherError(f"extra_config for node {index}: {exc}") from exc
        return checked

    def _checked_options(self, extra: Mapping[int, Sequence[str]]) -> dict[int, tuple[str, ...]]:
        checked: dict[int, tuple[str, ...]] = {}
        for index, options in extra.items():
            self._check_extra_index("extra_jvm_options", index)
            if isinstance(options, str) or not all(isinstance(o, str) for o in options):
                raise LauncherError(
                    f"extra_jvm_options for node {index} must be a list of strings, got {options!r}"
                )
            checked[index] = tuple(options)
        return checked

    def _check_extra_index(self, name: str, index: object) -> None:
        if not isinstance(index, int) or isinstance(index, bool) or index not in self.indexes:
            raise LauncherError(
                f"{name} names node {index!r}; this {self.nodes}-node cluster has nodes "
                f"1..{self.nodes}"
            )

    def to_state(self) -> dict[str, Any]:
        """JSON-ready form for the state file; from_state() reads it back."""
        return asdict(self)

    @classmethod
    def from_state(cls, state: Mapping[str, Any]) -> ClusterSpec:
        # JSON object keys are strings; the node indexes were ints.
        fields = dict(state)
        for name in ("extra_config", "extra_jvm_options"):
            fields[name] = {int(i): value for i, value in fields.get(name, {}).items()}
        return cls(**fields)

    def ip(self, index: int) -> str:
        self._check_index(index)
        return str(IPv4Address(self.first_ip) + (index - 1))

    @property
    def indexes(self) -> range:
        return range(1, self.nodes + 1)

    @property
    def ips(self) -> list[str]:
        return [self.ip(i) for i in self.indexes]

    def token(self, index: int) -> int:
        self._check_index(index)
        return ring_tokens(self.nodes)[index - 1]

    def _check_index(self, index: int) -> None:
        if index not in self.indexes:
            raise LauncherError(f"no node {index} in a {self.nodes}-node cluster")


def is_loopback(ip: str) -> bool:
    return IPv4Address(ip).is_loopback


def check_version(version: str) -> str:
    # The generated cassandra.yaml uses 5.0 key names and units.
    if not re.fullmatch(r"5\.0\.\d+", version):
        raise LauncherError(f"Cassandra version {version!r} is not 5.0.x")
    return version


def default_version() -> str:
    return check_version(os.environ.get(ENV_VERSION, DEFAULT_VERSION))


def default_heap_mb() -> int:
    return int(os.environ.get(ENV_HEAP, DEFAULT_HEAP_MB))
