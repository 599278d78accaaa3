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


def _grants(*roles: dict) -> set[tuple[str, str, str]]:
    return {(g, r, v) for role in roles for rule in role["rules"] for g in rule["apiGroups"]
            for r in rule["resources"] for v in rule["verbs"]}


def _doc(kind: str, name: str) -> dict:
    return next(d for _, d in DOCS if d["kind"] == kind and d["metadata"]["name"] == name)


def test_rbac_is_least_privilege() -> None:
    reads = _grants(_doc("ClusterRole", "gpudefrag-controller"))
    moves = _grants(_doc("ClusterRole", "gpudefrag-controller-moves"))
    # cluster-wide the controller only reads (live.py); it writes through the namespaced binding (executor.py)
    assert {("", "nodes", "list"), ("", "pods", "list"), ("", "events", "list"), ("", "resourcequotas", "list"),
            ("policy", "poddisruptionbudgets", "list"), ("apps", "replicasets", "list"), ("batch", "jobs", "list")
            } <= reads
    assert {v for _, _, v in reads} == {"get", "list", "watch"}
    assert moves == {("", "pods", "create"), ("", "pods", "patch"), ("", "pods", "delete"),
                     ("", "pods/eviction", "create")}
    for granted in (reads, moves):
        assert not any("*" in x for t in granted for x in t)
        assert not {("", "secrets", v) for v in ("get", "list", "watch")} & granted
        # never the kubelet: the node agent holds that, and only its checkpoint API
        assert not {r for _, r, _ in granted} & {"nodes/proxy", "nodes/checkpoint"}
        assert ("", "nodes", "patch") not in granted and ("", "pods", "update") not in granted
    cm_role = next(d for _, d in DOCS if d["kind"] == "Role")
    assert cm_role["metadata"]["namespace"] == "kube-system"
    assert cm_role["rules"] == [{"apiGroups": [""], "resources": ["configmaps"],
                                 "resourceNames": ["cluster-autoscaler-status"], "verbs": ["get", "list", "watch"]}]
    # leader election (lease.py): create a Lease in its own namespace, read and renew only its own one
    leader = _doc("Role", "gpudefrag-leader")
    assert leader["metadata"]["namespace"] == "gpudefrag"
    assert leader["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["gpudefrag-controller"],
         "verbs": ["get", "update"]}]


def test_no_role_grants_exec_attach_or_the_kubelet_proxy() -> None:
    """No gpudefrag component can run a command in a pod through the API server: the application hook's signal is
    sent by the node agent through its own node's container runtime (control/node_agent.py)."""
    roles = [d for _, d in DOCS if d["kind"] in ("Role", "ClusterRole")]
    assert {r["metadata"]["name"] for r in roles} >= {"gpudefrag-controller", "gpudefrag-controller-moves",
                                                      "gpudefrag-node-agent"}
    granted = {r for _, r, _ in _grants(*roles)}
    assert not granted & {"pods/exec", "pods/attach", "pods/portforward", "nodes/proxy", "*"}, granted


def test_the_controller_writes_only_in_the_namespaces_its_policy_names() -> None:
    cm = next(d for _, d in DOCS if d["kind"] == "ConfigMap")
    pol = parse_policy(yaml.safe_load(cm["data"]["policy.yaml"]), "configmap.yaml")
    bound = sorted(d["metadata"]["namespace"] for _, d in DOCS if d["kind"] == "RoleBinding"
                   and d["roleRef"]["name"] == "gpudefrag-controller-moves")
    assert bound == sorted(pol.filter.accounts)
    crbs = [d["roleRef"]["name"] for _, d in DOCS if d["kind"] == "ClusterRoleBinding"]
    assert "gpudefrag-controller-moves" not in crbs


def test_only_the_node_agent_has_host_access_and_only_the_checkpoint_folder_and_the_runtime_socket() -> None:
    agent = _grants(_doc("ClusterRole", "gpudefrag-node-agent"))
    assert agent == {("", "nodes", "get"), ("", "nodes/checkpoint", "create"), ("", "pods", "get"),
                     ("", "pods", "list"), ("", "pods", "watch"), ("", "pods", "patch")}
    ds = _doc("DaemonSet", "gpudefrag-node-agent")
    spec = ds["spec"]["template"]["spec"]
    assert [v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v] == ["/var/lib/kubelet/checkpoints",
                                                                                  "/run/containerd"]
    c = spec["containers"][0]
    # the runtime's folder read-only (a socket connects all the same), named to the agent as its CRI endpoint
    assert next(m for m in c["volumeMounts"] if m["name"] == "runtime") == {
        "name": "runtime", "mountPath": "/host/run/containerd", "readOnly": True}
    assert c["args"][c["args"].index("--runtime-endpoint") + 1] == "unix:///host/run/containerd/containerd.sock"
    assert c["args"][0] == "node-agent" and c["securityContext"]["capabilities"] == {"drop": ["ALL"]}
    assert not c["securityContext"].get("privileged")
    ns = {d["metadata"]["name"]: d["metadata"]["labels"] for _, d in DOCS if d["kind"] == "Namespace"}
    assert ns["gpudefrag"]["pod-security.kubernetes.io/enforce"] == "restricted"
    assert ds["metadata"]["namespace"] == "gpudefrag-node"
    dep = next(d for _, d in DOCS if d["kind"] == "Deployment")
    assert not any("hostPath" in v for v in dep["spec"]["template"]["spec"]["volumes"])


def test_admission_binds_every_policy() -> None:
    policies = {d["metadata"]["name"] for _, d in DOCS if d["kind"] == "ValidatingAdmissionPolicy"}
    bound = {d["spec"]["policyName"]: d["spec"]["validationActions"] for _, d in DOCS
             if d["kind"] == "ValidatingAdmissionPolicyBinding"}
    assert policies == set(bound) == {"gpudefrag-controller-pods", "gpudefrag-node-agent-pods"}
    assert all(a == ["Deny"] for a in bound.values())


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
    # its Lease in its own namespace (where rbac.yaml's gpudefrag-leader grants it), held under its pod's name
    env = {e["name"]: e.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") for e in c["env"]}
    assert env["POD_NAMESPACE"] == "metadata.namespace" and env["POD_NAME"] == "metadata.name"


def test_the_kubernetes_example_policy_is_the_one_the_deployment_ships() -> None:
    """examples/policies/kubernetes.yaml and the ConfigMap hold one policy: the example is what a first run with
    `--policy` uses, the ConfigMap what the deployment mounts."""
    cm = next(d for _, d in DOCS if d["kind"] == "ConfigMap")
    example = (DEPLOY.parents[1] / "examples" / "policies" / "kubernetes.yaml").read_text()
    body = "".join(line for line in example.splitlines(keepends=True) if not line.startswith("#"))
    assert body == cm["data"]["policy.yaml"]


@pytest.mark.parametrize(("kind", "name"), [("Deployment", "gpudefrag-controller"),
                                            ("DaemonSet", "gpudefrag-node-agent")])
def test_the_key_is_mounted_as_a_file_not_through_the_secret_volumes_link(kind: str, name: str) -> None:
    """A Secret volume's files are links into ..data/, which load_key refuses (insecure-key: the deployed
    controller crash-looped on it on the real nodes); a subPath mount is the regular file itself."""
    spec = _doc(kind, name)["spec"]["template"]["spec"]
    c = spec["containers"][0]
    key_arg = c["args"][c["args"].index("--key") + 1]
    secret_vols = {v["name"] for v in spec["volumes"] if "secret" in v}
    mounts = [m for m in c["volumeMounts"] if m["name"] in secret_vols]
    assert mounts and all(m.get("subPath") for m in mounts), mounts
    assert key_arg in {m["mountPath"] for m in mounts}
