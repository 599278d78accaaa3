"""The cost file (JSON or YAML): bandwidths in GB/s, per-pair links, and measured migrations → a CostModel.

Read by the one PlanOptions builder (`gpudefrag.policy.options`), so every entry point prices moves alike.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .. import fileio
from ..core.cost import GB, CostModel, TransferSample
from ..errors import InputError, loc_to_path

Pos = Annotated[float, Field(gt=0, allow_inf_nan=False)]
NonNegF = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LinkIn(_Strict):
    source: Annotated[str, Field(min_length=1)]
    target: Annotated[str, Field(min_length=1)]
    gbps: Pos


class SampleIn(_Strict):
    source: Annotated[str, Field(min_length=1)]
    target: Annotated[str, Field(min_length=1)]
    bytes: Annotated[int, Field(ge=0)]
    checkpoint_s: NonNegF
    transfer_s: NonNegF
    restore_s: NonNegF


class CostsIn(_Strict):
    """A cost file (JSON or YAML): bandwidths in GB/s, per-pair links, and measured migrations."""

    checkpoint_gbps: Pos = 2.0
    transfer_gbps: Pos = 1.25
    restore_gbps: Pos = 2.0
    overhead_s: NonNegF = 10.0
    cold_start_s: NonNegF = 300.0
    shared_storage: bool = False
    links: list[LinkIn] = []
    history: list[SampleIn] = []


def cost_model_from_doc(doc: Any, source: str) -> CostModel:
    """The CostModel a cost document describes; bad input is one InputError naming the file and field."""
    try:
        c = CostsIn.model_validate(doc)
    except ValidationError as e:
        err = e.errors()[0]
        raise InputError(source, loc_to_path(err["loc"]), err["msg"]) from None
    model = CostModel(
        checkpoint_bps=c.checkpoint_gbps * GB, transfer_bps=c.transfer_gbps * GB, restore_bps=c.restore_gbps * GB,
        overhead_s=c.overhead_s, cold_start_s=c.cold_start_s, shared_storage=c.shared_storage,
        link_bps={(lk.source, lk.target): lk.gbps * GB for lk in c.links},
    )
    samples = [TransferSample(s.source, s.target, s.bytes, s.checkpoint_s, s.transfer_s, s.restore_s)
               for s in c.history]
    model = model.from_history(samples) if samples else model
    if not all(math.isfinite(v) for v in (model.checkpoint_bps, model.transfer_bps, model.restore_bps)):
        raise InputError(source, "history", "measured bandwidths are not finite")
    return model


def load_cost_model(path: Path) -> CostModel:
    return cost_model_from_doc(fileio.read_document(path, "cost"), str(path))
