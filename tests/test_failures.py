"""The class of every attempt's end and the budget per class, as pure logic: the classifier over evidence
(automodel_hydra.failures.classify), the budget's decision (decide), the ledger read from records a job dir holds
(automodel_hydra.ledger) and the Slurm requeue hook's plan (automodel_hydra.retry.plan). The real runs are in
tests/test_failure_runs.py."""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import failures, ledger, outcome, retry
from automodel_hydra.failures import Error, Evidence, Failure, FailureBudget
from automodel_hydra.plan import JobSpec, write_run_id
from automodel_hydra.schema import ConfigError
from automodel_hydra.states import JobState


def _err(*types: str, line: str = "") -> Error:
    return Error((*types, "Exception", "BaseException", "object"), line or f"{types[0]}: x")


@pytest.mark.parametrize(("evidence", "kind"), [
    (Evidence(slurm_state="PREEMPTED"), failures.PREEMPTED),
    (Evidence(signal="SIGTERM", preempting=True), failures.PREEMPTED),
    (Evidence(slurm_state="TIMEOUT"), failures.TIME_LIMIT),
    (Evidence(slurm_state="DEADLINE"), failures.TIME_LIMIT),
    (Evidence(signal="SIGUSR2"), failures.TIME_LIMIT),
    (Evidence(slurm_state="NODE_FAIL", errors=(_err("RuntimeError", line="RuntimeError: Connection closed by peer"),)),
     failures.NODE_FAILURE),
    (Evidence(slurm_state="BOOT_FAIL"), failures.NODE_FAILURE),
    (Evidence(slurm_state="OUT_OF_MEMORY"), failures.OOM),
    (Evidence(errors=(_err("RuntimeError", line="RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB"),)),
     failures.OOM),
    (Evidence(errors=(_err("OutOfMemoryError", "RuntimeError"),), progressed=False), failures.OOM),
    (Evidence(errors=(_err("MemoryError"),)), failures.OOM),
    (Evidence(hang="rank 1 hung at step 5 on host n1"), failures.HANG),
    (Evidence(errors=(_err("DistBackendError", "RuntimeError"),)), failures.COMM),
    (Evidence(errors=(_err("RuntimeError", line="RuntimeError: [../gloo/transport/tcp/pair.cc:534] Connection "
                                                "closed by peer [127.0.0.1]:4242"),)), failures.COMM),
    (Evidence(errors=(_err("ValueError"),), progressed=False), failures.USER_ERROR),
    (Evidence(errors=(_err("RuntimeError"), _err("ModuleNotFoundError", "ImportError"))), failures.USER_ERROR),
    (Evidence(errors=(_err("ConfigValueError", "OmegaConfBaseException"),)), failures.USER_ERROR),
    (Evidence(errors=(_err("ValueError"),)), failures.CRASH),
    (Evidence(signal="SIGKILL"), failures.CRASH),
    (Evidence(exit_code=1), failures.CRASH),
    (Evidence(slurm_state="CANCELLED", signal="SIGTERM"), failures.CANCELLED),
    (Evidence(cancelled=True, errors=(_err("ValueError"),)), failures.CANCELLED),
    (Evidence(signal="SIGTERM"), failures.CANCELLED),
])
def test_the_classifier_names_each_class_from_its_evidence(evidence: Evidence, kind: str) -> None:
    found = failures.classify(evidence)
    assert found.kind == kind, (evidence, found)
    assert found.evidence and "\n" not in found.evidence


def test_real_torch_exceptions_are_classed() -> None:
    import torch
    import torch.distributed as dist

    assert failures.of_exception(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")).kind == "oom"
    assert failures.of_exception(dist.DistBackendError("NCCL error in: ...")).kind == "comm"
    wrapped = RuntimeError("step failed")
    wrapped.__cause__ = MemoryError()
    assert failures.of_exception(wrapped).line() == "oom: MemoryError"
    assert failures.of_exception(ValueError("bad batch at step 1"), progressed=False).line() == (
        "user_error: ValueError: bad batch at step 1 (before the first optimizer step)")


def test_the_default_budget_retries_what_a_restart_may_fix() -> None:
    budget = FailureBudget()
    oom, user = Failure("oom", "MemoryError"), Failure("user_error", "ValueError: x")
    assert failures.decide(oom, [], budget).why == "not retried: a restart repeats it (oom; failure_budget.oom=0)"
    assert not failures.decide(user, [], budget).retry
    crash = Failure("crash", "ValueError: x")
    assert failures.decide(crash, [], budget).retry
    assert not failures.decide(crash, ["crash"], budget).retry
    comm = Failure("comm", "DistBackendError: x")
    assert [failures.decide(comm, ["comm"] * n, budget).retry for n in range(5)] == [True, True, True, False, False]
    # preemptions and time limits before spend nothing of the crash budget; neither is bounded here
    assert failures.decide(crash, ["preempted", "time_limit", "preempted"], budget).retry
    assert failures.decide(Failure("preempted", "x"), ["preempted"] * 9, budget).retry
    assert not failures.decide(Failure("cancelled", "x"), [], budget).retry
    assert failures.decide(oom, [], FailureBudget(oom=1)).retry


def test_a_bad_budget_is_one_line_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"^failure_budget\.crash=-1 is invalid: a number of retries"):
        FailureBudget(crash=-1)
    from automodel_hydra import config
    from tests.helpers import compose_cfg

    with pytest.raises(ConfigError, match=r"failure_budget\.hang=-2"):
        config.load(compose_cfg(["failure_budget.hang=-2"]))


# ----------------------------------------------------------------------------------------------- the ledger


def _job(tmp_path: Path) -> JobSpec:
    job = JobSpec(tmp_path / "J", "train")
    write_run_id(job, "this")
    return job


def _at(path: Path, t: float) -> None:
    os.utime(path, (t, t))


def _end(job: JobSpec, rank: int, how: str, step: int, at: float, *, restart: int = 0, requeue: int = 0,
         resumed: int | None = None, failure: Failure | None = None, signals: tp.Sequence[str] = ()) -> None:
    path = outcome.record_end(job.launch_dir, rank=rank, world_size=2, how=how, step=step, restart=restart,
                              requeue=requeue, resumed=resumed, failure=failure, signals=signals,
                              error=failure.evidence if failure else None)
    _at(path, at)


def _start(job: JobSpec, at: float, restart: int = 0, requeue: int = 0) -> None:
    _at(ledger.record_start(job.launch_dir, restart, requeue), at)


def test_the_ledger_has_every_attempt_its_class_losses_and_the_goodput(tmp_path: Path) -> None:
    """Attempt 0 trains steps 1-10 in 100 s and is preempted (SIGTERM, then requeued); the requeued attempt resumes
    from checkpoint 8, trains to 12 in 40 s and crashes; its restart resumes from 12 and completes at step 20 in
    80 s. Lost: steps 9-10 (20 s) and nothing of the crash (checkpoint 12 kept all)."""
    job = _job(tmp_path)
    _start(job, 1000)
    for rank in (0, 1):
        _end(job, rank, outcome.STOPPED, 10, 1100, resumed=0, signals=["SIGTERM"])
    _start(job, 1200, requeue=1)
    _end(job, 1, outcome.RAISED, 12, 1240, requeue=1, resumed=8, failure=Failure("crash", "ValueError: bad batch"))
    _end(job, 0, outcome.RAISED, 12, 1241, requeue=1, resumed=8,
         failure=Failure("comm", "RuntimeError: Connection closed by peer"))
    _start(job, 1250, restart=1, requeue=1)
    for rank in (0, 1):
        _end(job, rank, outcome.RETURNED, 20, 1330, restart=1, requeue=1, resumed=12)
    rows = ledger.attempts(job.launch_dir)
    assert [(a.requeue, a.restart, a.kind) for a in rows] == [(0, 0, "preempted"), (1, 0, "crash"),
                                                              (1, 1, "completed")]
    assert rows[1].evidence == "rank 1: ValueError: bad batch"  # the first rank to fail, not its peer
    assert [a.steps_lost for a in rows] == [2, 0, 0]
    assert [a.seconds_lost for a in rows] == [20.0, 0.0, 0.0]
    assert ledger.goodput(rows) == round((100 - 20 + 41 + 80) / 330, 3)
    assert ledger.failed_before(job.launch_dir, (1, 1)) == ["preempted", "crash"]
    summary = ledger.summary(job.launch_dir)
    assert [a["class"] for a in summary["attempts"]] == ["preempted", "crash", "completed"]
    assert json.loads(json.dumps(summary)) == summary


def test_an_error_before_the_first_step_loses_the_whole_attempt_and_names_its_class_in_the_line(
        tmp_path: Path) -> None:
    job = _job(tmp_path)
    _start(job, 1000)
    _end(job, 0, outcome.RAISED, 0, 1030,
         failure=Failure("user_error", "ValueError: no (before the first optimizer step)"))
    _end(job, 1, outcome.RAISED, 0, 1031, failure=Failure("comm", "DistBackendError: peer gone"))
    (rows,) = ledger.attempts(job.launch_dir)
    assert (rows.kind, rows.steps_lost, rows.seconds_lost) == ("user_error", 0, 31.0)
    assert ledger.goodput([rows]) == 0.0
    verdict = outcome.derive(job, JobState.FAILED)
    assert verdict.why is not None and verdict.why.startswith("user_error: rank 0: ValueError: no")


def test_slurms_word_classes_the_last_attempt(tmp_path: Path) -> None:
    job = _job(tmp_path)
    _start(job, 1000)
    (row,) = ledger.attempts(job.launch_dir, slurm_state="NODE_FAIL")  # the ranks were killed: no record
    assert (row.kind, row.evidence) == ("node_failure", "Slurm state NODE_FAIL")
    _end(job, 0, outcome.STOPPED, 3, 1010, signals=["SIGTERM"])
    assert ledger.attempts(job.launch_dir, slurm_state="TIMEOUT")[0].kind == "time_limit"
    assert ledger.attempts(job.launch_dir, slurm_state="CANCELLED")[0].kind == "cancelled"


def test_an_earlier_run_slurm_says_ended_node_fail_is_a_node_failure(tmp_path: Path) -> None:
    """Run 0 trained to step 4 on node1 and died with its node (no end record; Slurm requeued the job itself); the
    requeued run's start record has sacct -D's word on run 0: the ledger classes it node_failure on node1, not a
    crash of ranks gone without a record, and a later failure's budget counts it."""
    job = _job(tmp_path)
    _start(job, 1000)
    path = ledger.record_start(job.launch_dir, 0, 1, environ={"SLURMD_NODENAME": "node2"})
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "slurm_runs": [["NODE_FAIL", "node1"], ["RUNNING", "node2"]]}))
    _at(path, 1100)
    _end(job, 0, outcome.RETURNED, 9, 1150, requeue=1)
    _end(job, 1, outcome.RETURNED, 9, 1150, requeue=1)
    first, second = ledger.attempts(job.launch_dir)
    assert (first.kind, first.evidence, first.node) == ("node_failure", "Slurm state NODE_FAIL", "node1"), first
    assert second.kind == "completed"
    assert ledger.failed_before(job.launch_dir, (2, 0)) == ["node_failure"]


def test_a_two_node_run_slurm_ended_node_fail_blames_the_node_that_went_down(tmp_path: Path) -> None:
    """Run 0 on node[1-2] died NODE_FAIL; the requeued run's rank 0 recorded which node Slurm's events say went
    down (node2): the ledger blames node2, not rank 0's node1; without that word it is a node_failure still."""
    job = _job(tmp_path)
    _start(job, 1000)
    path = ledger.record_start(job.launch_dir, 0, 1, environ={"SLURMD_NODENAME": "node1"})
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "slurm_runs": [["NODE_FAIL", "node[1-2]", "node2"],
                                                         ["RUNNING", "node[1-2]", ""]]}))
    _at(path, 1100)
    first = ledger.attempts(job.launch_dir)[0]
    assert (first.kind, first.node) == ("node_failure", "node2"), first
    unknown = [["NODE_FAIL", "node[1-2]", ""], ["RUNNING", "node[1-2]", ""]]
    path.write_text(json.dumps({**record, "slurm_runs": unknown}))
    assert ledger.attempts(job.launch_dir)[0].kind == "node_failure"


# ----------------------------------------------------------------------------------------------- the requeue hook


def _rows(*kinds: str) -> list[ledger.Attempt]:
    return [ledger.Attempt(requeue=i, restart=0, kind=k, evidence=f"{k} evidence") for i, k in enumerate(kinds)]


def test_the_requeue_hook_requeues_by_the_budget_and_leaves_slurms_classes_to_slurm() -> None:
    budget = FailureBudget()
    assert retry.plan(_rows("user_error"), budget, 0, 3, 1)[0] == retry.NOTHING
    assert retry.plan(_rows("oom"), budget, 0, 3, 1)[2] == failures.Decision(
        False, "not retried: a restart repeats it (oom; failure_budget.oom=0)")
    assert retry.plan(_rows("crash"), budget, 0, 3, 1)[0] == retry.REQUEUE
    assert retry.plan(_rows("preempted", "time_limit", "crash"), budget, 2, 3, 1)[0] == retry.REQUEUE
    assert retry.plan(_rows("crash", "crash"), budget, 1, 3, 1)[0] == retry.NOTHING
    action, _, decision = retry.plan(_rows("comm", "comm"), budget, 3, 3, 1)
    assert action == retry.NOTHING and decision is not None and "slurm.max_requeues=3 spent" in decision.why
    for kind in ("preempted", "time_limit", "cancelled", "completed"):
        assert retry.plan(_rows(kind), budget, 0, 3, 143)[0] == retry.NOTHING
    assert retry.plan([], budget, 0, 3, 0) == (retry.NOTHING, None, None)


def test_the_blamed_node_is_excluded_while_the_partition_keeps_enough_nodes() -> None:
    comm = ledger.Attempt(requeue=0, restart=0, kind="comm", evidence="x", node="n2")
    assert retry.exclusions([comm], partition_nodes=4, job_nodes=2) == ["n2"]
    assert retry.exclusions([comm], partition_nodes=2, job_nodes=2) == []  # the job would never start again
    assert retry.exclusions([comm], partition_nodes=None, job_nodes=1) == []
    earlier = ledger.Attempt(requeue=0, restart=0, kind="hang", evidence="x", node="n1", excluded=["n1"])
    again = ledger.Attempt(requeue=1, restart=0, kind="hang", evidence="x", node="n3")
    assert retry.exclusions([earlier, again], partition_nodes=4, job_nodes=1) == ["n1", "n3"]
    crash = ledger.Attempt(requeue=1, restart=0, kind="crash", evidence="x", node="n3")
    assert retry.exclusions([earlier, crash], partition_nodes=4, job_nodes=1) == ["n1"]  # a bug blames no node


def test_a_blamed_node_is_left_out_of_the_pending_tasks_that_can_spare_it() -> None:
    """Each pending array task keeps its own exclusions and gains the blamed node, one scontrol update per new
    list; a task that has it already, or that would keep too few of the partition's nodes, is left alone."""
    pending = {"1": [], "2": ["n3"], "3": [], "4": ["n2"], "5": ["n1", "n3"]}
    assert retry.pending_lists(pending, ["n2"], partition_nodes=4, job_nodes=1) == {
        ("n2",): ["1", "3"], ("n2", "n3"): ["2"], ("n1", "n2", "n3"): ["5"]}
    assert retry.pending_lists(pending, ["n2"], partition_nodes=3, job_nodes=1) == {("n2",): ["1", "3"],
                                                                                    ("n2", "n3"): ["2"]}
    assert retry.pending_lists(pending, ["n2"], partition_nodes=None, job_nodes=1) == {}
    assert retry.array_dirs([]) == {}
    assert retry.array_dirs(["--array", "0", "3", "--", "/s/0", "/s/3"]) == {"0": "/s/0", "3": "/s/3"}
    assert retry.array_dirs(["--array", "0", "--", "/s/0", "/s/3"]) is None


def test_a_node_another_member_excluded_is_this_jobs_too(tmp_path: Path) -> None:
    """A pending sweep member's record of a node another member left out of it: in status --json "excluded",
    in status's note, and kept when this member's own requeue sets its ExcNodeList; a record of an earlier
    launch of the dir is not this one's."""
    job = _job(tmp_path)
    ledger.record_inherited(job.launch_dir, ["n1"], by="53_0", failure=Failure("comm", "x"), node="n1")
    assert ledger.summary(job.launch_dir)["excluded"] == ["n1"]
    assert ledger.inherited_note(job.launch_dir) == "n1 excluded after 53_0's comm failure"
    hang = ledger.Attempt(requeue=0, restart=0, kind="hang", evidence="x", node="n2")
    assert retry.exclusions([hang], 4, 1, ledger.inherited_nodes(job.launch_dir)) == ["n1", "n2"]
    write_run_id(job, "next")
    assert ledger.summary(job.launch_dir)["excluded"] == [] and ledger.inherited_note(job.launch_dir) == ""


# ----------------------------------------------------------------------------------------------- the report


def test_the_report_shows_what_failures_cost_each_job_and_the_sweep(tmp_path: Path,
                                                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A 3-job Slurm sweep: job 0 failed a comm all-reduce at step 4 on n1 (60 s) and its requeue resumed from 2
    and completed at step 8 (60 s); job 1 ran once, clean (50 s); job 2 raised before its first step (20 s). The
    printed table lists jobs 0 and 2 only and says so; attempts.csv has all four attempts with the numbers of
    ``status --json`` (the ledger); failure_costs.csv has the sweep's summary. A single clean run is one line."""
    from automodel_hydra import report

    def job(num: int) -> JobSpec:
        spec = JobSpec(tmp_path / "S" / str(num), "train", job_num=num)
        write_run_id(spec, "this")
        (spec.job_dir / "metrics.jsonl").write_text("".join(json.dumps({"step": s, "loss": 2.0 / s}) + "\n"
                                                            for s in range(1, 5)))
        return spec

    first, clean, bad = job(0), job(1), job(2)
    _start(first, 1000)
    _end(first, 1, outcome.RAISED, 4, 1060, failure=Failure("comm", "DistBackendError: NCCL error"))
    _end(first, 0, outcome.RAISED, 4, 1060, failure=Failure("comm", "DistBackendError: peer gone"))
    _start(first, 1070, requeue=1)
    for rank in (0, 1):
        _end(first, rank, outcome.RETURNED, 8, 1130, requeue=1, resumed=2)
    ledger.record_decision(first.launch_dir, 0, 0, Failure("comm", "x"),
                           failures.Decision(True, "retried: comm 1 of failure_budget.comm=3"), by="slurm")
    _start(clean, 1000)
    for rank in (0, 1):
        _end(clean, rank, outcome.RETURNED, 4, 1050)
    _start(bad, 1000)
    _end(bad, 0, outcome.RAISED, 0, 1020, failure=Failure("user_error", "ValueError: no"))
    records = [{"job_dir": str(j.job_dir), "backend": "slurm", "job_num": j.job_num} for j in (first, clean, bad)]
    states = [JobState.COMPLETED, JobState.COMPLETED, JobState.FAILED]
    out = tmp_path / "S" / "report"
    assert report.report(tmp_path / "S", records, [0, 1, 2], {0: "a", 1: "b", 2: "c"}, [], states, out) == 0
    printed = capsys.readouterr().out
    assert "attempts of the jobs with more than one attempt or a failed one (2 of 3)" in printed
    assert "the other 1 job(s) ran once without a failure" in printed
    table = printed.split("attempts of the jobs")[1].split("what failures cost")[0]
    assert [line.split("│")[1].strip() for line in table.splitlines() if line.startswith("│")] == ["0", "0", "2"]
    with (out / "attempts.csv").open() as f:
        rows = list(csv.DictReader(f))
    assert [(r["job"], r["attempt"], r["class"], r["steps_lost"], r["seconds_lost"]) for r in rows] == [
        ("0", "attempt0", "comm", "2", "30.0"), ("0", "requeue1.attempt0", "completed", "0", "0.0"),
        ("1", "attempt0", "completed", "0", "0.0"), ("2", "attempt0", "user_error", "0", "20.0")]
    said = ledger.of_state(first.launch_dir, JobState.COMPLETED)["attempts"][0]  # what status --json gives
    assert rows[0]["node"] == said["node"] and float(rows[0]["seconds_lost"]) == said["seconds_lost"]
    assert rows[0]["decision"] == "retried: comm 1 of failure_budget.comm=3"
    assert rows[0]["start"] == "1970-01-01T00:16:40+00:00" and rows[0]["end"] == "1970-01-01T00:17:40+00:00"
    with (out / "failure_costs.csv").open() as f:
        (costs,) = list(csv.DictReader(f))
    # kept: job 0 (60 - 30) + 60 of 130 s, job 1 50 of 50 s, job 2 0 of 20 s
    assert costs == {"jobs": "3", "attempts": "4", "by_class": "completed 2, comm 1, user_error 1",
                     "failed_attempts": "2", "steps_lost": "2", "seconds_lost": "50.0",
                     "goodput": str(round((30 + 60 + 50) / (130 + 50 + 20), 3))}
    assert "what failures cost the sweep" in printed

    alone = tmp_path / "R"
    out = alone / "report"
    assert report.report(alone, records[1:2], [1], {1: "-"}, [], states[1:2], out) == 0
    assert "attempts: each of the 1 job(s) ran once without a failure" in capsys.readouterr().out
    assert (out / "attempts.csv").is_file() and not (out / "failure_costs.csv").exists()


def test_a_node_slurm_requeued_the_job_off_is_left_out_at_the_next_requeue() -> None:
    """Slurm requeued the job itself after n2 failed (no decision of ours); the next attempt crashes and the hook
    requeues it: n2 goes into ExcNodeList with it (Slurm avoids n2 only while it is down), while the partition
    keeps enough nodes; a node_failure the hook decided on itself is already in its own excluded list."""
    died = ledger.Attempt(requeue=0, restart=0, kind="node_failure", evidence="Slurm state NODE_FAIL", node="n2")
    crash = ledger.Attempt(requeue=1, restart=0, kind="crash", evidence="x", node="n1")
    assert retry.slurm_failed([died, crash]) == ["n2"]
    assert retry.exclusions([died, crash], partition_nodes=4, job_nodes=1) == ["n2"]
    assert retry.exclusions([died, crash], partition_nodes=2, job_nodes=2) == []
    both = ledger.Attempt(requeue=0, restart=0, kind="node_failure", evidence="x", node="n2,n3")
    assert retry.exclusions([both, crash], partition_nodes=4, job_nodes=1) == ["n2", "n3"]
    decided = dataclasses.replace(died, decision="retried: node_failure 1 of failure_budget.node_failure=3")
    assert retry.slurm_failed([decided, crash]) == []


# ----------------------------------------------------------------------------------------------- who ended first

ECHO = "RuntimeError: [../gloo/transport/tcp/pair.cc:553] Connection closed by peer [127.0.0.1]:4242"


def _ends(*ends: failures.RankEnd) -> Failure:
    return failures.classify(Evidence(ends=ends))


def test_the_rank_that_ended_first_classes_the_attempt_and_an_echo_never_does() -> None:
    """A peer's "Connection closed by peer" is only the echo of another rank's end, whatever the records' times
    say (a coarse clock, a record written late): the rank that returned, raised or was killed is the cause."""
    End, echo = failures.RankEnd, Failure("comm", ECHO)
    returned = End(1, "returned", 10.0, 3, node="n2")
    # rank 1 returned while rank 0 trained: the recipe's doing, which a restart repeats, before or after the echo
    for at in (9.0, 10.0, 11.0):
        found = _ends(End(0, "raised", at, 3, echo, "n1"), returned)
        assert found == Failure("user_error", "rank 1 returned at step 3 while the others trained"), (at, found)
    assert failures.first_end([End(0, "raised", 9.0, 3, echo, "n1"), returned]) == returned
    # a rank that raised first, the echo within the same clock tick: the raise
    bad = End(1, "raised", 10.0, 2, Failure("crash", "ValueError: bad batch"), "n2")
    assert _ends(End(0, "raised", 10.0, 2, echo, "n1"), bad) == Failure("crash", "rank 1: ValueError: bad batch")
    # a rank killed without a record (the OOM killer, SIGKILL), its peer's echo: the killed rank, a crash
    assert _ends(End(0, "raised", 10.0, 2, echo, "n1"), End(1, "gone")) == Failure(
        "crash", "rank 1 ended without a record (killed by a signal, or its process crashed)")
    # ... but a rank that raised something else comes before a rank gone without a record (the agent kills the rest)
    assert failures.first_end([bad, End(0, "gone")]) == bad
    # every rank saw a peer go: the transport failed under all of them, the first one's node is blamed
    first = End(1, "raised", 9.0, 2, Failure("comm", "RuntimeError: Connection reset by peer"), "n2")
    assert failures.first_end([End(0, "raised", 10.0, 2, echo, "n1"), first]) == first
    assert _ends(End(0, "raised", 10.0, 2, echo, "n1"), first).kind == "comm"
    # a collective that failed by itself (not a peer gone) is comm, and what came after it does not matter
    nccl = End(1, "raised", 9.0, 2, Failure("comm", "DistBackendError: NCCL error: unhandled system error"), "n2")
    assert failures.first_end([nccl, End(0, "stopped", 11.0, 2)]) == nccl
    # a hang after a rank's return is that return's echo; a hang first is the hang
    hung = End(0, "hung", 12.0, 3, Failure("hang", "rank 0 hung at step 4 on host n1"), "n1")
    assert _ends(hung, returned).kind == "user_error"
    assert _ends(End(1, "hung", 9.0, 3, Failure("hang", "rank 1 hung at step 4"), "n2"),
                 End(0, "raised", 11.0, 3, echo, "n1")) == Failure("hang", "rank 1 hung at step 4")
    # every rank returned: nothing failed
    assert failures.first_end([End(0, "returned", 1.0, 5), End(1, "returned", 2.0, 5)]) is None
    # from records: the hung rank hung, whatever its own end record says of how it was ended after the hang
    ranks = ledger.rank_ends([{"rank": 1, "how": "stopped", "step": 4, "world_size": 2, "mtime": 13.0},
                              {"rank": 0, "how": "raised", "step": 4, "world_size": 2, "mtime": 12.5,
                               "class": "comm", "evidence": ECHO}],
                             [{"rank": 1, "step": 4, "host": "n2", "timeout_s": 8, "mtime": 12.0,
                               "timeout_key": "rank_heartbeat_timeout", "stack": "s.txt"}])
    assert sorted((e.rank, e.how) for e in ranks) == [(0, "raised"), (1, "hung")]
    assert _ends(*ranks).line().startswith("hang: rank 1 hung at step 4 on host n2 (no heartbeat within")


def _end_on(job: JobSpec, node: str, rank: int, how: str, step: int, at: float, monkeypatch: pytest.MonkeyPatch,
            failure: Failure | None = None, requeue: int = 0) -> None:
    monkeypatch.setenv("SLURMD_NODENAME", node)
    _end(job, rank, how, step, at, failure=failure, requeue=requeue)


def test_a_rank_that_returned_early_is_a_user_error_not_retried_and_no_node_is_blamed(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 (node2) returned at step 3 while rank 0 (node1) was in step 4's all-reduce, and rank 0's "Connection
    closed by peer" record is older (the returning rank's record was written after its process group was gone):
    the ledger, the line and the requeue hook say rank 1's return, class user_error, run once, nothing
    excluded."""
    job = _job(tmp_path)
    _start(job, 1000)
    _end_on(job, "node1", 0, outcome.RAISED, 3, 1030.0, monkeypatch, Failure("comm", ECHO))
    _end_on(job, "node2", 1, outcome.RETURNED, 3, 1030.5, monkeypatch)
    (row,) = ledger.attempts(job.launch_dir)
    assert (row.kind, row.evidence, row.node) == (
        "user_error", "rank 1 returned at step 3 while the others trained", "node2"), row
    action, failure, decision = retry.plan([row], FailureBudget(), 0, 3, 1)
    assert action == retry.NOTHING and decision == failures.Decision(
        False, "not retried: a restart repeats it (user_error; failure_budget.user_error=0)"), failure
    assert retry.exclusions([row], partition_nodes=4, job_nodes=1) == []
    verdict = outcome.derive(job, JobState.FAILED)
    assert verdict.why is not None and verdict.why.startswith(
        "user_error: rank 1 returned at step 3 while the others trained; then rank 0: RuntimeError: "), verdict
    # under ft_launcher rank 0 decides as it raises: the attempt's class so far, not its own echo
    assert ledger.ending(job.launch_dir) == failures.Failure(
        "user_error", "rank 1 returned at step 3 while the others trained")


def test_the_echo_of_a_killed_rank_blames_no_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 1 on node2 was killed (no record); rank 0 on node1 saw "Connection closed by peer": a crash of rank 1,
    not a comm failure of node1, so the requeue leaves node1 in. Where rank 1 raised first within the same clock
    tick, its class; where rank 0's echo is the only end so far (its peer has not ended yet), comm."""
    job = _job(tmp_path)
    _start(job, 1000)
    _end_on(job, "node1", 0, outcome.RAISED, 3, 1030.0, monkeypatch, Failure("comm", ECHO))
    (row,) = ledger.attempts(job.launch_dir)
    assert (row.kind, row.evidence) == (
        "crash", "rank 1 ended without a record (killed by a signal, or its process crashed)"), row
    action, _, _ = retry.plan([row], FailureBudget(), 0, 3, 1)
    assert action == retry.REQUEUE and retry.exclusions([row], partition_nodes=4, job_nodes=1) == []
    assert ledger.ending(job.launch_dir) == failures.Failure("comm", f"rank 0: {ECHO}")  # rank 1 still ending
    # a ValueError and the echo in one tick of the file server's clock: the ValueError
    _end_on(job, "node2", 0, outcome.RAISED, 3, 1100.0, monkeypatch, Failure("comm", ECHO), requeue=1)
    _end_on(job, "node1", 1, outcome.RAISED, 3, 1100.0, monkeypatch, Failure("crash", "ValueError: bad batch"),
            requeue=1)
    last = ledger.attempts(job.launch_dir)[-1]
    assert (last.kind, last.evidence, last.node) == ("crash", "rank 1: ValueError: bad batch", "node1"), last
