"""An informer-style watch cache for a long-lived process (the controller): list each kind once, then keep it
current with a watch, so that a cycle reads a local store instead of listing 7,000 pods again.

Each `Source` of live.py gets a feed: the initial list records its resourceVersion; a background thread watches
from there (`watch=True`, bookmarks on, the server's JSON lines parsed as is) and applies ADDED / MODIFIED /
DELETED to the feed's store, keyed by namespace/name. A stream that ends (the server's timeout) is resumed from
the last resourceVersion seen; a 410 Gone (the resourceVersion expired) or an ERROR event relists the kind and
swaps its store at once; a broken connection (an API server restart) is retried until it answers.

Staleness is safe by construction: the cache only feeds diagnosis and planning. Before a move touches anything
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
from .live import Caller, Source, assemble, list_all, read_autoscaler_status, where_of


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{meta.get('namespace') or ''}/{meta.get('name') or ''}"


class _Feed:
    """One kind's store and the thread that keeps it current."""

    def __init__(self, src: Source, items: list[dict[str, Any]], rv: str) -> None:
        self.src = src
        self.store = {_key(o): o for o in items}
        self.rv: str | None = rv  # None: the next round relists
        self.connected = False
        self.down_since: float | None = None
        self.relists = 0
        self.events = 0
        self.stream: Any = None


class WatchCache:
    """The cluster as the watches last saw it. `start()` lists everything (errors as `read_live`'s) and starts
    the watches; `cluster()` converts the store (no list call); `stop()` ends the watches."""

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
        self._configmap: dict[str, Any] | None = None

    def start(self) -> WatchCache:
        call = Caller(self.where)
        for src, items, rv in list_all(self.api, call):
            self.feeds[src.name] = _Feed(src, items, rv)
        self.skipped = call.warnings
        for feed in self.feeds.values():
            t = threading.Thread(target=self._run, args=(feed,), name=f"watch {feed.src.name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self) -> None:
        self._stop.set()
        for feed in self.feeds.values():
            self._close(feed)
        for t in self._threads:
            t.join(timeout=5)

    def cluster(self) -> KubeCluster:
        """Convert what the store holds now; only the autoscaler's status ConfigMap is read (one GET)."""
        call = Caller(self.where)
        call.warnings.extend(self.skipped)
        t = time.monotonic()
        with self.lock:
            # in key order, as a list call answers (etcd's key order): the same input gives the same state
            lists = [(f.src, [f.store[k] for k in sorted(f.store)]) for f in self.feeds.values()]
            for f in self.feeds.values():
                if f.down_since is not None and t - f.down_since >= self.stale_after_s:
                    call.warnings.append(f"watch {f.src.name}: not connected for {t - f.down_since:.0f} s; "
                                         "what it shows may be stale")
        try:
            self._configmap = read_autoscaler_status(self.api, call)
        except InputError as e:  # the API server is unreachable: the cache still answers, with the last one seen
            call.warnings.append(f"{e.message}; the autoscaler status is the last one read")
        return assemble(lists, self._configmap, call, self.now())

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
        call = Caller(self.where)
        got = call.list(feed.src)  # InputError when the server cannot answer: retried by _run
        items, rv = got if got is not None else ([], "")
        store = {_key(o): o for o in items}
        with self.lock:
            feed.store, feed.rv = store, rv
            feed.relists += 1
            self.generation += 1

    def _run(self, feed: _Feed) -> None:
        while not self._stop.is_set():
            try:
                if feed.rv is None:
                    self._relist(feed)
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
                    with self.lock:
                        if typ == "DELETED":
                            feed.store.pop(_key(obj), None)
                        else:
                            feed.store[_key(obj)] = obj
                        feed.events += 1
                        self.generation += 1
                if rv:
                    feed.rv = rv
        finally:
            feed.stream = None
            resp.release_conn()
            if self._stop.is_set():
                feed.connected = False
