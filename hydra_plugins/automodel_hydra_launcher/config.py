"""Hydra registrations of automodel-hydra (Hydra imports this module when it scans ``hydra_plugins``):
the launcher ``hydra/launcher=automodel`` and the recipe schema ``llm_finetune_schema``.

The job's own sections (``interactive:``, ``slurm:``, ``skypilot:``) hold every option, so a sweep can vary them
and each job routes by its own sections; the launcher node only names the launcher class."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

from automodel_hydra.config import register


@dataclass
class AutomodelLauncherConf:
    _target_: str = "hydra_plugins.automodel_hydra_launcher.launcher.AutomodelLauncher"


ConfigStore.instance().store(group="hydra/launcher", name="automodel", node=AutomodelLauncherConf,
                             provider="automodel_hydra")
register()
