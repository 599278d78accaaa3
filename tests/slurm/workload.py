"""A stand-in training job for the Slurm tests: a step counter and a seeded buffer whose checksum must survive
a move. Every step appends `step=N node=NODE sha=HEX pid=PID` to --log; the node comes from the file the
gpudefrag wrapper rewrites at each start ($GPUDEFRAG_NODE_FILE), since a restored process keeps its old
environment. Kept free of gpudefrag imports so that it starts fast."""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import socket
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--log", required=True)
    ap.add_argument("--mb", type=int, default=4)
    ap.add_argument("--period", type=float, default=0.2)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--connect", help="hold a connection to this unix socket (CRIU cannot dump that)")
    a = ap.parse_args()
    if a.connect:
        held = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        held.connect(a.connect)
    buf = bytearray(random.Random(a.seed).randbytes(a.mb << 20))
    sha = hashlib.sha256(buf).hexdigest()[:16]
    node_file = os.environ.get("GPUDEFRAG_NODE_FILE", "")
    fd = os.open(a.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.write(fd, f"START pid={os.getpid()} sha={sha}\n".encode())
    step = 0
    while True:
        time.sleep(a.period)
        step += 1
        try:
            with open(node_file) as f:
                node = f.read().strip()
        except OSError:
            node = "?"
        now_sha = hashlib.sha256(buf).hexdigest()[:16]
        os.write(fd, f"step={step} node={node} sha={now_sha} pid={os.getpid()} t={time.time():.3f}\n".encode())


if __name__ == "__main__":
    main()
