"""One registry shape (issue 29): checkpoint backends, engines, cause checks and triggers are each a
`gpudefrag.registry.Registry` — a name, a function, typed and validated arguments — and no module hand-writes
another; a trigger's settings are declared beside the trigger and are exactly the policy's `trigger:` section."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from pydantic import BaseModel

from gpudefrag.checkpoint.protocol import UNAVAILABLE, CheckpointError
from gpudefrag.checkpoint.registry import BACKENDS, backend_for
from gpudefrag.core.diagnose import CAUSE_CHECKS, CauseCode
from gpudefrag.core.model import ClusterState
from gpudefrag.engines.registry import ENGINES, make_engine
from gpudefrag.policy import parse_policy
from gpudefrag.policy.triggers import TRIGGERS, Trigger
from gpudefrag.registry import Args, Registry

SRC = Path(__file__).resolve().parents[2] / "src" / "gpudefrag"


def test_the_four_registries_are_one_shape() -> None:
    for reg, names in [(BACKENDS, {"criu", "cuda", "app"}), (ENGINES, {"slurm", "kubernetes", "sim"}),
                       (TRIGGERS, {"pending", "scheduled", "fragmentation-above"})]:
        assert isinstance(reg, Registry) and set(reg.names()) == names
        assert all(issubclass(e.args, BaseModel) for e in reg)
    assert isinstance(CAUSE_CHECKS, Registry)
    assert set(CAUSE_CHECKS.names()) <= {c.value for c in CauseCode} and len(CAUSE_CHECKS) >= 10


class _Args(Args):
    n: int = 1
    where: Path | None = None


def test_arguments_are_validated_and_converted_before_the_function_runs() -> None:
    reg: Registry = Registry("widget")
    calls: list[dict[str, object]] = []

    @reg.register("w", _Args)
    def build(**kw: object) -> dict[str, object]:
        calls.append(kw)
        return kw

    assert reg.build("w", n="3", where="/x") == {"n": 3, "where": Path("/x")}
    assert reg.build("w", where=None, m=None) == {}  # None is "not given": the function's own default
    for kw, said in [({"n": "three"}, "widget 'w': n: Input should be a valid integer"),
                     ({"m": 1}, "widget 'w' takes no argument(s) m; it takes ['n', 'where']")]:
        with pytest.raises(ValueError, match="widget 'w'") as e:
            reg.build("w", **kw)
        assert said in str(e.value)
    with pytest.raises(ValueError, match="unknown widget 'v'; known: w"):
        reg.build("v")
    assert len(calls) == 2  # the refused calls never reached the function
    with pytest.raises(RuntimeError, match="registered twice"):
        reg.register("w")(build)


def test_each_kind_refuses_with_its_own_error() -> None:
    with pytest.raises(CheckpointError) as e:
        backend_for("app", timeout_s=-1)
    assert e.value.reason == UNAVAILABLE and "checkpoint backend 'app': timeout_s" in e.value.detail
    with pytest.raises(ValueError, match="engine 'sim': state: Input should be an instance of ClusterState"):
        make_engine("sim", state={"nodes": []})
    assert make_engine("sim", state=ClusterState(nodes=[], workloads=[])) is not None


def test_a_triggers_settings_live_beside_it_and_make_up_the_policy_section() -> None:
    declared = [f for e in TRIGGERS for f in e.args.model_fields]
    assert len(declared) == len(set(declared))  # no setting belongs to two triggers
    assert set(Trigger.model_fields) == set(declared) | {"plan_anyway"}
    pol = parse_policy({"trigger": {"pending": {"min_gpus": 2}, "cron": "*/5 * * * *", "fragmentation_above": 0.5}})
    assert pol.trigger.pending is not None and pol.trigger.pending.min_gpus == 2
    assert pol.trigger.cron == "*/5 * * * *" and pol.trigger.fragmentation_above == 0.5


def _hand_written_registries(tree: ast.Module) -> list[str]:
    """Decorator factories that add the decorated function to a module-level table (the shape each of the four
    registries repeated before there was one): a nested def that appends to or stores into a global name."""
    glob = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    found = []
    for fn in (n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)):
        for inner in (n for n in fn.body if isinstance(n, ast.FunctionDef)):
            for n in ast.walk(inner):
                call = isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append"
                target = n.func.value if call else (n.targets[0].value if isinstance(n, ast.Assign) and  # type: ignore[union-attr]
                                                     isinstance(n.targets[0], ast.Subscript) else None)
                if isinstance(target, ast.Name) and target.id in glob:
                    found.append(f"{fn.name}.{inner.name} -> {target.id}")
    return found


def test_no_module_hand_writes_a_registry() -> None:
    hits = {str(p.relative_to(SRC)): h for p in SRC.rglob("*.py")
            if p.name != "registry.py" or p.parent != SRC
            if (h := _hand_written_registries(ast.parse(p.read_text())))}
    assert hits == {}
    old = ast.parse("T = []\ndef trigger(name):\n    def register(fn):\n        T.append((name, fn))\n"
                    "        return fn\n    return register\n")
    assert _hand_written_registries(old) == ["trigger.register -> T"]  # the check sees the old shape
