"""NeMo AutoModel's ``nemo_run:`` section (its NeMo-Run launcher) with AutoModel's key names: ``executor: local``
runs here on torchrun with its ``ntasks_per_node``; a named executor, or a key a local run cannot honour, is one
line naming the ``slurm:`` keys to write instead, before anything is written or started."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from automodel_hydra import config
from automodel_hydra.schema import ConfigError
from tests.helpers import ROOT

RECIPE = "TrainFinetuneRecipeForNextTokenPrediction"


def load(nemo_run: dict[str, object], **sections: object) -> config.TrainConfig:
    return config.load({"recipe": RECIPE, "output_dir": "/tmp/automodel-test", "nemo_run": nemo_run,
                        "step_scheduler": {"max_steps": 2}, **sections})


def test_a_local_executor_runs_here_with_its_ntasks_per_node() -> None:
    cfg = load({"executor": "local", "ntasks_per_node": 3, "job_name": "local_test", "detach": True})
    assert cfg.backend == "interactive" and cfg.interactive.nproc_per_node == "3"
    assert "nemo_run" not in cfg.recipe_sections  # the recipe never sees the launcher's section
    # AutoModel's default executor is local; a value set in the config itself (the command line) wins
    assert load({"ntasks_per_node": 2}).interactive.nproc_per_node == "2"
    assert load({"ntasks_per_node": 2}, interactive={"nproc_per_node": "1"}).interactive.nproc_per_node == "1"


def test_a_named_executor_is_one_line_naming_the_slurm_keys_to_write() -> None:
    # AutoModel's docs/launcher/nemo-run.mdx quickstart section, as written there
    with pytest.raises(ConfigError) as e:
        load({"executor": "my_slurm", "container_image": "/images/custom.sqsh", "nodes": 1, "ntasks_per_node": 8,
              "time": "04:00:00", "job_name": "qwen3_moe_finetune"})
    line = str(e.value)
    assert "\n" not in line and e.value.key == "nemo_run.executor"
    assert "write the job's Slurm settings as a slurm: section" in line
    assert "slurm.container_image=/images/custom.sqsh, slurm.nodes=1, slurm.ntasks_per_node=8" in line
    assert "$NEMORUN_HOME/executors.py" in line


@pytest.mark.parametrize(("section", "key"), [
    ({"executor": "local", "nodes": 2}, "nemo_run.nodes"),  # a LocalExecutor has one node
    ({"container_image": "nvcr.io/nvidia/nemo:dev"}, "nemo_run.container_image"),
])
def test_a_key_a_local_run_cannot_honour_is_refused(section: dict[str, object], key: str) -> None:
    with pytest.raises(ConfigError, match="for Slurm write a slurm: section") as e:
        load(section)
    assert e.value.key == key


def test_nemo_run_beside_another_launcher_section_is_refused() -> None:
    with pytest.raises(ConfigError, match="keep either the nemo_run: or the slurm: section"):
        load({"executor": "local"}, slurm={"nodes": 1})


@pytest.mark.slow
def test_the_cli_refuses_a_named_executor_before_writing_anything(tmp_path: Path) -> None:
    path = tmp_path / "nemo_run.yaml"
    path.write_text(f"recipe: {RECIPE}\nnemo_run:\n  executor: my_slurm\n  nodes: 2\n"
                    "step_scheduler:\n  max_steps: 2\n")
    run = tmp_path / "R"
    proc = subprocess.run([sys.executable, "-m", "automodel_hydra.cli", str(path), f"hydra.run.dir={run}"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120, env={"PYTHONPATH": str(ROOT),
                          "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    errors = [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "nemo_run.executor='my_slurm'" in errors[0] and "slurm.nodes=2" in errors[0]
    assert not (run / "launch").exists()
