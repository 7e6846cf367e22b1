"""AutoModel's meaning for what its files say and leave out, at plan time: the batch-size rule over the
data-parallel ranks, AutoModel's Slurm defaults for AutoModel recipes only, and no GPU request unless
``gpus_per_node`` is given."""

from __future__ import annotations

import sys
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import config, recipes
from automodel_hydra.automodel.files import data_parallel_size
from automodel_hydra.backends import slurm
from automodel_hydra.plan import JobSpec
from automodel_hydra.schema import ConfigError

#: An AutoModel recipe by its fully qualified name (no import needed to plan it)
AUTOMODEL_RECIPE = "nemo_automodel.recipes.llm.train_ft.TrainFinetuneRecipeForNextTokenPrediction"


def _directives(text: str) -> dict[str, str]:
    return {k: v for k, _, v in (line[len("#SBATCH --"):].partition("=") for line in text.splitlines()
                                 if line.startswith("#SBATCH --"))}


def _plan(tmp_path: Path, recipe: tp.Any, sections: dict[str, tp.Any], **slurm_fields: tp.Any) -> str:
    cfg = config.load({"output_dir": str(tmp_path), "recipe": recipe, **sections,
                       "slurm": {"ntasks_per_node": 2, **slurm_fields}})
    return slurm.Slurm().plan(cfg, JobSpec(tmp_path, "train")).files["sbatch.sh"]


# ----------------------------------------------------------------------------------------------- data parallel


@pytest.mark.parametrize(("distributed", "world", "dp"), [
    (None, 8, 8),
    ({"strategy": "fsdp2", "dp_size": "none", "tp_size": 1, "cp_size": 1}, 8, 8),
    ({"tp_size": 2, "cp_size": 2, "pp_size": 2}, 8, 1),
    ({"tp_size": 4, "pp_size": None}, 8, 2),
    ({"strategy": "megatron_fsdp", "tp_size": 2, "pp_size": 4}, 8, 4),  # its mesh has no pipeline axis
    ({"dp_size": 2, "tp_size": 2}, 8, 2),  # an explicit dp_size stands
    ({"tp_size": "${oc.env:TP}"}, 8, 8),  # not a number here: nothing decided
])
def test_data_parallel_size_is_automodels(distributed: dict[str, tp.Any] | None, world: int, dp: int) -> None:
    sections = {} if distributed is None else {"distributed": distributed}
    assert data_parallel_size(sections, world) == dp


def test_tp_cp_pp_files_at_8_ranks_plan_and_a_bad_batch_names_the_data_parallel_size(tmp_path: Path) -> None:
    """A HEAD-style file with tp 2 x cp 2 at 8 ranks: global 8 = local 4 * dp 2 is AutoModel's valid batch."""
    sections = {"step_scheduler": {"global_batch_size": 8, "local_batch_size": 4},
                "distributed": {"strategy": "fsdp2", "tp_size": 2, "cp_size": 2, "pp_size": 1}}
    cfg = config.load({"output_dir": str(tmp_path), "recipe": AUTOMODEL_RECIPE, **sections})
    config.check_world(cfg, 8)  # refused before: 8 % (4 * 8) != 0
    bad = config.load({"output_dir": str(tmp_path), "recipe": AUTOMODEL_RECIPE, **sections,
                       "step_scheduler": {"global_batch_size": 4, "local_batch_size": 4}})
    with pytest.raises(ConfigError, match=r"local_batch_size \* data-parallel size \(of world size 8\) = 4 \* 2"):
        config.check_world(bad, 8)
    odd = config.load({"output_dir": str(tmp_path), "recipe": AUTOMODEL_RECIPE, **sections,
                       "distributed": {"tp_size": 3}})
    with pytest.raises(ConfigError, match=r"^distributed.tp_size=3 is invalid: the world size 8 must be a multiple"):
        config.check_world(odd, 8)


# ----------------------------------------------------------------------------------------------- whose defaults


def test_a_function_recipe_gets_slurms_own_defaults_not_automodels(tmp_path: Path, monkeypatch) -> None:
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "my_fn_recipe.py").write_text("def main(cfg, dist, should_stop):\n    return {}\n\n"
                                         "class Recipe:\n    def __init__(self, cfg): ...\n"
                                         "    def setup(self): ...\n    def run_train_validation_loop(self): ...\n")
    monkeypatch.syspath_prepend(str(pkg))
    for form in ("my_fn_recipe:main", "my_fn_recipe.main", {"_target_": "my_fn_recipe:main"}):
        assert recipes.kind_of(form) == "callable"
        d = _directives(_plan(tmp_path, form, {}))
        assert "partition" not in d and "exclusive" not in d and "mail-type" not in d, d
        assert d["time"] == "240" and d["job-name"] == recipes.recipe_target(form)
    text = _plan(tmp_path, "my_fn_recipe:main", {}, job_name="mine")
    assert _directives(text)["job-name"] == "mine" and "CUDA_DEVICE_MAX_CONNECTIONS" not in text
    # an AutoModel recipe (its own name, a bare one, or a class in AutoModel's style) keeps AutoModel's
    for form in (AUTOMODEL_RECIPE, "TrainFinetuneRecipeForNextTokenPrediction", "my_fn_recipe.Recipe"):
        assert recipes.kind_of(form) == "automodel"
    d = _directives(_plan(tmp_path, AUTOMODEL_RECIPE, {}))
    assert (d["partition"], d["time"], d["mail-type"], d["job-name"]) == ("batch", "5", "FAIL", "llm_finetune")
    assert "exclusive" in d


def test_no_gpu_is_requested_unless_gpus_per_node_is_given(tmp_path: Path) -> None:
    for recipe in (None, AUTOMODEL_RECIPE):
        sections: dict[str, tp.Any] = {}
        cfg = config.load({"output_dir": str(tmp_path), "recipe": recipe, **sections,
                           "slurm": {"ntasks_per_node": 4}})
        text = slurm.Slurm().plan(cfg, JobSpec(tmp_path, "train")).files["sbatch.sh"]
        assert "gpus-per-node" not in _directives(text)
        cfg = config.load({"output_dir": str(tmp_path), "recipe": recipe, "slurm": {"gpus_per_node": 4}})
        text = slurm.Slurm().plan(cfg, JobSpec(tmp_path, "train")).files["sbatch.sh"]
        assert _directives(text)["gpus-per-node"] == "4"


def test_a_gres_refusal_names_the_key(tmp_path: Path, monkeypatch) -> None:
    """sbatch's own refusal of a GPU request the cluster cannot meet gets the key that asked for it."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    sbatch = bin_dir / "sbatch"  # a stand-in for sbatch's refusal on a cluster without GPUs (its exact words)
    sbatch.write_text("#!/bin/sh\necho 'sbatch: error: Invalid generic resource (gres) specification' >&2\nexit 1\n")
    sbatch.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin")
    backend = slurm.Slurm()
    cfg = config.load({"output_dir": str(tmp_path), "slurm": {"gpus_per_node": 4, "snapshot": "none"}})
    (batch,) = backend.batches([backend.plan(cfg, JobSpec(tmp_path, "train"))], None)
    with pytest.raises(RuntimeError, match=r"gres.*: slurm.gpus_per_node \(#SBATCH --gpus-per-node\)"):
        backend.submit(batch)
