"""The Java driver for the client tests: java-driver-core 4.x and its runtime jars resolved
once into the launcher's cache by :func:`accord_cassandra.launcher.maven.resolve`, and
tests/clients/java/AccordCqlProbe.java compiled against them into that cache."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path

from accord_cassandra.launcher.maven import cache_root, file_lock, resolve
from accord_cassandra.launcher.spec import LauncherError

# 4.18 on, the driver (same com.datastax.oss.driver packages) is published under the
# org.apache.cassandra group; the com.datastax.oss line ended at 4.17.
COORDINATE = "org.apache.cassandra:java-driver-core:4.19.2"
VERSION = COORDINATE.rsplit(":", 1)[1]
SOURCE = Path(__file__).parent / "java" / "AccordCqlProbe.java"


def home() -> Path:
    return cache_root() / f"java-driver-{VERSION}"


def fetch() -> Path:
    """The lib folder of the driver's jars, resolved on the first call."""
    return resolve([COORDINATE], home())


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
