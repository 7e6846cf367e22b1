"""An AutoModel file on SkyPilot, run as far as this machine allows: no cloud exists here, so the planned task's own
``run`` script is run by bash with the variables SkyPilot sets on a node (one node, 2 ranks, the synced workdir =
this checkout, the job config where the task's file mount puts it), and trains AutoModel's real recipe on a tiny
local model. What differs from a cloud node: the setup is not run (this environment has it installed already), the
GPU is the tests' CPU stand-in (tests/automodel_assets.py), and the model is a local dir, not a Hub download."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from automodel_hydra import config
from automodel_hydra.backends import skypilot
from automodel_hydra.plan import JobSpec
from automodel_hydra.sections import FOR_EVERY_RANK
from tests.automodel_assets import SQUAD_YAML, cpu_overrides, rank_env
from tests.helpers import ROOT, free_port

pytest_plugins = ["tests.automodel_assets"]
pytestmark = [pytest.mark.automodel, pytest.mark.slow]
pytest.importorskip("nemo_automodel")


def _with_overrides(sections: dict, overrides: list[str]) -> dict:
    for item in overrides:
        key, value = item.split("=", 1)
        *path, leaf = key.split(".")
        node = sections
        for k in path:
            node = node.setdefault(k, {})
        node[leaf] = yaml.safe_load(value)
    return sections


def test_the_nodes_run_script_trains_the_automodel_recipe(tiny_llama_dir: Path, squad_dir: Path,
                                                           tmp_path: Path) -> None:
    small = [o for o in cpu_overrides(tiny_llama_dir, squad_dir, tmp_path / "unused", max_steps=2,
                                      ckpt_every_steps=2, val_every_steps=2) if not o.startswith("checkpoint.")]
    sections = _with_overrides(yaml.safe_load(SQUAD_YAML.read_text()), small)
    del sections["checkpoint"]  # as most of AutoModel's examples: AutoModel's defaults (checkpoints/, enabled)
    block = {"use_spot": False, "checkpoint_bucket": None, "accelerators": None, "nproc_per_node": 2,
             "master_port": free_port(), "hf_token": "", "hf_home": None}
    cfg = config.load({**sections, "output_dir": str(tmp_path / "R"), "skypilot": block})
    job = JobSpec(job_dir=tmp_path / "R", job_name="train", project_root=ROOT)
    p = skypilot.make_plan(cfg, job, skypilot.Facts("unused-bucket"))
    node_spec = yaml.safe_load(p.files[skypilot.NODE_JOB_FILE])
    assert {k: v for k, v in node_spec.items() if k not in FOR_EVERY_RANK} == sections

    home, key = tmp_path / "home", p.request.name
    mounted = home / "automodel" / key / "launch" / "job.yaml"  # where the task's file mount puts it
    mounted.parent.mkdir(parents=True)
    mounted.write_text(p.files[skypilot.NODE_JOB_FILE])
    env = {**rank_env(), "HOME": str(home), "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
           "SKYPILOT_NUM_NODES": "1", "SKYPILOT_NODE_RANK": "0", "SKYPILOT_NODE_IPS": "127.0.0.1\n",
           "SKYPILOT_TASK_ID": f"sky-test_{key}_1"}
    proc = subprocess.run(["bash", "-c", p.request.task["run"]], cwd=ROOT, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:]
    (line,) = [x for x in proc.stdout.splitlines() if x.startswith(skypilot.RESULT_MARK)]
    result = json.loads(line[len(skypilot.RESULT_MARK):])
    assert result["world_size"] == 2 and result["step"] >= 1 and result["loss"] > 0
    out = home / "automodel" / key
    assert sorted(d.name for d in (out / "checkpoints").glob("epoch_*_step_*")) == ["epoch_0_step_1"]
    # AutoModel's default checkpoint_dir, under the node's run dir (with a bucket: the run's dir in it), not the
    # synced workdir the ranks start in
    assert (out / "checkpoints" / "training.jsonl").is_file() and not (ROOT / "checkpoints").exists()
