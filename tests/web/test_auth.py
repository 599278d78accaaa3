"""The token file loader: any bytes give either a usable token or one InputError naming the file."""

from __future__ import annotations

import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpudefrag.errors import InputError
from gpudefrag.web.auth import MIN_TOKEN_CHARS, read_token_file


@settings(max_examples=150, deadline=None)
@given(raw=st.one_of(st.binary(max_size=64), st.text(max_size=64).map(lambda t: t.encode("utf-8"))))
def test_any_token_file_loads_or_fails_with_one_clear_error(raw: bytes) -> None:
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "token"
        path.write_bytes(raw)
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
        with pytest.raises(InputError, match=message) as err:
            read_token_file(p)
        assert err.value.source == str(p)
