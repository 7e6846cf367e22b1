"""Every run tells the truth: each sweep job writes its own dirs, a run with nothing left to do keeps its result,
and whether a job completed is read from what it wrote (the launch id), never from two machines' clocks.

The real-process tests run ``train.py`` as a user would, with one rank each (a recipe function with AutoModel's
key names, or the bundled recipe for 2 steps); the others decide outcomes from real files in a tmp dir."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import worker
from automodel_hydra.backends import interactive
from automodel_hydra.plan import JobSpec, Plan, read_run_id, write_run_id, written_by_this_launch
from automodel_hydra.states import JobState
from tests.helpers import ROOT

#: An AutoModel fine-tuning file as AutoModel ships them: a relative checkpoint dir, its own key names.
AUTOMODEL_SHAPED = """\
recipe: tests.recipe_automodel_keys:main
step_scheduler:
  max_steps: 2
optimizer:
  lr: 1.0e-3
checkpoint:
  checkpoint_dir: checkpoints/
"""


def train(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items()
           if k == "SLURM_CONF" or not k.startswith(("SLURM_", "SUBMITIT_", "HYDRA_FULL_ERROR"))}
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run([sys.executable, str(ROOT / "train.py"), *args], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)


def result(job_dir: Path) -> dict[str, tp.Any]:
    return tp.cast(dict[str, tp.Any], json.loads((job_dir / "result.json").read_text()))


# ----------------------------------------------------------------------------------------------- 1 + 2, for real


@pytest.mark.slow
def test_automodel_shaped_sweep_points_each_train_in_their_own_dir_and_a_rerun_keeps_their_results(
        tmp_path: Path) -> None:
    """``-m optimizer.lr=1e-3,3e-3`` over a file with ``checkpoint.checkpoint_dir: checkpoints/``, one point after
    the other. Each point trains steps 1..2 in ``<job dir>/checkpoints`` (the second never resumes from the
    first's LATEST); the same sweep again is a resume with nothing left to do: every point is kept, its result
    untouched (the id of the launch that made it)."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "am.yaml").write_text(AUTOMODEL_SHAPED)
    sweep = tmp_path / "S"
    args = ["--config-dir", str(tmp_path / "conf"), "--config-name", "am", "-m", "optimizer.lr=1e-3,3e-3",
            "++interactive.nproc_per_node=1", "++interactive.max_parallel=1", f"hydra.sweep.dir={sweep}"]
    t0 = time.monotonic()
    first = train(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-4000:]
    assert not (tmp_path / "checkpoints").exists(), "a relative checkpoint_dir was the launching dir's"
    losses = []
    for n, lr in ((0, 1e-3), (1, 3e-3)):
        jsonl = sweep / str(n) / "checkpoints" / "training.jsonl"
        rows = [json.loads(line) for line in jsonl.read_text().splitlines()]
        assert [(r["start"], r["end"]) for r in rows] == [(0, 2)], f"job {n} resumed from another's checkpoint"
        res = result(sweep / str(n))
        assert res["loss"] == pytest.approx(lr * 1000 / 2) and res["run_id"] == read_run_id(sweep / str(n) / "launch")
        losses.append((res["loss"], res["run_id"]))
    t1 = time.monotonic()
    again = train(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-4000:]
    assert again.stdout.splitlines()[0] == "resume: 2 of 2 members COMPLETED and kept; nothing to run again"
    for n in (0, 1):
        res = result(sweep / str(n))
        assert (res["loss"], res["run_id"]) == losses[n], "a kept member's result was replaced"
    print(f"timing: first sweep {t1 - t0:.1f} s, rerun {time.monotonic() - t1:.1f} s")


@pytest.mark.slow
def test_rerunning_a_finished_run_keeps_its_result_and_starts_nothing(tmp_path: Path) -> None:
    """The README's resume command a second time: ``hydra.run.dir=R step_scheduler.max_steps=2``."""
    run = tmp_path / "R"
    args = ["interactive.nproc_per_node=1", "step_scheduler.max_steps=2", "step_scheduler.log_interval=1",
            f"hydra.run.dir={run}"]
    first = train(*args, cwd=tmp_path)
    assert first.returncode == 0, first.stdout[-4000:]
    before = (run / "result.json").read_bytes()
    assert json.loads(before)["loss"] is not None
    pid, metrics = (run / "launch" / "pid").read_bytes(), (run / "metrics.jsonl").read_bytes()
    again = train(*args, cwd=tmp_path)
    assert again.returncode == 0, again.stdout[-4000:]
    assert f"{run}: already at step 2 (step_scheduler.max_steps): the earlier result is kept" in again.stdout
    assert (run / "result.json").read_bytes() == before
    assert (run / "launch" / "pid").read_bytes() == pid and (run / "metrics.jsonl").read_bytes() == metrics


# ----------------------------------------------------------------------------------------------- 2: the rank's rule


def test_a_rank_with_nothing_left_to_do_keeps_the_earlier_result(tmp_path: Path) -> None:
    path = tmp_path / "result.json"
    path.write_text(json.dumps({"step": 40, "loss": 1.25, "final_model": "F", "run_id": "old"}))
    kept = worker.write_result(path, {"step": 40, "loss": None, "stopped_early": False}, "new")
    assert kept == {"step": 40, "loss": 1.25, "final_model": "F", "run_id": "new"} == json.loads(path.read_text())
    # a run that trained on replaces it; so does a first result
    assert worker.write_result(path, {"step": 60, "loss": 0.5}, "next")["loss"] == 0.5
    assert worker.write_result(tmp_path / "fresh.json", {"step": 1, "loss": None}, None) == {"step": 1, "loss": None}


# ----------------------------------------------------------------------------------------------- 4: no clocks


def _local_job(tmp_path: Path, run_id: str) -> JobSpec:
    job = JobSpec(job_dir=tmp_path / "J", job_name="train")
    write_run_id(job, run_id)
    return job


def test_a_result_stamped_in_the_past_is_this_launchs_and_a_stale_one_is_not(tmp_path: Path) -> None:
    job = _local_job(tmp_path, "this-launch")
    plan: Plan[tp.Any] = Plan("interactive", job, {}, interactive.Request(1, None, None, False, (), None))
    job.result_file.write_text(json.dumps({"step": 2, "loss": 1.0, "run_id": "this-launch"}))
    old = time.time() - 120  # the file server's clock, 2 minutes behind this host's
    os.utime(job.result_file, (old, old))
    assert interactive._result(plan, 0, {}).state is JobState.COMPLETED
    assert interactive.local_state(job.job_dir) is JobState.COMPLETED
    # an earlier launch's result, whatever its mtime (a clock ahead: in the future), is not this launch's
    job.result_file.write_text(json.dumps({"step": 2, "loss": 9.0, "run_id": "an-earlier-launch"}))
    os.utime(job.result_file, (time.time() + 120, time.time() + 120))
    failed = interactive._result(plan, 0, {})
    assert failed.state is JobState.FAILED and "an earlier launch's" in (failed.error or "")
    assert interactive.local_state(job.job_dir) is not JobState.COMPLETED
    job.result_file.write_text(json.dumps({"step": 2, "loss": 9.0}))  # written before launches had ids
    assert not written_by_this_launch(job)


def test_a_call_jobs_return_carries_its_launch_id(tmp_path: Path) -> None:
    """A call job's JobReturn (``launch/call_result.pkl``) is this launch's only with this launch's id."""
    from hydra.core.utils import JobReturn, JobStatus

    from automodel_hydra import call

    job = _local_job(tmp_path, "this-launch")
    ret = JobReturn()
    ret.status, ret.return_value = JobStatus.COMPLETED, 3
    assert call._write_job_return(job.launch_dir, ret)
    path = job.launch_dir / "call_result.pkl"
    old = time.time() - 120
    os.utime(path, (old, old))
    assert written_by_this_launch(job, path) and call.read_job_return(path).return_value == 3
    write_run_id(job, "the-next-launch")
    assert not written_by_this_launch(job, path)
    with path.open("rb") as f:
        assert pickle.load(f) == {"run_id": "this-launch"}


@pytest.mark.slurm
@pytest.mark.slow
def test_automodel_shaped_sweep_on_slurm_is_one_array_whose_tasks_own_their_checkpoint_dirs(
        slurm_cluster: tp.Any, tmp_path: Path) -> None:
    """The same file with a ``slurm:`` section (AutoModel's routing), swept as one job array on the real cluster:
    each task writes ``<job dir>/checkpoints`` (sbatch starts the tasks in the submitting dir), trains its own
    steps and is COMPLETED with its own loss, decided from the launch id its result carries."""
    (tmp_path / "conf").mkdir()
    (tmp_path / "conf" / "am.yaml").write_text(AUTOMODEL_SHAPED + "slurm:\n  job_name: am\n  nodes: 1\n"
                                               "  ntasks_per_node: 1\n  gpus_per_node: 0\n  partition: debug\n"
                                               "  time: '00:10:00'\n")
    sweep = tmp_path / "S"
    proc = train("--config-dir", str(tmp_path / "conf"), "--config-name", "am", "-m", "optimizer.lr=1e-3,3e-3",
                 f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "#SBATCH --array=0-1" in (sweep / "launch" / "sbatch.sh").read_text()
    assert "2 done (2 COMPLETED)" in proc.stdout, proc.stdout[-4000:]
    assert not (tmp_path / "checkpoints").exists(), "a relative checkpoint_dir was the submitting dir's"
    for n, lr in ((0, 1e-3), (1, 3e-3)):
        rows = [json.loads(line) for line in (sweep / str(n) / "checkpoints" / "training.jsonl").read_text()
                .splitlines()]
        assert [(r["start"], r["end"]) for r in rows] == [(0, 2)], f"job {n} resumed from another's checkpoint"
        res = result(sweep / str(n))
        assert res["loss"] == pytest.approx(lr * 1000 / 2) and res["run_id"] == read_run_id(sweep / str(n) / "launch")
