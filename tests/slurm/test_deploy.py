"""The systemd units (deploy/slurm) for the controller and for the nodes' run service: each command line is one
the CLI accepts, each restarts on failure, and each environment file names exactly the settings its command reads
from the environment."""

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


UNITS = [("gpudefrag-controller.service", "controller.env", "controller"),
         ("gpudefrag-run.service", "run.env", "run-service")]


def unit(name: str = "gpudefrag-controller.service") -> dict[str, str]:
    text = (DEPLOY / name).read_text().replace("\\\n", " ")
    out: dict[str, str] = {}
    for line in text.splitlines():
        if "=" in line and not line.lstrip().startswith(("#", "[")):
            k, v = line.split("=", 1)
            out[k.strip()] = v.strip()
    return out


@pytest.mark.parametrize(("name", "env_name", "command"), UNITS)
def test_the_unit_runs_a_command_line_the_cli_accepts(name: str, env_name: str, command: str) -> None:
    u = unit(name)
    assert u["Restart"] == "on-failure"
    if command == "controller":
        assert u["StateDirectory"] == "gpudefrag"
    else:  # the socket's folder: root's, 0755, kept across restarts (running jobs' wrappers outlive a restart)
        assert (u["RuntimeDirectory"], u["RuntimeDirectoryMode"], u["KillMode"]) == ("gpudefrag", "0755", "process")
        assert "--socket /run/gpudefrag/run.sock" in u["ExecStart"] and "--jobs slurm" in u["ExecStart"]
    argv = u["ExecStart"].split()
    assert argv[0].endswith("/gpudefrag") and argv[1] == command
    env = dict(line.split("=", 1) for line in (DEPLOY / f"{env_name}.example").read_text().splitlines()
               if line and not line.startswith("#"))
    assert u["EnvironmentFile"] == f"/etc/gpudefrag/{env_name}"
    args = [re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], a) for a in argv[2:]]
    help_text = CliRunner().invoke(app, [command, "--help"], terminal_width=200).output
    for a in args:
        if a.startswith("--"):
            assert a in help_text, a
    # every setting the environment file gives is one the controller reads (its envvar) or the unit expands
    for k in env:
        assert k in help_text or f"${{{k}}}" in u["ExecStart"], k


@pytest.mark.parametrize(("name", "env_name", "command"), UNITS)
def test_systemd_accepts_the_unit(tmp_path: Path, name: str, env_name: str, command: str) -> None:
    """`systemd-analyze verify` where systemd is installed (the unit's syntax and directives)."""
    if shutil.which("systemd-analyze") is None:
        pytest.skip("systemd-analyze not installed (the structural test above still ran)")
    unit_file = tmp_path / name
    text = (DEPLOY / name).read_text()
    unit_file.write_text(text.replace("/usr/local/bin/gpudefrag", str(Path(sys.executable).parent / "gpudefrag"))
                         .replace(f"EnvironmentFile=/etc/gpudefrag/{env_name}",
                                  f"EnvironmentFile={DEPLOY / (env_name + '.example')}"))
    p = subprocess.run(["systemd-analyze", "verify", str(unit_file)], capture_output=True, text=True, timeout=60)
    bad = [ln for ln in p.stderr.splitlines() if name in ln and "Unknown" in ln]
    assert not bad, p.stderr
