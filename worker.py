"""The fleetq worker: runs every workflow and activity on the ``fleetq`` task queue.

``python worker.py`` (or ``fleetq worker``) connects with Temporal's standard client
configuration (TEMPORAL_ADDRESS, TEMPORAL_NAMESPACE, TLS / API-key variables or a
profile), reads member clusters from ``FLEETQ_CONFIG``, and shuts down gracefully on
SIGTERM/SIGINT. Any number of workers on any number of machines can share the queue.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
import logging
import os
import signal
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.runtime import OpenTelemetryConfig, PrometheusConfig, Runtime, TelemetryConfig
from temporalio.worker import Worker

from activities.fleet import Fleet
from activities.scheduling import SchedulingActivities
from fleetq.naming import TASK_QUEUE
from fleetq.temporal_client import connect, has_search_attributes
from workflows import ALL_WORKFLOWS

log = logging.getLogger("fleetq.worker")


def metrics_runtime(prometheus_port: int | None = None) -> Runtime | None:
    """Temporal's worker metrics and fleetq's scheduler metrics (jobs by state, queue
    lengths, admission latency, placement failures, failovers): Prometheus on
    127.0.0.1:PORT/metrics, or OpenTelemetry when OTEL_EXPORTER_OTLP_METRICS_ENDPOINT /
    OTEL_EXPORTER_OTLP_ENDPOINT is set; none by default."""
    if prometheus_port:
        return Runtime(
            telemetry=TelemetryConfig(
                metrics=PrometheusConfig(bind_address=f"127.0.0.1:{prometheus_port}")
            )
        )
    url = os.environ.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or os.environ.get(
        "OTEL_EXPORTER_OTLP_ENDPOINT"
    )
    if url and os.environ.get("OTEL_METRICS_EXPORTER", "otlp") != "none":
        return Runtime(telemetry=TelemetryConfig(metrics=OpenTelemetryConfig(url=url)))
    return None


def build_worker(
    client: Client,
    activities: SchedulingActivities,
    *,
    task_queue: str = TASK_QUEUE,
    max_concurrent_activities: int = 200,
    executor: concurrent.futures.Executor | None = None,
    **kwargs: Any,
) -> Worker:
    executor = executor or concurrent.futures.ThreadPoolExecutor(
        max_workers=max_concurrent_activities, thread_name_prefix="fleetq-activity"
    )
    return Worker(
        client,
        task_queue=task_queue,
        workflows=ALL_WORKFLOWS,
        activities=activities.all(),
        activity_executor=executor,
        max_concurrent_activities=max_concurrent_activities,
        graceful_shutdown_timeout=timedelta(seconds=10),
        **kwargs,
    )


async def run_worker(
    *,
    address: str | None = None,
    namespace: str | None = None,
    task_queue: str = TASK_QUEUE,
    fleet_config: str | None = None,
    prometheus_port: int | None = None,
    ready: asyncio.Event | None = None,
) -> None:
    kwargs: dict[str, Any] = {}
    runtime = metrics_runtime(prometheus_port)
    if runtime is not None:
        kwargs["runtime"] = runtime
    client = await connect(address, namespace, **kwargs)
    path = fleet_config or os.environ.get("FLEETQ_CONFIG")
    fleet_source = (lambda: Fleet.from_config(path)) if path else Fleet.from_env
    activities = SchedulingActivities(
        client, fleet_source, search_attributes=await has_search_attributes(client)
    )
    worker = build_worker(client, activities, task_queue=task_queue)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
            loop.add_signal_handler(sig, stop.set)
    log.info(
        "fleetq worker polling %s on %s (namespace %s)",
        task_queue,
        client.service_client.config.target_host,
        client.namespace,
    )
    async with worker:
        if ready is not None:
            ready.set()
        await stop.wait()
        log.info("shutting down: finishing in-flight tasks")
    if activities._fleet is not None:
        activities._fleet.close()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--address", help="Temporal frontend (default: TEMPORAL_ADDRESS)")
    parser.add_argument("--namespace", help="Temporal namespace (default: TEMPORAL_NAMESPACE)")
    parser.add_argument("--task-queue", default=TASK_QUEUE)
    parser.add_argument("--fleet-config", help="fleet config file (default: FLEETQ_CONFIG)")
    parser.add_argument(
        "--prometheus-port",
        type=int,
        default=None,
        help="serve Temporal worker metrics on 127.0.0.1:PORT/metrics",
    )
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=os.environ.get("FLEETQ_LOG_LEVEL", "INFO"),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    asyncio.run(
        run_worker(
            address=args.address,
            namespace=args.namespace,
            task_queue=args.task_queue,
            fleet_config=args.fleet_config,
            prometheus_port=args.prometheus_port,
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
