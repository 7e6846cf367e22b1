"""SkyPilot planning: recorded task files checked by SkyPilot itself, AutoModel's own ``skypilot:`` blocks, every key
of docs/skypilot.md in each accepted form, bad inputs, and the run/setup scripts in bash.

No cloud is reachable here. What SkyPilot itself can check offline is checked with SkyPilot (schema +
``sky.Task`` construction); the generated shell is run by bash with the variables SkyPilot sets on each node."""

from __future__ import annotations

import contextlib
import difflib
import getpass
import hashlib
import os
import socket
import subprocess
import sys
import textwrap
import typing as tp
from pathlib import Path

import pytest
import yaml

from automodel_hydra import config
from automodel_hydra.automodel import kind as automodel_kind
from automodel_hydra.backends import skypilot, skypilot_sdk
from automodel_hydra.bootstrap import DistEnv
from automodel_hydra.plan import JobSpec, PreflightError
from automodel_hydra.schema import ConfigError
from automodel_hydra.sections import FOR_EVERY_RANK
from tests.helpers import ROOT, SKY_ELSEWHERE, compose_cfg

GOLDEN = Path(__file__).parent / "golden"
AUTOMODEL = Path(__file__).parent / "data" / "skypilot"  # AutoModel's examples' skypilot: blocks, unchanged
#: Set to record a missing golden file (the test still fails, so the new record is read before it is trusted).
RECORD_VAR = "AUTOMODEL_HYDRA_RECORD_GOLDEN"
#: Fixed paths so the recorded files do not depend on where the tests run (planning never touches them).
JOB = JobSpec(job_dir=Path("/runs/outputs/2026-01-01/00-00-00"), job_name="train",
              project_root=Path("/src/automodel-hydra"))
#: What preflight read on a fixed machine: the auto bucket, HF_TOKEN set in the shell.
#: The 6 hex of JOB's run dir in its default run name.
DIGEST = hashlib.sha1(str(JOB.job_dir).encode()).hexdigest()[:6]
FACTS = skypilot.Facts("automodel-me-12345678", frozenset({"HF_TOKEN"}))
FIELD_IPS = "10.0.0.12\n10.0.0.5\n"

CASES = {
    "1node_ondemand": ["skypilot.cloud=gcp", "skypilot.region=us-central1", "skypilot.accelerators=A100-80GB:4",
                       "skypilot.use_spot=false", "skypilot.idle_minutes_to_autostop=30", "skypilot.down=true",
                       "skypilot.checkpoint_bucket=null"],
    "1node_spot": ["skypilot.checkpoint_bucket=my-ckpts", "skypilot.checkpoint_store=s3",
                   "skypilot.max_restarts_on_errors=2", "skypilot.accelerators=L4:1", "skypilot.hf_token=''"],
    "2node_ondemand": ["skypilot.num_nodes=2", "skypilot.cloud=kubernetes", "skypilot.use_spot=false",
                       "skypilot.checkpoint_bucket=gs://team/llm", "skypilot.cluster_name=team-a100", "profile=nsys",
                       "skypilot.nproc_per_node=4", "++skypilot.env_vars.NOTE='it\\'s a; $(id)'",
                       "++skypilot.env_vars.WANDB_KEY=${WANDB_API_KEY}", "++skypilot.env_vars.DATA=${HOME}/data"],
    "2node_spot": ["skypilot.cloud=aws", "skypilot.accelerators=H100:8", "skypilot.num_nodes=2",
                   "skypilot.use_spot=true", "skypilot.disk_size=200", "skypilot.region=us-east-1",
                   "skypilot.checkpoint_bucket=s3://my-ckpts", "++skypilot.env_vars.HF_TOKEN=${HF_TOKEN}"],
}
#: Values a command line cannot easily carry (a multi-line setup).
SETUP = {"2node_ondemand": "pip install -e .\nnvidia-smi"}
ENV = {"HOME": "/home/me", "HF_TOKEN": "h", "WANDB_API_KEY": "w"}


def load(overrides: list[str], tmp_path: Path, setup: str | None = None) -> config.TrainConfig:
    """The project's composed config with these overrides, as ``python train.py launcher=skypilot ...``."""
    cfg = compose_cfg(["launcher=skypilot", *overrides], tmp_path)
    if setup is not None:
        cfg.skypilot.setup = setup
    return config.load(cfg)


def load_block(block: str | dict[str, tp.Any]) -> config.TrainConfig:
    """An AutoModel-style ``skypilot:`` block (YAML text or its dict), loaded as ``config.load`` loads any config."""
    data = yaml.safe_load(block) if isinstance(block, str) else block
    return config.load({"output_dir": "/runs/out", **data})


def plan(cfg: config.TrainConfig, job: JobSpec = JOB, facts: skypilot.Facts = FACTS) -> skypilot.Plan:
    return skypilot.make_plan(cfg, job, facts)


def task_of(block: dict[str, tp.Any], job: JobSpec = JOB, facts: skypilot.Facts = FACTS) -> dict[str, tp.Any]:
    return plan(load_block({"skypilot": block}), job, facts).request.task


def at_launch(p: skypilot.Plan, environ: tp.Mapping[str, str] = ENV) -> dict[str, str]:
    """Every variable the nodes get, as the launch gives them (planned literals + values expanded at launch)."""
    envs, secrets = skypilot_sdk.launch_values(p.request, environ)
    return {**{k: v for k, v in (p.request.task.get("envs") or {}).items() if v is not None}, **dict(envs),
            **dict(secrets)}


def check_golden(name: str, text: str) -> None:
    record = GOLDEN / f"sky_task_{name}.yaml"
    if not record.exists():  # a missing record fails; it is written only when asked for
        if os.environ.get(RECORD_VAR):
            record.write_text(text)
            pytest.fail(f"recorded {record}: read it, then rerun without {RECORD_VAR}")
        pytest.fail(f"{record} is missing. Record it with {RECORD_VAR}=1 pytest {Path(__file__).relative_to(ROOT)} "
                    f"-k {name}, read it, and commit it")
    if text != record.read_text():
        diff = "".join(difflib.unified_diff(record.read_text().splitlines(True), text.splitlines(True),
                                            str(record), "planned"))
        pytest.fail(f"planned task differs from the record:\n{diff}\nIf the change is intended, regenerate: "
                    f"rm {record.relative_to(ROOT)} && {RECORD_VAR}=1 pytest {Path(__file__).relative_to(ROOT)} "
                    f"-k {name}")


@pytest.mark.parametrize("case", sorted(CASES))
def test_plan_matches_record_and_skypilot_accepts_it(case: str, sky, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    p = plan(load(CASES[case], tmp_path, SETUP.get(case)))
    skypilot.SkyPilot().check([p])  # SkyPilot's own schema and sky.Task; every reference set here
    text = p.files[skypilot.TASK_FILE]
    check_golden(case, text)
    task = sky.Task.from_yaml_config(yaml.safe_load(text), env_overrides=skypilot_sdk.launch_values(p.request, ENV)[0])
    (res,) = task.resources
    nodes, spot = int(case[0]), case.endswith("spot")
    assert (task.num_nodes, res.use_spot, p.request.managed) == (nodes, spot, spot)
    assert task.name == p.request.name
    assert '"$SKYPILOT_NODE_IPS"' in task.run and '--nnodes="$SKYPILOT_NUM_NODES"' in task.run


# ----------------------------------------------------------------------------------------- AutoModel's own blocks

#: What AutoModel would have launched for each example (its launcher: sky.Resources + sky.Task fields).
AUTOMODEL_WOULD = {
    "llama3_2_1b_squad_skypilot": dict(infra="gcp/us-central1", accelerators={"T4": 1}, use_spot=True, disk=100,
                                       nodes=1, name="llama3-2-1b-squad"),
    "llama3_2_1b_squad_skypilot_kubernetes": dict(infra="kubernetes", accelerators={"H100": 1}, use_spot=False,
                                                  disk=200, nodes=1, name="llama3-2-1b-k8s"),
    "llama3_2_1b_squad_skypilot_kubernetes_2nodes": dict(infra="kubernetes", accelerators={"H100": 1},
                                                         use_spot=False, disk=200, nodes=2,
                                                         name="llama3-2-1b-k8s-2nodes"),
}


@pytest.mark.parametrize("example", sorted(AUTOMODEL_WOULD))
def test_automodel_examples_plan_as_automodel_would_launch_them(example: str, sky, monkeypatch) -> None:
    monkeypatch.setenv("HF_TOKEN", "hf_x")
    want = AUTOMODEL_WOULD[example]
    cfg = load_block((AUTOMODEL / f"{example}.yaml").read_text())
    with pytest.warns(UserWarning, match="each node keeps") if want["nodes"] > 1 else contextlib.nullcontext():
        p = plan(cfg)  # several kubernetes nodes without a bucket: as AutoModel, each keeps its own files
    skypilot.SkyPilot().check([p])
    check_golden(example, p.files[skypilot.TASK_FILE])
    task = sky.Task.from_yaml_config(yaml.safe_load(p.files[skypilot.TASK_FILE]))
    (res,) = task.resources
    assert (res.infra.to_str(), res.accelerators, res.use_spot, res.disk_size, task.num_nodes) == (
        want["infra"], want["accelerators"], want["use_spot"], want["disk"], want["nodes"])
    # AutoModel's job name, plus the run dir's hash (deliberate: two runs of one file never share a bucket dir)
    assert task.name == f"{want['name']}-{DIGEST}" and p.request.managed == want["use_spot"]
    if not want["use_spot"]:  # AutoModel: the job name is the cluster name too
        assert p.request.cluster_name == task.name
        assert (p.request.idle_minutes_to_autostop, p.request.down) == (10, True)  # kubernetes cannot stop
    assert f"--nproc_per_node={want['accelerators']['H100' if 'H100' in want['accelerators'] else 'T4']}" in task.run
    assert [r.name for r in task.managed_secret_refs] == ["HF_TOKEN"] and not task.secrets  # by name only
    assert task.envs == {"HF_HOME": "~/.cache/huggingface"}  # AutoModel's hf_home default
    assert at_launch(p, {"HF_TOKEN": "hf_x"})["HF_TOKEN"] == "hf_x"  # from ${HF_TOKEN}, at launch
    assert "python -m pip install -e ." in task.setup


@pytest.mark.slow
def test_automodel_example_block_as_a_whole_config_routes_to_skypilot(sky, tmp_path: Path) -> None:
    """The block file itself, as ``python train.py --config-dir D --config-name NAME`` reads it (the real CLI)."""
    env = {**os.environ, "HOME": str(tmp_path / "home"), "HF_TOKEN": "hf_secret_value_9f2"}
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(AUTOMODEL), "--config-name",
                           "llama3_2_1b_squad_skypilot", "++dry_run=true", f"hydra.run.dir={tmp_path / 'R'}"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    task = yaml.safe_load((tmp_path / "R" / "launch" / skypilot.TASK_FILE).read_text())
    assert (task["name"].rsplit("-", 1)[0], task["resources"]["infra"], task["secrets"]) == (
        "llama3-2-1b-squad", "gcp/us-central1", {"HF_TOKEN": None})
    leaks = [p for p in tmp_path.rglob("*") if p.is_file() and b"hf_secret_value_9f2" in p.read_bytes()]
    assert leaks == [] and "hf_secret_value_9f2" not in proc.stdout + proc.stderr


# ----------------------------------------------------------------------------------------- every key, every form

#: key -> ({skypilot: block}, what the planned task or request must hold); docs/skypilot.md has the same table.
KEY_CASES: dict[str, tuple[dict[str, tp.Any], tp.Callable[[skypilot.Plan], tp.Any]]] = {
    "cloud": ({"cloud": "aws"}, lambda p: p.request.task["resources"]["infra"] == "aws"),
    "cloud-any-case": ({"cloud": "GCP"}, lambda p: p.request.task["resources"]["infra"] == "gcp"),
    "cloud-null": ({}, lambda p: "infra" not in p.request.task["resources"] and p.request.cloud is None),
    "accelerators": ({"accelerators": "A100-80GB:4"}, lambda p: "--nproc_per_node=4" in p.request.task["run"]),
    "accelerators-default": ({}, lambda p: p.request.task["resources"]["accelerators"] == "T4:1"),
    "accelerators-null": ({"accelerators": None}, lambda p: "accelerators" not in p.request.task["resources"]),
    "num_nodes": ({"num_nodes": 3}, lambda p: p.request.task["num_nodes"] == 3),
    "use_spot-default": ({}, lambda p: p.request.managed and p.request.task["resources"]["use_spot"] is True),
    "use_spot-false": ({"use_spot": False}, lambda p: not p.request.managed and p.request.cluster_name),
    "disk_size": ({"disk_size": 500}, lambda p: p.request.task["resources"]["disk_size"] == 500),
    "disk_size-default": ({}, lambda p: p.request.task["resources"]["disk_size"] == 100),
    "region": ({"cloud": "aws", "region": "us-west-2"}, lambda p: p.request.task["resources"]["infra"] ==
               "aws/us-west-2"),
    "region-kubernetes-context": ({"cloud": "kubernetes", "region": "arn:aws:eks:x/ctx", "use_spot": False},
                                  lambda p: p.request.task["resources"]["infra"] == "kubernetes/arn:aws:eks:x/ctx"),
    "zone": ({"cloud": "aws", "region": "us-east-1", "zone": "us-east-1a"},
             lambda p: p.request.task["resources"]["infra"] == "aws/us-east-1/us-east-1a"),
    "zone-without-region": ({"cloud": "aws", "zone": "us-east-1a"},
                            lambda p: p.request.task["resources"]["infra"] == "aws/*/us-east-1a"),
    "instance_type": ({"instance_type": "p4d.24xlarge"},
                      lambda p: p.request.task["resources"]["instance_type"] == "p4d.24xlarge"),
    "setup": ({"setup": "pip install nemo-automodel"}, lambda p: p.request.task["setup"].endswith(
        "python -m pip install -e .\n# skypilot.setup\npip install nemo-automodel\n")),
    "setup-shell-refs-stay-for-the-node": ({"setup": "export PATH=${HOME}/bin:$PATH"},
                                           lambda p: "export PATH=${HOME}/bin:$PATH" in p.request.task["setup"]),
    "setup-null": ({"setup": None}, lambda p: p.request.task["setup"].rstrip().endswith("pip install -e .")),
    "env_vars-literal": ({"env_vars": {"A": "x y"}}, lambda p: p.request.task["envs"]["A"] == "x y"),
    "env_vars-int": ({"env_vars": {"OMP_NUM_THREADS": 4}}, lambda p: p.request.task["envs"]["OMP_NUM_THREADS"] == "4"),
    "env_vars-$VAR": ({"env_vars": {"A": "$HOME"}}, lambda p: p.request.task["secrets"]["A"] is None
                      and at_launch(p)["A"] == "/home/me"),
    "env_vars-${VAR}": ({"env_vars": {"A": "${HOME}"}}, lambda p: at_launch(p)["A"] == "/home/me"),
    "env_vars-${VAR}/sub": ({"env_vars": {"A": "${HOME}/sub"}}, lambda p: p.request.task["envs"]["A"] is None
                            and "A" not in p.request.task.get("secrets", {}) and at_launch(p)["A"] == "/home/me/sub"),
    "env_vars-${VAR:-default}": ({"env_vars": {"A": "${UNSET_X:-/d}", "B": "${HOME:-/d}"}},
                                 lambda p: (at_launch(p)["A"], at_launch(p)["B"]) == ("/d", "/home/me")),
    "env_vars-${VAR,default}": ({"env_vars": {"A": "${UNSET_X,/d}/x"}}, lambda p: at_launch(p)["A"] == "/d/x"),
    "env_vars-${oc.env:VAR}": ({"env_vars": {"A": "${oc.env:HOME}"}}, lambda p: at_launch(p)["A"] == "/home/me"),
    "env_vars-\\$": ({"env_vars": {"A": "cost \\$5 $(id)"}}, lambda p: p.request.task["envs"]["A"] == "cost $5 $(id)"),
    "gpus_per_node": ({"gpus_per_node": 2, "accelerators": "A100:8"},
                      lambda p: "--nproc_per_node=2" in p.request.task["run"]),
    "nproc_per_node": ({"nproc_per_node": 2}, lambda p: "--nproc_per_node=2" in p.request.task["run"]),
    "gpus_per_node-and-nproc_per_node-agree": ({"gpus_per_node": 2, "nproc_per_node": 2},
                                               lambda p: "--nproc_per_node=2" in p.request.task["run"]),
    "job_name": ({"job_name": "Llama_3.2 squad", "use_spot": False},
                 lambda p: p.request.name == p.request.cluster_name == f"llama-3-2-squad-{DIGEST}"),
    "job_name-and-run_name": ({"job_name": "a", "run_name": "b"}, lambda p: p.request.name == "b"),
    "run_name": ({"run_name": "exp-7"}, lambda p: p.request.task["name"] == "exp-7"),
    "hf_home-default": ({}, lambda p: p.request.task["envs"]["HF_HOME"] == "~/.cache/huggingface"),
    "hf_home": ({"hf_home": "/mnt/hf"}, lambda p: p.request.task["envs"]["HF_HOME"] == "/mnt/hf"),
    "hf_home-${VAR}": ({"hf_home": "${HOME}/hf"}, lambda p: at_launch(p)["HF_HOME"] == "/home/me/hf"),
    "hf_home-null": ({"hf_home": None}, lambda p: "HF_HOME" not in (p.request.task.get("envs") or {})),
    "hf_home-env_vars-wins": ({"env_vars": {"HF_HOME": "/x"}}, lambda p: p.request.task["envs"]["HF_HOME"] == "/x"),
    "hf_token-default-set": ({}, lambda p: p.request.task["secrets"] == {"HF_TOKEN": None}
                             and at_launch(p)["HF_TOKEN"] == "h"),
    "hf_token-${VAR}": ({"hf_token": "${MY_TOKEN}"}, lambda p: at_launch(p, {"MY_TOKEN": "t"})["HF_TOKEN"] == "t"),
    "hf_token-$VAR": ({"hf_token": "$HF_TOKEN"}, lambda p: at_launch(p)["HF_TOKEN"] == "h"),
    "hf_token-empty": ({"hf_token": ""}, lambda p: "secrets" not in p.request.task),
    "wandb_key-${VAR}": ({"wandb_key": "${WANDB_API_KEY}"},
                         lambda p: p.request.task["secrets"]["WANDB_API_KEY"] is None
                         and at_launch(p)["WANDB_API_KEY"] == "w"),
    "idle_minutes_to_autostop-default": ({"use_spot": False}, lambda p: (p.request.idle_minutes_to_autostop,
                                                                        p.request.down) == (10, False)),
    "idle_minutes_to_autostop-null-keeps-up": ({"use_spot": False, "idle_minutes_to_autostop": None},
                                               lambda p: (p.request.idle_minutes_to_autostop, p.request.down)
                                               == (None, False)),
    "down-default-with-a-bucket": ({"use_spot": False, "checkpoint_bucket": "b-1"}, lambda p: p.request.down),
    "cluster_name": ({"use_spot": False, "cluster_name": "dev_box"}, lambda p: p.request.cluster_name == "dev_box"),
}


@pytest.mark.parametrize("case", sorted(KEY_CASES))
def test_each_key_in_each_form_reaches_the_plan(case: str) -> None:
    block, holds = KEY_CASES[case]
    p = plan(load_block({"skypilot": block}))
    assert holds(p), p.request


def test_no_secret_or_launch_value_is_in_the_planned_files() -> None:
    with pytest.warns(UserWarning, match="skypilot.hf_token holds the value itself"):
        p = plan(load_block({"skypilot": {"env_vars": {"A": "${HOME}/x", "T": "${HF_TOKEN}"},
                                          "hf_token": "hf_lit_123", "wandb_key": "${WANDB_API_KEY}"}}))
    text = "".join(p.files.values())
    assert "hf_lit_123" not in text and "/home/me" not in text
    assert at_launch(p)["HF_TOKEN"] == "hf_lit_123"  # a literal token still travels, as a secret, in memory
    header = text.splitlines()[1]  # the by-hand command: bash expands what launch expands
    assert '--env A="${HOME}/x"' in header and "--secret HF_TOKEN " in header + " "


def test_hydra_env_set_reaches_every_node_and_workdir_is_ignored() -> None:
    job = JobSpec(JOB.job_dir, "train", env=(("OMP_NUM_THREADS", "2"), ("NCCL_DEBUG", "INFO")),
                  workdir=Path("/somewhere/local"), project_root=JOB.project_root)
    p = plan(load_block({"skypilot": {}}), job)
    assert {k: p.request.task["envs"][k] for k in ("OMP_NUM_THREADS", "NCCL_DEBUG")} == {"OMP_NUM_THREADS": "2",
                                                                                        "NCCL_DEBUG": "INFO"}
    assert p.request.task["workdir"] == str(JOB.project_root) and "/somewhere/local" not in str(p.files)


BAD_KEYS = {  # block -> (field named, what the message says)
    "gpus_per_node-vs-nproc": ({"gpus_per_node": 2, "nproc_per_node": 4}, "skypilot.gpus_per_node",
                               "skypilot.nproc_per_node"),
    "cloud": ({"cloud": "mars"}, "skypilot.cloud", "aws"),
    "zone-on-kubernetes": ({"cloud": "kubernetes", "zone": "z"}, "skypilot.zone", "context"),
    "region-slash": ({"cloud": "aws", "region": "us/east"}, "skypilot.region", "'/'"),
    "down-false-on-kubernetes": ({"cloud": "kubernetes", "down": False, "use_spot": False}, "skypilot.down",
                                 "cannot stop"),
    "job_name-nothing-left": ({"job_name": "___"}, "skypilot.job_name", "letter or digit"),
    "env_vars-bad-ref": ({"env_vars": {"A": "${HOME:?x}"}}, "skypilot.env_vars.A", "not a supported reference"),
    "env_vars-bad-name": ({"env_vars": {"A-B": "1"}}, "skypilot.env_vars.A-B", "variable names"),
    "hf_token-twice": ({"hf_token": "${T}", "env_vars": {"HF_TOKEN": "${T}"}}, "skypilot.hf_token",
                       "skypilot.env_vars.HF_TOKEN"),
}


@pytest.mark.parametrize("case", sorted(BAD_KEYS))
def test_bad_key_is_one_line_naming_it(case: str) -> None:
    block, field, says = BAD_KEYS[case]
    with pytest.raises(ConfigError) as e:
        plan(load_block({"skypilot": block}))
    message = str(e.value)
    assert "\n" not in message and message.startswith(field) and says in message, message


def test_env_set_and_env_vars_naming_one_variable_is_refused() -> None:
    job = JobSpec(JOB.job_dir, "train", env=(("A", "1"),))
    with pytest.raises(ConfigError, match=r"^skypilot.env_vars.A=.*hydra.job.env_set.A"):
        plan(load_block({"skypilot": {"env_vars": {"A": "2"}}}), job)


def test_unset_reference_without_default_fails_before_launch_naming_the_field(sky, monkeypatch) -> None:
    monkeypatch.delenv("NOPE_X", raising=False)
    for block, field in [({"env_vars": {"OUT": "${NOPE_X}/o"}}, "skypilot.env_vars.OUT"),
                         ({"hf_token": "${NOPE_X}"}, "skypilot.hf_token"),
                         ({"hf_home": "$NOPE_X"}, "skypilot.hf_home")]:
        p = plan(load_block({"skypilot": block}))
        with pytest.raises(PreflightError) as e:
            skypilot.SkyPilot().check([p])  # what the driver runs before writing or launching anything
        assert str(e.value).startswith(f"{field} refers to ${{NOPE_X}}, which is not set") and "\n" not in str(e.value)


def test_bad_fields_are_rejected_by_skypilot_naming_them(sky, tmp_path: Path) -> None:
    good = plan(load(CASES["2node_spot"], tmp_path)).request.task
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
            skypilot_sdk.validate({**good, **change})
        assert field in str(e.value)


# ----------------------------------------------------------------------------------------- planning is pure


@pytest.mark.slow
def test_planning_does_not_import_sky() -> None:
    code = textwrap.dedent("""
        import sys
        from pathlib import Path
        from automodel_hydra import config
        from automodel_hydra.backends import skypilot
        from automodel_hydra.plan import JobSpec
        cfg = config.load({"output_dir": "/tmp/o", "skypilot": {"num_nodes": 2, "use_spot": True,
                                                                "checkpoint_bucket": "b-1", "env_vars": {"T": "${T}"}}})
        backend = skypilot.SkyPilot()
        plan = backend.plan(cfg, JobSpec(job_dir=Path("/tmp/o"), job_name="train"), backend.preflight([cfg]))
        assert plan.request.task["num_nodes"] == 2
        print(sorted(m for m in sys.modules if m == "sky" or m.startswith("sky.")))
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_planning_reads_nothing_of_the_machine(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    data = tmp_path / "corpus.txt"
    data.write_text("text")
    cfg = load_block({"data": {"source": "file", "path": str(data)}, "model": {"name_or_path": str(tmp_path)},
                      "skypilot": {"job_dir": "~/jobs"}})
    backend = skypilot.SkyPilot()
    facts = backend.preflight([cfg])  # the one step that reads this machine

    def machine(*args: tp.Any, **kwargs: tp.Any) -> tp.NoReturn:
        raise AssertionError("planning read the machine")

    for target, name in [(socket, "gethostname"), (getpass, "getuser"), (os, "getcwd"), (os.path, "expanduser"),
                         (Path, "exists"), (Path, "is_file"), (Path, "is_dir"), (Path, "resolve"), (Path, "home")]:
        monkeypatch.setattr(target, name, machine)
    monkeypatch.setattr(os, "environ", {})
    p = backend.plan(cfg, JOB, facts)
    assert p.request.task["file_mounts"][f"~/automodel/{p.request.name}/launch/model"] == str(tmp_path)
    assert p.request.copy_dir == f"{facts.job_dirs['~/jobs']}/{p.request.name}"
    assert vars(backend) == vars(skypilot.SkyPilot())  # the facts live in what preflight returned, not on the backend


def test_preflight_facts(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(getpass, "getuser", lambda: "Jane.Doe")
    monkeypatch.setattr(socket, "gethostname", lambda: "login1")
    monkeypatch.setenv("HF_TOKEN", "x")
    monkeypatch.setenv("WANDB_API_KEY", "")  # set but empty: AutoModel sends nothing
    monkeypatch.setenv("JOBS", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    cfgs = [load_block({"skypilot": {"job_dir": d}}) for d in ("${JOBS}/am", "rel/dir")]
    backend = skypilot.SkyPilot()
    facts = backend.preflight(cfgs)
    assert facts.auto_bucket == skypilot.default_bucket("Jane.Doe", "login1")
    assert facts.auto_bucket.startswith("automodel-jane-doe-") and facts.set_vars == {"HF_TOKEN"}
    assert facts.job_dirs == {"${JOBS}/am": f"{tmp_path}/am", "rel/dir": f"{tmp_path}/rel/dir"}
    (batch,) = backend.batches([backend.plan(cfgs[0], JOB, facts)], None, facts)
    key = batch.plans[0].request.name
    copies = {tmp_path / "am" / key / name for name in (skypilot.TASK_FILE, skypilot.NODE_JOB_FILE)}
    assert copies < set(batch.files)
    monkeypatch.delenv("JOBS")
    with pytest.raises(PreflightError, match=r"^skypilot.job_dir refers to \$\{JOBS\}"):
        backend.preflight(cfgs)


def test_cross_section_rules_and_names(tmp_path: Path) -> None:
    spot = {"use_spot": True, "checkpoint_bucket": "b-1"}
    with pytest.raises(ConfigError, match="checkpoint.enabled"):
        plan(load_block({"skypilot": spot, "checkpoint": {"enabled": False}}))
    with pytest.raises(ConfigError, match="restore_from.path"):
        plan(load_block({"skypilot": spot, "restore_from": {"path": None}}))
    with pytest.raises(ConfigError, match="skypilot.checkpoint_bucket"):
        load_block({"skypilot": {"use_spot": True, "checkpoint_bucket": None}})
    # a sweep point gets its own run key and cluster; run_name keys the bucket dir across relaunches
    point = JobSpec(job_dir=Path("/runs/multirun/x/3"), job_name="train", job_num=3)
    p = plan(load_block({"skypilot": {"run_name": "exp-7", "cluster_name": "c", "use_spot": False}}), point).request
    assert (p.name, p.cluster_name) == ("exp-7-3", "c-3")
    cfg = load_block({"skypilot": {}})
    assert skypilot.run_key(cfg.skypilot, JOB) == skypilot.run_key(cfg.skypilot, JOB)


def test_two_runs_of_one_automodel_file_never_share_a_bucket_dir() -> None:
    """AutoModel's ``job_name`` is the same in every run of its file: it names the task, and the run dir's hash
    keeps each run's checkpoints apart (AutoModel resumes from what it finds there); a relaunch in the same run dir
    gets the same dir back, and only an explicit ``run_name`` shares one across runs."""
    block = {"skypilot": {"job_name": "llama3_2_1b_squad", "use_spot": True, "checkpoint_bucket": "b-1"},
             "restore_from": {"path": "/checkpoints/latest"}}
    first, second = (JobSpec(job_dir=Path(f"/runs/outputs/2026-01-01/0{i}-00-00"), job_name="train") for i in (1, 2))

    def bucket_dir(job: JobSpec, data: dict[str, tp.Any] = block) -> str:
        """The dir in the bucket the ranks write to (and AutoModel resumes from): the nodes' ``output_dir``."""
        p = plan(load_block(data), job)
        out = str(yaml.safe_load(p.files[skypilot.NODE_JOB_FILE])["output_dir"])
        assert out.startswith("/checkpoints/")
        return out.removeprefix("/checkpoints/")

    assert bucket_dir(first) != bucket_dir(second)
    assert bucket_dir(first).startswith("llama3-2-1b-squad-") and bucket_dir(first) == bucket_dir(first)
    shared = {**block, "skypilot": {**block["skypilot"], "run_name": "exp-7"}}
    assert bucket_dir(first, shared) == bucket_dir(second, shared) == "exp-7"


def test_auto_bucket_only_when_the_job_needs_one(monkeypatch: pytest.MonkeyPatch) -> None:
    spot = plan(load_block({"skypilot": {}})).request.task
    assert spot["file_mounts"]["/checkpoints"] == {"name": "automodel-me-12345678", "mode": "MOUNT_CACHED"}
    assert "/checkpoints" in plan(load_block({"skypilot": {"use_spot": False, "num_nodes": 2}})).request.task[
        "file_mounts"]
    with pytest.warns(UserWarning, match="each node keeps its own checkpoint"):  # kubernetes: node disk
        k8s = plan(load_block({"skypilot": {"use_spot": False, "num_nodes": 2, "cloud": "kubernetes"}}))
    assert "/checkpoints" not in k8s.request.task["file_mounts"]
    single = plan(load_block({"skypilot": {"use_spot": False}}))
    assert "/checkpoints" not in single.request.task["file_mounts"]
    node = yaml.safe_load(single.files[skypilot.NODE_JOB_FILE])
    assert node["output_dir"] == "${oc.env:HOME}/automodel/" + single.request.name
    monkeypatch.setenv("HOME", "/home/sky")  # as the worker loads it on a node
    on_node = config.load(node)
    assert on_node.output_dir == f"/home/sky/automodel/{single.request.name}"
    assert on_node.checkpoint_dir == f"/home/sky/automodel/{single.request.name}/checkpoints"


def test_custom_workdir_still_installs_this_project() -> None:
    p = plan(load_block({"skypilot": {"workdir": "/my/code", "setup": "pip install nemo-automodel"}}))
    task = p.request.task
    assert task["workdir"] == "/my/code" and task["file_mounts"][skypilot.PROJECT_MOUNT] == str(JOB.project_root)
    assert 'python -m pip install -e "$HOME"/automodel-hydra/\n# skypilot.setup\npip install nemo-automodel' in \
        task["setup"]


# ----------------------------------------------------------------------------------------------- the scripts in bash


def bash(script: str, env: dict[str, str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-c", script], env=env, cwd=cwd, capture_output=True, text=True, timeout=60)


def test_field_case_master_is_first_ip_and_world_size_is_16(tmp_path: Path) -> None:
    p = plan(load(CASES["2node_spot"], tmp_path))
    run = p.request.task["run"]
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
    assert f"{tmp_path}/automodel/{p.request.name}/launch/job.yaml" in out.stdout  # "$HOME"/... expanded
    # the bootstrap's SkyPilot row: one process per node, no torchrun
    row = DistEnv.from_environ({"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": FIELD_IPS,
                                "AUTOMODEL_NPROC_PER_NODE": "8", "LOCAL_RANK": "3"})
    assert (row.master_addr, row.world_size, row.rank, row.launcher) == ("10.0.0.12", 16, 11, "skypilot")


def test_failing_setup_line_fails_the_setup() -> None:
    env = {"PATH": os.environ["PATH"]}
    for failing in ("false\necho reached", "false | cat\necho reached", "pip-does-not-exist install x\necho reached"):
        script = skypilot.render_setup(failing, install="true")
        assert script.startswith("set -eo pipefail\n")
        out = bash(script, env)
        assert out.returncode != 0 and "reached" not in out.stdout
    assert bash(skypilot.render_setup("echo reached", install="echo installed"), env).stdout == "installed\nreached\n"
    assert bash(skypilot.render_setup("echo reached", install="false"), env).stdout == ""  # the user's lines need ours


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
    "++skypilot.env_vars.X=${NOT_SET_ANYWHERE_Q}": "skypilot.env_vars.X",
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


@pytest.mark.slow
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


@pytest.mark.slow
@pytest.mark.parametrize("override", sorted(BAD))
def test_bad_input_fails_before_launch_naming_its_field(override: str, train_py_runs) -> None:
    run_dir, proc = train_py_runs[override]
    assert proc.returncode != 0
    assert BAD[override] in proc.stdout, proc.stdout[-2000:]
    assert "Traceback" not in proc.stdout, proc.stdout[-3000:]
    assert not (run_dir / "launch" / skypilot.TASK_FILE).exists()


# ------------------------------------------------------------------ SkyPilot in its own interpreter (the bridge)


def sky_python() -> str:
    """An interpreter that has skypilot: .venv-sky's (scripts/setup makes it beside the automodel extra), else
    this one when ``sky`` imports here; skips the test when there is none."""
    other = ROOT / ".venv-sky" / "bin" / "python"
    if other.exists():
        return str(other)
    pytest.importorskip("sky", reason=SKY_ELSEWHERE)
    return sys.executable


@pytest.mark.slow  # starts SkyPilot's Python three times (~3 s each: `import sky`)
def test_bridge_checks_states_and_refuses_in_skypilots_own_python(tmp_path: Path, monkeypatch) -> None:
    from automodel_hydra.backends import skypilot_bridge
    from automodel_hydra.backends.interactive import free_port
    from automodel_hydra.plan import PreflightError
    from automodel_hydra.states import JobState

    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv(skypilot_bridge.ENV_VAR, sky_python())
    monkeypatch.setenv("HOME", str(tmp_path / "home"))  # `import sky` creates ~/.sky
    monkeypatch.setenv("SKYPILOT_API_SERVER_LOCAL_PORT", str(free_port(47000 + os.getpid() % 2000)))
    good = plan(load(CASES["2node_spot"], tmp_path))
    skypilot.SkyPilot().check([good])  # SkyPilot's own schema and sky.Task, in its process
    with pytest.raises(skypilot.SkyPilotPlanError, match="^SkyPilot rejects the planned task.*nodes") as e:
        skypilot_bridge.call("validate_all", [good.request.task, {**good.request.task, "nodes": 2}])
    assert "\n" not in str(e.value)
    # no local API server runs: every state is UNKNOWN and says how to start one (none is started to ask)
    (info,) = skypilot.SkyPilot().states([skypilot.SkyRef("5", None)])
    assert info.state is JobState.UNKNOWN and "sky api start" in info.reason
    assert not (tmp_path / "home" / ".sky" / "api_server").exists()
    monkeypatch.setenv(skypilot_bridge.ENV_VAR, str(tmp_path / "nope" / "python"))
    with pytest.raises(PreflightError, match=f"^{skypilot_bridge.ENV_VAR}=.*is not an executable file"):
        skypilot.SkyPilot().check([good])


# ------------------------------------------------------------------------------------ an AutoModel file on SkyPilot

#: AutoModel's SQuAD fine-tuning file (tests/data/automodel), read as YAML: its sections, with AutoModel's key names.
SQUAD = yaml.safe_load((Path(__file__).parent / "data" / "automodel" / "llama3_2_1b_squad.yaml").read_text())


@pytest.mark.parametrize("shape", ["with-checkpoint-section", "without-checkpoint-section"])
def test_automodel_file_reaches_the_nodes_unchanged_and_nodes_install_automodel(shape: str, sky) -> None:
    """An AutoModel file with AutoModel's own ``skypilot:`` block: the planned rank config is the file's sections as
    written (``seed`` included, no key of the bundled recipe added), SkyPilot's own schema accepts the task, and the
    nodes' setup installs NeMo AutoModel (GPU nodes: without the CPU machines' triton pin)."""
    sections = {k: v for k, v in SQUAD.items() if not (shape.startswith("without") and k == "checkpoint")}
    sections["seed"] = 7  # a top-level key AutoModel's recipes read (cfg.get("seed", 42))
    p = plan(config.load({**sections, "output_dir": "/runs/out",
                          "skypilot": {"cloud": "gcp", "accelerators": "A100:8", "hf_token": ""}}))
    skypilot.SkyPilot().check([p])  # SkyPilot's schema and sky.Task
    assert sky.Task.from_yaml_config(yaml.safe_load(p.files[skypilot.TASK_FILE])).num_nodes == 1
    node = yaml.safe_load(p.files[skypilot.NODE_JOB_FILE])
    ours = {k: node.pop(k) for k in FOR_EVERY_RANK}  # ours in every rank's spec
    assert node == sections  # every section as the user wrote it, and nothing else
    assert ours["output_dir"] == f"/checkpoints/{p.request.name}"  # spot: the run's dir in its bucket
    setup = p.request.task["setup"]
    assert f"python -m pip install -e '.[{automodel_kind.NODE_EXTRA}]'" in setup
    cpu = plan(config.load({**sections, "output_dir": "/runs/out", "skypilot": {"accelerators": None}}))
    assert "install -e '.[automodel]'" in cpu.request.task["setup"]  # a CPU node: the pinned triton, as here
    if "checkpoint" in sections:  # spot: no checkpoint a recovered job's fresh nodes can find: planned (AutoModel's
        # launcher runs these files), saying in one line that a recovery trains from step 0 and what resumes
        for key, value in (("enabled", False), ("checkpoint_dir", "/scratch/ckpt")):
            lost = {**sections, "checkpoint": {**sections["checkpoint"], key: value}}
            with pytest.warns(UserWarning, match=rf"^checkpoint.{key}=.*from step 0 again;") as seen:
                planned = plan(config.load({**lost, "output_dir": "/runs/out", "skypilot": {"cloud": "gcp"}}))
            assert "\n" not in str(seen[0].message) and planned.request.managed
            assert yaml.safe_load(planned.files[skypilot.NODE_JOB_FILE])["checkpoint"][key] == value  # as written
    bundled = plan(load_block({"skypilot": {"cloud": "gcp"}}))
    assert "install -e .\n" in bundled.request.task["setup"]  # the bundled recipe needs no AutoModel


def _local_recipe(tmp_path: Path) -> tuple[dict[str, tp.Any], Path, Path, Path]:
    """SQUAD's sections with a local model dir (its tokenizer the same dir), a local dataset dir (``dataset_name``,
    as the tests' own runs give it) and a local validation file (``path_or_dataset_id``: ColumnMapped's form);
    ``model.config`` stays a Hub id. Returns ``(sections, model, data, validation file)``."""
    model, data = tmp_path / "models" / "tiny", tmp_path / "data" / "squad"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text("{}\n")
    val = tmp_path / "val" / "rows.jsonl"
    val.parent.mkdir()
    val.write_text("{}\n")
    sections = {k: v for k, v in SQUAD.items() if k != "validation_dataset"}
    sections["model"] = {**SQUAD["model"], "pretrained_model_name_or_path": str(model),
                         "config": {"pretrained_model_name_or_path": "meta-llama/Llama-3.2-1B"}}
    sections["dataset"] = {**SQUAD["dataset"], "dataset_name": str(data),
                           "tokenizer": {"pretrained_model_name_or_path": f"{model}/"}}
    sections["validation_dataset"] = {"_target_": "nemo_automodel.components.datasets.llm."
                                      "column_mapped_text_instruction_dataset.ColumnMappedTextInstructionDataset",
                                      "path_or_dataset_id": [str(val)], "column_mapping": {"answer": "a"}}
    return sections, model, data, val


def test_automodel_local_model_and_dataset_are_file_mounts_at_their_own_paths(sky, tmp_path: Path) -> None:
    """A local model dir and local dataset dir/file of an AutoModel file reach the nodes at the same absolute paths
    (file mounts SkyPilot's schema and ``sky.Task`` accept), so the rank config is the file's sections unchanged;
    a Hub id is not a path and is not mounted."""
    sections, model, data, val = _local_recipe(tmp_path)
    cfg = config.load({**sections, "output_dir": str(tmp_path / "R"),
                       "skypilot": {"cloud": "gcp", "accelerators": "A100:8", "hf_token": ""}})
    backend = skypilot.SkyPilot()
    p = backend.plan(cfg, JOB, backend.preflight([cfg]))
    backend.check([p])  # SkyPilot's own schema and sky.Task (a mount source must exist)
    task = sky.Task.from_yaml_config(yaml.safe_load(p.files[skypilot.TASK_FILE]))
    mounts = {k: v for k, v in (task.file_mounts or {}).items() if k.startswith(str(tmp_path))}
    assert mounts == {str(model): str(model.resolve()), str(data): str(data.resolve()), str(val): str(val.resolve())}
    assert not any("meta-llama" in k for k in task.file_mounts or {})
    node = yaml.safe_load(p.files[skypilot.NODE_JOB_FILE])
    assert {k: v for k, v in node.items() if k not in FOR_EVERY_RANK} == sections  # as written


def test_automodel_local_paths_the_nodes_cannot_have_are_one_line_each(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A relative path (here it names a dir of the submitting dir; on a node it is read from the synced workdir),
    a ``~`` path (the node user's home) and an absolute path missing here are refused in one line naming the key,
    the value and what to write, before anything is planned or launched. A Hub id passes."""
    sections, model, _, _ = _local_recipe(tmp_path)
    monkeypatch.chdir(model.parent)

    def refusal(key: str, value: str) -> str:
        node, *path, leaf = key.split(".")
        bad = yaml.safe_load(yaml.safe_dump(sections))
        target = bad[node]
        for k in path:
            target = target[k]
        target[leaf] = value
        cfg = config.load({**bad, "output_dir": str(tmp_path / "R"), "skypilot": {"cloud": "gcp", "hf_token": ""}})
        with pytest.raises(ConfigError) as e:
            skypilot.SkyPilot().preflight([cfg])
        assert "\n" not in str(e.value)
        return str(e.value)

    assert refusal("model.pretrained_model_name_or_path", "tiny") == (
        "model.pretrained_model_name_or_path='tiny' is invalid: an absolute path on the SkyPilot nodes (a relative "
        f"path is read from the ranks' own working dir there, not the one it names here); write the absolute path: "
        f"{model}")
    assert refusal("dataset.tokenizer.pretrained_model_name_or_path", "~/tok").startswith(
        "dataset.tokenizer.pretrained_model_name_or_path='~/tok' is invalid: an absolute path on the SkyPilot nodes "
        "(a home path is the home of the ranks' user there")
    assert refusal("dataset.dataset_name", str(tmp_path / "gone")) == (
        f"dataset.dataset_name='{tmp_path / 'gone'}' is invalid: a file or dir that exists on this machine (it is "
        "uploaded (a file mount) to the SkyPilot nodes at the same path), or a Hub id")
    hub = {**sections, "dataset": {**sections["dataset"], "dataset_name": "rajpurkar/squad"}}  # not a dir here
    facts = skypilot.SkyPilot().preflight([config.load({**hub, "output_dir": "/r", "skypilot": {}})])
    assert sorted(facts.paths) == sorted(map(str, [model, tmp_path / "val" / "rows.jsonl"]))


def test_the_bundled_recipes_jsonl_data_travels_with_the_job_as_its_text_file_does(tmp_path: Path) -> None:
    """``data.source: jsonl`` reads ``data.path`` on the ranks as ``source: file`` does: both are uploaded."""
    rows = tmp_path / "rows.jsonl"
    rows.write_text('{"prompt": "a", "answer": "b"}\n')
    cfg = load(["data.source=jsonl", f"data.path={rows}"], tmp_path)
    p = skypilot.SkyPilot().plan(cfg, JOB, skypilot.SkyPilot().preflight([cfg]))
    node = yaml.safe_load(p.files[skypilot.NODE_JOB_FILE])
    assert p.request.task["file_mounts"][node["data"]["path"].replace("${oc.env:HOME}", "~")] == str(rows)


def test_spot_resume_keys_plan_and_resume_from_the_jobs_bucket(sky, tmp_path: Path) -> None:
    """The spot-resume keys ``restore_from: {path: /checkpoints/latest}`` and a short
    ``step_scheduler.checkpoint_interval`` plan a managed spot job whose nodes resume from the newest complete
    checkpoint of the job's own dir in its bucket (mounted at /checkpoints); SkyPilot accepts the task."""
    cfg = load(["skypilot.use_spot=true", "skypilot.cloud=aws", "skypilot.hf_token=",
                "restore_from.path=/checkpoints/latest", "step_scheduler.checkpoint_interval=5"], tmp_path)
    p = plan(cfg)
    skypilot.SkyPilot().check([p])
    task = sky.Task.from_yaml_config(yaml.safe_load(p.files[skypilot.TASK_FILE]))
    assert p.request.managed and task.resources.pop().use_spot
    assert task.storage_mounts["/checkpoints"].name == FACTS.auto_bucket
    on_node = config.load_rank(yaml.safe_load(p.files[skypilot.NODE_JOB_FILE]))
    assert on_node.checkpoint_dir == f"/checkpoints/{p.request.name}/checkpoints"
    assert on_node.restore_from.path == "latest" and on_node.step_scheduler.checkpoint_interval == 5
    # another mount point: the same key names that one; any other path stays refused, naming the field
    moved = load(["skypilot.checkpoint_mount=/ckpt", "restore_from.path=/ckpt/latest"], tmp_path)
    assert config.load_rank(yaml.safe_load(plan(moved).files[skypilot.NODE_JOB_FILE])).restore_from.path == "latest"
    with pytest.raises(ConfigError, match=r"restore_from.path.*'/ckpt/latest'"):
        plan(load(["skypilot.checkpoint_mount=/ckpt", "restore_from.path=/checkpoints/latest"], tmp_path))
