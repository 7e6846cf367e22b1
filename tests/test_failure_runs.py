"""Every failure gets the right response, for real: ``python train.py`` with real ft_launcher and torchrun processes
(2 gloo ranks on CPU) and real Slurm jobs on the shared test cluster, the recipe tests/fault_recipe.py.

An error before the first step is user_error and runs once, under ft_launcher and under Slurm with requeues left; a
MemoryError is oom and runs once; a crash after progress is retried once (failure_budget.crash=1), not as often as
fault_tolerance.max_restarts or slurm.max_requeues allow; ``status --json`` has each attempt and the goodput. The
pure rules are in tests/test_failures.py."""

from __future__ import annotations

import concurrent.futures
import csv
import json
import re
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import fault_tolerance as ftm
from tests.test_truth_runs import _cli, _config, _rank_ends, _train, needs_ft


def _status(run: Path) -> dict[str, tp.Any]:
    proc = _cli("status", str(run), "--json")
    (row,) = json.loads(proc.stdout)
    return tp.cast(dict[str, tp.Any], row)


def _classes(row: tp.Mapping[str, tp.Any]) -> list[str]:
    return [a["class"] for a in row["attempts"]]


@pytest.mark.slow
@needs_ft
@pytest.mark.parametrize(("fault", "kind", "evidence"), [
    ({"mode": "raise", "step": 0}, "user_error", "ValueError: bad batch at step 1 (before the first optimizer step)"),
    ({"mode": "oom", "step": 2}, "oom", "MemoryError"),
])
def test_ft_launcher_does_not_restart_what_a_restart_repeats(tmp_path: Path, fault: dict[str, tp.Any], kind: str,
                                                             evidence: str) -> None:
    """fault_tolerance.max_restarts=2: one attempt, FAILED at once, the class and its evidence in the rank's line,
    the last line and the ledger."""
    run = tmp_path / "R"
    proc = _train(_config(tmp_path, {**fault, "attempts": "every"}, ft={"max_restarts": 2}), run)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert f"not retried: a restart repeats it ({kind}; failure_budget.{kind}=0)" in proc.stdout
    assert f"rank 1 failed: {kind}: {evidence}" in proc.stdout
    last = proc.stdout.splitlines()[-1]
    assert f"ended FAILED: {kind}: " in last, last
    assert {r["attempt"] for r in _rank_ends(run)} == {0}
    row = _status(run)
    assert row["state"] == "FAILED" and _classes(row) == [kind]
    assert row["attempts"][0]["evidence"] == f"rank 1: {evidence}"


@pytest.mark.slow
@needs_ft
def test_ft_launcher_restarts_a_crash_once_and_status_has_the_ledger(tmp_path: Path) -> None:
    """A ValueError at step 3 in every attempt, fault_tolerance.max_restarts=3: one restart (failure_budget.crash=1),
    then FAILED naming the spent budget; status --json has both attempts, the steps they lost and the goodput."""
    run = tmp_path / "R"
    conf = _config(tmp_path, {"mode": "raise", "step": 3, "attempts": "every"}, ft={"max_restarts": 3})
    proc = _train(conf, run)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "not retried: failure_budget.crash=1 spent (1 crash attempt before)" in proc.stdout
    assert {r["attempt"] for r in _rank_ends(run)} == {0, 1}
    row = _status(run)
    assert row["state"] == "FAILED" and _classes(row) == ["crash", "crash"], row
    first, second = row["attempts"]
    assert first["evidence"] == "rank 1: ValueError: bad batch at step 4" and first["node"]
    # the recipe keeps no checkpoint: the restart starts from step 0, so attempt 0's 3 steps were lost
    assert first["step"] == 3 and first["steps_lost"] == 3 and first["seconds_lost"] > 0
    assert second["decision"] == "not retried: failure_budget.crash=1 spent (1 crash attempt before)"
    assert row["goodput"] is not None and 0 <= row["goodput"] < 1


@pytest.mark.slow
@needs_ft
def test_a_hang_past_its_budget_is_not_restarted(tmp_path: Path) -> None:
    """Rank 1 hangs in step 4 of the first attempt, failure_budget.hang=0, fault_tolerance.max_restarts=2: the rank
    monitor kills it and ft_launcher starts attempt 1, whose ranks see the hang budget spent, ask ft_launcher not to
    restart and exit before running: FAILED, one attempt, class hang (with the default budget the restart trains
    on: tests/test_fault_tolerance.py)."""
    run = tmp_path / "R"
    conf = _config(tmp_path, {"mode": "hang", "step": 3, "attempts": "first"},
                   ft={"max_restarts": 2, "rank_heartbeat_timeout": 8}, extra="failure_budget:\n  hang: 0\n")
    proc = _train(conf, run)
    assert proc.returncode == 1, proc.stdout[-3000:]
    assert "not retried: failure_budget.hang=0 spent (0 hang attempts before)" in proc.stdout
    last = proc.stdout.splitlines()[-1]
    assert "ended FAILED: hang: rank 1 hung at step 4" in last, last
    assert not [r for r in _rank_ends(run) if r["attempt"] != 0] and ftm.attempts(run / "launch") == []
    row = _status(run)
    assert row["state"] == "FAILED" and _classes(row) == ["hang"], row
    assert row["attempts"][0]["decision"] == "not retried: failure_budget.hang=0 spent (0 hang attempts before)"


# ----------------------------------------------------------------------------------------------- Slurm


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_requeues_by_the_failure_budget(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    """slurm.max_requeues=3, no fault tolerance, three jobs at once: a ValueError before the first step is one
    attempt, FAILED, user_error; a MemoryError is one attempt, oom; a ValueError after progress in every attempt is
    requeued once by the batch script's hook (failure_budget.crash=1), then FAILED."""
    cases = {"user": ({"mode": "raise", "step": 0}, ["user_error"]),
             "oom": ({"mode": "oom", "step": 1}, ["oom"]),
             "crash": ({"mode": "raise", "step": 2}, ["crash", "crash"])}

    def one(name: str) -> tuple[Path, tp.Any]:
        base = tmp_path / name
        base.mkdir()
        conf = _config(base, {**cases[name][0], "attempts": "every"}, launcher="slurm", ft=None)
        text = (conf / "job.yaml").read_text().replace("  wait: true\n", "  wait: true\n  max_requeues: 3\n")
        (conf / "job.yaml").write_text(text)
        return base / "R", _train(conf, base / "R")

    with concurrent.futures.ThreadPoolExecutor(max_workers=3) as pool:
        done = dict(zip(cases, pool.map(one, cases)))
    for name, (run, proc) in done.items():
        kind = cases[name][1][-1]
        assert proc.returncode == 1, (name, proc.stdout[-3000:])
        last = proc.stdout.splitlines()[-1]
        assert re.search(rf"ended FAILED: (job \d+: )?{kind}: ", last), (name, last)
        row = _status(run)
        assert row["state"] == "FAILED" and _classes(row) == cases[name][1], (name, row)
        job = row["job_ids"][0]
        restarts = slurm_cluster.job_info(job).get("Restarts")
        assert restarts == str(len(cases[name][1]) - 1), (name, restarts)
        print(f"\n{name}: {_classes(row)}, decision: {row['attempts'][-1]['decision']}")
    assert done["crash"][0].joinpath("launch", "ranks", "decision.requeue1.attempt0.json").is_file()
    assert _status(done["user"][0])["attempts"][0]["decision"] == (
        "not retried: a restart repeats it (user_error; failure_budget.user_error=0)")


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_requeue_leaves_the_blamed_node_out(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    """A comm failure (torch's DistBackendError) at step 2 of the first attempt of a one-node job: the hook requeues
    it with its node in ExcNodeList, and the requeued attempt runs on the other node and completes; the ledger,
    status --json and Slurm agree on the excluded node."""
    run = tmp_path / "R"
    conf = _config(tmp_path, {"mode": "comm", "step": 2, "attempts": "first"}, launcher="slurm", ft=None)
    text = (conf / "job.yaml").read_text().replace("  wait: true\n", "  wait: true\n  max_requeues: 3\n")
    (conf / "job.yaml").write_text(text)
    proc = _train(conf, run)
    assert proc.returncode == 0, proc.stdout[-3000:]
    row = _status(run)
    assert row["state"] == "COMPLETED" and _classes(row) == ["comm", "completed"], row
    first, second = row["attempts"]
    assert first["node"] in ("node1", "node2") and second["node"] in ("node1", "node2")
    assert second["node"] != first["node"] and row["excluded"] == [first["node"]] == first["excluded"]
    assert first["decision"] == (f"retried: comm 1 of failure_budget.comm=3; node {first['node']} excluded "
                                 f"(ExcNodeList={first['node']})")
    assert first["evidence"].startswith("rank ") and "DistBackendError: NCCL error at step 3" in first["evidence"]
    assert slurm_cluster.job_info(row["job_ids"][0]).get("ExcNodeList") == first["node"]


@pytest.mark.slurm
@pytest.mark.slow
def test_a_node_blamed_by_one_sweep_member_is_left_out_of_the_pending_ones(slurm_cluster: tp.Any,
                                                                           tmp_path: Path) -> None:
    """A 3-member sweep run one task at a time (``slurm.array_parallelism=1``: ``--array=0-2%1``): member 0's
    all-reduce fails (comm) at step 2 on its node while members 1 and 2 are pending. The requeue hook leaves that
    node out of member 0's requeue and of the two pending tasks (Slurm shows it in their ExcNodeList); they run
    on the other node and every member COMPLETES; status (--json "excluded", and its note) says so."""
    sweep = tmp_path / "S"
    conf = _config(tmp_path, {"mode": "comm", "step": 2, "attempts": "first"}, launcher="slurm", ft=None)
    proc = _train(conf, tmp_path / "R", "-m", "fault.rank=1,7,8", "slurm.array_parallelism=1",
                  f"hydra.sweep.dir={sweep}")
    assert proc.returncode == 0, proc.stdout[-4000:]
    rows = json.loads(_cli("status", str(sweep), "--json").stdout)
    assert [r["state"] for r in rows] == ["COMPLETED"] * 3, rows
    first = rows[0]["attempts"][0]
    bad = first["node"]
    assert first["class"] == "comm" and bad in ("node1", "node2"), rows[0]
    array = rows[0]["job_ids"][0].split("_")[0]
    for row in rows:
        assert row["excluded"] == [bad], row
    for row in rows[1:]:
        assert [a["node"] for a in row["attempts"]] == [{"node1": "node2", "node2": "node1"}[bad]], row
        assert f"{bad} excluded after {array}_0's comm failure" in row["note"], row
        assert slurm_cluster.job_info(row["job_ids"][0]).get("ExcNodeList") == bad
    decision = json.loads((sweep / "0" / "launch" / "ranks" / "decision.attempt0.json").read_text())
    assert decision["pending_excluded"] == {f"{array}_1": [bad], f"{array}_2": [bad]}, decision
    assert f"node {bad} excluded for the array's pending task(s) {array}_1, {array}_2" in \
        (sweep / "slurm").joinpath(f"{array}_0_0_log.out").read_text()
    # the report: job 0's two attempts (the others ran once, clean), with the numbers status --json gave
    made = _cli("report", str(sweep))  # (exit 1: the recipe logs no step to draw; the tables are all there)
    assert made.returncode == 1 and "no logged step in any job yet" in made.stderr, made.stdout + made.stderr
    print("\n" + made.stdout)
    assert "attempts of the jobs with more than one attempt or a failed one (1 of 3)" in made.stdout
    with (sweep / "report" / "attempts.csv").open() as f:
        tried = list(csv.DictReader(f))
    assert [(r["job"], r["class"], r["node"]) for r in tried] == [
        ("0", "comm", bad), ("0", "completed", rows[0]["attempts"][1]["node"]),
        ("1", "completed", rows[1]["attempts"][0]["node"]), ("2", "completed", rows[2]["attempts"][0]["node"])]
    assert [float(r["seconds_lost"]) for r in tried] == [a["seconds_lost"] for row in rows for a in row["attempts"]]
    with (sweep / "report" / "failure_costs.csv").open() as f:
        (costs,) = list(csv.DictReader(f))
    assert costs["by_class"] == "completed 3, comm 1" and costs["failed_attempts"] == "1", costs
    assert 0 < float(costs["goodput"]) < 1, costs
