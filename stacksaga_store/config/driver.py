"""The DataStax-format driver file (``stacksaga-cassandra.conf``) mapped onto cassandra-driver.

Theory of operation
-------------------
``stacksaga.cassandra.config`` names a HOCON file in the DataStax Java driver format, as in the
seed. :func:`load_driver_config` finds it, parses it with :mod:`stacksaga_store.config.hocon` and
turns the keys below into a typed :class:`DriverConfig`; :func:`build_cluster` turns that into a
``cassandra.cluster.Cluster``. Keys are paths under ``datastax-java-driver``:

===========================================  =================================================
DataStax key                                  cassandra-driver
===========================================  =================================================
basic.contact-points (``"host:port"`` list)   ``Cluster(contact_points=[(host, port)])``
basic.load-balancing-policy.local-datacenter  ``TokenAwarePolicy(DCAwareRoundRobinPolicy(dc))``
basic.session-keyspace                        the keyspace of every table (fully qualified)
basic.request.timeout                         ``ExecutionProfile(request_timeout=)``
advanced.auth-provider.{class,username,       ``PlainTextAuthProvider(username, password)``
password}
advanced.reconnection-policy.{class,          ``ExponentialReconnectionPolicy(base, max)`` or
base-delay,max-delay}                         ``ConstantReconnectionPolicy(base)``
advanced.connection.connect-timeout           ``Cluster(connect_timeout=)``
advanced.connection.init-query-timeout        ``Cluster(control_connection_timeout=)``
advanced.protocol.version (V3, V4, V5)        ``Cluster(protocol_version=)``
===========================================  =================================================

Defaults are the DataStax driver's (request timeout 2 s, connect timeout 5 s, exponential
reconnection 1 s..60 s) except the contact point, which defaults to ``127.0.0.1:9042``.
Consistency comes from ``stacksaga.cassandra.read/write-consistency-level``, so
``basic.request.consistency`` is ignored. TLS (``advanced.ssl-engine-factory``) is refused
rather than silently dropped. Any other key is reported in :attr:`DriverConfig.ignored` and
logged once: real files carry many tuning keys that have no cassandra-driver equivalent.

``classpath:NAME`` is looked up next to the YAML file, then in the working directory; if
``NAME`` is the default ``stacksaga-cassandra.conf`` and no file exists, the built-in
:data:`DEFAULT_DRIVER_FILE` (a local development node) is used and logged.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from stacksaga_store.config.durations import parse_duration
from stacksaga_store.config.hocon import parse_hocon
from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.errors import ConfigError

__all__ = [
    "DEFAULT_DRIVER_FILE",
    "DriverConfig",
    "build_cluster",
    "load_driver_config",
    "parse_driver_config",
]

logger = logging.getLogger(__name__)

ROOT = "datastax-java-driver"
CONFIG_PROPERTY = "stacksaga.cassandra.config"
DEFAULT_RESOURCE = "stacksaga-cassandra.conf"
DEFAULT_PORT = 9042
CONTACT_POINTS_MAX = 64
TIMEOUT_MAX = timedelta(minutes=10)
_KEYSPACE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
_HOST_PORT = re.compile(
    r"^(?:\[(?P<v6>[0-9A-Fa-f:.]+)\]|(?P<host>[^:\s\[\]]+))(?::(?P<port>\d+))?$"
)

DEFAULT_DRIVER_FILE = """\
# Built-in default: one local development node (see stacksaga_store/config/driver.py).
datastax-java-driver {
  basic {
    contact-points = ["127.0.0.1:9042"]
    load-balancing-policy.local-datacenter = datacenter1
    session-keyspace = stacksaga_event_store
  }
}
"""

_AUTH_CLASSES = {"plaintextauthprovider"}
_RECONNECTION_CLASSES = {"exponentialreconnectionpolicy", "constantreconnectionpolicy"}
_SUPPORTED = {
    "basic.contact-points",
    "basic.load-balancing-policy.local-datacenter",
    "basic.load-balancing-policy.class",
    "basic.session-keyspace",
    "basic.request.timeout",
    "advanced.auth-provider.class",
    "advanced.auth-provider.username",
    "advanced.auth-provider.password",
    "advanced.reconnection-policy.class",
    "advanced.reconnection-policy.base-delay",
    "advanced.reconnection-policy.max-delay",
    "advanced.connection.connect-timeout",
    "advanced.connection.init-query-timeout",
    "advanced.protocol.version",
}


@dataclass(frozen=True, slots=True)
class Credentials:
    username: str
    password: str = field(repr=False)


@dataclass(frozen=True, slots=True)
class DriverConfig:
    """What this package takes from a DataStax driver file."""

    contact_points: tuple[tuple[str, int], ...] = (("127.0.0.1", DEFAULT_PORT),)
    local_datacenter: str | None = None
    session_keyspace: str = "stacksaga_event_store"
    credentials: Credentials | None = None
    reconnection_policy: str = "exponential"
    reconnection_base_delay: timedelta = timedelta(seconds=1)
    reconnection_max_delay: timedelta = timedelta(seconds=60)
    request_timeout: timedelta = timedelta(seconds=2)
    connect_timeout: timedelta = timedelta(seconds=5)
    init_query_timeout: timedelta = timedelta(seconds=5)
    protocol_version: int | None = None
    origin: str = "<defaults>"
    ignored: tuple[str, ...] = ()

    @property
    def keyspace(self) -> str:
        """Unquoted CQL identifiers are case-insensitive; Cassandra stores them lower-case."""
        return self.session_keyspace.lower()


def load_driver_config(settings: StackSagaSettings) -> DriverConfig:
    """Find, read and map the file named by ``stacksaga.cassandra.config``."""
    resource = settings.cassandra.config
    text, origin = _read_resource(resource, settings.source_dir)
    return parse_driver_config(text, origin)


def _read_resource(resource: str, source_dir: Path | None) -> tuple[str, str]:
    if resource.startswith("classpath:"):
        name = resource.removeprefix("classpath:").lstrip("/")
        folders = [folder for folder in (source_dir, Path.cwd()) if folder is not None]
        for folder in folders:
            candidate = folder / name
            if candidate.is_file():
                return _read_file(candidate), str(candidate)
        if name == DEFAULT_RESOURCE:
            logger.info(
                "no %s next to the YAML or in the working directory; using the "
                "built-in local default",
                name,
            )
            return DEFAULT_DRIVER_FILE, f"<built-in {DEFAULT_RESOURCE}>"
        searched = ", ".join(str(folder) for folder in folders)
        raise ConfigError.single(CONFIG_PROPERTY, f"{resource}: not found in {searched}")
    path = Path(resource.removeprefix("file:")).expanduser()
    if source_dir is not None and not path.is_absolute():
        path = source_dir / path
    return _read_file(path), str(path)


def _read_file(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError.single(CONFIG_PROPERTY, f"cannot read {path}: {exc}") from None


def parse_driver_config(text: str, origin: str = "<driver config>") -> DriverConfig:
    """Map DataStax HOCON text onto a :class:`DriverConfig`; errors name the key."""
    document = parse_hocon(text, origin)
    root = document.get(ROOT)
    if not isinstance(root, dict):
        raise ConfigError.single(origin, f"no `{ROOT} {{ ... }}` block")
    flat = dict(_flatten(root))
    if "advanced.ssl-engine-factory.class" in flat or "advanced.ssl-engine-factory" in flat:
        raise ConfigError.single(
            f"{ROOT}.advanced.ssl-engine-factory", "TLS is not supported by this mapping yet"
        )
    reader = _Reader(flat, origin)
    config = DriverConfig(
        contact_points=reader.contact_points(),
        local_datacenter=reader.text("basic.load-balancing-policy.local-datacenter", None),
        session_keyspace=reader.keyspace(),
        credentials=reader.credentials(),
        reconnection_policy=reader.reconnection_class(),
        reconnection_base_delay=reader.duration(
            "advanced.reconnection-policy.base-delay", timedelta(seconds=1)
        ),
        reconnection_max_delay=reader.duration(
            "advanced.reconnection-policy.max-delay", timedelta(seconds=60)
        ),
        request_timeout=reader.duration("basic.request.timeout", timedelta(seconds=2)),
        connect_timeout=reader.duration(
            "advanced.connection.connect-timeout", timedelta(seconds=5)
        ),
        init_query_timeout=reader.duration(
            "advanced.connection.init-query-timeout", timedelta(seconds=5)
        ),
        protocol_version=reader.protocol_version(),
        origin=origin,
        ignored=tuple(sorted(key for key in flat if key not in _SUPPORTED)),
    )
    reader.raise_problems()
    if config.reconnection_base_delay > config.reconnection_max_delay:
        raise ConfigError.single(
            f"{ROOT}.advanced.reconnection-policy.base-delay", "is larger than max-delay"
        )
    if config.ignored:
        logger.info(
            "%s: keys without a cassandra-driver mapping, ignored: %s",
            origin,
            ", ".join(config.ignored),
        )
    return config


def _flatten(node: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    items: list[tuple[str, Any]] = []
    for key, value in node.items():
        path = f"{prefix}{key}"
        if isinstance(value, dict):
            items.extend(_flatten(value, path + "."))
        else:
            items.append((path, value))
    return items


class _Reader:
    """Typed access to the flattened keys; collects every problem before raising."""

    def __init__(self, flat: dict[str, Any], origin: str) -> None:
        self.flat = flat
        self.origin = origin
        self.problems: list[tuple[str, str]] = []

    def problem(self, key: str, message: str) -> None:
        self.problems.append((f"{ROOT}.{key}", f"{message} (in {self.origin})"))

    def raise_problems(self) -> None:
        if self.problems:
            raise ConfigError(self.problems)

    def text(self, key: str, default: str | None) -> str | None:
        value = self.flat.get(key, default)
        if value is None or isinstance(value, str):
            return value
        if isinstance(value, bool | list):
            self.problem(key, f"expected text, got {value!r}")
            return default
        return str(value)

    def duration(self, key: str, default: timedelta) -> timedelta:
        value = self.flat.get(key)
        if value is None:
            return default
        try:
            parsed = parse_duration(value)
        except ValueError as exc:
            self.problem(key, str(exc))
            return default
        if not timedelta(0) < parsed <= TIMEOUT_MAX:
            self.problem(key, f"must be above 0 and at most 10 minutes, got {value!r}")
            return default
        return parsed

    def contact_points(self) -> tuple[tuple[str, int], ...]:
        key = "basic.contact-points"
        value = self.flat.get(key, [f"127.0.0.1:{DEFAULT_PORT}"])
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value or len(value) > CONTACT_POINTS_MAX:
            self.problem(key, f'expected a list of 1..{CONTACT_POINTS_MAX} "host:port" strings')
            return ()
        points: list[tuple[str, int]] = []
        for item in value:
            match = _HOST_PORT.match(str(item).strip())
            port = int(match.group("port") or DEFAULT_PORT) if match else 0
            if match is None or not 0 < port < 65536:
                self.problem(key, f'{item!r} is not "host:port"')
                continue
            points.append((match.group("v6") or match.group("host"), port))
        return tuple(points)

    def keyspace(self) -> str:
        key = "basic.session-keyspace"
        value = self.text(key, "stacksaga_event_store") or ""
        if not _KEYSPACE.match(value):
            self.problem(key, f"{value!r} is not a CQL identifier (letter, then a-z 0-9 _; max 48)")
            return "stacksaga_event_store"
        return value

    def credentials(self) -> Credentials | None:
        prefix = "advanced.auth-provider."
        if not any(key.startswith(prefix) for key in self.flat):
            return None
        kind = (self.text(prefix + "class", "") or "").rsplit(".", 1)[-1]
        if kind.lower() not in _AUTH_CLASSES:
            self.problem(prefix + "class", f"{kind!r} is not supported; use PlainTextAuthProvider")
            return None
        username = self.text(prefix + "username", None)
        password = self.text(prefix + "password", None)
        if not username or password is None:
            self.problem(prefix + "username", "PlainTextAuthProvider needs username and password")
            return None
        return Credentials(username=username, password=password)

    def reconnection_class(self) -> str:
        key = "advanced.reconnection-policy.class"
        kind = (self.text(key, "ExponentialReconnectionPolicy") or "").rsplit(".", 1)[-1]
        if kind.lower() not in _RECONNECTION_CLASSES:
            self.problem(
                key,
                f"{kind!r} is not supported; use ExponentialReconnectionPolicy or "
                "ConstantReconnectionPolicy",
            )
            return "exponential"
        return "exponential" if kind.lower().startswith("exponential") else "constant"

    def protocol_version(self) -> int | None:
        key = "advanced.protocol.version"
        value = self.flat.get(key)
        if value is None:
            return None
        match = re.fullmatch(r"[Vv]?([345])", str(value).strip())
        if match is None:
            self.problem(key, f"{value!r} is not one of V3, V4, V5")
            return None
        return int(match.group(1))


def build_cluster(config: DriverConfig, settings: StackSagaSettings) -> Any:
    """A ``cassandra.cluster.Cluster`` for this config (not yet connected).

    Rows come back as dicts; consistency levels are set per prepared statement
    (:mod:`stacksaga_store.store.cql`), the profile's levels only cover ad-hoc DDL.
    """
    from cassandra import ConsistencyLevel
    from cassandra.auth import PlainTextAuthProvider
    from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
    from cassandra.policies import (
        ConstantReconnectionPolicy,
        DCAwareRoundRobinPolicy,
        ExponentialReconnectionPolicy,
        TokenAwarePolicy,
    )
    from cassandra.query import dict_factory

    profile = ExecutionProfile(
        load_balancing_policy=TokenAwarePolicy(
            DCAwareRoundRobinPolicy(local_dc=config.local_datacenter or "")
        ),
        request_timeout=config.request_timeout.total_seconds(),
        row_factory=dict_factory,
        # The same mapping as the store's CqlSession uses (store/cql.py driver_level); named
        # here so the config layer does not reach up into the store.
        consistency_level=int(
            getattr(ConsistencyLevel, settings.cassandra.write_consistency_level.value)
        ),
    )
    reconnection: Any
    if config.reconnection_policy == "constant":
        reconnection = ConstantReconnectionPolicy(config.reconnection_base_delay.total_seconds())
    else:
        reconnection = ExponentialReconnectionPolicy(
            config.reconnection_base_delay.total_seconds(),
            config.reconnection_max_delay.total_seconds(),
        )
    options: dict[str, Any] = {
        "contact_points": list(config.contact_points),
        "execution_profiles": {EXEC_PROFILE_DEFAULT: profile},
        "reconnection_policy": reconnection,
        "connect_timeout": config.connect_timeout.total_seconds(),
        "control_connection_timeout": config.init_query_timeout.total_seconds(),
        # Protocol v5 is Cassandra 5.0's; naming it skips the driver's downgrade handshake.
        "protocol_version": config.protocol_version or 5,
    }
    if config.credentials is not None:
        options["auth_provider"] = PlainTextAuthProvider(
            username=config.credentials.username, password=config.credentials.password
        )
    from cassandra import UnresolvableContactPoints

    try:
        return Cluster(**options)
    except UnresolvableContactPoints:
        # The driver resolves host names here, before connecting.
        points = ", ".join(f"{host}:{port}" for host, port in config.contact_points)
        raise ConfigError.single(
            f"{ROOT}.basic.contact-points", f"no contact point resolves: {points}"
        ) from None
