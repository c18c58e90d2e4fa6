"""One ring coordinator's ``Status`` (leadership, rings, epochs, which node holds which token
range), authenticated as the console's node id when a secret or node key is configured."""

from __future__ import annotations

from typing import Any

import grpc

from stacksaga_store.config.settings import StackSagaSettings
from stacksaga_store.ring.auth import auth_metadata, client_security
from stacksaga_store.v1 import ring_pb2 as pb
from stacksaga_store.v1 import ring_pb2_grpc

__all__ = ["CONSOLE_NODE_ID", "coordinator_status"]

CONSOLE_NODE_ID = "stacksaga-console"
STATUS_TIMEOUT_SECONDS = 2.0


async def coordinator_status(settings: StackSagaSettings, address: str) -> dict[str, Any]:
    props = settings.cassandra.recovery.coordinator
    key, credentials = client_security(props, CONSOLE_NODE_ID)
    channel = (
        grpc.aio.secure_channel(address, credentials)
        if credentials is not None
        else grpc.aio.insecure_channel(address)
    )
    try:
        stub = ring_pb2_grpc.RingCoordinatorStub(channel)
        metadata = auth_metadata(key, CONSOLE_NODE_ID) if key is not None else ()
        reply = await stub.Status(
            pb.StatusRequest(), metadata=metadata, timeout=STATUS_TIMEOUT_SECONDS
        )
    except grpc.aio.AioRpcError as exc:
        return {"address": address, "error": f"{exc.code().name}: {exc.details()}"}
    finally:
        await channel.close()
    rings = []
    for ring in reply.rings:
        leases = []
        for holder, lease in zip(ring.holders, ring.leases, strict=False):
            leases.append(
                {
                    "holder": holder,
                    "range_start": str(lease.range.start),
                    "range_end": str(lease.range.end),
                    "node_zero": lease.ordinal == 0,
                    "epoch": int(lease.epoch),
                }
            )
        rings.append(
            {
                "service": ring.service_name,
                "epoch": int(ring.epoch),
                "phase": ring.phase,
                "members": list(ring.members),
                "leases": leases,
            }
        )
    return {
        "address": address,
        "coordinator_id": reply.coordinator_id,
        "leader": bool(reply.leader),
        "rings": rings,
        "error": None,
    }
