"""SkyPilot launching: the SDK calls made with the planned task (MagicMock'ed SDK: no cloud exists here, the one
place a stand-in is used), values expanded and secrets kept only in memory, the API server the SDK starts,
waiting and status; a real launch attempt with SkyPilot on this machine (no credentials, no network); and the
planned ``run`` script executed for real as two nodes on this machine, with the variables SkyPilot sets."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time
import typing as tp
from pathlib import Path
from unittest.mock import MagicMock

import pytest

from automodel_hydra import config
from automodel_hydra.backends import skypilot, skypilot_sdk
from automodel_hydra.backends.interactive import free_port
from automodel_hydra.plan import JobSpec, Plan, PreflightError, Submission, job_batch
from automodel_hydra.records import write_record
from automodel_hydra.states import JobState
from tests.helpers import ROOT, SKY_ELSEWHERE, compose_cfg, metrics

TOKEN = "hf_in-memory-only-5e1d"


@pytest.fixture
def sdk(sky, monkeypatch: pytest.MonkeyPatch) -> tp.Any:
    """``sky.launch`` / ``sky.jobs.launch`` / ``sky.stream_and_get`` / status calls replaced by MagicMocks; the API
    server answers (``sky.api_info``), the task's cloud has credentials (:func:`skypilot_sdk.cloud_problem`)."""
    for name, value in [("launch", "req-launch"), ("stream_and_get", None), ("get", None), ("job_status", "req-st"),
                        ("cancel", "req-cancel"), ("api_info", "healthy"), ("api_stop", None)]:
        monkeypatch.setattr(sky, name, MagicMock(name=f"sky.{name}", return_value=value))
    for name, value in [("launch", "req-jobs-launch"), ("queue_v2", "req-queue"), ("cancel", "req-jobs-cancel")]:
        monkeypatch.setattr(sky.jobs, name, MagicMock(name=f"sky.jobs.{name}", return_value=value))
    monkeypatch.setattr(skypilot_sdk, "cloud_problem", MagicMock(name="cloud_problem", return_value=None))
    monkeypatch.delenv("SKYPILOT_API_SERVER_ENDPOINT", raising=False)

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
    """Plan as the driver does (preflight, plan) and write the plan's files."""
    job = job or JobSpec(job_dir=tmp_path / "R", job_name="train")
    cfg = config.load(compose_cfg(["launcher=skypilot", *overrides], job.job_dir))
    backend = skypilot.SkyPilot()
    plan = backend.plan(cfg, job, backend.preflight([cfg]))
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
    monkeypatch.setenv("DATA_ROOT", "/mnt/data")
    plan = plan_job(tmp_path, ["skypilot.num_nodes=2", "skypilot.use_spot=true", "skypilot.checkpoint_bucket=s3://b",
                               "skypilot.accelerators=H100:8", "++skypilot.env_vars.HF_TOKEN=${HF_TOKEN}",
                               "++skypilot.env_vars.MODE=fast", "++skypilot.env_vars.DATA=${DATA_ROOT}/squad"])
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
    assert (res.use_spot, res.accelerators) == (True, {"H100": 8})
    assert task.envs == {"HF_HOME": "~/.cache/huggingface", "MODE": "fast", "DATA": "/mnt/data/squad"}
    assert planned["envs"]["DATA"] is None  # the file says "given at launch"; the value is in memory only
    assert task.secrets["HF_TOKEN"].get_secret_value() == TOKEN  # in the task handed to SkyPilot
    assert list(task.storage_mounts) == ["/checkpoints"]
    assert sub.ids == ["7"] and sub.log_path == "sky jobs logs 7"
    record = json.loads((plan.job.launch_dir / "submission.json").read_text())
    assert (record["backend"], record["job_ids"]) == ("skypilot", ["7"])
    assert record["job_name"] == task.name == kwargs["name"]  # the name `sky jobs queue` shows
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and TOKEN in p.read_text(errors="replace")]
    assert leaks == [] and TOKEN not in capsys.readouterr().out


def test_on_demand_job_launches_a_named_cluster_that_stops_itself(sdk, tmp_path: Path) -> None:
    plan = plan_job(tmp_path, ["skypilot.use_spot=false", "skypilot.cluster_name=dev", "skypilot.wait=false"])
    sdk.stream_and_get.return_value = (3, None)
    sub = submit(plan)
    (task,), kwargs = sdk.launch.call_args
    assert kwargs == {"cluster_name": "dev", "idle_minutes_to_autostop": 10, "down": False}  # the defaults
    assert task.run == plan.request.task["run"] and not plan.wait
    assert json.loads((plan.job.launch_dir / "submission.json").read_text())["job_name"] == task.name
    sdk.jobs.launch.assert_not_called()
    assert sub.ids == ["dev:3"] and sub.log_path == "sky logs dev 3"
    kept_up = plan_job(tmp_path, ["skypilot.use_spot=false", "skypilot.idle_minutes_to_autostop=null",
                                  "skypilot.checkpoint_bucket=b-1"])  # outputs in a bucket, kept up by choice
    submit(kept_up)
    assert sdk.launch.call_args.kwargs["idle_minutes_to_autostop"] is None and not sdk.launch.call_args.kwargs["down"]


def test_unset_secret_variable_fails_before_any_launch(sdk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HF_TOKEN", raising=False)
    plan = plan_job(tmp_path, ["++skypilot.env_vars.HF_TOKEN=${HF_TOKEN}"])
    with pytest.raises(PreflightError, match=r"^skypilot.env_vars.HF_TOKEN refers to \$\{HF_TOKEN\}, which is not set"):
        skypilot.SkyPilot().check([plan])
    with pytest.raises(PreflightError, match=r"skypilot.env_vars.HF_TOKEN"):
        submit(plan)
    sdk.launch.assert_not_called()
    sdk.jobs.launch.assert_not_called()


def test_sweep_points_are_separate_tasks_and_a_failed_launch_raises_skypilots_error(sdk, tmp_path: Path) -> None:
    plans = [plan_job(tmp_path, ["skypilot.use_spot=true"], JobSpec(tmp_path / "M" / str(i), "train", job_num=i))
             for i in range(2)]
    assert plans[0].request.name != plans[1].request.name
    sdk.stream_and_get.side_effect = [([11], None), RuntimeError("Failed to setup with return code 1")]
    first = submit(plans[0])
    with pytest.raises(RuntimeError, match="Failed to setup"):
        submit(plans[1])
    sdk.api_stop.assert_not_called()  # the server was up before this launch: it is not ours to stop
    assert [c.kwargs["name"] for c in sdk.jobs.launch.call_args_list] == [p.request.name for p in plans]
    sdk.get.return_value = queue(sdk, 11, "SUCCEEDED")
    (result,) = skypilot.SkyPilot().wait([first], poll_s=0)
    assert result.state is JobState.COMPLETED
    assert result.value["loss"] == 2.5  # node 0's result line, read back from the job's log for the sweeper
    sdk.jobs.tail_logs.assert_called_once()
    assert sdk.jobs.tail_logs.call_args.kwargs["job_id"] == 11 and not sdk.jobs.tail_logs.call_args.kwargs["follow"]


def test_a_failed_launch_stops_the_api_server_it_started_and_names_the_cause(sdk, tmp_path: Path) -> None:
    plan = plan_job(tmp_path, ["skypilot.cloud=aws"])
    sdk.api_info.side_effect = ConnectionError("Connection refused")  # no server before: the SDK starts one
    sdk.stream_and_get.side_effect = sdk.exceptions.NoCloudAccessError("Cloud access is not set up. Run: \x1b[1msky "
                                                                       "check\x1b[0m")
    with pytest.raises(PreflightError) as e:
        submit(plan)
    assert str(e.value) == ("SkyPilot has no cloud access from this machine (Cloud access is not set up. Run: sky "
                            "check); run `sky check` and fix what it reports")
    sdk.api_stop.assert_called_once_with()
    sdk.api_stop.reset_mock()
    sdk.stream_and_get.side_effect = sdk.exceptions.CloudError(  # as 0.14.1 relays a catalog download offline
        "HTTPSConnectionPool(host='raw.githubusercontent.com', port=443): Max retries exceeded with url: "
        "/skypilot-org/skypilot-catalog/master/catalogs/v8/common/accelerators.csv", "requests", "ConnectionError")
    with pytest.raises(PreflightError, match=r"^SkyPilot cannot reach raw.githubusercontent.com from this machine .*"
                                             r"then run `sky check`$"):
        submit(plan)
    sdk.api_stop.assert_called_once_with()


def test_no_credentials_fails_before_any_sdk_call(sdk, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    plan = plan_job(tmp_path, ["skypilot.cloud=gcp"])
    skypilot_sdk.cloud_problem.return_value = "SkyPilot cannot launch on gcp from this machine: ..."
    backend = skypilot.SkyPilot()
    for _ in range(2):  # a sweep asks once per cloud
        with pytest.raises(PreflightError, match="^SkyPilot cannot launch on gcp"):
            backend.submit(job_batch(plan))
    skypilot_sdk.cloud_problem.assert_called_once()
    assert skypilot_sdk.cloud_problem.call_args.args[1] == "gcp"
    for call in (sdk.api_info, sdk.launch, sdk.jobs.launch, sdk.stream_and_get):
        call.assert_not_called()
    # a remote API server holds the credentials: nothing is asked here, and its server is never stopped
    monkeypatch.setenv("SKYPILOT_API_SERVER_ENDPOINT", "https://sky.example.com")
    sdk.stream_and_get.side_effect = RuntimeError("boom")
    with pytest.raises(RuntimeError, match="boom"):
        skypilot.SkyPilot().submit(job_batch(plan))
    skypilot_sdk.cloud_problem.assert_called_once()
    sdk.api_info.assert_not_called()
    sdk.api_stop.assert_not_called()


def test_cloud_problem_asks_skypilot_itself(sky, monkeypatch: pytest.MonkeyPatch) -> None:
    """SkyPilot's own credential check, in this process (no cloud has credentials on this machine)."""
    problem = skypilot_sdk.cloud_problem(sky, "azure")
    assert problem is not None and problem.startswith("SkyPilot cannot launch on azure from this machine: no usable "
                                                      "credentials (azure: ")
    assert problem.endswith("run `sky check azure` and fix what it reports") and "\n" not in problem


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


# ------------------------------------------------------------------- a real launch attempt with SkyPilot, here

#: Submit one planned job with the real ``sky`` SDK (nothing mocked unless BYPASS), print the one line and seconds.
LAUNCH = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from automodel_hydra import config
    from automodel_hydra.backends import skypilot, skypilot_sdk
    from automodel_hydra.plan import JobSpec
    cfg = config.load({"output_dir": "/tmp/o", "skypilot": {**({"cloud": sys.argv[2]} if sys.argv[2] else {}),
                                                            "checkpoint_bucket": "b-1", "hf_token": ""}})
    backend = skypilot.SkyPilot()
    plan = backend.plan(cfg, JobSpec(job_dir=Path(sys.argv[1]), job_name="train"), backend.preflight([cfg]))
    (batch,) = backend.batches([plan], None)
    for path, text in batch.files.items():  # what the driver writes before submitting
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    if sys.argv[3] == "bypass":  # stand-in for a machine whose credentials pass: the SDK's own launch path
        skypilot_sdk.cloud_problem = lambda sky, cloud: None
    start = time.monotonic()
    try:
        backend.submit(batch)
    except Exception as e:
        print(f"{type(e).__name__}|{e}|{time.monotonic() - start:.1f}")
""")


def sky_servers(port: int) -> list[str]:
    """Command lines of SkyPilot API server processes bound to ``port`` (what ``sky api stop`` looks for)."""
    import psutil  # installed with skypilot

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if "-m sky.server.server" in cmdline and f"--port={port}" in cmdline:
            found.append(cmdline)
    return found


def real_launch(tmp_path: Path, cloud: str, mode: str) -> tuple[str, str, float, Path, int]:
    home, port = tmp_path / "home", free_port(47000 + os.getpid() % 2000)
    home.mkdir(exist_ok=True)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SKYPILOT_")}, "HOME": str(home),
           "SKYPILOT_API_SERVER_LOCAL_PORT": str(port), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", LAUNCH, str(tmp_path / "R"), cloud, mode], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=500)
    assert proc.returncode == 0, proc.stderr[-3000:]
    kind, message, seconds = proc.stdout.strip().splitlines()[-1].split("|")
    print(f"{cloud or 'any cloud'} ({mode}): {kind} after {seconds} s: {message}")
    return kind, message, float(seconds), home, port


@pytest.mark.slow
@pytest.mark.parametrize("cloud", ["aws", ""])
def test_real_launch_without_credentials_fails_in_seconds_and_starts_no_api_server(cloud: str,
                                                                                  tmp_path: Path) -> None:
    kind, message, seconds, home, port = real_launch(tmp_path, cloud, "check")
    assert kind == "PreflightError" and "\n" not in message
    assert "usable credentials" in message and "`sky check" in message
    assert seconds < 30  # SkyPilot's own credential checks, in this process (~4 s here, most of it importing boto)
    assert not (home / ".sky" / "api_server").exists() and sky_servers(port) == []  # no server was ever started


@pytest.mark.slow
def test_real_sdk_launch_that_fails_stops_the_api_server_it_started(tmp_path: Path) -> None:
    """The SDK's own path (credential check passed by a stand-in): it starts a local API server, the launch fails
    here (no network, no credentials), and the server it started is stopped: no process is left behind."""
    pytest.importorskip("sky", reason=SKY_ELSEWHERE)  # the stand-in replaces a function of this process's SDK
    kind, message, seconds, home, port = real_launch(tmp_path, "aws", "bypass")
    assert kind == "PreflightError" and "\n" not in message and "`sky check`" in message
    assert "no network" in message or "no cloud access" in message
    assert (home / ".sky" / "api_server" / "server.log").exists()  # the SDK really started one
    deadline = time.monotonic() + 30
    while sky_servers(port) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert sky_servers(port) == []


BUSY = textwrap.dedent("""
    import json, sys
    from pathlib import Path
    from automodel_hydra import records
    from automodel_hydra.plan import JobSpec
    job = JobSpec(job_dir=Path(sys.argv[1]), job_name="train")
    job.launch_dir.mkdir(parents=True)
    records.record_path(job.job_dir).write_text(json.dumps({"backend": "skypilot", "job_ids": ["7"],
                                                            "job_dir": sys.argv[1],
                                                            "ref": {"job_id": "7", "cluster": None}}))
    records.refuse_if_busy([job])  # the job's state cannot be known without a server: not refused
    print("not refused")
""")


@pytest.mark.slow
def test_busy_dir_check_of_a_skypilot_record_starts_no_api_server(tmp_path: Path) -> None:
    """A rerun in a dir that holds a SkyPilot job's record asks for that job's state, but never starts SkyPilot's
    API server to do so (the SDK would, ~1 GB in 8 processes, left running)."""
    home, port = tmp_path / "home", free_port(47000 + os.getpid() % 2000)
    home.mkdir()
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SKYPILOT_")}, "HOME": str(home),
           "SKYPILOT_API_SERVER_LOCAL_PORT": str(port), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", BUSY, str(tmp_path / "R")], env=env, cwd=ROOT, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0 and "not refused" in proc.stdout, proc.stderr[-3000:]
    assert not (home / ".sky" / "api_server").exists() and sky_servers(port) == []


def test_states_without_a_running_local_api_server_are_unknown_and_say_how_to_start_it(sdk) -> None:
    sdk.api_info.side_effect = ConnectionError("Connection refused")
    (info,) = skypilot.SkyPilot().states([skypilot.SkyRef("5", None)])
    assert info.state is JobState.UNKNOWN and "sky api start" in info.reason
    sdk.get.assert_not_called()  # no request that would start a server


# ------------------------------------------------------------------------------------ the run script, for real


def emulate_node(task: dict[str, tp.Any], home: Path, rank: int, env: dict[str, str]) -> subprocess.Popen[str]:
    """What SkyPilot does on node ``rank``: file mounts in place, task envs exported, ``run`` in the workdir."""
    for dest, src in task["file_mounts"].items():
        if isinstance(src, str) and dest.startswith("~/"):
            (home / dest[2:]).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src, home / dest[2:])
    planned = {k: v for k, v in (task.get("envs") or {}).items() if v is not None}
    node_env = {**env, **planned, "HOME": str(home), "SKYPILOT_NODE_RANK": str(rank)}
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
