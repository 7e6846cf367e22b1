"""The run dir's records: what a launch leaves under ``launch/`` for the commands that come after it
(``automodel-hydra status|logs|cancel|report|resume``, a relaunch of the same dir), read and written here only.

* ``launch/submission.json``: a job's submission record (:meth:`automodel_hydra.plan.Submission.record`: its
  backend, typed reference, ids, overrides, paths), :func:`write_record` / :func:`read_record`;
* ``launch/manifest.json`` of a sweep dir: every member's record, plus the dirs each writes and the sweep's
  definition (for a resume), :func:`write_manifest` / :func:`read_manifest`;
* ``launch/lock``: a local job's run lock, an ``flock`` that its processes hold for as long as they live
  (:func:`take_lock`, :func:`locked`), and :func:`refuse_if_busy`, which asks it (or the job's scheduler) before a
  launch rewrites a dir;
* ``launch/tracker_id``: the job's (or the sweep's) id for experiment trackers, kept by every later launch of the
  dir (:func:`stable_tracker_id`, :func:`write_tracker_id`; the ranks' variables:
  :func:`automodel_hydra.plan.tracker_env`);
* ``launch/cancel.json``: a user's cancel of the job, on every backend (:func:`write_cancel`, :func:`read_cancel`):
  who sent it, the ids and the state then, the launch it covers (``launch/run_id``) and, for a local job, how its
  processes ended. Run dirs written before this record was one file still read: a local job's old
  ``launch/cancelled`` mark reads as its cancel (:data:`OLD_CANCEL_MARK`).

Every record is written atomically (a temporary file, then ``os.replace``), so a reader never sees half of one.

A run or sweep dir may be moved, renamed, copied to another machine or mounted under another path: its records are
read relative to the dir they are read from. A path on this machine inside the dir that holds a record (the job
dir for ``submission.json``, the sweep dir for the manifest: :data:`LOCAL_PATHS`) is stored relative to it and read
back under the dir as named now (:func:`stored`, :func:`placed`); a dir written before records stored relative
paths is read with its recorded root mapped onto the dir named (:func:`_old_root`). Paths outside that dir, and
the paths of jobs that ran on another machine (a ``slurm.tunnel`` job's dir and log on its login node), stay as
recorded.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import typing as tp
from pathlib import Path

from automodel_hydra.plan import (
    LAUNCH_DIR,
    TRACKER_ID_FILE,
    PreflightError,
    SubmitError,
    launch_dir,
    new_run_id,
    read_run_id,
)
from automodel_hydra.states import JobState

if tp.TYPE_CHECKING:
    from automodel_hydra.plan import JobSpec, Submission

#: A job's submission record, and a sweep's list of them (under ``launch/``).
RECORD_FILE = "submission.json"
MANIFEST_FILE = "manifest.json"
#: A local job's run lock (``flock``, held by its processes).
LOCK_FILE = "lock"
#: A user's cancel of the job (:func:`write_cancel`).
CANCEL_FILE = "cancel.json"
#: What versions before ``cancel.json`` covered local jobs left for a local job's cancel: an empty file, or how its
#: processes ended. Read as its cancel (:func:`read_cancel`), removed with it (:func:`clear_cancel`); never written.
OLD_CANCEL_MARK = "cancelled"

Record = dict[str, tp.Any]


def _write_json(path: Path, value: tp.Any, indent: int | None = 2) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=indent) + "\n")
    os.replace(tmp, path)
    return path


def _read_json(path: Path) -> tp.Any:
    """The JSON value in ``path``; None when there is no file or it cannot be read."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


# ----------------------------------------------------------------------------------------------- submission records


def record_path(run_dir: Path | str) -> Path:
    """``<run_dir>/launch/submission.json``."""
    return launch_dir(run_dir) / RECORD_FILE


def manifest_path(sweep_dir: Path | str) -> Path:
    """``<sweep_dir>/launch/manifest.json``."""
    return launch_dir(sweep_dir) / MANIFEST_FILE


#: The fields of a submission record that name a file or dir on this machine (the dotted key of a value that is a
#: path, a list or a mapping of paths): :meth:`automodel_hydra.plan.Submission.record`'s own, a sweep member's
#: ``paths`` and ``checkpoint_dir`` (:func:`write_manifest`), a local job's ``ref.job_dir`` and a ``slurm.tunnel``
#: job's ``ref.remote.local_log`` (the copy here of its log). Not ``ref.remote.job_dir`` / ``ref.remote.log``: those
#: are paths on its login node, which a move here does not change.
LOCAL_PATHS = ("job_dir", "log_path", "files", "paths", "checkpoint_dir", "ref.job_dir", "ref.remote.local_log")
#: The record's key listing the fields of :data:`LOCAL_PATHS` stored relative to the dir that holds the record.
RELATIVE_KEY = "relative"


def _field(record: Record, dotted: str) -> tuple[dict[str, tp.Any], str] | None:
    """``(mapping, key)`` that holds the field ``a.b.c`` of ``record``, None when it has none."""
    *parents, last = dotted.split(".")
    node: tp.Any = record
    for key in parents:
        node = node.get(key) if isinstance(node, dict) else None
    return (node, last) if isinstance(node, dict) and node.get(last) is not None else None


def _each(value: tp.Any, f: tp.Callable[[str], str]) -> tp.Any:
    """``f`` applied to a path, to each path of a list, to each value of a mapping; other values as they are."""
    if isinstance(value, str):
        return f(value)
    if isinstance(value, list):
        return [_each(v, f) for v in value]
    if isinstance(value, dict):
        return {k: _each(v, f) for k, v in value.items()}
    return value


def _below(path: str, root: Path | str) -> str | None:
    """``path`` relative to ``root`` (POSIX, ``.`` for root itself) when it lies inside it, as written or with
    symbolic links resolved; None otherwise (a relative ``path`` is none of root's)."""
    if not os.path.isabs(path):
        return None
    for there, here in ((os.path.abspath(root), os.path.abspath(path)),
                        (os.path.realpath(root), os.path.realpath(path))):
        if here == there or here.startswith(there.rstrip("/") + "/"):
            return os.path.relpath(here, there)
    return None


def stored(record: Record, root: Path | str) -> Record:
    """``record`` as saved in a file under ``root`` (a job dir, a sweep dir): each path of :data:`LOCAL_PATHS`
    inside ``root`` relative to it, the fields that hold one listed under :data:`RELATIVE_KEY`. Pure but for
    resolving symbolic links."""
    out = json.loads(json.dumps(record))
    relative = []
    for dotted in LOCAL_PATHS:
        found = _field(out, dotted)
        if found is None:
            continue
        node, key = found
        now = _each(node[key], lambda path: _below(path, root) or path)
        if now != node[key]:
            node[key] = now
            relative.append(dotted)
    out.pop(RELATIVE_KEY, None)
    return {**out, **({RELATIVE_KEY: relative} if relative else {})}


def placed(record: Record, root: Path | str, old_root: str | None = None) -> Record:
    """A record read from a file under ``root`` with its :data:`LOCAL_PATHS` as paths here: a relative one under
    ``root`` as named (not resolved: a dir reached through a link stays so), an absolute one inside ``old_root`` (the
    root a record of the previous version was written under) moved to the same place under ``root``; any other as
    recorded."""
    out = json.loads(json.dumps(record))
    here = os.path.abspath(root)
    relative = set(out.pop(RELATIVE_KEY, None) or ())

    def move(path: str) -> str:
        if not os.path.isabs(path):
            return os.path.normpath(os.path.join(here, path))
        below = _below(path, old_root) if old_root is not None else None
        return path if below is None else os.path.normpath(os.path.join(here, below))

    for dotted in LOCAL_PATHS:
        found = _field(out, dotted)
        if found is not None and (dotted in relative or old_root is not None):
            node, key = found
            node[key] = _each(node[key], move)
    return out


def _old_root(root: Path | str, jobs: tp.Sequence[Record]) -> str | None:
    """Where a sweep dir that now is ``root`` was when the previous version wrote its manifest (absolute job dirs,
    no :data:`RELATIVE_KEY`), or None when it was not moved or that cannot be told. A member's own record still lies
    in its dir: the nearest ancestor ``A`` of a recorded job dir ``J`` such that ``root/(J relative to A)`` holds a
    submission record of job dir ``J`` is the old root (a few ``stat`` calls, whatever the sweep's size)."""
    for rec in jobs:
        job_dir = rec.get("job_dir")
        if RELATIVE_KEY in rec or not isinstance(job_dir, str) or not os.path.isabs(job_dir):
            continue
        if _below(job_dir, root) is not None:
            return None
        for above in Path(job_dir).parents:
            there = record_path(Path(root) / Path(job_dir).relative_to(above))
            if there.is_file() and (_read_json(there) or {}).get("job_dir") == job_dir:
                return str(above)
        return None
    return None


def write_record(sub: Submission[tp.Any]) -> Path:
    """Save ``sub.record()`` as the job's ``launch/submission.json`` (its paths relative to the job dir:
    :func:`stored`)."""
    job_dir = sub.plan.job.job_dir
    return _write_json(record_path(job_dir), stored(sub.record(), job_dir))


def read_record(run_dir: Path | str) -> Record | None:
    """The job's submission record, its paths as they are now (:func:`placed`: the job dir is ``run_dir`` as
    named, wherever it was when the record was written); None when it has none (nothing submitted there) or it
    cannot be read."""
    value = _read_json(record_path(run_dir))
    if not isinstance(value, dict):
        return None
    job_dir = value.get("job_dir")
    old = job_dir if RELATIVE_KEY not in value and isinstance(job_dir, str) and os.path.isabs(job_dir) else None
    return placed(value, run_dir, old)


def read_manifest(sweep_dir: Path | str) -> Record | None:
    """``launch/manifest.json`` of ``sweep_dir``, its jobs' paths as they are now (:func:`placed`), or None when
    there is none (or it cannot be read)."""
    value = _read_json(manifest_path(sweep_dir))
    if not isinstance(value, dict):
        return None
    jobs = value.get("jobs")
    if isinstance(jobs, list):
        jobs = [r for r in jobs if isinstance(r, dict)]
        old = _old_root(sweep_dir, jobs)
        value["jobs"] = [placed(r, sweep_dir, old) for r in jobs]
    return value


def _same_dir(path: tp.Any) -> str:
    return os.path.realpath(str(path))


def write_manifest(sweep_dir: Path, subs: tp.Sequence[Submission[tp.Any]],
                   extra: tp.Mapping[str, tp.Mapping[str, tp.Any]] | None = None,
                   sweep: tp.Callable[[Record], Record] | None = None) -> Path:
    """``launch/manifest.json`` in the sweep dir: one record per job (plus ``extra[job_dir]``), merged with the
    records already there (a sweeper may launch a sweep in several batches: Hydra's ``max_batch_size``; a resume
    runs some members again), for ``automodel-hydra status|logs|cancel|report|resume``; paths relative to the sweep
    dir (:func:`stored`). The sweep's own fields there are kept, updated with ``sweep(manifest there)`` (its
    definition: :func:`automodel_hydra.resume.manifest_fields`)."""
    data = read_manifest(sweep_dir) or {}
    try:
        jobs: dict[str, Record] = {_same_dir(r["job_dir"]): r for r in data.get("jobs", [])}
    except (KeyError, TypeError):
        data, jobs = {}, {}
    jobs.update({_same_dir(s.plan.job.job_dir): {**s.record(), **(extra or {}).get(str(s.plan.job.job_dir), {})}
                 for s in subs})
    out: Record = {"jobs": [stored(r, sweep_dir) for r in jobs.values()],
                   **{k: v for k, v in data.items() if k != "jobs"}}
    out.update(sweep(data) if sweep is not None else {})
    return _write_json(manifest_path(sweep_dir), out)


def manifest_jobs(sweep_dir: Path | str) -> list[Record]:
    """The job records of the sweep's manifest (:func:`read_manifest`); [] without one."""
    jobs = (read_manifest(sweep_dir) or {}).get("jobs")
    return list(jobs) if isinstance(jobs, list) else []


def load(root: Path | str) -> list[Record]:
    """The submission records of a run or sweep dir, their paths as they are now (:func:`placed`): its manifest's,
    its own record, or (a sweep without a manifest) its members' ``*/launch/submission.json``; [] when it has none.
    Unordered."""
    root = Path(root)
    if manifest_path(root).is_file():
        return manifest_jobs(root)
    if record_path(root).is_file():
        return [r for r in [read_record(root)] if r is not None]
    found = (read_record(p.parent.parent) for p in root.glob(f"*/{LAUNCH_DIR}/{RECORD_FILE}"))
    return [r for r in found if r is not None]


def is_sweep_dir(d: Path | str) -> bool:
    """Whether ``d`` holds a sweep's manifest."""
    return manifest_path(d).is_file()


def newest_record_mtime(d: Path | str, sweep: bool) -> float | None:
    """mtime of ``d``'s launch record (a sweep without a manifest: its newest job record), None without one."""
    paths = [manifest_path(d), record_path(d)]
    if sweep:
        paths += list(Path(d).glob(f"*/{LAUNCH_DIR}/{RECORD_FILE}"))
    times = [p.stat().st_mtime for p in paths if p.is_file()]
    return max(times) if times else None


#: ``launch/<file>`` names that mark a run's or a sweep's dir (for :mod:`automodel_hydra.snapshot`).
MARKERS = (("launch", MANIFEST_FILE), ("launch", RECORD_FILE))


# ----------------------------------------------------------------------------------------------- the run lock


def lock_path(job_dir: Path | str) -> Path:
    """``<job_dir>/launch/lock``."""
    return launch_dir(job_dir) / LOCK_FILE


def take_lock(job_dir: Path) -> int:
    """Take the job dir's run lock (``flock`` on ``launch/lock``) and return its fd; the job's processes inherit
    it, so the lock lives exactly as long as they do, whoever started them.

    Raises SubmitError naming the dir and the holder's pid when another run is using this dir (two runs writing
    one ``checkpoints/`` and ``metrics.jsonl`` would corrupt both)."""
    path = lock_path(job_dir)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o666)  # the umask decides who else may lock it (a team dir)
    except PermissionError:
        raise SubmitError(_not_yours(job_dir, path)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
        by = "" if os.fstat(fd).st_uid == os.getuid() else f" of user {_owner(path)}"
        os.close(fd)
        raise SubmitError(f"{job_dir} is in use by another run{by} (pid {holder}); wait for it, cancel it "
                          f"(automodel-hydra cancel {job_dir}), or choose another hydra.run.dir") from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    return fd


def locked(job_dir: Path | str) -> bool:
    """Whether a run holds the job dir's lock right now (no pid guessing: a recycled pid cannot fool it). Raises
    SubmitError when this user may not open it."""
    path = lock_path(job_dir)
    if not path.exists():
        return False
    try:
        fd = os.open(path, os.O_RDONLY)
    except PermissionError:
        raise SubmitError(_not_yours(Path(job_dir), path)) from None
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def _owner(path: Path) -> str:
    """The user name owning ``path`` (its uid when the name is unknown here)."""
    import pwd

    try:
        uid = path.stat().st_uid
    except OSError:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _not_yours(job_dir: Path, lock: Path) -> str:
    """The one line for a run dir whose run lock this user may not open: whose it is, busy or not, and the fix."""
    owner = _owner(lock)
    busy = ""
    try:
        with lock.open("rb") as f:  # readable but not writable: ask whether a run holds it
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_SH | fcntl.LOCK_NB)
            except BlockingIOError:
                busy = " and a run of theirs is using it"
    except OSError:
        pass
    return (f"{job_dir} belongs to user {owner}{busy} ({lock} is not writable for you); choose another "
            "hydra.run.dir, or ask them to share it (a group dir written under umask 002)")


def refuse_if_busy(jobs: tp.Sequence[JobSpec]) -> None:
    """Refuse a job dir whose earlier job has not finished, on any backend (a pending Slurm job, a SkyPilot job,
    a local run), before anything in it is rewritten: its run lock, then one state query per backend for all of
    ``jobs`` whose backend's jobs do not hold the lock (:attr:`~automodel_hydra.plan.Backend.holds_run_lock`; one
    ``sacct`` for a relaunched 1000-job sweep). Raises PreflightError naming the dir, the job and the fix."""
    from automodel_hydra import backends

    earlier: dict[str, list[tuple[JobSpec, Record]]] = {}
    for job in jobs:
        if locked(job.job_dir):
            raise PreflightError(f"{job.job_dir} is in use by a running job; wait for it, cancel it "
                                 f"(automodel-hydra cancel {job.job_dir}), or choose another hydra.run.dir")
        record = read_record(job.job_dir)
        if record is not None and "backend" in record:
            earlier.setdefault(record["backend"], []).append((job, record))
    for name, held in earlier.items():
        try:
            impl = backends.get(name)
            if impl.holds_run_lock:  # the run lock above is the whole truth for its jobs
                continue
            infos = impl.states([impl.ref_from_record(record) for _, record in held])
        except Exception:
            continue
        for (job, record), info in zip(held, infos):
            if info.state in (JobState.PENDING, JobState.RUNNING):
                raise PreflightError(f"{job.job_dir} holds {name} job {','.join(record.get('job_ids') or [])}, "
                                     f"still {info.state.value}; wait for it, cancel it (automodel-hydra cancel "
                                     f"{job.job_dir}), or choose another hydra.run.dir")


def dry_run_dir(overrides: tp.Sequence[str], sweep: bool) -> Path | None:
    """The dir a dry run on this command line writes, when the line says both (``dry_run=true`` and a literal
    ``hydra.run.dir=D``, ``hydra.sweep.dir=D`` with ``-m``; the last of each wins), else None: what
    :func:`refuse_dry_run_over` can ask before Hydra writes its ``.hydra/`` there. Pure."""
    values: dict[str, str] = {}
    for override in overrides:
        key, eq, value = override.lstrip("+").partition("=")
        if eq:
            values[key] = value.strip("'\"")
    where = values.get("hydra.sweep.dir" if sweep else "hydra.run.dir")
    if values.get("dry_run", "").lower() not in ("true", "yes", "on") or not where or "$" in where:
        return None
    return Path(os.path.expanduser(where))


def refuse_dry_run_over(jobs: tp.Sequence[JobSpec], sweep_dir: Path | None = None) -> None:
    """Refuse a dry run (``dry_run=true``) whose dir holds a submitted run or sweep (its ``launch/submission.json``
    or ``launch/manifest.json``), before anything of ours is written: a dry run writes its own launch files
    (``job.yaml``, ``sbatch.sh``, ...), and over a run's they would describe another config than its result. Raises
    PreflightError naming the dir, the record and the way out (another ``hydra.run.dir`` / ``hydra.sweep.dir``)."""
    key = "hydra.sweep.dir" if sweep_dir is not None else "hydra.run.dir"
    held = [(d, p) for d in ([sweep_dir] if sweep_dir is not None else []) + [Path(j.job_dir) for j in jobs]
            for p in (manifest_path(d), record_path(d)) if p.is_file()]
    if held:
        where, record = held[0]
        what = "sweep" if record.name == MANIFEST_FILE else "run"
        raise PreflightError(f"dry_run=true into {where}, which holds a submitted {what} ({record}): a dry run "
                             "writes launch files and would replace that run's, so nothing was written; give the "
                             f"dry run a dir of its own ({key}=...), or drop dry_run=true to launch there")


# ----------------------------------------------------------------------------------------------- a user's cancel


@dataclasses.dataclass(frozen=True)
class Cancel:
    """A user's cancel of a job's current launch (``launch/cancel.json``).

    ``by``: who sent it (``automodel-hydra cancel``, a sweep's ``max_failures`` stop; None: a stop of the
    launching command); ``job_ids``: the scheduler's ids it was sent for; ``was``: the job's state then; ``how``:
    how a local job's processes ended (``ended within the 30 s grace time``, ``killed after 30 s: rank 1 (pid
    12)``), None until they have."""

    by: str | None = None
    job_ids: tuple[str, ...] = ()
    was: str | None = None
    how: str | None = None


def write_cancel(launch: Path | str, job_ids: tp.Sequence[str] = (), was: JobState | None = None,
                 by: str | None = None, how: str | None = None) -> Path:
    """Record a cancel of the job whose launch dir is ``launch``, for its current launch (``launch/run_id``): a
    field given here replaces the one recorded, the others stay (a local job's stop records how its processes
    ended, ``automodel-hydra cancel`` then who sent it). What we sent is what is known: Slurm keeps no record of a
    pending array task cancelled before it started. Written atomically; a later launch of the dir (another run
    id) is not covered by it."""
    launch = Path(launch)
    run_id = read_run_id(launch)
    earlier = read_cancel(launch)
    now = earlier or Cancel()
    now = Cancel(by or now.by, tuple(str(i) for i in job_ids) or now.job_ids, was.value if was else now.was,
                 how or now.how)
    return _write_json(launch / CANCEL_FILE, {"job_ids": list(now.job_ids), "was": now.was, "run_id": run_id,
                                              "by": now.by, "how": now.how}, indent=None)


def read_cancel(launch: Path | str) -> Cancel | None:
    """The cancel recorded for the job's current launch (:func:`write_cancel`), or None. An old local job's
    ``launch/cancelled`` mark (:data:`OLD_CANCEL_MARK`) reads as a cancel whose ``how`` is its text."""
    launch = Path(launch)
    rec = _read_json(launch / CANCEL_FILE)
    try:
        old = Cancel(how=(launch / OLD_CANCEL_MARK).read_text().strip() or None)
    except OSError:
        old = None
    if not isinstance(rec, dict):
        return old
    if rec.get("run_id") != read_run_id(launch):
        return None
    return Cancel(rec.get("by"), tuple(str(i) for i in rec.get("job_ids") or ()), rec.get("was"),
                  rec.get("how") or (old.how if old is not None else None))


def clear_cancel(launch: Path | str) -> None:
    """Remove the job's cancel record (a rerun of a local job in the same dir starts uncancelled)."""
    for name in (CANCEL_FILE, OLD_CANCEL_MARK):
        (Path(launch) / name).unlink(missing_ok=True)


def cancel_note(job_dir: Path, job_ids: tp.Sequence[str]) -> str | None:
    """The note for ``job_ids`` of this launch that our cancel covers and the scheduler cannot tell about, or None
    when this launch sent no cancel of them (:func:`read_cancel`)."""
    rec = read_cancel(launch_dir(job_dir))
    if rec is None or not set(job_ids) <= set(rec.job_ids):
        return None
    return (f"cancelled with {rec.by or 'automodel-hydra cancel'} while {rec.was or 'PENDING'}; the "
            "scheduler keeps no record of it")


def stable_tracker_id(launch_dir: Path) -> str:
    """The id in ``launch_dir/tracker_id`` (a job's or a sweep's), or a fresh one (:func:`new_run_id`'s form) when
    there is none yet; writes nothing (:func:`write_tracker_id` does, with the launch's files)."""
    try:
        found = (Path(launch_dir) / TRACKER_ID_FILE).read_text().strip()
    except OSError:
        found = ""
    return found or new_run_id()


def write_tracker_id(launch_dir: Path, value: str) -> None:
    """Write ``launch_dir/tracker_id`` unless it holds ``value`` already (atomically: tmp + replace)."""
    path = Path(launch_dir) / TRACKER_ID_FILE
    try:
        if path.read_text().strip() == value:
            return
    except OSError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{TRACKER_ID_FILE}.{os.getpid()}")
    tmp.write_text(value + "\n")
    os.replace(tmp, path)
