"""May a checkpoint taken with one software/hardware stack be restored on a given node? The one rule.

Both the planner (for a node in a snapshot) and the restore path (`gpudefrag.checkpoint.compat`, for the machine
it runs on) call `mismatches` with the same `CompatRule`, so a move the planner accepts is never refused at
restore for compatibility. Per field (GPU model, driver, CUDA, checkpointer, engine, model, CPU architecture,
kernel) the rule says how the offered version must relate to the recorded one: exact, same minor, same major,
at least, or any. The GPU count is always a minimum. A field the checkpoint does not record is not checked; a
field the node (or host) does not report passes unless the rule is `strict`. Documented in docs/planner.md.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, fields
from enum import StrEnum

import msgspec

from .model import ClusterState, Node, Versions, Workload


class VersionMatch(StrEnum):
    EXACT = "exact"  # identical strings
    MINOR = "minor"  # same major.minor (550.54.15 ~ 550.54.14)
    MAJOR = "major"  # same major (550.x)
    AT_LEAST = "at-least"  # offered version >= recorded version
    ANY = "any"  # not checked


EXACT = VersionMatch.EXACT

# The fields a rule governs; gpu_count is always a minimum. ORDER: how mismatches are reported.
RULE_FIELDS: tuple[str, ...] = ("cpu_arch", "kernel", "checkpointer", "gpu_model", "driver", "cuda", "engine",
                                "model")
ORDER: tuple[str, ...] = ("cpu_arch", "kernel", "checkpointer", "gpu_model", "gpu_count", "driver", "cuda", "engine",
                          "model")


@dataclass(frozen=True, slots=True)
class CompatRule:
    """How each recorded version must relate to the offered one. Defaults: everything exact."""

    gpu_model: VersionMatch = EXACT  # GPU state is not portable across architectures
    driver: VersionMatch = EXACT
    cuda: VersionMatch = EXACT
    checkpointer: VersionMatch = EXACT
    engine: VersionMatch = EXACT
    model: VersionMatch = EXACT
    cpu_arch: VersionMatch = EXACT
    kernel: VersionMatch = EXACT
    strict: bool = False  # a version the checkpoint records but the node does not report is a mismatch

    def __post_init__(self) -> None:
        for f in fields(self):
            if f.name != "strict":
                object.__setattr__(self, f.name, VersionMatch(getattr(self, f.name)))

    def match(self, name: str) -> VersionMatch:
        return getattr(self, name)  # type: ignore[no-any-return]

    def as_dict(self) -> dict[str, object]:
        return {f.name: (getattr(self, f.name) if f.name == "strict" else getattr(self, f.name).value)
                for f in fields(self)}


def _parts(v: str) -> tuple[int | str, ...]:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"[.\-+ ]", v.strip()) if p)


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
    # AT_LEAST: compare part by part, numbers below words (so "12.4" < "12.4.1" < "12.10")
    return [(0, p, "") if isinstance(p, int) else (1, 0, p) for p in b] >= [
        (0, p, "") if isinstance(p, int) else (1, 0, p) for p in a
    ]


@dataclass(frozen=True, slots=True)
class Mismatch:
    """One field the offered stack does not satisfy. `offered` None: not reported (strict rule)."""

    field: str
    recorded: str | int
    offered: str | int | None
    match: str


def mismatches(record: Versions, offered: Versions, rule: CompatRule | None = None,
               only: Iterable[str] | None = None) -> list[Mismatch]:
    """Every field where `offered` does not satisfy `record` under `rule` (empty: compatible). `only` limits
    the check to some fields (a backend whose state does not depend on the kernel, say)."""
    rule = rule or CompatRule()
    wanted = set(only) if only is not None else None
    out: list[Mismatch] = []
    for name in ORDER:
        if wanted is not None and name not in wanted:
            continue
        rec, off = getattr(record, name), getattr(offered, name)
        if name == "gpu_count":  # a minimum; a host that reports no GPUs has none
            if rec is not None and (off or 0) < rec:
                out.append(Mismatch(name, rec, off, "at-least"))
            continue
        match = rule.match(name)
        if not rec or match is VersionMatch.ANY:
            continue
        if off is None:
            if rule.strict:
                out.append(Mismatch(name, rec, None, match.value))
        elif not version_ok(rec, off, match):
            out.append(Mismatch(name, rec, off, match.value))
    return out


def describe(record: Versions, node: Node, rule: CompatRule | None = None) -> list[str]:
    """One human sentence per mismatching field (empty: compatible). Each starts with the field name."""
    out = []
    for m in mismatches(record, node_versions(node), rule):
        if m.offered is None:
            out.append(f"{m.field}: checkpoint has {m.recorded}, node {node.name} does not report one (strict rule)")
        elif m.field == "gpu_count":
            out.append(f"gpu_count: checkpoint holds {m.recorded} GPUs, node {node.name} has {m.offered}")
        else:
            out.append(f"{m.field}: checkpoint {m.recorded}, node {node.name} has {m.offered} (rule: {m.match})")
    return out


def check(record: Versions, node: Node, rule: CompatRule | None = None) -> list[str]:
    """The mismatching fields (e.g. ["driver", "cuda"]); empty = the checkpoint may be restored on the node."""
    return [m.field for m in mismatches(record, node_versions(node), rule)]


def node_versions(node: Node) -> Versions:
    """What a node offers, as a Versions record (its usable GPUs as the count)."""
    v = node.versions()
    return Versions(gpu_model=v.gpu_model, gpu_count=node.usable_gpus, driver=v.driver, cuda=v.cuda,
                    cpu_arch=v.cpu_arch, kernel=v.kernel, checkpointer=v.checkpointer)


def node_signature(node: Node) -> tuple[object, ...]:
    """What `check` reads from a node: nodes with equal signatures get equal answers (used to cache)."""
    return (node.gpu_model, node.usable_gpus, node.driver_version, node.cuda_version, node.cpu_arch, node.kernel,
            node.checkpointer_version)


# What every checkpoint records about the host it was taken on, whatever the workload says about itself
# (`checkpoint.compat.host_versions`: the CPU architecture, the kernel release, the checkpointer).
HOST_FIELDS: tuple[str, ...] = ("cpu_arch", "kernel", "checkpointer")


def checkpoint_record(state: ClusterState, w: Workload) -> Versions:
    """What a checkpoint of `w` taken where it runs now will record: the workload's own versions, plus the facts
    its node reports for the fields every checkpoint records of its host (`HOST_FIELDS`) where the workload does
    not say. The planner and the Kubernetes moves check this record, as the restore gate checks the manifest's,
    so a job on a 6.1 kernel is not planned onto a 6.12 node that the restore would refuse."""
    v = w.versions
    src = w.placements[0].node if w.placements else None
    if src is None or src not in state.node_index:
        return v
    host = state.node(src).versions()
    fill = {f: getattr(host, f) for f in HOST_FIELDS if getattr(v, f) is None and getattr(host, f) is not None}
    return msgspec.structs.replace(v, **fill) if fill else v
