"""Every sweep in ``sweeps/`` composes, says how to run it, and runs (LHT ``tests/test_sweeps.py``).

Local sweeps run for real with tiny steps on the interactive launcher; Slurm sweeps run as dry runs (the real
cluster's sweeps are tested in ``test_slurm_cluster_jobs.py`` and ``test_cli.py``)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from automodel_hydra import records
from automodel_hydra.backends.interactive import free_port
from tests.helpers import CONF, ROOT, compose_cfg, metrics, train_py

SWEEPS = sorted(p.stem for p in (ROOT / "sweeps").glob("*.yaml"))
TINY = ["step_scheduler.max_steps=2", "step_scheduler.log_interval=1", "checkpoint.enabled=false"]


def test_sweeps_dir_is_the_sweep_config_group() -> None:
    assert {"lr_seed", "slurm_nodes"} <= set(SWEEPS)
    assert (CONF / "sweep").resolve() == (ROOT / "sweeps").resolve()


@pytest.mark.parametrize("name", SWEEPS)
def test_sweep_composes_as_a_multirun_and_documents_its_command(name: str) -> None:
    text = (ROOT / "sweeps" / f"{name}.yaml").read_text()
    assert text.startswith("# @package _global_\n")
    assert f"python train.py -m sweep={name}" in text, "the header comment gives the exact command line"
    cfg = compose_cfg([f"sweep={name}"])
    assert str(cfg.hydra.mode) == "RunMode.MULTIRUN"
    params = cfg.hydra.sweeper.params
    assert params and all("," in str(v) for v in params.values()), f"{name} sweeps nothing: {params}"


def test_slurm_nodes_routes_to_slurm() -> None:
    cfg = compose_cfg(["sweep=slurm_nodes"])
    assert cfg.hydra.launcher._target_.endswith(".AutomodelLauncher")
    assert cfg.slurm is not None and "slurm.nodes" in cfg.hydra.sweeper.params


@pytest.mark.slow
def test_lr_seed_runs_locally_and_the_command_line_narrows_it(tmp_path: Path) -> None:
    sweep = tmp_path / "S"
    # one learning rate from the command line (replacing the file's three), both seeds from the file: 2 jobs
    port = free_port(random.randrange(20000, 40000, 100))  # away from other test runs sharing this machine
    train_py("-m", "sweep=lr_seed", "optim.lr=3e-3", "interactive.nproc_per_node=1", *TINY,
             f"interactive.master_port={port}", f"hydra.sweep.dir={sweep}")
    jobs = records.manifest_jobs(sweep)  # (its paths stored relative to the sweep dir: read as paths here)
    points = [[o for o in j["overrides"] if o.startswith(("optim.lr=", "seed="))] for j in jobs]
    assert points == [["optim.lr=0.003", "seed=1"], ["optim.lr=0.003", "seed=2"]]
    for job in jobs:
        assert [r["step"] for r in metrics(Path(job["job_dir"]))] == [1, 2]
        assert (Path(job["job_dir"]) / "result.json").exists()


@pytest.mark.slow
def test_slurm_nodes_dry_run_plans_one_array_per_node_count(tmp_path: Path) -> None:
    sweep = tmp_path / "S"
    # a partition of 4 nodes or more (where the test cluster answers, its 2-node debug partition would refuse
    # slurm.nodes=4 before planning; a partition it does not list is not checked)
    out = train_py("-m", "sweep=slurm_nodes", "slurm.partition=batch", "dry_run=true",
                   f"hydra.sweep.dir={sweep}").stdout
    assert "nothing was submitted" in out
    scripts = sorted((sweep / "launch").glob("sbatch*.sh"))
    nodes = sorted(int(line.split("=")[1]) for s in scripts for line in s.read_text().splitlines()
                   if line.startswith("#SBATCH --nodes="))
    assert nodes == [1, 2, 4]
    assert all(s.read_text().count("#SBATCH --array=") == 1 for s in scripts)
    assert not (sweep / "launch" / "manifest.json").exists()  # nothing submitted


@pytest.mark.slow
def test_slurm_seed_sweep_dry_run_writes_one_plan_with_a_single_array(tmp_path: Path) -> None:
    """``python train.py -m seed=1,2,3 launcher=slurm slurm.partition=debug slurm.ntasks_per_node=2 dry_run=true``."""
    sweep = tmp_path / "S2"
    train_py("-m", "seed=1,2,3", "launcher=slurm", "slurm.partition=debug", "slurm.ntasks_per_node=2", "dry_run=true",
             f"hydra.sweep.dir={sweep}")
    scripts = list((sweep / "launch").glob("*.sh"))
    assert [s.name for s in scripts] == ["sbatch.sh"]
    arrays = [line for line in scripts[0].read_text().splitlines() if line.startswith("#SBATCH --array=")]
    assert len(arrays) == 1 and arrays[0].startswith("#SBATCH --array=0-2"), arrays
