#!/usr/bin/env bash
# Regenerates accord_cassandra/v1/*_pb2*.py(i) from proto/accord_cassandra/v1/*.proto, with
# typed gRPC stubs so that code using the client passes mypy --strict.
# tests/sidecar/test_proto_current.py fails when the committed output is stale.
set -euo pipefail
cd "$(dirname "$0")"
python -m grpc_tools.protoc -I . --python_out=.. --grpc_python_out=.. --mypy_out=.. --mypy_grpc_out=.. \
  accord_cassandra/v1/peer.proto accord_cassandra/v1/client.proto
# The generated stub types trip mypy --strict in code nobody edits; importers keep the types.
for stub in ../accord_cassandra/v1/*_pb2_grpc.pyi; do
  sed -i '1i # mypy: ignore-errors' "$stub"
done
