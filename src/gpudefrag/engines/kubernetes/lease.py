"""One controller per cluster: leader election through a `coordination.k8s.io/v1` Lease.

Two controllers driving the same cluster would start the same moves twice or leave them mid-way, and on
Kubernetes their journals need not share a volume (where the journal's file lock would refuse the second). So
the controller holds a Lease for its whole life: it takes it when the Lease is free or its holder stopped
renewing it for longer than its duration, renews it before every cycle, and gives it back when it stops. Every
write is a compare-and-swap on the Lease's resourceVersion, so of two controllers racing for it exactly one
wins. A controller that finds the Lease held, or loses it, stops with one line naming the holder.

Expiry is judged on the holder's `renewTime` against the reader's clock, so the hosts' clocks must agree to well
within the Lease's duration (60 s by default; NTP does). A holder that cannot reach the API server keeps acting
only while its last renewal is younger than two thirds of the duration — before anyone else may take it over —
and then stops.
"""

from __future__ import annotations

import json
import os
import socket
import time
from datetime import UTC, datetime
from typing import Any

from ...errors import GpudefragError

DEFAULT_NAME = "gpudefrag-controller"
DEFAULT_DURATION_S = 60


class LeaseHeld(GpudefragError):
    """Another controller holds the Lease (or took it over): one line, exit 1 (waiting may help)."""

    exit_code = 1


def _micro(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _parse(s: str | None) -> float | None:
    if not s:
        return None
    try:
        return datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
    except ValueError:
        try:
            return datetime.strptime(s.replace("Z", "+0000"), "%Y-%m-%dT%H:%M:%S%z").timestamp()
        except ValueError:
            return None


def default_identity() -> str:
    """This process: the pod (or host) and the PID."""
    return f"{os.environ.get('POD_NAME') or socket.gethostname()}_{os.getpid()}"


class LeaderLease:
    """The Lease `namespace/name`, held by `identity` once `acquire` returned."""

    def __init__(self, api_client: Any, namespace: str, name: str = DEFAULT_NAME, *, identity: str | None = None,
                 duration_s: int = DEFAULT_DURATION_S, clock: Any = time.time) -> None:
        from kubernetes import client

        self.api = client.CoordinationV1Api(api_client)
        self.namespace, self.name = namespace, name
        self.identity = identity or default_identity()
        self.duration_s = int(duration_s)
        self.clock = clock
        self.held = False
        self._renewed = 0.0  # time.monotonic() of the last successful write

    def _fresh(self) -> bool:
        """Our last renewal is recent enough that nobody else may have taken the Lease over yet."""
        return self.held and time.monotonic() - self._renewed < self.duration_s * 2 / 3

    def _read(self) -> dict[str, Any] | None:
        from kubernetes.client.rest import ApiException

        try:
            resp = self.api.read_namespaced_lease(self.name, self.namespace, _preload_content=False)
        except ApiException as e:
            if e.status == 404:
                return None
            raise LeaseHeld(f"lease {self.namespace}/{self.name}: cannot read it: HTTP {e.status} {e.reason}") \
                from None
        except Exception as e:  # the API server unreachable (urllib3 raises its own errors, not OSError)
            raise LeaseHeld(f"lease {self.namespace}/{self.name}: cannot read it: {e}") from None
        doc: dict[str, Any] = json.loads(resp.data)
        return doc

    def _body(self, spec: dict[str, Any], rv: str | None) -> dict[str, Any]:
        meta: dict[str, Any] = {"name": self.name, "namespace": self.namespace}
        if rv:
            meta["resourceVersion"] = rv
        return {"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": meta, "spec": spec}

    def _held_by_other(self, spec: dict[str, Any], now: float) -> str | None:
        holder = spec.get("holderIdentity")
        if not holder or holder == self.identity:
            return None
        renewed = _parse(spec.get("renewTime")) or _parse(spec.get("acquireTime")) or 0.0
        duration = int(spec.get("leaseDurationSeconds") or self.duration_s)
        if now - renewed > duration:
            return None  # its holder stopped renewing it: expired
        return f"{holder} (renewed {max(0.0, now - renewed):.0f} s ago, valid for {duration} s)"

    def acquire(self) -> None:
        """Take the Lease, or raise LeaseHeld naming the controller that holds it."""
        from kubernetes.client.rest import ApiException

        now = self.clock()
        doc = self._read()
        spec = dict((doc or {}).get("spec") or {})
        other = self._held_by_other(spec, now)
        if other is not None:
            raise LeaseHeld(f"lease {self.namespace}/{self.name}: another controller is running ({other}); only "
                            "one controller may drive a cluster")
        new = {"holderIdentity": self.identity, "leaseDurationSeconds": self.duration_s,
               "acquireTime": _micro(now), "renewTime": _micro(now),
               "leaseTransitions": int(spec.get("leaseTransitions") or 0)
               + (1 if spec.get("holderIdentity") not in (None, self.identity) else 0)}
        try:
            if doc is None:
                self.api.create_namespaced_lease(self.namespace, self._body(new, None))
            else:
                rv = str((doc.get("metadata") or {}).get("resourceVersion") or "")
                self.api.replace_namespaced_lease(self.name, self.namespace, self._body(new, rv))
        except ApiException as e:
            if e.status in (409, 422):  # another controller wrote it first: it won
                raise LeaseHeld(f"lease {self.namespace}/{self.name}: another controller took it first; only one "
                                "controller may drive a cluster") from None
            raise LeaseHeld(f"lease {self.namespace}/{self.name}: cannot take it: HTTP {e.status} {e.reason}") \
                from None
        except Exception as e:
            raise LeaseHeld(f"lease {self.namespace}/{self.name}: cannot take it: {e}") from None
        self.held, self._renewed = True, time.monotonic()

    def renew(self) -> None:
        """Before each cycle: still ours? Then push its renew time. Lost (another holder, or deleted): raise
        LeaseHeld. The API server unreachable or failing: carry on while the last renewal is fresh (nobody may
        take it over before it expires), else raise LeaseHeld — stop rather than act without knowing."""
        from kubernetes.client.rest import ApiException

        try:
            doc = self._read()
        except LeaseHeld as e:
            if self._fresh():
                return
            self.held = False
            raise LeaseHeld(f"{e}; stopping so that only one controller drives the cluster") from None
        spec = dict((doc or {}).get("spec") or {})
        if doc is None or spec.get("holderIdentity") != self.identity:
            self.held = False
            raise LeaseHeld(f"lease {self.namespace}/{self.name}: lost to {spec.get('holderIdentity') or 'nobody'}; "
                            "stopping so that only one controller drives the cluster")
        spec["renewTime"] = _micro(self.clock())
        rv = str((doc.get("metadata") or {}).get("resourceVersion") or "")
        try:
            self.api.replace_namespaced_lease(self.name, self.namespace, self._body(spec, rv))
        except Exception as e:
            # 409: somebody wrote it since we read it; the next renew sees who holds it
            if self._fresh():
                return
            self.held = False
            why = f"HTTP {e.status} {e.reason}" if isinstance(e, ApiException) else str(e)
            raise LeaseHeld(f"lease {self.namespace}/{self.name}: cannot renew it ({why}); stopping so that only "
                            "one controller drives the cluster") from None
        self._renewed = time.monotonic()

    def release(self) -> None:
        """Give the Lease back (a clean stop): the next controller need not wait for it to expire."""
        if not self.held:
            return
        self.held = False
        try:
            doc = self._read()
            spec = dict((doc or {}).get("spec") or {})
            if doc is None or spec.get("holderIdentity") != self.identity:
                return
            spec["holderIdentity"] = None
            rv = str((doc.get("metadata") or {}).get("resourceVersion") or "")
            self.api.replace_namespaced_lease(self.name, self.namespace, self._body(spec, rv))
        except Exception:  # the API server gone, or the Lease changed: it expires on its own
            return
