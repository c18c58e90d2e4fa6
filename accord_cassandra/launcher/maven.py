"""The server jars: cassandra-all and its runtime dependencies, resolved once with Maven into
a cache outside the repository."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from accord_cassandra.launcher.jdk import check_java
from accord_cassandra.launcher.process import tail_text
from accord_cassandra.launcher.spec import LauncherError, check_version, default_version

log = logging.getLogger(__name__)

ENV_CACHE = "ACCORD_CASSANDRA_CACHE"
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
MARKER_FILE = "fetched.json"

POM_TEMPLATE = """\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.accord-cassandra</groupId>
  <artifactId>cassandra-server-deps</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>org.apache.cassandra</groupId>
      <artifactId>cassandra-all</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


def cache_root() -> Path:
    configured = os.environ.get(ENV_CACHE)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / "accord-cassandra"


def version_home(version: str) -> Path:
    return cache_root() / f"cassandra-{check_version(version)}"


def read_marker(home: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((home / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_fetched(home: Path, version: str) -> bool:
    """True when a previous fetch of this version completed and none of its jars went missing."""
    marker = read_marker(home)
    if not marker or marker.get("version") != version:
        return False
    lib = home / "lib"
    jars = marker.get("jars") or []
    return bool(jars) and all((lib / name).is_file() for name in jars)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    # A test run and `make cassandra-jars` (or the Kafka launcher's fetch) may fetch at once.
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def fetch(version: str | None = None) -> Path:
    """Resolve cassandra-all and its runtime jars into the cache once; returns the lib folder."""
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
        raise LauncherError("`mvn` not found: install Maven 3 (Debian package `maven`)")
    pom = home / "pom.xml"
    pom.write_text(POM_TEMPLATE.format(version=version))
    partial = home / "lib.partial"
    shutil.rmtree(partial, ignore_errors=True)
    log.info("resolving cassandra-all %s and its runtime dependencies with Maven", version)
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
        raise LauncherError(
            f"Maven could not resolve cassandra-all {version} (exit {result.returncode}). "
            f"Last lines:\n{tail_text(result.stdout + result.stderr, 30)}"
        )
    _install_jars(home, partial, version, time.monotonic() - started)


def _install_jars(home: Path, partial: Path, version: str, seconds: float) -> None:
    jars = sorted(p.name for p in partial.glob("*.jar"))
    if f"cassandra-all-{version}.jar" not in jars:
        raise LauncherError(f"Maven finished but cassandra-all-{version}.jar is not in {partial}")
    lib = home / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)
    size = sum((lib / name).stat().st_size for name in jars)
    marker = {"version": version, "jars": jars, "bytes": size, "seconds": round(seconds, 1)}
    # Written last: its presence means the copy is complete.
    (home / MARKER_FILE).write_text(json.dumps(marker, indent=1) + "\n")
    log.info("fetched %d jars, %.1f MB, in %.1f s", len(jars), size / 1e6, seconds)
