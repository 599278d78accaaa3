"""A small, deterministic PyTorch CPU training loop that checkpoints through gpudefrag.job at safe points.

Usage: python train_torch.py --steps N --out WEIGHTS --log LOG [--sleep S]. Batches depend only on the seed
and the step (so a resumed run sees the same data); model, optimizer and RNG state are what a checkpoint holds.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from torch import nn

from gpudefrag.job import Job

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=40)
ap.add_argument("--seed", type=int, default=1)
ap.add_argument("--sleep", type=float, default=0.0)
ap.add_argument("--out", required=True)
ap.add_argument("--log", required=True)
a = ap.parse_args()

torch.set_num_threads(1)
torch.use_deterministic_algorithms(True)
torch.manual_seed(a.seed)
model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.2), nn.Linear(64, 1))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
step = 0


def save(d: Path) -> None:
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "rng": torch.get_rng_state(),
                "step": step}, d / "state.pt")


def load(d: Path) -> None:
    global step
    ck = torch.load(d / "state.pt", weights_only=True)
    model.load_state_dict(ck["model"])
    opt.load_state_dict(ck["opt"])
    torch.set_rng_state(ck["rng"])
    step = ck["step"]


def log(line: str) -> None:
    with open(a.log, "a") as f:
        f.write(line + "\n")


job = Job(save, load)
meta = job.resume()
log(f"START pid={os.getpid()} resumed_from={meta['step'] if meta else 0} step={step}")
while step < a.steps:
    g = torch.Generator().manual_seed(a.seed * 1_000_003 + step)
    x = torch.randn(128, 32, generator=g)
    y = x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(128, 1, generator=g)
    loss = nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
    step += 1
    log(f"step={step} loss={loss.item():.6f}")
    if job.safe_point(step):
        log(f"SAVED step={step}")
    time.sleep(a.sleep)
torch.save(model.state_dict(), a.out)
log(f"DONE step={step}")
