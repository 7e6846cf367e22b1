"""An unmodified AutoModel fine-tuning YAML through the product itself: ``automodel-hydra F.yaml --a.b=c`` plans it
(its sections pass through to AutoModel's recipe), our interactive launcher runs 2 gloo ranks, they checkpoint,
and a second command in the same run dir resumes. Local tiny model and data (tests/automodel_assets.py); AutoModel's
hard-coded CUDA calls go to the CPU through the tests' stand-in on the ranks' PYTHONPATH."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.automodel_assets import SQUAD_YAML, cpu_overrides, rank_env

pytest_plugins = ["tests.automodel_assets"]
pytestmark = [pytest.mark.automodel, pytest.mark.slow]
pytest.importorskip("nemo_automodel")


def launch(run: Path, overrides: list[str]) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "automodel_hydra.cli", str(SQUAD_YAML), *(f"--{o}" for o in overrides),
           "++interactive.nproc_per_node=2", f"hydra.run.dir={run}"]
    return subprocess.run(cmd, env=rank_env(), cwd=run.parent, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True, timeout=900)


def test_automodel_yaml_runs_unchanged_through_our_launcher_and_resumes(tiny_llama_dir: Path, squad_dir: Path,
                                                                         tmp_path: Path) -> None:
    run, ckpt = tmp_path / "R", tmp_path / "ckpt"
    first = launch(run, cpu_overrides(tiny_llama_dir, squad_dir, ckpt, max_steps=4, ckpt_every_steps=2))
    assert first.returncode == 0, first.stdout[-4000:]
    spec = (run / "launch" / "job.yaml").read_text()
    assert "recipe: TrainFinetuneRecipeForNextTokenPrediction" in spec and "slurm" not in spec
    assert (ckpt / "LATEST").exists()
    assert json.loads((run / "result.json").read_text())["stopped_early"] is False
    second = launch(run, cpu_overrides(tiny_llama_dir, squad_dir, ckpt, max_steps=6, ckpt_every_steps=2))
    assert second.returncode == 0, second.stdout[-4000:]
    assert "Loading checkpoint from" in second.stdout  # AutoModel resumed from LATEST in checkpoint_dir
    rows = [json.loads(line) for line in (ckpt / "training.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows][-2:] == [4, 5]  # steps 0..3, then 4..5: every step once
