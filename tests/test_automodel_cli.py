"""AutoModel's CLI shapes through ``automodel-hydra`` (``automodel-hydra finetune llm -c FILE``, ``FILE.yaml``,
``--nproc-per-node N`` with or without ``=``, ``--key value`` overrides, flags before the file) with AutoModel's
meaning, one line for a form that cannot mean the same, and a ``--help`` that shows the file forms and lists only
real config groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from automodel_hydra import argv
from tests.automodel_assets import SQUAD_YAML, cpu_overrides, rank_env
from tests.helpers import ROOT

pytest_plugins = ["tests.automodel_assets"]


def _older_file(tmp_path: Path, extra: str = "") -> Path:
    """AutoModel's example as its older releases had it: no ``recipe:`` line (the CLI command chose the recipe)."""
    path = tmp_path / "llama3_2_1b_squad_old.yaml"
    text = "".join(line for line in SQUAD_YAML.read_text().splitlines(keepends=True)
                   if not line.startswith("recipe:"))
    path.write_text(text + extra)
    return path


def _overrides(args: list[str]) -> list[str]:
    return args[4:]  # after --config-dir D --config-name F


def test_older_cli_shape_chooses_the_recipe_and_keeps_automodels_flags(tmp_path: Path) -> None:
    old = _older_file(tmp_path)
    for form in (["finetune", "llm", "-c", str(old), "--nproc-per-node=2"],
                 ["finetune", "llm", "--nproc-per-node", "2", "--config", str(old)],  # flags before the file
                 ["--nproc_per_node", "2", "finetune", "llm", "-c", str(old)]):
        out = _overrides(argv.from_automodel_cli(form))
        assert "++recipe=TrainFinetuneRecipeForNextTokenPrediction" in out, form
        assert "++interactive.nproc_per_node=2" in out, form
    kd = _overrides(argv.from_automodel_cli(["kd", "llm", "-c", str(old), "--model.pretrained_model_name_or_path",
                                             "Qwen/Qwen3-0.6B", "--peft", "-m", "optimizer.lr=1e-5,3e-5"]))
    assert "++recipe=KnowledgeDistillationRecipeForNextTokenPrediction" in kd
    assert "++model.pretrained_model_name_or_path=Qwen/Qwen3-0.6B" in kd  # AutoModel's --key value
    assert "++peft=true" in kd  # a bare --flag is true, as in AutoModel's parse_cli_argv
    assert kd[kd.index("-m") + 1] == "optimizer.lr=1e-5,3e-5"  # Hydra's own arguments pass through
    head = _overrides(argv.from_automodel_cli(["--nproc-per-node=3", str(SQUAD_YAML), "--a.b=c"]))
    assert "++interactive.nproc_per_node=3" in head and "++a.b=c" in head
    assert not any(o.startswith("++recipe=") for o in head)  # the file names its recipe


@pytest.mark.parametrize(("form", "message"), [
    (["finetune", "llm"], "no config file: automodel-hydra finetune llm -c FILE.yaml"),
    (["train", "llm", "-c", "{old}"], "<command> one of finetune, pretrain, kd, benchmark"),
    (["pretrain", "vlm", "-c", "{old}"], "AutoModel has no pretrain recipe for vlm"),
    (["{old}"], "names no recipe: and its sections are AutoModel's: run it as AutoModel's older CLI did, "
                "automodel-hydra finetune llm -c {old}"),
    (["kd", "llm", "-c", str(SQUAD_YAML)], "names recipe: TrainFinetuneRecipeForNextTokenPrediction, and `kd llm` "
                                           "means KnowledgeDistillationRecipeForNextTokenPrediction"),
    (["finetune", "llm", "-c", "{slurm}", "--nproc-per-node=2"],
     "has a slurm: section (AutoModel ignored the flag there): write --slurm.ntasks_per_node=2"),
])
def test_forms_that_cannot_mean_the_same_say_what_to_write(tmp_path: Path, form: list[str], message: str) -> None:
    old = _older_file(tmp_path)
    (tmp_path / "s").mkdir()
    slurm = _older_file(tmp_path / "s", "slurm:\n  nodes: 1\n")
    form = [a.format(old=old, slurm=slurm) for a in form]
    with pytest.raises(argv.UsageError) as err:
        argv.from_automodel_cli(form)
    assert message.format(old=old) in str(err.value) and "\n" not in str(err.value)


def _cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "automodel_hydra.cli", *args], cwd=cwd, env=env, text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)


@pytest.mark.slow
def test_help_shows_the_file_forms_and_no_past_run_as_a_config_group(tmp_path: Path) -> None:
    assert "automodel-hydra FILE.yaml" in _cli("--help", cwd=tmp_path).stdout
    train_help = subprocess.run([sys.executable, str(ROOT / "train.py"), "--help"], text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120).stdout
    assert "automodel-hydra FILE.yaml" in train_help
    (tmp_path / "mine.yaml").write_text("step_scheduler:\n  max_steps: 3\n")
    past = tmp_path / "outputs" / "2026-01-01" / "10-00-00-abcd" / ".hydra"  # a past run beside the file
    past.mkdir(parents=True)
    for name in ("config", "hydra", "overrides"):
        (past / f"{name}.yaml").write_text("{}\n")
    out = _cli("mine.yaml", "--help", cwd=tmp_path).stdout
    assert "launcher: interactive, skypilot, slurm" in out, out
    assert "outputs" not in out, out
    (tmp_path / "launcher").mkdir()  # a dir beside the file is no config group either
    (tmp_path / "launcher" / "slurm.yaml").write_text("bogus: 1\n")
    out = _cli("mine.yaml", "--cfg", "job", "dry_run=true", cwd=tmp_path).stdout
    assert "bogus" not in out and "max_steps: 3" in out, out


@pytest.mark.slow
def test_a_recipe_module_whose_import_raises_is_refused_in_one_line(tmp_path: Path) -> None:
    """A recipe module that raises on import (not ImportError: triton's RuntimeError on a host without a GPU
    driver, which AutoModel's speculative-decoding recipes meet) is a refusal naming the recipe, not a traceback."""
    (tmp_path / "gpu_only_recipe.py").write_text('raise RuntimeError("0 active drivers ([]). There should only '
                                                 'be one.")\n')
    (tmp_path / "mine.yaml").write_text("recipe: gpu_only_recipe:main\nstep_scheduler:\n  max_steps: 3\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH"))
                                                       if p)}
    proc = _cli("mine.yaml", "dry_run=true", cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == (
        "error: recipe='gpu_only_recipe:main': importing module 'gpu_only_recipe' failed here (RuntimeError: 0 "
        "active drivers ([]). There should only be one.); it must import on the host that plans the job and on "
        "every rank")
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("launch"))


@pytest.mark.automodel
@pytest.mark.slow
def test_an_older_file_trains_with_the_commands_recipe_on_nproc_ranks(tiny_llama_dir: Path, squad_dir: Path,
                                                                       tmp_path: Path) -> None:
    pytest.importorskip("nemo_automodel")
    old = _older_file(tmp_path)
    run = tmp_path / "R"
    overrides = [f"--{o}" for o in cpu_overrides(tiny_llama_dir, squad_dir, tmp_path / "ckpt", max_steps=2,
                                                 ckpt_every_steps=2, val_every_steps=2)]
    proc = _cli("finetune", "llm", "--nproc-per-node=2", "-c", str(old), *overrides, f"hydra.run.dir={run}",
                cwd=tmp_path, env=rank_env())
    assert proc.returncode == 0, proc.stdout[-4000:]
    assert "recipe: TrainFinetuneRecipeForNextTokenPrediction" in (run / "launch" / "job.yaml").read_text()
    assert "--nproc_per_node=2" in (run / "launch" / "torchrun.sh").read_text()
    rows = [json.loads(line) for line in (tmp_path / "ckpt" / "training.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1]


def test_trainpy_override_forms_mean_the_same_for_a_users_file(tmp_path: Path) -> None:
    """``launcher=``, ``profile=``, ``sweep=`` and keys of our sections, written as for ``train.py``: group choices
    the file's defaults list lacks are added, our sections' keys set; a recipe key keeps Hydra's rule."""
    out = _overrides(argv.from_automodel_cli([str(SQUAD_YAML), "launcher=skypilot", "profile=nsys", "sweep=x",
                                              "skypilot.num_nodes=2", "interactive.nproc_per_node=2", "seed=3",
                                              "optimizer.lr=1e-4", "hydra.run.dir=R", "+launcher=slurm"]))
    assert out[:9] == ["+launcher=skypilot", "+profile=nsys", "+sweep=x", "++skypilot.num_nodes=2",
                       "++interactive.nproc_per_node=2", "++seed=3", "optimizer.lr=1e-4", "hydra.run.dir=R",
                       "+launcher=slurm"]
    # a launcher's key without its section or launcher= choice: not added (it would route the job there)
    assert _overrides(argv.from_automodel_cli([str(SQUAD_YAML), "slurm.nodes=2"]))[0] == "slurm.nodes=2"
    chooses = tmp_path / "chooses.yaml"  # a file whose defaults list names the group: a plain choice, as Hydra's
    chooses.write_text("defaults:\n  - launcher: slurm\n  - _self_\nrecipe: my.mod:main\n")
    assert _overrides(argv.from_automodel_cli([str(chooses), "launcher=skypilot"]))[0] == "launcher=skypilot"
    bundled = tmp_path / "bundled.yaml"  # no recipe: every section is the bundled recipe's, typed by our schema
    bundled.write_text("skypilot:\n  cloud: gcp\n")
    assert _overrides(argv.from_automodel_cli([str(bundled), "optim.lr=1e-4"]))[0] == "++optim.lr=1e-4"


@pytest.mark.automodel
@pytest.mark.slow
def test_launcher_and_profile_choices_on_an_automodel_file_dry_run(tiny_llama_dir: Path, tmp_path: Path) -> None:
    """The README's ``train.py`` forms on AutoModel's file through the real CLI (dry runs, nothing launched):
    ``launcher=skypilot skypilot.accelerators=... skypilot.num_nodes=2`` plans a two-node task that SkyPilot's own
    schema accepts; ``launcher=slurm slurm.nodes=2 profile=nsys`` a two-node Slurm job with every rank under nsys."""
    pytest.importorskip("nemo_automodel")
    env = {**rank_env(), "HOME": str(tmp_path / "home")}
    model = f"--model.pretrained_model_name_or_path={tiny_llama_dir}"
    runs = {"on_sky": ["launcher=skypilot", "skypilot.accelerators=H100:8", "skypilot.num_nodes=2",
                    "skypilot.hf_token=", "--step_scheduler.global_batch_size=128"],
            "on_slurm": ["launcher=slurm", "slurm.nodes=2", "slurm.ntasks_per_node=1", "profile=nsys"]}
    procs = {name: subprocess.Popen([sys.executable, "-m", "automodel_hydra.cli", str(SQUAD_YAML), *args, model,
                                     "dry_run=true", f"hydra.run.dir={tmp_path / name}"], env=env, cwd=tmp_path,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for name, args in runs.items()}
    for name, proc in procs.items():
        out = proc.communicate(timeout=600)[0]
        assert proc.returncode == 0 and "dry run: wrote" in out, f"{name}:\n{out[-3000:]}"
    import yaml

    task = yaml.safe_load((tmp_path / "on_sky" / "launch" / "sky_task.yaml").read_text())
    assert (task["num_nodes"], task["resources"]["accelerators"]) == (2, "H100:8")
    sbatch = (tmp_path / "on_slurm" / "launch" / "sbatch.sh").read_text()
    assert "#SBATCH --nodes=2" in sbatch and "nsys profile" in sbatch


@pytest.mark.slow
def test_the_resume_key_on_an_automodel_file_without_it_and_an_unknown_keys_line(tmp_path: Path) -> None:
    """``automodel-hydra FILE.yaml restore_from.path=latest`` on AutoModel's file, which has no ``restore_from:``,
    sets the resume key (as ``++`` would); a function recipe's file keeps Hydra's rule. A key the file lacks is one
    line naming that file's ``--help`` and the ``++`` form, not ``python train.py --help`` (the bundled config's).
    Old main refused the first with Hydra's "no such key" and named train.py in the second."""
    assert _overrides(argv.from_automodel_cli([str(SQUAD_YAML), "restore_from.path=latest"]))[0] == \
        "++restore_from.path=latest"
    mine = tmp_path / "mine.yaml"
    mine.write_text("recipe: my_module:main\nstep_scheduler:\n  max_steps: 3\n")
    assert _overrides(argv.from_automodel_cli([str(mine), "restore_from.path=latest"]))[0] == \
        "restore_from.path=latest"
    proc = _cli(str(SQUAD_YAML), "--cfg", "job", "dry_run=true", "restore_from.path=latest", cwd=tmp_path)
    assert proc.returncode == 0 and "restore_from:\n  path: latest\n" in proc.stdout, proc.stdout[-3000:]
    proc = _cli(str(SQUAD_YAML), "--cfg", "job", "dry_run=true", "nosuchsection.x=1", cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout[-3000:]
    assert proc.stdout.strip().splitlines()[-1] == (
        f"error: nosuchsection: no such key in the config (automodel-hydra {SQUAD_YAML} --help lists its keys); "
        "++nosuchsection.x=1 adds it to the file's config")
