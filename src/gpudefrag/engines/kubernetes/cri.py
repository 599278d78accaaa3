"""Two CRI calls, `RuntimeService/Version` and `RuntimeService/ExecSync`, over the node's container runtime
socket — what the node agent uses to run the application hook's command inside a container of its own node (the
kubelet's own way to the runtime, without the kubelet: no `pods/exec`, no `nodes/proxy`).

CRI is gRPC on a unix socket: the call goes through `grpcio`, and its four messages are protobuf classes made
at import from their descriptors (fields and numbers as in k8s.io/cri-api's `runtime/v1/api.proto`; a message
carries only the fields gpudefrag reads, and protobuf skips the others). No generated stubs to keep in step,
and no wire format written here. Verified against containerd 2.2's CRI (tests/kubernetes/test_cri.py, and the
real-node lab's tests/kubernetes/real/nodes/test_app_hook_nodes.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import grpc
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

SERVICE = "/runtime.v1.RuntimeService/"
_F = descriptor_pb2.FieldDescriptorProto
_MESSAGES: dict[str, tuple[tuple[str, int, int, int], ...]] = {
    "VersionRequest": (("version", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL),),
    "VersionResponse": (("version", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL),
                        ("runtime_name", 2, _F.TYPE_STRING, _F.LABEL_OPTIONAL),
                        ("runtime_version", 3, _F.TYPE_STRING, _F.LABEL_OPTIONAL),
                        ("runtime_api_version", 4, _F.TYPE_STRING, _F.LABEL_OPTIONAL)),
    "ExecSyncRequest": (("container_id", 1, _F.TYPE_STRING, _F.LABEL_OPTIONAL),
                        ("cmd", 2, _F.TYPE_STRING, _F.LABEL_REPEATED),
                        ("timeout", 3, _F.TYPE_INT64, _F.LABEL_OPTIONAL)),
    "ExecSyncResponse": (("stdout", 1, _F.TYPE_BYTES, _F.LABEL_OPTIONAL),
                         ("stderr", 2, _F.TYPE_BYTES, _F.LABEL_OPTIONAL),
                         ("exit_code", 3, _F.TYPE_INT32, _F.LABEL_OPTIONAL)),
}


def _message_classes() -> dict[str, Any]:
    """The messages as protobuf classes, in a pool of their own (never clashing with another `runtime.v1`)."""
    fd = descriptor_pb2.FileDescriptorProto(name="gpudefrag/cri_runtime_v1_subset.proto", package="runtime.v1",
                                            syntax="proto3")
    for name, fields in _MESSAGES.items():
        m = fd.message_type.add(name=name)
        for field, number, kind, label in fields:
            m.field.add(name=field, number=number, type=kind, label=label)
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return {name: message_factory.GetMessageClass(pool.FindMessageTypeByName(f"runtime.v1.{name}"))
            for name in _MESSAGES}


MESSAGES = _message_classes()


class CriError(Exception):
    """The runtime could not be reached, or refused the call; the message says which and what it answered."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


@dataclass(frozen=True)
class Runtime:
    """The node's CRI endpoint: `unix:///run/containerd/containerd.sock` (or a plain path)."""

    endpoint: str

    @property
    def path(self) -> str:
        return self.endpoint.removeprefix("unix://")

    def exec_sync(self, container_id: str, cmd: list[str], *, timeout_s: int = 30) -> ExecResult:
        """Run `cmd` in the container (as its runtime would for a kubelet exec probe) and wait for it."""
        req = MESSAGES["ExecSyncRequest"](container_id=container_id, cmd=cmd, timeout=timeout_s)
        got = self._call("ExecSync", req, timeout_s + 15, f"ExecSync in {container_id[:12]}")
        return ExecResult(got.exit_code, got.stdout, got.stderr)

    def version(self) -> str:
        """`RuntimeService/Version`: "containerd v2.2.9 (CRI v1)" — the agent says at start which runtime it reached."""
        got = self._call("Version", MESSAGES["VersionRequest"](), 15, "Version")
        return f"{got.runtime_name} {got.runtime_version} (CRI {got.runtime_api_version})"

    def _call(self, method: str, request: Any, timeout_s: float, what: str) -> Any:
        """One unary call on a channel of its own (the agent makes one per hook: nothing to keep open)."""
        reply = MESSAGES[f"{method}Response"]
        with grpc.insecure_channel(f"unix:{self.path}") as channel:
            call = channel.unary_unary(SERVICE + method, request_serializer=lambda m: m.SerializeToString(),
                                       response_deserializer=reply.FromString)
            try:
                return call(request, timeout=timeout_s)
            except grpc.RpcError as e:
                code, details = e.code(), e.details()  # type: ignore[attr-defined]
                if code == grpc.StatusCode.UNAVAILABLE:
                    raise CriError(f"container runtime at {self.endpoint} unreachable: {details}") from None
                if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                    raise CriError(f"container runtime at {self.endpoint}: {what} gave no answer within "
                                   f"{timeout_s:.0f} s") from None
                raise CriError(f"the container runtime refused {what}: {code.name}: {details}") from None
