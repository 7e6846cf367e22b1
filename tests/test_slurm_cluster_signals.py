"""What a Slurm job does when Slurm stops it, on the project's real Slurm 22.05 cluster, and the rule behind it.

The rule (``automodel_hydra.worker.after_stop``, docs/slurm.md "Signals") is unit-tested first. The cluster tests
submit their own scripts, built with ``render_sbatch``, whose tasks run the product's worker command
(``python -u -m automodel_hydra.worker launch/job.yaml``) on a config composed from the project's ``conf/``: they
prove the rank side, whatever backend submits the job. Partitions ``low``/``lowcancel``/``lowgrace``/``high`` of
the test cluster are described in docs/slurm-test-cluster.md.

Every worker job pays torch's and the recipe's start-up on each rank (20-45 s on the 2-core test machine under
load), so the timeouts below are generous; the training itself is a few seconds.
"""

from __future__ import annotations

import functools
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest
import yaml

from automodel_hydra import config
from automodel_hydra.backends.slurm_script import (
    SRUN_EXPORT_ARGS,
    parse_job_id,
    pattern_literal,
    render_sbatch,
    sbatch_export_args,
)
from automodel_hydra.backends.slurm_states import query
from automodel_hydra.plan import JobSpec, worker_argv
from automodel_hydra.states import JobState, StateInfo
from automodel_hydra.worker import EXIT, REQUEUE, WAIT, StopFlag, after_stop, preempt_time
from tests.helpers import ROOT, compose_cfg, metrics, wait_for

FREE_PORT = 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])'
#: A job requeued by anyone restarts ~6-7 s later here (cred_expire=5, sched_interval=1); wait longer than that
#: before believing that a job stays ended.
REQUEUE_WINDOW_S = 10.0
START_TIMEOUT_S = 240.0  # submission -> first steps, under load


# ----------------------------------------------------------------------------------------------- the rule (unit)


@pytest.mark.parametrize("usr2, term, preempted, left, action", [
    (True, False, False, True, REQUEUE),  # the time-limit warning
    (True, False, False, False, EXIT),  # ... with slurm.max_requeues used up
    (False, True, False, True, EXIT),  # scancel, a preemption without grace, the time limit itself
    (True, True, False, True, EXIT),  # the warning, then scancel: the user's stop wins
    (True, False, True, True, WAIT),  # the job's signal sent at preemption (preempt_send_user_signal)
    (True, True, True, True, EXIT),  # ... and the grace time is over
    (False, False, False, True, EXIT),
])
def test_after_stop(usr2: bool, term: bool, preempted: bool, left: bool, action: str) -> None:
    assert after_stop(usr2=usr2, term=term, preempted=preempted, requeues_left=left)[0] == action


@pytest.mark.parametrize("text, value", [
    ("JobId=6 JobState=RUNNING PreemptEligibleTime=2026-11-30T16:47:57 PreemptTime=2026-11-30T16:48:01 Req",
     "2026-11-30T16:48:01"),
    ("JobId=2 JobState=RUNNING PreemptEligibleTime=2026-11-30T16:47:26 PreemptTime=None Dependency=(null)", None),
    ("JobId=2 JobState=RUNNING", None),
])
def test_preempt_time(text: str, value: str | None) -> None:
    assert preempt_time(text) == value


def test_stop_flag_records_each_signal_once_in_order() -> None:
    flag = StopFlag()
    assert not flag() and flag.signum is None and not flag.terminated
    for s in (signal.SIGUSR2, signal.SIGTERM, signal.SIGUSR2):
        flag._handle(s, None)
    assert flag() and flag.signals == [signal.SIGUSR2, signal.SIGTERM] and flag.terminated


@pytest.mark.slow
def test_worker_module_imports_nothing_heavy_before_its_handlers() -> None:
    """``python -m automodel_hydra.worker`` installs its handlers first thing in main(): that only helps if
    importing the module itself does not take torch's 5-15 s."""
    code = ("import sys, automodel_hydra.worker; "
            "print(sorted({'torch', 'omegaconf', 'transformers'} & set(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    assert out.strip() == "[]"


# ----------------------------------------------------------------------------------------------- helpers


def job_dir(tmp_path: Path, name: str, max_steps: int = 100_000) -> Path:
    """A run dir with ``launch/job.yaml`` as the driver writes it (validated, resolved): every step logged, no
    checkpoint but the ones signals ask for."""
    run = tmp_path / name
    cfg = compose_cfg(["launcher=slurm", "slurm.gpus_per_node=0", "step_scheduler.log_interval=1",
                       f"step_scheduler.max_steps={max_steps}", "step_scheduler.checkpoint_interval=100000"],
                      output_dir=run)
    (run / "launch").mkdir(parents=True)
    set_job(run, config.rank_spec(config.load(cfg)))
    return run


def set_job(run: Path, job: dict[str, tp.Any]) -> None:
    (run / "launch" / "job.yaml").write_text(yaml.safe_dump(job, sort_keys=False))


def shorten(run: Path, max_steps: int) -> None:
    """Let the next start of the job end at ``max_steps`` (every start re-reads ``launch/job.yaml``)."""
    job = yaml.safe_load((run / "launch" / "job.yaml").read_text())
    job["step_scheduler"]["max_steps"] = max_steps
    set_job(run, job)


def worker_script(run: Path, *, ntasks: int = 2, time_min: int = 10, max_requeues: int = 0,
                  directives: tp.Sequence[tuple[str, object]] = (), setup: tp.Sequence[str] = (),
                  srun_args: tp.Sequence[str] = SRUN_EXPORT_ARGS) -> Path:
    """An sbatch script whose ``ntasks`` tasks (one node) run the worker on ``run``; log ``run/slurm-<id>.out``."""
    text = render_sbatch(
        directives=[("job-name", run.name), ("nodes", 1), ("ntasks-per-node", ntasks), ("time", time_min),
                    ("output", f"{pattern_literal(run)}/slurm-%j.out"), ("open-mode", "append"), *directives],
        setup=[f"export PYTHONPATH={shlex.quote(str(ROOT))}", "export OMP_NUM_THREADS=1",
               f"export AUTOMODEL_MAX_REQUEUES={max_requeues}",
               'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
               f"export MASTER_PORT=$({shlex.quote(sys.executable)} -c {shlex.quote(FREE_PORT)})",
               'echo "test: start ${SLURM_RESTART_COUNT:-0} port ${MASTER_PORT}"', *setup],
        srun_args=["--kill-on-bad-exit=1", *srun_args],
        command=shlex.join(worker_argv(JobSpec(run, "train"), python=sys.executable)),
    )
    script = run / "launch" / "sbatch.sh"
    script.write_text(text)
    return script


def sbatch(cluster: tp.Any, script: Path, *args: str, env: tp.Mapping[str, str] | None = None) -> str:
    """Submit ``script`` with ``sbatch --parsable ARGS`` in ``os.environ`` + ``env``; the job id."""
    proc = subprocess.run(["sbatch", "--parsable", *args, str(script)], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "SLURM_CONF": str(cluster.conf), **(env or {})}, check=False)
    assert proc.returncode == 0, proc.stderr
    job = parse_job_id(proc.stdout)
    cluster.submitted.append(job)
    return job


def output(run: Path, job: str) -> str:
    path = run / f"slurm-{job}.out"
    return path.read_text(errors="replace") if path.exists() else ""


def training(run: Path, steps: int = 3) -> bool:
    """Whether rank 0 has logged ``steps`` steps."""
    return logged_steps(run) >= steps


def logged_steps(run: Path) -> int:
    path = run / "metrics.jsonl"
    return path.read_text().count("\n") if path.exists() else 0


def checkpointed_step(text: str) -> int:
    """The step the ranks checkpointed on the signal (the recipe's "stop requested" line)."""
    m = re.findall(r"stop requested: checkpointed step (\d+)", text)
    assert m, f"no checkpoint on a signal in:\n{text[-3000:]}"
    return int(m[-1])


def attempts(cluster: tp.Any, job: str) -> list[str]:
    """Every attempt's state in accounting (``sacct -D``: a requeued job has one row per run)."""
    out = cluster.run("sacct", "-n", "-X", "-P", "-D", "-j", job, "-o", "JobID,State").stdout
    return [line.split("|")[1] for line in out.splitlines() if line.split("|")[0] == job]


def state(job: str) -> StateInfo:
    return query([job])[job]


def wait_final(cluster: tp.Any, job: str, timeout: float = 120.0) -> JobState:
    """The state once the job left the queue and accounting agrees with squeue."""
    cluster.wait_gone(job, timeout=timeout)
    wait_for(lambda: cluster.sacct_state(job) in cluster_terminal(), 30, f"job {job} to be final in accounting",
             poll=0.2)
    return state(job).state


def cluster_terminal() -> frozenset[str]:
    from tests.slurm_cluster import TERMINAL_STATES

    return TERMINAL_STATES


@pytest.fixture
def cluster(slurm_cluster: tp.Any) -> tp.Iterator[tp.Any]:
    """The cluster; the jobs a test submitted that are still queued after it (a failed test) are cancelled, so
    that none runs into the next test."""
    first = len(slurm_cluster.submitted)
    yield slurm_cluster
    slurm_cluster.cancel_left(slurm_cluster.submitted[first:])


# ----------------------------------------------------------------------------------------------- on the cluster


@pytest.mark.slurm
@pytest.mark.slow
def test_scancel_checkpoints_and_the_job_stays_cancelled(cluster: tp.Any, tmp_path: Path) -> None:
    """A plain ``scancel`` means stop: both ranks checkpoint one step on SIGTERM, the job ends CANCELLED and no
    one requeues it, though it is requeueable and has requeues left."""
    run = job_dir(tmp_path, "cancel")
    job = sbatch(cluster, worker_script(run, max_requeues=3, directives=[("requeue", True)]))
    wait_for(functools.partial(training, run), START_TIMEOUT_S, "training", poll=0.2, output=lambda: output(run, job))

    cluster.run("scancel", job)
    assert wait_final(cluster, job) is JobState.CANCELLED
    time.sleep(REQUEUE_WINDOW_S)
    assert state(job) == StateInfo(JobState.CANCELLED), "the cancelled job came back"
    assert attempts(cluster, job) == ["CANCELLED by 0"]
    assert cluster.job_info(job)["Restarts"] == "0"
    text = output(run, job)
    step = checkpointed_step(text)
    assert (run / "checkpoints" / f"step-{step}" / ".metadata").exists()
    assert text.count("caught SIGTERM") >= 2 and len(re.findall(r"not requeued: SIGTERM", text)) == 2, text[-3000:]
    assert "requeuing Slurm job" not in text


@pytest.mark.slurm
@pytest.mark.slow
def test_time_limit_warning_requeues_and_the_job_resumes(cluster: tp.Any, tmp_path: Path) -> None:
    """``--signal=USR2@110`` on a 2-minute job: the warning comes 10-40 s in (slurmctld checks limits every 30 s,
    maybe while the ranks still import torch), both ranks checkpoint one step, rank 0 requeues the job, and the
    requeued job resumes from that step and completes. The test shortens the resumed run (max_steps, TimeLimit)
    so that it ends in seconds."""
    run = job_dir(tmp_path, "timeout")
    job = sbatch(cluster, worker_script(run, time_min=2, max_requeues=1,
                                              directives=[("signal", "USR2@110"), ("requeue", True)]))
    wait_for(lambda: cluster.job_info(job).get("Restarts") == "1", 150, "the job to requeue itself", poll=0.2,
             output=lambda: output(run, job))
    step = checkpointed_step(output(run, job))
    shorten(run, step + 5)
    cluster.run("scontrol", "update", f"JobId={job}", "TimeLimit=10")

    assert wait_final(cluster, job, timeout=START_TIMEOUT_S) is JobState.COMPLETED, output(run, job)[-3000:]
    text = output(run, job)
    assert "caught SIGUSR2" in text and "requeuing Slurm job" in text
    assert f"restored step {step} from" in text
    assert [r["step"] for r in metrics(run)] == list(range(1, step + 6)), "a step was lost or run twice"
    assert (run / "result.json").exists()
    assert attempts(cluster, job) == ["REQUEUED", "COMPLETED"]
    from automodel_hydra import ledger

    assert [a.kind for a in ledger.attempts(run / "launch")] == ["time_limit", "completed"]


@pytest.mark.slurm
@pytest.mark.slow
def test_preemption_follows_the_partitions_preempt_mode(cluster: tp.Any, tmp_path: Path) -> None:
    """One job in each preemptable partition, all preempted by one job in ``high``:

    * ``low`` (PreemptMode=REQUEUE): SIGTERM, checkpoint, the worker does not requeue; Slurm does, once, and the
      job resumes from the checkpoint and completes.
    * ``lowcancel`` (PreemptMode=CANCEL): SIGTERM, checkpoint, PREEMPTED, and it stays so.
    * ``lowgrace`` (CANCEL, GraceTime, preempt_send_user_signal): the job's own USR2 comes at preemption, the
      ranks checkpoint and wait (PreemptTime is set: not a time-limit warning), SIGTERM ends them at the end of the
      grace time: PREEMPTED, not requeued by the worker and not FAILED.
    """
    runs = {p: job_dir(tmp_path, p) for p in ("low", "lowcancel", "lowgrace")}
    # only lowgrace has a --signal (its time limit is 9 minutes away): the others see SIGTERM alone
    jobs = {p: sbatch(cluster, worker_script(run, ntasks=1, max_requeues=3, directives=[
        ("partition", p), ("requeue", True), *([("signal", "USR2@60")] if p == "lowgrace" else [])]))
            for p, run in runs.items()}
    for p, run in runs.items():
        wait_for(functools.partial(training, run), START_TIMEOUT_S, f"training in {p}", poll=0.2,
                 output=functools.partial(output, run, jobs[p]))

    cluster.sbatch("--partition=high", "--nodes=2", "--exclusive", "--output=/dev/null", "--wrap=sleep 1")
    assert wait_final(cluster, jobs["lowcancel"]) is JobState.PREEMPTED
    assert wait_final(cluster, jobs["lowgrace"]) is JobState.PREEMPTED
    wait_for(lambda: cluster.job_info(jobs["low"]).get("Restarts") == "1", 60, "low to be requeued", poll=0.2)
    step = checkpointed_step(output(runs["low"], jobs["low"]))
    shorten(runs["low"], step + 5)
    assert wait_final(cluster, jobs["low"], timeout=START_TIMEOUT_S) is JobState.COMPLETED

    time.sleep(REQUEUE_WINDOW_S)
    for p in ("lowcancel", "lowgrace"):
        text = output(runs[p], jobs[p])
        assert state(jobs[p]) == StateInfo(JobState.PREEMPTED) and attempts(cluster, jobs[p]) == ["PREEMPTED"]
        assert (runs[p] / "checkpoints" / f"step-{checkpointed_step(text)}" / ".metadata").exists()
        assert "requeuing Slurm job" not in text
    assert "not requeued: SIGTERM" in output(runs["lowcancel"], jobs["lowcancel"])
    assert "SIGUSR2 came with a preemption" in output(runs["lowgrace"], jobs["lowgrace"])
    low = output(runs["low"], jobs["low"])
    assert "not requeued: SIGTERM" in low and "requeuing Slurm job" not in low and f"restored step {step}" in low
    assert attempts(cluster, jobs["low"]) == ["PREEMPTED", "COMPLETED"]
    assert [r["step"] for r in metrics(runs["low"])] == list(range(1, step + 6))
    # the ledger classes each attempt from what the ranks recorded, and a preemption spends no failure budget: a
    # crash after two of them is still retried (failure_budget.crash=1)
    from automodel_hydra import failures, ledger

    rows = {p: [a.kind for a in ledger.attempts(run / "launch")] for p, run in runs.items()}
    assert rows == {"low": ["preempted", "completed"], "lowcancel": ["preempted"], "lowgrace": ["preempted"]}, rows
    before = [*ledger.failed_before(runs["low"] / "launch", (2, 0)), "preempted"]
    assert before == ["preempted", "preempted"]
    assert failures.decide(failures.Failure("crash", "ValueError: x"), before, failures.FailureBudget()).retry


@pytest.mark.slurm
@pytest.mark.slow
def test_node_failure_is_final_unless_the_job_is_requeueable(cluster: tp.Any) -> None:
    """``scontrol update nodename=node2 state=down`` under two running jobs: the ``--no-requeue`` one ends
    NODE_FAIL and stays so; the ``--requeue`` one Slurm requeues, and the state reader says so (PENDING/RUNNING,
    not the NODE_FAIL that accounting shows for the ended run)."""
    final = cluster.sbatch("-w", "node2", "--no-requeue", "--output=/dev/null", "--wrap=sleep 300")
    again = cluster.sbatch("-w", "node2", "--requeue", "--output=/dev/null", "--wrap=sleep 300")
    try:
        wait_for(lambda: {state(final).state, state(again).state} == {JobState.RUNNING}, 60, "both jobs to run",
                 poll=0.2)
        cluster.run("scontrol", "update", "nodename=node2", "state=down", "reason=node-fail-test")
        assert wait_final(cluster, final, timeout=60) is JobState.NODE_FAIL
        wait_for(lambda: cluster.job_info(again).get("Restarts") == "1", 30, "the requeueable job to be back",
                 poll=0.2)
        time.sleep(REQUEUE_WINDOW_S)
        assert state(final) == StateInfo(JobState.NODE_FAIL) and attempts(cluster, final) == ["NODE_FAIL"]
        assert state(again).state in (JobState.PENDING, JobState.RUNNING)
        assert attempts(cluster, again)[0] == "NODE_FAIL"
    finally:
        cluster.run("scancel", again, final, check=False)
        cluster.run("scontrol", "update", "nodename=node2", "state=resume", check=False)
        wait_for(lambda: "node2 idle" in cluster.run("sinfo", "-h", "-N", "-p", "debug", "-o", "%N %t").stdout, 60,
                 "node2 back", poll=0.2)


EXPORT_PROBE = 'echo "{label}: FROM_SCRIPT=${{FROM_SCRIPT-unset}} REF=${{SEEN_REF-unset}}"'


@pytest.mark.slurm
@pytest.mark.slow
def test_export_none_at_the_site_keeps_the_job_working(cluster: tp.Any, tmp_path: Path) -> None:
    """``SBATCH_EXPORT=NONE`` in the submitting shell: sbatch sets ``SLURM_EXPORT_ENV=NONE`` for srun, so a plain
    srun task gets none of the script's exports (the control); ``srun --export=ALL`` (SRUN_EXPORT_ARGS) passes
    them, and ``sbatch_export_args`` brings the one submitting-shell variable the script refers to. The real
    worker job then runs on the script's MASTER_PORT and PYTHONPATH and completes."""
    site = {"SBATCH_EXPORT": "NONE", "AUTOMODEL_TEST_REF": "ref-value"}
    extra = sbatch_export_args(site, ["AUTOMODEL_TEST_REF"])
    assert extra == ["--export=AUTOMODEL_TEST_REF"]
    probe = tmp_path / "probe.sh"
    probe.write_text(render_sbatch(
        directives=[("output", f"{pattern_literal(tmp_path)}/probe-%j.out"), ("ntasks", 1)],
        setup=["export FROM_SCRIPT=yes", 'export SEEN_REF="${AUTOMODEL_TEST_REF-unset}"',
               "/bin/sh -c " + shlex.quote(EXPORT_PROBE.format(label="batch")),
               "srun /bin/sh -c " + shlex.quote(EXPORT_PROBE.format(label="plain srun"))],
        srun_args=list(SRUN_EXPORT_ARGS), command="/bin/sh -c " + shlex.quote(EXPORT_PROBE.format(label="fixed srun"))))
    probe_job = sbatch(cluster, probe, *extra, env=site)
    cluster.wait_gone(probe_job, timeout=60)
    lines = (tmp_path / f"probe-{probe_job}.out").read_text()
    assert "batch: FROM_SCRIPT=yes REF=ref-value" in lines, lines
    assert "plain srun: FROM_SCRIPT=unset REF=unset" in lines, lines  # what the site setting does without the fix
    assert "fixed srun: FROM_SCRIPT=yes REF=ref-value" in lines, lines

    run = job_dir(tmp_path, "export", max_steps=5)
    job = sbatch(cluster, worker_script(run), *extra, env=site)
    assert wait_final(cluster, job, timeout=START_TIMEOUT_S) is JobState.COMPLETED, output(run, job)[-3000:]
    text = output(run, job)
    port = re.search(r"test: start 0 port (\d+)", text).group(1)  # type: ignore[union-attr]
    assert re.search(rf"DistEnv\[slurm\] rank 0\(2\) .* master node1:{port}\b", text), text[-3000:]
    assert [r["world_size"] for r in metrics(run)] == [2] * 5 and (run / "result.json").exists()


@pytest.mark.slurm
@pytest.mark.slow
def test_states_of_a_20_task_array_come_from_one_sacct_call(cluster: tp.Any, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ``query`` of 21 ids (20 tasks and the whole array) makes exactly one sacct call, and one squeue call
    only while some task is not final; pending tasks carry Slurm's reason; all end COMPLETED."""
    calls = tmp_path / "calls"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("sacct", "squeue"):
        real = shutil.which(tool)
        assert real is not None
        (bin_dir / tool).write_text(f'#!/bin/sh\necho {tool} >> {shlex.quote(str(calls))}\nexec {real} "$@"\n')
        (bin_dir / tool).chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")

    array = cluster.sbatch("--array=0-19%4", "--output=/dev/null", "--wrap=sleep 1")
    ids = [f"{array}_{i}" for i in range(20)] + [array]
    seen: set[tuple[JobState, str]] = set()
    queries = 0
    while True:
        calls.unlink(missing_ok=True)
        states = query(ids)
        queries += 1
        made = calls.read_text().split() if calls.exists() else []
        live = any(not s.state.final for s in states.values())
        assert made.count("sacct") == 1 and made.count("squeue") <= 1, made
        seen |= {(s.state, s.reason) for s in states.values()}
        if not live and made == ["sacct"]:  # accounting alone told every state
            break
        assert queries < 300, f"array {array} never completed: {states}"
        time.sleep(0.3)
    assert all(s == StateInfo(JobState.COMPLETED) for s in states.values())
    assert (JobState.PENDING, "JobArrayTaskLimit") in seen, seen


@pytest.mark.slurm
@pytest.mark.slow
def test_sbatch_reads_quoted_values_whole(cluster: tp.Any, tmp_path: Path, weird_path: Path) -> None:
    """The real sbatch parses what render_sbatch writes: a weird work dir (spaces, quotes, ``;``, ``$( )``,
    backticks, a backslash; sbatch cannot take its newline), a comment with ``#`` and quotes, and an output
    pattern in a weird dir whose ``%j`` Slurm expands; ``--parsable`` output is read by parse_job_id."""
    work = weird_path.with_name(weird_path.name.replace("\n", " "))
    work.mkdir()
    logs = tmp_path / "we ird 'q' \"dq\" ; $(touch MARK4) #x"  # no backslash: filename patterns cannot take one
    logs.mkdir()
    comment = 'a "q" \\ b # c \'s\' %j'
    script = tmp_path / "quoted.sh"
    script.write_text(render_sbatch(
        directives=[("job-name", "quoted; $(touch MARK5)"), ("chdir", str(work)), ("comment", comment),
                    ("output", f"{pattern_literal(logs)}/%j.out")],
        setup=[], srun_args=["--ntasks=1"], command="pwd"))
    job = sbatch(cluster, script)
    cluster.wait_gone(job, timeout=60)
    info = cluster.run("scontrol", "show", "job", job).stdout
    assert f"Comment={comment}" in info and "JobName=quoted; $(touch MARK5)" in info, info
    assert (logs / f"{job}.out").read_text().strip() == str(work)
    assert not list(tmp_path.rglob("MARK*")), "a value was run as code"
