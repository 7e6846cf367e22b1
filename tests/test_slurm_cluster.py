"""The real loopback Slurm cluster (scripts/slurm-cluster) does what the Slurm tests rely on.

Two nodes idle; a 2-node x 2-task torch gloo job run with srun reduces correctly; sacct reports honest final
states (COMPLETED, CANCELLED); a requeued job restarts within seconds. About 20-30 s on 2 cores.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.helpers import wait_for
from tests.slurm_cluster import REPO_ROOT, SlurmCluster

pytestmark = pytest.mark.slurm

# Each rank joins a gloo group from Slurm's variables and all-reduces rank + 1: 1 + 2 + 3 + 4 = 10.
ALL_REDUCE = textwrap.dedent(
    """
    import datetime, os
    import torch, torch.distributed as dist
    rank, world = int(os.environ["SLURM_PROCID"]), int(os.environ["SLURM_NTASKS"])
    dist.init_process_group(
        "gloo", init_method=f"tcp://{os.environ['MASTER_ADDR']}:{os.environ['MASTER_PORT']}",
        rank=rank, world_size=world, timeout=datetime.timedelta(seconds=60),
    )
    value = torch.tensor([rank + 1.0])
    dist.all_reduce(value)
    print(f"rank={rank} world={world} node={os.environ['SLURMD_NODENAME']} sum={value.item():g}", flush=True)
    dist.destroy_process_group()
    """
)

# MASTER_PORT is a free port on the first node (the batch script runs there), so that two clusters on one
# machine never meet on a fixed port.
GLOO_JOB = """#!/bin/bash
#SBATCH --job-name=gloo-allreduce
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=2
#SBATCH --time=2
#SBATCH --output={output}
set -euo pipefail
export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
export MASTER_PORT=$({python} -c 'import socket; s = socket.socket(); s.bind(("", 0)); print(s.getsockname()[1])')
srun {python} -c {code}
"""


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_both_nodes_idle(slurm_cluster: SlurmCluster) -> None:
    def states() -> dict[str, str]:
        out = slurm_cluster.run("sinfo", "-h", "-N", "-p", slurm_cluster.partition, "-o", "%N %t").stdout
        return dict(line.split() for line in out.splitlines())

    # a job of an earlier test (or another session sharing the cluster) may still be completing
    wait_for(lambda: set(states().values()) == {"idle"}, 30, "idle nodes")
    assert states() == {node: "idle" for node in slurm_cluster.nodes}


def test_two_node_gloo_all_reduce(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    output = tmp_path / "gloo-%j.out"
    script = tmp_path / "gloo.sbatch"
    script.write_text(GLOO_JOB.format(output=output, python=shlex.quote(sys.executable), code=shlex.quote(ALL_REDUCE)))

    job_id = slurm_cluster.sbatch(f"--chdir={tmp_path}", str(script))
    slurm_cluster.wait_gone(job_id, timeout=120)

    log = Path(str(output).replace("%j", job_id)).read_text()
    results = sorted(line for line in log.splitlines() if line.startswith("rank="))
    assert results == [
        f"rank={rank} world=4 node={node} sum=10"
        for rank, node in enumerate(["node1", "node1", "node2", "node2"])
    ], log
    assert slurm_cluster.sacct_state(job_id, timeout=15) == "COMPLETED"


def test_scancel_gives_cancelled(slurm_cluster: SlurmCluster) -> None:
    job_id = slurm_cluster.sbatch("--output=/dev/null", "--time=2", "--wrap", "sleep 300")
    wait_for(lambda: slurm_cluster.job_info(job_id).get("JobState") == "RUNNING", 30, f"job {job_id} to run")

    slurm_cluster.run("scancel", job_id)
    slurm_cluster.wait_gone(job_id, timeout=30)
    assert slurm_cluster.sacct_state(job_id, timeout=15) == "CANCELLED"


def test_requeued_job_restarts_quickly(slurm_cluster: SlurmCluster, tmp_path: Path) -> None:
    starts = tmp_path / "starts.txt"
    job_id = slurm_cluster.sbatch(
        "--requeue", "--output=/dev/null", "--time=2",
        "--wrap", f"echo start ${{SLURM_RESTART_COUNT:-0}} >> {shlex.quote(str(starts))}; sleep 300",
    )  # fmt: skip
    try:
        wait_for(lambda: len(_lines(starts)) == 1, 30, f"job {job_id} to start")

        slurm_cluster.run("scontrol", "requeue", job_id)
        # the hold-off is AuthInfo=cred_expire=5 (+1 s), then a scheduler pass (sched_interval=1): ~6-7 s
        requeued = time.monotonic()
        wait_for(lambda: len(_lines(starts)) == 2, 30, f"job {job_id} to restart")
        waited = time.monotonic() - requeued
        assert waited < 15, f"requeued job restarted only after {waited:.1f} s"
        assert _lines(starts) == ["start 0", "start 1"]
        assert slurm_cluster.job_info(job_id)["Restarts"] == "1"
    finally:
        slurm_cluster.run("scancel", job_id, check=False)
        slurm_cluster.wait_gone(job_id, timeout=30)


def test_generated_config_names_no_path_outside_the_state_dir(slurm_cluster: SlurmCluster) -> None:
    """slurm.conf is rewritten on every `up`; every path in it (values and comments) lies in the state dir or
    /tmp, so the cluster depends on nothing outside the repository's checkout and its state dir."""
    text = slurm_cluster.conf.read_text()
    paths = re.findall(r"(?<![\w.])/[^\s,;)]+", text)
    assert paths, "no path found: the pattern is wrong"
    outside = [p for p in paths if not (p.startswith(f"{slurm_cluster.dir}/") or p.startswith("/tmp/"))]
    assert outside == [], f"{slurm_cluster.conf} names paths outside {slurm_cluster.dir}: {outside}"


def test_a_second_up_after_one_that_failed_on_a_busy_port_names_the_port_again(tmp_path: Path) -> None:
    """An ``up`` that fails before writing anything (a port in use) leaves only its own ``.lock``: the next ``up``
    names the port again, not "not a slurm-cluster state dir" (which sent the user hunting a dir they never made)."""
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        env = {**os.environ, "SLURM_CLUSTER_DIR": str(tmp_path / "state"),
               "SLURM_CLUSTER_PORT_BASE": str(busy.getsockname()[1])}
        for _ in range(2):
            run = subprocess.run([str(REPO_ROOT / "scripts" / "slurm-cluster"), "up"], env=env, text=True,
                                 capture_output=True, timeout=60)
            assert run.returncode == 1 and "is in use" in run.stderr, run.stderr
    assert [p.name for p in (tmp_path / "state").iterdir()] == [".lock"]
