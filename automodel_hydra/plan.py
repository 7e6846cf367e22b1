"""What planning produces and submitting consumes: pure data, no side effects.

Every backend module (``automodel_hydra/backends/{interactive,slurm,skypilot}.py``) has the same shape:

* ``plan(cfg: TrainConfig, job: JobSpec) -> Plan`` — pure: config in, the exact files to write and run out;
* ``submit(plans: Sequence[Plan]) -> list[Submission]`` — the side effect: start or submit the planned jobs;
* ``wait(subs: Sequence[Submission]) -> list[JobResult]`` — block until they end and collect their results;
* ``status(record: dict) -> str`` and ``cancel(record: dict) -> None`` — operate on a saved submission record.

The driver writes ``plan.files`` under the job's ``launch/`` dir before ``submit`` is called, so a dry run and a
real run leave the same files behind.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import typing as tp
from pathlib import Path

#: Slurm's job state names, used by every backend (``automodel-hydra status``).
STATES = ("PENDING", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "UNKNOWN")
#: States after which a job never runs again.
FINISHED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT")


@dataclasses.dataclass(frozen=True)
class JobSpec:
    """One Hydra job: where it lives and how its ranks find their config. All paths are absolute."""

    job_dir: Path
    job_name: str
    overrides: tuple[str, ...] = ()
    job_num: int | None = None  # position in a sweep; None for a single run
    project_root: Path = Path(__file__).resolve().parents[1]

    @property
    def launch_dir(self) -> Path:
        return self.job_dir / "launch"

    @property
    def job_file(self) -> Path:
        """The validated, resolved config every rank reads (``launch/job.yaml``)."""
        return self.launch_dir / "job.yaml"

    @property
    def log_file(self) -> Path:
        """The job log (Hydra's ``<job_name>.log``); rank 0 appends to it."""
        return self.job_dir / f"{self.job_name}.log"


def worker_argv(job: JobSpec, python: str = "python") -> list[str]:
    """The command every rank runs: ``python -m automodel_hydra.worker <job.yaml> --log-file <log>``."""
    return [python, "-u", "-m", "automodel_hydra.worker", str(job.job_file), "--log-file", str(job.log_file)]


@dataclasses.dataclass(frozen=True)
class Plan:
    """A planned job: the files that describe it exactly and the backend's private submit payload."""

    backend: str
    job: JobSpec
    #: file name under ``launch/`` -> text, e.g. ``{"sbatch.sh": ...}`` or ``{"sky_task.yaml": ...}``
    files: tp.Mapping[str, str]
    #: backend-specific data ``submit`` needs (argv and env, submitit parameters, a SkyPilot task dict)
    payload: tp.Any = None
    #: options of the whole launch that jobs must share to be submitted together (e.g. array parallelism)
    group_key: tp.Hashable = None

    def render(self) -> str:
        """Every planned file, each under a ``# launch/<name>`` header (what a dry run prints)."""
        return "\n".join(f"# ---- {self.job.launch_dir / name}\n{text.rstrip()}\n" for name, text in self.files.items())


@dataclasses.dataclass
class Submission:
    """A submitted or started job. ``ids`` are the scheduler's ids (Slurm job ids, SkyPilot job ids, pids)."""

    plan: Plan
    ids: list[str]
    log_path: str | None = None
    handle: tp.Any = None  # in-memory handle (Popen, submitit Job, SkyPilot request); not saved

    def record(self) -> dict[str, tp.Any]:
        """The small JSON record saved as ``launch/submission.json``: backend, ids, overrides, time, paths."""
        return {
            "backend": self.plan.backend,
            "job_ids": self.ids,
            "job_name": self.plan.job.job_name,
            "job_num": self.plan.job.job_num,
            "overrides": list(self.plan.job.overrides),
            "job_dir": str(self.plan.job.job_dir),
            "log_path": self.log_path,
            "files": [str(self.plan.job.launch_dir / n) for n in self.plan.files],
            "submitted_at": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        }


@dataclasses.dataclass
class JobResult:
    """How a job ended. ``value`` is the recipe's final metrics (rank 0) when it completed."""

    state: str
    value: tp.Any = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.state == "COMPLETED"


class JobFailedError(RuntimeError):
    """A launched job ended in a state other than COMPLETED; the message has its state, ids and log path."""


def write_plan_files(plan: Plan) -> list[Path]:
    """Write ``plan.files`` under ``launch/`` (the only file I/O of planning). Returns the paths written."""
    plan.job.launch_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in plan.files.items():
        path = plan.job.launch_dir / name
        path.write_text(text)
        if name.endswith(".sh"):
            path.chmod(0o755)
        paths.append(path)
    return paths


def write_record(sub: Submission) -> Path:
    """Save ``sub.record()`` as ``launch/submission.json``."""
    path = sub.plan.job.launch_dir / "submission.json"
    path.write_text(json.dumps(sub.record(), indent=2) + "\n")
    return path
