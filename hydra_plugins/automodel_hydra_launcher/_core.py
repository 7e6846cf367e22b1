"""``AutomodelLauncher.launch``: the sequence of Hydra's joblib/ray launchers' ``_core``, with planning in place of
running.

1. A task function that declares the interface we plan through (``automodel_hydra.driver.launchable``,
   ``train.py``'s) is planned as below. Any other task function (any Hydra app) runs each job as a *call job* on
   the backend ``hydra.launcher.backend`` names (:func:`launch_calls`), never in this process.
2. Every job is set up by the sweep fast path (``_fast.setup_jobs``) or, where it does not apply, by the exact
   path: compose its config with Hydra's ``load_sweep_config``, set ``hydra.job.id/num``, and run Hydra's own
   ``run_job`` with the task function's ``automodel_prepare``: Hydra creates the job's dir, ``.hydra/`` and log
   exactly as for any job,
   calls ``on_job_start`` callbacks, and ``prepare`` validates the config (it starts nothing). The job's launch
   line (``#N : overrides``) goes to the console and to that job's own log, never to another job's.
3. If any job failed to prepare (a bad value), stop before anything is submitted, with one line naming the key.
4. ``driver.launch`` plans, writes, submits and waits for all jobs together; each job's real result (its final
   loss, or its failure) goes into its ``JobReturn`` through Hydra's public setters, and only then do the
   ``on_job_end`` callbacks see it — with that job's Hydra config, log and (``hydra.job.chdir``) working dir in
   place, as ``run_job`` gives them.

A sweeper may call ``launch`` several times for one sweep (``hydra.sweeper.max_batch_size``); each call adds its
jobs to the sweep's ``launch/manifest.json``.

Call jobs (:func:`launch_calls`), the way hydra-submitit-launcher runs any task function on Slurm: each job's
config is composed here as above; its task function, config, Hydra context and Hydra's global state are pickled
with cloudpickle into ``<job dir>/launch/call.pkl`` (:mod:`automodel_hydra.call`), and ``driver.launch`` plans,
writes, submits and waits for them like any job (:class:`automodel_hydra.plan.JobSpec` with ``call`` set): one
process per job (``launch/call.sh`` here; a one-task ``srun`` in ``sbatch.sh`` on Slurm) runs Hydra's own
``run_job`` there, so ``.hydra/``, the job's log, ``chdir``, ``env_set`` and the callbacks behave as under Hydra's
basic launcher. The JobReturn that process pickles back is what this launcher returns; a job that died without
writing one returns FAILED with the backend's account (state, ids, log).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import io
import logging
import os
import typing as tp
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.types import HydraContext
from omegaconf import DictConfig, OmegaConf, open_dict, read_write

from automodel_hydra import call, driver, resume
from automodel_hydra import config as am_config
from automodel_hydra import records as run_records
from automodel_hydra.plan import RESULT_FILE, JobFailedError, JobSpec, written_by_this_launch
from automodel_hydra.schema import ConfigError, UserValueError
from automodel_hydra.states import JobState

from . import _fast

if tp.TYPE_CHECKING:
    from .launcher import AutomodelLauncher

log = logging.getLogger(__name__)


class _DeferJobEnd:
    """Hydra's callbacks with ``on_job_end`` held back: a job ends when its backend says so, not when it has been
    prepared. Everything else goes through unchanged."""

    def __init__(self, callbacks: tp.Any) -> None:
        self.callbacks = callbacks

    def __getattr__(self, name: str) -> tp.Any:
        return getattr(self.callbacks, name)

    def on_job_end(self, **kwargs: tp.Any) -> None:
        pass


#: The backends a call job runs on, and the launcher options that choose them (``hydra.launcher.<name>``).
CALL_BACKENDS = ("interactive", "slurm")


def _set_call_options(config: DictConfig) -> list[str]:
    """The ``hydra.launcher.*`` call options set away from their defaults (``["backend", "slurm"]``)."""
    from .config import AutomodelLauncherConf

    node, defaults = config.hydra.launcher, OmegaConf.structured(AutomodelLauncherConf)
    changed = ["backend"] if node.get("backend") is not None else []
    return changed + [name for name in CALL_BACKENDS
                      if OmegaConf.to_container(node[name], resolve=False) != OmegaConf.to_container(defaults[name])]


def call_options(config: DictConfig) -> tuple[str, dict[str, tp.Any]]:
    """The backend call jobs run on (``hydra.launcher.backend``, null = interactive) and its options
    (``hydra.launcher.<backend>``, as written: shell references stay for :func:`automodel_hydra.config.load`).

    Raises ConfigError naming the key: an unknown backend; skypilot (the reason: SkyPilot's ``CALL_REFUSAL``);
    options of another backend than the chosen one; more than one process per job (``slurm.nodes``,
    ``slurm.ntasks_per_node``, ``interactive.nproc_per_node``)."""
    node = config.hydra.launcher
    backend = node.get("backend") or "interactive"
    if backend == "skypilot":
        from automodel_hydra.backends.skypilot import CALL_REFUSAL

        raise ConfigError("hydra.launcher.backend", backend, CALL_REFUSAL)
    if backend not in CALL_BACKENDS:
        raise ConfigError("hydra.launcher.backend", backend, f"one of {', '.join(CALL_BACKENDS)} (null = interactive)")
    for other in _set_call_options(config):
        if other not in ("backend", backend):
            raise ConfigError(f"hydra.launcher.{other}", "<set>", f"options of the {other} backend, and "
                              f"hydra.launcher.backend={backend}: set hydra.launcher.backend={other}, or drop them")
    section = OmegaConf.to_container(node[backend], resolve=False)
    assert isinstance(section, dict)
    one = "a task function not declared @launchable runs as one process per job; for a job of many tasks use " \
          "hydra/launcher=submitit_slurm, or declare the function @automodel_hydra.driver.launchable"
    if backend == "slurm":
        for key in ("nodes", "ntasks_per_node"):
            if section.get(key) != 1:
                raise ConfigError(f"hydra.launcher.slurm.{key}", section.get(key), f"1: {one}")
        if not section.get("job_name"):
            section["job_name"] = str(config.hydra.job.name)
    elif str(section.get("nproc_per_node")) not in ("auto", "1"):
        raise ConfigError("hydra.launcher.interactive.nproc_per_node", section.get("nproc_per_node"), f"1: {one}")
    return backend, {str(k): v for k, v in section.items()}


def _call_train_config(backend: str, section: dict[str, tp.Any]) -> am_config.TrainConfig:
    """The launcher options as the config every backend plans from (its launcher section; no recipe: nothing
    of the bundled recipe is checked or resumed). ConfigError keys are named as the user wrote them."""
    try:
        return am_config.load({backend: section, "checkpoint": {"enabled": False}, "output_dir": "."})
    except ConfigError as e:
        raise ConfigError(f"hydra.launcher.{e.key}", e.value, e.valid) from None
    except driver.USER_ERRORS as e:
        raise UserValueError(f"hydra.launcher: {driver.one_line(e)}") from None


#: Hydra's basic sweeper (``hydra/sweeper=basic``): its jobs are fixed before any of them runs.
_BASIC_SWEEPER = ("hydra._internal.core_plugins.basic_sweeper", "BasicSweeper")


def results_needed(config: DictConfig) -> str | None:
    """Why the sweep's sweeper needs every job's result, or None when it does not.

    A sweeper that derives from Hydra's ``BasicSweeper`` (``basic``, ``automodel_basic``) fixes every job from the
    command line before the first runs and reads a result only to raise a failed job's error. Any other sweeper
    (Hydra's Optuna, Ax and Nevergrad sweepers) may choose each batch's jobs from the previous batch's results
    (``JobReturn.return_value``), so each job must be waited for. Classes are compared by module and name: Hydra's
    plugin scan re-executes plugin modules, which makes new class objects of the same classes."""
    from hydra.utils import get_class

    target = OmegaConf.select(config, "hydra.sweeper._target_")
    if not target:
        return None
    try:
        mro = get_class(str(target)).__mro__
    except Exception:  # (Hydra reports a sweeper it cannot import itself, before it gets here)
        mro = ()
    if any((c.__module__, c.__name__) == _BASIC_SWEEPER for c in mro):
        return None
    choice = OmegaConf.select(config, "hydra.runtime.choices", default={}).get("hydra/sweeper") or target
    return (f"hydra/sweeper={choice} is no BasicSweeper: it chooses each batch of jobs from the results of the "
            "batch before, so every job must be waited for")


def check_job_dir(sweep_config: DictConfig, overrides: tp.Sequence[str]) -> None:
    """Exit with one line (status 2) when the job's dir (:func:`_sweep_job_dir`) is too long for the filesystem
    (:func:`automodel_hydra.paths.sweep_dir_problem`): a name made from the user's overrides, such as
    ``hydra.sweep.subdir=${hydra.job.override_dirname}``."""
    from automodel_hydra import paths

    text = OmegaConf.to_container(sweep_config.hydra.sweep, resolve=False).get("subdir")  # type: ignore[union-attr]
    problem = paths.sweep_dir_problem(str(OmegaConf.select(sweep_config, "hydra.sweep.dir")),
                                      str(OmegaConf.select(sweep_config, "hydra.sweep.subdir")), str(text), overrides)
    if problem is not None:
        driver.fail(driver.one_line(problem))


def _sweep_job_dir(sweep_config: DictConfig) -> Path:
    """The job's output dir, as Hydra's ``run_job`` makes it from ``hydra.sweep.dir`` and ``hydra.sweep.subdir``
    (with the job's HydraConfig set, for ``${hydra:job.num}`` and friends)."""
    subdir = str(OmegaConf.select(sweep_config, "hydra.sweep.subdir"))
    return Path(os.path.abspath(os.path.join(str(OmegaConf.select(sweep_config, "hydra.sweep.dir")), subdir)))


def launch(launcher: AutomodelLauncher, job_overrides: tp.Sequence[tp.Sequence[str]],
           initial_job_idx: int) -> tp.Sequence[JobReturn]:
    setup_globals()
    by_cli = resume.resumed_by_cli(os.environ)  # (taken out before any job is set up: no job inherits it)
    assert launcher.config is not None and launcher.hydra_context is not None and launcher.task_function is not None
    prepare = getattr(launcher.task_function, driver.PREPARE_ATTR, None)
    if prepare is None:
        return launch_calls(launcher, job_overrides, initial_job_idx)
    set_options = _set_call_options(launcher.config)
    if set_options:
        driver.fail(f"hydra.launcher.{set_options[0]} is set: hydra.launcher.backend and its options are for task "
                    "functions not declared @launchable; this one routes each job by its own config (launcher=slurm "
                    "and slurm.* keys, launcher=skypilot and skypilot.* keys)")
    config, context = launcher.config, launcher.hydra_context
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    max_failures = _max_failures(config)
    numbered = list(enumerate(job_overrides, start=initial_job_idx))
    definition, kept = _resuming(config, sweep_dir, numbered, by_cli)
    numbered = [(idx, o) for idx, o in numbered if idx not in kept]
    if not numbered:  # every member was kept: nothing is set up, written or submitted
        launcher.job_states.extend(JobState.COMPLETED for _ in kept)
        return [kept[idx] for idx, _ in enumerate(job_overrides, start=initial_job_idx)]
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log.info(f"sweep dir: {sweep_dir}: preparing {len(numbered)} job(s)")
    planning = HydraContext(config_loader=context.config_loader,
                            callbacks=tp.cast(tp.Any, _DeferJobEnd(context.callbacks)))
    configs: dict[int, DictConfig] = {}  # the jobs set up by the exact path, for their on_job_end callbacks

    def exact(idx: int, overrides: tp.Sequence[str]) -> JobReturn:
        """Hydra's own path for one job: ``load_sweep_config``, then ``run_job`` with the task's ``prepare``."""
        try:
            sweep_config = context.config_loader.load_sweep_config(config, list(overrides))
        except AssertionError:  # OmegaConf's answer to `slurm.nodes=4` when the job has no slurm: section
            message = driver.unselected_section_message(overrides)
            if message is None:
                raise
            driver.fail(message)
        except Exception as e:  # an unknown key or a wrong type in this job's overrides: one line
            _fail_config(e)
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"automodel_{idx}"
            sweep_config.hydra.job.num = idx
        HydraConfig.instance().set_config(sweep_config)
        configs[idx] = sweep_config
        check_job_dir(sweep_config, overrides)  # before run_job makes it: too long is one line, not an OSError
        return run_job(hydra_context=planning, task_function=prepare, config=sweep_config,
                       job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir")

    try:
        returns = _fast.setup_jobs(context, config, prepare, [o for _, o in numbered], initial_job_idx, exact,
                                   job_nums=[idx for idx, _ in numbered])
    except SystemExit:
        raise
    except Exception as e:  # a job's value of the wrong type: one line, nothing submitted
        _fail_config(e)
    with driver.one_line_exits(log.error):  # the same lines and statuses as a single run's
        for ret in returns:
            if ret.status == JobStatus.FAILED:  # a job failed to prepare: submit nothing
                raise_failure(ret)
        outcomes = driver.launch([ret.return_value for ret in returns], sweep_dir, results_needed(config),
                                 definition=definition, max_failures=max_failures)
    _record_states(launcher, outcomes)
    launcher.job_states.extend(JobState.COMPLETED for _ in kept)
    for (idx, _), ret, outcome in zip(numbered, returns, outcomes):
        try:
            ret.return_value = outcome.value()
        except JobFailedError as e:
            ret.status = JobStatus.FAILED
            ret.return_value = e
        job_config = configs.get(idx)
        if job_config is None:  # set up by the fast path: no callbacks to show it to
            continue
        with _job_context(job_config, ret):
            context.callbacks.on_job_end(config=job_config, job_return=ret)
        configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    if not kept:
        return returns
    ran = {idx: ret for (idx, _), ret in zip(numbered, returns)}
    return [kept.get(idx) or ran[idx] for idx, _ in enumerate(job_overrides, start=initial_job_idx)]


def _max_failures(config: DictConfig) -> int | None:
    """``hydra.launcher.sweep_policy.max_failures``, checked (:func:`automodel_hydra.sweep_policy.check`): exits with
    one line (status 2) for a bad value, before anything is set up."""
    from automodel_hydra import sweep_policy

    try:
        return sweep_policy.check(OmegaConf.select(config, "hydra.launcher.sweep_policy.max_failures", default=None))
    except ConfigError as e:
        driver.fail(driver.one_line(e))


def _resuming(config: DictConfig, sweep_dir: Path, numbered: tp.Sequence[tuple[int, tp.Sequence[str]]],
              by_cli: bool = False) -> tuple[resume.Definition | None, dict[int, JobReturn]]:
    """This launch's sweep definition (None for a sweeper that chooses its points from results: there is no
    fixed sweep to resume) and, when ``sweep_dir`` recorded this sweep before, the JobReturns of its COMPLETED
    members, which are kept (:mod:`automodel_hydra.resume`). Prints the resume's line first; exits with one line
    (status 2) for another definition or a member still RUNNING or PENDING, before anything is set up. ``by_cli``:
    ``automodel-hydra resume`` ran this command (the line for another definition speaks of it)."""
    import sys

    if results_needed(config) is not None:
        return None, {}
    body = OmegaConf.to_container(config, resolve=False, enum_to_str=True)
    assert isinstance(body, dict)
    for key in ("hydra", *resume.NOT_DEFINING):
        body.pop(key, None)
    argv = getattr(sys, "orig_argv", [sys.executable, *sys.argv])[1:]
    now = resume.Definition({idx: resume.point(overrides) for idx, overrides in numbered},
                            resume.flatten(body), tuple(argv), os.getcwd())
    manifest = run_records.read_manifest(sweep_dir)
    then = resume.recorded_definition(manifest)
    if then is None or manifest is None:
        return now, {}
    whole = OmegaConf.select(config, "hydra.sweeper.max_batch_size", default=None) is None
    tail = resume.difference(now, then, whole, by=resume.RESUMED_BY if by_cli else "this command")
    if tail is not None:
        changed = _changed_config_files(config, _first_submitted(manifest.get("jobs") or []))
        driver.fail(resume.resume_line(sweep_dir, tail, changed) if by_cli else
                    resume.difference_line(sweep_dir, tail))
    records = [r for r in manifest.get("jobs", []) if (r.get("job_num") or 0) in now.points]
    if not records and not set(now.points) & set(then.points):  # a batch this sweep had not reached: it just runs
        return now, {}
    decision = resume.decide(now.points, resume.member_states(records))
    if decision.busy:
        driver.fail(resume.busy_line(sweep_dir, decision))
    print(resume.summary(decision), flush=True)
    by_num, overrides = {int(r.get("job_num") or 0): r for r in records}, dict(numbered)
    return now, {idx: _kept_return(by_num[idx], overrides[idx]) for idx in decision.kept}


def _changed_config_files(config: DictConfig, since: float | None) -> list[str]:
    """The YAML files of the sweep's config search path (its ``file://`` sources) modified after ``since`` (epoch
    s; the sweep's first submission, recorded to the second, so a file needs a modification time a second past it)
    : what a resume that composes another sweep from the same command line finds changed. [] without ``since``."""
    if since is None:
        return []
    found = []
    for source in OmegaConf.select(config, "hydra.runtime.config_sources", default=None) or ():
        if source.get("schema") != "file":
            continue
        for path in sorted(Path(str(source.get("path"))).rglob("*.yaml")):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime > since + 1:
                    found.append(str(path))
    return found


def _first_submitted(records: tp.Sequence[tp.Mapping[str, tp.Any]]) -> float | None:
    """The earliest ``submitted_at`` of ``records`` (epoch s), None without one."""
    import datetime

    times = []
    for record in records:
        with contextlib.suppress(TypeError, ValueError):
            times.append(datetime.datetime.fromisoformat(str(record["submitted_at"])).timestamp())
    return min(times) if times else None


def _kept_return(record: tp.Mapping[str, tp.Any], overrides: tp.Sequence[str]) -> JobReturn:
    """The JobReturn of a member kept by a resume: COMPLETED, its value the final loss of its ``result.json``
    (read, never written)."""
    import json

    ret = JobReturn()
    ret.overrides = list(overrides)
    ret.task_name = str(record.get("log_name") or record.get("job_name") or "")
    ret.working_dir = str(record["job_dir"])
    try:
        value = json.loads((Path(record["job_dir"]) / RESULT_FILE).read_text())
    except (OSError, ValueError):
        value = None
    ret.status = JobStatus.COMPLETED
    ret.return_value = value.get("loss") if isinstance(value, dict) else value
    return ret


def failure(ret: JobReturn) -> BaseException | None:
    """A failed job's exception, through Hydra's public ``return_value`` (which raises it) without the line Hydra
    writes to stderr first ("Error executing job with overrides: [...]"): the command's own line says which job
    and why (the exception names the key)."""
    with contextlib.redirect_stderr(io.StringIO()):
        try:
            ret.return_value  # noqa: B018
        except Exception as e:
            return e
    return None


def raise_failure(ret: JobReturn) -> None:
    """Raise a failed job's exception (:func:`failure`)."""
    error = failure(ret)
    if error is not None:
        raise error


def _fail_config(error: Exception) -> tp.NoReturn:
    """Exit with the one line for a config error of a job's composition (:func:`automodel_hydra.errors.describe`);
    re-raise any other error."""
    from automodel_hydra import errors

    line = errors.describe(error)
    if line is None:
        raise error
    driver.fail(line)


def launch_calls(launcher: AutomodelLauncher, job_overrides: tp.Sequence[tp.Sequence[str]],
                 initial_job_idx: int) -> tp.Sequence[JobReturn]:
    """Run each job of a task function that is not ours as a call job on ``hydra.launcher.backend`` (see the
    module's docstring); returns the JobReturns the jobs' processes pickled back, in order. A bad launcher option
    exits with one line (status 2) before anything is written."""
    assert launcher.config is not None and launcher.hydra_context is not None and launcher.task_function is not None
    config, context = launcher.config, launcher.hydra_context
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    try:
        backend, section = call_options(config)
        base = _call_train_config(backend, section)
    except driver.USER_ERRORS as e:
        driver.fail(driver.one_line(e))
    sweep_dir = Path(str(config.hydra.sweep.dir))
    max_failures = _max_failures(config)
    sweep_dir.mkdir(parents=True, exist_ok=True)
    name = f"{getattr(launcher.task_function, '__module__', '?')}." \
           f"{getattr(launcher.task_function, '__qualname__', launcher.task_function)}"
    log.info(f"sweep dir: {sweep_dir}: {len(job_overrides)} job(s) of {name} on {backend}, one process each")
    shared = call.shared_payload(launcher.task_function, context)  # the same for every job: pickled once
    state = Singleton.get_state()
    jobs: list[driver.Prepared] = []
    configs: list[DictConfig] = []
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        sweep_config = context.config_loader.load_sweep_config(config, list(overrides))
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"automodel_{idx}"
            sweep_config.hydra.job.num = idx
        HydraConfig.instance().set_config(sweep_config)
        job_dir = _sweep_job_dir(sweep_config)
        job = JobSpec(job_dir=job_dir, job_name=str(sweep_config.hydra.job.name),
                      overrides=tuple(str(o) for o in sweep_config.hydra.overrides.task), job_num=idx,
                      call=call.payload(shared, sweep_config))
        jobs.append(driver.Prepared(dataclasses.replace(base, output_dir=str(job_dir)), job, dry_run=False))
        configs.append(sweep_config)
        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        Singleton.set_state(state)
    with driver.one_line_exits(log.error):
        outcomes = driver.launch(jobs, sweep_dir, results_needed(config), max_failures=max_failures)
    _record_states(launcher, outcomes)
    return [_call_return(outcome, sweep_config) for outcome, sweep_config in zip(outcomes, configs)]


def _record_states(launcher: AutomodelLauncher, outcomes: tp.Sequence[driver.Outcome]) -> None:
    """Keep each job's final state (None: submitted and not waited for) for the sweep's last line, which our
    sweeper prints after every batch has run (:func:`automodel_hydra.progress.last_line`); a dry run keeps none."""
    launcher.job_states.extend(o.result.state if o.result is not None else None
                               for o in outcomes if o.sub is not None or o.result is not None)


def _call_return(outcome: driver.Outcome, sweep_config: DictConfig) -> JobReturn:
    """The JobReturn a call job's process pickled back in this launch (``call_result.pkl``, or ``call_error.pkl``
    when its task function raised; its header carries ``launch/run_id``'s id), or, when it wrote none (it died,
    was cancelled, or was not waited for), one made here from the job's config and the backend's account of it."""
    job = outcome.prepared.job
    for path in (job.result_file, job.call_error_file):
        if written_by_this_launch(job, path):
            try:
                return tp.cast(JobReturn, call.read_job_return(path))
            except Exception as e:
                error: Exception = RuntimeError(f"{path}: the job's JobReturn cannot be read here: {e}")
                break
    else:
        error = RuntimeError("no JobReturn")
    ret = JobReturn()
    ret.overrides = list(job.overrides)
    ret.cfg = copy.deepcopy(sweep_config)
    with read_write(ret.cfg), open_dict(ret.cfg):
        del ret.cfg["hydra"]
    ret.hydra_cfg = copy.deepcopy(sweep_config)
    with read_write(ret.hydra_cfg.hydra.runtime), open_dict(ret.hydra_cfg.hydra.runtime):
        ret.hydra_cfg.hydra.runtime.output_dir = str(job.job_dir)
    ret.working_dir = str(job.job_dir) if sweep_config.hydra.job.chdir else os.getcwd()
    ret.task_name = job.job_name
    try:
        value = outcome.value()
    except JobFailedError as e:
        ret.status, ret.return_value = JobStatus.FAILED, e
        return ret
    if outcome.result is not None:  # completed, yet its JobReturn is missing or unreadable
        ret.status, ret.return_value = JobStatus.FAILED, error
    else:  # not waited for (slurm.detach): where the job is
        ret.status, ret.return_value = JobStatus.COMPLETED, value
    return ret


@contextlib.contextmanager
def _job_context(sweep_config: DictConfig, ret: JobReturn) -> tp.Iterator[None]:
    """What ``run_job`` has in place when it calls ``on_job_end``: the job's Hydra config, its logging (console and
    the job's own log) and, under ``hydra.job.chdir``, its output dir as working dir."""
    saved, cwd = HydraConfig.instance().cfg, os.getcwd()
    HydraConfig.instance().set_config(sweep_config)
    configure_log(sweep_config.hydra.job_logging, sweep_config.hydra.verbose)
    try:
        if sweep_config.hydra.job.chdir and ret.working_dir:
            os.chdir(ret.working_dir)
        yield
    finally:
        os.chdir(cwd)
        HydraConfig.instance().cfg = saved
