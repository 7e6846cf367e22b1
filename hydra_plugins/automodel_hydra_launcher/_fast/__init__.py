"""The sweep fast path: a sweep's jobs set up as Hydra sets them up, without composing, copying and dumping every
job's config with Hydra's general machinery (200 points of ``train.py``: ~26 -> ~4 CPU-s to the first ``sbatch``).

One door: the launcher calls :func:`setup_jobs` with its *exact path*, Hydra's own ``load_sweep_config`` and
``run_job`` for one job; every job the fast path does not take goes through that exact path, and what the fast
path does take ends up as the exact path would leave it. ``tests/test_fast_path.py`` runs both paths over a corpus
of sweeps and asserts the same job configs, validation results and ``.hydra/`` files, byte for byte; so the parts
below may change freely as long as it passes.

The parts (each module's docstring says which rule of Hydra or OmegaConf it follows, and where that rule is
documented):

* ``_compose``: one Hydra compose per distinct set of config-group choices; a job's config is a copy of that base
  with its value overrides applied as Hydra applies them.
* ``_jobs``: what ``run_job`` does for a job (its dir, ``.hydra/`` files, log, ``env_set``, ``chdir``), done with
  state kept per base config, and the task function's ``prepare`` called inside it.
* ``_yaml``: OmegaConf's YAML output with libyaml's emitter.
* ``_load``: the loader ``prepare`` validates through (``SweepLoader``): the previous job's typed schema with the
  changed values set.

The fast path does not apply (every job takes the exact path) when Hydra callbacks are configured: they must see
each job as ``run_job`` shows it. Its modules are private (leading underscore) because Hydra's plugin scan imports
every package under ``hydra_plugins`` and executes every public module in it: this ``__init__`` imports nothing
until it is called.
"""

from __future__ import annotations

import logging
import typing as tp

if tp.TYPE_CHECKING:
    from hydra.core.utils import JobReturn
    from hydra.types import HydraContext
    from omegaconf import DictConfig

log = logging.getLogger(__name__)

#: The launcher's exact path for one job: ``(job number, its overrides) -> its JobReturn``, through Hydra's
#: ``load_sweep_config`` and ``run_job``, which leave that job's HydraConfig and logging in place (restored here).
Exact = tp.Callable[[int, tp.Sequence[str]], "JobReturn"]


def setup_jobs(context: HydraContext, config: DictConfig, prepare: tp.Callable[..., tp.Any],
               job_overrides: tp.Sequence[tp.Sequence[str]], initial_job_idx: int, exact: Exact,
               job_nums: tp.Sequence[int] | None = None) -> list[JobReturn]:
    """Set up and ``prepare`` every job of one launch (numbered from ``initial_job_idx``, or ``job_nums``: a
    resumed sweep's members that run again keep their numbers) as ``exact`` would.

    Parameters
    ----------
    context, config:
        The launcher's Hydra context and the sweep's config.
    prepare:
        The task function's ``automodel_prepare``; called as ``prepare(cfg, load=...)`` inside the job's Hydra
        context, as ``run_job`` calls a task function.
    exact:
        The launcher's own path for one job, taken for every job the fast path does not set up.

    Returns one JobReturn per job, in order (a job that failed to prepare: FAILED with its exception). Each job's
    launch line (``#N : overrides``) goes to the console and that job's log, as the exact path logs it; the
    console logging and Hydra's global state are the sweep's again on return."""
    from hydra.core.singleton import Singleton
    from hydra.core.utils import configure_log, filter_overrides

    from ._compose import SweepComposer
    from ._jobs import FastJobs

    state = Singleton.get_state()
    composer = SweepComposer(context.config_loader, config)  # one Hydra compose per set of group choices
    fast = None if config.hydra.callbacks else FastJobs(composer, config, prepare)
    returns: list[JobReturn] = []
    nums = list(job_nums) if job_nums is not None else range(initial_job_idx, initial_job_idx + len(job_overrides))
    for idx, overrides in zip(nums, job_overrides):
        ret = fast.run(idx, overrides) if fast is not None else None
        if ret is not None:
            returns.append(ret)
        else:
            returns.append(exact(idx, overrides))
        # the job's logging is still in place: its launch line goes to the console and to its own log only
        log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
        if ret is None:  # the exact path set the global HydraConfig and the logging: the sweep's again
            configure_log(config.hydra.hydra_logging, config.hydra.verbose)
            Singleton.set_state(state)
            if fast is not None:
                fast.invalidate()
    done = fast.jobs if fast is not None else 0
    if done:
        configure_log(config.hydra.hydra_logging, config.hydra.verbose)
        Singleton.set_state(state)
    log.debug(f"{done} of {len(job_overrides)} job(s) set up as copies of {composer.composed} composed "
              f"config(s); {len(job_overrides) - done} through Hydra's run_job")
    return returns
