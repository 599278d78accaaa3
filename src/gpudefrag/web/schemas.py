"""Response models of the JSON API: they make FastAPI's OpenAPI page document every view precisely."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


class Error(BaseModel):
    detail: str


class Config(BaseModel):
    engine: str
    mutable: bool
    actions_enabled: bool  # a token is configured
    can_apply: bool  # apply-plan works here (in-memory cluster)
    can_checkpoint: bool  # trigger-checkpoint works here (in-memory, or an engine that can signal the wrapper)
    version: int
    journal: str | None


class Summary(BaseModel):
    cluster: str
    now: float
    nodes: int
    gpus: int
    free_gpus: int
    free_gpu_share: float
    whole_free_nodes: int
    request: str
    request_gpus_per_node: int
    nodes_fitting_request: int
    stranded_gpus: int
    largest_placeable: int
    fgd_ratio: float
    running: int
    pending: int
    models: list[str]
    version: int = 0


class WorkloadInfo(BaseModel):
    id: str
    name: str
    namespace: str
    state: str
    gpus_per_node: int
    node_count: int
    gpu_milli: int
    request: str
    nodes: list[str]
    checkpoint_bytes: int
    last_checkpoint_at: float | None
    priority: int


class Cell(BaseModel):
    free_milli: int  # -1: GPU not advertised by the device plugin
    shares: list[tuple[str, int]]  # (workload id, milli-GPU)


class NodeRow(BaseModel):
    name: str
    model: str
    gpus: int
    usable: int
    schedulable: bool
    free_gpus: int
    fits: bool
    stranded_gpus: int
    cells: list[Cell]


class MapGroup(BaseModel):
    model: str
    rows: list[NodeRow]


class GpuMap(BaseModel):
    request: str
    request_gpus_per_node: int
    total_nodes: int
    matching_nodes: int
    offset: int
    limit: int
    groups: list[MapGroup]
    workloads: list[WorkloadInfo]


class CauseOut(BaseModel):
    code: str
    summary: str
    evidence: dict[str, Any]


class DiagnosisOut(BaseModel):
    primary: str
    is_fragmentation: bool
    scheduler_reason: str
    causes: list[CauseOut]


class PendingJob(WorkloadInfo):
    submitted_at: float | None
    diagnosis: DiagnosisOut


class MoveOut(BaseModel):
    workload_id: str
    workload_name: str
    gpus: int
    source: str
    target: str
    target_gpus: list[int]
    cost: dict[str, Any]


class PlanOut(BaseModel):
    feasible: bool
    reason: str
    target_node: str | None
    solver: str
    optimal: bool
    total_cost_s: float | None
    total_gpu_s: float | None
    explain: list[str]
    moves: list[MoveOut]


class PlanPreview(BaseModel):
    workload: PendingJob
    available: bool  # False: no plan (an ordinary cause blocks the job, or the planner failed); message says why
    message: str
    plan: PlanOut | None
    decision: dict[str, Any] | None = None  # core.decision.Decision.as_dict(): causes, options, the one chosen
    before: list[NodeRow]
    after: list[NodeRow]
    after_summary: Summary | None
    version: int


class ApplyResult(BaseModel):
    applied: bool
    moves: int
    version: int
    summary: Summary
    plan: PlanOut


class CheckpointResult(BaseModel):
    workload_id: str
    mode: str  # "recorded": in-memory cluster, checkpoint time set; "signalled": USR2 sent to the job's wrapper
    last_checkpoint_at: float | None
    version: int


class SampleOut(BaseModel):
    at: float
    free_gpus: int
    whole_free_nodes: int
    stranded_gpus: int
    request: str
    fgd_ratio: float
    pending: int


class HistoryStep(BaseModel):
    state: str
    at: float | str | None = None
    detail: str | None = None


class HistoryMove(BaseModel):
    id: str | int
    workload_id: str
    source: str
    target: str
    state: str
    reason: str | None = None
    created_at: float | str | None = None
    updated_at: float | str | None = None
    steps: list[HistoryStep] = []
    origin: str  # "journal" | "dashboard"


class History(BaseModel):
    moves: list[HistoryMove]
    note: str
