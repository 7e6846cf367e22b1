"""The submitting side of a launch: prepare each Hydra job, then plan, write, submit and wait — in one place.

Two callers, one pipeline (:func:`launch`):

* a single run, ``python train.py``: Hydra calls the task function, which calls :func:`run` on its config;
* a sweep, ``python train.py -m``: our Hydra launcher (``hydra_plugins/automodel_hydra_launcher``) calls
  :func:`prepare` for each job through the task function's declared interface (:func:`launchable`), then
  :func:`launch` once for all of them, so a bad value in any job fails before the first one is submitted and
  the jobs are submitted together (one Slurm job array, packed local jobs, one SkyPilot task per point).

Ranks never run this: they run :mod:`automodel_hydra.worker` with the rank-side spec written here
(``launch/job.yaml``), so only this process writes ``.hydra/`` and the job's dirs.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import os
import sys
import typing as tp
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from automodel_hydra import backends, config, errors, paths, profile, records, stops, sweep_policy, yaml11
from automodel_hydra.plan import (
    Backend,
    JobFailedError,
    JobResult,
    JobSpec,
    JobStoppedError,
    Plan,
    SchedulerUnreachable,
    Submission,
    SubmitError,
    launch_dir,
    new_run_id,
    render_files,
    stop_line,
    write_run_id,
)
from automodel_hydra.schema import USER_ERROR_EXIT, ConfigError, UserError
from automodel_hydra.sections import LAUNCHER_SECTIONS, selected_by
from automodel_hydra.states import JobState

log = logging.getLogger(__name__)

#: ``yaml.safe_dump``'s dumper, with libyaml's emitter where PyYAML has it (the same data, ~8x faster per job).
_SafeDumper: tp.Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)

#: The attribute of a task function our Hydra launchers plan through (set by :func:`launchable`).
PREPARE_ATTR = "automodel_prepare"

F = tp.TypeVar("F", bound=tp.Callable[..., tp.Any])


def launchable(task_function: F) -> F:
    """Declare a Hydra task function launchable by our launchers: they call its ``automodel_prepare(cfg)``
    (:func:`prepare`) for every job of a sweep instead of running it in this process. ``train.py``'s ``main`` is
    one; a task function without the mark is refused by our launchers, naming it."""
    setattr(task_function, PREPARE_ATTR, prepare)
    return task_function


@dataclasses.dataclass(frozen=True)
class Prepared:
    """One Hydra job, validated: its config and where it lives. What a sweep's launcher collects per job."""

    cfg: config.TrainConfig
    job: JobSpec
    dry_run: bool


@dataclasses.dataclass
class Outcome:
    """What became of one job: its submission (None on a dry run) and its result (None when not waited for)."""

    prepared: Prepared
    sub: Submission[tp.Any] | None = None
    result: JobResult | None = None

    @property
    def name(self) -> str:
        """``<backend> job <ids>`` (the job dir before anything was submitted)."""
        ids = ",".join(self.sub.ids) if self.sub is not None else ""
        return f"{self.prepared.cfg.backend} job {ids or self.prepared.job.job_dir}"

    def value(self) -> tp.Any:
        """The job's final loss for Hydra's sweeper (None when not waited for). Raises JobFailedError otherwise."""
        if self.result is None or self.sub is None:
            if self.result is not None and self.result.ok:  # nothing left to do: the earlier result, kept
                value = self.result.value
                return value.get("loss") if isinstance(value, dict) else value
            return None if self.sub is None else {"job_ids": self.sub.ids, "job_dir": str(self.prepared.job.job_dir)}
        if self.result.state is JobState.CANCELLED:  # someone stopped it: a stop line, not an error
            how = f": {self.result.stop}" if self.result.stop else ""
            raise JobStoppedError(stop_line([f"{self.name} (cancelled{how})"], [], self.prepared.job.job_dir,
                                            checkpoint_note([self])))
        if not self.result.ok:
            first, _, rest = (self.result.error or "").partition("\n")  # the log named before a log's tail
            raise JobFailedError(f"{self.sub.plan.backend} job {','.join(self.sub.ids) or self.prepared.job.job_dir}"
                                 f" ended {self.result.state.value}: {first} (log: {self.sub.log_path})"
                                 f"{chr(10) + rest if rest else ''}")
        value = self.result.value
        return value.get("loss") if isinstance(value, dict) else value


# ----------------------------------------------------------------------------------------------- preparing


def job_spec_from_hydra(sweep: bool) -> JobSpec:
    """This Hydra job's dir, name, overrides, sweep number, ``env_set`` and working dir (HydraConfig)."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    job_dir = Path(hc.runtime.output_dir).resolve()
    env = OmegaConf.to_container(hc.job.env_set, resolve=True) or {}
    assert isinstance(env, dict)
    return JobSpec(
        job_dir=job_dir,
        job_name=hc.job.name,
        # resolve=False: an override such as '++slurm.env_vars.HF_TOKEN=${HF_TOKEN}' is text, not an interpolation
        overrides=tuple(str(o) for o in OmegaConf.to_container(hc.overrides.task, resolve=False) or []),
        job_num=hc.job.num if sweep else None,
        env=tuple((str(k), str(v)) for k, v in env.items()),
        workdir=job_dir if hc.job.chdir else None,
    )


def prepare(cfg: DictConfig, sweep: bool = True,
            load: tp.Callable[[DictConfig], config.TrainConfig] | None = None) -> Prepared:
    """Validate one job's composed config (inside its Hydra job context). Raises ConfigError naming the key, or an
    OmegaConf error for an unknown key or wrong type; writes nothing.

    ``load`` turns the config into the typed one (default :func:`config.load`); the sweep fast path passes its
    loader's, which gives the same result faster for a sweep's similar jobs."""
    job = job_spec_from_hydra(sweep)
    changes = yaml11.restorations(cfg, yaml11.config_files(), job.overrides)
    if changes:  # put back the file's text, on a copy (Hydra's job config is not ours to edit)
        cfg = copy.deepcopy(cfg)
        for key, value, text in changes:
            OmegaConf.update(cfg, key, text, force_add=True)
            log.info("read as text, not as YAML 1.1's implicit type: %s: %r -> %r", key, value, text)
    train_cfg = (load or config.load)(cfg)
    return Prepared(train_cfg, job, bool(OmegaConf.select(cfg, "dry_run", default=False)))


# ----------------------------------------------------------------------------------------------- launching


def launch(jobs: tp.Sequence[Prepared], sweep_dir: Path | None = None, results_needed: str | None = None,
           definition: tp.Any = None, max_failures: int | None = None) -> list[Outcome]:
    """Plan, write, submit and (where the plans say so) wait for ``jobs``; one outcome per job, in order.

    Every job of every backend is checked (its world-size rules, its backend's preflight and planned-task checks,
    its dir not held by an unfinished job, the checkpoint it resumes from not past its last step, no dir it writes
    shared with another job of the sweep: :func:`refuse_shared_paths`) before any file is written or anything
    submitted; a dry run stops after writing. A job with nothing left to do (:func:`kept_result`) is not started:
    its earlier result is its outcome. Each submitted job gets a fresh launch id in ``launch/run_id``, which its
    result echoes (:func:`automodel_hydra.plan.written_by_this_launch`). Raises ConfigError / PreflightError (one
    line) for what can be fixed before submitting. ``results_needed``: why the caller needs every job's result (a
    sweeper that chooses its next jobs from them); then a job that would not be waited for is refused, ConfigError
    naming the setting (``slurm.detach``), before anything is written. ``definition``: the sweep's
    (:class:`automodel_hydra.resume.Definition`), recorded in the manifest with the first submission, for a
    resume. ``max_failures``: stop the sweep after that many failed members (:mod:`automodel_hydra.sweep_policy`);
    a launch that would not wait for them is refused, ConfigError naming the setting."""
    errors.release()  # composing is over: what starts from here must not inherit HYDRA_FULL_ERROR
    for p in jobs:  # names the user chose, made into paths: each fits the filesystem (one line naming the key)
        for problem in paths.name_problems(p.cfg, p.job.job_dir, p.job.job_name):
            raise problem
    refuse_shared_paths(jobs, sweep_dir)
    group = records.stable_tracker_id(launch_dir(sweep_dir)) if sweep_dir is not None else None
    jobs = [dataclasses.replace(p, job=dataclasses.replace(
        p.job, code_dir=code_dir(p.job, sweep_dir), tracker_id=records.stable_tracker_id(p.job.launch_dir),
        tracker_group=group if p.job.job_num is not None else None)) for p in jobs]
    by_backend: dict[str, list[int]] = {}
    for i, p in enumerate(jobs):
        by_backend.setdefault(p.cfg.backend, []).append(i)
    impls = {name: backends.get(name) for name in by_backend}
    warn_shell_tracker_id(jobs, impls)
    checked: set[str] = set()
    for p in jobs:
        check_recipe(p.cfg, checked, impls[p.cfg.backend].ranks_see_local_files(p.cfg))
    plans: dict[int, Plan[tp.Any]] = {}
    facts: dict[str, tp.Any] = {}
    for name, idx in by_backend.items():
        impl = impls[name]
        facts[name] = impl.preflight([jobs[i].cfg for i in idx])
        for i in idx:
            config.check_world(jobs[i].cfg, impl.world_size(jobs[i].cfg, facts[name]))
            plans[i] = impl.plan(jobs[i].cfg, jobs[i].job, facts[name])
        impl.check([plans[i] for i in idx])
        needed = results_needed or (None if max_failures is None or impl.stops_after_failures else
                                    f"{sweep_policy.KEY}={max_failures} is set: the command that waits for the sweep "
                                    "stops it")
        if needed is not None and any(not plans[i].wait for i in idx):
            key, waits = impl.wait_setting or (name, True)
            raise ConfigError(key, not waits, f"it must be {str(waits).lower()} here, since {needed}")
    records.refuse_if_busy([p.job for p in jobs])
    if all(p.dry_run for p in jobs):  # never over a submitted run's launch files
        records.refuse_dry_run_over([p.job for p in jobs], sweep_dir)
    kept: dict[int, JobResult] = {}
    for i, p in enumerate(jobs):
        impl = impls[p.cfg.backend]
        here = impl.ranks_see_local_files(p.cfg)
        refuse_finished_resume(p, here)
        earlier = kept_result(p, here)
        if earlier is not None:
            kept[i] = earlier
        warning = profile.long_run_warning(p.cfg.profile.nsys, p.cfg.step_scheduler.max_steps,
                                           impl.time_limit_minutes(p.cfg))
        if warning:
            log.warning(warning)
    dry = all(p.dry_run for p in jobs)
    outcomes = [Outcome(p, result=kept.get(i)) for i, p in enumerate(jobs)]
    if not dry:  # a job with nothing left to do is not started, and nothing of its dir is rewritten
        for i, o in enumerate(outcomes):
            if o.result is not None:
                print(kept_line(jobs[i], o.result), flush=True)
        by_backend = {name: [i for i in idx if i not in kept] for name, idx in by_backend.items()}
        by_backend = {name: idx for name, idx in by_backend.items() if idx}
        jobs_left = [p for i, p in enumerate(jobs) if i not in kept]
    else:
        jobs_left = list(jobs)
    batches = [(name, [dataclasses.replace(b, max_failures=max_failures) for b in
                       impls[name].batches([plans[i] for i in idx], sweep_dir, facts[name])], idx)
               for name, idx in by_backend.items()]
    if group is not None and sweep_dir is not None and jobs_left:
        records.write_tracker_id(launch_dir(sweep_dir), group)
    for p in jobs_left:  # the rank-side spec (a call job: its pickled call); the plan files come with the batches
        p.job.launch_dir.mkdir(parents=True, exist_ok=True)
        if p.job.tracker_id is not None:  # kept by every later launch of this dir: one tracker run per job
            records.write_tracker_id(p.job.launch_dir, p.job.tracker_id)
        if p.job.call is not None:
            p.job.call_file.write_bytes(p.job.call)
        else:
            p.job.job_file.write_text(yaml.dump(config.rank_spec(p.cfg), Dumper=_SafeDumper, sort_keys=False))
    for _, groups, _ in batches:
        for batch in groups:
            for path, text in batch.files.items():
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
                if path.suffix == ".sh":
                    path.chmod(0o777 & ~current_umask())  # executable for whom the umask lets read it
    if dry:
        for _, groups, _ in batches:
            for batch in groups:
                print(render_files(batch.files), flush=True)
        where = sweep_dir or jobs[0].job.job_dir
        print(f"dry run: wrote {where}; nothing was submitted or started", flush=True)
        return outcomes
    for p in jobs_left:  # this launch's id, which the job's result echoes (never a clock: plan.RUN_ID_FILE)
        write_run_id(p.job, new_run_id())
    subs: dict[Path, Submission[tp.Any]] = {}
    for name, groups, _ in batches:
        for batch in groups:
            for sub in impls[name].submit(batch):
                subs[sub.plan.job.job_dir] = sub
                records.write_record(sub)
                _announce(sub)
    for o in outcomes:
        o.sub = subs.get(o.prepared.job.job_dir)
    if sweep_dir is not None and subs:
        from automodel_hydra import resume

        records.write_manifest(sweep_dir, [o.sub for o in outcomes if o.sub is not None],
                               {str(p.job.job_dir): {"checkpoint_dir": str(checkpoint_path(p)),
                                                     "paths": {k: str(v) for k, v in written(p)}} for p in jobs},
                               resume.manifest_fields(definition) if definition is not None else None)
    try:
        with stops.stop_signals():
            _wait(outcomes, impls, max_failures, sweep_dir)
    except (KeyboardInterrupt, stops.StopRequested) as e:
        stop = stops.as_stop(e)
        raise Stopped(_stop_summary(outcomes, impls, sweep_dir, stop), stop.exit_code) from None
    return outcomes


def warn_shell_tracker_id(jobs: tp.Sequence[Prepared], impls: tp.Mapping[str, Backend[tp.Any, tp.Any, tp.Any]]
                          ) -> None:
    """One warning when this shell has ``WANDB_RUN_ID`` and a job does not choose its run itself (``env_set``, or
    its backend's :meth:`~automodel_hydra.plan.Backend.env_vars`): each job logs to its own W&B run
    (``launch/tracker_id``, :func:`automodel_hydra.plan.tracker_env`), so a leftover export never merges jobs, sweep
    members included, into one run."""
    def chooses(p: Prepared) -> bool:
        return any(k == "WANDB_RUN_ID" for k, _ in p.job.env) or "WANDB_RUN_ID" in impls[p.cfg.backend].env_vars(p.cfg)

    shell = os.environ.get("WANDB_RUN_ID")
    if not shell or all(chooses(p) for p in jobs):
        return
    log.warning(f"WANDB_RUN_ID={shell} of this shell is not passed on: each job is its own W&B run (its "
                "launch/tracker_id); to choose the run, set hydra.job.env_set.WANDB_RUN_ID (or the launcher's "
                "env_vars), or wandb.id in an AutoModel file")


def code_dir(job: JobSpec, sweep_dir: Path | None) -> Path:
    """Where a job's code snapshot lives: ``<sweep dir>/launch/code`` for a sweep's jobs (one copy for all of
    them), else ``<job dir>/launch/code`` (:mod:`automodel_hydra.snapshot`)."""
    from automodel_hydra.snapshot import CODE_DIR

    return (launch_dir(Path(sweep_dir).resolve()) if sweep_dir is not None else job.launch_dir) / CODE_DIR


class Stopped(Exception):
    """A stop signal while waiting (Ctrl-C, SIGTERM, SIGHUP): the message says, in one line, what was stopped
    and how it ended, what keeps running (with the command that cancels it) and where the newest checkpoint is.
    ``exit_code``: 128 + the signal (130 for Ctrl-C, 143 for SIGTERM)."""

    def __init__(self, message: str, exit_code: int = stops.CTRL_C_EXIT) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def _stop_summary(outcomes: tp.Sequence[Outcome], impls: tp.Mapping[str, Backend[tp.Any, tp.Any, tp.Any]],
                  sweep_dir: Path | None, stop: stops.StopRequested) -> str:
    """The stop line (:func:`automodel_hydra.plan.stop_line`) after a stop signal while waiting. Local jobs were
    stopped: each is named with how it ended (``ended within the 30 s grace time``, ``killed after 30 s: rank 1
    (pid 12), ...``, ``never started``), from the results the interactive backend put on ``stop``. Slurm and
    SkyPilot jobs keep running (only the waiting stopped), unless the scheduler says they already ended."""
    where = sweep_dir or outcomes[0].prepared.job.job_dir
    running: list[Outcome] = []
    stopped: list[str] = []
    stopped_jobs: list[Outcome] = []
    open_jobs: dict[str, list[Outcome]] = {}
    for o in outcomes:
        result = stop.results.get(str(o.prepared.job.job_dir))
        if result is not None:
            o.result = result
        if o.sub is not None and (o.result is None or not o.result.state.final or result is not None):
            open_jobs.setdefault(o.prepared.cfg.backend, []).append(o)
    for name, group in open_jobs.items():
        try:  # one query per backend (one sacct for a whole Slurm sweep), not one per job
            states = [info.state for info in impls[name].states([o.sub.ref for o in group if o.sub is not None])]
        except Exception:
            states = [JobState.UNKNOWN] * len(group)
        for o, state in zip(group, states):
            if o.result is not None and o.result.state is JobState.COMPLETED:
                continue  # it had finished before the signal
            if str(o.prepared.job.job_dir) in stop.results or state.final:  # stopped by its backend's wait
                how = o.result.stop if o.result is not None else None
                stopped.append(f"{o.name} ({stop.how}{': ' + how if how else ''})")
                stopped_jobs.append(o)
            else:
                running.append(o)
    what = stopped or [f"waiting ({stop.how})"]
    return stop_line(what, [o.name for o in running], where,
                     checkpoint_note(stopped_jobs + running))


def checkpoint_note(outcomes: tp.Sequence[Outcome]) -> str:
    """Where the newest checkpoint of stopped jobs is, for a stop line: ``newest checkpoint: PATH`` (the newest
    complete one in the checkpoint dir of this project's layout, the recipe kind's
    :meth:`~automodel_hydra.recipe_kind.RecipeKind.checkpoint_dir`), else where to look: jobs whose ranks write
    elsewhere (:meth:`~automodel_hydra.plan.Backend.ranks_path`: a login node's disks) are named there, never said
    to have none."""
    from automodel_hydra.checkpoint import find_latest

    jobs = [o.prepared for o in outcomes]
    if not jobs:
        return "no checkpoint"
    if not all(backends.get(p.cfg.backend).ranks_write_job_dir for p in jobs):  # on their own nodes or bucket
        return "checkpoints: in the job's bucket or on its cluster (launch/sky_task.yaml, file_mounts)"
    dirs = [p.cfg.kind.checkpoint_dir(p.cfg, p.job.job_dir) for p in jobs]  # None: the recipe's own layout
    if dirs[0] is None or None in dirs:
        return "checkpoints: where the recipe's checkpoint section puts them"
    sub = outcomes[0].sub
    there = backends.get(sub.plan.backend).ranks_path(sub.plan, dirs[0]) if sub else None
    if there is not None:
        return (f"checkpoints: where the ranks write them, {'each job its own, ' if len(jobs) > 1 else ''}"
                f"{there}{', ...' if len(jobs) > 1 else ''} (not copied here)")
    if len(jobs) > 1:
        return f"checkpoints: each job's own ({dirs[0]}, ...)"
    latest = find_latest(dirs[0])
    return f"newest checkpoint: {latest}" if latest else f"no checkpoint yet in {dirs[0]}"


def check_recipe(cfg: config.TrainConfig, seen: set[str], here: bool) -> None:
    """What the ranks will run, checked here before anything starts (each distinct recipe and model once, ``seen``
    holds what was checked): the recipe resolves (an AutoModel recipe class, a function that takes ``(cfg, dist,
    should_stop)``); AutoModel's own loader accepts the recipe's sections (when AutoModel is installed here); every
    model the ranks load can be fetched where they run, when that is this machine's filesystem (``here``: the
    backend's :meth:`~automodel_hydra.plan.Backend.ranks_see_local_files`; SkyPilot nodes and containers fetch on
    their own). A ``_target_`` (or the recipe itself) that does not import on this machine is checked here only when
    the ranks are this machine's processes (``interactive``); for any other launcher it is left to the ranks, which
    import it first thing and fail in one line naming the key (Transformer Engine's FusedAdam on a CPU login node).
    Raises ValueError with one line."""
    from automodel_hydra import recipes

    ranks_here = backends.get(cfg.backend).ranks_import_here  # the ranks import in this very environment
    target = recipes.recipe_target(cfg.recipe)
    recipe = None
    if target is not None and target not in seen:
        seen.add(target)
        try:
            recipe = recipes.resolve(cfg.recipe)
        except recipes.RecipeError:
            if ranks_here or _answerable(target):
                raise
            log.info("recipe=%s does not import on this machine: the ranks import it first thing, where they "
                     "run (%s)", target, cfg.backend)
    cfg.kind.check_recipe(cfg, recipe, seen, here, ranks_here, note=lambda line: log.info("%s", line))


def _answerable(target: str) -> bool:
    """Whether this machine can judge a ``recipe:`` name the ranks import elsewhere: a bare AutoModel class name
    needs AutoModel here (its recipes are scanned), a dotted one a module that imports here."""
    from automodel_hydra.recipe_names import importable_here

    if ":" not in target and "." not in target:
        return importable_here("nemo_automodel.cli.utils")
    return importable_here(target.partition(":")[0] if ":" in target else target.rpartition(".")[0])


# ----------------------------------------------------------------------------------------------- no shared state

def checkpoint_path(p: Prepared) -> Path:
    """Where the job's ranks checkpoint, as an absolute path on this machine: ``checkpoint.dir`` (a relative one
    is under the job dir: :mod:`automodel_hydra.paths`), or ``<job dir>/checkpoints``."""
    return Path(os.path.normpath(p.cfg.checkpoint.under(p.job.job_dir)))


def written(p: Prepared) -> list[tuple[str, Path]]:
    """The dirs the job writes (:func:`automodel_hydra.paths.written_dirs`); a job whose ranks write on their own
    nodes or bucket prefix (its backend's ``ranks_write_job_dir`` is False: SkyPilot) shares no recipe dir with
    another, so only its job dir counts here."""
    found = paths.written_dirs(p.cfg, p.job.job_dir)
    return found if backends.get(p.cfg.backend).ranks_write_job_dir else found[:1]


def refuse_shared_paths(jobs: tp.Sequence[Prepared], sweep_dir: Path | None) -> None:
    """Refuse a sweep in which two jobs would write one dir — in this launch, or against the other jobs an earlier
    launch of the same sweep recorded in ``launch/manifest.json`` (a sweeper that launches in batches,
    ``hydra.sweeper.max_batch_size``) — before anything is written or submitted
    (:func:`automodel_hydra.paths.refuse_shared`). Single runs are not checked. Raises ConfigError (one line)."""
    sweep = [p for p in jobs if p.job.job_num is not None]
    if not sweep:
        return
    earlier = {str(r.get("job_dir")): r["paths"] for r in records.manifest_jobs(sweep_dir)
               if isinstance(r.get("paths"), dict)} if sweep_dir is not None else {}
    paths.refuse_shared([(p.job.job_num, p.job.job_dir, written(p)) for p in sweep], earlier)


def resume_step(p: Prepared) -> tuple[int, Path] | None:
    """The step and path of the checkpoint the job's ranks will resume from (``restore_from.path``: ``latest`` =
    the newest complete one in its checkpoint dir; ``D/latest``: that one, else D's, as
    ``checkpoint.resume_target`` decides), read from the step dir's name (``step-N``); None for a fresh start or a
    checkpoint whose step the name does not give."""
    cfg = p.cfg
    if not cfg.checkpoint.enabled or cfg.restore_from.path is None:
        return None
    source = paths.pointer_dir(cfg.restore_from.path)
    if cfg.restore_from.path == paths.POINTER or source is not None:
        ckpt_dir = checkpoint_path(p)
        if source is not None and not source.is_absolute():
            source = (p.job.workdir or Path.cwd()) / source
        if not any(d.is_dir() and any(d.iterdir()) for d in (ckpt_dir, *([source] if source else []))):
            return None
        from automodel_hydra.checkpoint import resume_target  # imports torch: only when there is something to find

        target = resume_target(ckpt_dir, paths.POINTER if source is None else source / paths.POINTER)
    else:
        target = Path(cfg.restore_from.path)
        if not target.is_absolute():
            target = (p.job.workdir or Path.cwd()) / target
    step = paths.step_of(target.name) if target is not None else None
    return (step, tp.cast(Path, target)) if step is not None else None


def kept_result(p: Prepared, here: bool) -> JobResult | None:
    """The earlier result of a job with nothing left to do, else None: a job of the bundled recipe, checked where
    the ranks see this machine's files (``here``), that would resume from a checkpoint at its
    ``step_scheduler.max_steps`` while its ``result.json`` holds the loss of that same step. Starting it would
    train no step; its outcome is the earlier result (COMPLETED), kept as it is. Where this cannot be known here
    (another recipe, a container, SkyPilot) the rank keeps it instead (:func:`automodel_hydra.worker.write_result`)."""
    max_steps = p.cfg.kind.max_steps(p.cfg)
    if max_steps is None or not here or p.job.call is not None:
        return None
    found = resume_step(p)
    if found is None or found[0] != max_steps:
        return None
    try:
        earlier = json.loads(p.job.result_file.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(earlier, dict) or earlier.get("step") != found[0] or earlier.get("loss") is None:
        return None
    return JobResult(JobState.COMPLETED, earlier)


def kept_line(p: Prepared, result: JobResult) -> str:
    """The one line for a job that was not started (:func:`kept_result`)."""
    step = result.value.get("step") if isinstance(result.value, dict) else None
    return (f"{p.job.job_dir}: already at step {step} (step_scheduler.max_steps): the earlier result is kept "
            f"({p.job.result_file}); nothing was started (raise step_scheduler.max_steps to train on)")


def refuse_finished_resume(p: Prepared, here: bool) -> None:
    """Refuse a job of the bundled recipe that would resume from a checkpoint past its ``step_scheduler.max_steps``:
    it would train nothing and report no loss. Checked where the ranks see this machine's files (``here``: the
    backend's :meth:`~automodel_hydra.plan.Backend.ranks_see_local_files`). Raises ConfigError naming the key, the
    checkpoint's step and path, and the fix."""
    max_steps = p.cfg.kind.max_steps(p.cfg)
    if max_steps is None or not here:
        return
    found = resume_step(p)
    if found is not None and found[0] > max_steps:
        step, path = found
        raise ConfigError("step_scheduler.max_steps", max_steps,
                          f"the job would resume from step {step} ({path}), past step_scheduler.max_steps: set it "
                          f"above {step} to train on, or start afresh in another run dir or checkpoint.dir")


def _announce(sub: Submission[tp.Any]) -> None:
    """Print where a submitted job is, and put the same line at the top of that job's own log."""
    if not sub.ids:
        return
    script = sub.plan.job.launch_dir / next(iter(sub.plan.files))
    line = f"submitted {sub.plan.backend} job {','.join(sub.ids)}: script {script}, log {sub.log_path}"
    print(line, flush=True)
    if sub.plan.job.job_num is not None:
        with sub.plan.job.log_file.open("a") as f:
            f.write(line + "\n")


def _wait(outcomes: list[Outcome], impls: tp.Mapping[str, Backend[tp.Any, tp.Any, tp.Any]],
          max_failures: int | None = None, sweep_dir: Path | None = None) -> None:
    from automodel_hydra.progress import sweep_progress

    waited = [o for o in outcomes if o.sub is not None and o.sub.plan.wait]
    if not waited:
        return
    watched = [o.sub for o in waited if o.sub is not None and not impls[o.prepared.cfg.backend].stops_after_failures]
    poll_s = min(impls[o.prepared.cfg.backend].poll_s for o in waited)
    with sweep_progress([o.sub for o in waited if o.sub is not None], poll_s=poll_s), \
            sweep_policy.watch(watched, impls, max_failures, sweep_dir):
        for name, impl in impls.items():
            mine = [o for o in waited if o.prepared.cfg.backend == name]
            if mine:
                for o, result in zip(mine, impl.wait([o.sub for o in mine if o.sub is not None])):
                    o.result = result


def current_umask() -> int:
    """This process's umask (Linux ``/proc/self/status``, else set and put back): the modes of the files we write
    follow it, so a group-shared run dir under ``umask 002`` stays writable for the group."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


# ----------------------------------------------------------------------------------------------- single run


def run(cfg: DictConfig) -> tp.Any:
    """``python train.py``: prepare this job and launch it; print it (dry run), or submit it and wait when asked.
    In a task that another launcher started as one rank of a job (:func:`launched_rank`: ``hydra/launcher=
    submitit_slurm``, ``srun -n N python train.py``), run the recipe as that rank instead (:func:`run_as_rank`).

    Returns the final training loss when the job was waited for, else None. A bad value exits with one line
    naming the key (status 2) before anything is written or started; a job that fails exits with status 1."""
    errors.release()  # Hydra has composed this job's config (errors.run_hydra_main)
    launched_by = launched_rank()
    if launched_by is not None:
        return run_as_rank(cfg, launched_by)
    with one_line_exits():
        prepared = prepare(cfg, sweep=False)
        print(f"run dir: {prepared.job.job_dir}", flush=True)
        (outcome,) = launch([prepared])
    try:
        return outcome.value()
    except JobStoppedError as e:  # cancelled from elsewhere: a stop, the same line and status as Ctrl-C's
        print(f"stopped: {e}", file=sys.stderr, flush=True)
        raise SystemExit(stops.CTRL_C_EXIT) from None
    except JobFailedError as e:  # the job's own output above says the rest
        if outcome.result is not None and outcome.result.traceback:  # the first failed rank's, once
            print(outcome.result.traceback, file=sys.stderr, flush=True)
        print(f"error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(1) from None


#: Mistakes the user can fix before anything starts: reported as one line (exit status 2), never a traceback.
#: Only our own type (:class:`~automodel_hydra.schema.UserError`: ConfigError, PreflightError, RecipeError, ...)
#: and OmegaConf's errors about the config (a bad interpolation or type, with the key); any other exception is
#: not the user's mistake (:func:`fail_unexpected`).
USER_ERRORS = (UserError, OmegaConfBaseException)


def one_line(error: BaseException) -> str:
    """An error as the one line a user reads: a ConfigError's own line; an unknown key or a wrong type as
    :func:`automodel_hydra.errors.describe` says it (the closest keys, the expected type); other OmegaConf errors'
    first line plus the full key they name; anything else as it prints."""
    line = errors.describe(error)
    if line is not None:
        return line
    if isinstance(error, OmegaConfBaseException):
        key = getattr(error, "full_key", None)
        first = str(error).splitlines()[0] if str(error) else type(error).__name__
        return f"{first} (key: {key})" if key and str(key) not in first else first
    text = str(error)
    return text.splitlines()[0] if isinstance(error, ConfigError) else text


def fail(message: str) -> tp.NoReturn:
    """Exit with a one-line error (no traceback) for mistakes the user can fix."""
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(USER_ERROR_EXIT)


#: What goes wrong while submitting or running after every check passed (sbatch refused the job, the job dir is
#: held by another run, a job failed, its scheduler could not be asked any more while waiting): exit 1 with the
#: error's own line (:func:`fail_launch`).
LAUNCH_ERRORS = (JobFailedError, SubmitError, SchedulerUnreachable)


def fail_launch(error: BaseException) -> tp.NoReturn:
    """Exit 1 with ``error: <the error's line>`` (no traceback): the same for a single run and a sweep."""
    print(f"error: {error}", file=sys.stderr, flush=True)
    raise SystemExit(1) from None


#: The last line of an exception that is none of ours: it is not the user's mistake, and says so.
BUG_LINE = ("{kind}: {error} -- an unexpected error, not a mistake in the config: a bug of automodel-hydra (or of a "
            "library it calls); please report it with the traceback above (also in the job's log)")


def fail_unexpected(error: BaseException) -> tp.NoReturn:
    """Exit 1 for an exception that is not a :data:`USER_ERRORS` or :data:`LAUNCH_ERRORS` one: its traceback is
    logged (the console and, under Hydra, the job's log), then one last line says it is a bug to report."""
    log.error("unexpected error", exc_info=error)
    print("error: " + BUG_LINE.format(kind=type(error).__name__, error=error), file=sys.stderr, flush=True)
    raise SystemExit(1) from None


@contextlib.contextmanager
def one_line_exits(say_stopped: tp.Callable[[str], object] | None = None) -> tp.Iterator[None]:
    """How a launching command ends when its launch raises, the same for a single run, a sweep and a sweep of call
    jobs: a stop (:class:`Stopped`) says ``stopped: <line>`` (on stderr, or through ``say_stopped``: a sweep's
    logger) and exits 128 + the signal; a mistake the user can fix (:data:`USER_ERRORS`) exits 2 with one line
    (:func:`fail`); a launch that failed after every check (:data:`LAUNCH_ERRORS`) exits 1 with one line
    (:func:`fail_launch`); anything else is a bug (:func:`fail_unexpected`: exit 1, its traceback logged)."""
    try:
        yield
    except Stopped as e:
        line = f"stopped: {e}"
        if say_stopped is None:
            print(line, file=sys.stderr, flush=True)
        else:
            say_stopped(line)
        raise SystemExit(e.exit_code) from None
    except USER_ERRORS as e:
        fail(one_line(e))
    except LAUNCH_ERRORS as e:
        fail_launch(e)
    except Exception as e:
        fail_unexpected(e)



# ----------------------------------------------------------------------------------------------- ranks of others' jobs


def launched_rank(environ: tp.Mapping[str, str] | None = None) -> str | None:
    """Whether this process is one rank of a job another launcher started, and which launcher; None otherwise.

    * a submitit task (``hydra/launcher=submitit_slurm`` or ``submitit_local``): ``SUBMITIT_EXECUTOR`` is set
      (submitit's job script and local controller export it) together with the task's rank (``SLURM_PROCID``,
      ``SUBMITIT_LOCAL_GLOBALID``) — every task is a rank, whatever the task count;
    * a task of a multi-task ``srun`` step: ``SLURM_PROCID`` with ``SLURM_STEP_NUM_TASKS`` > 1 (srun(1), OUTPUT
      ENVIRONMENT VARIABLES). A batch script (``sbatch``) or a 1-task step plans a job as anywhere else.

    Our own backends never come here: their ranks run :mod:`automodel_hydra.worker`, not the task function."""
    env = os.environ if environ is None else environ
    executor = env.get("SUBMITIT_EXECUTOR", "")
    if executor and ("SLURM_PROCID" in env or "SUBMITIT_LOCAL_GLOBALID" in env):
        return f"submitit ({executor})"
    try:
        step_tasks = int(env.get("SLURM_STEP_NUM_TASKS") or 1)
    except ValueError:
        step_tasks = 1
    if "SLURM_PROCID" in env and step_tasks > 1:
        return "srun"
    return None


def run_as_rank(cfg: DictConfig, launched_by: str) -> tp.Any:
    """Run the recipe as this task's rank of a job ``launched_by`` started (the ranks find each other through
    :mod:`automodel_hydra.bootstrap`, from the launcher's variables). Writes ``launch/job.yaml`` (every rank the
    same, atomically) and runs the worker's code path on it (:func:`automodel_hydra.worker.run`); rank 0 writes
    ``result.json``. Returns the final loss. The job's launcher sections (``slurm:``, ``skypilot:``) are not used:
    the launcher that started the tasks decided where and how many.

    Exits with one line (status 2) on a bad value, or when ``srun`` tasks would write to different run dirs."""
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    from automodel_hydra import worker

    hc = HydraConfig.get()
    try:
        prepared = prepare(cfg, sweep=hc.mode == RunMode.MULTIRUN)
        if launched_by == "srun" and hc.mode != RunMode.MULTIRUN and not any(
                str(o).startswith("hydra.run.dir=") for o in hc.overrides.hydra):
            raise ConfigError("hydra.run.dir", hc.run.dir, "srun started this command once per task, and each task "
                              "is one rank of one job, so they must share a run dir: give hydra.run.dir=DIR")
        refuse_finished_resume(prepared, here=True)  # this task is a rank: its files are these
    except USER_ERRORS as e:
        fail(one_line(e))
    job = prepared.job
    for section in (s for s in LAUNCHER_SECTIONS if getattr(prepared.cfg, s, None) is not None):
        log.warning(f"{section}: section not used: {launched_by} started this job; its own options "
                    "(hydra.launcher.*) say where and how many ranks run")
    job.launch_dir.mkdir(parents=True, exist_ok=True)
    tmp = job.launch_dir / f".job.yaml.{os.getpid()}"
    tmp.write_text(yaml.safe_dump(config.rank_spec(prepared.cfg), sort_keys=False))
    os.replace(tmp, job.job_file)
    if prepared.dry_run:
        print(f"dry run: wrote {job.job_file}; {launched_by} started this task as a rank, nothing was run", flush=True)
        return None
    # who started this task is known: srun (directly, or as submitit's job script runs it), or submitit's local
    # controller; the environment's other variables decide nothing
    start = worker.Start(None, "local") if launched_by == "submitit (local)" else worker.Start("srun", "slurm")
    result = worker.run(job.job_file, str(job.log_file), start=start)
    return result.get("loss")


# ----------------------------------------------------------------------------------------------- launcher sections

def unselected_section_message(overrides: tp.Iterable[str],
                               sections: tp.Iterable[str] = LAUNCHER_SECTIONS) -> str | None:
    """The one-line error for overrides that set a key of a launcher section the job does not have
    (``slurm.nodes=4`` without ``launcher=slurm``), or None when no override does."""
    wanted = tuple(sections)
    for override in overrides:
        key = str(override).lstrip("~+").split("=", 1)[0]
        section = key.split(".", 1)[0]
        if "." in key and section in wanted:
            choice = selected_by(section)
            return (f"{override}: {key} is an option of {choice}, and this job's launcher is another: "
                    f"add {choice} to the command line (or drop {key})")
    return None


def refuse_unselected_sections(app_file: str | Path, config_path: str, config_name: str,
                               argv: tp.Sequence[str] | None = None) -> None:
    """Before Hydra starts: exit with one line (status 2) when the command line sets a ``slurm.*`` or
    ``skypilot.*`` key that the composed config has no section for — OmegaConf would otherwise stop Hydra's
    composition with an ``AssertionError`` ("Unexpected type for root: NoneType"), naming neither key nor fix.

    ``config_path`` (relative to ``app_file``) and ``config_name`` are the app's ``@hydra.main`` arguments;
    ``-cp/-cd/-cn`` on the command line win, as in Hydra. Costs nothing unless such a key is set without its
    ``launcher=`` choice; then it composes the config once (without those keys) to see whether the section is
    there (a config file or a sweep bundle may give it)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not any(a.lstrip("~+").split("=", 1)[0].split(".", 1)[0] in LAUNCHER_SECTIONS for a in args if "." in a):
        return  # no argument names a section's key: nothing to parse (Hydra's override parser costs ~2 ms each)
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from automodel_hydra import argv as command_line

    line = command_line.parse(args)
    where = {key: value for key, flag in (("path", "--config-path"), ("dir", "--config-dir"), ("name", "--config-name"))
             if (value := line.value(flag)) is not None}
    overrides = line.overrides
    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception:
        return
    chosen = {str(o.value()) for o in parsed if o.key_or_group == "launcher" and not o.is_sweep_override()}
    suspects = [o for o in parsed if "." in o.key_or_group and o.key_or_group.split(".")[0] in LAUNCHER_SECTIONS
                and o.key_or_group.split(".")[0] not in chosen]
    if not suspects:
        return
    from hydra import compose, initialize_config_dir

    base = Path(app_file).resolve().parent / where.get("path", config_path)
    rest = [o.input_line for o in parsed if o not in suspects and not o.is_sweep_override()]
    if "dir" in where:
        rest.append(f"hydra.searchpath=[file://{Path(where['dir']).resolve()}]")
    try:
        with initialize_config_dir(config_dir=str(base.resolve()), version_base=None):
            composed = compose(where.get("name", config_name), overrides=tp.cast(tp.List[str], rest))
    except Exception:
        return
    missing = {o.key_or_group.split(".")[0] for o in suspects if composed.get(o.key_or_group.split(".")[0]) is None}
    message = unselected_section_message([o.input_line or "" for o in suspects], missing)
    if message is not None:
        fail(message)
