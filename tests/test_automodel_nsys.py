"""``profile=nsys`` for recipes that are not the bundled one: the capture range ``profile.nsys.start_step..
stop_step`` comes from the optimizer's steps (torch's global step hook), so NeMo AutoModel's recipe, which never
calls the profiler API, gets the range it asked for; a container job checks for ``nsys`` inside the image, where
nsys runs. ``nsys`` is a STAND-IN here (tests/standins/nsys: a CPU machine has no Nsight Systems); on CPU the
profiler calls themselves are skipped and logged."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from automodel_hydra import config
from automodel_hydra.backends import slurm
from automodel_hydra.plan import JobSpec
from tests.automodel_assets import SQUAD_YAML, cpu_overrides, rank_env
from tests.helpers import ROOT, compose_cfg

pytest_plugins = ["tests.automodel_assets"]
STANDINS = ROOT / "tests" / "standins"


def test_the_range_follows_the_optimizer_steps_of_any_recipe() -> None:
    import torch

    from automodel_hydra.profile import StepRange

    weight = torch.nn.Parameter(torch.ones(2))
    optimizer = torch.optim.AdamW([weight], lr=0.1)
    capture = StepRange(config.NsysConfig(enabled=True, start_step=2, stop_step=3), cuda=False).install()
    for _ in range(5):
        weight.grad = torch.ones(2)
        optimizer.step()
    capture.close()
    assert capture.calls == [("start", 2), ("stop", 3)]  # start once step 1 is done, stop once step 3 is
    # a run that ends inside the range stops the capture; a range from step 1 starts before the first step
    early = StepRange(config.NsysConfig(enabled=True, start_step=1, stop_step=10), cuda=False).install()
    weight.grad = torch.ones(2)
    optimizer.step()  # AdamW's own count is 6 now: past the range's start, inside it
    early.close()
    assert early.calls == [("start", 1), ("stop", 1)]


def test_a_container_job_checks_for_nsys_inside_the_image() -> None:
    cfg = config.load(compose_cfg(["launcher=slurm", "profile=nsys", "slurm.container_image=nvcr.io/nvidia/nemo:25.02",
                                   "slurm.ntasks_per_node=1"], "/scratch/R"))
    text = slurm.Slurm().plan(cfg, JobSpec(Path("/scratch/R"), "train")).files["sbatch.sh"]
    batch, srun = text.split("\nsrun ", 1)
    assert "command -v nsys" not in batch  # the batch step runs on the host, outside the image
    prologue = srun.split(" automodel-hydra nsys profile ", 1)[0]
    assert "command -v nsys" in prologue and "not on PATH" in prologue  # in the task, in the container
    bare = config.load(compose_cfg(["launcher=slurm", "profile=nsys", "slurm.ntasks_per_node=1"], "/scratch/R"))
    bare_text = slurm.Slurm().plan(bare, JobSpec(Path("/scratch/R"), "train")).files["sbatch.sh"]
    assert "command -v nsys" in bare_text.split("\nsrun ", 1)[0]  # bare metal: the nodes' own environment


@pytest.mark.automodel
@pytest.mark.slow
def test_an_automodel_recipe_on_two_ranks_gets_the_capture_range(tiny_llama_dir: Path, squad_dir: Path,
                                                                 tmp_path: Path) -> None:
    pytest.importorskip("nemo_automodel")
    run, ckpt = tmp_path / "R", tmp_path / "ckpt"
    overrides = [f"--{o}" for o in cpu_overrides(tiny_llama_dir, squad_dir, ckpt, max_steps=4, ckpt_every_steps=100,
                                                   val_every_steps=100)]
    env = {**rank_env(), "PATH": f"{STANDINS}:{os.environ['PATH']}",
           "NSYS_STANDIN_LOG": str(tmp_path / "nsys-calls.jsonl")}
    nsys = ["++profile.nsys.enabled=true", "++profile.nsys.start_step=2", "++profile.nsys.stop_step=3"]
    proc = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", str(SQUAD_YAML), *overrides, *nsys,
                           "++interactive.nproc_per_node=2", f"hydra.run.dir={run}"], env=env, cwd=tmp_path,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-4000:]
    host = socket.gethostname()
    assert sorted(p.name for p in run.glob("*.nsys-rep")) == [f"train_{host}_rank0_attempt0.nsys-rep",
                                                              f"train_{host}_rank1_attempt0.nsys-rep"]
    calls = [json.loads(line) for line in (tmp_path / "nsys-calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2 and all("--capture-range=cudaProfilerApi" in argv for argv in calls)
    log = (run / "train.log").read_text()
    assert "nsys capture range: cudaProfilerStart before step 2" in log
    assert "nsys capture range: cudaProfilerStop after step 3" in log
    assert json.loads((run / "result.json").read_text())["step"] == 4
