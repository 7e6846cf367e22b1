"""A user's recipe function written against NeMo AutoModel's key names (``checkpoint.checkpoint_dir``,
``optimizer.lr``, ``step_scheduler.max_steps``) that resumes the way AutoModel's recipes do: from ``LATEST`` in its
checkpoint dir, with no flag. Its "training" is arithmetic (no torch): a test of where a job writes and what it
reports, not of learning. Used by tests/test_truth.py."""

from __future__ import annotations

import json
import os
import typing as tp
from pathlib import Path


def main(cfg: tp.Any, dist: tp.Any, should_stop: tp.Callable[[], bool]) -> dict[str, tp.Any]:
    ckpt = Path(cfg.checkpoint.checkpoint_dir)
    max_steps = int(cfg.step_scheduler.max_steps)
    start = int((ckpt / "LATEST").read_text()) if (ckpt / "LATEST").is_file() else 0
    loss = None
    for step in range(start + 1, max_steps + 1):
        loss = float(cfg.optimizer.lr) * 1000 / step
    if dist.rank == 0:
        ckpt.mkdir(parents=True, exist_ok=True)
        with (ckpt / "training.jsonl").open("a") as f:
            f.write(json.dumps({"start": start, "end": max_steps, "loss": loss, "cwd": os.getcwd()}) + "\n")
        (ckpt / "LATEST").write_text(f"{max_steps}\n")
    return {"step": max_steps, "loss": loss}
