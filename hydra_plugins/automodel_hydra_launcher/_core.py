"""The shared ``launch()`` of our Hydra launchers (the sequence of Hydra's joblib/ray launchers' ``_core``).

1. For each job: ``load_sweep_config``, set ``hydra.job.id/num``, ``run_job`` in this process. Our recipe's task
   function (:func:`automodel_hydra.driver.run`) only *plans* here: it validates, writes the job's dirs and
   ``launch/`` files and hands the plan back; any other task function simply runs.
2. If any job failed to plan (a bad value), stop before submitting anything.
3. Submit the collected plans together (:func:`automodel_hydra.driver.execute`), wait where they say so, and put
   each job's real result (or failure) into its ``JobReturn``, in input order.
"""

from __future__ import annotations

import logging
import typing as tp
from pathlib import Path

from hydra.core.hydra_config import HydraConfig
from hydra.core.singleton import Singleton
from hydra.core.utils import JobReturn, JobStatus, configure_log, filter_overrides, run_job, setup_globals
from omegaconf import open_dict

from automodel_hydra import driver
from automodel_hydra.plan import JobFailedError

if tp.TYPE_CHECKING:
    from .launchers import AutomodelLauncher

log = logging.getLogger(__name__)


def launch(launcher: AutomodelLauncher, job_overrides: tp.Sequence[tp.Sequence[str]],
           initial_job_idx: int) -> tp.Sequence[JobReturn]:
    setup_globals()
    assert launcher.config is not None and launcher.hydra_context is not None and launcher.task_function is not None
    configure_log(launcher.config.hydra.hydra_logging, launcher.config.hydra.verbose)
    sweep_dir = Path(str(launcher.config.hydra.sweep.dir))
    sweep_dir.mkdir(parents=True, exist_ok=True)
    log.info(f"AutomodelLauncher({launcher.backend}) is launching {len(job_overrides)} jobs locally")
    state = Singleton.get_state()
    returns: list[JobReturn] = []
    with driver.collecting() as collected:
        for idx, overrides in enumerate(job_overrides, start=initial_job_idx):
            log.info(f"\t#{idx} : {' '.join(filter_overrides(overrides))}")
            sweep_config = launcher.hydra_context.config_loader.load_sweep_config(launcher.config, list(overrides))
            with open_dict(sweep_config):
                sweep_config.hydra.job.id = f"{launcher.backend}_{idx}"
                sweep_config.hydra.job.num = idx
            HydraConfig.instance().set_config(sweep_config)
            returns.append(run_job(hydra_context=launcher.hydra_context, task_function=launcher.task_function,
                                   config=sweep_config, job_dir_key="hydra.sweep.dir",
                                   job_subdir_key="hydra.sweep.subdir"))
            Singleton.set_state(state)
    if not collected:
        return returns
    bad = next((r for r in returns if r.status == JobStatus.FAILED), None)
    if bad is not None:  # a job failed to plan: submit nothing
        raise bad._return_value
    plans = [plan for plan, _ in collected]
    dry = all(dry_run for _, dry_run in collected)
    driver.write_sweep_files(plans, sweep_dir, echo=dry)
    if dry:
        return returns
    outcome = driver.execute(plans, sweep_dir)
    for ret in returns:
        pending = ret.return_value if ret.status == JobStatus.COMPLETED else None
        if not isinstance(pending, driver.Pending):
            continue
        sub, result = outcome[pending.plan.job.job_dir]
        if result is None:  # detached: submitted, not waited for
            ret.return_value = {"job_ids": sub.ids, "job_dir": str(sub.plan.job.job_dir)}
            continue
        try:
            ret.return_value = driver.value_or_raise(sub, result)
        except JobFailedError as e:
            ret.status, ret._return_value = JobStatus.FAILED, e
    return returns
