"""The task function's body on the submitting machine: validate -> plan -> write launch/ -> submit -> wait.

Runs inside a Hydra job (``python train.py``, or each job of ``-m`` under our launcher plugins). Ranks never run
this: they run :mod:`automodel_hydra.worker` with the job file written here, so only this process writes
``.hydra/`` and the job's dirs.

In a sweep our Hydra launchers plan every job first (:func:`collecting`), so a bad value in any job fails before
the first one is submitted, and then submit them together (one Slurm job array, packed local jobs, one SkyPilot
job per point) through :func:`execute`.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import logging
import sys
import typing as tp
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from automodel_hydra import backends, config, profile
from automodel_hydra.plan import JobFailedError, JobResult, JobSpec, Plan, Submission, write_plan_files, write_record

log = logging.getLogger(__name__)

#: Plans collected by a sweep launcher instead of being submitted one by one (None outside a sweep).
_COLLECTOR: contextvars.ContextVar[list[tuple[Plan, bool]] | None] = contextvars.ContextVar("automodel_plans",
                                                                                           default=None)


class Pending:
    """Stands in for a sweep job's return value until the launcher has run the job."""

    def __init__(self, plan: Plan) -> None:
        self.plan = plan

    def __repr__(self) -> str:
        return f"Pending({self.plan.job.job_dir})"


def job_spec_from_hydra() -> JobSpec:
    """This Hydra job's dir, name, overrides and sweep number."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hc = HydraConfig.get()
    return JobSpec(
        job_dir=Path(hc.runtime.output_dir).resolve(),
        job_name=hc.job.name,
        # resolve=False: an override such as '++slurm.env_vars.HF_TOKEN=${HF_TOKEN}' is text, not an interpolation
        # (edited by the Slurm backend's author: iterating the ListConfig resolved it and failed)
        overrides=tuple(OmegaConf.to_container(hc.overrides.task, resolve=False)),
        # a sweep job: Hydra's -m, or any job planned under our sweep launchers' collector
        job_num=hc.job.num if hc.mode == RunMode.MULTIRUN or _COLLECTOR.get() is not None else None,
    )


def plan_job(cfg: DictConfig, job: JobSpec | None = None) -> Plan:
    """Validate ``cfg`` and plan its job; writes ``launch/job.yaml`` and the plan's files, submits nothing.

    Raises ConfigError (naming the key) before anything is written when a value is invalid."""
    train_cfg = config.load(cfg)
    job = job or job_spec_from_hydra()
    limit = train_cfg.slurm.time_minutes if train_cfg.slurm is not None else None
    warning = profile.long_run_warning(train_cfg.profile.nsys, train_cfg.step_scheduler.max_steps, limit)
    if warning:
        log.warning(warning)
    plan = backends.get(train_cfg.backend).plan(train_cfg, job)
    if backends.get("interactive").job_running(job.job_dir):  # never rewrite the files of a job still running
        raise RuntimeError(f"{job.job_dir} is in use by a running job; wait for it, cancel it "
                           f"(automodel-hydra cancel {job.job_dir}), or choose another hydra.run.dir")
    job.launch_dir.mkdir(parents=True, exist_ok=True)
    job.job_file.write_text(yaml.safe_dump(config.to_dict(train_cfg), sort_keys=False))
    write_plan_files(plan)
    return plan


def run(cfg: DictConfig) -> tp.Any:
    """``python train.py``: plan this job, then print it (dry run), hand it to the sweep launcher, or submit it.

    Returns the final training loss when the job was waited for, else None. A bad config value exits with a
    one-line error naming the key (status 2) before anything is written or started."""
    try:
        plan = plan_job(cfg)
    except (ValueError, RuntimeError, OmegaConfBaseException) as e:  # ConfigError is a ValueError
        fail(str(e).splitlines()[0] if isinstance(e, config.ConfigError) else str(e))
    collector = _COLLECTOR.get()
    # issue 7: select, not cfg.dry_run: a plain AutoModel-style config (no defaults list) has no dry_run key
    if OmegaConf.select(cfg, "dry_run", default=False):
        print(plan.render())
        print(f"dry run: wrote {plan.job.launch_dir}; nothing was submitted or started", flush=True)
        if collector is not None:  # the sweep's own plan (e.g. one Slurm array) is written by the launcher
            collector.append((plan, True))
        return None
    if collector is not None:
        collector.append((plan, False))
        return Pending(plan)
    try:
        (sub,) = submit([plan])
        if not should_wait(plan):
            return None
        (result,) = backends.get(plan.backend).wait([sub])
        return value_or_raise(sub, result)
    except (JobFailedError, RuntimeError, OSError) as e:  # the job's own output above says the rest
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


def should_wait(plan: Plan) -> bool:
    """Interactive jobs always run in the foreground; Slurm and SkyPilot say so in their payload."""
    return bool(getattr(plan.payload, "wait", True))


def submit(plans: tp.Sequence[Plan]) -> list[Submission]:
    """Submit plans of one backend together; save each job's record and print where to look."""
    for plan in plans:  # a result left by an earlier run in the same dir must not stand for this one
        (plan.job.job_dir / "result.json").unlink(missing_ok=True)
    subs = backends.get(plans[0].backend).submit(plans)
    for sub in subs:
        write_record(sub)
        if sub.ids:
            script = sub.plan.job.launch_dir / next(iter(sub.plan.files))
            print(f"submitted {sub.plan.backend} job {','.join(sub.ids)}: script {script}, log {sub.log_path}",
                  flush=True)
    return subs


def value_or_raise(sub: Submission, result: JobResult) -> tp.Any:
    """The job's final loss, or JobFailedError with its state, ids and log path."""
    if not result.ok:
        raise JobFailedError(f"{sub.plan.backend} job {','.join(sub.ids) or sub.plan.job.job_dir} ended "
                             f"{result.state}: {result.error or ''} (log: {sub.log_path})")
    return result.value.get("loss") if isinstance(result.value, dict) else result.value


@contextlib.contextmanager
def collecting() -> tp.Iterator[list[tuple[Plan, bool]]]:
    """Within this block, :func:`run` collects ``(plan, dry_run)`` instead of submitting (sweep launchers)."""
    plans: list[tuple[Plan, bool]] = []
    token = _COLLECTOR.set(plans)
    try:
        yield plans
    finally:
        _COLLECTOR.reset(token)


def group_plans(plans: tp.Sequence[Plan]) -> list[list[Plan]]:
    """Plans that can be submitted together: same backend and same launch-wide options (``group_key``)."""
    groups: dict[tp.Hashable, list[Plan]] = {}
    for p in plans:
        groups.setdefault((p.backend, p.group_key), []).append(p)
    return list(groups.values())


def write_sweep_files(plans: tp.Sequence[Plan], sweep_dir: Path, echo: bool) -> None:
    """Write the sweep-level plan of each group under ``<sweep_dir>/launch/`` (e.g. the Slurm array script),
    for backends that have one (``sweep_files(plans, sweep_dir) -> {name: text}``)."""
    for group in group_plans(plans):
        make = getattr(backends.get(group[0].backend), "sweep_files", None)
        if make is None:
            continue
        launch = Path(sweep_dir) / "launch"
        launch.mkdir(parents=True, exist_ok=True)
        for name, text in make(group, Path(sweep_dir)).items():
            (launch / name).write_text(text)
            if echo:
                print(f"# ---- {launch / name}\n{text.rstrip()}\n", flush=True)


def execute(plans: tp.Sequence[Plan], sweep_dir: Path) -> dict[Path, tuple[Submission, JobResult | None]]:
    """Submit a sweep's collected plans, grouped by backend and shared options; wait where the plans say so.

    Writes ``<sweep_dir>/launch/manifest.json`` (backend, job ids, overrides, output dirs) once all are
    submitted. Returns job dir -> (submission, result or None when not waited for)."""
    subs: list[Submission] = []
    for group in group_plans(plans):
        subs += submit(group)
    write_manifest(sweep_dir, subs)
    out: dict[Path, tuple[Submission, JobResult | None]] = {}
    from automodel_hydra.progress import sweep_progress  # issue 6: jobs submitted/running/done while waiting

    with sweep_progress([s for s in subs if should_wait(s.plan)]):
        for group_subs in _by_backend(subs):
            waited = [s for s in group_subs if should_wait(s.plan)]
            results = backends.get(group_subs[0].plan.backend).wait(waited) if waited else []
            by_dir = {s.plan.job.job_dir: r for s, r in zip(waited, results)}
            for s in group_subs:
                out[s.plan.job.job_dir] = (s, by_dir.get(s.plan.job.job_dir))
    return out


def _by_backend(subs: tp.Sequence[Submission]) -> list[list[Submission]]:
    groups: dict[str, list[Submission]] = {}
    for s in subs:
        groups.setdefault(s.plan.backend, []).append(s)
    return list(groups.values())


def write_manifest(sweep_dir: Path, subs: tp.Sequence[Submission]) -> Path:
    """``launch/manifest.json`` in the sweep dir: one record per job, for ``automodel-hydra status|logs|cancel``."""
    path = Path(sweep_dir) / "launch" / "manifest.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"jobs": [s.record() for s in subs]}, indent=2) + "\n")
    return path


def fail(message: str) -> tp.NoReturn:
    """Exit with a one-line error (no traceback) for mistakes the user can fix."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)
