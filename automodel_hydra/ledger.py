"""The ledger: every attempt of a job's current launch (each in-job restart, each Slurm requeue), with the class
of its end (:func:`automodel_hydra.failures.classify`), the node the evidence blames, when it started and ended,
the step it reached, the steps and seconds it lost, and whether it was tried again; and the job's goodput.

Read from what the ranks leave in ``launch/`` (nothing here asks a scheduler; the caller passes sacct's state of
the latest attempt):

* ``ranks/start.<attempt>.json``: written by rank 0 as the attempt starts (:func:`record_start`);
* ``ranks/rank<R>.<attempt>.json``: each rank's end (:mod:`automodel_hydra.outcome`): how, its class and evidence,
  the optimizer step it reached (``step``) and the one it resumed from (``resumed``);
* ``ft/hang.rank<R>.<attempt>.json``: a hung rank (:mod:`automodel_hydra.fault_tolerance`);
* ``ranks/decision.<attempt>.json``: whether the attempt was tried again and why (:func:`record_decision`: the
  worker under ``ft_launcher``, the Slurm requeue hook :mod:`automodel_hydra.retry`);
* ``ranks/excluded.<task>.json``: nodes a sweep's other member (array task ``<task>``) left out of this job while
  it was pending (:func:`record_inherited`).

Times are the file server's modification times of those records (no host's clock is compared). Definitions
(docs/failures.md): ``steps_lost`` of an attempt = the step it reached minus the step the next attempt resumed
from (the steps done again), 0 for an attempt that completed, all its steps for a failed last attempt (no attempt
resumed them; a checkpoint it left may keep some, which the ledger cannot know), None where no step is known;
``seconds_lost`` = the attempt's wall time times the share of its steps lost (all of it when it made no step);
``goodput`` = the wall time of kept steps over the wall time from the first attempt's start to the last one's end.

This module imports only the standard library, :mod:`automodel_hydra.failures`,
:mod:`automodel_hydra.fault_tolerance`, :mod:`automodel_hydra.plan` and :mod:`automodel_hydra.states`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import typing as tp
from pathlib import Path

from automodel_hydra import failures, fault_tolerance
from automodel_hydra.plan import attempt_name, read_run_id
from automodel_hydra.records import read_cancel
from automodel_hydra.states import JobState

#: Where the ranks' records go, under the job's ``launch/`` dir (end records: :mod:`automodel_hydra.outcome`).
RANKS_DIR = "ranks"
#: How a rank left the worker (the end record's ``how``; :mod:`automodel_hydra.failures` reads them).
RETURNED, STOPPED, RAISED = failures.RETURNED, failures.STOPPED, failures.RAISED
#: The ledger's class of an attempt that completed (not a failure class).
COMPLETED = "completed"
#: An attempt still running (the latest, before it ended).
RUNNING = "running"


def node_name(environ: tp.Mapping[str, str] = os.environ) -> str:
    """The node this process runs on, as the scheduler names it (``SLURMD_NODENAME``: what ``ExcNodeList`` takes),
    else the host name."""
    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def _write(path: Path, record: dict[str, tp.Any]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(record) + "\n")
    os.replace(tmp, path)
    return path


def start_file(launch: Path, restart: int = 0, requeue: int = 0) -> Path:
    return Path(launch) / RANKS_DIR / f"start.{attempt_name(restart, requeue)}.json"


def decision_file(launch: Path, restart: int = 0, requeue: int = 0) -> Path:
    return Path(launch) / RANKS_DIR / f"decision.{attempt_name(restart, requeue)}.json"


def record_start(launch: Path, restart: int = 0, requeue: int = 0,
                 environ: tp.Mapping[str, str] = os.environ) -> Path:
    """Rank 0: the attempt ``(restart, requeue)`` starts now, on this host. The first attempt of a Slurm requeue
    also records how Slurm says each earlier run of the job ended (:func:`slurm_runs`): a run that ended
    NODE_FAIL left no record of its own (its ranks died with the node), and Slurm requeued it itself."""
    record: dict[str, tp.Any] = {"attempt": restart, "requeue": requeue, "host": socket.gethostname(),
                                 "node": node_name(environ), "run_id": read_run_id(launch)}
    job = environ.get("SLURM_JOB_ID")
    if requeue > 0 and restart == 0 and job:
        record["slurm_runs"] = slurm_runs(job)
    return _write(start_file(launch, restart, requeue), record)


#: The Slurm states of an earlier run that the ranks cannot record: the node died under them.
NODE_STATES = ("NODE_FAIL", "BOOT_FAIL")


def slurm_runs(job_id: str, timeout_s: float = 10.0) -> list[list[str]]:
    """``[[state, nodelist, failed], ...]`` of every run of the job, oldest first (``sacct -D -X -j JOB``:
    sacct(1) "--duplicates" lists each run of a requeued job, the earlier ones ``REQUEUED``, ``PREEMPTED`` or
    ``NODE_FAIL``); ``failed``: for a run of several nodes that ended NODE_FAIL or BOOT_FAIL, the nodes that went
    down while it ran (:func:`failed_nodes`), else ""; [] when sacct cannot tell (no accounting, a timeout)."""
    import subprocess

    try:
        proc = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", str(job_id), "-o", "State,NodeList,Start,End"],
                              capture_output=True, text=True, timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode != 0:
        return []
    runs = []
    for r in (line.split("|") for line in proc.stdout.splitlines() if line.strip()):
        if len(r) < 2 or not r[0].strip():
            continue
        state, nodes = r[0].split()[0], r[1]
        several = "," in nodes or "[" in nodes
        failed = failed_nodes(nodes, r[2], r[3], timeout_s=timeout_s) if state in NODE_STATES and several \
            and len(r) >= 4 else []
        runs.append([state, nodes, ",".join(failed)])
    return runs


#: The node states of a node failure in Slurm's event records (sacctmgr(1) "show event": a node DOWN, FAILed or
#: drained, and not responding).
DOWN_STATES = ("DOWN", "FAIL", "DRAIN", "NOT_RESPONDING")


def failed_nodes(nodelist: str, start: str, end: str, slack_s: float = 60.0, timeout_s: float = 10.0) -> list[str]:
    """Which nodes of ``nodelist`` went down between ``start`` and ``end`` (sacct's ISO times) plus ``slack_s``:
    ``sacctmgr -n -P show event nodes=LIST start=START format=NodeName,TimeStart,State`` (Slurm keeps a node's
    down events in its accounting, also after the node is back); [] when it cannot tell."""
    import datetime
    import subprocess

    try:
        until = datetime.datetime.fromisoformat(end).timestamp() + slack_s
        proc = subprocess.run(["sacctmgr", "-n", "-P", "show", "event", f"nodes={nodelist}", f"start={start}",
                               "format=NodeName,TimeStart,State"], capture_output=True, text=True,
                              timeout=timeout_s, check=False)
    except (OSError, ValueError, subprocess.SubprocessError):
        return []
    found: list[str] = []
    for row in (line.split("|") for line in proc.stdout.splitlines() if line.count("|") >= 2):
        try:
            at = datetime.datetime.fromisoformat(row[1]).timestamp()
        except ValueError:
            continue
        if at <= until and any(s in row[2].upper() for s in DOWN_STATES) and row[0] not in found:
            found.append(row[0])
    return found if proc.returncode == 0 else []


def _run_states(starts: tp.Mapping[tuple[int, int], tp.Mapping[str, tp.Any]]) -> dict[int, list[str]]:
    """Requeue number -> ``[state, nodelist, failed]`` of that Slurm run, from the later attempts' start records
    (an older record's ``[state, nodelist]`` is read with ``failed`` "")."""
    found: dict[int, list[str]] = {}
    for record in starts.values():
        for i, run in enumerate(record.get("slurm_runs") or []):
            if isinstance(run, list) and len(run) in (2, 3) and i < int(record.get("requeue") or 0):
                found.setdefault(i, [str(run[0]), str(run[1]), str(run[2]) if len(run) == 3 else ""])
    return found


def record_decision(launch: Path, restart: int, requeue: int, failure: failures.Failure,
                    decision: failures.Decision, by: str, excluded: tp.Sequence[str] = (),
                    pending: tp.Mapping[str, tp.Sequence[str]] | None = None) -> Path:
    """Whether the attempt is tried again (``by``: ``ft_launcher``, ``slurm``), with its class and evidence;
    ``excluded``: the nodes the requeued job is kept off (``ExcNodeList``), all so far; ``pending``: the sweep's
    pending array tasks that the blamed node was left out of, task -> its new ``ExcNodeList``."""
    return _write(decision_file(launch, restart, requeue),
                  {"attempt": restart, "requeue": requeue, "class": failure.kind, "evidence": failure.evidence,
                   "retry": decision.retry, "why": decision.why, "by": by, "excluded": list(excluded),
                   **({"pending_excluded": {t: list(n) for t, n in pending.items()}} if pending else {}),
                   "run_id": read_run_id(launch)})


#: A record of nodes a sweep's other member left out of this pending job: ``ranks/excluded.<task>.json``.
INHERITED = "excluded.{task}.json"


def record_inherited(launch: Path, nodes: tp.Sequence[str], *, by: str, failure: failures.Failure,
                     node: str) -> Path:
    """In a pending sweep member's job dir: array task ``by`` blamed ``node`` (``failure``) and left ``nodes``
    (the member's whole ``ExcNodeList`` now) out of this member before it started."""
    return _write(Path(launch) / RANKS_DIR / INHERITED.format(task=by),
                  {"nodes": list(nodes), "by": by, "node": node, "class": failure.kind, "evidence": failure.evidence,
                   "run_id": read_run_id(launch)})


def inherited(launch: Path) -> list[dict[str, tp.Any]]:
    """This launch's records of :func:`record_inherited`, oldest first."""
    found = _read((Path(launch) / RANKS_DIR).glob(INHERITED.format(task="*")), read_run_id(launch))
    return sorted(found, key=lambda r: r["mtime"])


def inherited_nodes(launch: Path) -> list[str]:
    """Every node a sweep's other member left out of this job (:func:`inherited`), sorted."""
    return sorted({str(n) for r in inherited(launch) for n in r.get("nodes") or []})


def inherited_note(launch: Path) -> str:
    """``"node1 excluded after 53_0's comm failure"`` for ``status``, or "" when no other member excluded any."""
    said = [f"{r.get('node')} excluded after {r.get('by')}'s {r.get('class')} failure" for r in inherited(launch)]
    return "; ".join(dict.fromkeys(said))


@dataclasses.dataclass
class Attempt:
    """One attempt of the ledger; ``start``/``end`` in seconds since the epoch (file server's clock)."""

    requeue: int
    restart: int
    kind: str
    evidence: str
    node: str | None = None
    start: float | None = None
    end: float | None = None
    step: int | None = None
    resumed: int | None = None
    steps_lost: int | None = None
    seconds_lost: float | None = None
    decision: str | None = None
    excluded: list[str] = dataclasses.field(default_factory=list)

    def as_json(self) -> dict[str, tp.Any]:
        return {"attempt": attempt_name(self.restart, self.requeue), "requeue": self.requeue,
                "restart": self.restart, "class": self.kind, "evidence": self.evidence, "node": self.node,
                "start": self.start, "end": self.end, "step": self.step, "resumed_from": self.resumed,
                "steps_lost": self.steps_lost,
                "seconds_lost": None if self.seconds_lost is None else round(self.seconds_lost, 1),
                "decision": self.decision, **({"excluded": self.excluded} if self.excluded else {})}


def _key(record: tp.Mapping[str, tp.Any]) -> tuple[int, int]:
    return int(record.get("requeue") or 0), int(record.get("attempt") or 0)


def _read(paths: tp.Iterable[Path], current: str | None) -> list[dict[str, tp.Any]]:
    found = []
    for path in paths:
        try:
            record = json.loads(path.read_text())
            record["mtime"] = path.stat().st_mtime
        except (OSError, ValueError, TypeError):
            continue
        if isinstance(record, dict) and fault_tolerance.this_launch(current, record):
            found.append(record)
    return found


def _node(record: tp.Mapping[str, tp.Any] | None) -> str | None:
    if record is None:
        return None
    found = record.get("node") or record.get("host")
    return str(found) if found else None


def rank_ends(ends: tp.Sequence[tp.Mapping[str, tp.Any]], hangs: tp.Sequence[tp.Mapping[str, tp.Any]] = (),
              time_key: str = "mtime") -> list[failures.RankEnd]:
    """Every rank of one attempt as :class:`automodel_hydra.failures.RankEnd`, from its ranks' end records and hang
    records (each with its file's modification time under ``time_key``): the hung rank (the first hang of
    :func:`automodel_hydra.fault_tolerance.hangs`, at the earliest hang record's time) hung, whatever its end record
    says of how it was ended afterwards; any other rank with an end record ended as it says; a rank of the world
    size with neither is :data:`~automodel_hydra.failures.GONE`. Pure."""
    out = []
    hung_rank = int(hangs[0].get("rank") or 0) if hangs else None
    for r in ends:
        if int(r.get("rank") or 0) == hung_rank:
            continue
        failure = None
        if r.get("how") == RAISED:
            failure = failures.Failure(str(r.get("class") or failures.CRASH),
                                       str(r.get("evidence") or r.get("error") or "an error"))
        out.append(failures.RankEnd(int(r.get("rank") or 0), str(r.get("how")), float(r[time_key]),
                                    r.get("step") if isinstance(r.get("step"), int) else None, failure, _node(r)))
    if hangs:
        h, when = hangs[0], min(float(x.get(time_key) or 0.0) for x in hangs)
        out.append(failures.RankEnd(int(h.get("rank") or 0), failures.HUNG, when,
                                    h.get("step") if isinstance(h.get("step"), int) else None,
                                    failures.Failure(failures.HANG, fault_tolerance.describe_hang(h)), _node(h)))
    ranks = {e.rank for e in out}
    hung = {int(h.get("rank") or 0) for h in hangs}
    world = max((int(r.get("world_size") or 1) for r in ends), default=0)
    out += [failures.RankEnd(rank, failures.GONE) for rank in range(world) if rank not in ranks | hung]
    return out


def classify_attempt(ends: tp.Sequence[tp.Mapping[str, tp.Any]], hangs: tp.Sequence[tp.Mapping[str, tp.Any]], *,
                     slurm_state: str | None = None, cancelled: bool = False,
                     requeued_after: bool = False) -> tuple[failures.Failure | None, str | None]:
    """The class of one attempt's end from its ranks' end records and hang records (``mtime`` each), sacct's
    ``slurm_state`` where known, a user's cancel, and whether Slurm requeued the job after it
    (``requeued_after``), by :func:`automodel_hydra.failures.classify` (the rank that ended first decides,
    :func:`automodel_hydra.failures.first_end`). Returns ``(failure, node)``: ``node`` is where the rank that
    ended first ran (None where unknown); ``failure`` is None for an attempt whose every rank returned. Pure."""
    world = max((int(r.get("world_size") or 1) for r in ends), default=0)
    returned = {r.get("rank") for r in ends if r.get("how") == RETURNED}
    if world and returned >= set(range(world)) and not slurm_state:
        return None, next((_node(r) for r in ends if r.get("rank") == 0), None)
    ranks = rank_ends(ends, hangs)
    cause = failures.first_end(ranks)
    stopped = [r for r in ends if r.get("how") == STOPPED]
    signal = next((str(s) for r in stopped for s in (r.get("signals") or [])), None)
    preempting = any(r.get("preempting") for r in stopped)
    detail = None
    if signal == "SIGTERM" and requeued_after and (cause is None or cause.how == STOPPED):
        preempting, detail = True, "SIGTERM, then Slurm requeued the job"
    ev = failures.Evidence(slurm_state=slurm_state, cancelled=cancelled, preempting=preempting, signal=signal,
                           detail=detail, ends=tuple(ranks))
    node = cause.node if cause is not None else None
    return failures.classify(ev), node


def ending(launch: Path, restart: int = 0, requeue: int = 0) -> failures.Failure | None:
    """The class of the attempt ``(restart, requeue)`` while its ranks are still ending (a failed rank's in-job
    decision under ``ft_launcher``): :func:`automodel_hydra.failures.classify` of the end and hang records its
    ranks left so far, where a rank without one has not ended yet (it is not taken as gone). None without
    records."""
    launch = Path(launch)
    current = read_run_id(launch)
    mine = [r for r in _read((launch / RANKS_DIR).glob("rank*.json"), current) if _key(r) == (requeue, restart)]
    hung = [h for h in fault_tolerance.hangs(launch, restart) if _key(h) == (requeue, restart)]
    for h in hung:
        try:
            h["mtime"] = fault_tolerance.hang_file(launch, int(h.get("rank", 0)), restart, requeue).stat().st_mtime
        except OSError:
            h["mtime"] = 0.0
    ranks = [e for e in rank_ends(mine, hung) if e.how != failures.GONE]
    return failures.classify(failures.Evidence(ends=tuple(ranks))) if ranks else None


def attempts(launch: Path, slurm_state: str | None = None, running: bool = False) -> list[Attempt]:
    """The ledger of the job's current launch, oldest attempt first. ``slurm_state``: sacct's final state of the
    latest attempt (None: not on Slurm, or not final); ``running``: the latest attempt has not ended."""
    launch = Path(launch)
    current = read_run_id(launch)
    ranks = launch / RANKS_DIR
    ends = _read(ranks.glob("rank*.json"), current)
    starts = {_key(r): r for r in _read(ranks.glob("start.*.json"), current)}
    decisions = {_key(r): r for r in _read(ranks.glob("decision.*.json"), current)}
    hangs = fault_tolerance.hangs(launch)
    for h in hangs:
        try:
            h["mtime"] = fault_tolerance.hang_file(launch, int(h.get("rank", 0)), *reversed(_key(h))).stat().st_mtime
        except OSError:
            h["mtime"] = 0.0
    keys = sorted({*starts, *(_key(r) for r in ends), *(_key(h) for h in hangs)})
    cancelled = read_cancel(launch) is not None
    runs = _run_states(starts)
    out: list[Attempt] = []
    for i, key in enumerate(keys):
        mine = [r for r in ends if _key(r) == key]
        hung = [h for h in hangs if _key(h) == key]
        last = i == len(keys) - 1
        if last and running:
            failure, node = None, None
            kind, evidence = RUNNING, "running"
        else:
            # an earlier Slurm run that the node's failure ended: Slurm's word, as for the last attempt's
            run = runs.get(key[0]) if not last and not any(k[0] == key[0] for k in keys[i + 1:]) else None
            died = run is not None and run[0] in NODE_STATES
            failure, node = classify_attempt(mine, hung, slurm_state=slurm_state if last else
                                             run[0] if died and run is not None else None,
                                             cancelled=cancelled and last,
                                             requeued_after=any(k[0] > key[0] for k in keys[i + 1:]))
            kind, evidence = (COMPLETED, "every rank returned") if failure is None else (failure.kind,
                                                                                         failure.evidence)
            if died and run is not None and "," not in run[1] and "[" not in run[1]:
                node = run[1]  # a one-node run: the node that failed
            elif died and run is not None and run[2]:
                node = run[2]  # a run of several nodes: those Slurm's events say went down while it ran
        start = starts.get(key)
        times = [float(r["mtime"]) for r in (*mine, *hung)]
        steps = [int(r["step"]) for r in mine if isinstance(r.get("step"), int)]
        steps += [int(h["completed_steps"]) for h in hung if isinstance(h.get("completed_steps"), int)]
        resumed = [int(r["resumed"]) for r in mine if isinstance(r.get("resumed"), int)]
        decided = decisions.get(key)
        out.append(Attempt(requeue=key[0], restart=key[1], kind=kind, evidence=evidence,
                           node=node or _node(start),
                           start=float(start["mtime"]) if start else min(times, default=None),
                           end=max(times, default=None) if kind != RUNNING else None,
                           step=max(steps, default=None), resumed=min(resumed, default=None),
                           decision=str(decided.get("why")) if decided else None,
                           excluded=[str(n) for n in (decided or {}).get("excluded") or []]))
    _losses(out)
    return out


def _losses(rows: list[Attempt]) -> None:
    for i, a in enumerate(rows):
        done = (a.step or 0) - (a.resumed or 0) if a.step is not None else 0
        nxt = rows[i + 1] if i + 1 < len(rows) else None
        if a.kind in (COMPLETED, RUNNING) or done <= 0:
            a.steps_lost = 0
        elif nxt is not None and nxt.resumed is not None and a.step is not None:
            a.steps_lost = max(0, a.step - nxt.resumed)
        elif nxt is None:  # a failed last attempt: nothing resumed its steps (yet)
            a.steps_lost = done
        if a.start is None or a.end is None or a.kind == RUNNING:
            continue
        wall = max(0.0, a.end - a.start)
        if done <= 0:
            a.seconds_lost = 0.0 if a.kind == COMPLETED else wall
        elif a.steps_lost is not None:
            a.seconds_lost = wall * min(a.steps_lost, done) / done


def wall_times(rows: tp.Sequence[Attempt]) -> tuple[float, float] | None:
    """``(kept_s, wall_s)``: the wall time of kept steps (each attempt's wall time less its ``seconds_lost``) and
    the wall time from the first attempt's start to the last one's end, in seconds; None without times."""
    starts = [a.start for a in rows if a.start is not None]
    ends = [a.end for a in rows if a.end is not None]
    if not starts or not ends or any(a.seconds_lost is None and a.kind != RUNNING for a in rows):
        return None
    total = max(ends) - min(starts)
    if total <= 0:
        return None
    kept = sum(max(0.0, (a.end - a.start) - (a.seconds_lost or 0.0)) for a in rows
               if a.start is not None and a.end is not None)
    return min(kept, total), total


def goodput(rows: tp.Sequence[Attempt]) -> float | None:
    """Kept steps' wall time over the wall time since the first start (0..1), or None without times
    (:func:`wall_times`)."""
    times = wall_times(rows)
    return None if times is None else round(times[0] / times[1], 3)


def failed_before(launch: Path, key: tuple[int, int]) -> list[str]:
    """The classes of the current launch's failed attempts before ``key`` ``(requeue, restart)``: what the
    budget of :func:`automodel_hydra.failures.decide` counts."""
    return [a.kind for a in attempts(launch) if (a.requeue, a.restart) < key
            and a.kind not in (COMPLETED, RUNNING)]


def summary(launch: Path, slurm_state: str | None = None, running: bool = False) -> dict[str, tp.Any]:
    """``{"attempts": [...], "goodput": g, "kept_s": k, "wall_s": w, "excluded": [nodes]}`` for
    ``automodel-hydra status --json`` and ``report`` (``kept_s``/``wall_s``: :func:`wall_times`;
    ``excluded``: the nodes a requeue kept the job off, :mod:`automodel_hydra.retry`, and those a sweep's other
    member left out of it while it was pending)."""
    rows = attempts(launch, slurm_state, running)
    times = wall_times(rows)
    return {"attempts": [a.as_json() for a in rows], "goodput": goodput(rows),
            "kept_s": None if times is None else round(times[0], 1),
            "wall_s": None if times is None else round(times[1], 1),
            "excluded": sorted({*excluded(rows), *inherited_nodes(launch)})}


def of_state(launch: Path, state: JobState) -> dict[str, tp.Any]:
    """:func:`summary` of a job in ``state`` as its backend says it (``automodel-hydra status``): the
    scheduler's final word classes the last attempt (TIMEOUT, PREEMPTED, NODE_FAIL, OUT_OF_MEMORY, CANCELLED...;
    FAILED and COMPLETED say nothing the ranks' records do not), and a job not ended yet has a running attempt."""
    slurm_state = state.value if state.final and state not in (JobState.COMPLETED, JobState.FAILED) else None
    return summary(launch, slurm_state=slurm_state, running=not state.final)


def excluded(rows: tp.Sequence[Attempt]) -> list[str]:
    """Every node a requeue of the job excluded so far (``ExcNodeList`` only grows), sorted."""
    return sorted({n for a in rows for n in a.excluded})
