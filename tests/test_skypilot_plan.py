"""SkyPilot planning: recorded task files checked by SkyPilot itself, bad inputs, the run/setup scripts in bash.

No cloud is reachable here. What SkyPilot itself can check offline is checked with SkyPilot (schema +
``sky.Task`` construction); the generated shell is run by bash with the variables SkyPilot sets on each node
(docs/skypilot.md)."""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from automodel_hydra import config
from automodel_hydra.backends import skypilot
from automodel_hydra.bootstrap import DistEnv
from automodel_hydra.schema import ConfigError
from automodel_hydra.plan import JobSpec
from tests.helpers import ROOT, compose_cfg

GOLDEN = Path(__file__).parent / "golden"
#: Fixed paths so the recorded files do not depend on where the tests run (planning never touches them).
JOB = JobSpec(job_dir=Path("/runs/outputs/2026-01-01/00-00-00"), job_name="train",
              project_root=Path("/src/automodel-hydra"))
FIELD_IPS = "10.0.0.12\n10.0.0.5\n"

CASES = {
    "1node_ondemand": ["skypilot.cloud=gcp", "skypilot.region=us-central1", "skypilot.accelerators=A100-80GB:4",
                       "skypilot.idle_minutes_to_autostop=30", "skypilot.down=true", "skypilot.checkpoint_bucket=null"],
    "1node_spot": ["skypilot.use_spot=true", "skypilot.checkpoint_bucket=my-ckpts", "skypilot.checkpoint_store=s3",
                   "skypilot.max_restarts_on_errors=2", "skypilot.accelerators=L4:1"],
    "2node_ondemand": ["skypilot.num_nodes=2", "skypilot.cloud=kubernetes", "skypilot.checkpoint_bucket=gs://team/llm",
                       "skypilot.cluster_name=team-a100", "profile=nsys", "skypilot.nproc_per_node=4",
                       "++skypilot.env_vars.NOTE='it\\'s a; $(id)'", "++skypilot.env_vars.WANDB_KEY=${WANDB_API_KEY}"],
    "2node_spot": ["skypilot.cloud=aws", "skypilot.accelerators=H100:8", "skypilot.num_nodes=2",
                   "skypilot.use_spot=true", "skypilot.disk_size=200", "skypilot.region=us-east-1",
                   "skypilot.checkpoint_bucket=s3://my-ckpts", "++skypilot.env_vars.HF_TOKEN=${HF_TOKEN}"],
}


#: Values a command line cannot easily carry (a multi-line setup).
SETUP = {"2node_ondemand": "pip install -e .\nnvidia-smi"}


def load(overrides: list[str], tmp_path: Path, setup: str | None = None) -> config.TrainConfig:
    cfg = compose_cfg(["launcher=skypilot", *overrides], tmp_path)
    if setup is not None:
        cfg.skypilot.setup = setup
    return config.load(cfg)


@pytest.fixture(scope="module")
def sky(tmp_path_factory: pytest.TempPathFactory):
    """``import sky`` once for this module, with HOME in a temp dir (the import creates ~/.sky)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(tmp_path_factory.mktemp("home")))
        import sky as sky_module

        yield sky_module


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_matches_record_and_skypilot_accepts_it(case: str, sky, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WANDB_API_KEY", "w")
    monkeypatch.setenv("HF_TOKEN", "h")
    plan = skypilot.make_plan(load(CASES[case], tmp_path, SETUP.get(case)), JOB)
    skypilot.SkyPilot().check([plan])  # SkyPilot's own schema and sky.Task
    text = plan.files[skypilot.TASK_FILE]
    record = GOLDEN / f"sky_task_{case}.yaml"
    if not record.exists():  # a missing record fails: it is never re-recorded silently
        record.write_text(text)
        pytest.fail(f"{record} was missing; recorded it now: check it by eye and rerun")
    if text != record.read_text():
        diff = "".join(difflib.unified_diff(record.read_text().splitlines(True), text.splitlines(True),
                                            str(record), "planned"))
        pytest.fail(f"planned task differs from the record:\n{diff}\nIf the change is intended, regenerate: "
                    f"rm {record.relative_to(ROOT)} && pytest {Path(__file__).relative_to(ROOT)} -k {case}")
    task = sky.Task.from_yaml_config(yaml.safe_load(text))  # the file on disk, as `sky launch` would read it
    (res,) = task.resources
    nodes, spot = int(case[0]), case.endswith("spot")
    assert (task.num_nodes, res.use_spot, plan.request.managed) == (nodes, spot, spot)
    assert task.name == plan.request.name
    assert '"$SKYPILOT_NODE_IPS"' in task.run and '--nnodes="$SKYPILOT_NUM_NODES"' in task.run


def test_issue_case_is_two_spot_h100x8_nodes_with_a_bucket_and_a_secret_by_name(sky, tmp_path: Path) -> None:
    plan = skypilot.make_plan(load(CASES["2node_spot"], tmp_path), JOB)
    task = sky.Task.from_yaml_config(yaml.safe_load(plan.files[skypilot.TASK_FILE]))
    (res,) = task.resources
    assert (task.num_nodes, res.use_spot, res.accelerators, res.disk_size) == (2, True, {"H100": 8}, 200)
    assert (str(res.cloud), res.region, res.job_recovery["max_restarts_on_errors"]) == ("AWS", "us-east-1", 0)
    assert list(task.storage_mounts) == ["/checkpoints"]
    assert plan.request.secrets == (("HF_TOKEN", "HF_TOKEN"),)
    assert [r.name for r in task.managed_secret_refs] == ["HF_TOKEN"] and not task.secrets  # name only, no value
    assert "--nproc_per_node=8" in task.run
    node = yaml.safe_load(plan.files[skypilot.NODE_JOB_FILE])  # the config every rank reads on the nodes
    key = plan.request.name
    assert (node["output_dir"], node["checkpoint"]["dir"]) == (f"/checkpoints/{key}", f"/checkpoints/{key}/checkpoints")
    assert node["restore_from"]["path"] == "latest" and "skypilot" not in node and "slurm" not in node


def test_bad_fields_are_rejected_by_skypilot_naming_them(sky, tmp_path: Path) -> None:
    good = skypilot.make_plan(load(CASES["2node_spot"], tmp_path), JOB).request.task
    bad = {
        "infra": {"resources": {**good["resources"], "infra": "foo/us-east-1"}},
        "accelerators": {"resources": {**good["resources"], "accelerators": "H100:x"}},
        "disk_size": {"resources": {**good["resources"], "disk_size": 0}},
        "num_nodes": {"num_nodes": 0},
        "use_spot": {"resources": {**good["resources"], "use_spot": "maybe"}},
        "nodes": {"nodes": 2},  # not a SkyPilot field
    }
    for field, change in bad.items():
        with pytest.raises(skypilot.SkyPilotPlanError) as e:
            skypilot.validate({**good, **change})
        assert field in str(e.value)


def test_planning_does_not_import_sky() -> None:
    code = textwrap.dedent("""
        import sys
        from pathlib import Path
        from automodel_hydra import config
        from automodel_hydra.backends import skypilot
        from automodel_hydra.plan import JobSpec
        cfg = config.load({"output_dir": "/tmp/o", "skypilot": {"num_nodes": 2, "use_spot": True,
                                                                "checkpoint_bucket": "b-1", "env_vars": {"T": "${T}"}}})
        plan = skypilot.make_plan(cfg, JobSpec(job_dir=Path("/tmp/o"), job_name="train"))
        assert plan.request.task["num_nodes"] == 2
        print(sorted(m for m in sys.modules if m == "sky" or m.startswith("sky.")))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_cross_section_rules_and_names(tmp_path: Path) -> None:
    spot = ["skypilot.use_spot=true", "skypilot.checkpoint_bucket=b-1"]
    with pytest.raises(ConfigError, match="checkpoint.enabled"):
        skypilot.make_plan(load([*spot, "checkpoint.enabled=false"], tmp_path), JOB)
    with pytest.raises(ConfigError, match="restore_from.path"):
        skypilot.make_plan(load([*spot, "restore_from.path=null"], tmp_path), JOB)
    with pytest.raises(ConfigError, match="skypilot.checkpoint_bucket"):
        load(["skypilot.use_spot=true", "skypilot.checkpoint_bucket=null"], tmp_path)
    # a sweep point gets its own run key and cluster; run_name keys the bucket dir across relaunches
    point = JobSpec(job_dir=Path("/runs/multirun/x/3"), job_name="train", job_num=3)
    p = skypilot.make_plan(load(["skypilot.run_name=exp-7", "skypilot.cluster_name=c"], tmp_path), point).request
    assert (p.name, p.cluster_name) == ("exp-7-3", "c-3")
    assert skypilot.run_key(load([], tmp_path).skypilot, JOB) == skypilot.run_key(load([], tmp_path).skypilot, JOB)


def test_auto_bucket_only_when_the_job_needs_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert skypilot.default_bucket("Jane.Doe", "host") == skypilot.default_bucket("Jane.Doe", "host")
    assert skypilot.default_bucket("Jane.Doe", "host").startswith("automodel-jane-doe-")
    monkeypatch.setattr(skypilot, "default_bucket", lambda: "automodel-me-12345678")
    spot = skypilot.make_plan(load(["skypilot.use_spot=true"], tmp_path), JOB).request.task
    assert spot["file_mounts"]["/checkpoints"] == {"name": "automodel-me-12345678", "mode": "MOUNT_CACHED"}
    single = skypilot.make_plan(load([], tmp_path), JOB)
    assert "/checkpoints" not in single.request.task["file_mounts"]
    node = yaml.safe_load(single.files[skypilot.NODE_JOB_FILE])
    assert node["output_dir"] == "${oc.env:HOME}/automodel/" + single.request.name
    monkeypatch.setenv("HOME", "/home/sky")  # as the worker loads it on a node
    on_node = config.load(node)
    assert on_node.output_dir == f"/home/sky/automodel/{single.request.name}"
    assert on_node.checkpoint_dir == f"/home/sky/automodel/{single.request.name}/checkpoints"


# ----------------------------------------------------------------------------------------------- the scripts in bash


def bash(script: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_field_case_master_is_first_ip_and_world_size_is_16(tmp_path: Path) -> None:
    plan = skypilot.make_plan(load(CASES["2node_spot"], tmp_path), JOB)
    run = plan.request.task["run"]
    (master_line,) = [line for line in run.splitlines() if line.startswith("MASTER_ADDR=")]
    env = {"PATH": os.environ["PATH"], "SKYPILOT_NODE_IPS": FIELD_IPS}
    assert bash(master_line + '\necho "$MASTER_ADDR"', env).stdout == "10.0.0.12\n"
    assert bash('echo $SKYPILOT_NODE_IPS | head -n1', env).stdout == "10.0.0.12 10.0.0.5\n"  # the field bug
    # the whole run script on node 1, with an argv recorder in place of torchrun
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "torchrun").write_text('#!/bin/bash\nprintf "%s\\n" "$@"\n')
    (tmp_path / "bin" / "torchrun").chmod(0o755)
    env = {"PATH": f"{tmp_path / 'bin'}:{os.environ['PATH']}", "HOME": str(tmp_path), "SKYPILOT_NODE_IPS": FIELD_IPS,
           "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_GPUS_PER_NODE": "8"}
    out = bash(run.replace("/checkpoints/", f"{tmp_path}/checkpoints/"), env)
    assert out.returncode == 0, out.stderr
    args = dict(a.lstrip("-").split("=", 1) for a in out.stdout.splitlines() if a.startswith("--") and "=" in a)
    assert (args["master_addr"], args["node_rank"]) == ("10.0.0.12", "1")
    assert int(args["nnodes"]) * int(args["nproc_per_node"]) == 16
    assert f"{tmp_path}/automodel/{plan.request.name}/launch/job.yaml" in out.stdout  # "$HOME"/... expanded
    # the bootstrap's SkyPilot row: one process per node, no torchrun
    row = DistEnv.from_environ({"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": FIELD_IPS,
                                "AUTOMODEL_NPROC_PER_NODE": "8", "LOCAL_RANK": "3"})
    assert (row.master_addr, row.world_size, row.rank, row.launcher) == ("10.0.0.12", 16, 11, "skypilot")


def test_failing_setup_line_fails_the_setup(tmp_path: Path) -> None:
    env = {"PATH": os.environ["PATH"]}
    for failing in ("false\necho reached", "false | cat\necho reached", "pip-does-not-exist install x\necho reached"):
        script = skypilot.render_setup(failing)
        assert script is not None and script.startswith("set -eo pipefail\n")
        out = bash(script, env)
        assert out.returncode != 0 and "reached" not in out.stdout
    assert bash(skypilot.render_setup("true\necho reached") or "", env).stdout == "reached\n"


# ---------------------------------------------------------------------------------- train.py, as a user runs it

DONE_WHEN = ["launcher=skypilot", "skypilot.cloud=aws", "skypilot.accelerators=H100:8", "skypilot.num_nodes=2",
             "skypilot.use_spot=true", "skypilot.disk_size=200", "skypilot.region=us-east-1",
             "++skypilot.env_vars.HF_TOKEN=${HF_TOKEN}", "dry_run=true"]
TOKEN = "hf_do-not-leak-7f3a9c"
BAD = {  # override -> the field the error must name
    "skypilot.cloud=mars": "skypilot.cloud",
    "skypilot.accelerators=H100:x": "skypilot.accelerators",
    "skypilot.disk_size=0": "skypilot.disk_size",
    "skypilot.num_nodes=0": "skypilot.num_nodes",
    "skypilot.use_spot=maybe": "use_spot",
    "skypilot.checkpoint_bucket=null": "skypilot.checkpoint_bucket",  # with use_spot=true: spot needs a bucket
}


@pytest.fixture(scope="module")
def train_py_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, subprocess.CompletedProcess]]:
    """The issue's dry run and every bad input, as subprocesses started together (each starts Hydra)."""
    base = tmp_path_factory.mktemp("train_py")
    env = {**os.environ, "HOME": str(base / "home"), "HF_TOKEN": TOKEN}
    runs = {"done": DONE_WHEN}
    runs.update({bad: ["launcher=skypilot", "skypilot.use_spot=true", bad, "dry_run=true"] for bad in BAD})
    procs = {}
    for i, (name, args) in enumerate(runs.items()):
        run_dir = base / f"R{i}"
        procs[name] = (run_dir, subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args,
                                                  f"hydra.run.dir={run_dir}"], env=env, text=True,
                                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    return {name: (run_dir, subprocess.CompletedProcess(p.args, p.wait(timeout=300), p.communicate()[0]))
            for name, (run_dir, p) in procs.items()}


def test_issue_dry_run_writes_a_two_node_spot_task_and_no_secret(train_py_runs, sky) -> None:
    run_dir, proc = train_py_runs["done"]
    assert proc.returncode == 0, proc.stdout
    assert "nothing was submitted" in proc.stdout and TOKEN not in proc.stdout
    task = sky.Task.from_yaml_config(yaml.safe_load((run_dir / "launch" / skypilot.TASK_FILE).read_text()))
    (res,) = task.resources
    assert (task.num_nodes, res.use_spot, res.accelerators) == (2, True, {"H100": 8})
    assert '"$SKYPILOT_NODE_IPS"' in task.run
    files = [p for p in run_dir.rglob("*") if p.is_file()]
    assert {"sky_task.yaml", "job.sky.yaml", "job.yaml", "config.yaml"} <= {p.name for p in files}
    assert [p for p in files if TOKEN in p.read_text(errors="replace")] == []


@pytest.mark.parametrize("override", sorted(BAD))
def test_bad_input_fails_before_launch_naming_its_field(override: str, train_py_runs) -> None:
    run_dir, proc = train_py_runs[override]
    assert proc.returncode != 0
    assert BAD[override] in proc.stdout, proc.stdout[-2000:]
    assert not (run_dir / "launch" / skypilot.TASK_FILE).exists()
