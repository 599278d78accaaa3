"""Terminal pictures of a cluster: the GPU map (one row per node, one cell per GPU) and small tables.

A cell shows the workload holding the GPU as a letter in that workload's colour; a GPU shared by several
workloads shows how full it is (▁…█); a free GPU is a dot; a GPU the device plugin does not advertise is ×.
Stranded GPUs (free, but on a node where the waiting request cannot fit) are dimmed red.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from rich.columns import Columns
from rich.table import Table
from rich.text import Text

from .core.model import MILLI, ClusterState, Workload

_PALETTE = (
    "bold white on blue", "bold black on green", "bold black on yellow", "bold white on magenta",
    "bold black on cyan", "bold white on red", "bold black on bright_green", "bold black on bright_yellow",
    "bold white on bright_blue", "bold black on bright_magenta", "bold black on bright_cyan",
    "bold white on dark_orange3",
)
_LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
_SHARE = "▁▂▃▄▅▆▇█"


def workload_tags(state: ClusterState) -> dict[str, tuple[str, str]]:
    """A stable (letter, style) per running workload, in order of first appearance."""
    tags: dict[str, tuple[str, str]] = {}
    for i, w in enumerate(state.running):
        tags[w.id] = (_LETTERS[i % len(_LETTERS)], _PALETTE[i % len(_PALETTE)])
    return tags


def gpu_owners(state: ClusterState) -> dict[tuple[str, int], list[Workload]]:
    owners: dict[tuple[str, int], list[Workload]] = {}
    for w in state.running:
        for p in w.placements:
            for g in p.gpus:
                owners.setdefault((p.node, g), []).append(w)
    return owners


def gpu_map(
    state: ClusterState,
    *,
    title: str | None = None,
    highlight_nodes: Iterable[str] = (),
    stranded_nodes: Iterable[str] = (),
    tags: Mapping[str, tuple[str, str]] | None = None,
    max_nodes: int = 64,
) -> Table:
    tags = dict(tags) if tags is not None else workload_tags(state)
    owners = gpu_owners(state)
    highlight = set(highlight_nodes)
    stranded = set(stranded_nodes)
    table = Table(title=title, show_header=True, header_style="bold", box=None, pad_edge=False)
    table.add_column("node", no_wrap=True)
    table.add_column("model", no_wrap=True)
    table.add_column("GPUs", no_wrap=True)
    table.add_column("free", justify="right")
    free = state.free_milli
    shown = 0
    for i, n in enumerate(state.nodes):
        if shown >= max_nodes:
            table.add_row(Text(f"… {len(state.nodes) - shown} more nodes", style="dim"), "", "", "")
            break
        shown += 1
        cells = Text()
        for g in range(n.gpu_count):
            if g > 0:
                cells.append(" ")
            if free[i, g] < 0:
                cells.append("×", style="dim")
                continue
            own = owners.get((n.name, g), [])
            if not own:
                cells.append("·", style="bold red" if n.name in stranded else "green")
            elif len(own) == 1 and own[0].request.gpu_milli >= MILLI:
                letter, style = tags.get(own[0].id, ("?", "reverse"))
                cells.append(letter, style=style)
            else:
                used = MILLI - int(free[i, g])
                level = _SHARE[min(len(_SHARE) - 1, max(0, round(used / MILLI * len(_SHARE)) - 1))]
                style = tags.get(own[0].id, ("?", "white"))[1].split(" on ")[-1]
                cells.append(level, style=style)
        whole = int((free[i] == MILLI).sum())
        name = Text(n.name, style="bold green" if n.name in highlight else ("dim" if not n.schedulable else ""))
        table.add_row(name, n.gpu_model or "", cells, f"{whole}/{n.usable_gpus}")
    return table


def legend(state: ClusterState, tags: Mapping[str, tuple[str, str]] | None = None, limit: int = 40) -> Columns:
    """One entry per running workload (letter in its colour, id, size), laid out in columns."""
    tags = dict(tags) if tags is not None else workload_tags(state)
    items = []
    for w in state.running[:limit]:
        if w.id not in tags:
            continue
        letter, style = tags[w.id]
        share = "" if w.request.gpu_milli >= MILLI else f"×{w.request.gpu_milli / MILLI:.2f}"
        item = Text()
        item.append(f" {letter} ", style=style)
        item.append(f" {w.id} ({w.request.gpus_total} GPU{share})")
        items.append(item)
    free = Text()
    free.append(" · ", style="green")
    free.append(" free GPU")
    items.append(free)
    return Columns(items, padding=(0, 2))


def histogram_line(hist: Mapping[int, int]) -> str:
    total = max(hist.values(), default=1)
    return "\n".join(
        f"{k:>3} free: {'█' * max(1, round(v / total * 30))} {v}" for k, v in sorted(hist.items())
    )
