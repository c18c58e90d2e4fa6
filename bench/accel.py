"""The optional mypyc-compiled build of accord/ for the simulator (issue 15).

accord/ stays pure Python and is what everything imports by default. ``make accel`` compiles
the simulator's hot modules with mypyc into ``<venv>/accord-accel``: a full copy of accord/
with extension modules beside the copied sources, in the venv rather than beside accord/, so
it can never shadow an edited source; a digest of the sources it was built from marks it
stale once accord/ changes. It then checks that the compiled build simulates byte for byte
what the pure source does. ``python -m bench sim`` runs it too, in a child process with
PYTHONPATH pointing at it, and reports both figures.

    python -m bench.accel build     # 80-95 s of CPU on the 2-core machine
    python -m bench.accel check     # same digests and verdicts as the pure source
    python -m bench.accel compare   # check, then txns per CPU-second, pure vs compiled
    python -m bench.accel build-sidecar  # the sidecars' build (below), then `check DIR`

Not compiled: accord/messages/__init__.py (mypyc drops the ``ClassVar`` annotations the
msgspec Structs rely on, so ``has_side_effects`` became a field and the class was refused),
accord/sim/history.py (a dataclass field typed ``object`` fails at import), and the codec,
which the simulator does not use.

Sidecars cannot run on that build: the codec derives each journal record's schema from its
class's annotations, which mypyc erases. ``build-sidecar`` makes a build for them into
``<venv>/accord-accel-sidecar``: the same modules less accord/api.py and
accord/local/command.py (where those records live) and accord/primitives/txn.py (msgspec
Structs whose tags mypyc drops).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(part) for part in parts) + "\n")


ROOT = Path(__file__).resolve().parent.parent
# Beside the venv it was built for: a compiled module works only with that interpreter.
ACCEL_DIR = Path(sys.prefix) / "accord-accel"
STAMP = "SOURCE_DIGEST"

COMPILED = [
    "accord/node",
    "accord/local",
    "accord/coordinate",
    "accord/primitives",
    "accord/topology",
    "accord/messages/validate.py",
    "accord/invariants.py",
    "accord/api.py",
    "accord/sim/cluster.py",
    "accord/sim/oracle.py",
    "accord/sim/journal.py",
    "accord/sim/burn.py",
    "accord/sim/verify.py",
    "accord/sim/verify_graph.py",
    "accord/sim/verify_list_append.py",
]

# The sidecars' build: the same modules less those the codec cannot read once compiled
# (the simulator's stay compiled, so `check` can compare it: a pure SimDataStore cannot
# inherit from a compiled MemoryPartitions). mypyc erases a compiled class's annotations
# to ``type``, and the codec derives each journal record's schema from them
# (``CommandSnapshot``, ``HlcFloor``, ``Durable``: "no codec for CommandSnapshot.txn_id");
# and it drops the ``tag`` of the msgspec Structs of accord/primitives/txn.py, which the
# codec's tagged unions need ("all Struct types must be tagged").
SIDECAR_ACCEL_DIR = Path(sys.prefix) / "accord-accel-sidecar"
SIDECAR_PURE = ("accord/api.py", "accord/local/command.py", "accord/primitives/txn.py")


def sidecar_modules() -> list[str]:
    chosen = []
    for entry in COMPILED:
        if entry in SIDECAR_PURE:
            continue
        if entry.endswith(".py"):
            chosen.append(entry)
            continue
        chosen += [
            str(path.relative_to(ROOT))
            for path in sorted((ROOT / entry).rglob("*.py"))
            if str(path.relative_to(ROOT)) not in SIDECAR_PURE
        ]
    return chosen


# Runs whose digests and verdicts must match: the bench's configuration, every fault, and
# two planted bugs, which must be caught at the same seed by both builds.
CHILD = r"""
import json, sys, time
import accord.node
from accord.local.bugs import Bugs
from accord.sim.burn import BurnConfig, run_seed
from accord.sim.cluster import Faults

mode = sys.argv[1]
out = {"node_module": accord.node.__file__}
if mode == "identity":
    runs = []
    plain = BurnConfig(nodes=5, rf=3, txns=300, workload="list-append", faults=Faults())
    faulty = BurnConfig(txns=200, faults=Faults.parse("all"))
    for seed in range(3):
        r = run_seed(seed, plain)
        runs.append(["plain", seed, r.passed, r.digest])
    for seed in range(2):
        r = run_seed(seed, faulty)
        runs.append(["all-faults", seed, r.passed, r.digest])
    for bug in ("execute_without_waiting", "write_before_durable"):
        config = BurnConfig(txns=200, faults=Faults.parse("all"), bugs=Bugs(**{bug: True}))
        caught = None
        for seed in range(10):
            r = run_seed(seed, config)
            if not r.passed:
                caught = [seed, r.digest]
                break
        runs.append([bug, "caught at", caught])
    out["runs"] = runs
else:
    txns, repetitions = int(sys.argv[2]), int(sys.argv[3])
    config = BurnConfig(nodes=5, rf=3, txns=txns, workload="list-append", faults=Faults())
    rates = []
    for seed in range(repetitions):
        r = run_seed(seed, config)
        if not r.passed:
            raise SystemExit(f"seed {seed} failed verification")
        rates.append(r.txns / r.cpu_seconds)
    out["rates"] = rates
print(json.dumps(out))
"""


def source_digest() -> str:
    """sha256 over accord/'s sources: a build made from other sources is stale."""
    digest = hashlib.sha256()
    for path in sorted((ROOT / "accord").rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def status(target: Path = ACCEL_DIR) -> str:
    """ "ready", "absent" or "stale": whether ``target`` holds a build of today's sources."""
    stamp = target / STAMP
    if not stamp.exists():
        return "absent"
    return "ready" if stamp.read_text().strip() == source_digest() else "stale"


def build(target: Path, modules: list[str] | None = None) -> None:
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    digest = source_digest()
    shutil.copytree(
        ROOT / "accord", target / "accord", ignore=shutil.ignore_patterns("__pycache__")
    )
    started = time.monotonic()
    mypyc = Path(sys.executable).parent / "mypyc"
    compiled = COMPILED if modules is None else modules
    subprocess.run([str(mypyc), *compiled], cwd=target, check=True, stdout=subprocess.DEVNULL)
    cpu = os.times().children_user + os.times().children_system
    # Written last: an interrupted build has no stamp and counts as absent.
    (target / STAMP).write_text(digest + "\n")
    _say(f"built {target}: {time.monotonic() - started:.0f} s wall, {cpu:.0f} s CPU")


def _child(compiled: Path | None, *args: str) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if compiled is not None:
        env["PYTHONPATH"] = str(compiled)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, *args],
        cwd="/",
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def compiled_rates(txns: int, repetitions: int, target: Path = ACCEL_DIR) -> list[float]:
    """The bench's simulator runs on the compiled build, in a child process."""
    result = _child(target, "rate", str(txns), str(repetitions))
    if not str(result["node_module"]).endswith(".so"):
        raise RuntimeError(f"{target} did not load compiled modules: {result['node_module']}")
    rates: list[float] = result["rates"]
    return rates


def check(compiled: Path) -> int:
    """Same trace digests and verdicts from both builds, planted bugs caught at the same seed."""
    pure_id = _child(None, "identity")
    fast_id = _child(compiled, "identity")
    if not str(fast_id["node_module"]).endswith(".so"):
        _say(f"not the compiled build: {fast_id['node_module']}")
        return 1
    same = pure_id["runs"] == fast_id["runs"]
    _say("identity:", "same digests and verdicts" if same else "DIFFERENT")
    for pure_run, fast_run in zip(pure_id["runs"], fast_id["runs"], strict=True):
        _say("  pure", pure_run, "| compiled", fast_run)
    return 0 if same else 1


def compare(compiled: Path) -> int:
    if check(compiled):
        return 1
    pure = _child(None, "rate", "2000", "3")["rates"]
    fast = compiled_rates(2000, 3, compiled)
    pure_median = statistics.median(pure)
    fast_median = statistics.median(fast)
    _say(f"pure     txns/CPU-s {[round(r) for r in pure]} median {pure_median:.0f}")
    _say(f"compiled txns/CPU-s {[round(r) for r in fast]} median {fast_median:.0f}")
    _say(f"speed-up {fast_median / pure_median:.2f}x")
    return 0


def main() -> int:
    commands: dict[str, Callable[[Path], int | None]] = {
        "build": build,
        "build-sidecar": build,
        "check": check,
        "compare": compare,
    }
    if len(sys.argv) not in (2, 3) or sys.argv[1] not in commands:
        _say(__doc__)
        return 2
    default = SIDECAR_ACCEL_DIR if sys.argv[1] == "build-sidecar" else ACCEL_DIR
    target = Path(sys.argv[2]).resolve() if len(sys.argv) == 3 else default
    if sys.argv[1] == "build":
        build(target)
        return 0
    if sys.argv[1] == "build-sidecar":
        build(target, sidecar_modules())
        return 0
    if status(target) != "ready":
        _say(f"{target}: build {status(target)}; run `make accel`")
        return 1
    return commands[sys.argv[1]](target) or 0


if __name__ == "__main__":
    sys.exit(main())
