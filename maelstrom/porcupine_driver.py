"""Porcupine, an external linearizability checker, built from source and run on histories.

Theory of operation
-------------------
``maelstrom/porcupine/`` is a small Go program (``main.go``, ``go.mod``, ``go.sum``) around
Porcupine (github.com/anishathalye/porcupine v1.3.1, MIT): an implementation of the same
decision problem that none of this project's engineers wrote, so a bug in our checkers and
a bug in Accord must coincide exactly to slip past both.

:func:`ensure_binary` builds it with ``go build`` into ``.cache/porcupine/`` (git-ignored)
the first time it is needed, named by a digest of its sources so an edited driver is
rebuilt and a stale binary is never used. ``$MAELSTROM_PORCUPINE_BIN`` points at a binary
built elsewhere instead.

:func:`document` turns a Maelstrom history into the driver's JSON: lin-kv operations per
key, or whole transactions for the txn workloads; values are canonical JSON texts so the
Go side compares strings. Failed operations are left out (they did not happen); unknown
ones have ``"return": null``. :func:`check` writes it, runs the binary with a time bound
and a heap bound, and maps its exit status: 0 valid, 1 invalid, anything else unknown
(with the reason). Whole-database txn checks are exponential in the number of mutually
concurrent transactions, so long runs full of slow operations end unknown, by design.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from maelstrom.history import Event, Operation, pair

SOURCE_DIR: Final = Path(__file__).resolve().parent / "porcupine"
SOURCES: Final = ("go.mod", "go.sum", "main.go")
CACHE_DIR: Final = Path(__file__).resolve().parent.parent / ".cache" / "porcupine"
BINARY_ENV: Final = "MAELSTROM_PORCUPINE_BIN"
BUILD_TIMEOUT_SECONDS: Final = 300
"""A first build downloads Porcupine through the module proxy; later builds are cached."""
DEFAULT_CHECK_TIMEOUT_SECONDS: Final = 120
DEFAULT_MAX_HEAP_MB: Final = 2048
"""Porcupine's search cache has no bound of its own; past this heap the driver answers
Unknown rather than take the machine's memory."""
MODELS: Final = {
    "lin-kv": "cas-register",
    "txn-list-append": "list-append",
    "txn-rw-register": "rw-register",
}


class PorcupineUnavailable(Exception):
    """Go is missing or the driver did not build; the check's answer is unknown."""


@dataclass(frozen=True, slots=True)
class PorcupineResult:
    """``valid``: True (Ok), False (Illegal) or None (Unknown, with ``reason``)."""

    valid: bool | None
    reason: str
    report: dict[str, Any]


def _source_digest() -> str:
    digest = hashlib.sha256()
    for name in SOURCES:
        digest.update(name.encode())
        digest.update((SOURCE_DIR / name).read_bytes())
    return digest.hexdigest()[:16]


def ensure_binary() -> Path:
    """The driver binary, built now if this version of the sources has not been built."""
    override = os.environ.get(BINARY_ENV)
    if override:
        path = Path(override)
        if not path.is_file():
            raise PorcupineUnavailable(f"${BINARY_ENV}={override} is not a file")
        return path
    target = CACHE_DIR / f"porcupine-check-{_source_digest()}"
    if target.is_file():
        return target
    go = shutil.which("go")
    if go is None:
        raise PorcupineUnavailable("the go toolchain is not on PATH")
    CACHE_DIR.mkdir(parents=True, exist_ok=True)
    # Build to a private name, then rename: concurrent builders never see a partial file.
    partial = CACHE_DIR / f".build-{os.getpid()}-{target.name}"
    try:
        completed = subprocess.run(
            [go, "build", "-o", str(partial), "."],
            cwd=SOURCE_DIR,
            capture_output=True,
            text=True,
            timeout=BUILD_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise PorcupineUnavailable(f"go build took over {BUILD_TIMEOUT_SECONDS} s") from None
    if completed.returncode != 0:
        partial.unlink(missing_ok=True)
        raise PorcupineUnavailable(f"go build failed: {completed.stderr.strip()[-2000:]}")
    os.replace(partial, target)
    for stale in CACHE_DIR.glob("porcupine-check-*"):
        # Builds of older sources are never used again; a running one keeps its inode.
        if stale != target:
            stale.unlink(missing_ok=True)
    return target


def _canonical(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), sort_keys=True)


def _kv_entry(op: Operation) -> dict[str, Any]:
    key, value = op.value
    entry: dict[str, Any] = {"f": op.f, "key": _canonical(key)}
    if op.f == "cas":
        entry["from"], entry["to"] = _canonical(value[0]), _canonical(value[1])
    elif value is not None:
        entry["value"] = _canonical(value)
    return entry


def _txn_entry(op: Operation, workload: str) -> dict[str, Any]:
    mops = []
    for f, key, value in op.value:
        mop: dict[str, Any] = {"f": f, "key": _canonical(key)}
        if f != "r":
            mop["value"] = _canonical(value)
        elif op.status == "ok" and workload == "txn-list-append":
            mop["list"] = [_canonical(v) for v in (value or [])]
        elif op.status == "ok" and value is not None:
            mop["value"] = _canonical(value)
        mops.append(mop)
    return {"f": "txn", "txn": mops}


def document(workload: str, events: list[Event]) -> dict[str, Any]:
    """The driver's input for a history of ``workload``."""
    operations = []
    for op in pair(events):
        if op.status == "fail":
            continue
        entry = _kv_entry(op) if workload == "lin-kv" else _txn_entry(op, workload)
        entry.update(client=op.process, call=op.invoked, **{"return": op.completed})
        operations.append(entry)
    return {"model": MODELS[workload], "operations": operations}


def check(
    workload: str,
    events: list[Event],
    *,
    timeout_seconds: float = DEFAULT_CHECK_TIMEOUT_SECONDS,
    max_heap_mb: int = DEFAULT_MAX_HEAP_MB,
    input_path: Path | None = None,
    html_path: Path | None = None,
) -> PorcupineResult:
    """Run Porcupine on the history; never raises for an unavailable toolchain."""
    try:
        binary = ensure_binary()
    except PorcupineUnavailable as error:
        return PorcupineResult(None, str(error), {})
    with tempfile.TemporaryDirectory(prefix="porcupine-") as scratch:
        path = input_path or Path(scratch) / "history.json"
        path.write_text(json.dumps(document(workload, events)), encoding="utf-8")
        command = [
            str(binary),
            "-timeout",
            f"{int(timeout_seconds * 1000)}ms",
            "-max-heap-mb",
            str(max_heap_mb),
        ]
        if html_path is not None:
            command += ["-html", str(html_path)]
        try:
            completed = subprocess.run(
                [*command, str(path)],
                capture_output=True,
                text=True,
                # Porcupine stops itself at -timeout; this only guards against a hang.
                timeout=timeout_seconds + 30,
                check=False,
            )
        except subprocess.TimeoutExpired:
            return PorcupineResult(None, "porcupine did not stop at its timeout", {})
    try:
        report = json.loads(completed.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report = {"stdout": completed.stdout[-2000:], "stderr": completed.stderr[-2000:]}
    if completed.returncode == 0:
        return PorcupineResult(True, "Ok", report)
    if completed.returncode == 1:
        return PorcupineResult(False, "Illegal", report)
    reason = str(
        report.get("error")
        or report.get("reason")
        or report.get("result")
        or f"exit {completed.returncode}"
    )
    return PorcupineResult(None, reason, report)


__all__ = [
    "BINARY_ENV",
    "DEFAULT_CHECK_TIMEOUT_SECONDS",
    "DEFAULT_MAX_HEAP_MB",
    "MODELS",
    "PorcupineResult",
    "PorcupineUnavailable",
    "check",
    "document",
    "ensure_binary",
]
