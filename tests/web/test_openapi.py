"""Property-based API test: schemathesis generates requests from the OpenAPI schema and runs them in-process
against the ASGI app; no response may be a server error or break the documented schema."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings

from gpudefrag.demo import demo_state
from gpudefrag.web.app import create_app
from gpudefrag.web.source import MemorySource

from .conftest import TOKEN

app = create_app(MemorySource(demo_state()), token=TOKEN)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)
# valid and invalid inputs both: a malformed query must answer 4xx, never 5xx
schema.config.generation.update(modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])


def test_schema_documents_every_view() -> None:
    paths = set(app.openapi()["paths"])
    assert {"/api/summary", "/api/map", "/api/pending", "/api/pending/{workload_id}/plan", "/api/history",
            "/api/timeseries", "/api/config", "/api/pending/{workload_id}/apply",
            "/api/workloads/{workload_id}/checkpoint"} <= paths


@schema.parametrize()
@settings(max_examples=12, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_api_never_fails(case: schemathesis.Case) -> None:
    case.call_and_validate(headers={"Authorization": f"Bearer {TOKEN}"})
