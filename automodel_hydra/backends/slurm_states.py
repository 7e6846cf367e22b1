"""Slurm job states for many jobs at once: one ``sacct`` call, and one ``squeue`` call only where sacct cannot tell.

:func:`query` asks ``sacct`` (accounting: the whole history, but written by slurmdbd a second or two behind
slurmctld) about every job in one call. It then asks ``squeue --states=all`` (slurmctld's live view, which keeps
a finished job for MinJobAge seconds, slurm.conf(5)) in one call about the jobs sacct

* does not know (just submitted, or accounting is off: "Slurm accounting storage is disabled"),
* reports PENDING or RUNNING (sacct lags: the job may have started or ended since),
* reports PREEMPTED or NODE_FAIL (Slurm itself may have requeued it: PreemptMode=REQUEUE, or a requeueable job
  on a failed node, slurm.conf(5) and sbatch(1) ``--requeue``; sacct shows the ended attempt until the new one is
  recorded).

Where both answer, squeue wins; where neither does, the state is UNKNOWN. Names are :class:`JobState`'s;
:attr:`StateInfo.reason` is the scheduler's reason for a PENDING job (squeue's ``%r``, or sacct's ``Reason``:
``Resources``, ``Priority``, ``BeginTime``, ``JobArrayTaskLimit`` ...), else empty.

Ids: ``"123"`` (a job, or a whole job array), ``"123_4"`` (one array task). Both tools are asked about the array
(``123``), since sacct does not list a task that still waits in a pending range such as ``123_[4-19%2]``; the
ranges are expanded here.
"""

from __future__ import annotations

import logging
import re
import subprocess
import typing as tp

from automodel_hydra.states import JobState, StateInfo

log = logging.getLogger(__name__)

#: ``sacct -o``: columns every Slurm since 17.x has (sacct(1), "Job Accounting Fields").
SACCT_FORMAT = "JobID,State,Reason"
#: ``squeue -o``: ``%i`` id (``123``, ``123_4``, ``123_[5-9%2]``), ``%T`` long state, ``%r`` reason (squeue(1)).
SQUEUE_FORMAT = "%i|%T|%r"
#: Final states after which Slurm itself may requeue a job: sacct's word is checked with squeue.
_MAY_REQUEUE = frozenset({JobState.PREEMPTED, JobState.NODE_FAIL})
_ID = re.compile(r"\d+(?:_\d+)?\Z")
_TABLE_ID = re.compile(r"(\d+)(?:_(\d+|\[[^\]]*\]))?\Z")
_NO_REASON = ("", "None", "(null)")


def query(ids: tp.Sequence[str], *, timeout_s: float = 60.0,
          run: tp.Callable[[list[str], float], str] | None = None) -> dict[str, StateInfo]:
    """The state of every job in ``ids``: at most one ``sacct`` and one ``squeue`` call in all.

    Parameters
    ----------
    ids
        ``"123"`` or ``"123_4"``; repeats are asked once.
    timeout_s
        per command; a command that fails or times out counts as knowing nothing.
    run
        runs a command and returns its stdout ("" when it failed); default: here (``slurm.tunnel``: on the login
        node, ``backends.slurm``).

    Returns
    -------
    dict
        ``{id: StateInfo}`` for every id; ``StateInfo(JobState.UNKNOWN)`` where neither tool knows the job. A
        whole array (``"123"``) is RUNNING while any task runs, else PENDING while any waits; once all tasks
        ended, COMPLETED if all did, else the state of the first task (by index) that did not.

    Raises
    ------
    ValueError
        an id that is not ``N`` or ``N_M`` (before any command runs).
    """
    wanted = list(dict.fromkeys(str(i) for i in ids))
    for job_id in wanted:
        if not _ID.match(job_id):
            raise ValueError(f"Slurm job id {job_id!r}: expected a job id such as '123' or an array task '123_4'")
    if not wanted:
        return {}
    run = run or _run
    table = parse_sacct(run(["sacct", "-X", "--parsable2", "--noheader", f"--format={SACCT_FORMAT}",
                              f"--jobs={_main_ids(wanted)}"], timeout_s))
    known = {job_id: lookup(table, job_id) for job_id in wanted}
    recheck = [job_id for job_id, info in known.items()
               if info is None or not info.state.final or info.state in _MAY_REQUEUE]
    if recheck:
        live = parse_squeue(run(["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}",
                                  f"--jobs={_main_ids(recheck)}"], timeout_s))
        table = {**table, **live}
        known.update({job_id: lookup(table, job_id) for job_id in recheck})
    return {job_id: info or StateInfo(JobState.UNKNOWN) for job_id, info in known.items()}


def _main_ids(ids: tp.Iterable[str]) -> str:
    return ",".join(sorted({i.split("_")[0] for i in ids}, key=int))


def _run(argv: list[str], timeout_s: float) -> str:
    """stdout of ``argv``, or "" when it fails (logged at debug level: "accounting storage is disabled" is normal
    on clusters without slurmdbd, and squeue answers "Invalid job id" when it knows none of the ids)."""
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError) as e:
        log.debug("%s: %s", argv[0], e)
        return ""
    if proc.returncode != 0:
        log.debug("%s exited %d: %s", argv[0], proc.returncode, proc.stderr.strip()[:300])
        return ""
    return proc.stdout


# ----------------------------------------------------------------------------------------------- parsing (pure)


def parse_sacct(text: str) -> dict[str, StateInfo]:
    """``sacct -X --parsable2 --noheader -o JobID,State,Reason`` output as ``{id: StateInfo}``; pending array
    ranges (``123_[4-19%2]``) are expanded to one entry per task. Lines of another shape are skipped."""
    return _parse(text)


def parse_squeue(text: str) -> dict[str, StateInfo]:
    """``squeue --noheader -o '%i|%T|%r'`` output as ``{id: StateInfo}``, ranges expanded (as :func:`parse_sacct`)."""
    return _parse(text)


def _parse(text: str) -> dict[str, StateInfo]:
    table: dict[str, StateInfo] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 2 or not _TABLE_ID.match(fields[0]):
            continue
        state = JobState.from_slurm(fields[1])
        reason = fields[2].strip() if len(fields) > 2 and state is JobState.PENDING else ""
        info = StateInfo(state, "" if reason in _NO_REASON else reason)
        for job_id in expand_array_id(fields[0]):
            table[job_id] = info
    return table


def expand_array_id(job_id: str) -> list[str]:
    """``"123_[0-3,7%2]"`` -> ``["123_0", "123_1", "123_2", "123_3", "123_7"]``; ``"123_[0-8:4]"`` (a step) ->
    ``["123_0", "123_4", "123_8"]``; any other id -> ``[job_id]``. The ``%N`` throttle is dropped (sbatch(1),
    ``--array``)."""
    m = _TABLE_ID.match(job_id)
    if m is None or m.group(2) is None or not m.group(2).startswith("["):
        return [job_id]
    main, spec = m.group(1), m.group(2)[1:-1].split("%", 1)[0]
    out: list[str] = []
    for part in filter(None, spec.split(",")):
        bounds, _, step = part.partition(":")
        first, _, last = bounds.partition("-")
        if not (first.isdigit() and (last or first).isdigit() and (step or "1").isdigit()):
            return [job_id]
        out += [f"{main}_{i}" for i in range(int(first), int(last or first) + 1, max(1, int(step or "1")))]
    return out


def lookup(table: tp.Mapping[str, StateInfo], job_id: str) -> StateInfo | None:
    """``job_id``'s state in a parsed table: its own entry, else (``"123"``) the whole array's state from its
    tasks (see :func:`query`), else None."""
    if job_id in table:
        return table[job_id]
    if "_" in job_id:
        return None
    prefix = f"{job_id}_"
    tasks = sorted((int(k[len(prefix):]), v) for k, v in table.items()
                   if k.startswith(prefix) and k[len(prefix):].isdigit())
    if not tasks:
        return None
    infos = [info for _, info in tasks]
    for waiting in (JobState.RUNNING, JobState.PENDING, JobState.UNKNOWN):
        if any(i.state is waiting for i in infos):
            return next(i for i in infos if i.state is waiting)
    return next((i for i in infos if i.state is not JobState.COMPLETED), infos[0])


__all__ = ["SACCT_FORMAT", "SQUEUE_FORMAT", "expand_array_id", "lookup", "parse_sacct", "parse_squeue", "query"]
