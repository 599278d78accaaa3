"""Slurm host lists: `node[1-3,7],gpu05` <-> the names, without a round trip through `scontrol show hostnames`."""

from __future__ import annotations

import re

_BRACKET = re.compile(r"^(?P<prefix>[^\[]*)\[(?P<body>[^\]]+)\](?P<rest>.*)$")


def _split_top(text: str) -> list[str]:
    """Split on commas that are not inside brackets."""
    out, depth, cur = [], 0, []
    for ch in text:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur))
    return [s for s in (p.strip() for p in out) if s]


def expand(hostlist: str | None) -> list[str]:
    """`node[1-3,7]` -> [node1, node2, node3, node7]; zero padding (`n[01-03]`) is kept."""
    if not hostlist or hostlist in {"(null)", "None"}:
        return []
    names: list[str] = []
    for part in _split_top(hostlist):
        m = _BRACKET.match(part)
        if not m:
            names.append(part)
            continue
        tails = expand(m.group("rest")) if m.group("rest") else [""]
        for rng in m.group("body").split(","):
            if "-" in rng:
                lo, hi = rng.split("-", 1)
                width = len(lo) if lo.startswith("0") else 0
                for i in range(int(lo), int(hi) + 1):
                    for t in tails:
                        names.append(f"{m.group('prefix')}{i:0{width}d}{t}")
            else:
                for t in tails:
                    names.append(f"{m.group('prefix')}{rng}{t}")
    return names


def expand_indices(spec: str) -> list[int]:
    """`0-2,5` -> [0, 1, 2, 5] (GPU index lists in `gpu:3(IDX:0-2)`)."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part or part == "N/A":
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.extend(range(int(lo), int(hi) + 1))
        else:
            out.append(int(part))
    return out
