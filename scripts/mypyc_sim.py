"""The mypyc experiment for the simulator (issue 15): build a compiled copy of accord/ in a
scratch directory, check that it simulates byte for byte what the pure source does, and
compare simulated transactions per CPU-second, pure against compiled, back to back.

    python scripts/mypyc_sim.py build /tmp/accord-mypyc     # ~80 s of CPU on this machine
    python scripts/mypyc_sim.py compare /tmp/accord-mypyc   # identity, then the rates

The compiled copy lives outside the worktree and is used only by the child processes that
``compare`` starts with PYTHONPATH pointing at it; accord/ itself stays pure Python.
Not compiled: accord/messages/__init__.py (mypyc drops the ``ClassVar`` annotations the
msgspec Structs rely on, so ``has_side_effects`` became a field and the class was refused),
accord/sim/history.py (a dataclass field typed ``object`` fails at import), and the codec
and the verifiers, which are not on the simulator's per-message path.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any


def _say(*parts: object) -> None:
    sys.stdout.write(" ".join(str(part) for part in parts) + "\n")


ROOT = Path(__file__).resolve().parent.parent

COMPILED = [
    "accord/node.py",
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
]

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
    config = BurnConfig(nodes=5, rf=3, txns=2000, workload="list-append", faults=Faults())
    rates = []
    for seed in range(3):
        r = run_seed(seed, config)
        if not r.passed:
            raise SystemExit(f"seed {seed} failed verification")
        rates.append(r.txns / r.cpu_seconds)
    out["rates"] = rates
print(json.dumps(out))
"""


def build(target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    target.mkdir(parents=True)
    shutil.copytree(
        ROOT / "accord", target / "accord", ignore=shutil.ignore_patterns("__pycache__")
    )
    started = time.process_time()
    wall = time.monotonic()
    mypyc = Path(sys.executable).parent / "mypyc"
    subprocess.run([str(mypyc), *COMPILED], cwd=target, check=True, stdout=subprocess.DEVNULL)
    child_cpu = os.times().children_user + os.times().children_system
    _say(
        f"built {target}: {time.monotonic() - wall:.0f} s wall, "
        f"{child_cpu + time.process_time() - started:.0f} s CPU"
    )


def _child(mode: str, compiled: Path | None) -> dict[str, Any]:
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    if compiled is not None:
        env["PYTHONPATH"] = str(compiled)
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode],
        cwd="/",
        env=env,
        check=True,
        capture_output=True,
        text=True,
    )
    result: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return result


def compare(compiled: Path) -> int:
    pure_id = _child("identity", None)
    fast_id = _child("identity", compiled)
    if not str(fast_id["node_module"]).endswith(".so"):
        _say(f"not the compiled build: {fast_id['node_module']}")
        return 1
    same = pure_id["runs"] == fast_id["runs"]
    _say("identity:", "same digests and verdicts" if same else "DIFFERENT")
    for pure_run, fast_run in zip(pure_id["runs"], fast_id["runs"], strict=True):
        _say("  pure", pure_run, "| compiled", fast_run)
    if not same:
        return 1
    pure = _child("rate", None)["rates"]
    fast = _child("rate", compiled)["rates"]
    pure_median = statistics.median(pure)
    fast_median = statistics.median(fast)
    _say(f"pure     txns/CPU-s {[round(r) for r in pure]} median {pure_median:.0f}")
    _say(f"compiled txns/CPU-s {[round(r) for r in fast]} median {fast_median:.0f}")
    _say(f"speed-up {fast_median / pure_median:.2f}x")
    return 0


def main() -> int:
    if len(sys.argv) != 3 or sys.argv[1] not in ("build", "compare"):
        _say(__doc__)
        return 2
    target = Path(sys.argv[2]).resolve()
    if sys.argv[1] == "build":
        build(target)
        return 0
    return compare(target)


if __name__ == "__main__":
    sys.exit(main())
