"""The dashboard's FastAPI app: static page(s), a JSON API behind every view, `/metrics`, and guarded actions.

`create_app` takes everything from outside (the cluster source, the token, the journal path) so tests run it
in-process exactly as `gpudefrag serve` does.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import msgspec
from fastapi import Depends, FastAPI, HTTPException, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse
from fastapi.staticfiles import StaticFiles
from starlette.middleware.trustedhost import TrustedHostMiddleware

from ..core.diagnose import diagnose_all
from ..core.model import ClusterState, Workload, WorkloadState
from ..core.planner import PlanOptions
from . import metrics as metrics_mod
from . import planning, schemas
from .auth import TokenGuard
from .source import ClusterSource, MemorySource, move_records, read_journal
from .views import MapQuery, Only, SortKey, gpu_map, pending_view, summary, workload_info

STATIC = Path(__file__).parent / "static"
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")

WorkloadId = Annotated[str, PathParam(min_length=1, max_length=253)]


def _errors(**codes: str) -> dict[int | str, dict[str, Any]]:
    """Document the error answers an endpoint gives (all carry {"detail": "..."})."""
    return {int(k.removeprefix("e")): {"model": schemas.Error, "description": v} for k, v in codes.items()}


NOT_FOUND = "no such workload"


def create_app(
    source: ClusterSource,
    *,
    token: str | None = None,
    journal: Path | None = None,
    allowed_hosts: list[str] | None = None,
    plan_options: PlanOptions | None = None,
) -> FastAPI:
    """Build the app. `token` enables the actions; `allowed_hosts` (Host header check) defends a loopback-bound
    server against DNS rebinding."""
    app = FastAPI(
        title="gpudefrag dashboard",
        version="1",
        description="GPU map, pending jobs with their diagnosis, plan preview, migration history, metrics.",
        docs_url=None,  # Swagger UI and ReDoc load their code from a CDN, which the CSP (rightly) forbids:
        redoc_url=None,  # /api-docs renders /openapi.json offline instead
    )
    guard = TokenGuard(token)
    if allowed_hosts:
        app.add_middleware(TrustedHostMiddleware, allowed_hosts=allowed_hosts)

    @app.middleware("http")
    async def security_headers(request: Request, call_next: Any) -> Response:
        response: Response = await call_next(request)
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        response.headers.setdefault("Referrer-Policy", "no-referrer")
        response.headers.setdefault("Content-Security-Policy", CSP)  # every answer, errors included
        response.headers.setdefault("X-Frame-Options", "DENY")
        return response

    def journal_rows(limit: int = 10_000) -> list[dict[str, Any]]:
        return read_journal(journal, limit)[0]

    registry = metrics_mod.metrics_registry(source, journal_rows)
    engine = getattr(source, "engine", None)
    # an engine may say it cannot signal (Kubernetes: no pods/exec) though it has the protocol's method
    can_signal = callable(getattr(engine, "signal", None)) and getattr(engine, "can_signal", True)

    def pending_workload(state: ClusterState, workload_id: str) -> Workload:
        if workload_id not in state.workload_index:
            raise HTTPException(404, f"no workload {workload_id!r}")
        w = state.workload(workload_id)
        if w.state is not WorkloadState.PENDING:
            raise HTTPException(409, f"workload {workload_id!r} is {w.state.value}, not pending")
        return w

    def summary_out(state: ClusterState) -> dict[str, Any]:
        return {**summary(state), "version": source.version}

    # ------------------------------------------------------------------------------------------------ pages
    app.mount("/static", StaticFiles(directory=STATIC), name="static")

    @app.get("/", include_in_schema=False)
    def index() -> FileResponse:
        return FileResponse(STATIC / "index.html", media_type="text/html")

    @app.get("/api-docs", include_in_schema=False)
    def api_docs() -> FileResponse:
        """The API reference from /openapi.json, with no CDN (FastAPI's /docs and /redoc need one: they are off)."""
        return FileResponse(STATIC / "api.html", media_type="text/html")

    @app.get("/healthz", include_in_schema=False)
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    # ------------------------------------------------------------------------------------------------ API
    @app.get("/api/config", response_model=schemas.Config, tags=["dashboard"])
    def config() -> dict[str, Any]:
        """What this server offers: engine, whether actions are enabled, whether the planner is present."""
        source.state()
        return {
            "engine": source.engine_name,
            "mutable": source.mutable,
            "actions_enabled": guard.enabled,
            "can_apply": guard.enabled and source.mutable,
            "can_checkpoint": guard.enabled and (source.mutable or can_signal),
            "version": source.version,
            "journal": str(journal) if journal else None,
        }

    @app.get("/api/summary", response_model=schemas.Summary, tags=["dashboard"])
    def get_summary() -> dict[str, Any]:
        """Headline numbers for the highlighted request (the largest pending one)."""
        return summary_out(source.state())

    @app.get("/api/map", response_model=schemas.GpuMap, tags=["dashboard"])
    def get_map(
        gpus: Annotated[int | None, Query(ge=1, le=1024, description="request shape to highlight")] = None,
        model: Annotated[str | None, Query(max_length=253)] = None,
        q: Annotated[str | None, Query(max_length=253, description="node name or workload substring")] = None,
        only: Only = "all",
        sort: SortKey = "name",
        offset: Annotated[int, Query(ge=0)] = 0,
        limit: Annotated[int, Query(ge=1, le=20_000)] = 500,
    ) -> dict[str, Any]:
        """The GPU map: one row per node, one cell per GPU, grouped by GPU model, filtered, sorted and paged."""
        return gpu_map(source.state(), MapQuery(gpus, model, q, only, sort, offset, limit))

    @app.get("/api/pending", response_model=list[schemas.PendingJob], tags=["dashboard"])
    def get_pending() -> list[dict[str, Any]]:
        """Every pending GPU job with its diagnosis (ordinary causes first, fragmentation last)."""
        return pending_view(source.state())

    @app.get("/api/workloads/{workload_id}", response_model=schemas.WorkloadInfo, tags=["dashboard"],
             responses=_errors(e404=NOT_FOUND))
    def get_workload(workload_id: WorkloadId) -> dict[str, Any]:
        state = source.state()
        if workload_id not in state.workload_index:
            raise HTTPException(404, f"no workload {workload_id!r}")
        return workload_info(state.workload(workload_id))

    @app.get("/api/pending/{workload_id:path}/plan", response_model=schemas.PlanPreview, tags=["dashboard"],
             responses=_errors(e404=NOT_FOUND, e409="the workload is not pending"))
    def get_plan(workload_id: WorkloadId) -> dict[str, Any]:
        """The plan preview for one pending job: its diagnosis, the moves with their costs, the node that becomes
        whole, and the map of the touched nodes before and after."""
        with source.lock:
            state = source.state()
            version = source.version
        pending_workload(state, workload_id)
        job = pending_view(state, diagnose_all(state, [workload_id]))[0]
        try:
            decision = source.plan_for(version, workload_id,
                                       lambda: planning.make_decision(state, workload_id, plan_options))
        except Exception as e:  # a planner bug must not take the page down: show it with the diagnosis
            return {"workload": job, "available": False, "message": f"the planner failed: {e}", "plan": None,
                    "before": [], "after": [], "after_summary": None, "version": version}
        return {"workload": job, **planning.preview(state, workload_id, decision), "version": version}

    @app.get("/api/history", response_model=schemas.History, tags=["dashboard"])
    def get_history(limit: Annotated[int, Query(ge=1, le=1000)] = 100) -> dict[str, Any]:
        """Migration history: the journal's moves (newest first) and those applied from this dashboard."""
        rows, note = read_journal(journal, limit)
        moves = [_history_row(r, "journal") for r in rows]
        own = [_history_row(m.as_dict(), "dashboard") for m in reversed(source.moves)]
        return {"moves": (own + moves)[:limit], "note": note}

    @app.get("/api/timeseries", response_model=list[schemas.SampleOut], tags=["dashboard"])
    def get_timeseries() -> list[dict[str, Any]]:
        """Free, stranded GPUs and fragmentation at each observation of the cluster (in memory, newest last)."""
        source.state()
        return [s.as_dict() for s in list(source.samples)]

    # ------------------------------------------------------------------------------------------------ actions
    @app.post("/api/pending/{workload_id:path}/apply", response_model=schemas.ApplyResult, tags=["actions"],
              dependencies=[Depends(guard)],
              responses=_errors(e401="no valid bearer token", e403="actions are off", e404=NOT_FOUND,
                                e409="stale version, not pending, no feasible plan, or a read-only engine"))
    def apply_plan(
        workload_id: WorkloadId,
        version: Annotated[int | None, Query(description="the version the preview was made from")] = None,
    ) -> dict[str, Any]:
        """Apply the plan for a pending job to the in-memory cluster (sim engine / snapshot)."""
        if not isinstance(source, MemorySource):
            raise HTTPException(409, f"the {source.engine_name} engine is read-only here: the controller applies "
                                     "plans (gpudefrag controller)")
        with source.lock:
            state = source.state()
            if version is not None and version != source.version:
                raise HTTPException(409, f"the cluster changed since the preview (version {version}, "
                                         f"now {source.version}): preview again")
            pending_workload(state, workload_id)
            try:
                decision = source.plan_for(source.version, workload_id,
                                           lambda: planning.make_decision(state, workload_id, plan_options))
            except Exception as e:
                raise HTTPException(409, f"the planner failed: {e}") from None
            plan = decision.plan
            if plan is None:
                raise HTTPException(409, f"no plan to apply: {decision.reason}")
            if not plan.feasible or not plan.moves:
                raise HTTPException(409, f"no plan to apply: {plan.reason or 'the request fits already'}")
            try:
                new = planning.apply_plan(state, plan)
            except Exception as e:
                raise HTTPException(409, f"the plan does not apply: {e}") from None
            records = move_records(state, plan, source.clock(), f"dashboard: make room for {workload_id}")
            ver = source.replace(new, records)
            return {"applied": True, "moves": len(plan.moves), "version": ver, "summary": summary_out(new),
                    "plan": planning.plan_dict(state, plan)}

    @app.post("/api/workloads/{workload_id}/checkpoint", response_model=schemas.CheckpointResult,
              tags=["actions"], dependencies=[Depends(guard)],
              responses=_errors(e401="no valid bearer token", e403="actions are off", e404=NOT_FOUND,
                                e409="not running, or an engine that cannot signal jobs",
                                e502="the scheduler refused the signal"))
    def checkpoint(workload_id: WorkloadId) -> dict[str, Any]:
        """Trigger a checkpoint. On the in-memory cluster this records a fresh checkpoint at the cluster's clock
        (so moving the workload loses no work); on a live engine it sends USR2 to the job's wrapper
        (`gpudefrag run`), which checkpoints at once."""
        if isinstance(source, MemorySource):
            with source.lock:
                state = source.state()
                w = _running(state, workload_id)
                fresh = msgspec.structs.replace(w, last_checkpoint_at=state.now)
                new = state.with_workloads([fresh if x.id == w.id else x for x in state.workloads])
                source.checkpoints[w.id] = source.clock()
                ver = source.replace(new)
                return {"workload_id": w.id, "mode": "recorded", "last_checkpoint_at": state.now, "version": ver}
        if not can_signal:
            raise HTTPException(409, f"the {source.engine_name} engine cannot signal jobs")
        w = _running(source.state(), workload_id)
        try:
            source.engine.signal(w.id, "USR2", batch=True)  # type: ignore[attr-defined]
        except Exception as e:  # the scheduler refused: say what it said
            raise HTTPException(502, f"could not signal {w.id}: {e}") from None
        source.checkpoints[w.id] = source.clock()
        return {"workload_id": w.id, "mode": "signalled", "last_checkpoint_at": w.last_checkpoint_at,
                "version": source.version}

    # ------------------------------------------------------------------------------------------------ metrics
    @app.get("/metrics", include_in_schema=False)
    def metrics() -> Response:
        return Response(metrics_mod.render(registry), media_type="text/plain; version=0.0.4; charset=utf-8")

    return app


def _running(state: ClusterState, workload_id: str) -> Workload:
    if workload_id not in state.workload_index:
        raise HTTPException(404, f"no workload {workload_id!r}")
    w = state.workload(workload_id)
    if not w.is_running:
        raise HTTPException(409, f"workload {workload_id!r} is not running")
    return w


def _history_row(r: dict[str, Any], origin: str) -> dict[str, Any]:
    """Coerce a journal row into the documented shape (journal fields may be richer than the contract)."""

    def text(v: Any) -> str | None:
        if v is None or isinstance(v, str):
            return v
        return json.dumps(v, default=str) if isinstance(v, dict | list) else str(v)

    def when(v: Any) -> float | str | None:
        return v if v is None or (isinstance(v, float | int | str) and not isinstance(v, bool)) else str(v)

    steps = [
        {"state": str(s.get("state", "")), "at": when(s.get("at")), "detail": text(s.get("detail"))}
        for s in (r.get("steps") or []) if isinstance(s, dict)
    ]
    return {
        "id": r.get("id") if isinstance(r.get("id"), str | int) else str(r.get("id")),
        "workload_id": str(r.get("workload_id", "")),
        "source": str(r.get("source", "")),
        "target": str(r.get("target", "")),
        "state": str(r.get("state", "")),
        "reason": text(r.get("reason")),
        "created_at": when(r.get("created_at")),
        "updated_at": when(r.get("updated_at")),
        "steps": steps,
        "origin": origin,
    }
