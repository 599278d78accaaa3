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
        def cmdline(pid: int) -> str:
            return Path(f"/proc/{pid}/cmdline").read_text()

        # the child is in the tree from its fork; its cmdline reads empty until its exec of `sleep` is done (a
        # loaded machine showed that window), so wait for both
        deadline = time.monotonic() + 10
        tree = cuda.process_tree(p.pid)
        while (len(tree) < 2 or not cmdline(tree[1]).startswith("sleep")) and time.monotonic() < deadline:
            time.sleep(0.05)
            tree = cuda.process_tree(p.pid)
        assert tree[0] == p.pid and len(tree) == 2
        assert cmdline(tree[1]).startswith("sleep")
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


class FakeDriver:
    """Stands in for the CUDA driver, which cannot run here: a per-process state machine with the driver's
    rules (lock only RUNNING, checkpoint only LOCKED, ...). The process's CUDA state lives in its memory, so a
    process CRIU restores from a checkpointed one is CHECKPOINTED too."""

    def __init__(self, cuda_marker: bytes):
        self.marker = cuda_marker
        self.state: dict[int, int] = {}
        self.calls: list[tuple[str, int]] = []
        self.checkpointed_once = False

    def _is_cuda(self, pid: int) -> bool:
        try:
            return self.marker in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            return False

    def cuCheckpointProcessGetState(self, pid: int):
        if not self._is_cuda(pid):
            return (201, None)  # CUDA_ERROR_INVALID_CONTEXT-like: not a CUDA process
        default = cuda.CHECKPOINTED if self.checkpointed_once else cuda.RUNNING
        return (0, self.state.setdefault(pid, default))

    def _step(self, name: str, pid: int, frm: int, to: int):
        self.calls.append((name, pid))
        if self.state.get(pid) != frm:
            return (999,)
        self.state[pid] = to
        return (0,)

    def cuCheckpointProcessLock(self, pid, args):
        assert args.timeoutMs > 0
        return self._step("lock", pid, cuda.RUNNING, cuda.LOCKED)

    def cuCheckpointProcessCheckpoint(self, pid, args):
        self.checkpointed_once = True
        return self._step("checkpoint", pid, cuda.LOCKED, cuda.CHECKPOINTED)

    def cuCheckpointProcessRestore(self, pid, args):
        return self._step("restore", pid, cuda.CHECKPOINTED, cuda.LOCKED)

    def cuCheckpointProcessUnlock(self, pid, args):
        return self._step("unlock", pid, cuda.LOCKED, cuda.RUNNING)

    class CUcheckpointLockArgs:
        timeoutMs = 0

    def cuDeviceGetCount(self):
        return (0, 2)

    def cuDeviceGet(self, i):
        return (0, i)

    def cuDeviceGetName(self, n, dev):
        return (0, b"NVIDIA H200\0\0")

    def cuDeviceGetUuid(self, dev):
        class U:
            bytes = bytes([dev + 1]) * 16
        return (0, U())

    def cuDriverGetVersion(self):
        return (0, 12080)


@pytest.mark.criu
def test_cuda_call_sequence_around_real_criu(criu, store, probes) -> None:
    """Lock and checkpoint before the dump, restore and unlock after the CRIU restore — on the restored PID —,
    and the GPU facts land in the manifest. The CRIU part and the process are real; only the driver is fake."""
    from gpudefrag.checkpoint import probe_job
    from gpudefrag.checkpoint.operations import checkpoint_to_store, restore_from_store

    job, log = probes.start(pidns=True)
    fake = FakeDriver(str(log).encode())
    be = cuda.CudaBackend(_drv=fake)
    m, res = checkpoint_to_store(store, be, job.pid, "gpu-job")
    assert fake.calls == [("lock", job.pid), ("checkpoint", job.pid)]
    assert res.mode == "cuda+dump" and m.backend == "cuda" and m.info["cuda_pids"] == [job.pid]
    assert m.gpus == {cuda.format_uuid(b"\x01" * 16): "NVIDIA H200", cuda.format_uuid(b"\x02" * 16): "NVIDIA H200"}
    assert (m.compat.gpu_model, m.compat.gpu_count, m.compat.cuda) == ("NVIDIA H200", 2, "12.8")
    job.reap()
    at_dump = probe_job.last_step(log)
    _, rr = restore_from_store(store, m.id, be)
    probes.track(rr.pid)
    assert fake.calls[2:] == [("restore", rr.pid), ("unlock", rr.pid)] and rr.pid != job.pid
    probe_job.wait_step(log, at_dump + 2)
    probes.stop(rr.pid, log)
    assert probe_job.check_log(log).ok


@pytest.mark.criu
def test_cuda_failed_dump_gives_the_gpu_back(criu, probes, tmp_path) -> None:
    job, log = probes.start()
    fake = FakeDriver(str(log).encode())
    be = cuda.CudaBackend(_drv=fake)
    with pytest.raises(CheckpointError):
        be.checkpoint(job.pid, tmp_path / "no-such-folder")
    assert [c for c, _ in fake.calls] == ["lock", "checkpoint", "restore", "unlock"]
    assert fake.state[job.pid] == cuda.RUNNING and Path(f"/proc/{job.pid}").exists()


@pytest.mark.criu
def test_cuda_heartbeat_restores_and_unlocks_the_source(criu, tmp_path, probes) -> None:
    job, log = probes.start()
    fake = FakeDriver(str(log).encode())
    be = cuda.CudaBackend(_drv=fake)
    (tmp_path / "img").mkdir()
    res = be.checkpoint(job.pid, tmp_path / "img", leave_running=True)
    assert [c for c, _ in fake.calls] == ["lock", "checkpoint", "restore", "unlock"]
    assert fake.state[job.pid] == cuda.RUNNING and "cuda_restore_s" in res.extra
