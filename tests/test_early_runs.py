"""The rank that ended first is the attempt's cause on every launcher and in every command, for real; a peer's
"Connection closed by peer" is only its echo.

Rank 1 of tests/early_recipe.py returns after step 3 while rank 0 is in step 4's all-reduce, and rank 0 fails with
gloo's "Connection closed by peer". ``python train.py`` as a user runs it, under a real torchrun (2 gloo ranks on
CPU) and as a real Slurm job on the shared test cluster without fault tolerance: the attempt is ``user_error: rank
1 returned at step 3 while the others trained`` in the launching command's last line, ``status`` and ``status
--json``; it runs once (a restart repeats it) and no node is blamed or excluded. A rank killed outright (no record)
is a crash of that rank, not a comm failure of the node whose rank saw it go. The pure rule is in
tests/test_failures.py; the early return under ft_launcher in tests/test_truth_runs.py."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.test_truth_runs import _cli, _config, _env, _rank_ends
from tests.test_truth_runs import _train as _train_conf

RECIPE = "recipe=tests.early_recipe:main"
LINE = "user_error: rank 1 returned at step 3 while the others trained"


def _train(run: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python train.py recipe=tests.early_recipe:main ARGS``: train.py's own config and the command line."""
    return subprocess.run([sys.executable, str(ROOT / "train.py"), RECIPE, f"hydra.run.dir={run}", *args],
                          env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=480,
                          cwd=run.parent)


def _status(run: Path) -> tuple[dict[str, tp.Any], str]:
    proc = _cli("status", str(run), "--json")
    (row,) = json.loads(proc.stdout)
    return tp.cast(dict[str, tp.Any], row), _cli("status", str(run)).stdout


def _check_one_attempt(run: Path, last: str, status: tuple[dict[str, tp.Any], str]) -> None:
    """FAILED, the line names rank 1 and how it ended, one attempt of class user_error, nothing excluded."""
    assert re.search(rf"ended FAILED: (job \d+: )?{LINE}", last), last  # Slurm's line names the job
    row, table = status
    assert row["state"] == "FAILED" and row["note"].startswith(LINE), row
    assert [(a["class"], a["evidence"]) for a in row["attempts"]] == [
        ("user_error", "rank 1 returned at step 3 while the others trained")], row["attempts"]
    assert row["excluded"] == [] and "excluded" not in row["attempts"][0], row
    assert "user_error: rank 1 returned at step 3" in table, table
    ends = {r["rank"]: r for r in _rank_ends(run)}
    assert (ends[1]["how"], ends[1]["step"]) == ("returned", 3), ends  # the step it logged with dist.log
    assert ends[0]["how"] == "raised" and ends[0]["class"] == "comm", ends  # rank 0's own view: the echo


@pytest.mark.slow
def test_a_rank_that_returns_early_under_torchrun_is_the_attempts_cause(tmp_path: Path) -> None:
    """Plain torchrun, no fault tolerance: the last line, status and status --json name rank 1's return, class
    user_error; rank 0's "Connection closed by peer" comes after it ("; then rank 0: ...")."""
    run = tmp_path / "R"
    proc = _train(run, "interactive.nproc_per_node=2")
    assert proc.returncode == 1, proc.stdout[-3000:]
    last = proc.stdout.strip().splitlines()[-1]
    assert f"{LINE}; then rank 0: RuntimeError: " in last and "by peer" in last, last
    _check_one_attempt(run, last, _status(run))


@pytest.mark.slurm
@pytest.mark.slow
def test_a_rank_that_returns_early_on_slurm_is_not_requeued_and_blames_no_node(slurm_cluster: tp.Any,
                                                                                tmp_path: Path) -> None:
    """The tester's command on the test cluster (no fault tolerance, slurm.max_requeues=3 by default): one
    attempt, FAILED, the requeue hook's line says it is not retried, the job was never requeued and has no
    ExcNodeList."""
    run = tmp_path / "R"
    proc = _train(run, "launcher=slurm", "slurm.partition=debug", "slurm.nodes=1",
                  "slurm.ntasks_per_node=2", "slurm.gpus_per_node=0", "slurm.time=00:10:00", "slurm.wait=true")
    assert proc.returncode == 1, proc.stdout[-4000:]
    last = proc.stdout.strip().splitlines()[-1]
    status = _status(run)
    _check_one_attempt(run, last, status)
    assert status[0]["attempts"][0]["decision"] == (
        "not retried: a restart repeats it (user_error; failure_budget.user_error=0)")
    info = slurm_cluster.job_info(status[0]["job_ids"][0])
    assert info.get("Restarts") == "0" and info.get("ExcNodeList") in (None, "", "(null)"), info
    assert not list((run / "launch" / "ranks").glob("*.requeue1.*"))


@pytest.mark.slurm
@pytest.mark.slow
def test_the_echo_of_a_killed_rank_on_slurm_blames_no_node(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    """Rank 1 of a one-node job is killed at step 3 (SIGKILL, the STAND-IN of tests/fault_recipe.py for the OOM
    killer) in the first attempt; rank 0 sees its peer go. The attempt is rank 1's crash (requeued once by
    failure_budget.crash=1), not a comm failure of the node rank 0 ran on: no ExcNodeList, the requeued run
    completes."""
    run = tmp_path / "R"
    conf = _config(tmp_path, {"mode": "kill", "step": 3, "attempts": "first"}, launcher="slurm", ft=None)
    proc = _train_conf(conf, run)
    assert proc.returncode == 0, proc.stdout[-4000:]
    row, _ = _status(run)
    assert row["state"] == "COMPLETED" and [a["class"] for a in row["attempts"]] == ["crash", "completed"], row
    assert row["attempts"][0]["evidence"].startswith("rank 1 ended without a record"), row["attempts"][0]
    assert row["attempts"][0]["decision"] == "retried: crash 1 of failure_budget.crash=1", row["attempts"][0]
    assert row["excluded"] == [], row
    assert slurm_cluster.job_info(row["job_ids"][0]).get("ExcNodeList") in (None, "", "(null)")
