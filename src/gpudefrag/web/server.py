"""Running the dashboard: the loopback-only bind rule and the uvicorn server.

A dashboard that can apply plans must not be reachable from the network by accident, so a non-loopback
address is refused unless the operator says `--allow-remote` explicitly.
"""

from __future__ import annotations

import ipaddress
import socket

from fastapi import FastAPI

LOOPBACK_HOSTS = ["127.0.0.1", "localhost", "::1", "[::1]"]


class BindRefused(ValueError):
    """A bind address that is not loopback, without --allow-remote."""


def is_loopback(host: str) -> bool:
    """Whether every address `host` names is a loopback address (unresolvable names are not)."""
    h = host.strip("[]")
    try:
        return ipaddress.ip_address(h).is_loopback
    except ValueError:
        pass
    if not h:
        return False
    try:
        infos = socket.getaddrinfo(h, None)
    except (OSError, UnicodeError):
        return False
    addrs = {info[4][0] for info in infos}
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)


def check_bind(host: str, allow_remote: bool) -> None:
    """Raise BindRefused for a non-loopback host unless remote access is explicitly allowed."""
    if allow_remote or is_loopback(host):
        return
    raise BindRefused(
        f"refusing to bind the dashboard to {host!r}: it is not a loopback address; "
        "pass --allow-remote to expose it (and protect actions with --token-file)"
    )


def allowed_hosts(host: str, allow_remote: bool) -> list[str] | None:
    """The Host headers a loopback-bound server answers (a DNS-rebinding page sends its own name): the loopback
    names plus the address it was told to bind (`--host 127.0.0.2` is reached as http://127.0.0.2:PORT/).
    None (any Host) with --allow-remote, where the operator chose to be reachable by other names."""
    if allow_remote:
        return None
    h = host.strip("[]")
    own = [f"[{h}]"] if ":" in h else [h]
    return LOOPBACK_HOSTS + [x for x in own if x not in LOOPBACK_HOSTS]


def serve(app: FastAPI, host: str, port: int, *, allow_remote: bool, log_level: str = "info") -> None:
    """Check the bind address, then run uvicorn until interrupted."""
    import uvicorn

    check_bind(host, allow_remote)
    uvicorn.run(app, host=host.strip("[]"), port=port, log_level=log_level, server_header=False,
                proxy_headers=False)
