"""SkyPilot launching: the SDK calls made with the planned task (MagicMock'ed SDK: no cloud exists here, the one
place a stand-in is used), secrets only in memory, waiting and status; and the planned ``run`` script executed for
real as two nodes on this machine, with the variables SkyPilot sets on each node."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
import typing as tp
from pathlib import Path
from unittest.mock import MagicMock

import pytest

from automodel_hydra import config
from automodel_hydra.backends import skypilot
from automodel_hydra.backends.interactive import free_port
from automodel_hydra.plan import JobSpec, Plan, PreflightError, Submission, job_batch, write_record
from automodel_hydra.states import JobState
from tests.helpers import compose_cfg, metrics

TOKEN = "hf_in-memory-only-5e1d"


@pytest.fixture(scope="module")
def sky(tmp_path_factory: pytest.TempPathFactory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(tmp_path_factory.mktemp("home")))
        import sky as sky_module

        yield sky_module


@pytest.fixture
def sdk(sky, monkeypatch: pytest.MonkeyPatch) -> tp.Any:
    """``sky.launch`` / ``sky.jobs.launch`` / ``sky.stream_and_get`` / status calls replaced by MagicMocks."""
    for name, value in [("launch", "req-launch"), ("stream_and_get", None), ("get", None), ("job_status", "req-st"),
                        ("cancel", "req-cancel")]:
        monkeypatch.setattr(sky, name, MagicMock(name=f"sky.{name}", return_value=value))
    for name, value in [("launch", "req-jobs-launch"), ("queue_v2", "req-queue"), ("cancel", "req-jobs-cancel")]:
        monkeypatch.setattr(sky.jobs, name, MagicMock(name=f"sky.jobs.{name}", return_value=value))

    def log_with_result(*args: tp.Any, output_stream: tp.Any, **kwargs: tp.Any) -> int:  # node 0's last line
        output_stream.write('(head, rank=0) automodel-result: {"step": 4, "loss": 2.5, "world_size": 16}\n')
        return 0

    monkeypatch.setattr(sky, "tail_logs", MagicMock(name="sky.tail_logs", side_effect=log_with_result))
    monkeypatch.setattr(sky.jobs, "tail_logs", MagicMock(name="sky.jobs.tail_logs", side_effect=log_with_result))
    return sky


def queue(sky: tp.Any, job_id: int, status: str) -> tuple[list[tp.Any], int, dict[str, int], int]:
    """What ``sky.get(sky.jobs.queue_v2(...))`` returns in 0.14.1 (records, total, status counts, unfiltered total)."""
    from sky.schemas.api.responses import ManagedJobRecord

    return [ManagedJobRecord(job_id=job_id, status=sky.jobs.ManagedJobStatus(status))], 1, {status: 1}, 1


def plan_job(tmp_path: Path, overrides: list[str], job: JobSpec | None = None) -> Plan[skypilot.Request]:
    job = job or JobSpec(job_dir=tmp_path / "R", job_name="train")
    cfg = config.load(compose_cfg(["launcher=skypilot", *overrides], job.job_dir))
    plan = skypilot.make_plan(cfg, job)
    for name, text in plan.files.items():  # what the driver writes before submitting
        (job.launch_dir / name).parent.mkdir(parents=True, exist_ok=True)
        (job.launch_dir / name).write_text(text)
    return plan


def submit(plan: Plan[skypilot.Request]) -> Submission[skypilot.SkyRef]:
    (sub,) = skypilot.SkyPilot().submit(job_batch(plan))
    write_record(sub)
    return sub


def test_spot_job_is_a_managed_job_launch_with_the_planned_task_and_secret_in_memory_only(
        sdk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    plan = plan_job(tmp_path, ["skypilot.num_nodes=2", "skypilot.use_spot=true", "skypilot.checkpoint_bucket=s3://b",
                               "++skypilot.env_vars.HF_TOKEN=${HF_TOKEN}", "++skypilot.env_vars.MODE=fast"])
    sdk.stream_and_get.return_value = ([7], None)
    sub = submit(plan)

    sdk.jobs.launch.assert_called_once()
    (task,), kwargs = sdk.jobs.launch.call_args
    assert kwargs == {"name": plan.request.name}
    sdk.stream_and_get.assert_called_once_with("req-jobs-launch")
    sdk.launch.assert_not_called()
    planned = plan.request.task
    (res,) = task.resources
    assert (task.name, task.num_nodes, task.run, task.setup) == (planned["name"], 2, planned["run"], planned["setup"])
    assert (res.use_spot, res.accelerators, task.envs) == (True, {"H100": 8}, {"MODE": "fast"})
    assert task.secrets["HF_TOKEN"].get_secret_value() == TOKEN  # in the task handed to SkyPilot
    assert list(task.storage_mounts) == ["/checkpoints"]
    assert sub.ids == ["7"] and sub.log_path == "sky jobs logs 7"
    record = json.loads((plan.job.launch_dir / "submission.json").read_text())
    assert (record["backend"], record["job_ids"]) == ("skypilot", ["7"])
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and TOKEN in p.read_text(errors="replace")]
    assert leaks == [] and TOKEN not in capsys.readouterr().out


def test_on_demand_job_launches_a_named_cluster_with_its_lifetime_options(sdk, tmp_path: Path) -> None:
    plan = plan_job(tmp_path, ["skypilot.cluster_name=dev", "skypilot.idle_minutes_to_autostop=10",
                               "skypilot.down=true", "skypilot.wait=false"])
    sdk.stream_and_get.return_value = (3, None)
    sub = submit(plan)
    (task,), kwargs = sdk.launch.call_args
    assert kwargs == {"cluster_name": "dev", "idle_minutes_to_autostop": 10, "down": True}
    assert task.run == plan.request.task["run"] and not plan.wait
    sdk.jobs.launch.assert_not_called()
    assert sub.ids == ["dev:3"] and sub.log_path == "sky logs dev 3"


def test_unset_secret_variable_fails_before_any_launch(sdk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    plan = plan_job(tmp_path, ["++skypilot.env_vars.HF_TOKEN=${HF_TOKEN}"])
    with pytest.raises(PreflightError, match=r"skypilot.env_vars.HF_TOKEN \(\$\{HF_TOKEN\}\): not set"):
        skypilot.SkyPilot().check([plan])
    with pytest.raises(PreflightError, match=r"skypilot.env_vars.HF_TOKEN"):
        submit(plan)
    sdk.launch.assert_not_called()


def test_sweep_points_are_separate_tasks_and_a_failed_launch_raises_skypilots_error(sdk, tmp_path: Path) -> None:
    plans = [plan_job(tmp_path, ["skypilot.use_spot=true"], JobSpec(tmp_path / "M" / str(i), "train", job_num=i))
             for i in range(2)]
    assert plans[0].request.name != plans[1].request.name
    sdk.stream_and_get.side_effect = [([11], None), RuntimeError("Failed to setup with return code 1")]
    first = submit(plans[0])
    with pytest.raises(RuntimeError, match="Failed to setup"):
        submit(plans[1])
    assert [c.kwargs["name"] for c in sdk.jobs.launch.call_args_list] == [p.request.name for p in plans]
    sdk.get.return_value = queue(sdk, 11, "SUCCEEDED")
    (result,) = skypilot.SkyPilot().wait([first], poll_s=0)
    assert result.state is JobState.COMPLETED
    assert result.value["loss"] == 2.5  # node 0's result line, read back from the job's log for the sweeper
    sdk.jobs.tail_logs.assert_called_once()
    assert sdk.jobs.tail_logs.call_args.kwargs["job_id"] == 11 and not sdk.jobs.tail_logs.call_args.kwargs["follow"]


def test_wait_follows_recovery_to_the_end_and_status_cancel_use_the_record(sdk, tmp_path: Path) -> None:
    plan = plan_job(tmp_path, ["skypilot.use_spot=true"])
    sdk.stream_and_get.return_value = ([5], None)
    sub = submit(plan)
    backend = skypilot.SkyPilot()
    states = ["RUNNING", "RECOVERING", "RUNNING", "FAILED_SETUP"]
    sdk.get.side_effect = [queue(sdk, 5, s) for s in states]
    (result,) = backend.wait([sub], poll_s=0)
    assert (result.state, result.value["sky_status"]) == (JobState.FAILED, "FAILED_SETUP")
    assert sdk.jobs.queue_v2.call_args.kwargs["job_ids"] == [5]
    sdk.get.side_effect = None
    sdk.get.return_value = queue(sdk, 5, "RECOVERING")
    ref = backend.ref_from_record(sub.record())
    assert backend.states([ref])[0].state is JobState.PENDING  # recovering: it will run again
    backend.cancel([ref])
    sdk.jobs.cancel.assert_called_once_with(job_ids=[5])
    cluster_job = backend.ref_from_record({"job_ids": ["dev:3"]})
    sdk.get.return_value = {3: sdk.JobStatus.SUCCEEDED}
    assert backend.states([cluster_job])[0].state is JobState.COMPLETED
    backend.cancel([cluster_job])
    sdk.cancel.assert_called_once_with("dev", job_ids=[3])


# ------------------------------------------------------------------------------------ the run script, for real


def emulate_node(task: dict[str, tp.Any], home: Path, rank: int, env: dict[str, str]) -> subprocess.Popen[str]:
    """What SkyPilot does on node ``rank``: file mounts in place, task envs exported, ``run`` in the workdir."""
    for dest, src in task["file_mounts"].items():
        if isinstance(src, str) and dest.startswith("~/"):
            (home / dest[2:]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, home / dest[2:])
    node_env = {**env, **task.get("envs", {}), "HOME": str(home), "SKYPILOT_NODE_RANK": str(rank)}
    return subprocess.Popen(["bash", "-c", task["run"]], cwd=task["workdir"], env=node_env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def preempt(nodes: list[subprocess.Popen[str]]) -> None:
    """Instance loss: SIGKILL every process of every node (torchrun starts its workers in their own sessions)."""
    import psutil  # installed with skypilot

    for node in nodes:
        with contextlib.suppress(psutil.NoSuchProcess):
            for proc in [*psutil.Process(node.pid).children(recursive=True), psutil.Process(node.pid)]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    proc.kill()
        node.communicate()


@pytest.mark.slow
def test_planned_run_script_trains_on_two_nodes_and_resumes_after_preemption(sky, tmp_path: Path) -> None:
    bucket = tmp_path / "bucket"  # stands for the bucket mounted at skypilot.checkpoint_mount on every node
    port = free_port(24000 + os.getpid() % 1000)
    plan = plan_job(tmp_path, [
        "skypilot.accelerators=null", "skypilot.num_nodes=2", "skypilot.use_spot=true",
        "skypilot.checkpoint_bucket=test-bucket", f"skypilot.checkpoint_mount={bucket}", f"skypilot.master_port={port}",
        "++skypilot.env_vars.OMP_NUM_THREADS=1", "step_scheduler.max_steps=40", "step_scheduler.checkpoint_interval=2",
        "step_scheduler.log_interval=1", "step_scheduler.local_batch_size=2", "data.seq_len=32"])
    task, out_dir = plan.request.task, bucket / plan.request.name
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}", "SKYPILOT_NUM_NODES": "2",
           "SKYPILOT_NODE_IPS": "127.0.0.1\n127.0.0.1\n", "SKYPILOT_NUM_GPUS_PER_NODE": "0", "CUDA_VISIBLE_DEVICES": ""}
    latest = out_dir / "checkpoints" / "latest"

    nodes = [emulate_node(task, tmp_path / "home-a", r, env) for r in (0, 1)]
    deadline = time.monotonic() + 240
    while not latest.exists() and all(n.poll() is None for n in nodes) and time.monotonic() < deadline:
        time.sleep(0.05)
    preempt(nodes)
    resumed = int(latest.read_text().strip().removeprefix("step-"))
    print(f"preempted: both nodes killed, newest complete checkpoint step-{resumed}")

    # SkyPilot recovers a managed job by running the same task on fresh nodes (new HOME, same bucket)
    nodes = [emulate_node(task, tmp_path / "home-b", r, env) for r in (0, 1)]
    outs = [n.communicate(timeout=240)[0] for n in nodes]
    assert [n.returncode for n in nodes] == [0, 0], "\n\n".join(o[-3000:] for o in outs)
    rows = metrics(out_dir)
    assert [r["step"] for r in rows] == list(range(1, 41)) and {r["world_size"] for r in rows} == {2}
    assert f"restored step {resumed} from" in (out_dir / "train.log").read_text()
    assert json.loads((out_dir / "result.json").read_text())["world_size"] == 2
    assert skypilot.parse_result(outs[0]) == json.loads((out_dir / "result.json").read_text())  # what wait() reads
    assert latest.read_text().strip() == "step-40"
