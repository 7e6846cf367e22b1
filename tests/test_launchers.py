"""Our Hydra launcher: discovered by Hydra, and it plans only task functions that declare our interface."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hydra.core.plugins import Plugins
from hydra.plugins.launcher import Launcher

from hydra_plugins.automodel_hydra_launcher.launcher import AutomodelLauncher


def test_discovery() -> None:
    assert AutomodelLauncher.__name__ in [x.__name__ for x in Plugins.instance().discover(Launcher)]


@pytest.mark.slow  # runs train.py or a script as a real process
def test_a_foreign_task_function_is_refused_naming_it_and_never_run_here(tmp_path: Path) -> None:
    """Under a launcher named Slurm, another task function must not silently run on the submitting machine."""
    app = tmp_path / "my_app.py"
    app.write_text(
        "import hydra\n"
        "from pathlib import Path\n"
        "@hydra.main(version_base=None, config_path=None)\n"
        "def my_task(cfg):\n"
        "    Path('RAN_HERE').touch()\n"
        "if __name__ == '__main__':\n"
        "    my_task()\n")
    out = subprocess.run([sys.executable, str(app), "-m", "hydra/launcher=automodel", "+x=1,2",
                          f"hydra.sweep.dir={tmp_path / 'S'}"], cwd=tmp_path, capture_output=True, text=True)
    assert out.returncode != 0
    assert "__main__.my_task is not one" in out.stderr and "hydra/launcher=basic" in out.stderr
    assert not (tmp_path / "RAN_HERE").exists()
