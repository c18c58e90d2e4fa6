"""Configuration: the seed's Properties Reference, same names and defaults, validated.

Theory of operation
-------------------
A :class:`StackSagaSettings` is built from four layers, highest precedence first:

1. keyword overrides passed to :func:`load_settings` (tests, the demo);
2. environment variables ``STACKSAGA_<PATH>`` where ``__`` separates path segments and ``_``
   stands for ``-`` inside a segment, e.g.
   ``STACKSAGA_CASSANDRA__WRITE_PROTECTION__DEFAULT_MODE=STRICT`` or
   ``STACKSAGA_CASSANDRA__WRITE_PROTECTION__DOMAINS__PAYMENT_SAGA__LEASE_DURATION=10s``;
3. the ``stacksaga:`` section of a YAML file (other top-level keys are ignored, so it can live in
   a shared application.yaml);
4. the defaults of the seed's Properties Reference.

YAML keys are kebab-case as in the seed; they are normalised to the snake_case field names
before the layers merge, so a YAML value and an environment value for the same property meet
under one key and the environment wins. Domain names (``domains.<name>``) are canonical in
lower case with ``-``: ``Payment_Saga`` and ``payment-saga`` are the same domain, because an
environment variable cannot spell a dash.

Every fault becomes one :class:`~stacksaga_store.errors.ConfigError` listing each bad property
by its dotted kebab name with the offending value.

Properties beyond the seed are marked *extension* below; they have defaults that leave the seed's
behaviour unchanged.

The DataStax driver file named by ``stacksaga.cassandra.config`` is read by
:mod:`stacksaga_store.config.driver`.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict
from pydantic_settings.exceptions import SettingsError

from stacksaga_store.config.durations import format_duration, parse_duration
from stacksaga_store.config.kafka import KafkaProperties
from stacksaga_store.errors import ConfigError

__all__ = [
    "MINUTES_PER_DAY",
    "AccordProperties",
    "CassandraProperties",
    "CommitModeName",
    "ConsistencyMode",
    "CoordinatorProperties",
    "DomainProperties",
    "InstanceProperties",
    "ProtectionPolicy",
    "RecoveryProperties",
    "ReplicationStrategy",
    "RestoreProperties",
    "RetryProperties",
    "SagaSupportConsistencyLevel",
    "SchemaProperties",
    "StackSagaSettings",
    "TransactionProperties",
    "WriteProtectionProperties",
    "canonical_domain",
    "load_settings",
    "property_name",
]

MINUTES_PER_DAY = 1440
# Cassandra TTLs are whole seconds; a lease longer than a day is a stuck step, not a lease.
LEASE_DURATION_MIN = timedelta(seconds=1)
LEASE_DURATION_MAX = timedelta(days=1)
LIFETIME_MIN = timedelta(seconds=1)
LIFETIME_MAX = timedelta(days=366)
BUCKET_SIZE_MAX = 1_000_000
CONCURRENCY_MAX = 10_000
LOOKBACK_DAYS_MAX = 366
# The restore watchdog must land inside the lookback horizon a Retry-Node can reach.
RESTORE_HORIZON_MINUTES_MAX = 366 * MINUTES_PER_DAY
REPLICATION_FACTOR_MAX = 10
INSTANCE_FIELD_LENGTH_MAX = 128
_DOMAIN_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,127}$")
_PRINTABLE = re.compile(r"^[^\x00-\x1f\x7f]+$")


class ConsistencyMode(StrEnum):
    """Write protection mode (seed Part 3)."""

    STRICT = "STRICT"
    RELAXED_WITH_DEDUP = "RELAXED_WITH_DEDUP"


class SagaSupportConsistencyLevel(StrEnum):
    """The consistency levels StackSaga supports for its reads and writes."""

    LOCAL_QUORUM = "LOCAL_QUORUM"
    QUORUM = "QUORUM"


class ReplicationStrategy(StrEnum):
    """Keyspace replication class used by ``schema apply`` (extension)."""

    SIMPLE = "SimpleStrategy"
    NETWORK_TOPOLOGY = "NetworkTopologyStrategy"


def _upper_enum_text(value: object) -> object:
    # Spring binds enums leniently (case, '-' for '_'); do the same so `strict` works.
    if isinstance(value, str):
        return value.strip().upper().replace("-", "_")
    return value


def _replication_class(value: object) -> object:
    if isinstance(value, str):
        short = value.strip().rsplit(".", 1)[-1].lower()
        for strategy in ReplicationStrategy:
            if short == strategy.value.lower():
                return strategy.value
    return value


def _duration(value: object) -> object:
    if isinstance(value, str | int | float | timedelta):
        return parse_duration(value)
    return value


def _whole_seconds_lease(value: timedelta) -> timedelta:
    if value.total_seconds() != int(value.total_seconds()):
        raise ValueError(
            f"must be a whole number of seconds (it becomes a Cassandra TTL), "
            f"got {format_duration(value)}"
        )
    if not LEASE_DURATION_MIN <= value <= LEASE_DURATION_MAX:
        raise ValueError(
            f"must be between {format_duration(LEASE_DURATION_MIN)} and "
            f"{format_duration(LEASE_DURATION_MAX)}, got {format_duration(value)}"
        )
    return value


Mode = Annotated[ConsistencyMode, BeforeValidator(_upper_enum_text)]
Level = Annotated[SagaSupportConsistencyLevel, BeforeValidator(_upper_enum_text)]
Duration = Annotated[timedelta, BeforeValidator(_duration)]
LeaseDuration = Annotated[timedelta, BeforeValidator(_duration)]


class _Properties(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True)


class DomainProperties(_Properties):
    """``stacksaga.cassandra.write-protection.domains.<name>``: per-saga-domain overrides."""

    mode: Mode | None = None
    lease_duration: LeaseDuration | None = None

    @field_validator("lease_duration")
    @classmethod
    def _lease(cls, value: timedelta | None) -> timedelta | None:
        return None if value is None else _whole_seconds_lease(value)


@dataclass(frozen=True, slots=True)
class ProtectionPolicy:
    """The write protection a domain resolves to: its override, else the defaults."""

    mode: ConsistencyMode
    lease_duration: timedelta

    @property
    def lease_seconds(self) -> int:
        return int(self.lease_duration.total_seconds())


def canonical_domain(name: str) -> str:
    """Domain names compare in lower case with '-' (environment variables cannot spell '-')."""
    return name.strip().lower().replace("_", "-")


class WriteProtectionProperties(_Properties):
    """``stacksaga.cassandra.write-protection``."""

    default_mode: Mode = ConsistencyMode.RELAXED_WITH_DEDUP
    default_lease_duration: LeaseDuration = timedelta(seconds=5)
    domains: dict[str, DomainProperties] = Field(default_factory=dict)

    @field_validator("default_lease_duration")
    @classmethod
    def _lease(cls, value: timedelta) -> timedelta:
        return _whole_seconds_lease(value)

    @field_validator("domains", mode="before")
    @classmethod
    def _canonical_names(cls, value: object) -> object:
        if not isinstance(value, Mapping):
            return value
        canonical: dict[str, object] = {}
        for raw_name, entry in value.items():
            name = canonical_domain(str(raw_name))
            if not _DOMAIN_NAME.match(name):
                raise ValueError(
                    f"domain name {raw_name!r} must be 1-128 characters of a-z, 0-9, '.', '-'"
                )
            if name in canonical:
                raise ValueError(f"domains {raw_name!r} and {name!r} name the same domain")
            canonical[name] = entry
        return canonical

    def policy_for(self, domain: str | None) -> ProtectionPolicy:
        """Resolve a domain's mode and lease: the override where set, else the defaults."""
        override = self.domains.get(canonical_domain(domain)) if domain else None
        mode = (override.mode if override else None) or self.default_mode
        lease = (override.lease_duration if override else None) or self.default_lease_duration
        return ProtectionPolicy(mode=mode, lease_duration=lease)


class TransactionProperties(_Properties):
    """``stacksaga.cassandra.transaction``."""

    lifetime: Duration = timedelta(hours=24)

    @field_validator("lifetime")
    @classmethod
    def _bounded(cls, value: timedelta) -> timedelta:
        if not LIFETIME_MIN <= value <= LIFETIME_MAX:
            raise ValueError(
                f"must be between {format_duration(LIFETIME_MIN)} and "
                f"{format_duration(LIFETIME_MAX)}, got {format_duration(value)}"
            )
        return value


class RetryProperties(_Properties):
    """``stacksaga.cassandra.recovery.retry``."""

    lookback_days: int = Field(default=2, ge=0, le=LOOKBACK_DAYS_MAX)


class RestoreProperties(_Properties):
    """``stacksaga.cassandra.recovery.restore``."""

    delay_windows: int = Field(default=600, ge=1)


class CommitModeName(StrEnum):
    """``recovery.commit-mode`` (extension): see :mod:`stacksaga_store.recovery.commit_modes`."""

    ORDERED = "ordered"
    ACCORD = "accord"


def _lower_text(value: object) -> object:
    return value.strip().lower() if isinstance(value, str) else value


def _positive_duration(value: timedelta, maximum: timedelta) -> timedelta:
    if not timedelta(0) < value <= maximum:
        raise ValueError(
            f"must be above 0 and at most {format_duration(maximum)}, got {format_duration(value)}"
        )
    return value


class AccordProperties(_Properties):
    """``stacksaga.cassandra.recovery.accord`` (extension): the sidecars of the accord mode."""

    sidecars: list[str] = Field(default_factory=list, max_length=64)
    # Default: "<session keyspace>_accord" (stacksaga_store.store.extension_schema).
    keyspace: str | None = Field(default=None, pattern=r"^[A-Za-z][A-Za-z0-9_]{0,47}$")
    token: str | None = None
    timeout: Duration = timedelta(seconds=15)
    # Instance ids a writer spreads its directory slots over (stacksaga_store/recovery/
    # writer.py, "Write lanes"): concurrent starts then touch different keys.
    write_lanes: int = Field(default=16, ge=1, le=256)

    @field_validator("timeout")
    @classmethod
    def _timeout(cls, value: timedelta) -> timedelta:
        return _positive_duration(value, timedelta(minutes=10))


class CoordinatorTlsProperties(_Properties):
    """``stacksaga.cassandra.recovery.coordinator.tls`` (extension). On the coordinator: its
    certificate, and with ``require-client-certificate`` every node must present one from
    ``ca`` naming ``identity`` of its node id. On a Retry-Node: its client certificate, and
    ``ca`` to verify the coordinator's."""

    certificate: Path
    private_key: Path
    ca: Path | None = None
    require_client_certificate: bool = False
    identity: str = "{node_id}"

    @model_validator(mode="after")
    def _consistent(self) -> CoordinatorTlsProperties:
        if self.require_client_certificate and self.ca is None:
            raise ValueError("require-client-certificate needs ca (to verify them with)")
        if "{node_id}" not in self.identity:
            raise ValueError(f"identity {self.identity!r} must contain {{node_id}}")
        return self


class CoordinatorProperties(_Properties):
    """``stacksaga.cassandra.recovery.coordinator`` (extension): the ring coordinator."""

    addresses: list[str] = Field(default_factory=list, max_length=16)
    lease_duration: Duration = timedelta(seconds=30)
    leadership_ttl: Duration = timedelta(seconds=10)
    # Authentication (stacksaga_store.ring.auth): the coordinator holds ``secret``; a
    # Retry-Node holds its ``node-key`` (``stacksaga-store coordinator-key --node-id X``),
    # which lets it speak for itself only, or else the secret.
    secret: SecretStr | None = Field(default=None, min_length=32, max_length=1024)
    node_key: SecretStr | None = None
    tls: CoordinatorTlsProperties | None = None
    # Serve beyond loopback with neither a secret nor client certificates.
    allow_insecure: bool = False

    @field_validator("node_key")
    @classmethod
    def _node_key(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and not re.fullmatch(r"[0-9a-f]{64}", value.get_secret_value()):
            raise ValueError("must be 64 lower-case hex digits (coordinator-key prints it)")
        return value

    @field_validator("lease_duration", "leadership_ttl")
    @classmethod
    def _bounded(cls, value: timedelta) -> timedelta:
        # The leadership row is a Cassandra TTL: whole seconds.
        if value.total_seconds() != int(value.total_seconds()):
            raise ValueError(f"must be whole seconds, got {format_duration(value)}")
        return _positive_duration(value, timedelta(hours=1))


class RecoveryProperties(_Properties):
    """``stacksaga.cassandra.recovery``: shared by Retry and Restore (used by the recovery
    engine; validated here so a bad value fails at start-up, not at the first failure)."""

    window_interval_minutes: int = Field(default=1, ge=1, le=MINUTES_PER_DAY)
    bucket_size: int = Field(default=50_000, ge=1, le=BUCKET_SIZE_MAX)
    concurrency: int = Field(default=100, ge=1, le=CONCURRENCY_MAX)
    retry: RetryProperties = Field(default_factory=RetryProperties)
    restore: RestoreProperties = Field(default_factory=RestoreProperties)
    # Extensions (defaults keep the seed's behaviour).
    commit_mode: Annotated[CommitModeName, BeforeValidator(_lower_text)] = CommitModeName.ORDERED
    read_grace: Duration = timedelta(0)
    accord: AccordProperties = Field(default_factory=AccordProperties)
    coordinator: CoordinatorProperties = Field(default_factory=CoordinatorProperties)

    @field_validator("read_grace")
    @classmethod
    def _grace(cls, value: timedelta) -> timedelta:
        if not timedelta(0) <= value <= timedelta(hours=1):
            raise ValueError(f"must be between 0s and 1h, got {format_duration(value)}")
        return value

    @model_validator(mode="after")
    def _accord_needs_sidecars(self) -> RecoveryProperties:
        if self.commit_mode is CommitModeName.ACCORD and not self.accord.sidecars:
            raise ValueError("commit-mode accord needs recovery.accord.sidecars (host:port list)")
        return self

    @field_validator("window_interval_minutes")
    @classmethod
    def _divides_day(cls, value: int) -> int:
        # Windows are numbered 0..(1440/interval - 1) within a UTC day; a remainder would make
        # the last window of a day shorter and shift every window after midnight.
        if MINUTES_PER_DAY % value != 0:
            raise ValueError(
                f"must evenly divide {MINUTES_PER_DAY} (1440 % {value} = "
                f"{MINUTES_PER_DAY % value}); use 1, 2, 3, 4, 5, 6, 10, 15, 30, 60, ..."
            )
        return value

    @model_validator(mode="after")
    def _restore_horizon(self) -> RecoveryProperties:
        minutes = self.restore.delay_windows * self.window_interval_minutes
        if minutes > RESTORE_HORIZON_MINUTES_MAX:
            raise ValueError(
                f"restore.delay-windows ({self.restore.delay_windows}) x window-interval-minutes "
                f"({self.window_interval_minutes}) = {minutes} minutes exceeds the "
                f"{RESTORE_HORIZON_MINUTES_MAX}-minute (366-day) horizon"
            )
        return self

    @property
    def windows_per_day(self) -> int:
        return MINUTES_PER_DAY // self.window_interval_minutes


class SchemaProperties(_Properties):
    """``stacksaga.cassandra.schema`` (extension): replication used by ``schema apply``.

    The default is the seed's production keyspace (NetworkTopologyStrategy, datacenter1: 3);
    for a one-node development cluster use SimpleStrategy with replication-factor 1, as the
    seed says.
    """

    replication_strategy: Annotated[ReplicationStrategy, BeforeValidator(_replication_class)] = (
        ReplicationStrategy.NETWORK_TOPOLOGY
    )
    replication_factor: int = Field(default=1, ge=1, le=REPLICATION_FACTOR_MAX)
    datacenters: dict[str, int] = Field(default_factory=lambda: {"datacenter1": 3})

    @field_validator("datacenters")
    @classmethod
    def _factors(cls, value: dict[str, int]) -> dict[str, int]:
        for name, factor in value.items():
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
                raise ValueError(f"datacenter name {name!r} is not a plain identifier")
            if not 1 <= factor <= REPLICATION_FACTOR_MAX:
                raise ValueError(f"datacenter {name}: factor {factor} is outside 1..10")
        return value

    @model_validator(mode="after")
    def _datacenters_for_nts(self) -> SchemaProperties:
        if (
            self.replication_strategy is ReplicationStrategy.NETWORK_TOPOLOGY
            and not self.datacenters
        ):
            raise ValueError("NetworkTopologyStrategy needs at least one entry in datacenters")
        return self

    def replication_map(self) -> dict[str, str | int]:
        """The keyspace's ``replication = {...}`` map."""
        if self.replication_strategy is ReplicationStrategy.SIMPLE:
            return {"class": "SimpleStrategy", "replication_factor": self.replication_factor}
        return {"class": "NetworkTopologyStrategy", **dict(sorted(self.datacenters.items()))}


class CassandraProperties(_Properties):
    """``stacksaga.cassandra``."""

    read_consistency_level: Level = SagaSupportConsistencyLevel.LOCAL_QUORUM
    write_consistency_level: Level = SagaSupportConsistencyLevel.LOCAL_QUORUM
    config: str = Field(default="classpath:stacksaga-cassandra.conf", min_length=1)
    write_protection: WriteProtectionProperties = Field(default_factory=WriteProtectionProperties)
    transaction: TransactionProperties = Field(default_factory=TransactionProperties)
    recovery: RecoveryProperties = Field(default_factory=RecoveryProperties)
    schema_: SchemaProperties = Field(default_factory=SchemaProperties, alias="schema")

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, populate_by_name=True
    )


def _instance_text(default: str) -> Any:
    return Field(default=default, min_length=1, max_length=INSTANCE_FIELD_LENGTH_MAX)


class InstanceProperties(_Properties):
    """``stacksaga.instance``: where this process's transactions live.

    region, cluster and service-name are the first three partition-key columns of every table,
    so they scope every read and write (virtual clusters, multi-tenancy).
    """

    region: str = _instance_text("default-region")
    cluster: str = _instance_text("default-cluster")
    service_name: str = _instance_text("default-service")

    @field_validator("region", "cluster", "service_name")
    @classmethod
    def _printable(cls, value: str) -> str:
        # These end up in partition keys and log lines; control characters are typos.
        if value and not _PRINTABLE.match(value):
            raise ValueError("must be printable text (no control characters)")
        return value


class StackSagaSettings(BaseSettings):
    """Everything under ``stacksaga:``. Build it with :func:`load_settings`."""

    model_config = SettingsConfigDict(
        env_prefix="STACKSAGA_",
        env_nested_delimiter="__",
        extra="forbid",
        frozen=True,
        validate_default=True,
    )

    cassandra: CassandraProperties = Field(default_factory=CassandraProperties)
    instance: InstanceProperties = Field(default_factory=InstanceProperties)
    kafka: KafkaProperties = Field(default_factory=KafkaProperties)
    # Folder of the YAML file it came from: `classpath:` resources are looked up there first.
    _source_dir: Path | None = PrivateAttr(default=None)

    @property
    def source_dir(self) -> Path | None:
        return self._source_dir

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # No .env or secrets directory: configuration comes from the YAML file and the
        # environment only, so nothing is picked up from an unexpected file.
        return (init_settings, env_settings, _YamlDataSource(settings_cls))


_YAML_DATA: contextvars.ContextVar[dict[str, Any]] = contextvars.ContextVar("stacksaga_yaml")


class _YamlDataSource(PydanticBaseSettingsSource):
    """The already-normalised ``stacksaga:`` section handed over by load_settings."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return _YAML_DATA.get({})


def load_settings(yaml_path: str | Path | None = None, **overrides: Any) -> StackSagaSettings:
    """Read YAML (optional), apply the environment and overrides, validate everything.

    ``overrides`` are nested dicts keyed like the YAML (kebab or snake case), e.g.
    ``load_settings(cassandra={"write-protection": {"default-mode": "STRICT"}})``.
    """
    section: dict[str, Any] = {}
    source_dir: Path | None = None
    if yaml_path is not None:
        path = Path(yaml_path)
        section = _read_yaml_section(path)
        source_dir = path.resolve().parent
    token = _YAML_DATA.set(_normalise_keys(section))
    try:
        settings = StackSagaSettings(**_normalise_keys(overrides))
    except ValidationError as exc:
        raise ConfigError(list(_problems(exc))) from None
    except SettingsError as exc:
        raise ConfigError.single("stacksaga (environment)", str(exc)) from None
    finally:
        _YAML_DATA.reset(token)
    settings._source_dir = source_dir
    return settings


def _read_yaml_section(path: Path) -> dict[str, Any]:
    # PyYAML ships no type information; the dev extra should add types-PyYAML.
    import yaml

    try:
        document = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError.single(str(path), f"cannot read the YAML file: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError.single(str(path), f"not valid YAML: {exc}") from None
    if document is None:
        return {}
    if not isinstance(document, dict):
        raise ConfigError.single(str(path), "the YAML document must be a mapping")
    section = document.get("stacksaga", {})
    if section is None:
        return {}
    if not isinstance(section, dict):
        raise ConfigError.single("stacksaga", f"must be a mapping, got {type(section).__name__}")
    return section


def _normalise_keys(value: Any) -> Any:
    """kebab-case YAML keys to the snake_case field names; domain names to lower case."""
    if isinstance(value, Mapping):
        return {
            str(key).strip().lower().replace("-", "_"): _normalise_keys(item)
            for key, item in value.items()
        }
    if isinstance(value, list):
        return [_normalise_keys(item) for item in value]
    return value


def property_name(location: tuple[int | str, ...]) -> str:
    """('cassandra', 'write_protection', 'default_mode') -> stacksaga.cassandra.write-...-mode"""
    parts = ["stacksaga"]
    for part in location:
        text = str(part)
        parts.append("schema" if text == "schema_" else text.replace("_", "-"))
    return ".".join(parts)


# Never echoed in an error message: it would put the secret in a log.
_SECRET_PROPERTIES = frozenset({"secret", "node_key"})


def _problems(exc: ValidationError) -> Iterator[tuple[str, str]]:
    for error in exc.errors(include_url=False):
        message = str(error["msg"]).removeprefix("Value error, ")
        if error["type"] == "extra_forbidden":
            message = "unknown property (check the spelling against the Properties Reference)"
        elif (
            "input" in error
            and not isinstance(error["input"], dict)
            and "got " not in message
            and not (error["loc"] and error["loc"][-1] in _SECRET_PROPERTIES)
        ):
            message = f"{message} (got {error['input']!r})"
        yield property_name(tuple(error["loc"])), message
