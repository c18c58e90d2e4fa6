#!/usr/bin/env bash
# Regenerates accord_cassandra/v1/*_pb2*.py(i) from proto/accord_cassandra/v1/*.proto.
# tests/sidecar/test_proto_current.py fails when the committed output is stale.
set -euo pipefail
cd "$(dirname "$0")"
python -m grpc_tools.protoc -I . --python_out=.. --grpc_python_out=.. --mypy_out=.. \
  accord_cassandra/v1/peer.proto accord_cassandra/v1/client.proto
