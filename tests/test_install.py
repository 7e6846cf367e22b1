"""A plain wheel install (no ``-e``, no checkout): the console command runs the Hydra app from the package itself
(its configs included) and prints the version; SkyPilot reached through its own interpreter (the bridge)."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.helpers import ROOT


@pytest.fixture(scope="module")
def wheel_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A scratch venv holding only this project's wheel (``pip wheel --no-deps .``); its dependencies are this
    environment's, reached through a ``.pth`` line (so the test installs nothing else and takes seconds)."""
    tmp = tmp_path_factory.mktemp("wheel")
    pip = [sys.executable, "-m", "pip"]
    subprocess.run([*pip, "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(tmp / "dist"), str(ROOT)],
                   check=True, timeout=300, capture_output=True)
    (whl,) = (tmp / "dist").glob("automodel_hydra-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    subprocess.run([*pip, "--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", str(whl)],
                   check=True, timeout=300, capture_output=True)
    site = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path("
                           "'purelib'))"], check=True, capture_output=True, text=True).stdout.strip()
    (Path(site) / "deps.pth").write_text(sysconfig.get_path("purelib") + "\n")
    return venv


@pytest.mark.slow  # builds a wheel and a venv (~20 s)
def test_wheel_install_runs_a_yaml_file_and_prints_its_version(wheel_venv: Path, tmp_path: Path) -> None:
    exe = wheel_venv / "bin" / "automodel-hydra"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH",)}
    version = subprocess.run([str(exe), "--version"], capture_output=True, text=True, timeout=60, env=env,
                             cwd=tmp_path)
    assert (version.returncode, version.stdout.strip()) == (0, "automodel-hydra 0.1.0"), version.stderr
    (tmp_path / "am_slurm.yaml").write_text(
        "defaults:\n  - llm_finetune\n  - _self_\nslurm:\n  nodes: 2\n  ntasks_per_node: 8\n  partition: batch\n")
    run = subprocess.run([str(exe), "am_slurm.yaml", "dry_run=true", f"hydra.run.dir={tmp_path / 'run'}"],
                         capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    script = (tmp_path / "run" / "launch" / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=2" in script and "#SBATCH --partition=batch" in script
    # the app, its configs and our Hydra plugins came from the wheel, not from this checkout
    where = subprocess.run([str(wheel_venv / "bin" / "python"), "-c", "import automodel_hydra.train as t, "
                            "hydra_plugins.automodel_hydra_launcher as p; print(t.CONFIG_PATH); print(p.__file__)"],
                           capture_output=True, text=True, timeout=60, env=env, cwd=tmp_path, check=True).stdout
    assert str(ROOT) not in where and where.count(str(wheel_venv)) == 2, where
