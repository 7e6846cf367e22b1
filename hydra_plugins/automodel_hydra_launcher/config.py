"""Hydra launcher configs: ``hydra/launcher=automodel_{interactive,slurm,skypilot}``.

The job's own sections (``interactive:``, ``slurm:``, ``skypilot:``) hold every option, so a sweep can vary them;
these nodes only name the launcher class. ``launcher=slurm`` selects both."""

from dataclasses import dataclass

from hydra.core.config_store import ConfigStore

_PKG = "hydra_plugins.automodel_hydra_launcher.launchers"


@dataclass
class InteractiveLauncherConf:
    _target_: str = f"{_PKG}.InteractiveLauncher"


@dataclass
class SlurmLauncherConf:
    _target_: str = f"{_PKG}.SlurmLauncher"


@dataclass
class SkyPilotLauncherConf:
    _target_: str = f"{_PKG}.SkyPilotLauncher"


cs = ConfigStore.instance()
for _name, _node in (("automodel_interactive", InteractiveLauncherConf), ("automodel_slurm", SlurmLauncherConf),
                     ("automodel_skypilot", SkyPilotLauncherConf)):
    cs.store(group="hydra/launcher", name=_name, node=_node, provider="automodel_hydra")
