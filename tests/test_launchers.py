"""Our Hydra launchers against Hydra's own launcher test suites (STYLE.md section e), plus discovery.

The suites' task functions are not our recipe, so each job runs in-process through ``run_job``, exactly as it
would before our launcher submits a recipe job; what is checked is the Hydra contract: dirs, job ids and numbers,
overrides, ``.hydra/`` files, errors re-raised from ``JobReturn``, custom resolvers."""

from __future__ import annotations

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher
from hydra.test_utils.launcher_common_tests import IntegrationTestSuite, LauncherTestSuite

from hydra_plugins.automodel_hydra_launcher.launchers import InteractiveLauncher, SkyPilotLauncher, SlurmLauncher

LAUNCHERS = ["automodel_interactive", "automodel_slurm", "automodel_skypilot"]


@pytest.mark.parametrize("cls", [InteractiveLauncher, SlurmLauncher, SkyPilotLauncher])
def test_discovery(cls: type) -> None:
    names = [x.__name__ for x in Plugins.instance().discover(Launcher)]
    assert cls.__name__ in names


@pytest.mark.parametrize("launcher_name, overrides", [(name, []) for name in LAUNCHERS])
class TestAutomodelLaunchers(LauncherTestSuite):
    pass


@pytest.mark.slow
@pytest.mark.parametrize("task_launcher_cfg, extra_flags",
                         [({}, ["-m", f"hydra/launcher={name}"]) for name in LAUNCHERS[:1]])
class TestAutomodelLaunchersIntegration(IntegrationTestSuite):
    pass
