"""Plan-time imports are checked where the ranks run them. An AutoModel file whose optimizer is Transformer
Engine's FusedAdam (not installed on this CPU machine), flashoptim's FlashAdamW (installed, but its import needs a
GPU driver) or dion's Muon plans for Slurm, a Slurm container and SkyPilot, where the ranks import it; an
interactive run (the ranks are this machine's processes) refuses it in one line; a rank that cannot import it
fails in one line naming the key and its host, in its error file and the job log."""

from __future__ import annotations

import json
import subprocess
import sys
import typing as tp
from pathlib import Path

import pytest
import yaml

from automodel_hydra import config, driver
from automodel_hydra.automodel import files as automodel_files

pytestmark = [pytest.mark.automodel]
pytest.importorskip("nemo_automodel")

TE_ADAM = "transformer_engine.pytorch.optimizers.fused_adam.FusedAdam"  # as AutoModel's examples write it


def imports_here(target: str) -> bool:
    """Whether ``target``'s module imports in this process (the test's own premise, without the product's code)."""
    import importlib

    module = target.rpartition(".")[0]
    try:
        importlib.import_module(module)
    except Exception:
        return False
    return True


def sections(optimizer: str = TE_ADAM) -> dict[str, tp.Any]:
    """An AutoModel-shaped fine-tuning file's recipe sections, its optimizer ``optimizer``."""
    return {"recipe": "TrainFinetuneRecipeForNextTokenPrediction",
            "step_scheduler": {"global_batch_size": 8, "local_batch_size": 2, "max_steps": 2},
            "optimizer": {"_target_": optimizer, "lr": 1.0e-5, "weight_decay": 0},
            "loss_fn": {"_target_": "nemo_automodel.components.loss.masked_ce.MaskedCrossEntropy"}}


LAUNCHERS = {
    "slurm": {"slurm": {"nodes": 1, "ntasks_per_node": 1}},
    "slurm container": {"slurm": {"nodes": 1, "ntasks_per_node": 1, "container_image": "nvcr.io/nvidia/nemo:25.02"}},
    "skypilot": {"skypilot": {"cloud": "gcp", "accelerators": "H100:8"}},
}


@pytest.mark.parametrize("optimizer", [TE_ADAM, "flashoptim.FlashAdamW", "dion.Muon"])
@pytest.mark.parametrize("launcher", sorted(LAUNCHERS))
def test_an_optimizer_that_does_not_import_here_plans_where_ranks_run_elsewhere(
        launcher: str, optimizer: str, caplog: pytest.LogCaptureFixture) -> None:
    assert not imports_here(optimizer)  # the premise: this CPU machine cannot import it
    cfg = config.load({**sections(optimizer), "output_dir": "/tmp/automodel-test", **LAUNCHERS[launcher]})
    caplog.set_level("INFO", logger="automodel_hydra.driver")
    driver.check_recipe(cfg, set(), here=False)  # no error: the ranks' environment answers
    assert f"optimizer._target_={optimizer} does not import on this machine" in caplog.text
    # what imports here is still checked, for every launcher: torch has no NoSuchAdam wherever the ranks run
    wrong = config.load({**sections("torch.optim.NoSuchAdam"), "output_dir": "/tmp/automodel-test",
                         **LAUNCHERS[launcher]})
    with pytest.raises(automodel_files.RecipeSectionError, match=r"optimizer._target_: .*NoSuchAdam"):
        driver.check_recipe(wrong, set(), here=False)


def test_an_interactive_run_refuses_it_in_one_line() -> None:
    cfg = config.load({**sections(), "output_dir": "/tmp/automodel-test"})
    with pytest.raises(automodel_files.RecipeSectionError) as e:
        driver.check_recipe(cfg, set(), here=True)
    line = str(e.value)
    assert e.value.key == "optimizer._target_" and "\n" not in line
    assert TE_ADAM in line and "No module named 'transformer_engine'" in line


@pytest.mark.slow
def test_a_rank_that_cannot_import_it_fails_in_one_line_naming_the_key_and_its_host(tmp_path: Path) -> None:
    """One real rank (the worker process, as srun starts it) on the rank-side spec the driver writes."""
    cfg = config.load({**sections(), "output_dir": str(tmp_path), **LAUNCHERS["slurm"]})
    (tmp_path / "launch").mkdir()
    job = tmp_path / "launch" / "job.yaml"
    job.write_text(yaml.safe_dump(config.rank_spec(cfg)))
    log = tmp_path / "train.log"
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[1]), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "automodel_hydra.worker", str(job), "--log-file", str(log)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode != 0
    message = json.loads((tmp_path / "launch" / "error.rank0.json").read_text())["message"]["message"]
    assert message.startswith("RecipeSectionError: optimizer._target_: ") and "\n" not in message
    assert "No module named 'transformer_engine'" in message and "(on rank 0, host " in message
    errors = [line for line in log.read_text().splitlines() if "[ERROR]" in line]
    assert len(errors) == 1 and "optimizer._target_" in errors[0]  # one line in the job log, no traceback
