"""A move the planner accepts is never refused at restore for compatibility: the rule the move was planned under
travels in the restore ticket the executor writes, and the job wrapper's restore gate applies it. Real files
(journal, ticket) and real CRIU; only the GPU facts are supplied (no GPU here): the checkpoint's host reports
driver 550.54.14, the restoring host 550.90.07."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from gpudefrag.checkpoint import probe_job
from gpudefrag.checkpoint.criu import CriuBackend
from gpudefrag.checkpoint.keys import load_key
from gpudefrag.checkpoint.launch import spawn_job
from gpudefrag.checkpoint.operations import checkpoint_to_store
from gpudefrag.checkpoint.protocol import CheckpointError
from gpudefrag.checkpoint.store import CheckpointStore
from gpudefrag.control.agent import FileAgent, JobDir, Ticket, read_json
from gpudefrag.control.executor import Executor
from gpudefrag.control.journal import Journal
from gpudefrag.control.journal import MigrationState as S
from gpudefrag.core.compat import CompatRule, VersionMatch
from gpudefrag.core.model import Versions
from gpudefrag.engines.sim import SimEngine
from gpudefrag.policy.models import Policy
from gpudefrag.policy.options import compat_rule
from gpudefrag.wrapper import Wrapper, WrapperConfig

from .conftest import Move


@dataclass
class GpuHostCriu(CriuBackend):
    """Real CRIU on a host whose GPU probe reports `driver` (this machine has no GPU to probe)."""

    driver: str = ""

    def gpu_versions(self) -> Versions:
        return Versions(driver=self.driver)


class FileTickets:
    """The simulated cluster answers everything but the ticket, which is written as the real file a wrapper reads."""

    def __init__(self, sim: SimEngine, files: FileAgent) -> None:
        self.sim, self.files = sim, files

    def __getattr__(self, name: str) -> Any:
        return getattr(self.sim, name)

    def set_ticket(self, workload_id: str, ticket: Ticket) -> None:
        self.sim.set_ticket(workload_id, ticket)
        self.files.set_ticket(workload_id, ticket)


@pytest.fixture
def criu_backend():  # type: ignore[no-untyped-def]
    try:
        if os.geteuid() != 0:
            raise CheckpointError("unavailable", "needs root")
        CriuBackend().check()
    except CheckpointError as e:
        if os.environ.get("GPUDEFRAG_REQUIRE_CRIU") == "1":
            pytest.fail(f"GPUDEFRAG_REQUIRE_CRIU=1 but CRIU cannot run: {e}")
        pytest.skip(f"needs CRIU as root: {e}")


def test_ticket_round_trips_the_rule_and_old_tickets_load(tmp_path: Path) -> None:
    agent = FileAgent(tmp_path / "run", None)
    rule = CompatRule(driver=VersionMatch.MAJOR, cuda=VersionMatch.AT_LEAST, strict=True)
    agent.set_ticket("w", Ticket("t1", "ck", "move", rule.as_dict()))
    doc = read_json(JobDir(tmp_path / "run", "w").ticket)
    assert doc is not None and Ticket(**doc) == Ticket("t1", "ck", "move", rule.as_dict())
    cfg = WrapperConfig([], "w", "n", tmp_path / "run", tmp_path / "store", tmp_path / "key")
    w = Wrapper(cfg, log=lambda _m: None)
    assert w.ticket_rule(doc) == rule
    assert w.ticket_rule({"id": "t0", "ckpt_id": "ck", "reason": "move"}) is None  # an old ticket: default rule
    assert w.ticket_rule({"id": "t2", "compat": {"driver": "sideways"}}) is None  # unreadable: the stricter rule


def test_a_driver_major_move_restores_and_the_default_rule_refuses(tmp_path: Path, criu_backend: None,
                                                                   state) -> None:  # type: ignore[no-untyped-def]
    run_dir, key = tmp_path / "run", tmp_path / "key"
    load_key(key, create=True)
    store = CheckpointStore(tmp_path / "store", key)
    # the job checkpointed on a host with driver 550.54.14 (stopped by the dump, as for a move)
    log = tmp_path / "job.log"
    job = spawn_job([sys.executable, "-m", "gpudefrag.checkpoint.probe_job", "--log", str(log), "--mb", "8"],
                    stdout=tmp_path / "job.out", pidns=True)
    restored: int | None = None
    try:
        probe_job.wait_step(log, 2, timeout=60)
        manifest, _ = checkpoint_to_store(store, GpuHostCriu(driver="550.54.14", log_dir=tmp_path / "l1"),
                                          job.pid, "a1")
        job.popen.wait(timeout=30)
        assert manifest.compat.driver == "550.54.14"
        # the executor moves it under a policy with `driver: major` and writes the restore ticket
        rule = compat_rule(Policy.model_validate({"compat": {"driver": "major"}}))
        sim = SimEngine(state, requeue_delay_s=3.0)
        ex = Executor(sim, FileTickets(sim, FileAgent(run_dir, store)),  # type: ignore[arg-type]
                      Journal(tmp_path / "journal.db", clock=lambda: sim.now), clock=lambda: sim.now)
        assert ex.submit([Move("a1", "node1", "node2")], reason="test", compat=rule.as_dict()).admitted
        for _ in range(100):
            ex.tick()
            if ex.journal.all()[0].state is S.DONE:
                break
            sim.advance(1.0)
        assert ex.journal.all()[0].state is S.DONE
        ticket = read_json(JobDir(run_dir, "a1").ticket)
        assert ticket is not None and ticket["compat"] == rule.as_dict()
        # the wrapper on the target (driver 550.90.07) restores the real checkpoint under the ticket's rule
        # (the sim's checkpoint exists only in memory: the ticket names the real one instead)
        ticket["ckpt_id"] = manifest.id
        cfg = WrapperConfig([], "a1", "node2", run_dir, store.root, key)
        w = Wrapper(cfg, log=lambda _m: None)
        w._backend = GpuHostCriu(driver="550.90.07", log_dir=tmp_path / "l2")
        refused = w._restore(manifest.id, None)  # the default rule: every field exact
        assert refused is not None and refused.startswith("incompatible") and "driver" in refused, refused
        assert w.pid is None  # nothing ran
        at = probe_job.last_step(log)
        assert w._restore(str(ticket["ckpt_id"]), w.ticket_rule(ticket)) is None
        restored = w.pid
        probe_job.wait_step(log, at + 2, timeout=60)  # it runs on from the dump
    finally:
        for pid in (job.pid, restored):
            if pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)

