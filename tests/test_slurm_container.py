"""A Slurm job in a stock container image (``slurm.container_image``: NeMo's image, which lacks this project)
runs the worker from the run's code snapshot, mounted with the run dir and put on ``PYTHONPATH`` inside the
container, where the image's own environment would otherwise win.

Pyxis cannot exist here (it is a Slurm plugin that needs enroot and root on every node), so the batch script is
checked as rendered, and then RUN by bash with a STAND-IN of Pyxis' ``srun`` (tests/standins/pyxis, tests only)
that does what Pyxis does to a task's process: it takes the image's ``PATH`` and ``PYTHONPATH`` over the batch
step's (Pyxis keeps the image's value of a variable the image defines), starts in ``--container-workdir`` and
checks every ``--container-mounts`` source, then hands the task to the srun stand-in of tests/standins/slurm.
The "image" is a plain Python with no venv, only the site dir that holds torch and omegaconf on its path: it has no
``automodel_hydra``, so a job that completes imported it from the mounted snapshot."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from automodel_hydra import config, driver, snapshot
from automodel_hydra.backends import slurm
from automodel_hydra.plan import JobSpec, Plan
from automodel_hydra.schema import ConfigError
from automodel_hydra.sections import FOR_EVERY_RANK
from tests.helpers import ROOT, compose_cfg

IMAGE = "nvcr.io/nvidia/nemo:25.02"
SLURM_STANDINS = ROOT / "tests" / "standins" / "slurm"
#: The STAND-IN of Pyxis' srun (see its header), in front of the srun stand-in here and of the real srun on the
#: test cluster (tests/test_slurm_tunnel_login.py).
PYXIS_STANDIN = ROOT / "tests" / "standins" / "pyxis"


def plan_job(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *overrides: str, sweep: bool = False
             ) -> tuple[config.TrainConfig, JobSpec, Plan[slurm.Request]]:
    """Plan a 1-task container job submitted from ``tmp_path/submit`` (not a git work tree: snapshot ``copy``)."""
    submit = tmp_path / "submit"
    submit.mkdir(exist_ok=True)
    (submit / "notes.txt").write_text("the submitting dir's own files go into the snapshot\n")
    monkeypatch.chdir(submit)
    sweep_dir = tmp_path / "S" if sweep else None
    run = sweep_dir / "0" if sweep_dir else tmp_path / "R"
    cfg = config.load(compose_cfg(["launcher=slurm", f"slurm.container_image={IMAGE}", "slurm.nodes=1",
                                   "slurm.ntasks_per_node=1", "step_scheduler.max_steps=1",
                                   "step_scheduler.val_every_steps=null", *overrides], run))
    job = JobSpec(run, "train", job_num=0 if sweep else None)
    job = JobSpec(run, "train", job_num=job.job_num, code_dir=driver.code_dir(job, sweep_dir))
    backend = slurm.Slurm()
    return cfg, job, backend.plan(cfg, job, backend.preflight([cfg]))


def srun_line(text: str) -> str:
    return next(line for line in text.splitlines() if line.startswith("srun "))


def test_a_stock_image_gets_the_snapshot_on_pythonpath_inside_the_container(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, job, plan = plan_job(tmp_path, monkeypatch)
    text, code = plan.files["sbatch.sh"], job.code_dir
    assert code is not None and plan.request.snapshot is not None and plan.request.snapshot.kind == "copy"
    assert "expected to be installed" not in text
    inside = f"{code}/src:{code}/lib"  # the copy of the submitting dir, then of this project (outside it)
    srun = srun_line(text)
    prologue = f"""bash -c 'export PYTHONPATH={inside}${{PYTHONPATH:+:$PYTHONPATH}}; exec "$@"' automodel-hydra"""
    assert f"{prologue} python -u -m automodel_hydra.worker" in srun
    mounts = srun.split("--container-mounts=")[1].split()[0].split(",")
    assert mounts == [f"{job.job_dir}:{job.job_dir}"]  # the snapshot is inside the run dir: one mount holds both
    assert str(JobSpec.project_root) not in srun  # not the live checkout
    # a sweep job's own script: the snapshot is the sweep's, outside the job dir, so it is mounted too
    _, sjob, splan = plan_job(tmp_path, monkeypatch, sweep=True)
    smounts = srun_line(splan.files["sbatch.sh"]).split("--container-mounts=")[1].split()[0].split(",")
    assert f"{sjob.code_dir}:{sjob.code_dir}" in smounts and f"{sjob.job_dir}:{sjob.job_dir}" in smounts


def test_pyxis_flags_the_fields_own_and_an_unreadable_mount_are_refused_at_plan_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match=r"slurm.srun_args=.*set slurm.extra_mounts instead"):
        plan_job(tmp_path, monkeypatch, "slurm.srun_args=['--container-mounts=/a:/b']")
    with pytest.raises(ConfigError, match=r"slurm.snapshot='git' is invalid: auto or none with slurm.nemo_mount"):
        plan_job(tmp_path, monkeypatch, "slurm.nemo_mount=/opt/automodel-hydra", "slurm.snapshot=git")
    # no snapshot: this project's source itself is mounted, so it must be readable by the job's user
    monkeypatch.setattr(JobSpec, "project_root", tmp_path / "gone")
    with pytest.raises(ConfigError, match=r"slurm.snapshot='?.*gone'? is invalid: a path that exists"):
        plan_job(tmp_path, monkeypatch, "slurm.snapshot=none")


@pytest.mark.parametrize("image", ["", " ", "${AUTOMODEL_TEST_UNSET_IMAGE:-}"])
def test_a_blank_image_is_refused_not_planned_as_bare_metal_in_a_container_prologue(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, image: str) -> None:
    """An image that is empty (``${IMG:-}`` with IMG unset) is neither a container job nor bare metal: one line."""
    with pytest.raises(ConfigError, match=r"^slurm.container_image='\s*' is invalid: an image"):
        plan_job(tmp_path, monkeypatch, f"slurm.container_image='{image}'")


@pytest.mark.slow
def test_the_job_runs_the_worker_from_the_mounted_snapshot_in_a_python_without_this_project(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg, job, plan = plan_job(tmp_path, monkeypatch)
    assert plan.request.snapshot is not None and job.code_dir is not None
    snapshot.write(plan.request.snapshot, job.code_dir)  # what submit does just before sbatch
    job.launch_dir.mkdir(parents=True, exist_ok=True)
    job.job_file.write_text(json.dumps(config.rank_spec(cfg)))
    (job.job_dir / "slurm").mkdir()
    script = job.launch_dir / "sbatch.sh"
    script.write_text(plan.files["sbatch.sh"])

    image_bin = tmp_path / "image-bin"  # the image's python: a plain interpreter, no venv, no automodel_hydra
    image_bin.mkdir()
    base = getattr(sys, "_base_executable", sys.executable)
    (image_bin / "python").symlink_to(base)
    site = next(p for p in sys.path if p.endswith("site-packages") and (Path(p) / "torch").is_dir())
    image_env = {"IMAGE_PATH": f"{image_bin}:/usr/bin:/bin", "IMAGE_PYTHONPATH": site}
    probe = subprocess.run(["python", "-c", "import torch, omegaconf; import automodel_hydra"], cwd=tmp_path,
                           env={"PATH": image_env["IMAGE_PATH"], "PYTHONPATH": site}, capture_output=True, text=True)
    assert "No module named 'automodel_hydra'" in probe.stderr, probe.stderr  # the premise: a stock image

    env = {"PATH": f"{PYXIS_STANDIN}:{SLURM_STANDINS}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "77",
           "SLURM_JOB_NODELIST": "localhost", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1",
           "SLURM_JOB_NUM_NODES": "1", "SLURMD_NODENAME": "localhost", "OMP_NUM_THREADS": "1",
           "PYTHONPATH": "/host/venv/only", **image_env}
    proc = subprocess.run(["bash", str(script)], env=env, cwd=tmp_path / "submit", capture_output=True, text=True,
                          timeout=300)
    log = "".join(p.read_text() for p in (job.job_dir / "slurm").glob("*.out"))
    assert proc.returncode == 0, proc.stderr + log[-3000:]
    result = json.loads((job.job_dir / "result.json").read_text())
    assert result["step"] == 1 and result["world_size"] == 1
    # imported from the snapshot (the interpreter wrote its bytecode beside the copy's sources)
    assert list((job.code_dir / snapshot.LIB_DIR / "automodel_hydra" / "__pycache__").glob("worker.*.pyc")), log



def test_a_recipe_only_the_image_has_plans_and_an_interactive_run_refuses_it(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """``recipe: lab_tools.train:main`` installed only in the image: the submitting host cannot import it."""
    recipe = {"recipe": "lab_tools_only_in_the_image.train:main", "output_dir": str(tmp_path)}
    cfg = config.load({**recipe, "slurm": {"container_image": IMAGE, "ntasks_per_node": 1}})
    caplog.set_level("INFO", logger="automodel_hydra.driver")
    driver.check_recipe(cfg, set(), here=False)
    assert "recipe=lab_tools_only_in_the_image.train:main does not import on this machine" in caplog.text
    with pytest.raises(ValueError, match="cannot import module 'lab_tools_only_in_the_image.train'"):
        driver.check_recipe(config.load(recipe), set(), here=True)


def _automodel_job(tmp_path: Path, **slurm_keys: object) -> tuple[config.TrainConfig, dict, Path, Path]:
    """AutoModel's SQuAD file (tests/data/automodel) with a local model dir (also its tokenizer), a local dataset
    dir and a validation file in another dir; ``model.config`` stays a Hub id. ``(cfg, sections, model, data)``."""
    import yaml

    model, data = tmp_path / "models" / "tiny", tmp_path / "data" / "squad"
    for d in (model, data, tmp_path / "val"):
        d.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (data / "train.jsonl").write_text("{}\n")
    (tmp_path / "val" / "rows.jsonl").write_text("{}\n")
    sections = yaml.safe_load((ROOT / "tests" / "data" / "automodel" / "llama3_2_1b_squad.yaml").read_text())
    sections["model"].update(pretrained_model_name_or_path=str(model),
                             config={"pretrained_model_name_or_path": "meta-llama/Llama-3.2-1B"})
    sections["dataset"].update(dataset_name=str(data), tokenizer={"pretrained_model_name_or_path": str(model)})
    sections["validation_dataset"].update(dataset_name=str(tmp_path / "val" / "rows.jsonl"))
    cfg = config.load({**sections, "output_dir": str(tmp_path / "R"),
                       "slurm": {"container_image": IMAGE, "ntasks_per_node": 1, **slurm_keys}})
    return cfg, sections, model, data


def test_a_recipes_local_model_and_dataset_are_mounted_into_the_container_at_their_own_paths(
        tmp_path: Path) -> None:
    """The model dir (once, though its tokenizer names it too), the dataset dir and the validation file are
    ``--container-mounts`` at the same paths, so the rank config (the file's sections as written) reads them in
    the container; a Hub id is not mounted, nor a path under a mount the job has already (``extra_mounts``)."""
    shared = tmp_path / "shared"
    (shared / "val").mkdir(parents=True)
    cfg, sections, model, data = _automodel_job(tmp_path, extra_mounts=[f"{shared}:{tmp_path / 'val'}"])
    job = JobSpec(tmp_path / "R", "train")
    backend = slurm.Slurm()
    plan = backend.plan(cfg, job, backend.preflight([cfg]))
    mounts = srun_line(plan.files["sbatch.sh"]).split("--container-mounts=")[1].split()[0].split(",")
    assert f"{model}:{model}" in mounts and f"{data}:{data}" in mounts
    assert [m for m in mounts if m.startswith(str(tmp_path))] == [f"{shared}:{tmp_path / 'val'}", f"{data}:{data}",
                                                                  f"{model}:{model}", f"{job.job_dir}:{job.job_dir}"]
    assert "meta-llama" not in plan.files["sbatch.sh"]
    assert {k: v for k, v in config.rank_spec(cfg).items() if k not in FOR_EVERY_RANK} == sections
    # bare metal: the nodes share this host's filesystem; nothing is mounted (no container)
    bare = config.load({**sections, "output_dir": str(tmp_path / "R"), "slurm": {"ntasks_per_node": 1}})
    assert "--container-mounts" not in backend.plan(bare, job, backend.preflight([bare])).files["sbatch.sh"]


def test_a_recipes_local_path_the_container_cannot_have_is_one_line(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative path (the container starts in the run dir), a ``~`` one and one missing on the submitting host
    are refused at plan time in one line naming the key, the value and what to write."""
    cfg, sections, model, _ = _automodel_job(tmp_path)
    monkeypatch.chdir(model.parent)

    def refusal(value: str) -> str:
        bad = {**sections, "model": {**sections["model"], "pretrained_model_name_or_path": value}}
        cfg = config.load({**bad, "output_dir": str(tmp_path / "R"),
                           "slurm": {"container_image": IMAGE, "ntasks_per_node": 1}})
        with pytest.raises(ConfigError) as e:
            slurm.Slurm().preflight([cfg])
        assert "\n" not in str(e.value)
        return str(e.value)

    where = f"the container ({IMAGE})"
    assert refusal("tiny") == (f"model.pretrained_model_name_or_path='tiny' is invalid: an absolute path on {where} "
                               "(a relative path is read from the ranks' own working dir there, not the one it names "
                               f"here); write the absolute path: {model}")
    assert refusal("~/m").startswith(f"model.pretrained_model_name_or_path='~/m' is invalid: an absolute path on "
                                     f"{where} (a home path")
    assert refusal(str(tmp_path / "gone")) == (
        f"model.pretrained_model_name_or_path='{tmp_path / 'gone'}' is invalid: a file or dir that exists on this "
        f"machine (it is mounted (--container-mounts) into {where} at the same path), or a Hub id")


def test_the_bundled_recipes_data_file_is_mounted_into_the_container(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """``data.path`` (a local file the bundled recipe's ranks read) is mounted at its own path."""
    rows = tmp_path / "data" / "rows.jsonl"
    rows.parent.mkdir()
    rows.write_text('{"prompt": "a", "answer": "b"}\n')
    _, _, plan = plan_job(tmp_path, monkeypatch, "data.source=jsonl", f"data.path={rows}")
    assert f"{rows}:{rows}" in srun_line(plan.files["sbatch.sh"]).split("--container-mounts=")[1].split()[0]
