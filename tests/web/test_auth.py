"""The token file loader: any bytes give either a usable token or one InputError naming the file."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.errors import InputError
from gpudefrag.web.auth import MIN_TOKEN_CHARS, read_token_file

from .conftest import serve_cmd


@settings(max_examples=150, deadline=None)
@given(raw=st.one_of(st.binary(max_size=64), st.text(max_size=64).map(lambda t: t.encode("utf-8"))))
def test_any_token_file_loads_or_fails_with_one_clear_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "token"
        path.write_bytes(raw)
        path.chmod(0o600)
        try:
            token = read_token_file(path)
        except InputError as e:
            assert e.source == str(path) and e.message
            return
        assert token == raw.decode("utf-8").strip()
        assert len(token) >= MIN_TOKEN_CHARS and not any(c.isspace() for c in token)


def test_token_file_errors_name_the_file(tmp_path: Path) -> None:
    good = tmp_path / "good"
    good.write_text("  s3cr3t-token-0123456789  \n")
    good.chmod(0o600)
    assert read_token_file(good) == "s3cr3t-token-0123456789"
    for name, content, message in [
        ("short", b"abc\n", "at least 16"),
        ("spaces", b"two words in one token file\n", "without spaces"),
        ("binary", b"\xff\xfe" * 10, "not UTF-8"),
        ("missing", None, "cannot read"),
    ]:
        p = tmp_path / name
        if content is not None:
            p.write_bytes(content)
            p.chmod(0o600)
        with pytest.raises(InputError, match=message) as err:
            read_token_file(p)
        assert err.value.source == str(p)


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o606])
def test_a_token_file_other_users_can_read_or_change_is_refused(tmp_path: Path, mode: int) -> None:
    """A token others can read hands them the dashboard's actions: refused (one line, exit 2), like a readable
    signing key; the server does not start."""
    tf = tmp_path / "token"
    tf.write_text("s3cr3t-token-0123456789\n")
    tf.chmod(mode)
    with pytest.raises(InputError, match="must be 0600"):
        read_token_file(tf)
    r = subprocess.run(serve_cmd("--check", "--enable-actions", "--token-file", str(tf)), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 2 and "must be 0600" in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr
