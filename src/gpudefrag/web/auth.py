"""Bearer-token protection for the actions that change the cluster (apply a plan, trigger a checkpoint).

Actions are off unless the server was started with a token; the token is compared in constant time
(`hmac.compare_digest`) so its bytes cannot be guessed from response timings.
"""

from __future__ import annotations

import hmac
import os
import stat
from pathlib import Path

from fastapi import HTTPException, Request, status

from ..errors import InputError
from ..fileio import read_input

MIN_TOKEN_CHARS = 16


def read_token_file(path: Path) -> str:
    """The token in `path` (surrounding whitespace stripped). InputError naming the file when unusable: a token
    that other users can read (or write) is refused, as a readable signing key is, since whoever reads it holds
    the dashboard's actions."""
    src = str(path)
    raw = read_input(path, "token")  # a regular file of at most 4 KiB: never a FIFO that would hang start-up
    st = os.stat(path)  # the file itself (a mounted secret may be a link to it)
    if st.st_mode & 0o077:
        raise InputError(src, "", f"token file mode is {stat.S_IMODE(st.st_mode):04o}: other users could read or "
                         f"change it; it must be 0600 (chmod 600 {src})")
    if st.st_uid not in (0, os.geteuid()):
        raise InputError(src, "", f"token file is owned by uid {st.st_uid}, not by this server's user or root")
    try:
        token = raw.decode("utf-8").strip()
    except UnicodeDecodeError:
        raise InputError(src, "", "token file is not UTF-8 text") from None
    if len(token) < MIN_TOKEN_CHARS:
        raise InputError(src, "", f"token must be at least {MIN_TOKEN_CHARS} characters, got {len(token)}")
    if any(c.isspace() for c in token):
        raise InputError(src, "", "token must be one line without spaces")
    return token


class TokenGuard:
    """A FastAPI dependency: 403 when actions are disabled, 401 without the right bearer token."""

    def __init__(self, token: str | None) -> None:
        self._token = token.encode("utf-8") if token else None

    @property
    def enabled(self) -> bool:
        return self._token is not None

    def __call__(self, request: Request) -> None:
        if self._token is None:
            raise HTTPException(status.HTTP_403_FORBIDDEN,
                                "actions are disabled: start the server with --enable-actions --token-file FILE")
        header = request.headers.get("authorization", "")
        scheme, _, given = header.partition(" ")
        ok = scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode("utf-8"), self._token)
        if not ok:
            raise HTTPException(status.HTTP_401_UNAUTHORIZED, "a valid bearer token is required",
                                headers={"WWW-Authenticate": "Bearer"})
