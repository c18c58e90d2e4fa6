"""The committed generated code is what proto/generate.sh makes from the .proto files today."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
GENERATED = REPO / "accord_cassandra" / "v1"


def test_generated_code_is_current(tmp_path: Path) -> None:
    # generate.sh writes next to its own folder's parent, so run a copy of it in a scratch
    # tree; the venv's bin comes first on PATH for grpc_tools and protoc-gen-mypy.
    shutil.copytree(REPO / "proto", tmp_path / "proto")
    environment = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }
    completed = subprocess.run(
        ["bash", str(tmp_path / "proto" / "generate.sh")],
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert completed.returncode == 0, completed.stderr
    fresh = tmp_path / "accord_cassandra" / "v1"
    made = sorted(p.name for p in fresh.iterdir())
    committed = sorted(p.name for p in GENERATED.iterdir() if p.name != "__init__.py")
    committed = [n for n in committed if not n.startswith("__pycache__")]
    assert made == committed, "generate.sh makes a different set of files than is committed"
    stale = [n for n in made if (fresh / n).read_bytes() != (GENERATED / n).read_bytes()]
    assert not stale, f"stale generated files {stale}: run proto/generate.sh and commit"
