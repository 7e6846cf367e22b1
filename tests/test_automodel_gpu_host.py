"""An AutoModel recipe planned for torchrun on a host without CUDA: AutoModel 0.7.0's recipe calls CUDA in
``setup()`` whatever the config, so the plan says so in one line (a dry run plans anyway and warns) instead of every
rank failing after start-up. The same question answered by the tests' named CPU stand-in on ``PYTHONPATH``
(tests/standins/automodel_cpu) plans with no line, as its ranks then train; Slurm and SkyPilot plans are not asked
(their ranks run elsewhere)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.automodel_assets import CPU_STANDIN, SQUAD_YAML, cpu_overrides, rank_env

pytest_plugins = ["tests.automodel_assets"]
pytestmark = [pytest.mark.automodel, pytest.mark.slow]
pytest.importorskip("nemo_automodel")

LINE = ("recipe=TrainFinetuneRecipeForNextTokenPrediction needs a GPU host: NeMo AutoModel 0.7.0's recipe calls "
        "torch.cuda.reset_peak_memory_stats() in setup()")


def _no_cuda_here() -> bool:
    import torch

    return not torch.cuda.is_available()


pytestmark.append(pytest.mark.skipif(not _no_cuda_here(), reason="this host has CUDA: the recipe can run here"))


def cli(run: Path, args: list[str], standin: bool) -> tuple[subprocess.CompletedProcess[str], float]:
    env = rank_env()
    if not standin:
        env["PYTHONPATH"] = os.pathsep.join(p for p in env["PYTHONPATH"].split(os.pathsep) if p != str(CPU_STANDIN))
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", str(SQUAD_YAML), *args,
                           f"hydra.run.dir={run}"], env=env, cwd=run.parent, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    return proc, time.monotonic() - t0


def test_torchrun_here_without_cuda_is_one_line_before_any_rank_starts(tiny_llama_dir: Path, squad_dir: Path,
                                                                        tmp_path: Path) -> None:
    args = [f"--{o}" for o in cpu_overrides(tiny_llama_dir, squad_dir, tmp_path / "ckpt")]
    proc, wall = cli(tmp_path / "R", args, standin=False)
    assert proc.returncode != 0
    errors = [ln for ln in proc.stdout.splitlines() if ln.startswith("error: ")]
    assert len(errors) == 1 and errors[0].startswith("error: " + LINE), proc.stdout[-3000:]
    assert "launcher=slurm or launcher=skypilot" in errors[0] and "_cuda_resetPeakMemoryStats" in errors[0]
    assert not (tmp_path / "R" / "launch" / "torchrun").exists() and not (tmp_path / "ckpt").exists()
    print(f"\nrefused at plan time in {wall:.1f} s (old main: every rank failed in setup())")

    dry, _ = cli(tmp_path / "D", [*args, "dry_run=true"], standin=False)
    assert dry.returncode == 0 and "dry run: wrote" in dry.stdout
    assert LINE in dry.stdout and "(dry run: planned anyway)" in dry.stdout

    shimmed, _ = cli(tmp_path / "S", [*args, "dry_run=true"], standin=True)
    assert shimmed.returncode == 0 and "dry run: wrote" in shimmed.stdout and "GPU host" not in shimmed.stdout

    on_nodes = [f"--{o}" for o in cpu_overrides(tiny_llama_dir, squad_dir, Path("ckpt"))]  # in the job's bucket
    sky, _ = cli(tmp_path / "K", [*on_nodes, "launcher=skypilot", "skypilot.hf_token=", "dry_run=true"],
                 standin=False)
    assert sky.returncode == 0 and "dry run: wrote" in sky.stdout, sky.stdout[-3000:]
    assert "GPU host" not in sky.stdout
