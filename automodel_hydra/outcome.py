"""A job's state is what its ranks did: every rank records how it ended, and :func:`derive` reads the job's state
from those records, rank 0's result and the scheduler's word, for every backend and every command (the launching
command's last line, ``automodel-hydra status``, a sweep's counts, ``report``).

An exit code alone says too little. ``ft_launcher`` exits 0 once its restarts are spent when one rank had returned
(nvidia-resiliency-ext 0.4.1: after stopping the workers of an UNHEALTHY group it reports the stopped group as
succeeded), so on Slurm the step exits 0 and ``sacct`` says COMPLETED for a job that wrote no result; an agent whose
terminal went away exits non-zero for a job whose ranks all finished. So:

* each rank writes ``launch/ranks/rank<R>.<attempt>.json`` when it leaves the worker (:func:`record_end`): how it
  ended (``returned``, ``stopped`` on a signal, ``raised``), the optimizer steps it had completed, its error's first
  line, the world size, the launch id (``launch/run_id``) and the attempt (:func:`automodel_hydra.plan.attempt_name`:
  in-job restart and Slurm requeue);
* a job **completed** when rank 0's result carries this launch's id and every rank of the last attempt returned
  (:func:`completed`); a job dir without rank records (written before they existed, a call job) keeps the older
  rule: the scheduler's COMPLETED and a result of this launch;
* anything else that ended is not COMPLETED, and the line says which rank ended first and how, by the file
  server's modification times of the records (never a clock of this host): ``rank 1 returned at step 3 while the
  others trained; then rank 0: RuntimeError: ...`` (:func:`explain`).

This module imports only the standard library, :mod:`automodel_hydra.plan`, :mod:`automodel_hydra.states`,
:mod:`automodel_hydra.failures`, :mod:`automodel_hydra.fault_tolerance`, :mod:`automodel_hydra.ledger` and
:mod:`automodel_hydra.records`, so the worker, every backend and the CLI use it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import typing as tp
from pathlib import Path

from automodel_hydra import failures, fault_tolerance, ledger, records
from automodel_hydra.ledger import RAISED, RANKS_DIR, RETURNED, STOPPED  # noqa: F401 (outcome.RETURNED, ...)
from automodel_hydra.plan import (
    CALL_FILE,
    JobSpec,
    attempt_name,
    first_error,
    launch_dir,
    rank_error,
    read_run_id,
    written_by_this_launch,
)
from automodel_hydra.states import JobState, StateInfo


def end_file(launch: Path, rank: int, restart: int = 0, requeue: int = 0) -> Path:
    """``launch/ranks/rank<R>.<attempt>.json`` (:func:`automodel_hydra.plan.attempt_name`)."""
    return Path(launch) / RANKS_DIR / f"rank{rank}.{attempt_name(restart, requeue)}.json"


def record_end(launch: Path, *, rank: int, world_size: int, how: str, step: int | None, restart: int = 0,
               requeue: int = 0, error: str | None = None, failure: tp.Any = None, resumed: int | None = None,
               signals: tp.Sequence[str] = (), preempting: bool = False) -> Path:
    """Write this rank's end record (atomically: a reader never sees half of one). ``how``: :data:`RETURNED`,
    :data:`STOPPED` or :data:`RAISED`; ``step``: the optimizer steps this rank completed (None: unknown);
    ``error``: the first line of what it raised; ``failure``: its :class:`automodel_hydra.failures.Failure`
    (class and evidence); ``resumed``: the step this attempt started from; ``signals``: the stop signals it caught
    (``SIGUSR2``, ``SIGTERM``), in order; ``preempting``: Slurm was preempting the job. Returns the path."""
    path = end_file(launch, rank, restart, requeue)
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"rank": rank, "world_size": world_size, "how": how, "step": step, "error": error,
              "attempt": restart, "requeue": requeue, "host": socket.gethostname(), "node": ledger.node_name(),
              "pid": os.getpid(),
              "run_id": read_run_id(launch), "resumed": resumed, "signals": list(signals),
              "preempting": preempting, **({"class": failure.kind, "evidence": failure.evidence} if failure else {})}
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)
    return path


def ends(launch: Path) -> list[dict[str, tp.Any]]:
    """The end records of the job's current launch (by ``run_id``), each with ``mtime_ns`` (the file server's),
    oldest first."""
    current, found = read_run_id(launch), []
    for path in (Path(launch) / RANKS_DIR).glob("rank*.json"):
        try:
            record = json.loads(path.read_text())
            record["mtime_ns"] = path.stat().st_mtime_ns
        except (OSError, ValueError, TypeError):
            continue
        if isinstance(record, dict) and fault_tolerance.this_launch(current, record):
            found.append(record)
    return sorted(found, key=lambda r: (r["mtime_ns"], r.get("rank", 0)))


def _attempt(record: tp.Mapping[str, tp.Any]) -> tuple[int, int]:
    return int(record.get("requeue") or 0), int(record.get("attempt") or 0)


def last_attempt(launch: Path, records: tp.Sequence[tp.Mapping[str, tp.Any]] | None = None) -> tuple[int, int]:
    """``(requeue, restart)`` of the newest attempt of the current launch that left a trace: a rank's end record,
    a restarted attempt's line (``launch/ft/attempts.jsonl``) or a hang record."""
    records = ends(launch) if records is None else records
    seen = [_attempt(r) for r in (*records, *fault_tolerance.attempts(launch), *fault_tolerance.hangs(launch))]
    return max(seen, default=(0, 0))


def ranks_completed(launch: Path) -> bool | None:
    """Whether every rank of the current launch's last attempt returned; None when no rank left a record."""
    records = ends(launch)
    if not records:
        return None
    final = last_attempt(launch, records)
    world = max(int(r.get("world_size") or 1) for r in records)
    returned = {r.get("rank") for r in records if _attempt(r) == final and r.get("how") == RETURNED}
    return returned >= set(range(world))


def completed(job: JobSpec, result: bool | None = None) -> bool:
    """Whether the job completed in its current launch: rank 0's result carries the launch id (``result``: what
    the backend read elsewhere, e.g. SkyPilot's node 0; None: the job dir's result file), and no rank of the last
    attempt ended otherwise than by returning (:func:`ranks_completed`)."""
    has = written_by_this_launch(job) if result is None else result
    return has and (job.call is not None or ranks_completed(job.launch_dir) is not False)


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A job's state as its ranks tell it, why (None for COMPLETED), and the traceback of the rank that failed
    first, where one was recorded (torch's error file), for the terminal."""

    state: JobState
    why: str | None = None
    traceback: str | None = None


def derive(job: JobSpec, state: JobState, stamps: tp.Mapping[str, tuple[int, int]] | None = None,
           result: bool | None = None) -> Verdict:
    """The job's state from ``state`` (the scheduler's or the launcher's word: sacct's, ``COMPLETED``/``FAILED``
    for a local exit status of 0 / non-zero) and what the ranks did.

    * not final (PENDING, RUNNING, UNKNOWN): ``state``;
    * COMPLETED or FAILED: COMPLETED when :func:`completed` (a FAILED exit of an agent whose ranks all returned
      and wrote the result is still their work done); for a job whose ranks left no records, only a COMPLETED
      with a result of this launch; else FAILED with :func:`explain`;
    * any other final state (CANCELLED, TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY, ...): the scheduler's word,
      with the ranks' explanation.

    ``stamps``: the rank error files before the launch (:func:`automodel_hydra.plan.error_stamps`); ``result``:
    see :func:`completed`."""
    if not state.final:
        return Verdict(state)
    if state in (JobState.COMPLETED, JobState.FAILED):
        known = job.call is None and ranks_completed(job.launch_dir) is not None
        if completed(job, result) and (known or state is JobState.COMPLETED):
            return Verdict(JobState.COMPLETED)
        # every rank returned and the result is missing: that is the news, not which rank returned first
        everyone = job.call is None and ranks_completed(job.launch_dir) is True
        why = None if everyone else explain(job, stamps)
        if why is None and (state is JobState.COMPLETED or everyone):
            why = (f"{job.result_file} is an earlier launch's (its run_id is not launch/run_id's)"
                   if job.result_file.is_file() else f"no {job.result_file.name} of this launch was written")
        return Verdict(JobState.FAILED, classed(job, None, why), first_traceback(job, stamps))
    return Verdict(state, classed(job, state.value, explain(job, stamps)), first_traceback(job, stamps))


def classed(job: JobSpec, slurm_state: str | None, why: str | None) -> str | None:
    """``why`` with the class of the last attempt's end first (:mod:`automodel_hydra.ledger`):
    ``"user_error: rank 1: ValueError: ..."``; ``why`` as it is for a call job or where no attempt is known."""
    if job.call is not None:
        return why
    rows = ledger.attempts(job.launch_dir, slurm_state=slurm_state)
    if not rows or rows[-1].kind in (ledger.COMPLETED, ledger.RUNNING):
        return why
    return f"{rows[-1].kind}: {why}" if why else f"{rows[-1].kind}: {rows[-1].evidence}"


def _short(text: str, limit: int = 160) -> str:
    """An error's line for a line that says more than it: at most ``limit`` characters (the record keeps it all)."""
    return text if len(text) <= limit else text[: limit - 3].rstrip() + "..."


def explain(job: JobSpec, stamps: tp.Mapping[str, tuple[int, int]] | None = None,
            attempt: tuple[int, int] | None = None) -> str | None:
    """Why the job's ``attempt`` (default: its last) ended, in one line, or None when nothing says: the rank that
    ended first and how (:func:`automodel_hydra.failures.first_end` over its end and hang records, ordered by the
    files' modification times; a peer's "Connection closed by peer" is only its echo), then, when that was no
    error, the first rank that raised. Without records: the rank error files
    (:func:`automodel_hydra.plan.rank_error`)."""
    launch = job.launch_dir
    records = ends(launch)
    final = last_attempt(launch, records) if attempt is None else attempt  # (requeue, restart)
    mine = [r for r in records if _attempt(r) == final]
    hung = [dict(h) for h in fault_tolerance.hangs(launch, final[1]) if _attempt(h) == final]
    for h in hung:
        try:
            path = fault_tolerance.hang_file(launch, int(h.get("rank", 0)), *reversed(final))
            h["mtime_ns"] = path.stat().st_mtime_ns
        except OSError:
            h["mtime_ns"] = min((int(r["mtime_ns"]) for r in mine), default=0)
    if not mine and not hung:
        return rank_error(job, stamps) if attempt is None else None
    ranks = ledger.rank_ends(mine, hung, time_key="mtime_ns")
    cause = failures.first_end(ranks)
    if cause is None:  # every rank returned
        cause = min(ranks, key=lambda e: (e.time or 0.0, e.rank))
        return cause.describe(everyone_returned=True)
    if cause.how == failures.GONE:  # a rank without a record: it came first, its peers failed because it was gone
        gone = sorted(e.rank for e in ranks if e.how == failures.GONE)
        text = (f"rank{'s' if len(gone) > 1 else ''} {', '.join(map(str, gone))} ended without a record (killed "
                "by a signal, or its process crashed)")
    elif cause.how == failures.HUNG and attempt is not None:  # a restart's reason is short
        text = f"rank {cause.rank} hung at step {cause.step}"
    else:  # the last line's hang says the timeout and where the stack is
        text = cause.describe() if cause.how == failures.HUNG else _short(cause.describe())
    raised = sorted((e for e in ranks if e.how == failures.RAISED), key=lambda e: (e.time or 0.0, e.rank))
    if cause.how != failures.RAISED and raised:
        return f"{text}; then {_short(raised[0].describe())}"
    return text


def first_traceback(job: JobSpec, stamps: tp.Mapping[str, tuple[int, int]] | None = None) -> str | None:
    """The traceback torch's ``record`` wrote for the rank that failed first (its error file's
    ``extraInfo.py_callstack``; the same file :func:`automodel_hydra.plan.rank_error` quotes), or None."""
    found = first_error(job, stamps)
    if found is None:
        return None
    path = found[0]
    try:
        message = json.loads(path.read_text())["message"]
        text = message["extraInfo"]["py_callstack"] if isinstance(message, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not text:
        return None
    lines = str(text).rstrip().splitlines()
    # torch's ``record`` wrapper is where the traceback was taken, not where the rank failed: leave its frame out
    if len(lines) > 3 and lines[0].startswith("Traceback") and _RECORD_FRAME in lines[1]:
        rest = lines[2:]
        while rest and rest[0].startswith("    "):
            rest = rest[1:]
        lines = [lines[0], *rest]
    return "\n".join(lines)


#: The frame of torch's ``record`` wrapper (torch/distributed/elastic/multiprocessing/errors/__init__.py).
_RECORD_FRAME = "/torch/distributed/elastic/multiprocessing/errors/__init__.py"


def state_info(record: tp.Mapping[str, tp.Any], info: StateInfo, ranks_write_job_dir: bool = True) -> StateInfo:
    """A submitted job's state as ``automodel-hydra status``, ``runs`` and a sweep's counts show it: the backend's
    ``info`` read through :func:`derive` where the job's ranks write their records into its dir here
    (``ranks_write_job_dir``, the backend's :attr:`~automodel_hydra.plan.Backend.ranks_write_job_dir`; a remote
    Slurm job's are copied back first), with the explanation as the note. A job the scheduler no longer knows
    (UNKNOWN) that this launch cancelled is CANCELLED (:func:`automodel_hydra.records.cancel_note`)."""
    job_dir = Path(str(record["job_dir"]))
    if info.state is JobState.UNKNOWN:
        ids = [str(i) for i in record.get("job_ids") or ()]
        note = records.cancel_note(job_dir, ids) if ids else None
        if note and not info.answered:
            return StateInfo(JobState.CANCELLED, f"the scheduler could not be asked ({info.reason}); {note}", False)
        info = StateInfo(JobState.CANCELLED, note) if note else info
    if not info.answered:  # the last state our records know, and that the scheduler was not asked
        call = (launch_dir(job_dir) / CALL_FILE).is_file()
        job = JobSpec(job_dir=job_dir, job_name=str(record.get("log_name") or "train"), call=b"" if call else None)
        done = completed(job)
        known = "its result of this launch is here" if done else "no result of this launch here"
        return StateInfo(JobState.COMPLETED if done else info.state,
                         f"the scheduler could not be asked ({info.reason}); {known}", answered=False)
    if not info.state.final or not ranks_write_job_dir:
        return info
    call = (launch_dir(job_dir) / CALL_FILE).is_file()
    job = JobSpec(job_dir=job_dir, job_name=str(record.get("log_name") or "train"), call=b"" if call else None)
    verdict = derive(job, info.state)
    if verdict.state is JobState.COMPLETED or (verdict.state is info.state and not verdict.why):
        return StateInfo(verdict.state, info.reason)
    return StateInfo(verdict.state, verdict.why or info.reason)
