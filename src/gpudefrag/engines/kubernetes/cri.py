"""One CRI call, `RuntimeService/ExecSync`, over the node's container runtime socket — what the node agent uses to
run the application hook's command inside a container of its own node (the kubelet's own way to the runtime,
without the kubelet: no `pods/exec`, no `nodes/proxy`).

CRI is gRPC over HTTP/2 on a unix socket. The gpudefrag image carries no gRPC library, and one unary call needs
little of HTTP/2: the client preface, an empty SETTINGS frame, one HEADERS frame (HPACK literals without
indexing, no Huffman coding), one DATA frame (the 5-byte gRPC prefix and the protobuf message, encoded by hand:
`ExecSyncRequest{container_id=1, cmd=2, timeout=3}`), then the server's frames until the stream ends. The answer
is the `ExecSyncResponse{stdout=1, stderr=2, exit_code=3}` message; a gRPC error carries no message (its status
is in the trailers, which are HPACK-coded and not decoded here), and says so. Verified against containerd 2.2's
CRI on the real-node lab (tests/kubernetes/real/nodes/test_app_hook_nodes.py)."""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, RST_STREAM, SETTINGS, PING, GOAWAY = 0, 1, 3, 4, 6, 7
END_STREAM = ACK = 0x1
END_HEADERS, PADDED = 0x4, 0x8
EXEC_SYNC = "/runtime.v1.RuntimeService/ExecSync"
VERSION = "/runtime.v1.RuntimeService/Version"


class CriError(Exception):
    """The runtime could not be reached, or refused the call; the message says which and what it answered."""


@dataclass(frozen=True)
class ExecResult:
    exit_code: int
    stdout: bytes
    stderr: bytes


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _len_field(no: int, value: bytes) -> bytes:
    return _varint(no << 3 | 2) + _varint(len(value)) + value


def exec_sync_request(container_id: str, cmd: list[str], timeout_s: int) -> bytes:
    """The protobuf encoding of `runtime.v1.ExecSyncRequest`."""
    msg = _len_field(1, container_id.encode())
    for arg in cmd:
        msg += _len_field(2, arg.encode())
    return msg + _varint(3 << 3) + _varint(timeout_s)


def _fields(msg: bytes) -> dict[int, bytes | int]:
    """A protobuf message's top-level fields (varints and length-delimited; fixed-width ones skipped)."""
    fields: dict[int, bytes | int] = {}
    i = 0

    def varint() -> int:
        nonlocal i
        n = shift = 0
        while True:
            if i >= len(msg):
                raise CriError("the runtime's answer is cut short")
            b = msg[i]
            i += 1
            n |= (b & 0x7F) << shift
            shift += 7
            if not b & 0x80:
                return n

    while i < len(msg):
        key = varint()
        no, wire = key >> 3, key & 7
        if wire == 0:
            fields[no] = varint()
        elif wire == 2:
            n = varint()
            fields[no], i = msg[i:i + n], i + n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise CriError(f"the runtime's answer has wire type {wire}")
    return fields


def parse_exec_sync_response(msg: bytes) -> ExecResult:
    """`runtime.v1.ExecSyncResponse` from its protobuf encoding (unknown fields skipped)."""
    fields = _fields(msg)
    code, out, err = fields.get(3, 0), fields.get(1, b""), fields.get(2, b"")
    code = int(code) if isinstance(code, int) else 0
    code = code - (1 << 64) if code >= 1 << 63 else code  # int32 negatives come as 10-byte varints
    return ExecResult(code, out if isinstance(out, bytes) else b"", err if isinstance(err, bytes) else b"")


def _frame(kind: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + bytes([kind, flags]) + struct.pack(">I", stream) + payload


def _literal(name: str, value: str) -> bytes:
    """An HPACK header field: literal without indexing, new name, no Huffman coding (names and values < 127)."""
    n, v = name.encode(), value.encode()
    return b"\x00" + bytes([len(n)]) + n + bytes([len(v)]) + v


@dataclass(frozen=True)
class Runtime:
    """The node's CRI endpoint: `unix:///run/containerd/containerd.sock` (or a plain path)."""

    endpoint: str

    @property
    def path(self) -> str:
        return self.endpoint.removeprefix("unix://")

    def exec_sync(self, container_id: str, cmd: list[str], *, timeout_s: int = 30) -> ExecResult:
        """Run `cmd` in the container (as its runtime would for a kubelet exec probe) and wait for it."""
        data = self._call(EXEC_SYNC, exec_sync_request(container_id, cmd, timeout_s), timeout_s + 15)
        if data is None:
            raise CriError(f"the container runtime refused ExecSync in {container_id[:12]} (a gRPC error, no "
                           "answer: is the container running on this node?)")
        return parse_exec_sync_response(data)

    def version(self) -> str:
        """`RuntimeService/Version`: "containerd v2.2.9 (CRI v1)" — the agent says at start which runtime it reached."""
        data = self._call(VERSION, b"", 15)
        if data is None:
            raise CriError(f"the container runtime at {self.endpoint} refused Version")
        f = _fields(data)
        name, ver, api = (f.get(n, b"") for n in (2, 3, 4))
        return " ".join(x.decode() if isinstance(x, bytes) else str(x) for x in (name, ver)) + (
            f" (CRI {api.decode() if isinstance(api, bytes) else api})")

    def _call(self, path: str, body: bytes, timeout_s: float) -> bytes | None:
        """One unary gRPC call: the answer's message, or None where the server answered a gRPC error."""
        block = b"".join(_literal(k, v) for k, v in ((":method", "POST"), (":scheme", "http"), (":path", path),
                                                      (":authority", "localhost"),
                                                      ("content-type", "application/grpc"), ("te", "trailers")))
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(timeout_s)
        try:
            try:
                s.connect(self.path)
            except OSError as e:
                raise CriError(f"container runtime at {self.endpoint} unreachable: {e}") from None
            s.sendall(PREFACE + _frame(SETTINGS, 0, 0) + _frame(HEADERS, END_HEADERS, 1, block)
                      + _frame(DATA, END_STREAM, 1, b"\x00" + struct.pack(">I", len(body)) + body))
            data = self._answer(s)
        except (TimeoutError, OSError) as e:
            raise CriError(f"container runtime at {self.endpoint}: {e}") from None
        finally:
            s.close()
        if len(data) < 5:
            return None
        return data[5:5 + struct.unpack(">I", data[1:5])[0]]

    @staticmethod
    def _answer(s: socket.socket) -> bytes:
        """The DATA of stream 1 until the server ends it; SETTINGS and PING are acknowledged on the way."""
        buf = b""

        def read(n: int) -> bytes:
            nonlocal buf
            while len(buf) < n:
                chunk = s.recv(65536)
                if not chunk:
                    raise CriError("the container runtime closed the connection before it answered")
                buf += chunk
            out, buf = buf[:n], buf[n:]
            return out

        data = b""
        while True:
            head = read(9)
            length, kind, flags = int.from_bytes(head[:3], "big"), head[3], head[4]
            stream = struct.unpack(">I", head[5:9])[0] & 0x7FFFFFFF
            payload = read(length)
            if kind == SETTINGS and not flags & ACK:
                s.sendall(_frame(SETTINGS, ACK, 0))
            elif kind == PING and not flags & ACK:
                s.sendall(_frame(PING, ACK, 0, payload))
            elif kind == GOAWAY:
                raise CriError("the container runtime ended the connection: "
                               + payload[8:].decode("utf-8", "replace"))
            elif kind == RST_STREAM and stream == 1:
                raise CriError(f"the container runtime reset the call (HTTP/2 error {int.from_bytes(payload, 'big')})")
            elif kind in (DATA, HEADERS) and stream == 1:
                if kind == DATA:
                    if flags & PADDED:
                        payload = payload[1:len(payload) - payload[0]]
                    data += payload
                if flags & END_STREAM:
                    return data
