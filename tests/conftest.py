"""Fixtures shared by every area's tests."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

import pytest

REPO = Path(__file__).resolve().parents[1]


def trace_dir() -> Path | None:
    """The Alibaba openb trace: $GPUDEFRAG_TRACE_DIR, else ../shared/traces/alibaba-gpu-v2023 beside the repo."""
    env = os.environ.get("GPUDEFRAG_TRACE_DIR")
    cand = Path(env) if env else REPO.parent / "shared" / "traces" / "alibaba-gpu-v2023"
    return cand if (cand / "openb_node_list_gpu_node.csv").is_file() else None


def part_missing(part: str, msg: str) -> NoReturn:
    """A real part a test needs cannot run here: fail when GPUDEFRAG_REQUIRE_<PART>=1 (CI sets it), else skip
    loudly (a developer's laptop)."""
    if os.environ.get(f"GPUDEFRAG_REQUIRE_{part}") == "1":
        pytest.fail(f"{msg} (GPUDEFRAG_REQUIRE_{part}=1)")
    warnings.warn(msg, stacklevel=2)
    print(f"\n*** {msg} ***")
    pytest.skip(msg)


@pytest.fixture(scope="session")
def require() -> Callable[[str, str], NoReturn]:
    """`part_missing`, for the real-part fixtures of other folders (they cannot import this conftest)."""
    return part_missing


@pytest.fixture(scope="session")
def alibaba_trace() -> Path:
    d = trace_dir()
    if d is None:
        part_missing("TRACE", "ALIBABA TRACE ABSENT: set GPUDEFRAG_TRACE_DIR or place the trace at "
                     f"{REPO.parent / 'shared/traces/alibaba-gpu-v2023'}; trace tests are SKIPPED")
    return d


@pytest.fixture
def cli(capsys: pytest.CaptureFixture[str]) -> Callable[[list[str]], tuple[int, str, str]]:
    """Run the `gpudefrag` command in-process: (exit code, stdout, stderr)."""
    from gpudefrag.cli.main import run

    def call(argv: list[str]) -> tuple[int, str, str]:
        try:
            run(argv)
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
        out, err = capsys.readouterr()
        return code, out, err

    return call
