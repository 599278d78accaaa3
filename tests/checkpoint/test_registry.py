"""The checkpoint backend registry: names map to builders whose arguments are checked before anything runs."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from gpudefrag.checkpoint.app_hook import AppHookBackend
from gpudefrag.checkpoint.protocol import UNAVAILABLE, CheckpointError
from gpudefrag.checkpoint.registry import backend_for, backend_names


def test_every_registered_name_builds_a_backend_of_that_name() -> None:
    assert set(backend_names()) == {"criu", "cuda", "app"}
    for name in backend_names():
        try:
            assert backend_for(name).name == name
        except CheckpointError as e:  # the CUDA backend checks for a driver as it is built; this host has none
            assert name == "cuda" and e.reason == UNAVAILABLE


def test_arguments_reach_the_backend() -> None:
    be = backend_for("app", spool=Path("/x"), signum=signal.SIGUSR2, timeout_s=5.0)
    assert isinstance(be, AppHookBackend) and be.spool == Path("/x") and be.signum == signal.SIGUSR2


@pytest.mark.parametrize(("name", "kw", "said"), [
    ("zfs", {}, "unknown checkpoint backend 'zfs'"),
    ("criu", {"spool": "/x"}, "takes no argument(s) spool"),
])
def test_unknown_names_and_arguments_are_refused(name: str, kw: dict[str, object], said: str) -> None:
    with pytest.raises(CheckpointError) as e:
        backend_for(name, **kw)
    assert e.value.reason == UNAVAILABLE and said in e.value.detail
