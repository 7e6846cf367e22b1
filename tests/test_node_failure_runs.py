"""A node that dies under a running Slurm job, for real, on the test cluster: the slurmd of the node running the
job and every process of the job on it are killed (SIGKILL, as a power loss leaves them), and the node is set DOWN
as slurmctld does once ``SlurmdTimeout`` passes (300 s by default: the test does not wait for it). Slurm requeues
the job itself (``--requeue``, slurm.max_requeues > 0); the requeued run goes to the other node and completes, and
the ledger says node_failure for the dead run (sacct -D's NODE_FAIL, recorded by the requeued run's rank 0). The
node is restored afterwards (slurmd restarted, ``state=resume``) so later tests have both nodes."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import typing as tp
from pathlib import Path

import pytest

from tests.slurm_cluster import SBIN_PATH
from tests.test_failure_runs import _classes, _status
from tests.test_truth_runs import _config, _train


def _job_pids(job: str) -> list[int]:
    """This job's processes on this machine: its slurmstepd and every task (SLURM_JOB_ID in their environment)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
            env = (proc / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if cmd.startswith(f"slurmstepd: [{job}.".encode()) or f"SLURM_JOB_ID={job}".encode() in env:
            found.append(int(proc.name))
    return found


def kill_node(cluster: tp.Any, node: str, job: str) -> float:
    """Kill ``node``'s slurmd and ``job``'s processes (all on ``node``: a one-node job), then set the node DOWN.
    Returns the time.time() of the kill."""
    slurmd = int((cluster.dir / "pid" / f"slurmd-{node}.pid").read_text())
    at = time.time()
    for pid in [slurmd, *_job_pids(job)]:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    cluster.run("scontrol", "update", f"nodename={node}", "state=down", "reason=node-killed-by-test")
    return at


def restore_node(cluster: tp.Any, node: str) -> None:
    """Start the killed slurmd again, as ``scripts/slurm-cluster up`` starts each one (in its own mount namespace
    with the cluster's hosts file; ``up`` itself would restart the whole cluster, one daemon being down), and resume
    the node."""
    env = {**os.environ, "SLURM_CONF": str(cluster.conf), "PATH": f"{os.environ.get('PATH', '')}:{SBIN_PATH}"}
    start = ["slurmd", "-f", str(cluster.conf), "-N", node]
    proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                           'mount --bind "$1" /etc/hosts && shift && exec "$@"', "sh",
                           str(cluster.dir / "etc" / "hosts"), *start], env=env, check=False, timeout=60)
    if proc.returncode != 0:  # no mount namespaces here: the node names resolve to 127.0.0.1 already
        subprocess.run(start, env=env, check=True, timeout=60)
    cluster.run("scontrol", "update", f"nodename={node}", "state=resume", check=False)
    deadline = time.monotonic() + 60
    while f"{node} idle" not in cluster.run("sinfo", "-h", "-N", "-o", "%N %t").stdout:
        assert time.monotonic() < deadline, f"{node} did not come back"
        time.sleep(0.5)


def submit_until_training(conf: Path, run: Path, started: Path) -> str:
    """Submit the run of ``conf`` into ``run`` (detached) and wait until its recipe has trained a few steps (its
    ``started`` file, rewritten every step, is 1.5 s old); returns the Slurm job id."""
    proc = _train(conf, run)
    assert proc.returncode == 0, proc.stdout[-3000:]
    job = _status(run)["job_ids"][0]
    deadline = time.monotonic() + 120
    while not started.exists() or time.time() - started.stat().st_mtime < 1.5:  # a few steps done
        assert time.monotonic() < deadline, proc.stdout[-3000:]
        time.sleep(0.2)
    return str(job)


def node_failure_run(cluster: tp.Any, tmp_path: Path) -> dict[str, tp.Any]:
    """One one-node job killed with its node once it trained a few steps; returns its status row, plus
    ``killed_at`` and ``first_step_at`` (the requeued run's recipe start, 0.1 s before its first step ends: the
    recipe's ``fault.write`` file, written by rank 0 as it starts)."""
    started = tmp_path / "recipe-started"
    conf = _config(tmp_path, {"mode": "none", "steps": 80, "write": str(started)}, launcher="slurm", ft=None)
    text = (conf / "job.yaml").read_text().replace("  wait: true\n", "  wait: false\n  max_requeues: 3\n")
    (conf / "job.yaml").write_text(text)
    run = tmp_path / "R"
    job = submit_until_training(conf, run, started)
    node = cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip()
    assert node in ("node1", "node2"), node
    first_write = started.stat().st_mtime
    try:
        killed_at = kill_node(cluster, node, job)
        deadline = time.monotonic() + 180
        while cluster.sacct_state(job) != "COMPLETED" or not (run / "result.json").exists():
            assert time.monotonic() < deadline, cluster.run("sacct", "-D", "-j", job, check=False).stdout
            time.sleep(0.5)
    finally:
        restore_node(cluster, node)
    row = _status(run)
    assert started.stat().st_mtime > first_write
    return {**row, "killed": node, "killed_at": killed_at, "first_step_at": started.stat().st_mtime}


@pytest.mark.slurm
@pytest.mark.slow
def test_a_node_failure_is_requeued_off_the_node_and_the_ledger_says_node_failure(slurm_cluster: tp.Any,
                                                                                  tmp_path: Path) -> None:
    row = node_failure_run(slurm_cluster, tmp_path)
    node = row["killed"]
    assert row["state"] == "COMPLETED" and _classes(row) == ["node_failure", "completed"], row
    first, second = row["attempts"]
    assert (first["node"], first["evidence"]) == (node, "Slurm state NODE_FAIL"), first
    assert second["node"] != node, row
    runs = slurm_cluster.run("sacct", "-D", "-X", "-n", "-P", "-j", row["job_ids"][0], "-o", "State").stdout.split()
    assert runs[:1] == ["NODE_FAIL"] and runs[-1] == "COMPLETED", runs
    print(f"\nnode failure to the requeued job's first step: {row['first_step_at'] - row['killed_at']:.1f} s")


@pytest.mark.slurm
@pytest.mark.slow
def test_a_node_failure_of_a_two_node_run_names_the_node_that_went_down(slurm_cluster: tp.Any,
                                                                        tmp_path: Path) -> None:
    """A two-node job (node1 and node2) whose node2 dies mid-run (its slurmd and the job's processes killed, node2
    set DOWN): Slurm ends the run NODE_FAIL and requeues it; it runs again once node2 is back and completes. The
    ledger names node2 for the dead run (Slurm's down event for it, sacctmgr's "show event"), not the node of the
    run's first rank, which a two-node run's node list alone cannot tell apart."""
    started = tmp_path / "recipe-started"
    conf = _config(tmp_path, {"mode": "none", "steps": 80, "write": str(started)}, launcher="slurm", ft=None)
    text = (conf / "job.yaml").read_text().replace("  wait: true\n", "  wait: false\n  max_requeues: 3\n")
    (conf / "job.yaml").write_text(text.replace("  nodes: 1\n", "  nodes: 2\n").replace("ntasks_per_node: 2",
                                                                                        "ntasks_per_node: 1"))
    run = tmp_path / "R"
    job = submit_until_training(conf, run, started)
    assert slurm_cluster.run("squeue", "-h", "-j", job, "-o", "%N").stdout.strip() == "node[1-2]"
    try:
        kill_node(slurm_cluster, "node2", job)
        deadline = time.monotonic() + 120
        while "NODE_FAIL" not in slurm_cluster.run("sacct", "-D", "-X", "-n", "-j", job, "-o", "State").stdout:
            assert time.monotonic() < deadline
            time.sleep(0.5)
    finally:
        restore_node(slurm_cluster, "node2")
    deadline = time.monotonic() + 180
    while slurm_cluster.sacct_state(job) != "COMPLETED" or not (run / "result.json").exists():
        assert time.monotonic() < deadline, slurm_cluster.run("sacct", "-D", "-j", job, check=False).stdout
        time.sleep(0.5)
    row = _status(run)
    assert row["state"] == "COMPLETED" and _classes(row) == ["node_failure", "completed"], row
    first = row["attempts"][0]
    assert (first["node"], first["evidence"]) == ("node2", "Slurm state NODE_FAIL"), first
