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
import os
import re
import typing as tp

from automodel_hydra.backends.slurm_transport import HERE, Transport
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
        runs a command and returns its stdout ("" when it failed); default: on this machine
        (:class:`~automodel_hydra.backends.slurm_transport.Here`; the backend passes its job's transport).

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
    NotAnswered
        (a strict ``run``, :func:`runner`) neither tool could be asked.
    """
    wanted = list(dict.fromkeys(str(i) for i in ids))
    for job_id in wanted:
        if not _ID.match(job_id):
            raise ValueError(f"Slurm job id {job_id!r}: expected a job id such as '123' or an array task '123_4'")
    if not wanted:
        return {}
    run = run or runner(HERE)
    try:
        table = parse_sacct(run(["sacct", "-X", "--parsable2", "--noheader", f"--format={SACCT_FORMAT}",
                                  f"--jobs={_main_ids(wanted)}"], timeout_s))
        failed: NotAnswered | None = None
    except NotAnswered as e:  # (a strict runner: accounting down; squeue may still answer)
        table, failed = {}, e
    known = {job_id: lookup(table, job_id) for job_id in wanted}
    recheck = [job_id for job_id, info in known.items()
               if info is None or not info.state.final or info.state in _MAY_REQUEUE]
    if recheck:
        try:
            live = parse_squeue(run(["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}",
                                      f"--jobs={_main_ids(recheck)}"], timeout_s))
        except NotAnswered as e:
            if failed is not None or not table:  # neither tool answered: nothing is known, not "none"
                raise NotAnswered(f"{failed}; {e}" if failed and str(failed) != str(e) else str(e)) from None
            live = {}  # sacct's word, if behind
        table = {**table, **live}
        known.update({job_id: lookup(table, job_id) for job_id in recheck})
    return {job_id: info or StateInfo(JobState.UNKNOWN) for job_id, info in known.items()}


def _main_ids(ids: tp.Iterable[str]) -> str:
    return ",".join(sorted({i.split("_")[0] for i in ids}, key=int))


class NotAnswered(RuntimeError):
    """A Slurm command that could not be asked (no slurm.conf, no controller, not on PATH, no answer in time):
    one line with the command, the side and what it said. Nothing is known of the jobs from it."""


#: What a failing sacct or squeue says when it was asked and knows nothing (sacct without slurmdbd; squeue when
#: it knows none of the ids): an answer, not a failure to ask.
KNOWS_NOTHING = ("accounting storage is disabled", "Invalid job id specified")


def runner(link: Transport, strict: bool = False) -> tp.Callable[[list[str], float], str]:
    """:func:`query`'s command runner through ``link`` (this machine, or a login node): a command's stdout, or ""
    when it failed (logged at debug level: :data:`KNOWS_NOTHING` is normal). ``strict``: a failure that is not one
    of those answers (a missing or unreadable slurm.conf, a controller that does not answer) raises NotAnswered.
    A transport that cannot reach its side raises (ConnectionLost): "could not ask" is never "knows nothing"."""

    def run(argv: list[str], timeout_s: float) -> str:
        conf = os.environ.get("SLURM_CONF")
        if strict and link is HERE and conf and not os.path.isfile(conf):  # (the tools would retry it for 60 s)
            raise NotAnswered(f"SLURM_CONF={conf} is not a file: point it at the cluster's slurm.conf")
        out = link.run(argv, timeout=timeout_s)
        if out.returncode != 0:
            said = out.said(1)
            log.debug("%s on %s exited %d: %s", argv[0], link.where, out.returncode, said[:300])
            if strict and not any(k in said for k in KNOWS_NOTHING):
                raise NotAnswered(f"{argv[0]} on {link.where} exited {out.returncode}: {said[:300]}")
            return ""
        return out.text

    return run


def job_of_script(script: str, run: tp.Callable[[list[str], float], str]) -> str:
    """The newest job of this user that ``squeue`` lists with ``script`` as its command (``%o``; ``%F``: a job
    array's own id), or "" when it lists none: how a job that sbatch queued is found when sbatch's answer was not
    ``--parsable``'s (squeue(1), ``--me``, ``--format``)."""
    text = run(["squeue", "--me", "--noheader", "--states=all", "--format=%F|%o"], 60.0)
    ids = [line.split("|", 1)[0].strip() for line in text.splitlines() if line.partition("|")[2].strip() == script]
    return max((i for i in ids if i.isdigit()), key=int, default="")


# ----------------------------------------------------------------------------------------------- parsing (pure)


def parse_sacct(text: str) -> dict[str, StateInfo]:
    """``sacct -X --parsable2 --noheader -o JobID,State,Reason`` output as ``{id: StateInfo}``; pending array
    ranges (``123_[4-19%2]``) are expanded to one entry per task. Lines of another shape are skipped."""
    return _parse(text)


def parse_squeue(text: str) -> dict[str, StateInfo]:
    """``squeue --noheader -o '%i|%T|%r'`` output as ``{id: StateInfo}``, ranges expanded (as :func:`parse_sacct`)."""
    return _parse(text)


def _parse(text: str) -> dict[str, StateInfo]:
    """A task's own row wins over a range row that names it: a pending range cancelled after some of its tasks
    started stays one sacct record with its first range (``123_[1-3%1]`` CANCELLED beside ``123_1`` FAILED)."""
    own: dict[str, StateInfo] = {}
    ranged: dict[str, StateInfo] = {}
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) < 2 or not _TABLE_ID.match(fields[0]):
            continue
        state = JobState.from_slurm(fields[1])
        reason = fields[2].strip() if len(fields) > 2 and state is JobState.PENDING else ""
        info = StateInfo(state, "" if reason in _NO_REASON else reason)
        ids = expand_array_id(fields[0])
        for job_id in ids:
            (ranged if "[" in fields[0] else own)[job_id] = info
    return {**ranged, **own}


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


__all__ = ["KNOWS_NOTHING", "SACCT_FORMAT", "SQUEUE_FORMAT", "NotAnswered", "expand_array_id", "job_of_script",
           "lookup", "parse_sacct", "parse_squeue", "query", "runner"]
