"""``stacksaga.kafka``: where the step events flow (stacksaga_store.kafka reads these).

YAML keys in kebab case, environment variables as ``STACKSAGA_KAFKA__<FIELD>`` (e.g.
``STACKSAGA_KAFKA__BOOTSTRAP_SERVERS``); a bad value is a ConfigError naming the property.
"""

from __future__ import annotations

import re
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

__all__ = ["KafkaProperties", "SaslMechanism", "SecurityProtocol"]

_SERVER = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")
_TOPIC = re.compile(r"^[A-Za-z0-9._\-]{1,200}$")


class SecurityProtocol(StrEnum):
    PLAINTEXT = "PLAINTEXT"
    SSL = "SSL"
    SASL_PLAINTEXT = "SASL_PLAINTEXT"
    SASL_SSL = "SASL_SSL"


class SaslMechanism(StrEnum):
    PLAIN = "PLAIN"
    SCRAM_SHA_256 = "SCRAM-SHA-256"
    SCRAM_SHA_512 = "SCRAM-SHA-512"


_SASL = (SecurityProtocol.SASL_PLAINTEXT, SecurityProtocol.SASL_SSL)


class KafkaProperties(BaseModel):
    """``stacksaga.kafka``. Topics: ``<topic-prefix>.steps.<domain>`` per saga domain
    (``default`` for sagas without one), ``<topic-prefix>.outcomes`` and
    ``<topic-prefix>.dead-letter``.
    """

    model_config = ConfigDict(
        extra="forbid", frozen=True, validate_default=True, populate_by_name=True
    )

    bootstrap_servers: str = "127.0.73.1:9092"
    topic_prefix: str = "stacksaga"
    group_id: str = Field(default="stacksaga-steps", min_length=1, max_length=200)
    # Topics the workers create when missing; an existing topic keeps its own layout.
    partitions: int = Field(default=3, ge=1, le=1000)
    replication_factor: int = Field(default=1, ge=1, le=5)
    # Step events of one partition handled at once by one worker (events of one saga are
    # ordered by their key anyway: a saga's next event is published only after its step).
    max_in_flight_per_partition: int = Field(default=4, ge=1, le=256)
    # Retryable store errors: attempts, then the dead-letter topic (a busy lease is retried
    # until the longest lease of the worker's domains could have expired).
    retry_attempts: int = Field(default=8, ge=1, le=100)
    retry_backoff_ms: int = Field(default=200, ge=1, le=60_000)
    retry_backoff_max_ms: int = Field(default=5_000, ge=1, le=600_000)
    # On a rebalance, in-flight steps of revoked partitions get this long to finish.
    revoke_grace_ms: int = Field(default=10_000, ge=0, le=600_000)
    session_timeout_ms: int = Field(default=10_000, ge=1_000, le=300_000)
    security_protocol: SecurityProtocol = SecurityProtocol.PLAINTEXT
    sasl_mechanism: SaslMechanism | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None

    @field_validator("bootstrap_servers")
    @classmethod
    def _servers(cls, value: str) -> str:
        servers = [part.strip() for part in value.split(",") if part.strip()]
        if not servers:
            raise ValueError("needs at least one host:port")
        bad = [server for server in servers if not _SERVER.match(server)]
        if bad:
            raise ValueError(f"not host:port: {', '.join(bad)}")
        return ",".join(servers)

    @field_validator("topic_prefix")
    @classmethod
    def _prefix(cls, value: str) -> str:
        if not _TOPIC.match(value):
            raise ValueError("only letters, digits, '.', '_' and '-' (at most 200)")
        return value

    @field_validator("security_protocol", "sasl_mechanism", mode="before")
    @classmethod
    def _upper(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @model_validator(mode="after")
    def _sasl(self) -> KafkaProperties:
        sasl = self.security_protocol in _SASL
        credentials = self.sasl_mechanism and self.sasl_username and self.sasl_password
        if sasl and not credentials:
            raise ValueError(
                f"security-protocol {self.security_protocol.value} needs sasl-mechanism, "
                "sasl-username and sasl-password"
            )
        if self.retry_backoff_max_ms < self.retry_backoff_ms:
            raise ValueError("retry-backoff-max-ms must be >= retry-backoff-ms")
        return self

    def steps_topic(self, domain: str | None) -> str:
        name = re.sub(r"[^A-Za-z0-9._\-]", "-", domain or "default")
        return f"{self.topic_prefix}.steps.{name}"

    @property
    def outcomes_topic(self) -> str:
        return f"{self.topic_prefix}.outcomes"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.topic_prefix}.dead-letter"
