"""`gpudefrag controller` reads its store's checkpoints only when signed by the store's key, so a missing key is
an error before anything starts — never a new key (only `checkpoint` and `keys init` create one)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from gpudefrag.checkpoint.keys import load_key

REPO = Path(__file__).resolve().parents[2]
GPUDEFRAG = str(Path(sys.executable).parent / "gpudefrag")


def controller(tmp_path: Path, key: Path) -> subprocess.CompletedProcess[str]:
    policy = tmp_path / "policy.yaml"
    policy.write_text("trigger:\n  pending: {longer_than_s: 0}\n")
    return subprocess.run([GPUDEFRAG, "controller", "--engine", "sim", "--snapshot",
                           str(REPO / "tests/scenarios/plain-fragmentation.json"), "--policy", str(policy),
                           "--journal", str(tmp_path / "journal.db"), "--store", str(tmp_path / "store"),
                           "--key", str(key), "--once", "--max-cycles", "1", "--json"],
                          capture_output=True, text=True, timeout=120)


def test_a_missing_key_is_one_line_exit_2_and_no_key_is_made(tmp_path: Path) -> None:
    key = tmp_path / "keys" / "ckpt.key"
    p = controller(tmp_path, key)
    assert p.returncode == 2, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "Traceback" not in p.stderr, p.stderr
    assert "missing-key" in p.stderr and str(key) in p.stderr, p.stderr
    assert not key.exists() and not key.parent.exists()
    assert not (tmp_path / "journal.db").exists()  # nothing started


def test_with_the_key_the_controller_runs(tmp_path: Path) -> None:
    key = tmp_path / "ckpt.key"
    load_key(key, create=True)  # the operator's `gpudefrag keys init`
    p = controller(tmp_path, key)
    assert p.returncode == 0, p.stderr
    assert (tmp_path / "journal.db").exists()
