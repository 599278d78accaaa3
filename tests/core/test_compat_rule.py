"""The one compatibility rule: a move the planner accepts is never refused at restore for compatibility."""

from __future__ import annotations

from hypothesis import event, given, settings
from hypothesis import strategies as st

from gpudefrag.checkpoint.compat import DEFAULT_FIELDS, mismatches
from gpudefrag.core.compat import RULE_FIELDS, CompatRule, VersionMatch, check, version_ok
from gpudefrag.core.model import Node, Versions

versions = st.one_of(st.none(), st.lists(st.integers(0, 20), min_size=1, max_size=3).map(
    lambda p: ".".join(map(str, p))))
models = st.one_of(st.none(), st.sampled_from(["H100", "A100", "H200"]))
kernels = st.one_of(st.none(), st.sampled_from(["6.1.0-18-amd64", "6.1.0-21-amd64", "6.12.9-amd64", "5.15.0"]))
engines = st.one_of(st.none(), st.sampled_from(["vllm 0.6.3", "vllm 0.7.0", "pytorch 2.4.0"]))
ml_models = st.one_of(st.none(), st.sampled_from(["llama-3-8b@rev3", "llama-3-8b@rev4"]))
rules = st.builds(CompatRule, **{f: st.sampled_from(list(VersionMatch)) for f in RULE_FIELDS},
                  strict=st.booleans())


@st.composite
def stacks(draw: st.DrawFn) -> tuple[Versions, Node]:
    rec = Versions(gpu_model=draw(models), gpu_count=draw(st.one_of(st.none(), st.integers(1, 8))),
                   driver=draw(versions), cuda=draw(versions), checkpointer=draw(versions),
                   cpu_arch=draw(st.one_of(st.none(), st.sampled_from(["amd64", "arm64"]))),
                   kernel=draw(kernels), engine=draw(engines), model=draw(ml_models))
    node = Node("n", draw(st.integers(0, 8)), gpu_model=draw(models), driver_version=draw(versions),
                cuda_version=draw(versions), cpu_arch=draw(st.one_of(st.none(), st.sampled_from(["amd64", "arm64"]))),
                checkpointer_version=draw(versions), kernel=draw(kernels))
    return rec, node


def host_as_node_said(node: Node) -> Versions:
    """The restoring host, exactly as the node described itself in the snapshot (a host knows no engine or model
    version: those the job brings)."""
    return Versions(gpu_model=node.gpu_model, gpu_count=node.usable_gpus, driver=node.driver_version,
                    cuda=node.cuda_version, cpu_arch=node.cpu_arch, checkpointer=node.checkpointer_version,
                    kernel=node.kernel)


@settings(max_examples=400, deadline=None)
@given(stacks(), rules)
def test_planner_accepted_implies_restore_accepts(stack: tuple[Versions, Node], rule: CompatRule) -> None:
    rec, node = stack
    event(f"kernel recorded={rec.kernel is not None} node={node.kernel is not None}")
    event(f"engine/model recorded={rec.engine is not None or rec.model is not None}")
    if not check(rec, node, rule):  # the planner would move it there
        assert mismatches(rec, host_as_node_said(node), DEFAULT_FIELDS, rule) == []


@settings(max_examples=300, deadline=None)
@given(stacks(), rules)
def test_both_gates_name_the_same_fields(stack: tuple[Versions, Node], rule: CompatRule) -> None:
    rec, node = stack
    planner = set(check(rec, node, rule))
    restore = {d.split(":", 1)[0] for d in mismatches(rec, host_as_node_said(node), DEFAULT_FIELDS, rule)}
    assert planner == restore


def test_engine_and_model_versions_are_compared() -> None:
    rec = Versions(engine="vllm 0.6.3", model="llama-3-8b@rev3")
    assert mismatches(rec, Versions(engine="vllm 0.6.3", model="llama-3-8b@rev3")) == []
    assert [d.split(":")[0] for d in mismatches(rec, Versions(engine="vllm 0.7.0", model="llama-3-8b@rev4"))] == [
        "engine", "model"]
    assert mismatches(rec, Versions(engine="vllm 0.6.9"), rule=CompatRule(engine=VersionMatch.MINOR)) == []


def test_at_least_orders_numerically() -> None:
    assert version_ok("12.4", "12.10", VersionMatch.AT_LEAST)
    assert not version_ok("12.10", "12.4", VersionMatch.AT_LEAST)
    assert version_ok("550.54", "550.54.15", VersionMatch.AT_LEAST)
