"""An informer-style watch feed for a long-lived process (the controller): list each kind once, then keep the
live model (incremental.py, `LiveModel`) current with watches, so that a cycle converts only what changed
instead of listing 40,000 pods again.

Each `Source` of live.py gets a feed: the initial list records its resourceVersion; a background thread watches
from there (`watch=True`, bookmarks on, the server's JSON lines parsed as is) and applies ADDED / MODIFIED /
DELETED to the model. A stream that ends (the server's timeout) is resumed from the last resourceVersion seen;
a 410 Gone (the resourceVersion expired) or an ERROR event relists the kind (with a growing pause when that
repeats) and applies the difference; a broken connection (an API server restart) is retried until it answers.
Every input is followed this way, the autoscaler's status ConfigMap too: after the start a warm controller makes
no list and no get between changes. The DRA kinds, when the server does not serve them at the start, are
looked for again with a growing pause (30 s doubling to 10 min) and followed from when they appear.

A change that can alter a decision (a pod created, bound, finished or deleted, a node's capacity or readiness,
any quota, PDB, DRA object or scheduling event) sets the wake flag that `wait()` returns on: the controller
reacts to it instead of to a timer.

Staleness is safe by construction: the model only feeds diagnosis and planning. Before a move touches anything
the executor re-reads from the API what it touches (the target node and the pods on it, the original pod's uid
and node, the PDBs), and the eviction carries the original's uid as a precondition.
"""

from __future__ import annotations

import contextlib
import json
import threading
import time
from collections.abc import Callable
from typing import Any

from ...errors import InputError
from .convert import KubeCluster
from .incremental import LiveModel
from .live import Caller, Source, absence_notes, autoscaler_source, list_all, list_dra, where_of

RELIST_BACKOFF_MAX_S = 30.0
DRA_PROBE_S = (30.0, 600.0)  # first pause, longest pause between looks for the DRA kinds
THREAD_PREFIX = "gpudefrag-watch"  # every thread a WatchCache starts is named so (a leak is found by its name)


class _Feed:
    """One kind's watch thread and where it stands; its objects live in the model."""

    def __init__(self, src: Source, rv: str) -> None:
        self.src = src
        self.rv: str | None = rv  # None: the next round relists
        self.last_relist: float | None = None
        self.backoff = 0.0
        self.connected = False
        self.down_since: float | None = None
        self.relists = 0
        self.events = 0
        self.stream: Any = None


class WatchCache:
    """The cluster as the watches last saw it. `start()` lists everything (errors as `read_live`'s) and starts
    the watches; `cluster()` converts what changed (no API call); `wait()` sleeps until a change that matters;
    `stop()` ends the watches."""

    def __init__(self, api: Any, context: str | None = None, *, watch_timeout_s: int = 240, retry_s: float = 1.0,
                 stale_after_s: float = 30.0, now: Callable[[], float] = time.time) -> None:
        self.api = api
        self.where = where_of(context)
        self.watch_timeout_s = watch_timeout_s  # the server ends each watch after this; it is resumed at once
        self.retry_s = retry_s
        self.stale_after_s = stale_after_s  # a feed down this long is named in the cluster's warnings
        self.now = now
        self.feeds: dict[str, _Feed] = {}
        self.skipped: list[str] = []
        self.lock = threading.Lock()
        self.generation = 0  # bumped by every change to any store
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.model = LiveModel(self.where)
        self._wake = threading.Event()
        self.dra_probe_s = DRA_PROBE_S

    def start(self) -> WatchCache:
        call = Caller(self.where)
        listed = list_all(self.api, call, [autoscaler_source(self.api)])
        self.skipped = call.warnings
        self._follow(listed)
        if not any(src.kind == "ResourceSlice" for src, _, _ in listed):
            self._spawn(self._probe_dra, f"{THREAD_PREFIX} DRA probe")
        return self

    def _follow(self, listed: list[tuple[Source, list[dict[str, Any]], str]]) -> None:
        with self.lock:
            for src, items, rv in listed:
                self.feeds[src.name] = _Feed(src, rv)
                self.model.add_feed(src.name, src.kind)
                self.model.replace(src.name, items)
                self.generation += 1
        for src, _, _ in listed:
            self._spawn(lambda f=self.feeds[src.name]: self._run(f), f"{THREAD_PREFIX} {src.name}")

    def _spawn(self, fn: Callable[[], None], name: str) -> None:
        t = threading.Thread(target=fn, name=name, daemon=True)
        t.start()
        self._threads.append(t)

    def _probe_dra(self) -> None:
        """The server did not serve DRA at the start: look again with a growing pause, follow it once it does
        (an API server upgraded or reconfigured while the controller runs)."""
        pause, longest = self.dra_probe_s
        while not self._stop.wait(pause):
            call = Caller(self.where)
            try:
                got = list_dra(self.api, call)
            except InputError:  # the server is down: look again later
                got = []
            if got:
                self._follow(got)
                self._wake.set()
                return
            pause = min(pause * 2, longest)

    def wait(self, timeout: float) -> bool:
        """Sleep until a change that can alter a decision arrives (True) or `timeout` passes (False)."""
        got = self._wake.wait(timeout)
        self._wake.clear()
        return got

    def stop(self) -> None:
        self._stop.set()
        for feed in self.feeds.values():
            self._close(feed)
        for t in self._threads:
            t.join(timeout=5)

    def cluster(self) -> KubeCluster:
        """The model now: what changed since the last call converted, no API call."""
        warnings = list(self.skipped)
        t = time.monotonic()
        with self.lock:
            for f in self.feeds.values():
                if f.down_since is not None and t - f.down_since >= self.stale_after_s:
                    warnings.append(f"watch {f.src.name}: not connected for {t - f.down_since:.0f} s; "
                                    "what it shows may be stale")
            notes = absence_notes([(k, self.model.raw[f]) for f, k in self.model.kinds.items()])
            return self.model.cluster(self.now(), warnings, notes)

    # ------------------------------------------------------------------ the watch threads
    def _close(self, feed: _Feed) -> None:
        s = feed.stream
        if s is not None:
            with contextlib.suppress(Exception):  # already closed
                s.shutdown() if hasattr(s, "shutdown") else s.close()

    def _down(self, feed: _Feed) -> None:
        feed.connected = False
        if feed.down_since is None:
            feed.down_since = time.monotonic()

    def _relist(self, feed: _Feed) -> None:
        """List the kind again (its watch expired) and apply the difference. A relist soon after the last one
        waits first, longer each time (to 30 s): a server that keeps expiring watches is not listed in a loop."""
        t = time.monotonic()
        if feed.last_relist is not None and t - feed.last_relist < 60:
            feed.backoff = min(max(feed.backoff * 2, self.retry_s), RELIST_BACKOFF_MAX_S)
            if self._stop.wait(feed.backoff):
                return
        else:
            feed.backoff = 0.0
        feed.last_relist = time.monotonic()
        call = Caller(self.where)
        got = call.list(feed.src)  # InputError when the server cannot answer: retried by _run
        items, rv = got if got is not None else ([], "")
        with self.lock:
            if self.model.replace(feed.src.name, items):
                self._wake.set()
            feed.rv = rv
            feed.relists += 1
            self.generation += 1

    def _run(self, feed: _Feed) -> None:
        while not self._stop.is_set():
            try:
                if feed.rv is None:
                    self._relist(feed)
                    if feed.rv is None:  # stopped while pausing
                        continue
                self._watch(feed)
            except Exception:  # a broken stream, an unreachable server, a relist refused: try again shortly
                self._down(feed)
                self._stop.wait(self.retry_s)

    def _watch(self, feed: _Feed) -> None:
        from kubernetes.client.rest import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        src = feed.src
        try:
            resp = src.fn(watch=True, resource_version=feed.rv, allow_watch_bookmarks=True,
                          timeout_seconds=self.watch_timeout_s, _preload_content=False, **src.kwargs)
        except ApiException as e:
            if e.status == 410:  # the resourceVersion expired before the watch began
                feed.rv = None
                return
            raise
        feed.stream = resp
        feed.connected, feed.down_since = True, None
        try:
            for line in iter_resp_lines(resp):
                ev = json.loads(line)
                typ, obj = ev.get("type"), ev.get("object") or {}
                if typ == "ERROR":  # 410 Gone (expired) or anything else: the stream is done; relist
                    feed.rv = None
                    return
                rv = (obj.get("metadata") or {}).get("resourceVersion")
                if typ != "BOOKMARK":
                    obj.setdefault("kind", src.kind)
                    with self.lock:  # the object and the resourceVersion it brings change together
                        if self.model.apply(src.name, typ, obj):
                            self._wake.set()
                        feed.events += 1
                        self.generation += 1
                        if rv:
                            feed.rv = rv
                elif rv:
                    feed.rv = rv
        finally:
            feed.stream = None
            resp.release_conn()
            if self._stop.is_set():
                feed.connected = False
