"""Dynamic Resource Allocation, where the API has it: GPUs published in ResourceSlices, asked for in
ResourceClaims. Reads `resource.k8s.io` v1 and v1beta1/v1beta2 shapes (devices with `attributes` directly or
under `basic`). Only the NVIDIA GPU driver's devices are counted; other drivers' devices are not GPUs to us."""

from __future__ import annotations

from dataclasses import dataclass, field

from .access import At

GPU_DRIVERS = ("gpu.nvidia.com",)


def _attr(dev: At, name: str) -> str | None:
    attrs = dev.obj("attributes").value or dev.obj("basic").obj("attributes").value
    a = attrs.get(name)
    if isinstance(a, dict):
        for k in ("string", "version", "int"):
            if k in a:
                return str(a[k])
    return None


@dataclass
class DraInventory:
    gpus_by_node: dict[str, int] = field(default_factory=dict)
    mig_by_node: dict[str, dict[str, int]] = field(default_factory=dict)
    product_by_node: dict[str, str] = field(default_factory=dict)
    claim_gpus: dict[tuple[str, str], int] = field(default_factory=dict)  # (namespace, claim) -> GPUs
    claim_allocated: set[tuple[str, str]] = field(default_factory=set)


def read_dra(slices: list[At], claims: list[At]) -> DraInventory:
    inv = DraInventory()
    for s in slices:
        spec = s.obj("spec", required=True)
        driver = spec.text("driver") or ""
        node = spec.text("nodeName")
        if driver not in GPU_DRIVERS or not node:
            continue
        for dev in spec.objects("devices"):
            kind = _attr(dev, "type") or "gpu"
            if kind == "gpu":
                inv.gpus_by_node[node] = inv.gpus_by_node.get(node, 0) + 1
                prod = _attr(dev, "productName")
                if prod:
                    inv.product_by_node.setdefault(node, prod.replace(" ", "-"))
            elif kind == "mig":
                prof = _attr(dev, "profile") or "mig"
                m = inv.mig_by_node.setdefault(node, {})
                m[prof] = m.get(prof, 0) + 1
    for c in claims:
        meta = c.obj("metadata", required=True)
        key = (meta.text("namespace") or "default", meta.req_str("name"))
        n = 0
        for r in c.obj("spec").obj("devices").objects("requests"):
            exact = r.obj("exactly") if "exactly" in r.value else r
            cls = exact.text("deviceClassName") or ""
            if cls in GPU_DRIVERS or cls.startswith("gpu."):
                n += exact.integer("count", 1) or 1
        results = c.obj("status").obj("allocation").obj("devices").objects("results")
        if results:
            inv.claim_allocated.add(key)
            n = max(n, sum(1 for r in results if (r.text("driver") or "") in GPU_DRIVERS))
        if n:
            inv.claim_gpus[key] = n
    return inv
