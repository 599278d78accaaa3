"""One projection of the policy onto every runtime setting (issue 29): the compatibility rule built once, the
executor's budgets and the Kubernetes move options read from the same `PlanInputs`, each default kept in one
place, and --policy/--costs/--store/--key declared once for every command."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path
from typing import Any

import typer.main

from gpudefrag.cli import common
from gpudefrag.cli.main import app
from gpudefrag.control.executor import ExecutorConfig
from gpudefrag.core.compat import CompatRule
from gpudefrag.core.planner import PlanOptions
from gpudefrag.engines.kubernetes import MoveOptions
from gpudefrag.policy import Budgets, Compat, Policy, parse_policy
from gpudefrag.policy.options import PlanInputs, load_inputs, plan_options

SRC = Path(__file__).resolve().parents[2] / "src" / "gpudefrag"


def test_each_default_lives_in_one_place() -> None:
    # the planner's own defaults are the policy's
    assert plan_options().max_moves == PlanOptions().max_moves == Budgets().max_moves_per_plan
    assert plan_options().time_limit_s == PlanOptions().time_limit_s == Policy().planner_time_limit_s
    assert plan_options().search_limit == PlanOptions().search_limit == Policy().planner_search_limit
    # the policy's compat section mirrors the rule, field for field and default for default
    assert CompatRule(**Compat().model_dump()) == CompatRule()
    assert set(Compat.model_fields) == {f.name for f in dataclasses.fields(CompatRule)}
    # the executor's and the moves' defaults are the default policy's
    assert ExecutorConfig() == ExecutorConfig.from_policy(Policy())
    assert {f.name for f in dataclasses.fields(ExecutorConfig)} == set(Budgets.model_fields) - {
        "max_moves_per_plan", "max_plans_per_cycle", "max_tries_per_cycle"} | {"fallback"}
    mo, b = MoveOptions(), Budgets()
    assert (mo.ready_timeout_s, mo.checkpoint_timeout_s) == (b.restore_timeout_s, b.checkpoint_timeout_s)


def test_every_runtime_setting_comes_from_the_policy(tmp_path: Path) -> None:
    pol = tmp_path / "p.yaml"
    pol.write_text("budgets: {max_moves_per_plan: 3, max_concurrent: 5, restore_timeout_s: 42, "
                   "checkpoint_timeout_s: 7}\nplanner_time_limit_s: 0.5\nplanner_search_limit: 99\n"
                   "action: {fallback: evict}\n"
                   "compat: {driver: minor, kernel: any}\n")
    inp = load_inputs(pol)
    assert inp.compat is inp.compat  # built once
    assert inp.compat.driver.value == "minor" and inp.compat.kernel.value == "any"
    opts = plan_options(inp)
    assert (opts.max_moves, opts.time_limit_s, opts.search_limit, opts.compat) == (3, 0.5, 99, inp.compat)
    assert inp.executor.max_concurrent == 5 and inp.executor.fallback == "evict"
    mo = MoveOptions.from_inputs(inp, checkpoint="app")
    assert (mo.ready_timeout_s, mo.checkpoint_timeout_s, mo.compat, mo.on_incompatible, mo.checkpoint) == (
        42, 7, inp.compat, "cold-start", "app")
    assert MoveOptions.from_inputs(PlanInputs(parse_policy({}), inp.costs)).on_incompatible == "refuse"


def test_the_policy_becomes_a_compat_rule_in_one_place() -> None:
    hits = []
    for p in SRC.rglob("*.py"):
        for n in ast.walk(ast.parse(p.read_text())):
            if (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "model_dump"
                    and isinstance(n.func.value, ast.Attribute) and n.func.value.attr == "compat"):
                hits.append(str(p.relative_to(SRC)))
    assert hits == ["policy/options.py"]


SHARED = {"--policy": common.PolicyOpt, "--costs": common.CostsOpt, "--store": common.StoreOpt, "--key": common.KeyOpt}
# `simulate replay --policy` is the policy of one simulated arm, whose default is the replay's (a trigger and
# heartbeat from --trigger/--heartbeat), not the built-in policy
OWN_MEANING = {("simulate replay", "--policy")}


def _commands(cmd: Any, path: str = "") -> list[tuple[str, Any]]:
    out = [(path, cmd)]
    if hasattr(cmd, "commands"):  # a group (typer's own click)
        for name, sub in cmd.commands.items():
            out += _commands(sub, f"{path} {name}".strip())
    return out


def test_policy_costs_store_key_are_one_option_each_everywhere() -> None:
    seen: dict[str, list[str]] = {o: [] for o in SHARED}
    for path, cmd in _commands(typer.main.get_command(app)):
        for prm in cmd.params:
            for opt in set(prm.opts) & set(SHARED):
                if (path, opt) in OWN_MEANING:
                    continue
                shared = SHARED[opt]
                assert (prm.help, prm.envvar) == (shared.help, shared.envvar), f"`{path} {opt}` has its own meaning"
                seen[opt].append(path)
    assert {o: len(v) >= 2 for o, v in seen.items()} == dict.fromkeys(SHARED, True), seen
    assert "controller" in seen["--store"] and "checkpoint" in seen["--store"] and "run" in seen["--store"]
