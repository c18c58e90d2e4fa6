#!/usr/bin/env bash
# Regenerates stacksaga_store/v1/*_pb2*.py(i) from proto/stacksaga_store/v1/*.proto.
# tests/recovery/test_ring.py fails when the committed output is stale.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m grpc_tools.protoc -I . --python_out=.. --grpc_python_out=.. --mypy_out=.. --mypy_grpc_out=.. \
  stacksaga_store/v1/ring.proto
# The generated gRPC stub trips mypy --strict (unused ignores, overlapping overloads) in code
# nobody edits; its types are still used by importers.
sed -i '1i # mypy: ignore-errors' ../stacksaga_store/v1/ring_pb2_grpc.pyi
