"""The Java driver for the client tests: java-driver-core 4.x and its runtime jars resolved
once with Maven into the launcher's cache (its marker, completeness check and fetch lock),
and tests/clients/java/AccordCqlProbe.java compiled against them into that cache."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

from accord_cassandra.launcher.jdk import check_java
from accord_cassandra.launcher.maven import (
    MARKER_FILE,
    MAVEN_DEPENDENCY_PLUGIN,
    cache_root,
    file_lock,
    is_fetched,
)
from accord_cassandra.launcher.process import tail_text
from accord_cassandra.launcher.spec import LauncherError

# 4.18 on, the driver (same com.datastax.oss.driver packages) is published under the
# org.apache.cassandra group; the com.datastax.oss line ended at 4.17.
GROUP = "org.apache.cassandra"
ARTIFACT = "java-driver-core"
VERSION = "4.19.2"
SOURCE = Path(__file__).parent / "java" / "AccordCqlProbe.java"

POM_TEMPLATE = """\
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.accord-cassandra</groupId>
  <artifactId>java-driver-deps</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
    <dependency>
      <groupId>{group}</groupId>
      <artifactId>{artifact}</artifactId>
      <version>{version}</version>
    </dependency>
  </dependencies>
</project>
"""


def home() -> Path:
    return cache_root() / f"java-driver-{VERSION}"


def fetch() -> Path:
    """The lib folder of the driver's jars, resolved on the first call."""
    where = home()
    with file_lock(where / ".lock"):
        if not is_fetched(where, VERSION):
            _resolve(where)
    return where / "lib"


def _resolve(where: Path) -> None:
    check_java()
    mvn = shutil.which("mvn")
    if not mvn:
        raise LauncherError("`mvn` not found: install Maven 3 (Debian package `maven`)")
    pom = where / "pom.xml"
    pom.write_text(POM_TEMPLATE.format(group=GROUP, artifact=ARTIFACT, version=VERSION))
    partial = where / "lib.partial"
    shutil.rmtree(partial, ignore_errors=True)
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
            f"Maven could not resolve {GROUP}:{ARTIFACT}:{VERSION} (exit {result.returncode}). "
            f"Last lines:\n{tail_text(result.stdout + result.stderr, 30)}"
        )
    jars = sorted(p.name for p in partial.glob("*.jar"))
    if f"{ARTIFACT}-{VERSION}.jar" not in jars:
        raise LauncherError(f"Maven finished but {ARTIFACT}-{VERSION}.jar is not in {partial}")
    lib = where / "lib"
    shutil.rmtree(lib, ignore_errors=True)
    partial.rename(lib)
    marker = {"version": VERSION, "jars": jars, "seconds": round(time.monotonic() - started, 1)}
    # Written last: its presence means the copy is complete.
    (where / MARKER_FILE).write_text(json.dumps(marker, indent=1) + "\n")


def probe_classpath() -> str:
    """The classpath that runs AccordCqlProbe, compiled again whenever its source changes."""
    lib = fetch()
    source = SOURCE.read_bytes()
    classes = home() / "probe" / hashlib.sha256(source).hexdigest()[:16]
    with file_lock(home() / ".compile.lock"):
        if not (classes / "AccordCqlProbe.class").is_file():
            javac = shutil.which("javac")
            if not javac:
                raise LauncherError("`javac` not found: install a JDK 17")
            partial = classes.with_suffix(".partial")
            shutil.rmtree(partial, ignore_errors=True)
            partial.mkdir(parents=True)
            result = subprocess.run(
                [javac, "-d", str(partial), "-cp", f"{lib}/*", str(SOURCE)],
                capture_output=True,
                text=True,
                check=False,
            )
            if result.returncode != 0:
                raise LauncherError(f"javac failed on {SOURCE}:\n{result.stdout}{result.stderr}")
            partial.rename(classes)
    return f"{classes}:{lib}/*"


def run_probe(args: list[str], timeout: float = 300) -> tuple[int, list[dict[str, object]], str]:
    """Run the probe; its exit status, its JSON lines, and its stderr."""
    java = shutil.which("java") or "java"
    result = subprocess.run(
        [java, "-cp", probe_classpath(), "AccordCqlProbe", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    return result.returncode, lines, result.stderr
