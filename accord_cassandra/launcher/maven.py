"""Jars from Maven: :func:`resolve` fetches artifacts and their runtime dependencies once into
a cache folder outside the repository; :func:`fetch` does so for the server jars
(cassandra-all). The Kafka broker's jars (stacksaga_store.kafka.jars) and the client tests'
Java driver use :func:`resolve` too, so one recipe (pom, lock, marker) serves all three."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any
from xml.sax.saxutils import escape

from accord_cassandra.launcher.jdk import check_java
from accord_cassandra.launcher.process import tail_text
from accord_cassandra.launcher.spec import LauncherError, check_version, default_version

log = logging.getLogger(__name__)

ENV_CACHE = "ACCORD_CASSANDRA_CACHE"
MAVEN_DEPENDENCY_PLUGIN = "org.apache.maven.plugins:maven-dependency-plugin:3.8.1"
MARKER_FILE = "fetched.json"
CASSANDRA_ARTIFACT = "org.apache.cassandra:cassandra-all"

# group:artifact:version, each part Maven's own characters; no packaging or classifier, so
# the jar Maven copies is artifact-version.jar.
_COORDINATE = re.compile(r"([A-Za-z0-9_.-]+):([A-Za-z0-9_.-]+):([A-Za-z0-9_.+-]+)\Z")

POM_TEMPLATE = """\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.accord-cassandra</groupId>
  <artifactId>resolved-deps</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{dependencies}
  </dependencies>
</project>
"""

DEPENDENCY_TEMPLATE = """\
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>"""


def cache_folder(env: str, name: str) -> Path:
    """The folder the environment variable ``env`` names, else ``~/.cache/<name>``."""
    configured = os.environ.get(env)
    if configured:
        return Path(configured).expanduser()
    return Path.home() / ".cache" / name


def cache_root() -> Path:
    return cache_folder(ENV_CACHE, "accord-cassandra")


def version_home(version: str) -> Path:
    return cache_root() / f"cassandra-{check_version(version)}"


def read_marker(home: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((home / MARKER_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def is_fetched(home: Path, version: str, coordinates: Sequence[str] | None = None) -> bool:
    """True when a previous fetch of this version completed and none of its jars went missing.
    A marker that records its coordinates is trusted only for the same ones; markers written
    before they were recorded name the version alone."""
    marker = read_marker(home)
    if not marker or marker.get("version") != version:
        return False
    recorded = marker.get("coordinates")
    if coordinates is not None and recorded is not None and recorded != list(coordinates):
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


def parse_coordinates(coordinates: Sequence[str]) -> list[tuple[str, str, str]]:
    """``group:artifact:version`` strings as triples, or :class:`LauncherError` naming the
    first one that is not of that form."""
    if isinstance(coordinates, str) or not coordinates:
        raise LauncherError(
            f"Maven coordinates are a non-empty list of group:artifact:version, not {coordinates!r}"
        )
    out = []
    for coordinate in coordinates:
        found = _COORDINATE.match(coordinate) if isinstance(coordinate, str) else None
        if found is None:
            raise LauncherError(
                f"Maven coordinate {coordinate!r} is not group:artifact:version "
                "(letters, digits and ._- only)"
            )
        out.append((found[1], found[2], found[3]))
    return out


def pom_text(coordinates: Sequence[str]) -> str:
    """The pom whose runtime dependencies are ``coordinates``."""
    dependencies = "\n".join(
        DEPENDENCY_TEMPLATE.format(group=escape(g), artifact=escape(a), version=escape(v))
        for g, a, v in parse_coordinates(coordinates)
    )
    return POM_TEMPLATE.format(dependencies=dependencies)


def maven_command(mvn: str, pom: Path, output: Path) -> list[str]:
    """The Maven run that copies the pom's runtime dependencies into ``output``."""
    return [
        mvn,
        "-B",
        "-q",
        "-f",
        str(pom),
        f"{MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies",
        f"-DoutputDirectory={output}",
        "-DincludeScope=runtime",
    ]


def resolve(coordinates: Sequence[str], home: Path) -> Path:
    """Resolve ``coordinates`` (``group:artifact:version``) and their runtime dependencies
    with Maven into ``home/lib`` once; returns that folder.

    ``home`` also holds the pom, a lock (concurrent callers wait; one resolves) and the marker
    ``fetched.json``, written last: while it names the first coordinate's version, these
    coordinates and jars that are all still there, a call runs neither Java nor Maven. A failed
    run leaves the previous state untouched and raises :class:`LauncherError` with Maven's last
    lines; so does a run after which a requested artifact's jar is missing."""
    triples = parse_coordinates(coordinates)
    version = triples[0][2]
    with file_lock(home / ".lock"):
        if not is_fetched(home, version, coordinates):
            _resolve_with_maven(home, list(coordinates), triples)
    return home / "lib"


def fetch(version: str | None = None) -> Path:
    """Resolve cassandra-all and its runtime jars into the cache once; returns the lib folder."""
    version = check_version(version or default_version())
    return resolve([f"{CASSANDRA_ARTIFACT}:{version}"], version_home(version))


def _resolve_with_maven(
    home: Path, coordinates: list[str], triples: list[tuple[str, str, str]]
) -> None:
    check_java()
    mvn = shutil.which("mvn")
    if not mvn:
        raise LauncherError("`mvn` not found: install Maven 3 (Debian package `maven`)")
    pom = home / "pom.xml"
    pom.write_text(pom_text(coordinates))
    partial = home / "lib.partial"
    shutil.rmtree(partial, ignore_errors=True)
    named = ", ".join(coordinates)
    log.info("resolving %s and the runtime dependencies with Maven", named)
    started = time.monotonic()
    result = subprocess.run(
        maven_command(mvn, pom, partial), capture_output=True, text=True, check=False
    )
    if result.returncode != 0:
        raise LauncherError(
            f"Maven could not resolve {named} (exit {result.returncode}). "
            f"Last lines:\n{tail_text(result.stdout + result.stderr, 30)}"
        )
    jars = sorted(p.name for p in partial.glob("*.jar"))
    missing = [f"{a}-{v}.jar" for _, a, v in triples if f"{a}-{v}.jar" not in jars]
    if missing:
        raise LauncherError(f"Maven finished but {partial} lacks {', '.join(missing)}")
    lib = home / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)
    seconds = time.monotonic() - started
    size = sum((lib / name).stat().st_size for name in jars)
    marker = {
        "version": triples[0][2],
        "coordinates": coordinates,
        "jars": jars,
        "bytes": size,
        "seconds": round(seconds, 1),
    }
    # Written last: its presence means the copy is complete.
    (home / MARKER_FILE).write_text(json.dumps(marker, indent=1) + "\n")
    log.info("fetched %d jars, %.1f MB, in %.1f s", len(jars), size / 1e6, seconds)
