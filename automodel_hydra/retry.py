"""The Slurm requeue hook: after the job step ends, is the failed attempt requeued?

The batch script runs ``python -m automodel_hydra.retry "$AUTOMODEL_JOB_DIR" "$status"`` after ``srun`` (bare
metal; not in a container job, whose image the batch step does not enter). It reads the job's ledger
(:mod:`automodel_hydra.ledger`: in-job restarts and requeues alike), and for an attempt that failed in a class with
a budget of its own (:data:`automodel_hydra.failures.BUDGETED`) asks :func:`automodel_hydra.failures.decide` with
``failure_budget`` from ``launch/job.yaml``; while ``SLURM_RESTART_COUNT < AUTOMODEL_MAX_REQUEUES``
(``slurm.max_requeues``) a retry is ``scontrol requeue`` of this job (scontrol(1): a running batch job can requeue
itself; it restarts with ``SLURM_RESTART_COUNT`` + 1 and resumes from its newest checkpoint). It says what it
decided in one line on stderr (the job's Slurm log) and records it (``launch/ranks/decision.<attempt>.json``).

A sweep's array task whose attempt blames a node (:data:`BLAMES_NODE`) has that node left out of the array's
tasks that are still pending too (:func:`exclude_pending`), before its own requeue: the array script passes its
task ids and job dirs (``--array TASK... -- DIR...``), and each pending task that gets the node records it in its
own job dir (:func:`automodel_hydra.ledger.record_inherited`).

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


def exclusions(rows: tp.Sequence[ledger.Attempt], partition_nodes: int | None, job_nodes: int,
               inherited: tp.Sequence[str] = ()) -> list[str]:
    """The nodes the requeued job is to be kept off: those excluded before (by its own requeues, and
    ``inherited``: by a sweep's other member while this one was pending), plus the node the last attempt's
    evidence blames (the hung rank's host, the first failing rank's of a comm failure) where its class is in
    :data:`BLAMES_NODE`, and the node of each earlier run that Slurm requeued itself after a node failure
    (:func:`slurm_failed`); each new one only while the partition keeps enough nodes for the job
    (``partition_nodes``: ``sinfo``'s count, None: unknown, then nothing new is excluded). Pure."""
    found = set(ledger.excluded(rows)) | set(inherited)
    if partition_nodes is None:
        return sorted(found)
    for node in [*slurm_failed(rows), *([blamed(rows)] if blamed(rows) else [])]:
        for name in str(node).split(","):
            if name and name not in found and partition_nodes - len(found) - 1 >= job_nodes:
                found.add(name)
    return sorted(found)


def slurm_failed(rows: tp.Sequence[ledger.Attempt]) -> list[str]:
    """The nodes of the earlier runs that ended in a node failure Slurm requeued by itself (no decision of ours:
    the hook never ran on the dead node), oldest first."""
    return [a.node for a in rows[:-1] if a.kind == failures.NODE_FAILURE and a.node and a.decision is None]


def blamed(rows: tp.Sequence[ledger.Attempt]) -> str | None:
    """The node the last attempt's evidence blames, where its class is in :data:`BLAMES_NODE`; else None."""
    last = rows[-1] if rows else None
    return last.node if last is not None and last.kind in BLAMES_NODE and last.node else None


def pending_lists(pending: tp.Mapping[str, tp.Sequence[str]], nodes: tp.Sequence[str], partition_nodes: int | None,
                  job_nodes: int) -> dict[tuple[str, ...], list[str]]:
    """Which of an array's pending tasks (task id -> its ``ExcNodeList`` now) get which list: its own plus
    ``nodes``, grouped by the new list so that one ``scontrol update`` serves each group. A task that has every
    node already is left alone, and so is one that would keep fewer than ``job_nodes`` of the partition's
    ``partition_nodes`` (None: unknown, then none is changed). Pure."""
    groups: dict[tuple[str, ...], list[str]] = {}
    if partition_nodes is None:
        return groups
    for task, now in pending.items():
        new = tuple(sorted({*now, *nodes}))
        if set(new) == set(now) or partition_nodes - len(new) < job_nodes:
            continue
        groups.setdefault(new, []).append(task)
    return groups


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
    """``python -m automodel_hydra.retry JOB_DIR STATUS [--array TASK... -- DIR...]``; returns STATUS (the step's
    exit status). ``--array``: the array's task ids and, after ``--``, their job dirs in the same order."""
    from automodel_hydra.worker import slurm_requeue_target

    args = list(sys.argv[1:] if argv is None else argv)
    array = array_dirs(args[2:])
    if len(args) < 2 or array is None:
        print("usage: python -m automodel_hydra.retry JOB_DIR STATUS [--array TASK... -- DIR...]", file=sys.stderr)
        return USER_ERROR_EXIT
    launch, status = Path(args[0]) / "launch", int(args[1])
    try:
        budget = failures.FailureBudget.of_job(launch)
    except failures.UserError as e:  # checked at plan time; a hand-edited job.yaml
        print(f"automodel-hydra: {e}", file=sys.stderr)
        return status
    rows = ledger.attempts(launch)
    restarts = int(environ.get("SLURM_RESTART_COUNT") or 0)
    action, failure, decision = plan(rows, budget, restarts, int(environ.get("AUTOMODEL_MAX_REQUEUES") or 0), status)
    if failure is None or decision is None:
        return status
    requeue, restart = (rows[-1].requeue, rows[-1].restart) if rows else (restarts, 0)
    inherited = ledger.inherited_nodes(launch)
    excluded = sorted({*ledger.excluded(rows), *inherited})
    job_nodes = int(environ.get("SLURM_JOB_NUM_NODES") or 1)
    node = blamed(rows)
    total = partition_nodes(environ) if node or (action == REQUEUE and slurm_failed(rows)) else None
    if action == REQUEUE:
        excluded = exclusions(rows, total, job_nodes, inherited)
        added = [n for n in excluded if n not in {*ledger.excluded(rows), *inherited}]
        if added:
            decision = failures.Decision(True, f"{decision.why}; node{'s' if len(added) > 1 else ''} "
                                               f"{', '.join(added)} excluded (ExcNodeList={','.join(excluded)})")
    target = slurm_requeue_target(environ)
    others: dict[str, list[str]] = {}
    if node and array and environ.get("SLURM_ARRAY_JOB_ID"):  # before our own requeue frees the array's slot
        others = exclude_pending(environ["SLURM_ARRAY_JOB_ID"], environ.get("SLURM_ARRAY_TASK_ID") or "",
                                 sorted({*excluded, node}), total, job_nodes)
        for task, nodes in others.items():  # task: ARRAY_TASK; the script's job_dirs are keyed by TASK
            if (index := task.rpartition("_")[2]) in array:
                ledger.record_inherited(Path(array[index]) / "launch", nodes, by=target, failure=failure, node=node)
    ledger.record_decision(launch, restart, requeue, failure, decision, by="slurm", excluded=excluded,
                           pending={t: others[t] for t in sorted(others, key=_task_order)})
    print(f"automodel-hydra: the attempt ended {failure.line()}; {decision.why}", file=sys.stderr, flush=True)
    if others:
        print(f"automodel-hydra: node {node} excluded for the array's pending task(s) "
              f"{', '.join(sorted(others, key=_task_order))}", file=sys.stderr, flush=True)
    if action == REQUEUE:
        requeue_job(target, excluded)
    return status


def _task_order(task: str) -> tuple[int, str]:
    tail = task.rpartition("_")[2]
    return (int(tail), task) if tail.isdigit() else (1 << 62, task)


def array_dirs(args: tp.Sequence[str]) -> dict[str, str] | None:
    """``--array TASK... -- DIR...`` as task id -> job dir (task ids as the array script's ``job_dirs`` keys);
    {} without ``--array``; None when the two lists do not pair up."""
    if not args:
        return {}
    if args[0] != "--array" or "--" not in args:
        return None
    cut = list(args).index("--")
    tasks, dirs = list(args[1:cut]), list(args[cut + 1:])
    return dict(zip(tasks, dirs)) if len(tasks) == len(dirs) else None


def _hostnames(text: str) -> list[str]:
    """A Slurm host list (``node[1-3],gpu7``) as names; ``(null)`` and empty are []."""
    from automodel_hydra.bootstrap import expand_hostlist

    text = text.strip()
    return [] if not text or text == "(null)" else expand_hostlist(text)


def pending_tasks(array_job: str, timeout_s: float = 30.0) -> dict[str, list[str]] | None:
    """The array's pending tasks, task id (``ArrayTaskId``) -> the nodes it excludes now
    (``squeue -h -r -t PENDING -j ARRAY -o %K|%x``: squeue(1), ``%K`` the array index, ``%x`` the excluded nodes;
    ``-r`` one line per task); None when squeue cannot tell."""
    try:
        proc = subprocess.run(["squeue", "-h", "-r", "-t", "PENDING", "-j", array_job, "-o", "%K|%x"],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if proc.returncode != 0:
        return None
    rows = [line.split("|", 1) for line in proc.stdout.splitlines() if "|" in line]
    return {task.strip(): _hostnames(nodes) for task, nodes in rows if task.strip().isdigit()}


def exclude_pending(array_job: str, own_task: str, nodes: tp.Sequence[str], partition_nodes: int | None,
                    job_nodes: int) -> dict[str, list[str]]:
    """Leave ``nodes`` out of the array's pending tasks (all but ``own_task``), each keeping its own exclusions
    (:func:`pending_lists`): one ``scontrol update JobId=ARRAY_[T1,T2,...] ExcNodeList=...`` per group (scontrol(1):
    a job array's tasks are named ``ARRAY_[list]``; Slurm 22.05 updates the pending ones and answers "Job is no
    longer pending execution" for a task that started meanwhile). Returns task id -> its new list, for the tasks
    that squeue then shows with it."""
    pending = pending_tasks(array_job)
    if not pending:
        return {}
    pending.pop(own_task, None)
    groups = pending_lists(pending, nodes, partition_nodes, job_nodes)
    for new, tasks in groups.items():
        ids = ",".join(sorted(tasks, key=int))
        subprocess.run(["scontrol", "update", f"JobId={array_job}_[{ids}]", f"ExcNodeList={','.join(new)}"],
                       capture_output=True, text=True, timeout=30, check=False)
    after = pending_tasks(array_job) or {} if groups else {}
    done: dict[str, list[str]] = {}
    for new, tasks in groups.items():
        for task in tasks:
            if task in after and set(new) <= set(after[task]):
                done[f"{array_job}_{task}"] = list(new)
    return done


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
