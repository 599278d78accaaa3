"""The CUDA backend without a GPU: importable, clear errors, and the pieces that need no driver.
The path itself is proven only by scripts/gpu-check.sh on a GPU machine (docs/checkpoint.md)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpudefrag.checkpoint import cuda
from gpudefrag.checkpoint.protocol import CheckpointError

HAVE_BINDINGS = importlib.util.find_spec("cuda") is not None


def test_module_imports_without_cuda_bindings() -> None:
    assert cuda.CudaBackend.name == "cuda" and "gpudefrag[gpu]" in cuda.INSTALL_HINT


@pytest.mark.skipif(HAVE_BINDINGS, reason="cuda-bindings installed: the missing-package error cannot occur")
def test_backend_without_bindings_is_a_clear_unavailable_error() -> None:
    with pytest.raises(CheckpointError) as e:
        cuda.CudaBackend()
    assert e.value.reason == "unavailable" and "cuda-bindings" in e.value.detail


def test_cli_cuda_backend_refuses_with_exit_2(run_cli, tmp_path) -> None:
    """Without a usable GPU stack (the case on every development machine), one line and exit 2."""
    if HAVE_BINDINGS:
        try:
            cuda.load_driver()
            pytest.skip("a working CUDA driver is present: this is the no-GPU error path")
        except CheckpointError:
            pass
    r = run_cli("checkpoint", "--pid", "1", "--backend", "cuda", "--json", "--store", str(tmp_path / "s"),
                "--key", str(tmp_path / "k"))
    assert r.returncode == 2 and json.loads(r.stdout)["reason"] == "unavailable"


def test_uuid_round_trip() -> None:
    raw = bytes(range(16))
    text = cuda.format_uuid(raw)
    assert text == "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f"
    assert cuda.parse_uuid(text) == raw
    with pytest.raises(ValueError):
        cuda.parse_uuid("GPU-1234")


def test_remap_pairs_gpus_of_the_same_model_in_order() -> None:
    a, b, c, d = (cuda.format_uuid(bytes([i]) * 16) for i in range(1, 5))
    assert cuda.remap({a: "H200", b: "H200"}, {a: "H200", b: "H200", c: "H200"}) == {a: a, b: b}
    assert cuda.remap({a: "H200", b: "H200"}, {c: "H200", d: "H200"}) == {a: c, b: d}
    with pytest.raises(CheckpointError, match="models differ"):
        cuda.remap({a: "H200"}, {c: "A100"})
    with pytest.raises(CheckpointError, match="2 GPUs"):
        cuda.remap({a: "H200", b: "H200"}, {c: "H200"})


def test_process_tree_finds_descendants() -> None:
    p = subprocess.Popen([sys.executable, "-c", "import subprocess,sys,time; "
                          "c=subprocess.Popen(['sleep','30']); time.sleep(30)"])
    try:
        deadline = time.monotonic() + 10
        tree = cuda.process_tree(p.pid)
        while len(tree) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
            tree = cuda.process_tree(p.pid)
        assert tree[0] == p.pid and len(tree) == 2
        child = tree[1]
        assert Path(f"/proc/{child}/cmdline").read_text().startswith("sleep")
    finally:
        for pid in cuda.process_tree(p.pid)[::-1]:
            subprocess.run(["kill", "-9", str(pid)])
        p.wait()


def test_every_backend_implements_the_protocol() -> None:
    from gpudefrag.checkpoint.app_hook import AppHookBackend
    from gpudefrag.checkpoint.criu import CriuBackend
    from gpudefrag.checkpoint.protocol import CheckpointBackend

    assert isinstance(AppHookBackend(), CheckpointBackend)
    for cls in (CriuBackend, cuda.CudaBackend):  # instantiating needs criu / a GPU: check the class
        assert all(callable(getattr(cls, m, None)) for m in ("checkpoint", "restore", "version"))
    assert issubclass(cuda.CudaBackend, CriuBackend)
