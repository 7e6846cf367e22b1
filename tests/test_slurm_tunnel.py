"""Slurm through SSH (``slurm.tunnel``, docs/remote.md): a real sshd on loopback (tests/ssh_server.py) in front of
the real test cluster. The launching shell has no SLURM_CONF and no Slurm client on its PATH (only ssh and git):
only the SSH side can submit. The error tests need no cluster."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
import typing as tp
from pathlib import Path

import pytest

from tests import helpers
from tests.helpers import ROOT, free_port, git

pytestmark = [pytest.mark.slurm]

RECIPE = '''
import time

VERSION = "{version}"


def main(cfg, dist, should_stop):
    if cfg.x == 1:  # the job a test cancels while it runs
        time.sleep(120)
    print(f"recipe {{VERSION}} on rank {{dist.rank}} of {{dist.world_size}}", flush=True)
    return {{"loss": 0.0, "version": VERSION, "x": cfg.x, "world_size": dist.world_size,
             "nodes": dist.env.num_nodes}}
'''

JOB = helpers.USER_JOB


def user_repo(tmp_path: Path, version: str = "submitted") -> Path:
    """The user's own repo: a recipe module and a job file, one commit, then an uncommitted edit."""
    return helpers.user_repo(tmp_path, RECIPE, JOB, version)


def local_env(tmp_path: Path) -> dict[str, str]:
    """The launching shell: no SLURM_CONF, no Slurm client on PATH; ssh and git only (and this venv)."""
    bin_dir = tmp_path / "local-bin"
    if not bin_dir.exists():
        bin_dir.mkdir()
        for tool in ("ssh", "git"):
            found = shutil.which(tool)
            assert found, tool
            (bin_dir / tool).symlink_to(found)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SBATCH_", "SQUEUE_"))}
    env["PATH"] = f"{bin_dir}:{Path(sys.executable).parent}"
    return env


def launch(repo: Path, env: dict[str, str], *overrides: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(ROOT / "train.py"), "--config-dir", str(repo), "--config-name", "job",
                           *overrides], cwd=repo, env={**env, "PYTHONPATH": str(repo)}, capture_output=True,
                          text=True, timeout=timeout)


def cli(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "automodel_hydra.cli", *args], env=env, cwd=cwd,
                          capture_output=True, text=True, timeout=120)


# ----------------------------------------------------------------------------------------------- one line, fast


@pytest.mark.parametrize("case", ["refused key", "closed port", "no sbatch"])
def test_an_unusable_login_node_is_one_line_within_seconds(sshd, tmp_path: Path, case: str) -> None:
    repo = user_repo(tmp_path)
    remote = tmp_path / "remote"
    kw: dict[str, tp.Any] = {"refused key": {"key": sshd.other_key}, "closed port": {"port": free_port()},
                             "no sbatch": {"port": sshd.bare_port}}[case]
    start = time.monotonic()
    proc = launch(repo, local_env(tmp_path), *sshd.overrides(remote, **kw), f"hydra.run.dir={tmp_path / 'run'}")
    took = time.monotonic() - start
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert lines[-1].startswith("error: slurm.tunnel"), lines[-3:]
    assert "Traceback" not in proc.stderr
    expected = {"refused key": ("slurm.tunnel.identity", "refused the key", str(sshd.other_key)),
                "closed port": ("slurm.tunnel.host", "does not answer", "Connection refused"),
                "no sbatch": ("slurm.tunnel.host", "has no sbatch")}[case]
    assert all(word in lines[-1] for word in expected), lines[-1]
    assert took < 20, f"{took:.1f} s"  # python + Hydra start-up included; ssh itself answers in well under 1 s
    assert not remote.exists(), "nothing was copied or submitted"
    assert not (tmp_path / "run" / "launch" / "submission.json").exists()


def test_a_request_no_node_can_hold_is_refused_with_the_login_nodes_answer(slurm_cluster, sshd, tmp_path: Path) -> None:
    """The launching shell has no Slurm client: the partitions compared are the ones the login node's sinfo
    describes, in the one preflight command, and nothing is copied or submitted."""
    repo, remote = user_repo(tmp_path), tmp_path / "remote"
    proc = launch(repo, local_env(tmp_path), *sshd.overrides(remote), "slurm.ntasks_per_node=8",
                  f"hydra.run.dir={tmp_path / 'run'}")
    slurm_cluster.cancel_left(re.findall(r"submitted slurm job (\d+)", proc.stdout))  # (what would wait for ever)
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == ("error: slurm.ntasks_per_node=8 asks 8 CPUs per node; partition "
                                                    "debug's nodes have at most 2 (CPUTot)")
    assert not remote.exists(), "nothing was copied or submitted"


# ----------------------------------------------------------------------------------------------- the cluster


def test_two_node_job_through_the_tunnel_is_followed_and_reported(slurm_cluster, sshd, tmp_path: Path) -> None:
    repo = user_repo(tmp_path)
    remote, run = tmp_path / "remote", tmp_path / "run"
    env = local_env(tmp_path)
    proc = launch(repo, env, *sshd.overrides(remote), "slurm.nodes=2", "+slurm.wait=true", "x=7",
                  f"hydra.run.dir={run}")
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out[-4000:]
    node_run = remote / run.relative_to("/")  # outside the submitting dir: its absolute path under job_dir
    record = json.loads((run / "launch" / "submission.json").read_text())
    job_id = record["job_ids"][0]
    assert f"submitted slurm job {job_id}" in proc.stdout
    assert record["log_path"] == f"{sshd.user}@127.0.0.1:{node_run}/slurm/{job_id}_0_log.out"
    assert record["ref"]["remote"]["job_dir"] == str(node_run)
    assert "recipe submitted on rank 0 of 2" in proc.stdout, "the remote log is followed"
    # the ranks ran there, in the remote job dir, from the snapshot shipped there
    there = json.loads((node_run / "result.json").read_text())
    assert there["world_size"] == 2 and there["nodes"] == 2 and there["x"] == 7 and there["version"] == "submitted"
    assert (node_run / "launch" / "code" / "src" / "my_pkg" / "train.py").is_file()
    assert not (run / "launch" / "code").exists(), "no snapshot is written here"
    # the local run dir keeps .hydra/, launch/ and the records, and a copy of the result this launch wrote
    assert (run / ".hydra" / "config.yaml").is_file()
    here = json.loads((run / "result.json").read_text())
    assert here == there and here["run_id"] == (run / "launch" / "run_id").read_text().strip()
    assert f"export AUTOMODEL_JOB_DIR={node_run}" in (run / "launch" / "sbatch.sh").read_text()
    assert record["code"]["host"] == f"{sshd.user}@127.0.0.1"
    assert record["code"]["dir"] == str(node_run / "launch" / "code") and record["code"]["dirty"] is True
    status = cli(env, "status", str(run), "--json")
    assert status.returncode == 0, status.stderr
    assert [r["state"] for r in json.loads(status.stdout)] == ["COMPLETED"]
    logs = cli(env, "logs", str(run), "--no-follow")
    assert "recipe submitted on rank 0 of 2" in logs.stdout, logs.stderr


def test_three_point_array_through_the_tunnel_runs_the_submitted_code(slurm_cluster, sshd, tmp_path: Path) -> None:
    """Submitted held, the recipe edited while the array pends, then released; the job that runs long is cancelled
    through the tunnel: the others run the submitted code, and status/report say what happened."""
    repo = user_repo(tmp_path)
    remote, sweep = tmp_path / "remote", repo / "multirun" / "S"  # inside the submitting dir
    env = local_env(tmp_path)
    proc = launch(repo, env, "-m", *sshd.overrides(remote), "x=1,2,3", "+slurm.detach=true",
                  "+slurm.sbatch_args.hold=null", "hydra.sweep.dir=multirun/S")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    manifest = json.loads((sweep / "launch" / "manifest.json").read_text())
    ids = [job["job_ids"][0] for job in manifest["jobs"]]
    array = ids[0].split("_")[0]
    node_sweep = remote / sweep.relative_to("/")  # its absolute path under job_dir, whatever the submitting dir
    try:
        assert ids == [f"{array}_{i}" for i in range(3)]
        status = cli(env, "status", str(sweep), "--json")
        assert [r["state"] for r in json.loads(status.stdout)] == ["PENDING"] * 3, status.stdout + status.stderr
        (repo / "my_pkg" / "train.py").write_text(RECIPE.format(version="edited while queued"))
        slurm_cluster.run("scontrol", "release", array)
        deadline = time.monotonic() + 60
        while json.loads(cli(env, "status", str(sweep), "--json").stdout)[0]["state"] != "RUNNING":
            assert time.monotonic() < deadline, "job 0 never started"
            time.sleep(0.5)
        cancel = cli(env, "cancel", str(sweep), "0")
        assert cancel.returncode == 0 and "was RUNNING, cancel requested" in cancel.stdout, cancel.stderr
        slurm_cluster.wait_gone(array, timeout=180)
    finally:
        slurm_cluster.run("scancel", array, check=False)
    deadline = time.monotonic() + 60
    while True:  # accounting is written a moment after the queue empties
        states = [r["state"] for r in json.loads(cli(env, "status", str(sweep), "--json").stdout)]
        if states == ["CANCELLED", "COMPLETED", "COMPLETED"] or time.monotonic() > deadline:
            break
        time.sleep(1)
    assert states == ["CANCELLED", "COMPLETED", "COMPLETED"]
    results = [json.loads((sweep / str(i) / "result.json").read_text()) for i in (1, 2)]  # fetched back by status
    assert [r["version"] for r in results] == ["submitted"] * 2 and [r["x"] for r in results] == [2, 3]
    assert not (sweep / "0" / "result.json").exists()
    code = {json.dumps(job.get("code"), sort_keys=True) for job in manifest["jobs"]}
    assert len(code) == 1, "one snapshot for the whole sweep"
    record = manifest["jobs"][0]["code"]
    assert record["commit"] == git(repo, "rev-parse", "HEAD") and record["dirty"] is True
    assert record["dir"] == str(node_sweep / "launch" / "code")
    assert not [p for p in (node_sweep / "launch").iterdir() if p.name.startswith(".code")]
    report = cli(env, "report", str(sweep), cwd=repo)  # exit 1: the recipe logs no metrics.jsonl, so no curves
    assert "final_metrics.csv" in report.stdout + report.stderr, report.stderr
    csv = (sweep / "report" / "final_metrics.csv").read_text().splitlines()
    assert [line.split(",")[2] for line in csv[1:]] == ["False", "True", "True"]  # completed column


APP = '''
import os
import re

import hydra
from hydra.core.hydra_config import HydraConfig

VERSION = "{version}"


@hydra.main(version_base=None, config_path=None)
def main(cfg):
    return {{"x": cfg.x, "version": VERSION, "cwd": os.getcwd(), "job_dir": HydraConfig.get().runtime.output_dir}}


if __name__ == "__main__":
    main()
'''


def test_call_jobs_of_a_foreign_hydra_app_run_through_the_tunnel(slurm_cluster, sshd, tmp_path: Path) -> None:
    """A Hydra app whose task function is not ours: each job one process on the cluster, from the snapshot,
    writing its Hydra job dir there; the JobReturn comes back to the launcher here."""
    from automodel_hydra.call import read_job_return

    repo = user_repo(tmp_path)
    (repo / "app.py").write_text(APP.format(version="submitted"))
    remote, sweep = tmp_path / "remote", repo / "multirun" / "C"
    env = local_env(tmp_path)
    tunnel = [o.replace("+slurm.", "hydra.launcher.slurm.") for o in sshd.overrides(remote)]
    tunnel = [("+" + o) if ".options." in o else o for o in tunnel]
    proc = subprocess.run([sys.executable, "app.py", "-m", "hydra/launcher=automodel", "hydra.launcher.backend=slurm",
                           "hydra.launcher.slurm.partition=debug", "hydra.launcher.slurm.time=5", *tunnel,
                           "+x=1,2", "hydra.sweep.dir=multirun/C"], cwd=repo, env={**env, "PYTHONPATH": str(repo)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    node_sweep = remote / sweep.relative_to("/")
    for i in (0, 1):
        ret = read_job_return(sweep / str(i) / "launch" / "call_result.pkl")  # fetched back
        value = ret.return_value
        assert value["x"] == i + 1 and value["version"] == "submitted"
        assert value["cwd"] == str(node_sweep / "launch" / "code" / "src"), "the copy of the submitting dir"
        assert Path(value["job_dir"]).resolve() == node_sweep / str(i)
        assert (node_sweep / str(i) / ".hydra" / "config.yaml").is_file()
