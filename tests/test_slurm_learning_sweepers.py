"""Sweepers that learn (Hydra's Optuna sweeper: each batch's trials chosen from the previous batch's results) on the
real Slurm cluster: refused in one line before anything is submitted when the jobs would not be waited for
(``slurm.detach=true``), and given every job's real result when they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.helpers import train_py

pytest.importorskip("hydra_plugins.hydra_optuna_sweeper")
pytestmark = [pytest.mark.slurm, pytest.mark.slow]

BASE = ["launcher=slurm", "slurm.gpus_per_node=0", "slurm.partition=debug", "slurm.time=00:10:00",
        "slurm.nodes=1", "slurm.ntasks_per_node=1", "step_scheduler.max_steps=3"]
OPTUNA = ["hydra/sweeper=optuna", "hydra.sweeper.sampler.seed=0", "optim.lr=interval(1e-4,1e-2)"]


def test_a_learning_sweeper_with_detached_jobs_is_refused_in_one_line_before_sbatch(slurm_cluster,
                                                                                    tmp_path: Path) -> None:
    sweep = tmp_path / "S"
    proc = train_py("-m", *BASE, *OPTUNA, "slurm.detach=true", "hydra.sweeper.n_trials=2", "hydra.sweeper.n_jobs=1",
                    f"hydra.sweep.dir={sweep}", check=False)
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert errors == [proc.stdout.strip().splitlines()[-1]], proc.stdout[-3000:]
    assert "slurm.detach=true is invalid: it must be false here" in errors[0], errors
    assert "hydra/sweeper=optuna" in errors[0] and "waited for" in errors[0], errors
    assert not list(sweep.rglob("sbatch*.sh")) and not list(sweep.rglob("submission.json")), "something was submitted"


def test_a_learning_sweeper_gets_each_batchs_real_results_before_the_next(slurm_cluster, tmp_path: Path) -> None:
    """Two batches of two trials: the second is submitted after the first has ended, and the study is told the
    losses the jobs wrote."""
    sweep = tmp_path / "S"
    proc = train_py("-m", *BASE, *OPTUNA, "hydra.sweeper.n_trials=4", "hydra.sweeper.n_jobs=2",
                    f"hydra.sweep.dir={sweep}", timeout=600)
    out = proc.stdout
    first_done, second_prepared = out.find("2 done (2 COMPLETED)"), out.find("#2 : ")
    assert 0 <= first_done < second_prepared, out[-3000:]  # batch 2 chosen after batch 1 ended
    losses = [json.loads((sweep / str(i) / "result.json").read_text())["loss"] for i in range(4)]
    assert all(isinstance(v, float) for v in losses), losses
    best = yaml.safe_load((sweep / "optimization_results.yaml").read_text())
    assert best["best_value"] == min(losses)  # the study saw the real objective values
    lrs = [yaml.safe_load((sweep / str(i) / ".hydra" / "overrides.yaml").read_text()) for i in range(4)]
    assert len({str(o) for o in lrs}) == 4  # four distinct trials
