"""The deployment manifests pass kubernetes-validate (strict) for current Kubernetes versions, the RBAC grants
what the engine calls and no more, and the ConfigMap's policy loads with the project's policy loader."""

from __future__ import annotations

from pathlib import Path

import kubernetes_validate
import pytest
import yaml

from gpudefrag.policy.loader import parse_policy

DEPLOY = Path(__file__).parents[2] / "deploy" / "kubernetes"
DOCS = [(f.name, d) for f in sorted(DEPLOY.glob("*.yaml")) if f.name != "kustomization.yaml"
        for d in yaml.safe_load_all(f.read_text()) if d]


@pytest.mark.parametrize("version", ["1.34.0", "1.35.0", kubernetes_validate.latest_version()])
@pytest.mark.parametrize(("name", "doc"), DOCS, ids=[f"{n}:{d['kind']}" for n, d in DOCS])
def test_manifest_is_valid(name: str, doc: dict, version: str) -> None:
    kubernetes_validate.validate(doc, version, strict=True)


def test_validator_rejects_a_broken_manifest() -> None:
    doc = next(d for _, d in DOCS if d["kind"] == "Deployment")
    bad = yaml.safe_load(yaml.safe_dump(doc))
    bad["spec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, "1.34.0", strict=True)


def test_kustomization_lists_every_manifest() -> None:
    k = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())
    assert sorted(k["resources"]) == sorted({n for n, _ in DOCS})


def test_rbac_is_least_privilege() -> None:
    role = next(d for _, d in DOCS if d["kind"] == "ClusterRole")
    granted = {(g, r, v) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]
               for v in rule["verbs"]}
    # what the engine calls (live.py, executor.py)
    needed = {("", "nodes", "list"), ("", "pods", "list"), ("", "pods", "create"), ("", "pods", "patch"),
              ("", "pods/eviction", "create"), ("", "nodes/proxy", "create"), ("", "events", "list"),
              ("policy", "poddisruptionbudgets", "list"), ("", "resourcequotas", "list"),
              ("apps", "replicasets", "list"), ("batch", "jobs", "list")}
    assert needed <= granted
    assert not any("*" in x for t in granted for x in t)
    assert not {("", "secrets", v) for v in ("get", "list")} & granted
    assert ("", "nodes", "patch") not in granted and ("", "pods", "update") not in granted
    cm_role = next(d for _, d in DOCS if d["kind"] == "Role")
    assert cm_role["metadata"]["namespace"] == "kube-system"
    assert cm_role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                                 "resourceNames": ["cluster-autoscaler-status"], "verbs": ["get", "list", "watch"]}]


def test_configmap_policy_loads() -> None:
    cm = next(d for _, d in DOCS if d["kind"] == "ConfigMap")
    pol = parse_policy(yaml.safe_load(cm["data"]["policy.yaml"]), "configmap.yaml")
    assert pol.filter.accounts == ["ml", "research"] and pol.budgets.max_moves_per_plan == 4


def test_deployment_runs_the_kubernetes_controller() -> None:
    dep = next(d for _, d in DOCS if d["kind"] == "Deployment")
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["args"][:3] == ["controller", "--engine", "kubernetes"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "gpudefrag-controller"
    assert c["securityContext"]["readOnlyRootFilesystem"] and c["securityContext"]["capabilities"]["drop"] == ["ALL"]


def test_the_kubernetes_example_policy_is_the_one_the_deployment_ships() -> None:
    """examples/policies/kubernetes.yaml and the ConfigMap hold one policy: the example is what a first run with
    `--policy` uses, the ConfigMap what the deployment mounts."""
    cm = next(d for _, d in DOCS if d["kind"] == "ConfigMap")
    example = (DEPLOY.parents[1] / "examples" / "policies" / "kubernetes.yaml").read_text()
    body = "".join(line for line in example.splitlines(keepends=True) if not line.startswith("#"))
    assert body == cm["data"]["policy.yaml"]
