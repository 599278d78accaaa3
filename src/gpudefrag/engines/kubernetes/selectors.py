"""Kubernetes label selectors (PDBs) and the GPU-relevant parts of node selection (pods)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from .access import At

GPU_PRODUCT_LABEL = "nvidia.com/gpu.product"


@dataclass(frozen=True, slots=True)
class LabelSelector:
    """`matchLabels` + `matchExpressions` (In, NotIn, Exists, DoesNotExist). An empty selector matches all."""

    match_labels: tuple[tuple[str, str], ...] = ()
    expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    @staticmethod
    def parse(at: At) -> LabelSelector:
        exprs = []
        for e in at.objects("matchExpressions"):
            op = e.req_str("operator")
            if op not in ("In", "NotIn", "Exists", "DoesNotExist"):
                raise e.error(f"unknown operator {op!r}", "operator")
            vals = []
            for v in e.items("values"):
                if not isinstance(v.value, str):
                    raise v.error("expected a string")
                vals.append(v.value)
            exprs.append((e.req_str("key"), op, tuple(vals)))
        return LabelSelector(tuple(sorted(at.str_map("matchLabels").items())), tuple(exprs))

    def matches(self, labels: Mapping[str, str]) -> bool:
        if any(labels.get(k) != v for k, v in self.match_labels):
            return False
        for key, op, vals in self.expressions:
            has = key in labels
            if (op == "In" and (not has or labels[key] not in vals)) or (op == "NotIn" and has and labels[key] in vals):
                return False
            if (op == "Exists" and not has) or (op == "DoesNotExist" and has):
                return False
        return True


@dataclass(frozen=True, slots=True)
class NodeSelection:
    """What a pod asks of its node, reduced to what the core model checks: equality labels and GPU models."""

    selector: dict[str, str]
    gpu_models: tuple[str, ...]
    other_terms: int  # required affinity expressions not representable as equality (reported, not enforced)


def node_selection(spec: At) -> NodeSelection:
    """`spec.nodeSelector` plus required node affinity. `nvidia.com/gpu.product` becomes the allowed GPU models;
    single-valued `In` expressions become equality labels. Multiple terms are ORed by Kubernetes: only the
    first term is used for labels, but GPU models are collected from every term."""
    selector = dict(spec.str_map("nodeSelector"))
    models: list[str] = []
    if GPU_PRODUCT_LABEL in selector:
        models.append(selector.pop(GPU_PRODUCT_LABEL))
    other = 0
    req = spec.obj("affinity").obj("nodeAffinity").obj("requiredDuringSchedulingIgnoredDuringExecution")
    for t, term in enumerate(req.objects("nodeSelectorTerms")):
        for e in term.objects("matchExpressions"):
            key, op = e.req_str("key"), e.req_str("operator")
            vals = [v.value for v in e.items("values") if isinstance(v.value, str)]
            if key == GPU_PRODUCT_LABEL and op == "In":
                models.extend(v for v in vals if v not in models)
            elif t == 0 and op == "In" and len(vals) == 1:
                selector.setdefault(key, vals[0])
            else:
                other += 1
    return NodeSelection(selector, tuple(models), other)
