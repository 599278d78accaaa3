"""The one place PlanOptions are built: from the policy file, the cost file and the compatibility rules.

`gpudefrag plan`, the controller, the dashboard (`serve`) and `kube plan` all take the same inputs
(`--policy`, `--costs`) and build their options here, so the same cluster gets the same plan from every door.
Explicit overrides (a CLI flag) win over the policy; the policy wins over the defaults.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..core.compat import CompatRule
from ..core.cost import CostModel
from ..core.model import Workload
from ..core.planner import PlanOptions
from .models import Policy


@dataclass(frozen=True)
class PlanInputs:
    """What every entry point reads before planning: the policy (default when no file) and the cost model."""

    policy: Policy
    costs: CostModel

    @property
    def compat(self) -> CompatRule:
        return compat_rule(self.policy)


def compat_rule(policy: Policy) -> CompatRule:
    return CompatRule(**policy.compat.model_dump())


def load_inputs(policy: str | os.PathLike[str] | None = None,
                costs: str | os.PathLike[str] | None = None) -> PlanInputs:
    """Read the policy and cost files (either may be None: the defaults). Bad input raises InputError."""
    from .costs import load_cost_model
    from .loader import load_policy

    pol = load_policy(policy) if policy is not None else Policy()
    cm = load_cost_model(Path(costs)) if costs is not None else CostModel()
    return PlanInputs(pol, cm)


def plan_options(inputs: PlanInputs | None = None, *, movable: Callable[[Workload], bool] | None = None,
                 exclude: Callable[[Workload], str | None] | None = None, use_filter: bool = True,
                 **overrides: Any) -> PlanOptions:
    """PlanOptions from the inputs: the policy's move budget, planner time limit, filter and compatibility rule,
    the cost model; `movable` narrows the filter further, and `exclude` too, saying why (busy jobs, jobs without
    a wrapper): the options name the filter field or reason that excludes each workload; `overrides` are
    PlanOptions fields set explicitly (None values are ignored). Every workload's own `movable` flag is
    honoured by `core.decision`, whatever the filter."""
    inp = inputs or PlanInputs(Policy(), CostModel())
    pol = inp.policy
    flt = pol.filter if use_filter else None

    def excluded_by(w: Workload) -> str | None:
        why = flt.why_not(w) if flt is not None else None
        if why is None and exclude is not None:
            why = exclude(w)
        if why is None and movable is not None and not movable(w):
            why = "the caller's filter"
        return why

    def allowed(w: Workload) -> bool:
        return excluded_by(w) is None

    opts = PlanOptions(max_moves=pol.budgets.max_moves_per_plan, time_limit_s=pol.planner_time_limit_s,
                       movable=allowed, cost_model=inp.costs, compat=inp.compat, excluded_by=excluded_by)
    return dataclasses.replace(opts, **{k: v for k, v in overrides.items() if v is not None})
