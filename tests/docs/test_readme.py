"""The README's quick start shows the output a newcomer gets: the commands in its `sh` block are run as written
(in a fresh folder, `gpudefrag` from this checkout) and their output must equal the `text` block under them, so
a change to the planner's output or the demo cluster fails here until the README shows it."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def quick_start() -> tuple[str, str]:
    """The quick start's command line and the output block that follows it."""
    text = (REPO / "README.md").read_text()
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    m = re.search(r"```sh\n(?:\. \.venv/bin/activate\n)?(?P<cmd>[^\n]+)\n```\s*```text\n(?P<out>.*?)```", section,
                  re.S)
    assert m, "README: the quick start has no ```sh command block followed by a ```text output block"
    return m["cmd"], m["out"]


def test_the_quick_start_shows_the_output_its_commands_print(tmp_path: Path) -> None:
    cmd, shown = quick_start()
    assert cmd == "gpudefrag snapshot demo c.json && gpudefrag plan c.json --gpus 8", cmd
    got = ""
    for part in cmd.split(" && "):
        argv = part.split()
        assert argv[0] == "gpudefrag"
        p = subprocess.run([sys.executable, "-m", "gpudefrag.cli.main", *argv[1:]], cwd=tmp_path, text=True,
                           capture_output=True, timeout=120,
                           env={**os.environ, "COLUMNS": "100", "NO_COLOR": "1",
                                "PYTHONPATH": str(REPO / "src")})
        assert p.returncode == 0, p.stderr
        got += p.stdout

    def lines(s: str) -> list[str]:
        return [line.rstrip() for line in s.strip("\n").splitlines()]

    assert lines(got) == lines(shown), "README quick start differs from the real output:\n" + got
