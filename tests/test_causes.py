"""A rank's failure reaches the error file, the job log and the command's last line whatever its base class:
torch's ``CheckpointException`` derives from ``BaseException``, and ``torch.distributed.checkpoint`` raises it for
a load into a model of another shape and for a save onto a full disk. Real runs, 2 CPU ranks (gloo)."""

from __future__ import annotations

import json
import subprocess
import typing as tp
from pathlib import Path

import pytest

from tests.helpers import train_py

pytestmark = pytest.mark.slow

TWO = ("interactive.nproc_per_node=2",)


def _error_files(run: Path) -> list[dict[str, tp.Any]]:
    return [json.loads(p.read_text()) for p in (run / "launch").glob("torchrun/*/attempt_*/*/error.json")]


def _last_line(out: str) -> str:
    return out.strip().splitlines()[-1]


def test_resume_into_a_model_of_another_shape_names_the_mismatch(tmp_path: Path) -> None:
    run = tmp_path / "R"
    train_py(f"hydra.run.dir={run}", *TWO, "step_scheduler.max_steps=2", "step_scheduler.checkpoint_interval=2")
    proc = train_py(f"hydra.run.dir={run}", *TWO, "step_scheduler.max_steps=4", "model.hidden_size=128",
                    check=False)
    assert proc.returncode == 1, proc.stdout[-3000:]
    last = _last_line(proc.stdout)
    assert last.startswith("error: interactive job ") and "Size mismatch between saved" in last, last
    assert "embed_tokens" in last and "ValueError" in last, last
    messages = [e["message"]["message"] for e in _error_files(run)]
    assert messages and all("Size mismatch between saved" in m for m in messages), messages
    log = (run / "train.log").read_text()
    assert "rank 0 failed" in log and "rank 1 failed" in log and "Size mismatch between saved" in log


def test_a_save_onto_a_full_disk_names_enospc(tmp_path: Path) -> None:
    """The checkpoint dir is a 256 KiB tmpfs mounted here (a real filesystem that fills up); skipped where this
    process may not mount one (not root, no CAP_SYS_ADMIN)."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mnt)], capture_output=True,
                             text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {mounted.stderr.strip()}")
    try:
        run = tmp_path / "R"
        proc = train_py(f"hydra.run.dir={run}", *TWO, "step_scheduler.max_steps=2",
                        "step_scheduler.checkpoint_interval=1", f"checkpoint.dir={mnt}", check=False)
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
    assert proc.returncode == 1, proc.stdout[-3000:]
    last = _last_line(proc.stdout)
    assert last.startswith("error: interactive job ") and "No space left on device" in last, last
    assert any("No space left on device" in e["message"]["message"] for e in _error_files(run))
    assert "No space left on device" in (run / "train.log").read_text()
