"""The systemd unit for the controller (deploy/slurm): its command line is one the CLI accepts, it restarts on
failure, and the environment file names exactly the settings the controller reads from the environment."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from gpudefrag.cli.main import app

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "slurm"


def unit() -> dict[str, str]:
    text = (DEPLOY / "gpudefrag-controller.service").read_text().replace("\\\n", " ")
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


def test_the_unit_runs_a_command_line_the_controller_accepts() -> None:
    u = unit()
    assert u["Restart"] == "on-failure" and u["StateDirectory"] == "gpudefrag"
    argv = u["ExecStart"].split()
    assert argv[0].endswith("/gpudefrag") and argv[1] == "controller"
    env = dict(line.split("=", 1) for line in (DEPLOY / "controller.env.example").read_text().splitlines()
               if line and not line.startswith("#"))
    assert u["EnvironmentFile"] == "/etc/gpudefrag/controller.env"
    args = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a) for a in argv[2:]]
    help_text = CliRunner().invoke(app, ["controller", "--help"], terminal_width=200).output
    for a in args:
        if a.startswith("--"):
            assert a in help_text, a
    # every setting the environment file gives is one the controller reads (its envvar) or the unit expands
    for k in env:
        assert k in help_text or f"${{{k}}}" in u["ExecStart"], k


def test_systemd_accepts_the_unit(tmp_path: Path) -> None:
    """`systemd-analyze verify` where systemd is installed (the unit's syntax and directives)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (the structural test above still ran)")
    unit_file = tmp_path / "gpudefrag-controller.service"
    text = (DEPLOY / "gpudefrag-controller.service").read_text()
    unit_file.write_text(text.replace("/usr/local/bin/gpudefrag", str(Path(sys.executable).parent / "gpudefrag"))
                         .replace("EnvironmentFile=/etc/gpudefrag/controller.env",
                                  f"EnvironmentFile={DEPLOY / 'controller.env.example'}"))
    p = subprocess.run(["systemd-analyze", "verify", str(unit_file)], capture_output=True, text=True, timeout=60)
    bad = [ln for ln in p.stderr.splitlines() if "gpudefrag-controller.service" in ln and "Unknown" in ln]
    assert not bad, p.stderr
