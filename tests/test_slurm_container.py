"""A Slurm job in a stock container image (``slurm.container_image``: NeMo's image, which lacks this project)
runs the worker from the run's code snapshot, mounted with the run dir and put on ``PYTHONPATH`` inside the
container, where the image's own environment would otherwise win.

Pyxis cannot exist here (it is a Slurm plugin that needs enroot and root on every node), so the batch script is
checked as rendered, and then RUN by bash with a STAND-IN ``srun`` that does what Pyxis does to a task's process
(tests only): it takes the image's ``PATH`` and ``PYTHONPATH`` over the batch step's (Pyxis keeps the image's value
of a variable the image defines), starts in ``--container-workdir`` and checks every ``--container-mounts`` source.
The "image" is a plain Python with no venv, only the site dir that holds torch and omegaconf on its path: it has no
``automodel_hydra``, so a job that completes imported it from the mounted snapshot."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from automodel_hydra import config, driver, snapshot
from automodel_hydra.backends import slurm
from automodel_hydra.plan import JobSpec, Plan
from automodel_hydra.schema import ConfigError
from tests.helpers import ROOT, compose_cfg

IMAGE = "nvcr.io/nvidia/nemo:25.02"
SLURM_STANDINS = ROOT / "tests" / "standins" / "slurm"


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


def _exe(path: Path, text: str) -> None:
    path.write_text(textwrap.dedent(text).lstrip())
    path.chmod(path.stat().st_mode | stat.S_IXUSR)


def pyxis_srun(bin_dir: Path) -> None:
    """The STAND-IN srun with Pyxis (see the module docstring)."""
    _exe(bin_dir / "srun", """
        #!/bin/bash
        # STAND-IN (tests only): srun --container-image as Pyxis runs one task, without the container itself
        set -uo pipefail
        image="" mounts="" workdir="" output=""
        while (($#)); do
            case "$1" in
                --container-image=*) image=${1#*=} ;;
                --container-mounts=*) mounts=${1#*=} ;;
                --container-workdir=*) workdir=${1#*=} ;;
                --output=*) output=${1#*=} ;;
                -*) ;;
                *) break ;;
            esac
            shift
        done
        [[ -n "$image" ]] || { echo "pyxis stand-in: no --container-image" >&2; exit 1; }
        IFS=, read -ra list <<< "$mounts"
        for m in "${list[@]}"; do
            src=${m%%:*} dst=${m#*:}
            [[ -e "$src" ]] || { echo "pyxis stand-in: mount source $src does not exist" >&2; exit 1; }
            [[ "$src" == "$dst" ]] || { echo "pyxis stand-in: only same-path mounts: $m" >&2; exit 1; }
        done
        export PATH="$IMAGE_PATH" PYTHONPATH="$IMAGE_PYTHONPATH"  # the image's ENV wins
        export SLURM_PROCID=0 SLURM_LOCALID=0 SLURM_NODEID=0 SLURM_STEP_ID=0
        cd "$workdir" || exit 1
        out=${output//%j/$SLURM_JOB_ID}; out=${out//%t/0}
        exec "$@" >>"$out" 2>&1
        """)


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

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    pyxis_srun(bin_dir)
    env = {"PATH": f"{bin_dir}:{SLURM_STANDINS}:/usr/bin:/bin", "HOME": str(tmp_path), "SLURM_JOB_ID": "77",
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
