"""The broker's jars: org.apache.kafka:kafka_2.13 and its runtime dependencies, resolved once
with Maven into a cache outside the repository (the Cassandra launcher's recipe)."""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import subprocess
import time
from pathlib import Path

from accord_cassandra.launcher.jdk import check_java
from accord_cassandra.launcher.maven import MARKER_FILE, file_lock, is_fetched
from accord_cassandra.launcher.process import tail_text
from stacksaga_store.kafka.errors import KafkaLauncherError

log = logging.getLogger(__name__)

# 4.1.x: a KRaft-only line aiokafka 0.14 was tested against here (docs/kafka.md).
DEFAULT_VERSION = "4.1.1"
ENV_VERSION = "STACKSAGA_KAFKA_VERSION"
ENV_CACHE = "STACKSAGA_KAFKA_CACHE"
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
# Kafka 4 logs through log4j2 but leaves the binding to the distribution; without one the
# broker would log nothing, and a failed start would leave no reason behind.
LOG4J_VERSION = "2.24.3"

POM_TEMPLATE = """\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.stacksaga</groupId>
  <artifactId>kafka-broker-deps</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>{version}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
      <version>{log4j}</version>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
      <version>{log4j}</version>
    </dependency>
  </dependencies>
</project>
"""


def check_version(version: str) -> str:
    # The generated server.properties is KRaft-only, which needs the 4.x line.
    if not re.fullmatch(r"4\.\d+\.\d+", version):
        raise KafkaLauncherError(f"Kafka version {version!r} is not 4.x.y")
    return version


def default_version() -> str:
    return check_version(os.environ.get(ENV_VERSION, DEFAULT_VERSION))


def cache_root() -> Path:
    configured = os.environ.get(ENV_CACHE)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "stacksaga-kafka"


def version_home(version: str) -> Path:
    return cache_root() / f"kafka-{check_version(version)}"


def fetch(version: str | None = None) -> Path:
    """Resolve kafka_2.13 and its runtime jars into the cache once; returns the lib folder."""
    version = check_version(version or default_version())
    home = version_home(version)
    with file_lock(home / ".lock"):
        if not is_fetched(home, version):
            _resolve_with_maven(home, version)
    return home / "lib"


def _resolve_with_maven(home: Path, version: str) -> None:
    check_java()
    mvn = shutil.which("mvn")
    if not mvn:
        raise KafkaLauncherError("`mvn` not found: install Maven 3 (Debian package `maven`)")
    pom = home / "pom.xml"
    pom.write_text(POM_TEMPLATE.format(version=version, log4j=LOG4J_VERSION))
    partial = home / "lib.partial"
    shutil.rmtree(partial, ignore_errors=True)
    log.info("resolving kafka_2.13 %s and its runtime dependencies with Maven", version)
    started = time.monotonic()
    result = subprocess.run(
        [
            mvn,
            "-B",
            "-q",
            "-f",
            str(pom),
            f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
            f"-DoutputDirectory={partial}",
            "-DincludeScope=runtime",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    if result.returncode != 0:
        raise KafkaLauncherError(
            f"Maven could not resolve kafka_2.13 {version} (exit {result.returncode}). "
            f"Last lines:\n{tail_text(result.stdout + result.stderr, 30)}"
        )
    _install_jars(home, partial, version, time.monotonic() - started)


def _install_jars(home: Path, partial: Path, version: str, seconds: float) -> None:
    jars = sorted(p.name for p in partial.glob("*.jar"))
    if f"kafka_2.13-{version}.jar" not in jars:
        raise KafkaLauncherError(f"Maven finished but kafka_2.13-{version}.jar is not in {partial}")
    lib = home / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)
    size = sum((lib / name).stat().st_size for name in jars)
    marker = {"version": version, "jars": jars, "bytes": size, "seconds": round(seconds, 1)}
    # Written last: its presence means the copy is complete.
    (home / MARKER_FILE).write_text(json.dumps(marker, indent=1) + "\n")
    log.info("fetched %d jars, %.1f MB, in %.1f s", len(jars), size / 1e6, seconds)
