"""An unmodified AutoModel fine-tuning YAML through the product itself: ``automodel-hydra F.yaml --a.b=c`` plans it
(its sections pass through to AutoModel's recipe), our interactive launcher runs 2 gloo ranks, they checkpoint,
and a second command in the same run dir resumes. Local tiny model and data (tests/automodel_assets.py); AutoModel's
hard-coded CUDA calls go to the CPU through the tests' stand-in on the ranks' PYTHONPATH."""

from __future__ import annotations

import csv
import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.automodel_assets import SQUAD_YAML, cpu_overrides, rank_env
from tests.test_quiet import NOISE

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
    # the dependency lines automodel_hydra.quiet filters: none from the driver, torchrun's agent or either rank
    printed = first.stdout + "".join(p.read_text(errors="replace") for p in run.rglob("*.log"))
    for fragment in [*NOISE.values(), "extended ALLOWED_"]:
        assert fragment not in printed, printed[-4000:]
    spec = (run / "launch" / "job.yaml").read_text()
    assert "recipe: TrainFinetuneRecipeForNextTokenPrediction" in spec and "slurm" not in spec
    assert (ckpt / "LATEST").exists()
    assert json.loads((run / "result.json").read_text())["stopped_early"] is False
    second = launch(run, cpu_overrides(tiny_llama_dir, squad_dir, ckpt, max_steps=6, ckpt_every_steps=2))
    assert second.returncode == 0, second.stdout[-4000:]
    assert "Loading checkpoint from" in second.stdout  # AutoModel resumed from LATEST in checkpoint_dir
    rows = [json.loads(line) for line in (ckpt / "training.jsonl").read_text().splitlines() if line.strip()]
    assert [r["step"] for r in rows][-2:] == [4, 5]  # steps 0..3, then 4..5: every step once
    # a curve from AutoModel's own records (training.jsonl, validation.jsonl in its checkpoint dir)
    report = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", "report", str(run)], capture_output=True,
                            text=True, timeout=120)
    assert report.returncode == 0, report.stdout + report.stderr
    assert (run / "report" / "loss.png").stat().st_size > 10_000
    with open(run / "report" / "curves.csv") as f:
        points = list(csv.DictReader(f))
    assert [int(p["step"]) for p in points if p["loss"]] == list(range(6))
    assert any(p["val_loss"] for p in points), "validation loss from validation.jsonl"
    status = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", "status", str(run), "--json"],
                            capture_output=True, text=True, timeout=120, check=True)
    (row,) = json.loads(status.stdout)
    assert row["step"] == 5 and row["loss"] == rows[-1]["loss"]


def train_steps(ckpt: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (ckpt / "training.jsonl").read_text().splitlines() if line.strip()]


def test_top_level_restore_from_d_latest_resumes_the_newest_checkpoint_of_d_then_the_jobs_own(
        tiny_llama_dir: Path, squad_dir: Path, tmp_path: Path) -> None:
    """The spot-resume key ``restore_from: {path: D/latest}`` with AutoModel's recipe and its own layout: a new job
    with its own (empty) checkpoint dir starts from D's newest complete checkpoint (AutoModel alone ignores the
    key and starts at step 0); once the job has a checkpoint of its own, the same command (a recovery) continues
    from that one, not from D's again."""
    d = tmp_path / "ckptA"
    first = launch(tmp_path / "R1", cpu_overrides(tiny_llama_dir, squad_dir, d, max_steps=4, ckpt_every_steps=2))
    assert first.returncode == 0, first.stdout[-4000:]
    assert sorted(p.name for p in d.glob("epoch_*")) == ["epoch_0_step_1", "epoch_0_step_3"]

    own = tmp_path / "ckptB"
    resume = [f"restore_from.path={d}/latest"]
    second = launch(tmp_path / "R2", [*cpu_overrides(tiny_llama_dir, squad_dir, own, max_steps=6,
                                                     ckpt_every_steps=2), *resume])
    assert second.returncode == 0, second.stdout[-4000:]
    assert f"Loading checkpoint from {d / 'epoch_0_step_3'}" in second.stdout, second.stdout[-4000:]
    assert f"restore_from.path='{d}/latest': resuming from {d / 'epoch_0_step_3'}" in second.stdout
    assert train_steps(own) == [4, 5]  # resumed from step 4 (old main: [0, ..., 5])

    third = launch(tmp_path / "R2", [*cpu_overrides(tiny_llama_dir, squad_dir, own, max_steps=8,
                                                    ckpt_every_steps=2), *resume])
    assert third.returncode == 0, third.stdout[-4000:]
    assert f"Loading checkpoint from {own / 'epoch_0_step_5'}" in third.stdout, third.stdout[-4000:]
    assert train_steps(own) == [4, 5, 6, 7]
    assert sorted(p.name for p in d.glob("epoch_*")) == ["epoch_0_step_1", "epoch_0_step_3"]  # D untouched


SLURM_SECTION = """
slurm:
  job_name: squad_ft
  nodes: 2
  ntasks_per_node: 1
  time: 00:10:00
  gpus_per_node: 0
"""


def with_slurm_section(tmp_path: Path, partition: str | None = None) -> Path:
    """The AutoModel YAML with an AutoModel-style ``slurm:`` block appended (as its docs show one)."""
    path = tmp_path / "squad_slurm.yaml"
    extra = f"  partition: {partition}\n" if partition else ""
    path.write_text(SQUAD_YAML.read_text() + SLURM_SECTION + extra)
    return path


def test_a_sweep_over_a_recipe_key_of_an_automodel_file_is_one_slurm_array(tiny_llama_dir: Path, squad_dir: Path,
                                                                          tmp_path: Path) -> None:
    cfg = with_slurm_section(tmp_path)
    sweep = tmp_path / "S"
    # relative: each sweep job's own checkpoint dir, under its job dir (a shared absolute one is refused)
    overrides = [f"--{o}" for o in cpu_overrides(tiny_llama_dir, squad_dir, Path("ckpt"))]
    proc = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", str(cfg), "-m", "optimizer.lr=1e-5,3e-5",
                           *overrides, "dry_run=true", f"hydra.sweep.dir={sweep}"], env=rank_env(), cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:]
    scripts = sorted(p.name for p in (sweep / "launch").glob("*.sh"))
    assert scripts == ["sbatch.sh"]
    array = (sweep / "launch" / "sbatch.sh").read_text()
    assert "#SBATCH --array=0-1%2" in array and "#SBATCH --nodes=2" in array and "#SBATCH --time=10" in array
    lrs = [yaml_lr((sweep / str(i) / "launch" / "job.yaml").read_text()) for i in range(2)]
    assert lrs == [1e-5, 3e-5]  # each job's recipe sections carry its own point


def yaml_lr(text: str) -> float:
    import yaml

    return float(yaml.safe_load(text)["optimizer"]["lr"])


@pytest.mark.slurm
def test_automodel_file_with_a_slurm_section_runs_as_a_two_node_job(slurm_cluster: object, tiny_llama_dir: Path,
                                                                     squad_dir: Path, tmp_path: Path) -> None:
    cfg = with_slurm_section(tmp_path, partition="debug")
    run, ckpt = tmp_path / "R", tmp_path / "ckpt"
    overrides = [f"--{o}" for o in cpu_overrides(tiny_llama_dir, squad_dir, ckpt, max_steps=3, ckpt_every_steps=3)]
    proc = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", str(cfg), *overrides,
                           "++slurm.wait=true", f"hydra.run.dir={run}"], env=rank_env(), cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "submitted slurm job" in proc.stdout
    result = json.loads((run / "result.json").read_text())
    assert result["stopped_early"] is False
    assert (ckpt / "LATEST").exists()
