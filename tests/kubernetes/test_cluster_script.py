"""tools/kubecluster/cluster.sh where no control plane has to run (issue 31): `start` on a folder an earlier
cluster left refuses (certificates are made anew on every start, so its old nodes would come back under a new
CA) and makes nothing; `nodes` needs a started folder; a bad `nodes` option is one line and exit 2. The rest
runs against the real control plane: tests/kubernetes/real/test_cluster_script_real.py."""

from __future__ import annotations

import subprocess
from pathlib import Path

SCRIPT = str(Path(__file__).resolve().parents[2] / "tools" / "kubecluster" / "cluster.sh")


def script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_start_refuses_a_folder_an_earlier_cluster_left(tmp_path: Path) -> None:
    (tmp_path / "etcd" / "member").mkdir(parents=True)
    (tmp_path / "etcd" / "member" / "snap").write_text("")
    p = script("start", str(tmp_path))
    assert p.returncode == 2 and "holds a cluster from an earlier start" in p.stderr, p.stderr
    assert sorted(x.name for x in tmp_path.iterdir()) == ["etcd"]  # no certificates made, nothing started


def test_nodes_needs_a_started_folder_and_names_a_bad_option(tmp_path: Path) -> None:
    p = script("nodes", str(tmp_path))
    assert p.returncode == 2 and "run cluster.sh start" in p.stderr, p.stderr
    (tmp_path / "admin.kubeconfig").write_text("")
    for opt, words in ((["--mig", "1g.10gb"], "expected PROFILE=N"), (["--taint", "a=b"], "expected KEY=VALUE"),
                       (["--count", "0"], "must be >= 1")):
        p = script("nodes", str(tmp_path), *opt)
        assert p.returncode == 2 and words in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
