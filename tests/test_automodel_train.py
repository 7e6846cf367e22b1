"""An unmodified AutoModel fine-tuning YAML (tests/data/automodel/llama3_2_1b_squad.yaml) trains on 2 gloo ranks
under real torchrun through the AutoModel adapter, checkpoints, resumes from ``LATEST``, and stops with a checkpoint
on SIGUSR2. The model and data are local (tests/automodel_assets.py); AutoModel's three hard-coded CUDA calls go to
the CPU through the tests' stand-in (tests/standins/automodel_cpu/sitecustomize.py)."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from tests.automodel_assets import CPU_STANDIN, SQUAD_YAML, cpu_overrides, rank_env

pytest_plugins = ["tests.automodel_assets"]  # the tiny_llama_dir and squad_dir fixtures
pytestmark = [pytest.mark.automodel, pytest.mark.slow]
pytest.importorskip("nemo_automodel")

STANDIN = CPU_STANDIN / "worker_standin.py"


def torchrun(out_dir: Path, overrides: list[str]) -> subprocess.Popen[str]:
    """2 gloo ranks of the worker stand-in on :data:`SQUAD_YAML`; stdout+stderr go to ``out_dir/log.txt``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(STANDIN),
           str(SQUAD_YAML), *overrides, "--result-dir", str(out_dir)]
    log = (out_dir / "log.txt").open("w")
    return subprocess.Popen(cmd, env=rank_env(), cwd=out_dir, stdout=log, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen[str], out_dir: Path, timeout: float = 600) -> tuple[int, float]:
    start = time.monotonic()
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"torchrun did not finish in {timeout} s:\n{log_tail(out_dir)}") from None
    return rc, time.monotonic() - start


def log_tail(out_dir: Path, n: int = 4000) -> str:
    return (out_dir / "log.txt").read_text(errors="replace")[-n:]


def results(out_dir: Path) -> list[dict[str, tp.Any]]:
    return [json.loads((out_dir / f"result.rank{r}.json").read_text()) for r in range(2)]


def train_rows(ckpt: Path) -> list[dict[str, tp.Any]]:
    return [json.loads(line) for line in (ckpt / "training.jsonl").read_text().splitlines() if line.strip()]


def test_squad_yaml_trains_checkpoints_and_resumes(tiny_llama_dir: Path, squad_dir: Path, tmp_path: Path,
                                                   record_property: tp.Callable[[str, tp.Any], None]) -> None:
    ckpt = tmp_path / "checkpoints"

    def run(name: str, max_steps: int) -> float:
        """One run of the file in ``tmp_path/name`` to ``max_steps``; its wall time (s)."""
        t0 = time.monotonic()
        proc = torchrun(tmp_path / name, cpu_overrides(tiny_llama_dir, squad_dir, ckpt, max_steps=max_steps,
                                                       ckpt_every_steps=3, val_every_steps=3))
        rc, _ = finish(proc, tmp_path / name)
        wall = time.monotonic() - t0
        assert rc == 0, log_tail(tmp_path / name)
        return wall

    wall1 = run("run1", 6)
    r0, r1 = results(tmp_path / "run1")
    assert (r0["kind"], r0["step"], r0["stopped_early"], r0["world_size"]) == ("automodel", 6, False, 2)
    assert r1["step"] == 6 and math.isfinite(r0["loss"]) and math.isfinite(r0["val_loss"])
    # AutoModel's layout: epoch_E_step_N (0-based step of the last step in it) and a LATEST symlink
    assert sorted(p.name for p in ckpt.glob("epoch_*")) == ["epoch_0_step_2", "epoch_0_step_5"]
    assert (ckpt / "LATEST").resolve().name == "epoch_0_step_5"
    assert [row["step"] for row in train_rows(ckpt)] == [0, 1, 2, 3, 4, 5]
    assert "torch distributed is already initialized, skipping initialization." in log_tail(tmp_path / "run1",
                                                                                         10**7)

    wall2 = run("run2", 9)
    assert f"Loading checkpoint from {ckpt / 'epoch_0_step_5'}" in log_tail(tmp_path / "run2", 10**7)
    assert results(tmp_path / "run2")[0]["step"] == 9
    assert [row["step"] for row in train_rows(ckpt)] == [0, 1, 2, 3, 4, 5, 6, 7, 8]  # resumed, not restarted
    assert (ckpt / "LATEST").resolve().name == "epoch_0_step_8"
    record_property("wall_s_train_6_steps", round(wall1, 1))
    record_property("wall_s_resume_3_steps", round(wall2, 1))
    print(f"\nAutoModel squad YAML on 2 gloo ranks: 6 steps {wall1:.1f} s, resume + 3 steps {wall2:.1f} s")


def test_sigusr2_checkpoints_the_current_step_and_stops(tiny_llama_dir: Path, squad_dir: Path,
                                                        tmp_path: Path) -> None:
    """SIGUSR2 is not AutoModel's default preemption signal; the adapter adds it, so Slurm's time-limit warning
    checkpoints like SIGTERM does. Only rank 1 is signalled: AutoModel's handler agrees across ranks."""
    ckpt, out = tmp_path / "checkpoints", tmp_path / "run"
    proc = torchrun(out, cpu_overrides(tiny_llama_dir, squad_dir, ckpt, max_steps=12, ckpt_every_steps=100,
                                       val_every_steps=100))
    deadline = time.monotonic() + 600
    while "| step 1 |" not in (out / "log.txt").read_text(errors="replace"):
        assert proc.poll() is None and time.monotonic() < deadline, log_tail(out)
        time.sleep(0.5)
    os.kill(int((out / "pid.rank1").read_text()), signal.SIGUSR2)
    rc, _ = finish(proc, out)
    assert rc != 0, "stopped ranks exit 143 (the worker's EXIT_STOPPED), so torchrun reports the stop"
    r0, r1 = results(out)
    assert r0["stopped_early"] is True and r1["stopped_early"] is True, log_tail(out)
    assert r0["step"] == r1["step"] < 12
    saved = sorted(p.name for p in ckpt.glob("epoch_*"))
    assert saved == [f"epoch_0_step_{r0['step'] - 1}"]  # the step it stopped at, and no other
    assert (ckpt / "LATEST").resolve().name == saved[0]
