"""`gpudefrag serve` refuses a non-loopback bind unless told, and rejects unusable options with exit code 2."""

from __future__ import annotations

import json
import socket
import subprocess
from pathlib import Path

import pytest

from gpudefrag.web.server import BindRefused, check_bind, is_loopback

from .conftest import free_port, serve_cmd


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.53", "::1", "[::1]", "localhost"])
def test_loopback_addresses_are_allowed(host: str) -> None:
    assert is_loopback(host)
    check_bind(host, allow_remote=False)


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.10", "10.1.2.3", "", "no-such-host.invalid"])
def test_other_addresses_are_refused_unless_allowed(host: str) -> None:
    assert not is_loopback(host)
    with pytest.raises(BindRefused, match="--allow-remote"):
        check_bind(host, allow_remote=False)
    check_bind(host, allow_remote=True)


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(serve_cmd(*args), capture_output=True, text=True, timeout=60, cwd=cwd)


def listening(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_cli_refuses_a_public_bind_and_starts_nothing(tmp_path: Path) -> None:
    port = free_port()
    r = run("--host", "0.0.0.0", "--port", str(port), cwd=tmp_path)
    assert r.returncode == 2
    assert "refusing to bind" in r.stderr and "--allow-remote" in r.stderr
    assert not listening(port)


def test_cli_accepts_a_public_bind_when_told(tmp_path: Path) -> None:
    r = run("--host", "0.0.0.0", "--allow-remote", "--check", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    info = json.loads(r.stdout)
    assert info["url"].startswith("http://0.0.0.0:") and info["nodes"] == 4 and not info["actions_enabled"]


def test_cli_option_errors_exit_2(tmp_path: Path) -> None:
    r = run("--enable-actions", "--check", cwd=tmp_path)
    assert r.returncode == 2 and "--token-file" in r.stderr
    short = tmp_path / "short-token"
    short.write_text("abc\n")
    short.chmod(0o600)  # a token others may read is refused before its length is looked at
    r = run("--enable-actions", "--token-file", str(short), "--check", cwd=tmp_path)
    assert r.returncode == 2 and str(short) in r.stderr and "at least 16" in r.stderr
    r = run("--enable-actions", "--token-file", str(tmp_path / "missing"), "--check", cwd=tmp_path)
    assert r.returncode == 2 and "missing" in r.stderr
    bad = tmp_path / "bad.json"
    bad.write_text('{"version": 1, "nodes": [{"name": "a", "gpus": -1}]}')
    r = run("--snapshot", str(bad), "--check", cwd=tmp_path)
    assert r.returncode == 2 and "bad.json" in r.stderr and "nodes[0].gpus" in r.stderr
    assert "Traceback" not in r.stderr


def test_cli_serves_a_snapshot_file(tmp_path: Path) -> None:
    snap = tmp_path / "one.json"
    snap.write_text(json.dumps({"version": 1, "name": "tiny", "nodes": [{"name": "a", "gpus": 2}]}))
    r = run("--snapshot", str(snap), "--check", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["cluster"] == "tiny"


def test_demo_serve_opens_the_demo_in_the_dashboard(tmp_path: Path) -> None:
    import signal
    import time
    import urllib.request

    from gpudefrag.cli.serve_cmd import DEFAULT_PORT

    if listening(DEFAULT_PORT):
        pytest.skip(f"port {DEFAULT_PORT} is taken on this machine")
    cmd = [serve_cmd()[0], "-c", "from gpudefrag.cli.main import run; run()", "demo", "--serve"]
    proc = subprocess.Popen(cmd, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while not listening(DEFAULT_PORT):
            assert proc.poll() is None and time.monotonic() < deadline, "demo --serve did not start"
            time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{DEFAULT_PORT}/api/summary", timeout=10) as r:
            summary = json.load(r)
        assert summary["cluster"] == "demo" and summary["nodes"] == 4 and summary["free_gpus"] == 12
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=15)
