"""The run dir's records: what a launch leaves under ``launch/`` for the commands that come after it
(``automodel-hydra status|logs|cancel|report|resume``, a relaunch of the same dir), read and written here only.

* ``launch/submission.json``: a job's submission record (:meth:`automodel_hydra.plan.Submission.record`: its
  backend, typed reference, ids, overrides, paths), :func:`write_record` / :func:`read_record`;
* ``launch/manifest.json`` of a sweep dir: every member's record, plus the dirs each writes and the sweep's
  definition (for a resume), :func:`write_manifest` / :func:`read_manifest`;
* ``launch/lock``: a local job's run lock, an ``flock`` that its processes hold for as long as they live
  (:func:`take_lock`, :func:`locked`), and :func:`refuse_if_busy`, which asks it (or the job's scheduler) before a
  launch rewrites a dir;
* ``launch/cancel.json``: a user's cancel of the job, on every backend (:func:`write_cancel`, :func:`read_cancel`):
  who sent it, the ids and the state then, the launch it covers (``launch/run_id``) and, for a local job, how its
  processes ended. Run dirs written before this record was one file still read: a local job's old
  ``launch/cancelled`` mark reads as its cancel (:data:`OLD_CANCEL_MARK`).

Every record is written atomically (a temporary file, then ``os.replace``), so a reader never sees half of one.
"""

from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import typing as tp
from pathlib import Path

from automodel_hydra.plan import LAUNCH_DIR, PreflightError, SubmitError, launch_dir, read_run_id
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


def write_record(sub: Submission[tp.Any]) -> Path:
    """Save ``sub.record()`` as the job's ``launch/submission.json``."""
    return _write_json(record_path(sub.plan.job.job_dir), sub.record())


def read_record(run_dir: Path | str) -> Record | None:
    """The job's submission record; None when it has none (nothing submitted there) or it cannot be read."""
    value = _read_json(record_path(run_dir))
    return value if isinstance(value, dict) else None


def read_manifest(sweep_dir: Path | str) -> Record | None:
    """``launch/manifest.json`` of ``sweep_dir``, or None when there is none (or it cannot be read)."""
    value = _read_json(manifest_path(sweep_dir))
    return value if isinstance(value, dict) else None


def write_manifest(sweep_dir: Path, subs: tp.Sequence[Submission[tp.Any]],
                   extra: tp.Mapping[str, tp.Mapping[str, tp.Any]] | None = None,
                   sweep: tp.Callable[[Record], Record] | None = None) -> Path:
    """``launch/manifest.json`` in the sweep dir: one record per job (plus ``extra[job_dir]``), merged with the
    records already there (a sweeper may launch a sweep in several batches: Hydra's ``max_batch_size``), for
    ``automodel-hydra status|logs|cancel|report|resume``. The sweep's own fields there are kept, updated with
    ``sweep(manifest there)`` (its definition: :func:`automodel_hydra.resume.manifest_fields`)."""
    data = read_manifest(sweep_dir) or {}
    try:
        jobs: dict[str, Record] = {r["job_dir"]: r for r in data.get("jobs", [])}
    except (KeyError, TypeError):
        data, jobs = {}, {}
    jobs.update({str(s.plan.job.job_dir): {**s.record(), **(extra or {}).get(str(s.plan.job.job_dir), {})}
                 for s in subs})
    out: Record = {"jobs": list(jobs.values()), **{k: v for k, v in data.items() if k != "jobs"}}
    out.update(sweep(data) if sweep is not None else {})
    return _write_json(manifest_path(sweep_dir), out)


def manifest_jobs(sweep_dir: Path | str) -> list[Record]:
    """The job records of the sweep's manifest; [] without one."""
    jobs = (read_manifest(sweep_dir) or {}).get("jobs")
    return [r for r in jobs if isinstance(r, dict)] if isinstance(jobs, list) else []


def load(root: Path | str) -> list[Record]:
    """The submission records of a run or sweep dir: its manifest's, its own record, or (a sweep without a
    manifest) its members' ``*/launch/submission.json``; [] when it has none. Unordered."""
    root = Path(root)
    if manifest_path(root).is_file():
        return list(json.loads(manifest_path(root).read_text())["jobs"])
    if record_path(root).is_file():
        return [json.loads(record_path(root).read_text())]
    return [json.loads(p.read_text()) for p in root.glob(f"*/{LAUNCH_DIR}/{RECORD_FILE}")]


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
