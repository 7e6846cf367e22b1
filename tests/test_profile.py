"""profile=nsys on every launcher, with a STAND-IN `nsys` (tests/standins/nsys): nsys cannot exist on this CPU
machine. The stand-in records its arguments, writes the report file -o names and runs the wrapped command."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from automodel_hydra.config import NsysConfig
from automodel_hydra.profile import long_run_warning, nsys_prefix
from tests.helpers import ROOT, train_py

STANDINS = ROOT / "tests" / "standins"


def with_standin_path(tmp_path: Path) -> dict[str, str]:
    return {"PATH": f"{STANDINS}:{os.environ['PATH']}", "NSYS_STANDIN_LOG": str(tmp_path / "nsys-calls.jsonl")}


@pytest.mark.slow
def test_two_rank_interactive_run_leaves_one_report_per_rank(tmp_path) -> None:
    run = tmp_path / "R"
    train_py("profile=nsys", f"hydra.run.dir={run}", "step_scheduler.max_steps=4", "interactive.nproc_per_node=2",
             "profile.nsys.start_step=2", "profile.nsys.stop_step=3", env=with_standin_path(tmp_path))
    reports = sorted(p.name for p in run.glob("*.nsys-rep"))
    host = socket.gethostname()
    assert reports == [f"train_{host}_rank0_attempt0.nsys-rep", f"train_{host}_rank1_attempt0.nsys-rep"]
    calls = [json.loads(line) for line in (tmp_path / "nsys-calls.jsonl").read_text().splitlines()]
    assert len(calls) == 2
    for argv in calls:
        assert "--capture-range=cudaProfilerApi" in argv and "automodel_hydra.worker" in argv
    # the capture range reaches the recipe through the job file every rank reads
    nsys = yaml.safe_load((run / "launch" / "job.yaml").read_text())["profile"]["nsys"]
    assert (nsys["enabled"], nsys["start_step"], nsys["stop_step"]) == (True, 2, 3)
    assert [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()][-1] == 4


@pytest.mark.slow
def test_missing_nsys_is_a_clear_error_at_start(tmp_path) -> None:
    env = {"PATH": os.pathsep.join(p for p in os.environ["PATH"].split(os.pathsep) if not (Path(p) / "nsys").exists())}
    args = ("profile=nsys", f"hydra.run.dir={tmp_path}", "step_scheduler.max_steps=2", "interactive.nproc_per_node=1")
    proc = train_py(*args, env=env, check=False)
    assert proc.returncode == 2  # found before torchrun starts: nothing was started
    assert "nsys (Nsight Systems) is not on PATH on this machine" in proc.stdout
    assert not (tmp_path / "metrics.jsonl").exists() and not (tmp_path / "launch" / "torchrun.sh").exists()
    # the script a dry run writes checks again when it is run by hand, into the job log where `logs` looks
    train_py(*args, "dry_run=true", env=env)
    by_hand = subprocess.run(["bash", str(tmp_path / "launch" / "torchrun.sh")], env={**os.environ, **env},
                             capture_output=True, text=True, timeout=60)
    assert by_hand.returncode == 127 and "nsys (Nsight Systems) is not on PATH" in by_hand.stderr
    assert "nsys (Nsight Systems) is not on PATH" in (tmp_path / "train.log").read_text()


@pytest.mark.slow  # runs train.py or a script as a real process
@pytest.mark.parametrize("switch", ["profile=nsys", "slurm.nsys_enabled=true"])
def test_slurm_plan_wraps_every_task(switch: str, tmp_path) -> None:
    train_py("launcher=slurm", switch, "dry_run=true", f"hydra.run.dir={tmp_path}", "slurm.ntasks_per_node=2")
    script = (tmp_path / "launch" / "sbatch.sh").read_text()
    assert "nsys profile" in script
    assert "%q{SLURM_PROCID}" in script and "%h" in script  # one report per task, named by node and rank


@pytest.mark.slow  # runs train.py or a script as a real process
def test_skypilot_plan_wraps_every_worker(tmp_path) -> None:
    train_py("launcher=skypilot", "profile=nsys", "dry_run=true", f"hydra.run.dir={tmp_path}",
             "skypilot.checkpoint_bucket=ckpts")
    task = yaml.safe_load((tmp_path / "launch" / "sky_task.yaml").read_text())
    assert "nsys profile" in task["run"] and "%q{RANK}" in task["run"]


def test_prefix_and_warning() -> None:
    assert nsys_prefix(NsysConfig(enabled=False), "/o", "train") == []
    argv = nsys_prefix(NsysConfig(enabled=True, delay_s=5, extra_args=["--sample=none"]), "/o", "job", "SLURM_PROCID")
    assert argv[:2] == ["nsys", "profile"]
    assert "--output=/o/job_%h_rank%q{SLURM_PROCID}" in argv and "--delay=5" in argv and argv[-1] == "--sample=none"
    assert long_run_warning(NsysConfig(enabled=True), max_steps=10) is None
    assert "max_steps=5000" in long_run_warning(NsysConfig(enabled=True), max_steps=5000)
    assert "240-minute" in long_run_warning(NsysConfig(enabled=True), max_steps=10, time_limit_min=240)
    assert long_run_warning(NsysConfig(enabled=False), max_steps=5000) is None
