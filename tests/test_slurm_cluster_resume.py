"""A sweep resumed on the project's real Slurm 22.05 cluster (``tests/slurm_cluster.py``): its failed member
runs again as one job array of one task, task 2 for job 2, while the members that completed keep their dirs."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.test_sweep_resume import run, stamps, states, sweep_args

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

BASE = ["launcher=slurm", "slurm.gpus_per_node=0", "slurm.partition=debug", "slurm.time=00:10:00", "slurm.nodes=1",
        "slurm.ntasks_per_node=1"]


def test_a_resumed_slurm_sweep_is_one_array_of_just_the_failed_task(slurm_cluster, tmp_path: Path) -> None:
    sweep, markers = tmp_path / "S", tmp_path / "markers"
    markers.mkdir()
    (markers / "fail-3").touch()
    proc = run(str(ROOT / "train.py"), *sweep_args(sweep, markers, *BASE), timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert states(sweep) == {0: "COMPLETED", 1: "COMPLETED", 2: "FAILED", 3: "COMPLETED"}
    first = json.loads((sweep / "2" / "launch" / "submission.json").read_text())["job_ids"][0]
    records = {n: (sweep / n / "launch" / "submission.json").read_bytes() for n in ("0", "1", "3")}
    (markers / "fail-3").unlink()
    before = stamps(sweep)

    proc = run("-m", "automodel_hydra.cli", "resume", str(sweep), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0] == "resume: 3 of 4 members COMPLETED and kept; running again: 1 (#2 FAILED)"
    script = (sweep / "launch" / "sbatch_2.sh").read_text()
    assert "#SBATCH --array=2%1" in script, script
    again = json.loads((sweep / "2" / "launch" / "submission.json").read_text())["job_ids"][0]
    assert again.endswith("_2") and again.split("_")[0] != first.split("_")[0], (first, again)
    assert proc.stdout.count("submitted slurm job ") == 1, proc.stdout
    assert {n: (sweep / n / "launch" / "submission.json").read_bytes() for n in records} == records
    after = stamps(sweep)
    assert {k: after[k] for k in before} == before, "a kept member's result.json changed"
    assert json.loads(after["2"][0])["started_from"] == 2
    assert states(sweep) == {0: "COMPLETED", 1: "COMPLETED", 2: "COMPLETED", 3: "COMPLETED"}


def test_max_failures_on_slurm_cancels_the_pending_array_tasks(slurm_cluster, tmp_path: Path) -> None:
    """Every point fails while its marker is there, one array task at a time (``slurm.array_parallelism=1``),
    ``max_failures=1``: the waiting command cancels the tasks still pending after the first failure (they never
    start), and a resume without the markers runs the rest."""
    sweep, markers = tmp_path / "S", tmp_path / "markers"
    markers.mkdir()
    for point in range(1, 5):
        (markers / f"fail-{point}").touch()
    policy = "hydra.launcher.sweep_policy.max_failures"
    # failure_budget.crash=0: each failure is final at once (a crash is otherwise requeued once, and a member
    # requeued and pending again is cancelled too: it would "start" twice)
    proc = run(str(ROOT / "train.py"), *sweep_args(sweep, markers, *BASE, "slurm.array_parallelism=1",
                                                   "failure_budget.crash=0", f"{policy}=1"), timeout=300)
    assert proc.returncode == 1, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert f"({policy}=1): " in proc.stderr and "not started yet are cancelled (" in proc.stderr, proc.stderr[-3000:]
    got = states(sweep)
    cancelled = [n for n, s in got.items() if s == "CANCELLED"]
    assert got[0] == "FAILED" and 3 in cancelled and set(got.values()) <= {"FAILED", "CANCELLED"}, got
    assert not [n for n in cancelled if (sweep / str(n) / "metrics.jsonl").exists()], "a cancelled task started"
    for point in range(1, 5):
        (markers / f"fail-{point}").unlink()
    proc = run("-m", "automodel_hydra.cli", "resume", str(sweep), cwd=tmp_path, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert proc.stdout.splitlines()[0].startswith("resume: 0 of 4 members COMPLETED and kept; running again: 4 (#0 "
                                                  "FAILED"), proc.stdout
    assert states(sweep) == {0: "COMPLETED", 1: "COMPLETED", 2: "COMPLETED", 3: "COMPLETED"}
