"""Our Hydra launcher is discovered by Hydra (what it does with a task function that is not ours:
tests/test_hydra_calls.py)."""

from __future__ import annotations

from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher

from hydra_plugins.automodel_hydra_launcher.launcher import AutomodelLauncher


def test_discovery() -> None:
    assert AutomodelLauncher.__name__ in [x.__name__ for x in Plugins.instance().discover(Launcher)]
