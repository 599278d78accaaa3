"""The one projection of the policy (and the cost file) onto every runtime setting.

`gpudefrag plan`, the controller, the dashboard (`serve`) and `kube plan` all take the same inputs
(`--policy`, `--costs`) and read their settings from one `PlanInputs`: the planner's options (`plan_options`),
the compatibility rule (`PlanInputs.compat`, built once), the executor's budgets (`PlanInputs.executor`) and,
through them, the Kubernetes move options (`engines.kubernetes.MoveOptions.from_inputs`). The defaults live in
one place each: the planner's in `core.planner.PlanOptions` (the policy's `budgets.max_moves_per_plan` and
`planner_time_limit_s` default to them), the compatibility rule's in `core.compat.CompatRule` (the policy's
`compat` mirrors it, a test checks), the disruption budget's in the policy's `Budgets` (`ExecutorConfig()` is
the default policy's). Explicit overrides (a CLI flag) win over the policy; the policy wins over the defaults.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from ..core.compat import CompatRule
from ..core.cost import CostModel
from ..core.model import Workload
from ..core.planner import PlanOptions
from .models import Action, Budgets, Policy

_BUDGETS, _ACTION = Budgets(), Action()


@dataclass(frozen=True)
class ExecutorConfig:
    """The executor's disruption budget and fallback: the policy's `budgets` and `action.fallback` (defaults:
    the default policy's, read from `Budgets` and `Action`, never restated)."""

    max_concurrent: int = _BUDGETS.max_concurrent
    max_per_node: int = _BUDGETS.max_per_node
    max_per_hour: int | None = _BUDGETS.max_per_hour
    checkpoint_timeout_s: float = _BUDGETS.checkpoint_timeout_s
    restore_timeout_s: float = _BUDGETS.restore_timeout_s
    fallback: str = _ACTION.fallback  # "evict": a failed checkpoint restarts the job on the target instead

    @staticmethod
    def from_policy(policy: Policy) -> ExecutorConfig:
        b = policy.budgets
        return ExecutorConfig(b.max_concurrent, b.max_per_node, b.max_per_hour, b.checkpoint_timeout_s,
                              b.restore_timeout_s, policy.action.fallback)


@dataclass(frozen=True)
class PlanInputs:
    """What every entry point reads before planning: the policy (default when no file) and the cost model."""

    policy: Policy
    costs: CostModel

    @cached_property
    def compat(self) -> CompatRule:
        """The policy's compatibility rule, built once for the planner, the executor and the move options."""
        return compat_rule(self.policy)

    @property
    def executor(self) -> ExecutorConfig:
        return ExecutorConfig.from_policy(self.policy)


def compat_rule(policy: Policy) -> CompatRule:
    """The one conversion of the policy's `compat` section into the rule planner and restore gate apply."""
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
                       search_limit=pol.planner_search_limit,
                       movable=allowed, cost_model=inp.costs, compat=inp.compat, excluded_by=excluded_by)
    return dataclasses.replace(opts, **{k: v for k, v in overrides.items() if v is not None})
