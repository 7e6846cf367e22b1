"""``automodel-hydra status|logs|cancel|report`` on real local sweeps, and its honesty rules (UNKNOWN, FAILED).

The Slurm side (states read from the real scheduler's sacct, scancel) is at the end, on the project's test cluster.
"""

from __future__ import annotations

import csv
import json
import os
import random
import subprocess
import sys
import time
import types
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import cli
from automodel_hydra.backends.interactive import free_port
from tests.helpers import ROOT, train_py

TINY = ["interactive.nproc_per_node=1", "step_scheduler.max_steps=4", "step_scheduler.log_interval=1",
        "checkpoint.enabled=false"]


def port_base() -> str:
    """A rendezvous port range of its own, away from other test runs sharing this machine (they start at 13742)."""
    return f"interactive.master_port={free_port(random.randrange(20000, 40000, 100))}"


def states(sweep: Path) -> dict[int, str]:
    out = cli_out("status", str(sweep), "--json")
    return {row["job"]: row["state"] for row in json.loads(out)}


def cli_out(*argv: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", *argv], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def wait_for(check: tp.Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.5)


@pytest.fixture(scope="module")
def sweep(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real local sweep of 4 tiny jobs: jobs 0 and 1 train; jobs 2 and 3 fail in their ranks (no such model)."""
    path = tmp_path_factory.mktemp("cli") / "S"
    proc = train_py("-m", "model.name_or_path=null,/nonexistent/model-dir", "seed=1,2", *TINY, port_base(),
                    f"hydra.sweep.dir={path}", check=False)
    assert proc.returncode != 0, "a sweep with failed jobs fails"
    assert "4 jobs submitted" in proc.stdout  # the progress lines (not a terminal here)
    return path


@pytest.mark.slow
def test_status_shows_completed_and_failed_rows(sweep: Path) -> None:
    assert states(sweep) == {0: "COMPLETED", 1: "COMPLETED", 2: "FAILED", 3: "FAILED"}
    # the installed console command prints the table: one row per job
    exe = Path(sys.executable).with_name("automodel-hydra")
    table = subprocess.run([str(exe), "status", str(sweep)], capture_output=True, text=True, timeout=60,
                           check=True).stdout
    rows = [line for line in table.splitlines() if line.startswith("│")]
    assert len(rows) == 4
    assert [r.split()[-2] for r in rows] == ["COMPLETED", "COMPLETED", "FAILED", "FAILED"], table
    assert "model.name_or_path=/nonexistent/model-dir seed=2" in rows[3]


@pytest.mark.slow
def test_a_job_dir_of_the_sweep_is_a_run_dir_too(sweep: Path) -> None:
    assert states(sweep / "2") == {2: "FAILED"}
    assert states(sweep / "1") == {1: "COMPLETED"}


@pytest.mark.slow
def test_report_writes_a_loss_png_and_final_metrics(sweep: Path) -> None:
    out = cli_out("report", str(sweep))
    png = sweep / "report" / "loss.png"
    assert png.stat().st_size > 10_000 and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    with open(sweep / "report" / "final_metrics.csv") as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["completed"], r["step"]) for r in rows] == [
        ("0", "True", "4"), ("1", "True", "4"), ("2", "False", ""), ("3", "False", "")]
    assert float(rows[0]["loss"]) > 0 and "loss.png" in out


@pytest.mark.slow
def test_logs_prints_a_job_log_and_asks_which_job_in_a_sweep(sweep: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["logs", str(sweep), "1", "--no-follow"]) == 0
    assert "done:" in capsys.readouterr().out
    assert cli.main(["logs", str(sweep), "1"]) == 0  # following a finished job prints it and returns
    assert "ended COMPLETED" in capsys.readouterr().err
    assert cli.main(["logs", str(sweep)]) == 2
    assert "name one" in capsys.readouterr().err
    assert cli.main(["logs", str(sweep), "7"]) == 2
    assert "no job 7" in capsys.readouterr().err


@pytest.mark.slow
def test_cancel_really_stops_a_running_interactive_job(tmp_path: Path) -> None:
    sweep = tmp_path / "S"
    log = open(tmp_path / "driver.out", "w")  # noqa: SIM115
    driver = subprocess.Popen([sys.executable, str(ROOT / "train.py"), "-m", "seed=1,2", *TINY, port_base(),
                               "step_scheduler.max_steps=100000", f"hydra.sweep.dir={sweep}"],
                              stdout=log, stderr=subprocess.STDOUT)
    pids: list[int] = []
    try:
        wait_for(lambda: all((sweep / str(j) / "metrics.jsonl").is_file() for j in (0, 1)), 180, "both jobs to train")
        pids = [int((sweep / str(j) / "launch" / "pid").read_text()) for j in (0, 1)]
        assert states(sweep) == {0: "RUNNING", 1: "RUNNING"}

        assert "was RUNNING, cancel requested" in cli_out("cancel", str(sweep), "1")
        wait_for(lambda: states(sweep)[1] == "CANCELLED", 60, "job 1 to stop")
        assert not group_alive(pids[1]), "every process of job 1 is gone"
        assert states(sweep)[0] == "RUNNING", "the other job trains on"

        cli_out("cancel", str(sweep))
        driver.wait(timeout=90)
        assert states(sweep) == {0: "CANCELLED", 1: "CANCELLED"}
        assert not any(map(group_alive, pids))
        assert not list(sweep.glob("*/result.json"))
        assert "already CANCELLED" in cli_out("cancel", str(sweep), "1")
    finally:
        if driver.poll() is None:
            driver.kill()
        for pid in pids:
            if group_alive(pid):
                os.killpg(pid, 9)
        log.close()


def group_alive(pgid: int) -> bool:
    """Whether any process of the torchrun process group ``pgid`` (torchrun and its workers) still runs."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def test_status_is_unknown_when_the_backend_cannot_tell(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from automodel_hydra import backends

    def broken(record: dict[str, tp.Any]) -> str:
        raise RuntimeError("sacct: error: Problem talking to the database")

    fakes = {"slurm": types.SimpleNamespace(status=broken), "skypilot": types.SimpleNamespace(status=lambda r: "UP"),
             # a backend that answers for many jobs at once is asked once
             "interactive": types.SimpleNamespace(statuses=lambda records: ["RUNNING"] * len(records))}
    monkeypatch.setattr(backends, "get", fakes.__getitem__)
    jobs = [{"backend": b, "job_ids": [f"{i}7"], "job_num": i, "overrides": [f"seed={i}"], "job_dir": str(tmp_path / str(i)),
             "job_name": "train", "log_path": None} for i, b in enumerate(["slurm", "skypilot", "interactive"])]
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "manifest.json").write_text(json.dumps({"jobs": jobs}))
    assert cli.main(["status", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["state"], r["job_ids"]) for r in rows] == [("UNKNOWN", ["07"]), ("UNKNOWN", ["17"]), ("RUNNING", ["27"])]
    assert "Problem talking to the database" in rows[0]["note"] and "'UP'" in rows[1]["note"]
    assert cli.main(["status", str(tmp_path)]) == 0
    assert capsys.readouterr().out.count("UNKNOWN") == 2


def test_a_dir_without_records_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", str(tmp_path)]) == 2
    assert "not a run or sweep dir" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- Slurm

SLURM = ["launcher=slurm", "slurm.gpus_per_node=0", "slurm.partition=debug", "slurm.time=00:10:00", "slurm.nodes=1",
         "slurm.ntasks_per_node=1", "step_scheduler.log_interval=1", "checkpoint.enabled=false"]


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_states_come_from_sacct_and_cancel_really_cancels(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    from automodel_hydra.states import JobState

    run, sweep = tmp_path / "R", tmp_path / "S"
    train_py(*SLURM, "step_scheduler.max_steps=100000", f"hydra.run.dir={run}")  # returns once submitted
    proc = train_py("-m", *SLURM, "slurm.detach=true", "model.name_or_path=null,/nonexistent/model-dir",
                    "step_scheduler.max_steps=4", f"hydra.sweep.dir={sweep}")
    jobs = json.loads((sweep / "launch" / "manifest.json").read_text())["jobs"]
    rows = json.loads(cli_out("status", str(sweep), "--json"))
    assert [r["job_ids"] for r in rows] == [j["job_ids"] for j in jobs]
    assert all(r["state"] in ("PENDING", "RUNNING", "COMPLETED", "FAILED") for r in rows), [
        (r["state"], r["note"]) for r in rows]
    assert "submitted slurm job" in proc.stdout

    wait_for(lambda: (run / "metrics.jsonl").is_file(), 120, "the long job to train")
    assert states(run) == {0: "RUNNING"}
    assert "was RUNNING, cancel requested" in cli_out("cancel", str(run))
    job_id = json.loads((run / "launch" / "submission.json").read_text())["job_ids"][0]
    slurm_cluster.wait_gone(job_id, timeout=60)
    assert states(run) == {0: "CANCELLED"} and slurm_cluster.sacct_state(job_id, timeout=30) == "CANCELLED"

    wait_for(lambda: all(JobState(s).final for s in states(sweep).values()), 150, "the sweep to finish")
    assert states(sweep) == {0: "COMPLETED", 1: "FAILED"}
    assert [slurm_cluster.sacct_state(j["job_ids"][0], timeout=30) for j in jobs] == ["COMPLETED", "FAILED"]
    assert "step 4/4" in cli_out("logs", str(sweep), "0", "--no-follow")
