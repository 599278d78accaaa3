"""May a checkpoint taken with one software/hardware stack be restored on a given node?

The rule (documented in docs/planner.md): the GPU model must be identical (GPU state is not portable across
architectures); the node must have at least the GPUs the checkpoint holds; the CPU architecture must match;
driver and CUDA versions follow a configurable rule, exact by default. Engine, model and checkpointer versions
travel with the workload's image, not the node, so they are recorded but not compared against a node. A field
the checkpoint does not record is not checked; a field the node does not report passes unless `strict`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from .model import Node, Versions


class VersionMatch(StrEnum):
    EXACT = "exact"  # identical strings
    MINOR = "minor"  # same major.minor (550.54.15 ~ 550.54.14)
    MAJOR = "major"  # same major (550.x)
    AT_LEAST = "at-least"  # node version >= checkpoint version
    ANY = "any"  # not checked


@dataclass(frozen=True, slots=True)
class CompatRule:
    driver: VersionMatch = VersionMatch.EXACT
    cuda: VersionMatch = VersionMatch.EXACT
    cpu_arch: bool = True  # require the same CPU architecture
    strict: bool = False  # a node that does not report a version the checkpoint records is incompatible


def _parts(v: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\-+]", v.strip()) if p)


def version_ok(recorded: str, offered: str, match: VersionMatch) -> bool:
    """Whether `offered` (the node's version) satisfies `recorded` (the checkpoint's) under `match`."""
    if match is VersionMatch.ANY or recorded.strip() == offered.strip():
        return True
    a, b = _parts(recorded), _parts(offered)
    if match is VersionMatch.EXACT:
        return a == b
    if match is VersionMatch.MAJOR:
        return a[:1] == b[:1]
    if match is VersionMatch.MINOR:
        return a[:2] == b[:2]
    try:  # AT_LEAST: compare numerically where both parts are numbers
        return [(0, p) if isinstance(p, int) else (1, p) for p in b] >= [
            (0, p) if isinstance(p, int) else (1, p) for p in a
        ]
    except TypeError:
        return False


def describe(record: Versions, node: Node, rule: CompatRule | None = None) -> list[str]:
    """One human sentence per mismatching field (empty: compatible). Each starts with the field name."""
    rule = rule or CompatRule()
    out: list[str] = []

    def unknown(name: str, rec: str) -> None:
        if rule.strict:
            out.append(f"{name}: checkpoint has {rec}, node {node.name} does not report one (strict rule)")

    if record.gpu_model:
        if node.gpu_model is None:
            unknown("gpu_model", record.gpu_model)
        elif node.gpu_model != record.gpu_model:
            out.append(f"gpu_model: checkpoint {record.gpu_model}, node {node.name} has {node.gpu_model}")
    if record.gpu_count is not None and node.usable_gpus < record.gpu_count:
        out.append(f"gpu_count: checkpoint holds {record.gpu_count} GPUs, node {node.name} has {node.usable_gpus}")
    for name, rec, offered, match in (
        ("driver", record.driver, node.driver_version, rule.driver),
        ("cuda", record.cuda, node.cuda_version, rule.cuda),
    ):
        if not rec or match is VersionMatch.ANY:
            continue
        if offered is None:
            unknown(name, rec)
        elif not version_ok(rec, offered, match):
            out.append(f"{name}: checkpoint {rec}, node {node.name} has {offered} (rule: {match.value})")
    if rule.cpu_arch and record.cpu_arch:
        if node.cpu_arch is None:
            unknown("cpu_arch", record.cpu_arch)
        elif node.cpu_arch != record.cpu_arch:
            out.append(f"cpu_arch: checkpoint {record.cpu_arch}, node {node.name} is {node.cpu_arch}")
    return out


def check(record: Versions, node: Node, rule: CompatRule | None = None) -> list[str]:
    """The mismatching fields (e.g. ["driver", "cuda"]); empty = the checkpoint may be restored on the node."""
    return [s.split(":", 1)[0] for s in describe(record, node, rule)]


def node_signature(node: Node) -> tuple[object, ...]:
    """What `check` reads from a node: nodes with equal signatures get equal answers (used to cache)."""
    return (node.gpu_model, node.usable_gpus, node.driver_version, node.cuda_version, node.cpu_arch)
