"""CUDA backend: the CUDA driver's checkpoint API around a CRIU dump and restore (optional extra `gpu`).

CRIU cannot save GPU memory. The driver can move it to host memory inside the process and back:

    checkpoint:  cuCheckpointProcessLock (CUDA calls block) -> cuCheckpointProcessCheckpoint (device memory
                 copied into the process's host memory, GPU handles released) -> CRIU dump of the process
                 (--leave-running: then Restore + Unlock so the job continues)
    restore:     CRIU restore -> cuCheckpointProcessRestore (memory back onto this node's GPUs, UUIDs remapped
                 old -> new when the GPUs differ) -> cuCheckpointProcessUnlock

Needs an NVIDIA driver with the checkpoint API (r570+/CUDA 12.8+) and `cuda-bindings` (`pip install
'gpudefrag[gpu]'`). UNVERIFIED here: the development machines have no GPU. `scripts/gpu-check.sh` proves it
on a GPU machine. Everything that can be checked without one (import guard, clear errors, process-tree walk,
UUID mapping) is unit-tested.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..core.model import Versions
from .criu import CriuBackend
from .launch import process_tree
from .protocol import CHECKPOINT_FAILED, RESTORE_FAILED, UNAVAILABLE, CheckpointError, CheckpointResult

INSTALL_HINT = "pip install 'gpudefrag[gpu]' (cuda-bindings) on a machine with an NVIDIA driver >= 570"
# CUprocessState values
RUNNING, LOCKED, CHECKPOINTED, FAILED = 0, 1, 2, 3


def load_driver() -> Any:
    """`cuda.bindings.driver` with cuInit done, or CheckpointError(unavailable) saying what is missing."""
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found]
    except ImportError:
        try:
            from cuda import cuda as driver  # type: ignore[import-not-found,no-redef]  # cuda-python < 12.6
        except ImportError:
            raise CheckpointError(UNAVAILABLE, f"the CUDA backend needs cuda-bindings: {INSTALL_HINT}") from None
    missing = [n for n in ("cuCheckpointProcessLock", "cuCheckpointProcessCheckpoint",
                           "cuCheckpointProcessRestore", "cuCheckpointProcessUnlock", "cuCheckpointProcessGetState")
               if not hasattr(driver, n)]
    if missing:
        raise CheckpointError(UNAVAILABLE, f"cuda-bindings lacks {', '.join(missing)} (needs >= 12.8)")
    try:
        (err,) = driver.cuInit(0)
    except RuntimeError as e:  # libcuda.so not found: no NVIDIA driver
        raise CheckpointError(UNAVAILABLE, f"no NVIDIA driver (libcuda): {e}") from None
    if int(err) != 0:
        raise CheckpointError(UNAVAILABLE, f"cuInit failed ({_name(err)}): no usable NVIDIA GPU/driver")
    return driver


def _name(err: Any) -> str:
    return getattr(err, "name", str(err))


def format_uuid(raw: bytes) -> str:
    """16 raw bytes -> 'GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx' (nvidia-smi's form)."""
    h = raw.hex()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def parse_uuid(text: str) -> bytes:
    h = text.removeprefix("GPU-").replace("-", "")
    raw = bytes.fromhex(h)
    if len(raw) != 16:
        raise ValueError(f"not a GPU UUID: {text!r}")
    return raw


def remap(checkpointed: dict[str, str], here: dict[str, str]) -> dict[str, str]:
    """Old UUID -> new UUID, pairing GPUs in order; identity when the same GPUs are present. The driver wants a
    pair for every GPU it sees, so a target with fewer GPUs than the checkpoint cannot be mapped."""
    old, new = sorted(checkpointed), sorted(here)
    if set(old) <= set(new):
        return {u: u for u in old}
    if len(new) < len(old):
        raise CheckpointError(RESTORE_FAILED, f"checkpoint used {len(old)} GPUs, this node has {len(new)}")
    models_old = [checkpointed[u] for u in old]
    models_new = [here[u] for u in new[:len(old)]]
    if models_old != models_new:
        raise CheckpointError(RESTORE_FAILED, f"GPU models differ: checkpoint {models_old}, here {models_new}")
    return dict(zip(old, new, strict=False))


def driver_release() -> str | None:
    """'570.86.15' from /proc/driver/nvidia/version (the kernel module's release), if present."""
    try:
        text = Path("/proc/driver/nvidia/version").read_text()
    except OSError:
        return None
    import re

    m = re.search(r"Kernel Module\s+(?:for \S+\s+)?([\d.]+)", text)
    return m.group(1) if m else None


@dataclass
class CudaBackend(CriuBackend):
    name: str = "cuda"
    lock_timeout_ms: int = 30_000
    _drv: Any = field(default=None, repr=False)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self._drv is None:  # a driver object may be passed in (tests drive the call sequence with a fake)
            self._drv = load_driver()

    # -- facts ----------------------------------------------------------------------------------------
    def gpu_map(self) -> dict[str, str]:
        d = self._drv
        err, n = d.cuDeviceGetCount()
        self._ok(err, "cuDeviceGetCount")
        out = {}
        for i in range(n):
            err, dev = d.cuDeviceGet(i)
            self._ok(err, "cuDeviceGet")
            err, name = d.cuDeviceGetName(256, dev)
            self._ok(err, "cuDeviceGetName")
            err, uuid = d.cuDeviceGetUuid(dev)
            self._ok(err, "cuDeviceGetUuid")
            raw = uuid.bytes  # bytes in current cuda-bindings; some releases gave a latin-1 str
            raw = raw.encode("latin-1") if isinstance(raw, str) else bytes(raw)
            label = name if isinstance(name, str) else name.split(b"\0", 1)[0].decode(errors="replace")
            out[format_uuid(raw[:16])] = label.split("\0", 1)[0]
        return out

    def gpu_versions(self) -> Versions:
        gpus = self.gpu_map()
        err, v = self._drv.cuDriverGetVersion()
        self._ok(err, "cuDriverGetVersion")
        models = sorted(set(gpus.values()))
        return Versions(gpu_model=models[0] if len(models) == 1 else ",".join(models) or None,
                        gpu_count=len(gpus), driver=driver_release(), cuda=f"{v // 1000}.{v % 1000 // 10}")

    def _ok(self, err: Any, what: str, pid: int | None = None) -> None:
        if int(err) != 0:
            on = f" on PID {pid}" if pid else ""
            raise CheckpointError(CHECKPOINT_FAILED, f"{what}{on} failed: {_name(err)}")

    def state(self, pid: int) -> int | None:
        """The process's CUDA checkpoint state, or None when it is not a CUDA process."""
        err, st = self._drv.cuCheckpointProcessGetState(pid)
        return None if int(err) != 0 else int(st)

    def cuda_pids(self, pid: int) -> list[int]:
        return [p for p in process_tree(pid) if self.state(p) is not None]

    # -- the driver calls -----------------------------------------------------------------------------
    def lock_and_checkpoint(self, pids: list[int]) -> dict[str, float]:
        d = self._drv
        t0 = time.perf_counter()
        args = d.CUcheckpointLockArgs()
        args.timeoutMs = self.lock_timeout_ms
        for p in pids:
            (err,) = d.cuCheckpointProcessLock(p, args)
            self._ok(err, "cuCheckpointProcessLock", p)
        t1 = time.perf_counter()
        for p in pids:
            (err,) = d.cuCheckpointProcessCheckpoint(p, None)
            self._ok(err, "cuCheckpointProcessCheckpoint", p)
        return {"cuda_lock_s": t1 - t0, "cuda_checkpoint_s": time.perf_counter() - t1}

    def restore_and_unlock(self, pids: list[int], mapping: dict[str, str] | None = None) -> float:
        d = self._drv
        t0 = time.perf_counter()
        args = None
        if mapping and any(k != v for k, v in mapping.items()):
            args = d.CUcheckpointRestoreArgs()
            pairs, keep = [], []  # keep: the byte buffers the CUuuid views point into, alive for the call
            for old, new in mapping.items():
                pair = d.CUcheckpointGpuPair()
                pair.oldUuid = self._cuuuid(old, keep)
                pair.newUuid = self._cuuuid(new, keep)
                pairs.append(pair)
            args.gpuPairs = pairs
            args.gpuPairsCount = len(pairs)
        for p in pids:
            if self.state(p) == CHECKPOINTED:
                (err,) = d.cuCheckpointProcessRestore(p, args)
                self._ok(err, "cuCheckpointProcessRestore", p)
        for p in pids:
            if self.state(p) == LOCKED:
                (err,) = d.cuCheckpointProcessUnlock(p, None)
                self._ok(err, "cuCheckpointProcessUnlock", p)
        return time.perf_counter() - t0

    def _cuuuid(self, text: str, keep: list[Any]) -> Any:
        import ctypes

        buf = ctypes.create_string_buffer(parse_uuid(text), 16)
        keep.append(buf)
        return self._drv.CUuuid(ctypes.addressof(buf))

    # -- the backend ----------------------------------------------------------------------------------
    def checkpoint(self, target: int, dest: Path, *, leave_running: bool = False, precopy: bool = False,
                   **kw: Any) -> CheckpointResult:
        pid = int(target)
        pids = self.cuda_pids(pid)
        gpus = self.gpu_map()
        t0 = time.perf_counter()
        times = self.lock_and_checkpoint(pids) if pids else {}
        try:
            res = super().checkpoint(pid, dest, leave_running=leave_running, precopy=precopy, **kw)
        except BaseException:
            if pids:
                self.restore_and_unlock(pids)  # the dump failed: give the job its GPU back
            raise
        if leave_running and pids:
            times["cuda_restore_s"] = self.restore_and_unlock(pids)
        extra = {**res.extra, **times, "gpus": gpus, "cuda_pids": pids}
        notes = res.notes if pids else (*res.notes, "no CUDA process in the tree: a plain CRIU dump")
        return CheckpointResult(**{**res.as_dict(), "backend": self.name, "mode": f"cuda+{res.mode}",
                                   "duration_s": time.perf_counter() - t0, "extra": extra, "notes": notes})

    def _after_restore(self, pid: int, info: dict[str, Any]) -> None:
        if not info.get("cuda_pids"):
            return
        mapping = remap(info.get("gpus") or {}, self.gpu_map())
        pids = self.cuda_pids(pid) or [pid]
        try:
            self.restore_and_unlock(pids, mapping)
        except CheckpointError as e:
            raise CheckpointError(RESTORE_FAILED, f"CRIU restored PID {pid} but its GPU state did not come back: "
                                  f"{e.detail}") from None
