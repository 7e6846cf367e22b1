"""No secret value reaches a file or the output .

A token lives only in the submitting shell (``HF_TOKEN=hf_SECRET_<random>``) and is referenced as ``${HF_TOKEN}``
(or ``${oc.env:HF_TOKEN}``) in env_vars. Every launcher's plan is made (dry runs, single and ``-m``) and real
interactive runs train with the token in their environment (interactive has no env_vars: the ranks simply inherit
it); then every byte the product wrote under the run and sweep dirs (scripts, task YAML, ``.hydra/``, job files,
launch records, logs, metrics, checkpoints) and everything it printed is searched for the value. The real Slurm
run is in test_slurm_cluster_jobs.py (``...keeps_the_token_secret``); SkyPilot's in-memory secret in
test_skypilot_launch.py.
"""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ROOT, metrics

REFS = {"slurm": ["++slurm.env_vars.HF_TOKEN=${HF_TOKEN}", "++slurm.env_vars.ALSO=${oc.env:HF_TOKEN}"],
        "skypilot": ["++skypilot.env_vars.HF_TOKEN=${HF_TOKEN}", "++skypilot.env_vars.ALSO=${oc.env:HF_TOKEN}"],
        "interactive": []}


def _start(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, str(ROOT / "train.py"), *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def _leaks(root: Path, token: bytes) -> list[str]:
    hits = []
    for p in root.rglob("*"):
        if p.is_file() and not p.is_symlink() and token in p.read_bytes():
            hits.append(str(p.relative_to(root)))
    return hits


@pytest.mark.slow
def test_no_launcher_writes_or_prints_the_token(tmp_path: Path) -> None:
    token = f"hf_SECRET_{secrets.token_hex(12)}"
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "HF_TOKEN": token,
           "HOME": str(tmp_path / "home")}  # SkyPilot's import writes ~/.sky: keep it in the test dir
    (tmp_path / "home").mkdir()
    out = tmp_path / "out"
    runs: dict[str, subprocess.Popen[str]] = {}
    for launcher, refs in REFS.items():  # every launcher's plan, single and as a sweep (Slurm: one array script)
        runs[f"{launcher}-plan"] = _start([f"launcher={launcher}", *refs, "dry_run=true",
                                           f"hydra.run.dir={out}/{launcher}-plan"], env, tmp_path)
        runs[f"{launcher}-sweep-plan"] = _start(["-m", f"launcher={launcher}", *refs, "seed=1,2", "dry_run=true",
                                                 f"hydra.sweep.dir={out}/{launcher}-sweep-plan"], env, tmp_path)
    # real interactive runs, single and a sweep (its jobs' torchrun output goes to launch/torchrun.out)
    train = ["step_scheduler.max_steps=3", "step_scheduler.checkpoint_interval=2", "step_scheduler.log_interval=1"]
    runs["interactive-run"] = _start([*train, "interactive.nproc_per_node=2", f"hydra.run.dir={out}/run"], env,
                                     tmp_path)
    runs["interactive-sweep"] = _start(["-m", *train, "interactive.nproc_per_node=1", "seed=1,2",
                                        f"hydra.sweep.dir={out}/sweep"], env, tmp_path)
    outputs = {name: p.communicate(timeout=300)[0] for name, p in runs.items()}
    for name, p in runs.items():
        assert p.returncode == 0, f"{name}:\n{outputs[name][-3000:]}"

    # the runs really happened and really saw the token's references
    assert [r["step"] for r in metrics(out / "run")] == [1, 2, 3]
    assert all((out / "sweep" / n / "result.json").exists() for n in ("0", "1"))
    assert list((out / "run" / "checkpoints").glob("step-*/*.distcp"))
    assert 'export HF_TOKEN="${HF_TOKEN}"' in (out / "slurm-plan" / "launch" / "sbatch.sh").read_text()
    assert 'export HF_TOKEN="${HF_TOKEN}"' in (out / "slurm-sweep-plan" / "launch" / "sbatch.sh").read_text()
    assert "HF_TOKEN: null" in (out / "skypilot-plan" / "launch" / "sky_task.yaml").read_text()
    written = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file())
    for must in (".hydra/config.yaml", ".hydra/overrides.yaml", "launch/job.yaml", "launch/submission.json",
                 "train.log", "metrics.jsonl", "result.json", "checkpoints/latest"):
        assert f"run/{must}" in written, f"expected run/{must} among what was searched"
    assert "sweep/0/launch/torchrun.out" in written and "sweep/launch/manifest.json" in written

    assert _leaks(out, token.encode()) == [], "the token's value was written to a file"
    assert _leaks(tmp_path / "home", token.encode()) == []
    printed = [name for name, text in outputs.items() if token in text]
    assert printed == [], f"the token's value was printed by {printed}"
