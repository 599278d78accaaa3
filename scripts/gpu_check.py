#!/usr/bin/env python3
"""Prove the CUDA checkpoint path on a GPU machine: a PyTorch process holding tensors on the GPU is
checkpointed through gpudefrag's CUDA backend (driver checkpoint API + CRIU), killed, restored, and its tensors
and step counter are verified. Prints times and GB/s, and writes them as JSON.

    python3 scripts/gpu_check.py [--gib 1,4] [--out results.json]     (run by scripts/gpu-check.sh)
    python3 scripts/gpu_check.py --job --log L --gib N                 (the GPU job itself)

The job writes the same log format as gpudefrag.checkpoint.probe_job (START/step/CHECKSUM lines with a hash
chain), so `probe_job.check_log` judges it: steps contiguous, never from zero, the tensor's SHA-256 unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import signal
import sys
import time
from pathlib import Path


def run_job(log_path: str, gib: float, seed: int) -> int:
    """The GPU job: `gib` GiB of seeded random floats on cuda:0, a step counter that also touches the GPU."""
    import torch

    from gpudefrag.checkpoint.probe_job import SEED_CHAIN, next_chain

    n = int(gib * (1 << 30)) // 4
    g = torch.Generator(device="cuda").manual_seed(seed)
    t = torch.randn(n, device="cuda", generator=g)
    acc = torch.zeros(1, device="cuda", dtype=torch.float64)
    fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)

    def log(line: str) -> None:
        os.write(fd, (line + "\n").encode())

    def checksum() -> str:
        h = hashlib.sha256()
        chunk = 1 << 26
        for off in range(0, n, chunk):
            h.update(t[off:off + chunk].cpu().numpy().tobytes())
        return h.hexdigest()

    flags = {"sum": False, "stop": False}
    signal.signal(signal.SIGUSR1, lambda *_: flags.__setitem__("sum", True))
    signal.signal(signal.SIGTERM, lambda *_: flags.__setitem__("stop", True))
    step, chain = 0, SEED_CHAIN
    log(f"START pid={os.getpid()} gib={gib} sha256={checksum()}")
    while not flags["stop"]:
        time.sleep(0.1)
        acc += t[: 1 << 20].double().sum()  # the GPU is used every step
        torch.cuda.synchronize()
        step += 1
        chain = next_chain(chain, step)
        log(f"step={step} chain={chain.hex()[:16]} t={time.time():.3f} pid={os.getpid()}")
        if flags["sum"]:
            flags["sum"] = False
            log(f"CHECKSUM step={step} sha256={checksum()}")
    log(f"EXIT step={step}")
    return 0


def check_one(gib: float, work: Path, leave_running: bool, pidns: bool = True) -> dict[str, object]:
    from gpudefrag.checkpoint import probe_job
    from gpudefrag.checkpoint.cuda import CudaBackend
    from gpudefrag.checkpoint.launch import spawn_job
    from gpudefrag.checkpoint.operations import checkpoint_to_store, restore_from_store
    from gpudefrag.checkpoint.store import CheckpointStore

    row: dict[str, object] = {"gib": gib, "leave_running": leave_running}
    be = CudaBackend()
    store = CheckpointStore(work / "store", work / "key", durable=False)
    log = work / f"gpu-{gib}-{int(leave_running)}.log"
    job = spawn_job([sys.executable, __file__, "--job", "--log", str(log), "--gib", str(gib)],
                    stdout=work / f"gpu-{gib}.out", pidns=pidns)
    pids = [job.pid]
    try:
        probe_job.wait_step(log, 2, timeout=300)
        sha = probe_job.request_checksum(log, job.pid, timeout=300)
        m, res = checkpoint_to_store(store, be, job.pid, "gpu-check", leave_running=leave_running)
        if leave_running:
            probe_job.wait_step(log, probe_job.last_step(log) + 2)  # still running on the GPU
            os.kill(job.pid, signal.SIGKILL)
        job.reap()
        at_dump = probe_job.last_step(log)
        gb = m.total_bytes / 1e9
        row.update(mode=res.mode, image_gb=round(gb, 3), checkpoint_s=round(res.duration_s, 3),
                   frozen_s=res.frozen_s, checkpoint_GBps=round(gb / res.duration_s, 2),
                   cuda_lock_s=res.extra.get("cuda_lock_s"), cuda_checkpoint_s=res.extra.get("cuda_checkpoint_s"),
                   gpus=m.gpus, compat=m.compat.model_dump())
        t0 = time.perf_counter()
        _, rr = restore_from_store(store, m.id)
        restore_s = time.perf_counter() - t0
        pids.append(rr.pid)
        row.update(restore_s=round(restore_s, 3), restore_GBps=round(gb / restore_s, 2))
        if not leave_running:
            probe_job.wait_step(log, at_dump + 3, timeout=120)
        else:
            time.sleep(1.0)
        row["tensor_sha_equal"] = probe_job.request_checksum(log, rr.pid, timeout=300) == sha
        os.kill(rr.pid, signal.SIGTERM)
        deadline = time.monotonic() + 60
        while "EXIT" not in log.read_text() and time.monotonic() < deadline:
            time.sleep(0.1)
        rep = probe_job.check_log(log)
        row["steps_ok"] = rep.ok or leave_running  # a heartbeat restore repeats the steps after the snapshot
        row["problems"] = rep.problems[:3]
        row["ok"] = bool(row["tensor_sha_equal"] and row["steps_ok"])
    except Exception as e:  # record and go on to the next size
        row.update(ok=False, error=f"{type(e).__name__}: {e}")
    finally:
        for p in pids:  # only our own job: a PID that exited may have been reused
            with contextlib.suppress(FileNotFoundError, ProcessLookupError):
                if str(log).encode() in Path(f"/proc/{p}/cmdline").read_bytes():
                    os.kill(p, signal.SIGKILL)
    return row


def gpu_mib_used(pid: int) -> int | None:
    """Device memory nvidia-smi charges to `pid` (MiB), or None where nvidia-smi cannot say (e.g. gVisor)."""
    import subprocess

    try:
        out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == 2 and fields[0] == str(pid) and fields[1].isdigit():
            return int(fields[1])
    return None


def check_in_place(gib: float, work: Path) -> dict[str, object]:
    """The driver half alone, no CRIU: lock -> checkpoint (device memory into the process's host memory, GPU
    released) -> restore -> unlock on a live process, then check its tensors and step chain. It is what a CUDA
    checkpoint does around the CRIU dump, so it proves the cuda-bindings calls against this driver even where
    CRIU cannot run (gVisor)."""
    from gpudefrag.checkpoint import probe_job
    from gpudefrag.checkpoint.cuda import CHECKPOINTED, CudaBackend
    from gpudefrag.checkpoint.launch import spawn_job

    row: dict[str, object] = {"gib": gib, "mode": "in-place"}
    be = CudaBackend()
    log = work / f"gpu-inplace-{gib}.log"
    job = spawn_job([sys.executable, __file__, "--job", "--log", str(log), "--gib", str(gib)],
                    stdout=work / f"gpu-inplace-{gib}.out", pidns=False)
    try:
        probe_job.wait_step(log, 2, timeout=300)
        sha = probe_job.request_checksum(log, job.pid, timeout=300)
        pids = be.cuda_pids(job.pid)
        row["cuda_pids"] = len(pids)
        row["gpu_mib_before"] = gpu_mib_used(job.pid)
        times = be.lock_and_checkpoint(pids)
        row.update({k: round(v, 3) for k, v in times.items()})
        row["state_after_checkpoint"] = [be.state(p) for p in pids]
        row["checkpointed"] = all(be.state(p) == CHECKPOINTED for p in pids)
        row["gpu_mib_while_checkpointed"] = gpu_mib_used(job.pid)
        at = probe_job.last_step(log)
        time.sleep(1.0)
        row["steps_while_locked"] = probe_job.last_step(log) - at  # CUDA calls block while locked
        row["restore_unlock_s"] = round(be.restore_and_unlock(pids), 3)
        probe_job.wait_step(log, probe_job.last_step(log) + 3, timeout=120)
        row["tensor_sha_equal"] = probe_job.request_checksum(log, job.pid, timeout=300) == sha
        os.kill(job.pid, signal.SIGTERM)
        job.reap()
        rep = probe_job.check_log(log)
        row["steps_ok"], row["problems"] = rep.ok, rep.problems[:3]
        row["ok"] = bool(row["checkpointed"] and row["tensor_sha_equal"] and rep.ok)
    except Exception as e:  # record and go on to the next size
        row.update(ok=False, error=f"{type(e).__name__}: {e}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(job.pid, signal.SIGKILL)
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--job", action="store_true")
    ap.add_argument("--log")
    ap.add_argument("--gib", default="1,4")
    ap.add_argument("--seed", type=int, default=3)
    ap.add_argument("--work", default="/dev/shm/gpudefrag-gpu-check")
    ap.add_argument("--out", default="gpu-check.json")
    ap.add_argument("--in-place", action="store_true", help="only the CUDA driver half (lock, checkpoint, "
                    "restore, unlock a live process), no CRIU: what can be proven where CRIU cannot run")
    ap.add_argument("--no-pidns", action="store_true", help="run the job in the host PID namespace (then a "
                    "restore needs its old PID free)")
    a = ap.parse_args()
    if a.job:
        return run_job(a.log, float(a.gib), a.seed)
    import shutil

    from gpudefrag.checkpoint.cuda import CudaBackend
    from gpudefrag.checkpoint.protocol import CheckpointError

    try:
        be = CudaBackend()
        if not a.in_place:
            be.check()
    except CheckpointError as e:
        print(f"gpu-check: {e}", file=sys.stderr)
        return 2
    work = Path(a.work)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    env = {"criu": None if a.in_place else be.version(), "gpu": be.gpu_versions().__repr__(), "gpus": be.gpu_map()}
    print(json.dumps(env), flush=True)
    rows = []
    for gib in [float(x) for x in a.gib.split(",")]:
        for leave in (False, True) if gib == float(a.gib.split(",")[0]) and not a.in_place else (False,):
            row = check_in_place(gib, work) if a.in_place else check_one(gib, work, leave, pidns=not a.no_pidns)
            print(json.dumps(row), flush=True)
            rows.append(row)
    Path(a.out).write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    print("\n| GiB | mode | image GB | checkpoint s | frozen s | GB/s | restore s | GB/s | tensors | steps |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['gib']} | {r.get('mode', '-')} | {r.get('image_gb', '-')} | {r.get('checkpoint_s', '-')} | "
              f"{r.get('frozen_s', '-')} | {r.get('checkpoint_GBps', '-')} | {r.get('restore_s', '-')} | "
              f"{r.get('restore_GBps', '-')} | {r.get('tensor_sha_equal', r.get('error', '-'))} | "
              f"{r.get('steps_ok', '-')} |")
    shutil.rmtree(work, ignore_errors=True)
    return 0 if rows and all(r.get("ok") for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
