"""What a user sees when a Slurm job goes wrong in ways no config check catches, on the project's real Slurm
22.05 cluster (``tests/slurm_cluster.py``: node1 and node2, 2 CPUs each, partition ``debug``, accounting on): a
request no node can hold, a pending job cancelled, a scheduler that cannot be asked, a log that never comes.

Jobs are held or tiny: the cluster's four CPUs are two real cores shared with other sessions."""

from __future__ import annotations

import csv
import json
import os
import secrets
import subprocess
import sys
import threading
import time
import typing as tp
from pathlib import Path

import pytest

from tests.helpers import train_py, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_readme_command_is_refused_before_sbatch_naming_the_key(slurm_cluster, tmp_path: Path) -> None:
    """README's ``slurm.nodes=2 slurm.partition=debug`` asks 8 tasks per node of nodes with 2 CPUs: sbatch would
    queue it PENDING (PartitionConfig) for ever; preflight refuses it in one line, and nothing is submitted."""
    name = f"unfit-{secrets.token_hex(4)}"
    run = tmp_path / "R"
    since = time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(time.time() - 1))
    proc = train_py("launcher=slurm", "slurm.nodes=2", "slurm.partition=debug", f"slurm.job_name={name}",
                    f"hydra.run.dir={run}", check=False)
    queued = slurm_cluster.run("squeue", "--noheader", f"--name={name}", "--format=%i").stdout.split()
    slurm_cluster.cancel_left(queued)  # (what the old preflight let through would wait for ever)
    assert proc.returncode == 2, proc.stdout[-3000:]
    errors = [line for line in proc.stdout.splitlines() if line.startswith("error:")]
    assert errors == ["error: slurm.ntasks_per_node=8 asks 8 CPUs per node; partition debug's nodes have at most 2 "
                      "(CPUTot)"], proc.stdout[-3000:]
    assert not (run / "launch" / "submission.json").exists()
    recorded = slurm_cluster.run("sacct", "--noheader", "-X", f"--name={name}", f"--starttime={since}",
                                 "--format=JobID").stdout.split()
    assert queued == [] and recorded == [], "a job was submitted"


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "automodel_hydra.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **(env or {})})


@pytest.fixture(scope="module")
def held_sweep(slurm_cluster, tmp_path_factory) -> tp.Iterator[tuple[Path, list[str]]]:
    """A 2-job array that waits for a start time an hour away (``sbatch --begin``): pending, never started."""
    sweep = tmp_path_factory.mktemp("held") / "S"
    train_py("-m", "launcher=slurm", "slurm.gpus_per_node=0", "slurm.partition=debug", "slurm.nodes=1",
             "slurm.ntasks_per_node=1", "slurm.detach=true", "++slurm.sbatch_args.begin=now+1hour",
             "optim.lr=1e-3,2e-3", f"hydra.sweep.dir={sweep}")
    ids = [json.loads((sweep / str(i) / "launch" / "submission.json").read_text())["job_ids"][0] for i in range(2)]
    try:
        yield sweep, ids
    finally:
        slurm_cluster.cancel_left([ids[0].split("_")[0]])


def test_a_scheduler_that_cannot_be_asked_leaves_a_pending_job_alone(held_sweep) -> None:
    """No slurm.conf here: ``logs`` of a job whose end the scheduler cannot tell ends at once (status 1) with
    the reason, and ``cancel`` cancels nothing and records no cancel."""
    sweep, ids = held_sweep
    logs = cli("logs", str(sweep), "0", env={"SLURM_CONF": "/nonexistent/slurm.conf"}, timeout=30)
    assert logs.returncode == 1 and "SLURM_CONF=/nonexistent/slurm.conf is not a file" in logs.stderr, logs.stderr
    cancel = cli("cancel", str(sweep), "0", env={"SLURM_CONF": "/nonexistent/slurm.conf"}, timeout=30)
    assert cancel.returncode == 1 and "nothing cancelled" in cancel.stderr, cancel.stderr
    assert not (sweep / "0" / "launch" / "cancel.json").exists()
    assert json.loads(cli("status", str(sweep), "--json").stdout)[0]["state"] == "PENDING"


def test_logs_of_a_pending_job_say_why_and_end_when_it_is_cancelled(held_sweep) -> None:
    """A job that never writes a log: ``logs`` says its state and reason while it waits, and ends (status 1) with
    a line once the job ended without one."""
    sweep, _ = held_sweep
    proc = subprocess.Popen([sys.executable, "-m", "automodel_hydra.cli", "logs", str(sweep), "0", "--poll", "0.2"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout or ()), daemon=True)  # (a blocking read)
    reader.start()
    try:
        # (just submitted, the scheduler may not have given a reason yet: "PENDING" first, then its reason)
        wait_for(lambda: any(line.startswith("-- job 0: PENDING (BeginTime); no log yet at ") for line in lines), 30,
                 "logs to say the job's state and reason", proc=proc, output=lambda: "".join(lines))
        assert cli("cancel", str(sweep), "0").returncode == 0
        proc.wait(timeout=30)
    finally:
        proc.kill()
    reader.join(timeout=5)
    assert proc.returncode == 1, lines
    assert lines[-1].startswith("-- job 0 ended CANCELLED without writing a log (expected at "), lines
    assert len(set(lines)) == len(lines) <= 3, f"each state is said once: {lines}"


def test_our_cancel_of_a_pending_array_task_shows_cancelled(slurm_cluster, held_sweep) -> None:
    """sacct keeps no record of a pending array task cancelled before it started while another task still waits
    (neither sacct nor squeue lists it again): the cancel we sent is recorded, and status and report say
    CANCELLED."""
    sweep, ids = held_sweep
    first = cli("cancel", str(sweep), "0")  # (already done by the logs test when it ran first)
    assert first.returncode == 0, first.stderr
    array = ids[0].split("_")[0]
    told = slurm_cluster.run("sacct", "-X", "--noheader", "--parsable2", "--format=JobID,State",
                             f"--jobs={array}").stdout + slurm_cluster.run(
        "squeue", "--noheader", "--states=all", "--format=%i|%T", f"--jobs={array}").stdout
    assert ids[0] not in told and "_[0" not in told, told  # the scheduler knows nothing of task 0 now
    deadline = time.monotonic() + 30  # (slurmctld splits the pending range a moment after scancel)
    while (rows := json.loads(cli("status", str(sweep), "--json").stdout))[0]["state"] == "PENDING":
        assert time.monotonic() < deadline, rows
        time.sleep(0.5)
    assert [(r["job"], r["state"]) for r in rows] == [(0, "CANCELLED"), (1, "PENDING")], rows
    assert "cancelled with automodel-hydra cancel while PENDING" in rows[0]["note"], rows
    out = cli("cancel", str(sweep), "1")
    assert out.returncode == 0 and "was PENDING, cancel requested" in out.stdout, out.stdout + out.stderr
    rows = json.loads(cli("status", str(sweep), "--json").stdout)
    assert [(r["job"], r["state"]) for r in rows] == [(0, "CANCELLED"), (1, "CANCELLED")], rows
    cli("report", str(sweep))  # exit 1: no job logged a step
    with open(sweep / "report" / "final_metrics.csv") as f:
        assert [r["state"] for r in csv.DictReader(f)] == ["CANCELLED", "CANCELLED"]


def test_a_finished_job_shows_its_own_records_when_the_scheduler_cannot_be_asked(slurm_cluster, tmp_path) -> None:
    """A new shell without SLURM_CONF (or with one that names no file): the finished job is COMPLETED from its own
    result, with a note that the scheduler could not be asked; ``logs`` prints the log here and ends."""
    run = tmp_path / "R"
    train_py("launcher=slurm", "slurm.gpus_per_node=0", "slurm.partition=debug", "slurm.nodes=1",
             "slurm.ntasks_per_node=1", "slurm.wait=true", "step_scheduler.max_steps=2", f"hydra.run.dir={run}")
    bare = {k: v for k, v in os.environ.items() if k != "SLURM_CONF"}
    for env in ({"SLURM_CONF": str(tmp_path / "no-such.conf")}, None):
        start = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", "status", str(run), "--json"],
                              capture_output=True, text=True, timeout=120, env={**bare, **(env or {})})
        row = json.loads(proc.stdout)[0]
        assert row["state"] == "COMPLETED" and row["note"].startswith("the scheduler could not be asked ("), row
        assert row["note"].endswith("its result of this launch is here"), row
        assert time.monotonic() - start < 30
        for args in (["--no-follow"], []):
            logs = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", "logs", str(run), *args],
                                  capture_output=True, text=True, timeout=60, env={**bare, **(env or {})})
            assert logs.returncode == 0 and "done: {'step': 2" in logs.stdout, logs.stderr
