"""The broker's jars: org.apache.kafka:kafka_2.13 and its runtime dependencies, resolved once
with Maven into a cache outside the repository by the Cassandra launcher's
:func:`~accord_cassandra.launcher.maven.resolve`."""

from __future__ import annotations

import os
import re
from pathlib import Path

from accord_cassandra.launcher.maven import cache_folder, resolve
from accord_cassandra.launcher.spec import LauncherError
from stacksaga_store.kafka.errors import KafkaLauncherError

# 4.1.x: a KRaft-only line aiokafka 0.14 was tested against here (docs/kafka.md).
DEFAULT_VERSION = "4.1.1"
ENV_VERSION = "STACKSAGA_KAFKA_VERSION"
ENV_CACHE = "STACKSAGA_KAFKA_CACHE"
# Kafka 4 logs through log4j2 but leaves the binding to the distribution; without one the
# broker would log nothing, and a failed start would leave no reason behind.
LOG4J_VERSION = "2.24.3"


def coordinates(version: str) -> list[str]:
    """What the broker runs on: kafka_2.13 first (its version names the cache's marker)."""
    return [
        f"org.apache.kafka:kafka_2.13:{check_version(version)}",
        f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
        f"org.apache.logging.log4j:log4j-core:{LOG4J_VERSION}",
    ]


def check_version(version: str) -> str:
    # The generated server.properties is KRaft-only, which needs the 4.x line.
    if not re.fullmatch(r"4\.\d+\.\d+", version):
        raise KafkaLauncherError(f"Kafka version {version!r} is not 4.x.y")
    return version


def default_version() -> str:
    return check_version(os.environ.get(ENV_VERSION, DEFAULT_VERSION))


def cache_root() -> Path:
    return cache_folder(ENV_CACHE, "stacksaga-kafka")


def version_home(version: str) -> Path:
    return cache_root() / f"kafka-{check_version(version)}"


def fetch(version: str | None = None) -> Path:
    """Resolve kafka_2.13 and its runtime jars into the cache once; returns the lib folder."""
    version = check_version(version or default_version())
    try:
        return resolve(coordinates(version), version_home(version))
    except LauncherError as error:  # the Kafka launcher's errors derive from its own root
        raise KafkaLauncherError(str(error)) from error
