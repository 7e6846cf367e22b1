"""The Slurm launcher against the project's real Slurm 22.05 cluster (``tests/slurm_cluster.py``: node1 and
node2, 2 CPUs each, partition ``debug``, accounting on). Each test runs ``train.py`` as a user would.

Sizes are kept small: every rank imports torch and transformers, and the cluster's four CPUs are two real cores."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from tests.helpers import ROOT, metrics, train_py

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

#: What every job here shares: CPU ranks, the test partition, a limit well above the 300 s checkpoint margin.
BASE = ["launcher=slurm", "slurm.gpus_per_node=0", "slurm.partition=debug", "slurm.time=00:10:00"]


def submission(run_dir: Path) -> dict[str, tp.Any]:
    return json.loads((run_dir / "launch" / "submission.json").read_text())


def wait_done(cluster: tp.Any, job_id: str, timeout: float = 150.0) -> str:
    """Wait until the job left the queue (requeues included); its final sacct state."""
    cluster.wait_gone(job_id.split("_")[0], timeout=timeout)
    return cluster.sacct_state(job_id, timeout=30)


def logged_steps(run_dir: Path) -> int:
    """Complete lines of a metrics.jsonl that rank 0 may be writing right now."""
    path = run_dir / "metrics.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def rendezvous_port(log: Path) -> tuple[str, int]:
    m = re.search(r"rendezvous at (\S+):(\d+)", log.read_text())
    assert m, f"no rendezvous line in {log}"
    return m.group(1), int(m.group(2))


def test_done_when_two_nodes_returns_at_once_and_keeps_the_token_secret(slurm_cluster, tmp_path: Path) -> None:
    token = f"hf_{secrets.token_hex(16)}"
    run = tmp_path / "R"
    seen = tmp_path / "token.sha256"  # outside R: proof that the job saw the token, without writing it
    start = time.monotonic()
    proc = train_py(*BASE, "slurm.nodes=2", "slurm.ntasks_per_node=2", "++slurm.env_vars.HF_TOKEN=${HF_TOKEN}",
                    f"hydra.run.dir={run}", "step_scheduler.max_steps=10",
                    f"slurm.setup=['printf %s \"$HF_TOKEN\" | sha256sum > {seen}']", env={"HF_TOKEN": token})
    returned_s = time.monotonic() - start
    job_id = submission(run)["job_ids"][0]
    assert not (run / "result.json").exists(), "train.py waited for the job"
    assert returned_s < 30
    assert f"submitted slurm job {job_id}" in proc.stdout and f"log {run}/slurm/{job_id}_0_log.out" in proc.stdout

    assert wait_done(slurm_cluster, job_id) == "COMPLETED"
    rows = metrics(run)
    assert rows[-1]["step"] == 10 and {r["world_size"] for r in rows} == {4}
    script = (run / "launch" / "sbatch.sh").read_text()
    assert "None" not in script and 'export HF_TOKEN="${HF_TOKEN}"' in script
    assert seen.read_text().split()[0] == hashlib.sha256(token.encode()).hexdigest()
    leaks = [p for p in run.rglob("*") if p.is_file() and token.encode() in p.read_bytes()]
    assert not leaks, f"the token's value was written to {leaks}"
    assert proc.stdout.count(token) == 0


def test_sweep_runs_as_one_array_and_returns_results(slurm_cluster, tmp_path: Path) -> None:
    """``python train.py -m`` on the real cluster: one job array, each job its own result (the sweeper's values;
    their route into Hydra's JobReturns and callbacks is tested in test_hydra_features.py)."""
    sweep_dir = tmp_path / "S"
    proc = train_py("-m", *BASE, "slurm.nodes=1", "slurm.ntasks_per_node=1", "step_scheduler.max_steps=5",
                    "optim.lr=1e-3,2e-3,3e-3", f"hydra.sweep.dir={sweep_dir}")
    ids = [submission(sweep_dir / str(i))["job_ids"][0] for i in range(3)]
    array = (sweep_dir / "launch" / "sbatch.sh").read_text()
    jobs_script = [(sweep_dir / str(i) / "launch" / "sbatch.sh").read_text() for i in range(3)]
    finals = [json.loads((sweep_dir / str(i) / "result.json").read_text()) for i in range(3)]
    assert len({i.split("_")[0] for i in ids}) == 1 and [i.split("_")[1] for i in ids] == ["0", "1", "2"]
    assert "#SBATCH --array=0-2%3" in array
    # each job dir keeps its own one-job script (sbatch it to rerun that point alone)
    assert all("--array" not in s and f"AUTOMODEL_JOB_DIR={sweep_dir / str(i)}" in s for i, s in enumerate(jobs_script))
    assert all(f["stopped_early"] is False and f["step"] == 5 for f in finals)
    assert len({f["loss"] for f in finals}) == 3  # each job its own learning rate, its own loss
    assert "3 jobs submitted" in proc.stdout and "3 done (3 COMPLETED)" in proc.stdout


def test_preempted_job_requeues_and_logs_every_step_once(slurm_cluster, tmp_path: Path) -> None:
    run, steps = tmp_path / "P", 160
    cmd = [sys.executable, str(ROOT / "train.py"), *BASE, "slurm.nodes=1", "slurm.ntasks_per_node=2",
           "slurm.wait=true", f"hydra.run.dir={run}", f"step_scheduler.max_steps={steps}",
           "step_scheduler.log_interval=1", "step_scheduler.checkpoint_interval=100"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 90
        while logged_steps(run) < 20:
            assert time.monotonic() < deadline and proc.poll() is None, "the job never got going"
            time.sleep(0.2)
        job_id = submission(run)["job_ids"][0]
        slurm_cluster.run("scancel", "--signal=USR2", job_id)  # what a preemption / the time-limit warning sends
        out, _ = proc.communicate(timeout=150)  # slurm.wait=true: returns when the requeued job has finished
    finally:
        proc.kill()
    assert proc.returncode == 0, out[-3000:]
    assert slurm_cluster.sacct_state(job_id, timeout=30) == "COMPLETED"
    assert slurm_cluster.job_info(job_id).get("Restarts") == "1"
    assert [r["step"] for r in metrics(run)] == list(range(1, steps + 1)), "a step was lost or logged twice"
    signal_step = int(re.search(r"checkpoint complete: \S+/step-(\d+)", out).group(1))
    assert 20 <= signal_step < 100, "the first checkpoint must be the one taken on the signal"
    assert "requeuing Slurm job" in out and f"step {steps}/{steps}" in out  # the followed log, across the requeue


def test_dry_run_writes_the_script_and_submits_nothing(slurm_cluster, tmp_path: Path) -> None:
    name = f"dry-{secrets.token_hex(4)}"
    proc = train_py(*BASE, "slurm.ntasks_per_node=2", f"slurm.job_name={name}", "dry_run=true",
                    f"hydra.run.dir={tmp_path / 'D'}")
    script = (tmp_path / "D" / "launch" / "sbatch.sh").read_text()
    assert f"#SBATCH --job-name={name}" in script and script.strip() in proc.stdout
    assert not (tmp_path / "D" / "launch" / "submission.json").exists()
    assert slurm_cluster.run("squeue", "-h", f"--name={name}").stdout == ""
    assert slurm_cluster.run("sacct", "-n", "-X", f"--name={name}").stdout.strip() == ""


def test_two_jobs_on_the_same_node_rendezvous_on_different_ports(slurm_cluster, tmp_path: Path) -> None:
    # 2 nodes x 1 task: each job takes one CPU of each node, so both run at once and both masters are node1
    sweep = tmp_path / "E"
    train_py("-m", *BASE, "slurm.nodes=2", "slurm.ntasks_per_node=1", "step_scheduler.max_steps=10", "seed=1,2",
             f"hydra.sweep.dir={sweep}")
    ids = [submission(sweep / str(i))["job_ids"][0] for i in range(2)]
    rows = slurm_cluster.run("sacct", "-n", "-X", "-P", "-o", "JobID,State,Start,End", "-j", ids[0].split("_")[0])
    spans = {r.split("|")[0]: r.split("|")[1:] for r in rows.stdout.split()}
    assert [spans[i][0] for i in ids] == ["COMPLETED", "COMPLETED"]
    (_, s0, e0), (_, s1, e1) = spans[ids[0]], spans[ids[1]]
    assert s0 < e1 and s1 < e0, f"the two jobs did not overlap: {spans}"
    logs = [sweep / "slurm" / f"{i}_0_log.out" for i in ids]
    (host0, port0), (host1, port1) = (rendezvous_port(log) for log in logs)
    assert host0 == host1 == "node1" and port0 != port1
    # both ranks of each job met on its port: a rank on another port would have hung in init_process_group
    for i in range(2):
        assert {r["world_size"] for r in metrics(sweep / str(i))} == {2}


def test_leftover_sbatch_variables_in_the_shell_never_change_the_planned_job(slurm_cluster, tmp_path: Path) -> None:
    """``SBATCH_PARTITION``, ``SBATCH_TIMELIMIT`` and ``SBATCH_JOB_NAME`` left in the submitting shell (sbatch(1):
    they beat ``#SBATCH`` lines) are named in one line and left out: the job runs in the planned partition, with
    the planned limit and name."""
    import os

    from tests.helpers import USER_JOB, user_repo
    from tests.test_slurm_tunnel import RECIPE, launch

    repo, run = user_repo(tmp_path, RECIPE, USER_JOB), tmp_path / "run"
    env = {**os.environ, "SBATCH_PARTITION": "low", "SBATCH_TIMELIMIT": "1", "SBATCH_JOB_NAME": "leftover"}
    proc = launch(repo, env, "+slurm.wait=true", "+slurm.job_name=planned", f"hydra.run.dir={run}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-3000:]
    line = next(x for x in out.splitlines() if "SBATCH_PARTITION" in x)
    assert "SBATCH_TIMELIMIT" in line and "SBATCH_JOB_NAME" in line and "set in this shell" in line, line
    assert "--partition" in line and "--time" in line and "--job-name" in line, line
    job_id = submission(run)["job_ids"][0]
    deadline = time.monotonic() + 30
    while (row := slurm_cluster.run("sacct", "-n", "-X", "-P", "-j", job_id, "-S", "now-1hours", "-o",
                                    "JobName,Partition,Timelimit").stdout.split()) in ([], ["allocation||"]):
        assert time.monotonic() < deadline, row  # (slurmdbd has the job's request a moment after it ran)
        time.sleep(1)
    assert row == ["planned|debug|00:10:00"], row
