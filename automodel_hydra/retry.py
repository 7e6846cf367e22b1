"""The Slurm requeue hook: after the job step ends, is the failed attempt requeued?

The batch script runs ``python -m automodel_hydra.retry "$AUTOMODEL_JOB_DIR" "$status"`` after ``srun`` (bare
metal; not in a container job, whose image the batch step does not enter). It reads the job's ledger
(:mod:`automodel_hydra.ledger`: in-job restarts and requeues alike), and for an attempt that failed in a class with
a budget of its own (:data:`automodel_hydra.failures.BUDGETED`) asks :func:`automodel_hydra.failures.decide` with
``failure_budget`` from ``launch/job.yaml``; while ``SLURM_RESTART_COUNT < AUTOMODEL_MAX_REQUEUES``
(``slurm.max_requeues``) a retry is ``scontrol requeue`` of this job (scontrol(1): a running batch job can requeue
itself; it restarts with ``SLURM_RESTART_COUNT`` + 1 and resumes from its newest checkpoint). It says what it
decided in one line on stderr (the job's Slurm log) and records it (``launch/ranks/decision.<attempt>.json``).

Preempted, time_limit and cancelled attempts are never requeued here: Slurm's PreemptMode, the worker's own
requeue on the time-limit warning and the user's cancel decide those (docs/slurm.md, "Signals"). A node failure is
requeued by Slurm itself (``--requeue``); the hook does not run on a failed node.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

from automodel_hydra import failures, ledger
from automodel_hydra.schema import USER_ERROR_EXIT

#: What the hook does: requeue the job, or nothing (the job ends as it did).
REQUEUE, NOTHING = "requeue", "nothing"
#: The classes whose evidence blames a node (the ledger's ``node``): it is left out of the requeued job.
BLAMES_NODE = frozenset({failures.HANG, failures.COMM, failures.NODE_FAILURE})


def exclusions(rows: tp.Sequence[ledger.Attempt], partition_nodes: int | None, job_nodes: int) -> list[str]:
    """The nodes the requeued job is to be kept off: those excluded before, plus the node the last attempt's
    evidence blames (the hung rank's host, the first failing rank's of a comm failure) where its class is in
    :data:`BLAMES_NODE`; the blamed node only while the partition keeps enough nodes for the job
    (``partition_nodes``: ``sinfo``'s count, None: unknown, then nothing new is excluded). Pure."""
    before = ledger.excluded(rows)
    last = rows[-1] if rows else None
    if last is None or last.kind not in BLAMES_NODE or not last.node or last.node in before:
        return before
    if partition_nodes is None or partition_nodes - len(before) - 1 < job_nodes:
        return before
    return sorted({*before, last.node})


def plan(rows: tp.Sequence[ledger.Attempt], budget: failures.FailureBudget, restarts: int, max_requeues: int,
         status: int) -> tuple[str, failures.Failure | None, failures.Decision | None]:
    """What the hook does for the ledger ``rows`` (oldest first), the job's ``SLURM_RESTART_COUNT``
    (``restarts``), ``slurm.max_requeues`` and the step's exit ``status``: ``(action, failure, decision)``;
    ``failure``/``decision`` None when the last attempt completed or is not the hook's to decide. Pure."""
    last = rows[-1] if rows else None
    if last is None:
        if status == 0:
            return NOTHING, None, None
        failure = failures.classify(failures.Evidence(exit_code=status, progressed=False,
                                                      detail=f"the job step exited {status} before any rank started"))
        failure = failures.Failure(failures.USER_ERROR, failure.evidence)
    elif last.kind in (ledger.COMPLETED, ledger.RUNNING):
        return NOTHING, None, None
    else:
        failure = failures.Failure(last.kind, last.evidence)
    if failure.kind not in failures.BUDGETED:
        return NOTHING, failure, None
    before = [a.kind for a in rows[:-1] if a.kind not in (ledger.COMPLETED, ledger.RUNNING)]
    decision = failures.decide(failure, before, budget)
    if decision.retry and restarts >= max_requeues:
        decision = failures.Decision(False, f"not retried: slurm.max_requeues={max_requeues} spent "
                                            f"(SLURM_RESTART_COUNT={restarts})")
    return (REQUEUE if decision.retry else NOTHING), failure, decision


def main(argv: tp.Sequence[str] | None = None, environ: tp.Mapping[str, str] = os.environ) -> int:
    """``python -m automodel_hydra.retry JOB_DIR STATUS``; returns STATUS (the step's exit status)."""
    from automodel_hydra.worker import _budget_section, slurm_requeue_target

    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2:
        print("usage: python -m automodel_hydra.retry JOB_DIR STATUS", file=sys.stderr)
        return USER_ERROR_EXIT
    launch, status = Path(args[0]) / "launch", int(args[1])
    try:
        budget = failures.FailureBudget.of(_budget_section(launch))
    except failures.UserError as e:  # checked at plan time; a hand-edited job.yaml
        print(f"automodel-hydra: {e}", file=sys.stderr)
        return status
    rows = ledger.attempts(launch)
    restarts = int(environ.get("SLURM_RESTART_COUNT") or 0)
    action, failure, decision = plan(rows, budget, restarts, int(environ.get("AUTOMODEL_MAX_REQUEUES") or 0), status)
    if failure is None or decision is None:
        return status
    requeue, restart = (rows[-1].requeue, rows[-1].restart) if rows else (restarts, 0)
    excluded = ledger.excluded(rows)
    if action == REQUEUE:
        excluded = exclusions(rows, partition_nodes(environ), int(environ.get("SLURM_JOB_NUM_NODES") or 1))
        if set(excluded) - set(ledger.excluded(rows)):
            decision = failures.Decision(True, f"{decision.why}; node {rows[-1].node} excluded (ExcNodeList="
                                               f"{','.join(excluded)})")
    ledger.record_decision(launch, restart, requeue, failure, decision, by="slurm", excluded=excluded)
    print(f"automodel-hydra: the attempt ended {failure.line()}; {decision.why}", file=sys.stderr, flush=True)
    if action == REQUEUE:
        requeue_job(slurm_requeue_target(environ), excluded)
    return status


def partition_nodes(environ: tp.Mapping[str, str]) -> int | None:
    """How many nodes the job's partition has (``sinfo -h -N -p P -o %N``), or None when that cannot be told."""
    part = environ.get("SLURM_JOB_PARTITION")
    try:
        proc = subprocess.run(["sinfo", "-h", "-N", *(["-p", part] if part else []), "-o", "%N"],
                              capture_output=True, text=True, timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    names = {line.strip() for line in proc.stdout.splitlines() if line.strip()}
    return len(names) if proc.returncode == 0 and names else None


def requeue_job(target: str, excluded: tp.Sequence[str], attempts: int = 20) -> None:
    """``scontrol requeue TARGET``, then, for ``excluded`` nodes, ``scontrol update JobId=TARGET
    ExcNodeList=...`` (scontrol(1): a requeued job is pending again, and a pending job's ExcNodeList can be
    changed; the update is tried again for a few seconds while the job is still completing). The batch step's
    SIGTERM of the requeue is ignored here until the update is done."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    subprocess.run(["scontrol", "requeue", target], check=False)
    if not excluded:
        return
    for _ in range(attempts):
        proc = subprocess.run(["scontrol", "update", f"JobId={target}", f"ExcNodeList={','.join(excluded)}"],
                              capture_output=True, text=True, check=False)
        if proc.returncode == 0:
            return
        time.sleep(0.25)
    print(f"automodel-hydra: could not exclude {','.join(excluded)}: {proc.stderr.strip()}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
