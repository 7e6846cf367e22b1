"""``AutomodelLauncher.launch``: the sequence of Hydra's joblib/ray launchers' ``_core``, with planning in place of
running.

1. The task function must declare the interface we plan through (``automodel_hydra.driver.launchable``); any
   other task function is refused, naming it — it is never run in this process under a launcher named Slurm.
2. For each job: compose its config (``_compose``: exactly Hydra's ``load_sweep_config``, composed once per set of
   config-group choices), set ``hydra.job.id/num``, and run Hydra's own ``run_job`` with the task
   function's ``automodel_prepare``: Hydra creates the job's dir, ``.hydra/`` and log exactly as for any job,
   calls ``on_job_start`` callbacks, and ``prepare`` validates the config (it starts nothing). The job's launch
   line (``#N : overrides``) goes to the console and to that job's own log, never to another job's.
3. If any job failed to prepare (a bad value), stop before anything is submitted, with one line naming the key.
4. ``driver.launch`` plans, writes, submits and waits for all jobs together; each job's real result (its final
   loss, or its failure) goes into its ``JobReturn`` through Hydra's public setters, and only then do the
   ``on_job_end`` callbacks see it — with that job's Hydra config, log and (``hydra.job.chdir``) working dir in
   place, as ``run_job`` gives them.

A sweeper may call ``launch`` several times for one sweep (``hydra.sweeper.max_batch_size``); each call adds its
jobs to the sweep's ``launch/manifest.json``.
"""

from __future__ import annotations

import contextlib
import logging
import os
import typing as tp
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from hydra.types import HydraContext
from omegaconf import DictConfig, open_dict

from automodel_hydra import driver
from automodel_hydra.plan import JobFailedError

from ._compose import SweepComposer
from ._jobs import FastJobs

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


def _prepare_function(task_function: tp.Any) -> tp.Callable[[DictConfig], driver.Prepared]:
    prepare = getattr(task_function, driver.PREPARE_ATTR, None)
    if prepare is None:
        name = f"{getattr(task_function, '__module__', '?')}.{getattr(task_function, '__qualname__', task_function)}"
        raise ValueError(f"hydra/launcher=automodel runs task functions declared with @automodel_hydra.driver."
                         f"launchable (train.py's main); {name} is not one: decorate it, or pick another launcher "
                         "(hydra/launcher=basic runs it here, hydra/launcher=submitit_slurm on Slurm)")
    return tp.cast(tp.Callable[[DictConfig], driver.Prepared], prepare)


def launch(launcher: AutomodelLauncher, job_overrides: tp.Sequence[tp.Sequence[str]],
           initial_job_idx: int) -> tp.Sequence[JobReturn]:
    setup_globals()
    assert launcher.config is not None and launcher.hydra_context is not None and launcher.task_function is not None
    prepare = _prepare_function(launcher.task_function)
    config, context = launcher.config, launcher.hydra_context
    configure_log(config.hydra.hydra_logging, config.hydra.verbose)
    sweep_dir = Path(str(config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log.info(f"sweep dir: {sweep_dir}: preparing {len(job_overrides)} job(s)")
    state = Singleton.get_state()
    planning = HydraContext(config_loader=context.config_loader,
                            callbacks=tp.cast(tp.Any, _DeferJobEnd(context.callbacks)))
    returns: list[JobReturn] = []
    configs: list[DictConfig | None] = []  # None: a job set up by _jobs (no callbacks to show it to)
    console = lambda: configure_log(config.hydra.hydra_logging, config.hydra.verbose)  # noqa: E731
    composer = SweepComposer(context.config_loader, config)  # one Hydra compose per set of group choices
    fast = None if config.hydra.callbacks else FastJobs(composer, config, prepare)
    for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
        ret = fast.run(idx, overrides) if fast is not None else None
        if ret is not None:  # set up as run_job would, its logging still in place for the launch line below
            returns.append(ret)
            configs.append(None)
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            continue
        try:
            sweep_config = composer.compose(overrides)
        except AssertionError:  # OmegaConf's answer to `slurm.nodes=4` when the job has no slurm: section
            message = driver.unselected_section_message(overrides)
            if message is None:
                raise
            driver.fail(message)
        with open_dict(sweep_config):
            sweep_config.hydra.job.id = f"automodel_{idx}"
            sweep_config.hydra.job.num = idx
        HydraConfig.instance().set_config(sweep_config)
        returns.append(run_job(hydra_context=planning, task_function=prepare, config=sweep_config,
                               job_dir_key="hydra.sweep.dir", job_subdir_key="hydra.sweep.subdir"))
        configs.append(sweep_config)
        # run_job left this job's logging in place: its launch line goes to the console and to its own log only
        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        console()
        Singleton.set_state(state)
        if fast is not None:
            fast.invalidate()
    if fast is not None and fast.jobs:
        console()
        Singleton.set_state(state)
    log.debug(f"{fast.jobs if fast is not None else 0} of {len(job_overrides)} job(s) set up as copies of "
              f"{composer.composed - composer.fallbacks} composed config(s); {composer.fallbacks} composed by Hydra")
    try:
        for ret in returns:
            if ret.status == JobStatus.FAILED:  # a job failed to prepare: submit nothing
                ret.return_value  # noqa: B018  (Hydra's public way to re-raise the job's exception)
        outcomes = driver.launch([ret.return_value for ret in returns], sweep_dir)
    except driver.Stopped as e:
        log.error(f"stopped: {e}")
        raise SystemExit(130) from None
    except driver.USER_ERRORS as e:  # the same one line as a single run's, for every job's bad value
        driver.fail(driver.one_line(e))
    for ret, job_config, outcome in zip(returns, configs, outcomes):
        try:
            ret.return_value = outcome.value()
        except JobFailedError as e:
            ret.status = JobStatus.FAILED
            ret.return_value = e
        if job_config is None:
            continue
        with _job_context(job_config, ret):
            context.callbacks.on_job_end(config=job_config, job_return=ret)
        console()
    return returns


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
