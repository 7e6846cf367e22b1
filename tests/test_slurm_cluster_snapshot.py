"""A queued sweep runs the code it was submitted with (automodel_hydra/snapshot.py), on the real test cluster:
the jobs are held in the queue, the user's recipe is edited, then the jobs are released."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, USER_JOB, user_repo

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

RECIPE = '''
VERSION = "{version}"


def main(cfg, dist, should_stop):
    return {{"loss": 0.0, "version": VERSION, "x": cfg.x}}
'''

JOB = USER_JOB + """  detach: true
  sbatch_args: {hold: null}
"""


def test_held_sweep_runs_the_submitted_recipe_not_the_edited_one(slurm_cluster, tmp_path: Path) -> None:
    repo = user_repo(tmp_path, RECIPE, JOB)  # the user's own repo: one commit and an uncommitted edit
    sweep = tmp_path / "S"
    env = {**os.environ, "PYTHONPATH": str(repo)}  # the recipe imports here, as a user's checkout would
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(repo), "--config-name", "job",
                           "-m", "x=1,2,3", f"hydra.sweep.dir={sweep}"], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = json.loads((sweep / "launch" / "manifest.json").read_text())
    ids = [job["job_ids"][0] for job in manifest["jobs"]]
    array = ids[0].split("_")[0]
    try:
        assert len(ids) == 3 and {i.split("_")[0] for i in ids} == {array}
        state = slurm_cluster.run("squeue", "-h", "-j", array, "-o", "%T %r").stdout.split()
        assert state[:2] == ["PENDING", "JobHeldUser"], state
        (repo / "my_pkg" / "train.py").write_text(RECIPE.format(version="edited while queued"))
        slurm_cluster.run("scontrol", "release", array)
        slurm_cluster.wait_gone(array, timeout=180)
    finally:
        slurm_cluster.run("scancel", array, check=False)
    results = [json.loads((sweep / str(i) / "result.json").read_text()) for i in range(3)]
    assert [r["version"] for r in results] == ["submitted"] * 3
    assert sorted(r["x"] for r in results) == [1, 2, 3]
    code = {json.dumps(job.get("code"), sort_keys=True) for job in manifest["jobs"]}
    assert len(code) == 1, "one snapshot for the whole sweep"
    record = manifest["jobs"][0]["code"]
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert record["snapshot"] == "git" and record["commit"] == head.stdout.strip() and record["dirty"] is True
    assert record["dir"] == str(sweep / "launch" / "code") and record["files"] == 3
    assert not [p for p in (sweep / "launch").iterdir() if p.name.startswith(".code")]


VENDORED = '''
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "third_party", "mylib"))  # as Megatron users do
import mylib  # noqa: E402

VERSION = "{version}"


def main(cfg, dist, should_stop):
    return {{"loss": 0.0, "lib": mylib.NAME}}
'''


def test_a_recipe_importing_a_submodule_runs_from_the_snapshot(slurm_cluster, tmp_path: Path) -> None:
    """``third_party/mylib`` is a git submodule the recipe imports: the snapshot holds its files, so the job that
    imported fine here imports on the ranks too (the snapshot held only the superproject's files before)."""
    from tests.test_snapshot import with_submodule

    repo = user_repo(tmp_path, VENDORED, USER_JOB)
    with_submodule(repo, tmp_path)
    run = tmp_path / "R"
    env = {**os.environ, "PYTHONPATH": str(repo)}
    proc = subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(repo), "--config-name", "job",
                           "slurm.wait=true", f"hydra.run.dir={run}"], cwd=repo, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert json.loads((run / "result.json").read_text())["lib"] == "mylib"
    record = json.loads((run / "launch" / "submission.json").read_text())["code"]
    assert list(record["submodules"]) == ["third_party/mylib"]
