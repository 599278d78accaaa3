"""What the docs and comments promise about the code is checked against the code (issue 29): every command takes
`--json`; every `gpudefrag ...` command line named in the docs, the README or a source comment exists, with the
options it names; the import rule that docs/design.md states is the one tests/core/test_imports.py enforces; the
planner is reached only through the one decision (`core/decision.py`)."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pytest
import typer.main

from gpudefrag.cli.main import app

REPO = Path(__file__).resolve().parents[2]
SRC = REPO / "src" / "gpudefrag"
ROOT = typer.main.get_command(app)


def _leaves(cmd: Any, path: str = "") -> list[tuple[str, Any]]:
    if hasattr(cmd, "commands"):  # a group
        return [x for name, sub in cmd.commands.items() for x in _leaves(sub, f"{path} {name}".strip())]
    return [(path, cmd)]


def test_every_command_takes_json() -> None:
    leaves = _leaves(ROOT)
    assert len(leaves) > 20
    assert [p for p, c in leaves if not any("--json" in prm.opts for prm in c.params)] == []


def _problems(span: str) -> list[str]:
    """What is wrong with one `gpudefrag ...` command line: a command that does not exist, an option it does not
    take, or a word after a command that takes no arguments. `a|b` alternatives are each checked."""
    toks = span.replace("\\|", "|").split()
    out = []
    for first in toks[0].split("|"):
        c, used = ROOT, 0
        line = [first, *toks[1:]]
        for t in line:
            if hasattr(c, "commands") and t.split("|")[0] in c.commands:
                for alt in t.split("|"):
                    if alt not in c.commands:
                        out.append(f"no command {alt!r}")
                c, used = c.commands[t.split("|")[0]], used + 1
            else:
                break
        rest = toks[used:]
        if used == 0 or hasattr(c, "commands"):
            if used == 0 or (rest and not rest[0].startswith(("-", "[", "<", "…", "..."))):
                out.append(f"no command {' '.join(line[: used + 1])!r}")
            continue
        opts = {o for prm in c.params for o in [*prm.opts, *getattr(prm, "secondary_opts", [])]}
        takes_args = any(type(prm).__name__.endswith("Argument") for prm in c.params)
        if rest and re.fullmatch(r"[a-z][a-z-]+", rest[0]) and not takes_args:
            out.append(f"`{' '.join(line[:used])}` takes no argument {rest[0]!r}")
        for t in rest:
            o = t.split("=")[0].rstrip(",.;:)]")
            if re.fullmatch(r"--[a-z][a-z0-9-]*", o) and o not in opts and o != "--help":
                out.append(f"`{' '.join(line[:used])}` has no option {o}")
    return out


def _command_lines() -> list[tuple[str, str]]:
    files = [*SRC.rglob("*.py"), *(REPO / "docs").glob("*.md"), REPO / "README.md"]
    return [(str(p.relative_to(REPO)), m.group(1)) for p in files for m in re.finditer(r"`gpudefrag ([^`\n]+)`",
                                                                                          p.read_text())]


def test_every_named_command_exists() -> None:
    lines = _command_lines()
    assert len(lines) > 50
    bad = [(where, span, why) for where, span in lines for why in _problems(span)]
    assert bad == []


@pytest.mark.parametrize(("span", "said"), [
    ("controller request", "takes no argument 'request'"),  # the comment issue 29 found
    ("controller --request", "has no option --request"),
    ("checkpoints list|prune", "no command 'prune'"),
    ("kube plan --policy p.yaml --costs c.yaml --json", None),
])
def test_the_command_check_can_fail(span: str, said: str | None) -> None:
    got = _problems(span)
    assert (said is None and got == []) or any(said in g for g in got), got


def _layer_table() -> dict[str, int]:
    tree = ast.parse((REPO / "tests" / "core" / "test_imports.py").read_text())
    node = next(n for n in tree.body if isinstance(n, ast.Assign) and getattr(n.targets[0], "id", "") == "LAYER")
    return ast.literal_eval(node.value)  # type: ignore[no-any-return]


def test_the_import_rule_in_the_docs_is_the_enforced_one() -> None:
    text = (REPO / "docs" / "design.md").read_text()
    m = re.search(r"Imports point downwards only: (.+?)\.\s", text, re.S)
    assert m, "docs/design.md no longer states the import rule"
    stated = {name: k for k, group in enumerate(m.group(1).split("←")) for name in re.findall(r"`(\w+)`", group)}
    assert stated == _layer_table()


def test_the_planner_is_reached_only_through_the_decision() -> None:
    """`decide`/`decide_pending` are the only callers of the planner's entries; every door calls them."""
    entries = {"plan_moves", "plan_for", "plans_in_turn", "plan_all_pending"}
    callers = set()
    for p in SRC.rglob("*.py"):
        mod = str(p.relative_to(SRC))
        for n in ast.walk(ast.parse(p.read_text())):
            if isinstance(n, ast.ImportFrom) and entries & {a.name for a in n.names}:
                callers.add(mod)
            if isinstance(n, ast.ImportFrom) and (n.module or "").split(".")[-1] in (
                    "planner_exact", "planner_heuristic", "planner_problem", "planner_search"):
                callers.add(mod)
    assert {c for c in callers if not c.startswith("core/planner")} == {"core/decision.py"}
