"""Which java runs the nodes: Cassandra 5.0 needs JDK 17 (JDK 24 and later cannot run it)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

from accord_cassandra.launcher.spec import LauncherError

log = logging.getLogger(__name__)

SUPPORTED_JAVA = 17
# The Security Manager Cassandra 5.0 installs is gone from JDK 24 on, so startup fails there.
FIRST_UNSUPPORTED_JAVA = 24
JVM_ROOTS = (Path("/usr/lib/jvm"),)


def java_executable() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and (Path(java_home) / "bin" / "java").is_file():
        return str(Path(java_home) / "bin" / "java")
    found = shutil.which("java")
    if not found:
        raise LauncherError(f"`java` not found: install a JDK {SUPPORTED_JAVA} (or set JAVA_HOME)")
    return found


def parse_java_major(version_output: str) -> int:
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if not match:
        raise LauncherError(f"cannot read the Java version from: {version_output.strip()!r}")
    major = int(match[1])
    # Java 8 and older report themselves as "1.x".
    return int(match[2]) if major == 1 and match[2] else major


def check_java_major(major: int) -> None:
    if major >= FIRST_UNSUPPORTED_JAVA:
        raise LauncherError(
            f"Java {major} cannot run Cassandra 5.0 (it needs the Security Manager, removed in "
            f"Java 24); install JDK {SUPPORTED_JAVA} and set JAVA_HOME"
        )
    if major < SUPPORTED_JAVA:
        raise LauncherError(f"Java {major} is too old; install JDK {SUPPORTED_JAVA}")
    if major > SUPPORTED_JAVA:
        log.warning("Java %d is untested here; JDK %d is the supported one", major, SUPPORTED_JAVA)


def java_major(java: str) -> int:
    result = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    return parse_java_major(result.stderr + result.stdout)


def _installed_jdk17() -> str | None:
    # Machines here carry a Temurin 25 beside OpenJDK 17: should JAVA_HOME or PATH pick the
    # wrong one, a JDK 17 installed beside it still runs Cassandra.
    for root in JVM_ROOTS:
        for java in sorted(root.glob("*/bin/java")):
            with contextlib.suppress(LauncherError, OSError):
                if java_major(str(java)) == SUPPORTED_JAVA:
                    return str(java)
    return None


def check_java() -> tuple[str, int]:
    """The java binary to use and its major version, or a LauncherError saying what to install."""
    java = java_executable()
    major = java_major(java)
    if major != SUPPORTED_JAVA:
        fallback = _installed_jdk17()
        if fallback:
            log.info("%s is Java %d; using %s instead", java, major, fallback)
            return fallback, SUPPORTED_JAVA
    check_java_major(major)
    return java, major
