"""``automodel-hydra runs|status|logs|cancel|report`` and ``python train.py --help``: on real local runs and sweeps,
on run dirs laid out as the product lays them out, and the honesty rules (UNKNOWN, FAILED).

The Slurm side (states read from the real scheduler's sacct, scancel) is at the end, on the project's test cluster.
"""

from __future__ import annotations

import contextlib
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
import yaml

from automodel_hydra import cli
from automodel_hydra.argv import hydra_flags_first
from automodel_hydra.backends.interactive import free_port
from automodel_hydra.plan import read_from
from automodel_hydra.states import JobState
from tests.helpers import ROOT, broken_model_dir, train_py, wait_for

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


@pytest.fixture(scope="module")
def sweep_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, subprocess.CompletedProcess[str]]:
    """A real local sweep of 4 tiny jobs: jobs 0 and 1 train; jobs 2 and 3 fail in their ranks (a model no rank
    can load). The sweep dir and the command's process (stdout and stderr merged)."""
    path = tmp_path_factory.mktemp("cli") / "S"
    broken = broken_model_dir(path.parent)
    proc = train_py("-m", f"model.name_or_path=null,{broken}", "seed=1,2", *TINY, port_base(),
                    f"hydra.sweep.dir={path}", check=False)
    assert proc.returncode != 0, "a sweep with failed jobs fails"
    assert "4 jobs submitted" in proc.stdout  # the progress lines (not a terminal here)
    return path, proc


@pytest.fixture(scope="module")
def sweep(sweep_run: tuple[Path, subprocess.CompletedProcess[str]]) -> Path:
    return sweep_run[0]


@pytest.mark.slow
def test_the_sweeps_last_line_names_its_dir_and_the_report_command(
        sweep_run: tuple[Path, subprocess.CompletedProcess[str]]) -> None:
    path, proc = sweep_run
    lines = proc.stdout.strip().splitlines()
    assert lines[-1] == f"sweep {path}: 2 COMPLETED, 2 FAILED; automodel-hydra report {path}", lines[-4:]
    assert sum(line.startswith("error: interactive job ") for line in lines[-3:-1]) == 2, "each failure's line first"


@pytest.mark.slow
def test_status_shows_completed_and_failed_rows(sweep: Path) -> None:
    assert states(sweep) == {0: "COMPLETED", 1: "COMPLETED", 2: "FAILED", 3: "FAILED"}
    # the installed console command prints the table: one row per job
    exe = Path(sys.executable).with_name("automodel-hydra")
    table = subprocess.run([str(exe), "status", str(sweep)], capture_output=True, text=True, timeout=60,
                           check=True).stdout
    header = next([c.strip() for c in line.strip("┃").split("┃")] for line in table.splitlines()
                  if line.startswith("┃"))
    rows = [dict(zip(header, (c.strip() for c in line.strip("│").split("│")))) for line in table.splitlines()
            if line.startswith("│")]
    assert len(rows) == 4
    assert [r["state"] for r in rows] == ["COMPLETED", "COMPLETED", "FAILED", "FAILED"], table
    assert "broken-model seed=2" in rows[3]["overrides"]
    assert [r["step"] for r in rows] == ["4", "4", "-", "-"], "the last logged step of the jobs that trained"


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
        # a cancel is a stop the user asked for: the ranks end cleanly, and neither torchrun nor the driver
        # prints a traceback (torchrun does when it is signalled itself)
        outputs = [(tmp_path / "driver.out").read_text(), *(
            (sweep / str(j) / "launch" / "torchrun.out").read_text() for j in (0, 1))]
        assert not [o for o in outputs if "Traceback" in o]
        # each cancelled job ends with a stop line, not an error
        assert driver.returncode == 130 and "error:" not in outputs[0]
        assert sorted(line.split(" (")[0] for line in outputs[0].splitlines() if line.startswith("stopped: ")) == [
            f"stopped: interactive job {pid}" for pid in sorted(pids)]
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
    from automodel_hydra.states import StateInfo

    calls: list[int] = []

    def broken(refs: tp.Any) -> list[StateInfo]:
        raise RuntimeError("sacct: error: Problem talking to the database")

    def answers(refs: tp.Any) -> list[StateInfo]:
        calls.append(len(refs))  # a backend answers for all its jobs in one call
        return [StateInfo(JobState.RUNNING)] * len(refs)

    def fake(states: tp.Callable[[tp.Any], list[StateInfo]]) -> types.SimpleNamespace:
        return types.SimpleNamespace(states=states, ref_from_record=lambda r: r["job_ids"][0],
                                     fetch_results=lambda jobs: None)

    fakes = {"slurm": fake(broken), "interactive": fake(answers)}
    monkeypatch.setattr(backends, "get", fakes.__getitem__)
    jobs = [{"backend": b, "job_ids": [f"{i}7"], "job_num": i, "overrides": [f"seed={i}"],
             "job_dir": str(tmp_path / str(i)), "job_name": f"name{i}", "log_path": None}
            for i, b in enumerate(["slurm", "interactive", "interactive"])]
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "manifest.json").write_text(json.dumps({"jobs": jobs}))
    assert cli.main(["status", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["state"], r["job_ids"]) for r in rows] == [("UNKNOWN", ["07"]), ("RUNNING", ["17"]), ("RUNNING", ["27"])]
    assert "Problem talking to the database" in rows[0]["note"] and calls == [2]
    assert [r["name"] for r in rows] == ["name0", "name1", "name2"]  # the recorded job name (sbatch --job-name)
    assert cli.main(["status", str(tmp_path)]) == 0
    table = capsys.readouterr().out
    assert table.count("UNKNOWN") == 1 and "name2" in table


def test_status_flags_pending_reasons_that_mean_never(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    from automodel_hydra import backends
    from automodel_hydra.states import StateInfo

    infos = [StateInfo(JobState.PENDING, "Priority"), StateInfo(JobState.PENDING, "PartitionConfig")]
    fake = types.SimpleNamespace(states=lambda refs: infos[: len(refs)], ref_from_record=lambda r: r,
                                 fetch_results=lambda jobs: None,
                                 pending_note=backends.get("slurm").pending_note)  # what a reason means: Slurm's
    monkeypatch.setattr(backends, "get", lambda name: fake)
    jobs = [{"backend": "slurm", "job_ids": [f"4_{i}"], "job_num": i, "overrides": [],
             "job_dir": str(tmp_path / str(i)), "job_name": "train", "log_path": None} for i in range(2)]
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "manifest.json").write_text(json.dumps({"jobs": jobs}))
    assert cli.main(["status", str(tmp_path), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["note"] == "Priority"
    assert rows[1]["note"].startswith("PartitionConfig (will not start as submitted")


def test_a_dir_without_records_is_a_clear_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["status", str(tmp_path)]) == 2
    assert "not a run or sweep dir" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------- no DIR: the latest


def _job(job_dir: Path, num: int | None, overrides: list[str], *, completed: bool = True, when: float = 0.0,
         metrics: tp.Sequence[dict[str, tp.Any]] = ()) -> dict[str, tp.Any]:
    """A finished local job dir as the product leaves it (launch/pid, submission.json, result.json, metrics.jsonl);
    returns its submission record."""
    (job_dir / "launch").mkdir(parents=True)
    (job_dir / ".hydra").mkdir()
    (job_dir / "launch" / "pid").write_text("999999\n")
    record = {"backend": "interactive", "job_ids": [], "job_name": "train", "job_num": num, "overrides": overrides,
              "job_dir": str(job_dir), "log_path": str(job_dir / "train.log"), "files": [],
              "submitted_at": time.strftime("%Y-%m-%dT%H:%M:%S+00:00", time.gmtime(when or time.time()))}
    (job_dir / "launch" / "submission.json").write_text(json.dumps(record))
    (job_dir / "train.log").write_text(f"log of job {num}\nstep 2/2  loss 1.0\n")
    (job_dir / "launch" / "run_id").write_text("r1\n")
    if completed:  # as rank 0 writes it: with the launch id of launch/run_id
        (job_dir / "result.json").write_text(json.dumps({"step": 2, "loss": 1.0, "run_id": "r1"}))
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics))
    if when:
        os.utime(job_dir / "launch" / "submission.json", (when, when))
    return record


def _sweep(root: Path, overrides: list[list[str]], when: float, **kw: tp.Any) -> Path:
    root.mkdir(parents=True)
    (root / "multirun.yaml").write_text("hydra: {}\n")
    jobs = [_job(root / str(i), i, o, when=when, **kw) for i, o in enumerate(overrides)]
    (root / "launch").mkdir()
    (root / "launch" / "manifest.json").write_text(json.dumps({"jobs": jobs}))
    os.utime(root / "launch" / "manifest.json", (when, when))
    return root


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working dir with Hydra's default layout: an old run, a newer 2-job sweep, and decoys."""
    monkeypatch.chdir(tmp_path)
    now = time.time()
    _job(tmp_path / "outputs" / "2024-05-01" / "10-00-00", None, ["seed=1"], when=now - 3600)
    _sweep(tmp_path / "multirun" / "2024-05-01" / "11-00-00", [["optim.lr=0.1", "seed=1"], ["optim.lr=0.2", "seed=1"]],
           when=now - 60)
    # decoys: a record inside a job dir (never walked into) and a dry run (nothing submitted)
    _job(tmp_path / "outputs" / "2024-05-01" / "10-00-00" / "checkpoints" / "x", None, [], when=now)
    (tmp_path / "outputs" / "2024-05-02" / "09-00-00" / "launch").mkdir(parents=True)
    return tmp_path


def test_without_dir_status_logs_report_use_the_newest_run_or_sweep(here: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert [r.path.relative_to(here).as_posix() for r in cli.find_runs()] == [
        "multirun/2024-05-01/11-00-00", "outputs/2024-05-01/10-00-00"]
    assert cli.main(["status", "--json"]) == 0
    out = capsys.readouterr()
    assert [(r["job"], r["state"]) for r in json.loads(out.out)] == [(0, "COMPLETED"), (1, "COMPLETED")]
    assert "latest sweep: " in out.err and "11-00-00" in out.err
    assert cli.main(["logs", "1", "--no-follow"]) == 0  # `logs JOB`: job JOB of the latest sweep
    assert "log of job 1" in capsys.readouterr().out
    assert cli.main(["logs", "--no-follow"]) == 2  # a sweep of 2: which job?
    assert "name one" in capsys.readouterr().err
    # a newer single run becomes the latest
    _job(here / "outputs" / "2024-05-03" / "08-00-00", None, ["seed=3"], completed=False)
    assert cli.main(["logs", "--no-follow"]) == 0
    assert "log of job None" in capsys.readouterr().out


def test_without_dir_and_nothing_here_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    assert cli.main(["status"]) == 2
    assert "no run or sweep under" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_refused_at_plan_time_is_not_listed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """A refused run or sweep leaves only what Hydra writes before our code runs (``.hydra/``, an empty
    ``train.log``); without a launch record it is no run: ``runs`` lists nothing, ``status`` finds nothing."""
    monkeypatch.chdir(tmp_path)
    for args in (["launcher=slurm", "slurm.nodes=0", f"hydra.run.dir={tmp_path / 'outputs' / 'r'}"],
                 ["-m", "launcher=slurm", "slurm.nodes=0,1", f"hydra.sweep.dir={tmp_path / 'multirun' / 's'}"]):
        proc = train_py(*args, "dry_run=true", check=False)
        assert proc.returncode == 2 and "error: slurm.nodes=0 is invalid" in proc.stdout, proc.stdout[-2000:]
    assert (tmp_path / "outputs" / "r" / "train.log").is_file() and (tmp_path / "multirun" / "s" / "0").is_dir()
    assert cli.find_runs() == []
    assert cli.main(["runs"]) == 1 and "no runs or sweeps under" in capsys.readouterr().err
    assert cli.main(["status"]) == 2 and "no run or sweep under" in capsys.readouterr().err


@pytest.mark.slow
def test_version_is_ours_however_the_app_is_started(tmp_path: Path) -> None:
    """``python train.py --version`` (and ``automodel-hydra FILE.yaml --version``, which runs it) printed Hydra's
    version (``Hydra 1.3.8``); every form prints this package's line, before anything is composed or written."""
    from importlib.metadata import version

    line = f"automodel-hydra {version('automodel-hydra')}"  # the installed distribution's (pyproject.toml)
    (tmp_path / "mine.yaml").write_text("step_scheduler:\n  max_steps: 3\n")
    train = str(ROOT / "train.py")
    for argv in ([train, "--version"], [train, "launcher=slurm", "--version"],
                 ["-m", "automodel_hydra.cli", "--version"], ["-m", "automodel_hydra.cli", "mine.yaml", "--version"]):
        proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, timeout=120, cwd=tmp_path)
        assert (proc.returncode, proc.stdout.strip()) == (0, line), (argv, proc.stdout, proc.stderr)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["mine.yaml"]


def test_runs_lists_past_runs_and_sweeps(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["runs", "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["dir"], r["kind"], r["launcher"], r["jobs"]) for r in rows] == [
        ("multirun/2024-05-01/11-00-00", "sweep", "interactive", 2),
        ("outputs/2024-05-01/10-00-00", "run", "interactive", 1)]
    assert rows[0]["states"] == {"COMPLETED": 2} and rows[1]["states"] == {"COMPLETED": 1}
    assert all(len(r["when"]) == 16 for r in rows)  # YYYY-MM-DD HH:MM
    assert cli.main(["runs"]) == 0
    table = capsys.readouterr().out
    assert "2 COMPLETED" in table and "multirun/2024-05-01/11-00-00" in table


def test_final_states_come_from_jobstate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    """PREEMPTED (not requeued) is final in the single vocabulary: nothing to cancel, and `logs` stops following."""
    from automodel_hydra import backends
    from automodel_hydra.states import StateInfo

    cancelled: list[tp.Any] = []
    fake = types.SimpleNamespace(states=lambda refs: [StateInfo(JobState.PREEMPTED)] * len(refs),
                                 cancel=cancelled.extend, ref_from_record=lambda r: r["job_dir"],
                                 read_log=lambda ref, log, pos: read_from(log, pos), fetch_results=lambda jobs: None)
    monkeypatch.setattr(backends, "get", lambda name: fake)
    _job(tmp_path / "R", None, [], completed=False)
    assert cli.main(["cancel", str(tmp_path / "R")]) == 0
    assert "already PREEMPTED, nothing to cancel" in capsys.readouterr().out and not cancelled
    assert cli.main(["logs", str(tmp_path / "R"), "--poll", "0.01"]) == 0  # follows, sees a final state, returns
    assert "ended PREEMPTED" in capsys.readouterr().err


def _png_title(path: Path) -> str:
    from PIL import Image

    with Image.open(path) as img:
        return img.text["Title"]


@contextlib.contextmanager
def stdout_nobody_reads(monkeypatch: pytest.MonkeyPatch) -> tp.Iterator[None]:
    """This process's stdout is a pipe whose reader went away (``| head -1``). Entered in the test's body: pytest
    sets its own capture as ``sys.stdout`` again between a fixture's set-up and the test."""
    read, write = os.pipe()
    os.close(read)
    with os.fdopen(write, "w", buffering=1) as stream:
        monkeypatch.setattr(sys, "stdout", stream)
        yield
        monkeypatch.undo()


def test_status_and_runs_into_a_closed_pipe_exit_0(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``automodel-hydra status | head -1`` under ``set -o pipefail``: the reader's leaving is not the command's
    failure (rich answered the broken pipe with SystemExit(1))."""
    with stdout_nobody_reads(monkeypatch):
        assert cli.main(["runs"]) == 0
        assert cli.main(["status"]) == 0
        assert cli.main(["status", "--json"]) == 0


@pytest.mark.slow  # matplotlib renders a PNG (~2 s)
def test_report_into_a_closed_pipe_still_writes_its_files(here: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``automodel-hydra report S | head``: the table goes to nobody, the PNG and CSVs are still written."""
    sweep = here / "multirun" / "2024-05-01" / "11-00-00"
    for i in (0, 1):
        (sweep / str(i) / "metrics.jsonl").write_text("".join(
            json.dumps({"step": s, "loss": 4.0 / (s + i)}) + "\n" for s in range(1, 6)))
    with stdout_nobody_reads(monkeypatch):
        assert cli.main(["report", str(sweep)]) == 0
    assert (sweep / "report" / "loss.png").stat().st_size > 0
    assert (sweep / "report" / "curves.csv").is_file() and (sweep / "report" / "final_metrics.csv").is_file()


@pytest.mark.slow  # matplotlib renders a PNG (~2 s)
def test_report_plots_every_logged_step_and_validation_loss(here: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sweep = here / "multirun" / "2024-05-02" / "12-00-00"
    metrics = [[{"step": s, "loss": 5.0 / (s + k), "val_loss": 6.0 / (s + k) if s % 100 == 0 else None}
                for s in range(1, 301)] for k in (1, 2)]
    _sweep(sweep, [["optim.lr=0.1", "seed=7"], ["optim.lr=0.2", "seed=7"]], when=time.time())
    for i in (0, 1):
        (sweep / str(i) / "metrics.jsonl").write_text("".join(json.dumps(m) + "\n" for m in metrics[i]))
    assert cli.main(["report"]) == 0
    with open(sweep / "report" / "curves.csv") as f:
        points = list(csv.DictReader(f))
    for i, label in enumerate(["0: optim.lr=0.1", "1: optim.lr=0.2"]):
        mine = [p for p in points if p["job"] == label]
        assert [int(p["step"]) for p in mine] == list(range(1, 301))  # every logged step, not a thinned curve
        assert [int(p["step"]) for p in mine if p["val_loss"]] == [100, 200, 300]
        assert float(mine[99]["val_loss"]) == pytest.approx(6.0 / (100 + i + 1))
    title = _png_title(sweep / "report" / "loss.png")
    assert str(sweep) in title and "varied: optim.lr" in title and "seed" not in title
    with open(sweep / "report" / "final_metrics.csv") as f:
        # result.json of these jobs has no val_loss: the last logged one stands in
        assert [float(r["val_loss"]) for r in csv.DictReader(f)] == pytest.approx([6.0 / 301, 6.0 / 302])
    capsys.readouterr()


# ----------------------------------------------------------------------------------------------- train.py --help


@pytest.mark.slow  # starts Hydra in a subprocess (~2-5 s)
def test_help_is_the_products_help() -> None:
    out = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert "powered by Hydra" not in out and "slurm: null" not in out
    for launcher in ("interactive", "slurm", "skypilot"):  # each launcher and what it selects
        assert f"Selects the {launcher}: section" in out
    assert "launcher: interactive, skypilot, slurm" in out  # Hydra's $APP_CONFIG_GROUPS
    for command in ("runs", "status [DIR]", "logs [DIR] [JOB]", "cancel DIR [JOB]", "report [DIR]"):
        assert f"automodel-hydra {command}" in out
    assert "outputs/DATE/TIME-TAG/" in out and "multirun/DATE/TIME-TAG/N/" in out and "final_model/" in out
    assert "python train.py -m optim.lr=1e-4,3e-4 seed=1,2" in out
    assert "'++slurm.env_vars.HF_TOKEN=${HF_TOKEN}'" in out and "your $HF_TOKEN" in out  # $ survives the template
    # the list of sections and keys is read from the schema (it cannot drift from the config): each section a user
    # can set, with its keys, nested ones (slurm.tunnel) as their own entries
    from automodel_hydra.train import help_keys

    assert help_keys() in out
    for entry in ("fault_tolerance  enabled", "slurm.tunnel     host", "profile.nsys     enabled",
                  "seed, dry_run, recipe"):
        assert entry in out
    assert "snapshot" in out.split("\n  slurm            ")[1].split("  slurm.tunnel")[0]


# ----------------------------------------------------------------------------------------------- a real run


@pytest.mark.slow
def test_a_real_run_progress_in_its_log_and_final_model_loads(tmp_path: Path) -> None:
    """``python train.py`` (1 process) in a fresh dir, then, from that dir, the commands without DIR: progress lines
    are in the job log ``automodel-hydra logs`` prints, and final_model/ loads with from_pretrained and gives the
    trained model's logits (the model restored from the run's last checkpoint)."""
    import torch
    from transformers import AutoModelForCausalLM

    from automodel_hydra import config
    from automodel_hydra.checkpoint import MODEL_AND_OPTIM, CheckpointManager, ModelOptimState
    from automodel_hydra.recipes.llm_finetune import build_model

    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), *TINY, "checkpoint.enabled=true", port_base()],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (run,) = [p.parent.parent for p in tmp_path.glob("outputs/*/*/launch/submission.json")]

    def here(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "automodel_hydra.cli", *argv], cwd=tmp_path, capture_output=True,
                              text=True, timeout=60, check=True)

    log = here("logs", "--no-follow").stdout
    progress = [line for line in log.splitlines() if "[rank0][automodel_hydra.metrics]" in line]
    assert [line.split(" - ")[1].split()[:2] for line in progress] == [["step", f"{s}/4"] for s in (1, 2, 3, 4)]
    assert all("loss" in line and "lr" in line and "tok/s" in line for line in progress)
    assert progress[0] in (run / "train.log").read_text()
    assert json.loads(here("status", "--json").stdout)[0]["state"] == "COMPLETED"
    assert json.loads(here("runs", "--json").stdout)[0]["states"] == {"COMPLETED": 1}

    cfg = config.load(yaml.safe_load((run / "launch" / "job.yaml").read_text()))
    trained = build_model(cfg, torch.device("cpu"), 256)
    state = {MODEL_AND_OPTIM: ModelOptimState(trained, torch.optim.AdamW(trained.parameters()))}
    assert CheckpointManager(cfg.checkpoint_dir).load(state, "latest") == 4
    exported = AutoModelForCausalLM.from_pretrained(run / "final_model")
    ids = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(exported.eval()(input_ids=ids).logits, trained.eval()(input_ids=ids).logits,
                                   rtol=0, atol=1e-6)


# ----------------------------------------------------------------------------------------------- Slurm

SLURM = ["launcher=slurm", "slurm.gpus_per_node=0", "slurm.partition=debug", "slurm.time=00:10:00", "slurm.nodes=1",
         "slurm.ntasks_per_node=1", "step_scheduler.log_interval=1", "checkpoint.enabled=false"]


@pytest.mark.slurm
@pytest.mark.slow
def test_slurm_states_come_from_sacct_and_cancel_really_cancels(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    from automodel_hydra.states import JobState

    run, sweep = tmp_path / "R", tmp_path / "S"
    train_py(*SLURM, "step_scheduler.max_steps=100000", f"hydra.run.dir={run}")  # returns once submitted
    proc = train_py("-m", *SLURM, "slurm.detach=true", f"model.name_or_path=null,{broken_model_dir(tmp_path)}",
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


# ----------------------------------------------------------------------------------------------- stop lines


def _outcome(launcher: str, job_dir: Path, state: JobState) -> tp.Any:
    from automodel_hydra import config, driver
    from automodel_hydra.plan import JobResult, JobSpec, Plan, Submission
    from tests.helpers import compose_cfg

    cfg = config.load(compose_cfg([f"launcher={launcher}"], job_dir))
    job = JobSpec(job_dir=job_dir, job_name="train")
    sub = Submission(Plan(launcher, job, {}, None), types.SimpleNamespace(ids=["42"]))
    return driver.Outcome(driver.Prepared(cfg, job, False), sub, JobResult(state, error="torchrun exited with 0"))


@pytest.mark.parametrize("launcher", ["interactive", "slurm", "skypilot"])
def test_a_cancelled_job_ends_with_one_stop_line_of_one_format(launcher: str, tmp_path: Path) -> None:
    """``automodel-hydra cancel`` (or scancel, sky cancel) from another shell: the waiting command's last line is a
    stop, not an error: what was stopped and where the checkpoint is, in the format a Ctrl-C stop uses."""
    from automodel_hydra.plan import JobFailedError, JobStoppedError

    ckpt = tmp_path / "checkpoints"
    (ckpt / "step-20").mkdir(parents=True)
    (ckpt / "step-20" / ".metadata").write_text("{}")
    (ckpt / "latest").write_text("step-20\n")
    with pytest.raises(JobStoppedError) as stopped:
        _outcome(launcher, tmp_path, JobState.CANCELLED).value()
    line = str(stopped.value)
    assert line.startswith(f"{launcher} job 42 (cancelled); ") and "\n" not in line and "exited" not in line
    if launcher == "skypilot":  # the checkpoints are on the cloud, not here
        assert line.endswith("checkpoints: in the job's bucket or on its cluster (launch/sky_task.yaml, file_mounts)")
    else:
        assert line.endswith(f"newest checkpoint: {ckpt / 'step-20'}")
    with pytest.raises(JobFailedError) as failed:  # a failure stays an error
        _outcome(launcher, tmp_path, JobState.FAILED).value()
    assert not isinstance(failed.value, JobStoppedError)


def test_ctrl_c_stop_line_names_what_keeps_running_and_how_to_cancel_it(tmp_path: Path) -> None:
    from automodel_hydra import driver
    from automodel_hydra.plan import JobResult
    from automodel_hydra.states import StateInfo
    from automodel_hydra.stops import StopRequested

    running = types.SimpleNamespace(states=lambda refs: [StateInfo(JobState.RUNNING)] * len(refs))
    local = _outcome("interactive", tmp_path / "L", JobState.RUNNING)
    local.result = None
    stop = StopRequested(2)
    how = "killed after 30 s: rank 1 (pid 7)"
    stop.results[str(local.prepared.job.job_dir)] = JobResult(JobState.CANCELLED, stop=how)
    assert driver._stop_summary([local], {"interactive": running}, None, stop) == (
        f"interactive job 42 (Ctrl-C: killed after 30 s: rank 1 (pid 7)); no checkpoint yet in "
        f"{tmp_path / 'L' / 'checkpoints'}")
    local.result = None  # a local job the stop did not reach (another backend's wait was stopped) keeps running
    assert "interactive job 42 keeps running" in driver._stop_summary([local], {"interactive": running}, None,
                                                                      StopRequested(15))
    remote = _outcome("slurm", tmp_path / "S", JobState.RUNNING)
    remote.result = None
    assert driver._stop_summary([remote], {"slurm": running}, None, StopRequested(2)) == (
        f"waiting (Ctrl-C); slurm job 42 keeps running: cancel with automodel-hydra cancel {tmp_path / 'S'}; "
        f"no checkpoint yet in {tmp_path / 'S' / 'checkpoints'}")


@pytest.mark.slow
def test_hydra_flags_work_anywhere_on_the_command_line(tmp_path: Path) -> None:
    """``-m`` (or ``--cfg job``) after an override ended Hydra's override list: argparse then refused the rest as
    "unrecognized arguments", listing the arguments this project adds. A flag works wherever it is written."""
    assert hydra_flags_first(["a=1", "-m", "b=1,2", "--cfg", "job", "-cd=D"]) == [
        "-m", "--cfg", "job", "-cd=D", "a=1", "b=1,2"]
    sweep = tmp_path / "multirun"
    proc = train_py("launcher=slurm", "slurm.partition=debug", "slurm.ntasks_per_node=2", "-m", "seed=1,2",
                    "dry_run=true", "slurm.snapshot=none", f"hydra.sweep.dir={sweep}")
    assert "unrecognized arguments" not in proc.stdout
    assert sorted(p.name for p in sweep.iterdir() if p.name.isdigit()) == ["0", "1"]


def test_status_of_a_sweep_fits_on_a_screen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    """A sweep through ``slurm.tunnel``: every job shares ~400 characters of launcher overrides, and while the login
    node does not answer the backend gives every job the same long reason. Each row shows what tells its job
    apart; what is the same for every job is said once, below the table (rows were ~300-400 characters)."""
    from automodel_hydra import backends
    from automodel_hydra.states import StateInfo

    reason = ("slurm.tunnel.host: me@login.example.org port 22 does not answer (ssh: connect to host login.example.org "
              "port 22: Connection timed out); check slurm.tunnel.host and slurm.tunnel.port")
    fake = types.SimpleNamespace(states=lambda refs: [StateInfo(JobState.UNKNOWN, reason)] * len(refs),
                                 ref_from_record=lambda r: r, fetch_results=lambda jobs: None)
    monkeypatch.setattr(backends, "get", lambda name: fake)
    shared = ["launcher=slurm", "+slurm.tunnel.host=login.example.org", "+slurm.tunnel.user=me",
              f"+slurm.tunnel.identity={tmp_path}/keys/id_ed25519_cluster",
              f"+slurm.tunnel.job_dir=/lustre/projects/team/me/runs/{'x' * 40}",
              f"+slurm.tunnel.options.UserKnownHostsFile={tmp_path}/ssh/known_hosts", "+slurm.detach=true"]
    jobs = [{"backend": "slurm", "job_ids": [f"812_{i}"], "job_num": i,
             "overrides": [*shared[:3], f"optim.lr={lr}", *shared[3:]], "job_dir": str(tmp_path / str(i)),
             "job_name": "train", "log_path": None} for i, lr in enumerate(["1e-4", "3e-4"])]
    (tmp_path / "launch").mkdir()
    (tmp_path / "launch" / "manifest.json").write_text(json.dumps({"jobs": jobs}))
    assert cli.main(["status", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line.startswith("│")]
    assert len(rows) == 2 and "optim.lr=1e-4" in rows[0] and "optim.lr=3e-4" in rows[1]
    assert all(len(r) <= 80 for r in rows), [len(r) for r in rows]
    assert out.count(reason) == 1 and out.count("+slurm.tunnel.host=login.example.org") == 1
    assert f"every job: {' '.join(shared)}" in out and f"note for every job: {reason}" in out
    (tmp_path / "1" / "launch").mkdir(parents=True)
    (tmp_path / "1" / "launch" / "submission.json").write_text(json.dumps(jobs[1]))
    assert cli.main(["status", str(tmp_path / "1")]) == 0  # one run: its overrides are all said once, below
    out = capsys.readouterr().out
    assert all(len(line) <= 80 for line in out.splitlines() if line.startswith("│"))
    assert f"overrides: {' '.join(jobs[1]['overrides'])}" in out and f"note: {reason}" in out


def test_the_last_line_of_a_sweep_not_waited_for_says_how_to_follow_it() -> None:
    from automodel_hydra.progress import last_line

    assert last_line("multirun/S", [None, None, JobState.COMPLETED]) == (
        "sweep multirun/S: 1 COMPLETED, 2 submitted; automodel-hydra status multirun/S; automodel-hydra report "
        "multirun/S")
    assert last_line("multirun/S", []) is None  # a dry run: its own line ("dry run: wrote ...") is the last


@pytest.mark.slurm
@pytest.mark.slow
def test_a_moved_slurm_run_is_read_where_it_is_now(slurm_cluster: tp.Any, tmp_path: Path) -> None:
    """A finished Slurm run's dir moved with ``mv``: ``status`` says COMPLETED (its result.json is found where the
    dir is now), and ``logs --no-follow`` prints its log from there."""
    run = tmp_path / "R"
    train_py(*SLURM, "slurm.wait=true", "step_scheduler.max_steps=3", f"hydra.run.dir={run}")
    moved = tmp_path / "moved" / "R2"
    moved.parent.mkdir()
    os.rename(run, moved)
    assert states(moved) == {0: "COMPLETED"}
    proc = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", "logs", str(moved), "--no-follow"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0 and "no log yet" not in proc.stderr, proc.stderr
    assert "step 3" in proc.stdout or '"step": 3' in proc.stdout or "step=3" in proc.stdout, proc.stdout[-2000:]


@pytest.mark.slow
def test_a_dry_run_into_a_dir_that_holds_a_run_is_refused_and_writes_nothing(tmp_path: Path) -> None:
    """``dry_run=true`` with the ``hydra.run.dir`` of a finished run: one line naming the dir, its record and the way
    out; that run's launch files are unchanged (they still describe the config of its result)."""
    run, markers = tmp_path / "R", tmp_path / "markers"
    args = ["recipe=tests.sweep_recipe:main", "+sweep_test.point=1", "+sweep_test.fail_after=9",
            f"+sweep_test.fail_dir={markers}", "+sweep_test.out=${hydra:runtime.output_dir}",
            "interactive.nproc_per_node=1", f"hydra.run.dir={run}"]
    train_py(*args, "+sweep_test.steps=2")
    files = {p: p.read_bytes() for d in (run / "launch", run / ".hydra") for p in d.iterdir() if p.is_file()}
    proc = train_py(*args, "+sweep_test.steps=5", "dry_run=true", check=False)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == (
        f"error: dry_run=true into {run}, which holds a submitted run ({run / 'launch' / 'submission.json'}): a dry "
        "run writes launch files and would replace that run's, so nothing was written; give the dry run a dir of "
        "its own (hydra.run.dir=...), or drop dry_run=true to launch there")
    assert {p: p.read_bytes() for d in (run / "launch", run / ".hydra") for p in d.iterdir() if p.is_file()} == files
    assert states(run) == {0: "COMPLETED"}
    # a dir the command line does not spell out (an interpolation): refused by the launch, before any launch file
    proc = train_py(*args[:-1], "hydra.run.dir=${oc.env:RUN_DIR}", "+sweep_test.steps=5", "dry_run=true",
                    env={"RUN_DIR": str(run)}, check=False)
    assert proc.returncode == 2 and proc.stdout.strip().splitlines()[-1].startswith(
        f"error: dry_run=true into {run}, which holds a submitted run"), proc.stdout[-3000:]
    assert {p: p.read_bytes() for p in (run / "launch").iterdir() if p.is_file()} == {
        p: b for p, b in files.items() if p.parent.name == "launch"}
