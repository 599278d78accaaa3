"""`gpudefrag node-agent`: answer the controller's checkpoint requests for the pods on one node (the DaemonSet in
deploy/kubernetes runs it; see gpudefrag.control.node_agent for the protocol)."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import typer

from .common import KeyOpt, fail, log_line


def register(app: typer.Typer) -> None:
    app.command("node-agent")(node_agent)


def node_agent(
    node: str = typer.Option(None, "--node", envvar="NODE_NAME", help="This node's name (the DaemonSet sets it "
                             "from spec.nodeName)"),
    registry: str = typer.Option(..., "--registry", envvar="GPUDEFRAG_REGISTRY",
                                 help="Registry for checkpoint images, http(s)://host:port"),
    registry_name: str = typer.Option(None, "--registry-name", envvar="GPUDEFRAG_REGISTRY_NAME",
                                      help="The registry's name in image references, as the nodes pull them "
                                      "(default: --registry's host:port)"),
    key: Path = KeyOpt,
    host_root: Path = typer.Option(Path("/"), "--host-root", help="Where the node's filesystem is mounted (the "
                                   "kubelet's archive paths are read under it)"),
    kubelet: str = typer.Option(None, "--kubelet", help="Kubelet URL (default: the node's InternalIP and the "
                                "port it reports)"),
    kubelet_ca: Path = typer.Option(None, "--kubelet-ca", help="CA of the kubelet's serving certificate "
                                    "(default: the ServiceAccount's ca.crt)"),
    kubelet_insecure: bool = typer.Option(False, "--kubelet-insecure-tls",
                                          help="Do not verify the kubelet's serving certificate (self-signed "
                                          "kubelets; test clusters only)"),
    token_file: Path = typer.Option(None, "--token-file", help="Bearer token for the kubelet (default: the "
                                    "ServiceAccount's)"),
    client_cert: Path = typer.Option(None, "--kubelet-client-cert", help="Client certificate for the kubelet, "
                                     "instead of a token"),
    client_key: Path = typer.Option(None, "--kubelet-client-key", help="Its key"),
    runtime_endpoint: str = typer.Option("unix:///run/containerd/containerd.sock", "--runtime-endpoint",
                                         envvar="CONTAINER_RUNTIME_ENDPOINT",
                                         help="The node's CRI socket (the kubelet's --container-runtime-endpoint): "
                                         "the application hook's signal is run in the container through it"),
    context: str = typer.Option(None, "--context", help="Kubeconfig context (default: in-cluster)"),
    once: bool = typer.Option(False, "--once", help="Answer what is pending now, then exit"),
    json_out: bool = typer.Option(False, "--json", help="Log one JSON object per event (stdout) instead of text"),
) -> None:
    """Checkpoint pods of this node through its kubelet into signed OCI checkpoint images, and signal a pod that
    opted in to the application hook through the node's container runtime, when asked."""
    from kubernetes import client

    from ..checkpoint.keys import load_key
    from ..checkpoint.oci_registry import Registry
    from ..checkpoint.store import default_key_path
    from ..control.node_agent import SA_DIR, Kubelet, NodeAgent, kubelet_url
    from ..engines.kubernetes.cri import CriError, Runtime
    from ..engines.kubernetes.live import api_client

    if not node:
        raise fail("--node (or $NODE_NAME) is required")
    if not registry.startswith(("http://", "https://")):
        raise fail(f"--registry must be http(s)://host:port, not {registry!r}")
    sign_key = load_key(key or default_key_path())  # a missing or unsafe key: one line, exit 2
    core = client.CoreV1Api(api_client(context))
    url = kubelet
    if url is None:
        url = kubelet_url(core.api_client.sanitize_for_serialization(core.read_node(node)))
    tok = token_file or (SA_DIR / "token" if (SA_DIR / "token").exists() else None)
    ca = kubelet_ca or (SA_DIR / "ca.crt" if (SA_DIR / "ca.crt").exists() else None)
    cert = (str(client_cert), str(client_key or client_cert)) if client_cert else None
    kl = Kubelet(url, token=(lambda: tok.read_text().strip()) if tok and not cert else None,
                 ca_file=str(ca) if ca else None, insecure=kubelet_insecure, client_cert=cert)

    def log(message: str) -> None:
        if json_out:
            sys.stdout.write(json.dumps({"time": time.time(), "node": node, "event": message}) + "\n")
            sys.stdout.flush()
        else:
            log_line(message)

    if not runtime_endpoint.startswith(("unix://", "/")):
        raise fail(f"--runtime-endpoint must be unix:///path or /path, not {runtime_endpoint!r}")
    runtime = Runtime(runtime_endpoint)
    try:  # only the application hook needs it: an unreachable runtime is said, not fatal
        rt = f"{runtime.version()} at {runtime_endpoint}"
    except CriError as e:
        rt = f"none ({e}; application hook requests will be refused)"
    agent = NodeAgent(core, node, kl, Registry(registry, name=registry_name or None), sign_key, host_root=host_root,
                      runtime=runtime, log=log)
    log(f"node-agent on {node}: kubelet {url}, registry {registry}, runtime {rt}, pid {os.getpid()}")
    if once:
        agent.sweep()
        return
    agent.run()
