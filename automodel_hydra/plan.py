"""The backend contract: what planning produces, what submitting consumes, and the one interface every backend
implements (:class:`Backend`).

A launch goes through these steps, in this order, for one job or a whole sweep (:mod:`automodel_hydra.driver`):

1. ``preflight(cfgs) -> facts`` — every check that needs this machine (a mount source, a variable of the
   submitting shell, a cluster limit); a dry run runs it too. It returns the facts it read (``MaxArraySize``, the
   devices here, a bucket name), the backend's own typed value, and keeps nothing on the backend instance.
2. ``plan(cfg, job, facts) -> Plan`` — pure: config and facts in, the exact files and a typed request out; no
   cloud SDK import, no subprocess, no filesystem read. ``check(plans)`` then runs what needs the planned result
   and an SDK (SkyPilot's own schema).
3. ``batches(plans, sweep_dir, facts) -> [Batch]`` — pure: the plans grouped the way they are submitted (one Slurm job
   array per group of shared options; one torchrun group or SkyPilot task per job), with every file the launch
   leaves behind rendered once. The driver writes them; a dry run stops here.
4. ``submit(batch) -> [Submission]`` — the side effect; writes nothing that planning wrote, so a dry run and a
   real run leave byte-identical launch files.
5. ``wait(subs)``, ``states(refs)`` (batched: one scheduler query for any number of jobs), ``cancel(refs)``.

Job references are typed per backend (a Slurm job id, a SkyPilot managed job or cluster job, a local job dir)
and saved as ``launch/submission.json`` (:mod:`automodel_hydra.records`); ``ref_from_record`` reads them back for
``automodel-hydra``.
"""

from __future__ import annotations

import abc
import dataclasses
import datetime
import json
import os
import pickle
import typing as tp
import uuid
from pathlib import Path

from automodel_hydra.schema import UserError
from automodel_hydra.states import JobState, StateInfo

if tp.TYPE_CHECKING:
    from automodel_hydra.config import TrainConfig

#: The dir of a job (or of a sweep) that holds what launching it wrote: the plan's files, the rank-side spec, the
#: submission record (a sweep's: its manifest and array scripts). :func:`launch_dir`; ``JobSpec``'s properties name
#: each file, so these names live here only.
LAUNCH_DIR = "launch"
#: The rank-side spec every rank reads (``launch/job.yaml``).
JOB_FILE = "job.yaml"
#: A local job's torchrun group's pid. (The run dir's records, the run lock and a cancel's record are
#: :mod:`automodel_hydra.records`'.)
PID_FILE = "pid"
#: The file rank 0 writes when a job completes (its final metrics); its presence means "completed".
RESULT_FILE = "result.json"
#: A call job's pickled Hydra call (``launch/call.pkl``) and the pickled JobReturn its process writes back: as
#: ``call_result.pkl`` when the task function returned (its presence means "completed", as ``result.json``'s does),
#: as ``call_error.pkl`` when it raised.
CALL_FILE = "call.pkl"
CALL_RESULT_FILE = "call_result.pkl"
CALL_ERROR_FILE = "call_error.pkl"
#: ``launch/run_id``: the id of the launch that last submitted the job, written by the driver just before it
#: submits; the job echoes it in what it writes back (``result.json``'s ``run_id``, a call result's header), so
#: that whether the job completed *this* launch is read from what the job wrote, never from two machines' clocks.
RUN_ID_FILE = "run_id"
#: ``launch/tracker_id``: the job's own id for experiment trackers, made the first time its dir is planned and kept
#: by every later launch of that dir (a relaunch, a sweep's resume), so that a job is one tracker run for its whole
#: life (:func:`tracker_env`); a sweep dir's ``launch/tracker_id`` is the sweep's, its members' run group.
TRACKER_ID_FILE = "tracker_id"
#: What the ranks get from it (W&B's environment variables, read by ``wandb.init`` when it is given no ``id=``,
#: ``resume=``, ``group=``): the job's id, ``allow`` (resume the run of that id when it exists, else create it: the
#: same run across in-job restarts, requeues, spot recoveries and relaunches) and, for a sweep's members, the sweep.
TRACKER_VARS = {"id": "WANDB_RUN_ID", "resume": "WANDB_RESUME", "group": "WANDB_RUN_GROUP"}

RequestT = tp.TypeVar("RequestT")
RefT = tp.TypeVar("RefT")
FactsT = tp.TypeVar("FactsT")


def launch_dir(run_dir: Path | str) -> Path:
    """``<run_dir>/launch``: a job's (:attr:`JobSpec.launch_dir`) or a sweep's launch dir."""
    return Path(run_dir) / LAUNCH_DIR


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One Hydra job: where it lives, how its ranks find their config, and what Hydra asks of its environment.

    All paths are absolute. ``env`` is Hydra's ``hydra.job.env_set`` (every rank gets it); ``workdir`` is where
    ranks start (the job dir under ``hydra.job.chdir=true``, else the launching dir).

    Two kinds of job: a *recipe* job (``call`` is None), whose ranks run :mod:`automodel_hydra.worker` on
    ``launch/job.yaml``; and a *call* job, one process that runs a Hydra task function not declared
    ``@launchable`` (any Hydra app): ``call`` is the pickled call (:mod:`automodel_hydra.call`), written as
    ``launch/call.pkl``; Hydra's own ``run_job`` in that process applies ``env_set`` and ``chdir`` itself."""

    job_dir: Path
    job_name: str
    overrides: tuple[str, ...] = ()
    job_num: int | None = None  # position in a sweep; None for a single run
    env: tuple[tuple[str, str], ...] = ()
    workdir: Path | None = None
    project_root: Path = Path(__file__).resolve().parents[1]
    #: a call job's pickled Hydra call (bytes of ``launch/call.pkl``); None for a recipe job
    call: bytes | None = dataclasses.field(default=None, repr=False, compare=False)
    #: where the launch's code snapshot goes (:mod:`automodel_hydra.snapshot`): ``<launch dir>/code`` of the run,
    #: or of the sweep dir for a sweep's jobs (one snapshot shared by them); set by ``driver.launch``
    code_dir: Path | None = None
    #: the job's ``launch/tracker_id`` and, for a sweep's member, the sweep's (:data:`TRACKER_ID_FILE`); set by
    #: ``driver.launch``
    tracker_id: str | None = None
    tracker_group: str | None = None

    @property
    def launch_dir(self) -> Path:
        return launch_dir(self.job_dir)

    @property
    def call_file(self) -> Path:
        """A call job's pickled call (``launch/call.pkl``)."""
        return self.launch_dir / CALL_FILE

    @property
    def job_file(self) -> Path:
        """The rank-side spec every rank reads (``launch/job.yaml``)."""
        return self.launch_dir / JOB_FILE

    @property
    def log_file(self) -> Path:
        """The job log (Hydra's ``<job_name>.log``); rank 0 appends to it."""
        return self.job_dir / f"{self.job_name}.log"

    @property
    def result_file(self) -> Path:
        """What a job writes when it ends with a result: rank 0's ``result.json`` in the job dir; for a call job
        its process's pickled JobReturn (``launch/call_result.pkl``), written when the task function returned."""
        return self.launch_dir / CALL_RESULT_FILE if self.call is not None else self.job_dir / RESULT_FILE

    @property
    def call_error_file(self) -> Path:
        """A call job's pickled JobReturn when its task function raised (``launch/call_error.pkl``)."""
        return self.launch_dir / CALL_ERROR_FILE

    @property
    def pid_file(self) -> Path:
        """A local job's torchrun group pid (``launch/pid``)."""
        return self.launch_dir / PID_FILE

    @property
    def run_id_file(self) -> Path:
        """``launch/run_id`` (:data:`RUN_ID_FILE`)."""
        return self.launch_dir / RUN_ID_FILE

    @property
    def tracker_id_file(self) -> Path:
        """``launch/tracker_id`` (:data:`TRACKER_ID_FILE`)."""
        return self.launch_dir / TRACKER_ID_FILE


def tracker_env(job: JobSpec) -> tuple[tuple[str, str], ...]:
    """The variables every rank of ``job`` gets for its tracker run (:data:`TRACKER_VARS`): ``WANDB_RUN_ID`` =
    the job's id, ``WANDB_RESUME=allow``, and ``WANDB_RUN_GROUP`` = the sweep's id for a sweep's member; none
    before ``driver.launch`` has given the job its id. The backends put them before ``hydra.job.env_set`` and
    their own ``env_vars``, which therefore win, as does an explicit ``wandb.init(id=...)`` (AutoModel's
    ``wandb.id``); the submitting shell's own ``WANDB_RUN_ID`` does not (docs/outputs.md, "One tracker run")."""
    if job.tracker_id is None:
        return ()
    out = [(TRACKER_VARS["id"], job.tracker_id), (TRACKER_VARS["resume"], "allow")]
    if job.tracker_group is not None:
        out.append((TRACKER_VARS["group"], job.tracker_group))
    return tuple(out)


def worker_argv(job: JobSpec, python: str = "python", spec_file: str = JOB_FILE, started_by: str | None = None,
                scheduler: str | None = None) -> list[str]:
    """The command every rank runs: ``python -u -m automodel_hydra.worker <launch/job.yaml> --log-file <log>``
    (``spec_file``: another spec in the launch dir, e.g. one planned with another machine's paths), plus who starts
    the rank and under which scheduler (``--started-by``, ``--scheduler``: :data:`automodel_hydra.bootstrap.
    STARTERS`, :data:`~automodel_hydra.bootstrap.SCHEDULERS`), so that no rank guesses it from its environment."""
    return [python, "-u", "-m", "automodel_hydra.worker", str(job.launch_dir / spec_file), "--log-file",
            str(job.log_file), *(["--started-by", started_by] if started_by else []),
            *(["--scheduler", scheduler] if scheduler else [])]


def attempt_name(restart: int, requeue: int = 0) -> str:
    """``attempt<restart>`` (the in-job restart count), ``requeue<n>.attempt<restart>`` after a Slurm requeue: how
    a per-attempt file is named, so that no attempt's hang record, end, error file or report replaces another's."""
    return (f"requeue{requeue}." if requeue else "") + f"attempt{restart}"


def call_argv(job: JobSpec, python: str = "python") -> list[str]:
    """The command of a call job's one process: ``python -u -m automodel_hydra.call <launch/call.pkl>``."""
    return [python, "-u", "-m", "automodel_hydra.call", str(job.call_file)]


@dataclasses.dataclass(frozen=True)
class Plan(tp.Generic[RequestT]):
    """A planned job: its files under ``launch/`` and the backend's typed request."""

    backend: str
    job: JobSpec
    #: file name under ``launch/`` -> text, e.g. ``{"sbatch.sh": ...}`` or ``{"sky_task.yaml": ...}``
    files: tp.Mapping[str, str]
    request: RequestT
    #: whether the launching command waits for the job (interactive: always; Slurm/SkyPilot: as configured)
    wait: bool = True
    #: options of the whole launch that jobs must share to be submitted together (e.g. array parallelism)
    group_key: tp.Hashable = None
    #: the name the scheduler knows the job by (sbatch ``--job-name``, SkyPilot's task name); None: Hydra's job name
    name: str | None = None


def render_files(files: tp.Mapping[Path, str]) -> str:
    """Files, each under a ``# ---- <path>`` header (what a dry run prints)."""
    return "\n".join(f"# ---- {path}\n{text.rstrip()}\n" for path, text in files.items())


@dataclasses.dataclass(frozen=True)
class Batch(tp.Generic[RequestT]):
    """Plans submitted in one call (one job, or a Slurm job array) and every file the launch writes for them."""

    plans: tuple[Plan[RequestT], ...]
    #: absolute path -> text: each job's launch files, plus the batch's own (e.g. the sweep's array script)
    files: tp.Mapping[Path, str]
    #: the sweep's ``max_failures`` (:mod:`automodel_hydra.sweep_policy`), for a backend that starts its members
    #: itself (``Backend.stops_after_failures``); None: never stop
    max_failures: int | None = None


def job_batch(plan: Plan[RequestT]) -> Batch[RequestT]:
    """The batch of one job: its own launch files."""
    return Batch((plan,), {plan.job.launch_dir / name: text for name, text in plan.files.items()})


@dataclasses.dataclass
class Submission(tp.Generic[RefT]):
    """A submitted or started job and the backend's typed reference to it."""

    plan: Plan[tp.Any]
    ref: RefT
    log_path: str | None = None
    #: the code the job runs, when the backend snapshotted it (``snapshot.Source.record``: mode, commit, dirty)
    code: tp.Mapping[str, tp.Any] | None = None
    #: the job's rank error files before it was submitted (:func:`error_stamps`), so that
    #: :func:`rank_error` quotes only this launch's; not part of the record
    error_stamps: tp.Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def ids(self) -> list[str]:
        """The scheduler's ids, for people: Slurm job ids, SkyPilot job ids, local pids."""
        ids = getattr(self.ref, "ids", None)
        return list(ids) if ids else []

    def record(self) -> dict[str, tp.Any]:
        """The JSON record saved as ``launch/submission.json``: backend, typed reference, overrides, paths."""
        ref = dataclasses.asdict(self.ref) if dataclasses.is_dataclass(self.ref) else {}  # type: ignore[arg-type]
        return {
            "backend": self.plan.backend,
            "ref": ref,
            "job_ids": self.ids,
            "job_name": self.plan.name or self.plan.job.job_name,  # as squeue / sky queue show it
            "log_name": self.plan.job.job_name,  # Hydra's job name: the job log is <job_dir>/<log_name>.log
            "job_num": self.plan.job.job_num,
            "overrides": list(self.plan.job.overrides),
            "job_dir": str(self.plan.job.job_dir),
            "log_path": self.log_path,
            "run_id": read_run_id(self.plan.job.launch_dir),
            "files": [str(self.plan.job.launch_dir / n) for n in self.plan.files],
            **({"code": dict(self.code)} if self.code is not None else {}),
            "submitted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }


@dataclasses.dataclass
class JobResult:
    """How a job ended. ``value`` is the recipe's final metrics (rank 0's ``result.json``) when it completed."""

    state: JobState
    value: tp.Any = None
    error: str | None = None
    #: a stopped job: how its processes ended (a local job: ``ended within the 30 s grace time``, ``killed after
    #: 30 s: rank 1 (pid 12), ...``, ``never started``), for the stop line
    stop: str | None = None
    #: a failed job: the first failed rank's traceback (its error file), shown once above the command's last line
    traceback: str | None = None

    @property
    def ok(self) -> bool:
        return self.state.ok


class JobFailedError(RuntimeError):
    """A launched job ended in a state other than COMPLETED; the message has its state, ids and log path."""


class JobStoppedError(JobFailedError):
    """A waited-for job ended CANCELLED: someone stopped it (``automodel-hydra cancel``, ``scancel``, ``sky
    cancel``), which is not a failure. The message is the stop line's text (:func:`stop_line`)."""


def stop_line(stopped: tp.Sequence[str], running: tp.Sequence[str], where: Path | str, checkpoint: str) -> str:
    """The one line every stop ends with, for every launcher and every way of stopping (Ctrl-C, ``cancel`` from
    another shell, ``scancel``); the command prints it after ``stopped: `` (never ``error:``: a stop is no error).

    ``stopped``: what stopped, e.g. ``["interactive job 6324 (cancelled)"]``; ``running``: what keeps running,
    e.g. ``["slurm job 42"]`` (then the line names the command that cancels it, for the run or sweep dir
    ``where``); ``checkpoint``: where the newest checkpoint is. Parts are joined with ``"; "``."""
    parts = [", ".join(stopped)] if stopped else []
    if running:
        verb = "keeps" if len(running) == 1 else "keep"
        parts.append(f"{', '.join(running)} {verb} running: cancel with automodel-hydra cancel {where}")
    return "; ".join([*parts, checkpoint])


class PreflightError(UserError, RuntimeError):
    """This machine cannot submit the planned jobs (a tool, a file or a variable is missing); one line saying
    what is missing and how to fix it."""


class SubmitError(RuntimeError):
    """Submitting failed after every check passed: the scheduler refused the job (``sbatch``'s or SkyPilot's own
    message), or the job dir is held by another run. One line, exit status 1 (:data:`driver.LAUNCH_ERRORS`)."""


class SchedulerUnreachable(RuntimeError):
    """Waiting for submitted jobs ended before they did: their scheduler could not be asked for longer than the
    launch allows (a dropped SSH connection to the login node that did not come back). The jobs are still
    submitted, their records unchanged; the one line names them and the commands that follow them. Exit status 1
    (:data:`driver.LAUNCH_ERRORS`), never the config-error status."""


class Backend(abc.ABC, tp.Generic[RequestT, RefT, FactsT]):
    """One launcher backend, generic over its typed request, its job reference and the facts its preflight reads.
    Subclasses: ``backends.interactive.Interactive``, ``backends.slurm.Slurm``, ``backends.skypilot.SkyPilot``;
    :func:`automodel_hydra.backends.get` returns one by name.

    ``facts=None`` in :meth:`world_size`, :meth:`plan` and :meth:`batches` means "planned without a preflight"
    (tests of planning alone): a backend whose planning needs none plans as usual; SkyPilot refuses."""

    #: the backend's name, as in ``launch/submission.json`` and ``launcher=NAME``
    name: tp.ClassVar[str]
    #: the setting that decides whether a sweep's jobs are waited for, as ``(key, the value that waits)``
    #: (``("slurm.detach", False)``); None: they always are
    wait_setting: tp.ClassVar[tuple[str, bool] | None] = None
    #: whether the backend starts a batch's members itself and honours ``Batch.max_failures`` as they end (the
    #: local queue); else the waiting side cancels what is still pending (:func:`automodel_hydra.sweep_policy.watch`)
    stops_after_failures: tp.ClassVar[bool] = False
    #: whether the ranks write on this machine's filesystem or one it shares (a local job; a Slurm job's, shared or
    #: copied back): their records (``result.json``, ``launch/ranks/``, error files) are in the job dir here, for
    #: :mod:`automodel_hydra.outcome`, its checkpoints are where the stop line looks, and two jobs of a sweep that
    #: name one dir would write the same files; False: each job writes on its own nodes or bucket prefix (SkyPilot)
    ranks_write_job_dir: tp.ClassVar[bool] = True
    #: whether the jobs' processes hold their dir's run lock while they can still start or run (a local job): a free
    #: lock says the job is over (:func:`automodel_hydra.records.refuse_if_busy`); else :meth:`states` is asked
    holds_run_lock: tp.ClassVar[bool] = False
    #: whether the ranks are this machine's processes in this Python (torchrun here): what they import (the recipe,
    #: a ``_target_``) is checked here first; else the ranks import it where they run (``driver.check_recipe``)
    ranks_import_here: tp.ClassVar[bool] = False
    #: seconds between two polls of the jobs' states while a sweep is waited for (its progress line)
    poll_s: tp.ClassVar[float] = 15.0

    @abc.abstractmethod
    def preflight(self, cfgs: tp.Sequence[TrainConfig]) -> FactsT:
        """Checks that need this machine, for every job about to be planned; returns the facts planning needs
        (kept nowhere else). Raises PreflightError or ConfigError (one line) when they cannot be submitted here."""

    @abc.abstractmethod
    def world_size(self, cfg: TrainConfig, facts: FactsT | None = None) -> int:
        """How many ranks the job runs (for the rules of :func:`automodel_hydra.config.check_world`)."""

    @abc.abstractmethod
    def plan(self, cfg: TrainConfig, job: JobSpec, facts: FactsT | None = None) -> Plan[RequestT]:
        """Plan one job (pure). Raises ConfigError naming the key when a value cannot be planned."""

    def time_limit_minutes(self, cfg: TrainConfig) -> int | None:
        """The job's wall-clock limit in minutes (Slurm's ``--time``, sbatch(1)), for the warnings that compare it
        with the work asked (a long profile); None where the launcher sets none (default)."""
        return None

    def pending_note(self, reason: str) -> str:
        """A pending job's reason as ``automodel-hydra status`` shows it: flagged, with the keys at fault, where it
        means the job will not start as submitted; default: as the scheduler says it."""
        return reason

    def env_vars(self, cfg: TrainConfig) -> tp.Mapping[str, str]:
        """The variables the launcher section gives every rank, as written (``slurm.env_vars``); {} by default."""
        return {}

    @abc.abstractmethod
    def ranks_see_local_files(self, cfg: TrainConfig) -> bool:
        """Whether the job's ranks see this machine's filesystem as it is here (torchrun on this node, Slurm
        without a container on a shared filesystem), so that what they will read can be checked here before
        anything starts: a model to fetch, a checkpoint to resume from. False where they run on other disks
        (SkyPilot nodes) or in a container (its own paths and mounts)."""

    def check(self, plans: tp.Sequence[Plan[RequestT]]) -> None:
        """Checks of the planned jobs that need this machine or the backend's SDK (SkyPilot's own task schema);
        run before anything is written. Raises an error naming the field."""

    def batches(self, plans: tp.Sequence[Plan[RequestT]], sweep_dir: Path | None,
                facts: FactsT | None = None) -> list[Batch[RequestT]]:
        """Group plans the way they are submitted (pure); default: one batch per job."""
        return [job_batch(p) for p in plans]

    @abc.abstractmethod
    def submit(self, batch: Batch[RequestT]) -> list[Submission[RefT]]:
        """Submit or start one batch; returns one submission per plan, in order, without waiting."""

    @abc.abstractmethod
    def wait(self, subs: tp.Sequence[Submission[RefT]]) -> list[JobResult]:
        """Block until every job has a final state; one result per submission, in order. A backend whose jobs are
        this command's processes stops them on a stop signal (KeyboardInterrupt, :class:`~automodel_hydra.stops.
        StopRequested`) and re-raises it as a StopRequested whose ``results`` say, per job dir, how each ended; one
        whose jobs keep running without this command lets the signal through (the stop line then says they run)."""

    @abc.abstractmethod
    def states(self, refs: tp.Sequence[RefT]) -> list[StateInfo]:
        """Current state of each job, with one scheduler query for all of them where the scheduler allows."""

    @abc.abstractmethod
    def cancel(self, refs: tp.Sequence[RefT], pending_only: bool = False) -> None:
        """Cancel these jobs (a user's stop: they end CANCELLED and are not requeued); ``pending_only``: only
        those not started yet when the scheduler gets the request (a sweep stopped by ``max_failures``)."""

    @abc.abstractmethod
    def ref_from_record(self, record: tp.Mapping[str, tp.Any]) -> RefT:
        """The typed reference saved in a submission record."""

    def read_log(self, ref: RefT, log: Path, pos: int) -> tuple[int, bytes] | None:
        """The job's log from byte ``pos`` on, as ``(offset, data)`` (offset 0 when the log is shorter than ``pos``:
        replaced or truncated, read it from its start again), or None while there is none. ``log`` is the
        record's ``log_path`` here. Default: that file on this machine (:func:`read_from`)."""
        return read_from(log, pos)

    def ranks_path(self, plan: Plan[RequestT], path: Path) -> str | None:
        """Where the ranks write ``path`` when not here, as named there (``me@login:/jobs/x/ckpt``); None: here."""

    def fetch_results(self, jobs: tp.Sequence[tuple[RefT, Path, str | None]]) -> None:
        """Copy what jobs wrote where they ran (their results, metrics, logs) into their local job dirs, for
        ``(reference, local job dir, record's log_path)``; one that cannot be reached leaves the local copies as
        they are. Default: nothing (the jobs write here)."""


def read_from(path: Path | str, pos: int) -> tuple[int, bytes] | None:
    """What the file ``path`` on this machine holds from byte ``pos`` on, as ``(offset, data)``: offset 0 when it
    is shorter than ``pos`` (replaced or truncated: read from its start again); None while there is no file."""
    try:
        with Path(path).open("rb") as f:
            start = 0 if os.fstat(f.fileno()).st_size < pos else pos
            f.seek(start)
            return start, f.read()
    except (FileNotFoundError, IsADirectoryError, NotADirectoryError):
        return None


def new_run_id() -> str:
    """A fresh launch id: 16 hex digits, random (uuid4), never derived from a clock."""
    return uuid.uuid4().hex[:16]


def write_run_id(job: JobSpec, run_id: str) -> None:
    """Write ``launch/run_id`` atomically (every rank of every attempt of this launch reads the same id)."""
    job.launch_dir.mkdir(parents=True, exist_ok=True)
    tmp = job.run_id_file.with_name(f".{RUN_ID_FILE}.{os.getpid()}")
    tmp.write_text(run_id + "\n")
    os.replace(tmp, job.run_id_file)


def read_run_id(launch_dir: Path) -> str | None:
    """The launch id in ``launch_dir/run_id``; None when there is none (a job started by hand, a SkyPilot node)."""
    try:
        return (Path(launch_dir) / RUN_ID_FILE).read_text().strip() or None
    except OSError:
        return None


def result_run_id(path: Path) -> str | None:
    """The launch id a job wrote into its result: ``result.json``'s ``run_id``, or the header of a call job's
    pickled JobReturn (``call_result.pkl``/``call_error.pkl``: a dict pickled before the JobReturn). None when
    the file is missing, unreadable or carries none (written before launches had ids)."""
    try:
        if path.suffix == ".json":
            value = json.loads(path.read_text())
            return str(value["run_id"]) if isinstance(value, dict) and value.get("run_id") else None
        with path.open("rb") as f:
            header = pickle.load(f)
        return str(header["run_id"]) if isinstance(header, dict) and header.get("run_id") else None
    except (OSError, ValueError, KeyError, EOFError, pickle.UnpicklingError, AttributeError, ImportError):
        return None


def written_by_this_launch(job: JobSpec, path: Path | None = None) -> bool:
    """Whether ``path`` (default: the job's result file) was written by the job's current launch: it carries the
    launch id in ``launch/run_id``. A leftover of an earlier launch carries another id, so it is never taken for
    this one's, whatever its mtime and whatever the clocks of this host and the file server say."""
    expected = read_run_id(job.launch_dir)
    return expected is not None and result_run_id(path or job.result_file) == expected


def read_result(job: JobSpec) -> dict[str, tp.Any] | None:
    """Rank 0's final metrics (``result.json``), or None when the job has not completed. For a call job:
    ``{"call_result": <path of launch/call_result.pkl>}`` once its process wrote it (the JobReturn inside is
    unpickled by the launcher, which knows the task function's modules), else None."""
    if job.call is not None:
        return {"call_result": str(job.result_file)} if job.result_file.exists() else None
    try:
        value = json.loads(job.result_file.read_text())
    except (OSError, ValueError):
        return None
    return value if isinstance(value, dict) else {"value": value}


#: torchrun's ``--log-dir`` for a job started here: its per-rank error files land under it
#: (``<run id>_<random>/attempt_<k>/<local rank>/error.json``, torch.distributed.elastic's log layout).
TORCHRUN_LOG_DIR = "torchrun"


def _error_files(job: JobSpec) -> list[tuple[int, Path, str]]:
    """``(attempt, path, rank)`` of every rank error file the job's dir holds: torchrun's per restart attempt, and
    ``launch/error.rank<N>[.requeue<K>].json`` of ranks srun started (one per Slurm requeue ``K``)."""
    candidates = []
    for path in job.launch_dir.glob("error.rank*.json"):
        rank, _, requeue = path.name.removeprefix("error.rank").removesuffix(".json").partition(".requeue")
        candidates.append((int(requeue) if requeue.isdigit() else 0, path, rank))
    for path in job.launch_dir.glob(f"{TORCHRUN_LOG_DIR}/*/attempt_*/*/error.json"):
        n = path.parent.parent.name.removeprefix("attempt_")
        candidates.append((int(n) if n.isdigit() else 0, path, path.parent.name))
    return candidates


def error_stamps(job: JobSpec) -> dict[str, tuple[int, int]]:
    """What the job's rank error files are before a launch: path -> (mtime in ns, size), both as the file server
    reports them. :func:`rank_error` skips a file whose stamp is unchanged: one written by an earlier launch.
    Comparing a file's stamp with its own earlier stamp needs no clock of this host."""
    stamps = {}
    for _, path, _ in _error_files(job):
        try:
            st = path.stat()
        except OSError:
            continue
        stamps[str(path)] = (st.st_mtime_ns, st.st_size)
    return stamps


def rank_error(job: JobSpec, before: tp.Mapping[str, tuple[int, int]] | None = None) -> str | None:
    """The exception of the rank that failed first, ``"rank N: Type: message"`` (its first line, at most 500
    characters), or None when no rank recorded one since ``before`` (:func:`error_stamps` taken before the launch; a
    file with the same stamp is an earlier launch's; None: every file counts).

    "First" is the newest restart attempt's error file with the oldest modification time (the lowest rank on a
    tie): when one rank raises, its peers fail after it in the next collective ("Connection closed by peer",
    "NCCL communicator was aborted"), and quoting the lowest rank would hide the cause behind its consequence. The
    times compared are all the file server's, never this host's clock.

    Read from the error files torch's ``record`` writes (JSON, ``{"message": {"message": "Type: message",
    ...}}``): torchrun's under ``launch/torchrun/`` (one node, so the local rank is the rank; the newest restart
    attempt wins) and ``launch/error.rank<N>.json`` of ranks no torchrun started (Slurm's srun tasks)."""
    found = first_error(job, before)
    return None if found is None else f"rank {found[1]}: {found[2]}"


def first_error(job: JobSpec, before: tp.Mapping[str, tuple[int, int]] | None = None
                ) -> tuple[Path, int, str] | None:
    """``(path, rank, first line)`` of the error file :func:`rank_error` quotes (its rule), or None."""
    found: list[tuple[int, int, int, str, Path]] = []
    for attempt, path, rank in _error_files(job):
        try:
            st = path.stat()
            if not rank.isdigit() or (before or {}).get(str(path)) == (st.st_mtime_ns, st.st_size):
                continue
            message = json.loads(path.read_text())["message"]
            text = str(message["message"] if isinstance(message, dict) else message)
        except (OSError, ValueError, KeyError, TypeError):
            continue
        first = next((line.strip() for line in text.splitlines() if line.strip()), "")
        found.append((-attempt, st.st_mtime_ns, int(rank), first[:500], path))
    if not found:
        return None
    _, _, rank_n, first, path = min(found)
    return path, rank_n, first
