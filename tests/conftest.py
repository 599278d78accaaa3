"""Fixtures shared by every area's tests."""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


def trace_dir() -> Path | None:
    """The Alibaba openb trace: $GPUDEFRAG_TRACE_DIR, else ../shared/traces/alibaba-gpu-v2023 beside the repo."""
    env = os.environ.get("GPUDEFRAG_TRACE_DIR")
    cand = Path(env) if env else REPO.parent / "shared" / "traces" / "alibaba-gpu-v2023"
    return cand if (cand / "openb_node_list_gpu_node.csv").is_file() else None


@pytest.fixture(scope="session")
def alibaba_trace() -> Path:
    d = trace_dir()
    if d is None:
        msg = ("ALIBABA TRACE ABSENT: set GPUDEFRAG_TRACE_DIR or place the trace at "
               f"{REPO.parent / 'shared/traces/alibaba-gpu-v2023'}; trace tests are SKIPPED")
        if os.environ.get("GPUDEFRAG_REQUIRE_TRACE") == "1":
            pytest.fail(msg)
        warnings.warn(msg, stacklevel=1)
        print(f"\n*** {msg} ***")
        pytest.skip(msg)
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
