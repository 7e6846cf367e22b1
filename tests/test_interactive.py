"""The interactive launcher for real: torchrun with 2 CPU ranks, resume, failures, ports, dry runs."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time

import pytest

from automodel_hydra.backends.interactive import free_port, resolve_nproc
from automodel_hydra.plan import JobSpec, error_stamps, rank_error
from automodel_hydra.states import JobState
from tests.helpers import broken_model_dir, metrics, train_py


@pytest.mark.slow
def test_two_ranks_train_then_resume_continues_from_newest_checkpoint(tmp_path) -> None:
    run = tmp_path / "R"
    common = [f"hydra.run.dir={run}", "step_scheduler.checkpoint_interval=10", "step_scheduler.log_interval=1",
              "interactive.nproc_per_node=2"]
    train_py(*common, "step_scheduler.max_steps=30")
    rows = metrics(run)
    assert [r["step"] for r in rows] == list(range(1, 31))
    assert {r["world_size"] for r in rows} == {2}
    first, last = sum(r["loss"] for r in rows[:5]) / 5, sum(r["loss"] for r in rows[-5:]) / 5
    assert last < first - 0.5, f"loss did not fall: {first:.3f} -> {last:.3f}"
    assert (run / "checkpoints" / "latest").read_text().strip() == "step-30"
    assert (run / ".hydra" / "config.yaml").exists()

    out = train_py(*common, "step_scheduler.max_steps=40").stdout
    assert "step-30" in out  # resumed from the newest checkpoint
    steps = [r["step"] for r in metrics(run)]
    assert steps == list(range(1, 41)), "every step from 1 to 40 exactly once"
    # only the driver made Hydra dirs: no stray timestamped output dirs from the ranks
    assert sorted(p.name for p in run.iterdir() if p.is_dir()) == [".hydra", "checkpoints", "final_model", "launch"]


@pytest.mark.slow
def test_failing_rank_fails_the_command_and_shows_its_error(tmp_path) -> None:
    proc = train_py(f"hydra.run.dir={tmp_path / 'R'}", f"model.name_or_path={broken_model_dir(tmp_path)}",
                    "interactive.nproc_per_node=2", check=False)
    assert proc.returncode != 0
    last = proc.stdout.strip().splitlines()[-1]
    # the command's last line quotes the failing rank's own exception, not only torchrun's exit code
    assert last.startswith("error: ") and "ended FAILED" in last and "rank " in last and "no-such-architecture" in last
    assert not (tmp_path / "R" / "result.json").exists()
    # the first failed rank's traceback, once, above the last line; torchrun's own summary is in its log
    chained = proc.stdout.count("During handling of the above exception") + proc.stdout.count("direct cause of")
    assert proc.stdout.count("Traceback (most recent call last)") == 1 + chained  # one rank's (with its causes)
    agent_log = next((tmp_path / "R" / "launch").glob("agent.*.log")).read_text()
    root_cause = agent_log[agent_log.index("Root Cause"):]  # torchrun's Root Cause, from the rank's error file
    assert "error_file: <N/A>" not in root_cause and "no-such-architecture" in root_cause
    assert str(tmp_path / "R" / "launch" / "torchrun") in root_cause

    # a rank no torchrun started (as srun starts them) records its exception in launch/error.rank<N>.json
    launch = tmp_path / "R" / "launch"
    shutil.rmtree(launch / "torchrun")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCHELASTIC", "RANK", "WORLD_SIZE"))}
    by_hand = subprocess.run([sys.executable, "-m", "automodel_hydra.worker", str(launch / "job.yaml")], env=env,
                             capture_output=True, text=True, timeout=120)
    assert by_hand.returncode != 0
    assert json.loads((launch / "error.rank0.json").read_text())["message"]["message"].startswith("ValueError: ")
    quoted = rank_error(JobSpec(job_dir=tmp_path / "R", job_name="train")) or ""
    assert quoted.startswith("rank 0: ValueError: ") and "no-such-architecture" in quoted and "\n" not in quoted


@pytest.mark.slow
def test_taken_port_moves_to_next_free_one_and_dry_run_script_runs_by_hand(tmp_path) -> None:
    base = free_port(23000)
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", base))
        busy.listen()
        run = tmp_path / "R"
        args = [f"hydra.run.dir={run}", "step_scheduler.max_steps=2", "step_scheduler.log_interval=1",
                "interactive.nproc_per_node=1", f"interactive.master_port={base}"]
        out = train_py(*args, "dry_run=true").stdout
        assert "torchrun.sh" in out and "nothing was submitted" in out
        assert not (run / "metrics.jsonl").exists()
        out = train_py(*args).stdout
        assert f"rendezvous port {base + 1}" in out
    assert [r["step"] for r in metrics(run)] == [1, 2]
    # the written plan is the exact command: running it by hand trains too
    by_hand = tmp_path / "by_hand"
    train_py(f"hydra.run.dir={by_hand}", "step_scheduler.max_steps=2", "step_scheduler.log_interval=1",
             "interactive.nproc_per_node=1", "dry_run=true")
    subprocess.run(["bash", str(by_hand / "launch" / "torchrun.sh")], check=True, capture_output=True,
                   env={"PATH": "/usr/bin:/bin", "MASTER_PORT": str(free_port(24000))}, timeout=120)
    assert [r["step"] for r in metrics(by_hand)] == [1, 2]


@pytest.mark.parametrize("value, gpus, cpus, expected", [
    ("auto", 0, 2, 2), ("auto", 8, 2, 8), ("3", 0, 2, 3), ("1", 8, 64, 1),
])
def test_nproc_per_node(value: str, gpus: int, cpus: int, expected: int) -> None:
    assert resolve_nproc(value, gpus, cpus) == expected


@pytest.mark.slow
def test_second_run_in_a_busy_dir_is_refused_and_stale_pids_are_never_signalled(tmp_path) -> None:
    import os
    import sys
    import time

    from automodel_hydra.backends import interactive
    from tests.helpers import ROOT

    run = tmp_path / "R"
    args = [sys.executable, str(ROOT / "train.py"), f"hydra.run.dir={run}", "step_scheduler.max_steps=400",
            "interactive.nproc_per_node=1", "step_scheduler.log_interval=1"]
    first = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 120
        while not (run / "metrics.jsonl").exists() and time.time() < deadline:
            time.sleep(0.2)
        local = interactive.Interactive()
        ref = interactive.LocalRef(str(run))
        assert local.states([ref])[0].state is JobState.RUNNING
        second = train_py(f"hydra.run.dir={run}", "step_scheduler.max_steps=2", "interactive.nproc_per_node=1",
                          check=False)
        assert second.returncode == 2
        assert f"{run} is in use by a running job" in second.stdout
        assert "max_steps: 400" in (run / "launch" / "job.yaml").read_text()  # the running job's plan is intact
    finally:
        first.terminate()
        first.wait(timeout=120)
    assert local.states([ref])[0].state is not JobState.RUNNING
    # a pid file naming a process that is not this job's (a recycled pid) is never signalled
    bystander = subprocess.Popen(["sleep", "60"], start_new_session=True)
    try:
        (run / "launch" / "pid").write_text(f"{bystander.pid}\n")
        local.cancel([ref])
        time.sleep(0.2)
        assert bystander.poll() is None
        assert local.states([ref])[0].state in (JobState.FAILED, JobState.CANCELLED)
    finally:
        os.killpg(bystander.pid, 9)
        bystander.wait()


def test_rank_error_quotes_the_first_failed_rank_of_the_newest_attempt(tmp_path) -> None:
    job = JobSpec(job_dir=tmp_path, job_name="train")

    def error(path, message: str, mtime: float | None = None) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"message": {"message": message, "extraInfo": {"py_callstack": "..."}}}))
        if mtime is not None:
            os.utime(path, (mtime, mtime))

    assert rank_error(job) is None
    run = job.launch_dir / "torchrun" / "none_abc"
    t = time.time()
    error(run / "attempt_0" / "0" / "error.json", "RuntimeError: first attempt", t - 50)
    error(run / "attempt_1" / "3" / "error.json", "ValueError: Size mismatch\nfor layer 0", t - 9)
    error(run / "attempt_1" / "1" / "error.json", "KeyError: 'x'", t - 9)
    assert rank_error(job) == "rank 1: KeyError: 'x'"  # the restart that ended the job; a tie: its lowest rank
    # rank 2 raised; rank 0 failed after it, in the next collective: the cause is rank 2's, not the lowest rank's
    error(run / "attempt_1" / "2" / "error.json", "ValueError: loss is NaN at step 12", t - 10)
    error(run / "attempt_1" / "0" / "error.json", "RuntimeError: Connection closed by peer [127.0.0.1]:29500", t - 8)
    assert rank_error(job) == "rank 2: ValueError: loss is NaN at step 12"
    error(job.launch_dir / "error.rank2.json", "ValueError: Size mismatch\nmore")
    shutil.rmtree(job.launch_dir / "torchrun")
    assert rank_error(job) == "rank 2: ValueError: Size mismatch"  # first line only
    old = time.time() - 120  # a file server 2 minutes behind: mtimes say nothing of which launch wrote a file
    os.utime(job.launch_dir / "error.rank2.json", (old, old))
    before = error_stamps(job)  # what an earlier launch left, as the file server stamps it
    assert rank_error(job, before) is None  # files of an earlier launch are not this launch's
    error(job.launch_dir / "error.rank0.json", "OSError: disk full")  # this launch's, stamped in the past too
    os.utime(job.launch_dir / "error.rank0.json", (old, old))
    assert rank_error(job, before) == "rank 0: OSError: disk full"
