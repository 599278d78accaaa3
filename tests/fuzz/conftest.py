"""Hostile inputs for every reader: the values, the special files, and the console script that must survive them.

The rule (issue 15): whatever the file holds or is, a reader ends in one line naming the file, exit 2 (1 where a
command documents it), no traceback, in bounded time and memory.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpudefrag.demo import demo_state
from gpudefrag.snapshot import state_to_dict

REPO = Path(__file__).resolve().parents[2]
SENTINEL = "__HOSTILE__"

# JSON text that replaces one value of a valid document. Each one crashed or hung some reader before issue 15.
JSON_TOKENS = [
    "9" * 5000,  # past Python's int-str digit limit
    "-" + "9" * 30,  # past int64
    str(10**30),
    "9223372036854775808",  # 2**63
    "1e308", "1e309", "-1e400",  # the last two overflow to infinity
    "NaN", "Infinity", "-Infinity",
    "[" * 100_000 + "]" * 100_000,  # RecursionError
    "{" + '"a":' * 3000 + "1" + "}" * 3000,  # unbalanced on purpose: deep and truncated
    '{"a": 1, "a": 2}',  # duplicate keys
    '"\\ud800"',  # a lone surrogate
]
YAML_TOKENS = [
    "9" * 5000, str(10**30), "0x" + "f" * 40, ".nan", ".inf", "-.inf", "1.0e999",
    "[" * 100_000 + "]" * 100_000, "{a: 1, a: 2}", "&a [1]", "*a",
]


def paths(doc: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every place in a document that holds a value."""
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield (*prefix, k)
            yield from paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield (*prefix, i)
            yield from paths(v, (*prefix, i))


def with_token(doc: Any, where: tuple[Any, ...], token: str, fmt: str = "json") -> str:
    """`doc` serialised with the value at `where` replaced by the raw text `token`."""
    d = json.loads(json.dumps(doc))
    cur = d
    for k in where[:-1]:
        cur = cur[k]
    cur[where[-1]] = SENTINEL
    if fmt == "yaml":
        return yaml.safe_dump(d, default_flow_style=False, width=10**9).replace(SENTINEL, token, 1)
    return json.dumps(d).replace(f'"{SENTINEL}"', token, 1)


def snapshot_doc() -> dict[str, Any]:
    return state_to_dict(demo_state())


def dump_doc() -> dict[str, Any]:
    return json.loads((REPO / "tests/kubernetes/fixtures/fragmentation.json").read_text())


def policy_doc() -> dict[str, Any]:
    return yaml.safe_load((REPO / "examples/policies/default.yaml").read_text())


def cost_doc() -> dict[str, Any]:
    return {"checkpoint_gbps": 4, "overhead_s": 0, "shared_storage": False,
            "links": [{"source": "a", "target": "b", "gbps": 10}],
            "history": [{"source": "a", "target": "c", "bytes": 10**10, "checkpoint_s": 1, "transfer_s": 4,
                         "restore_s": 5}]}


NODES_CSV = "sn,cpu_milli,memory_mib,gpu,model\nn1,96000,786432,8,V100M32\nn2,96000,786432,8,V100M32\n"
PODS_CSV = ("name,cpu_milli,memory_mib,num_gpu,gpu_milli,gpu_spec,creation_time,deletion_time,scheduled_time\n"
            "p1,8000,30000,1,1000,,0,100,1\np2,4000,15000,1,500,,5,50,6\n")


def special_files(d: Path) -> dict[str, Path]:
    """Things that are not regular files, each of which once hung a reader or filled its memory."""
    fifo = d / "fifo.json"
    os.mkfifo(fifo)
    zero = d / "zero.json"
    zero.symlink_to("/dev/zero")
    null = d / "null.yaml"
    null.symlink_to("/dev/null")
    folder = d / "folder.json"
    folder.mkdir()
    to_fifo = d / "to-fifo.yaml"
    to_fifo.symlink_to(fifo)
    return {"fifo": fifo, "dev-zero-link": zero, "dev-null-link": null, "directory": folder, "link-to-fifo": to_fifo}


def gpudefrag_exe() -> list[str]:
    """The installed console script (the real entry point, with its error handling), else `python -m`."""
    exe = Path(sys.executable).parent / "gpudefrag"
    return [str(exe)] if exe.exists() else [sys.executable, "-m", "gpudefrag.cli.main"]


MEMORY_LIMIT = 3 << 30  # address space: far above a normal run, far below what /dev/zero read whole would take


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def run_cli(*args: str | Path, cwd: Path, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run `gpudefrag ARGS` as a user would, with this checkout's code first, a memory limit and a time limit
    (a hang is a TimeoutExpired, which fails the test)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")]),
           "COLUMNS": "400", "NO_COLOR": "1", "GPUDEFRAG_STATE_DIR": str(cwd / "state")}
    return subprocess.run([*gpudefrag_exe(), *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, stdin=subprocess.DEVNULL, preexec_fn=_limit_memory)


def assert_one_line_error(p: subprocess.CompletedProcess[str], name: str, codes: tuple[int, ...] = (2,)) -> None:
    err = p.stderr.strip()
    assert p.returncode in codes, (p.returncode, p.stdout[-2000:], err[-2000:])
    assert "Traceback" not in err and "Error:" not in err.split("error:", 1)[0], err[-2000:]
    assert len(err.splitlines()) == 1, err[-2000:]
    assert name in err, err


@pytest.fixture
def hostile_dir(tmp_path: Path) -> Path:
    return tmp_path
