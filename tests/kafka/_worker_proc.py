"""A Kafka step worker in its own process, so a test can SIGKILL it at a chosen instant.

``python -m tests.kafka._worker_proc '<json job>'``. Prints ``READY`` once consuming and, with
``hang_after`` set, ``HUNG <txn> <step>`` once that step's delivery returned EXECUTED - then
hangs before publishing the next event or committing the offset, until killed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from stacksaga_store.config.driver import parse_driver_config
from stacksaga_store.config.settings import load_settings
from stacksaga_store.kafka.worker import StepWorker
from stacksaga_store.saga.orchestrator import DeliveryOutcome, StepEvent
from stacksaga_store.saga.runtime import open_runtime
from tests.kafka._sagas import order_saga


async def main(job: dict[str, object]) -> None:
    settings = load_settings(**job["overrides"])  # type: ignore[arg-type]
    driver = parse_driver_config(str(job["driver"]))
    runtime = await open_runtime(settings, driver_config=driver, lease_waits_max=0)
    keyspace = runtime.driver_config.keyspace
    sagas = [
        await order_saga(runtime.cql, keyspace, name=str(name), domain=str(domain))
        for name, domain in job["sagas"]  # type: ignore[attr-defined]
    ]
    orchestrator = runtime.orchestrator(sagas=sagas)
    hang_after = job.get("hang_after")

    async def after_step(event: StepEvent, outcome: DeliveryOutcome) -> None:
        if event.step_name == hang_after and outcome is DeliveryOutcome.EXECUTED:
            print(f"HUNG {event.transaction_id} {event.step_name}", flush=True)
            await asyncio.Event().wait()

    worker = StepWorker(orchestrator, settings.kafka, name=str(job["name"]), after_step=after_step)
    await worker.start()
    print("READY", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await worker.stop()
        await runtime.close()


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    asyncio.run(main(json.loads(sys.argv[1])))
