"""The health check before training, for real: Slurm jobs on the test cluster (2 gloo ranks on CPU), the recipe
tests/fault_recipe.py without a fault, the device check failed on one node by the test hook
``AUTOMODEL_TEST_HEALTH_FAULT_FILE`` (automodel_hydra.health: the stand-in for a node without its GPUs, on a
cluster without GPUs). The pure rules are in tests/test_health.py."""

from __future__ import annotations

import re
import typing as tp
from pathlib import Path

import pytest

from automodel_hydra import health
from tests.test_failure_runs import _classes, _status
from tests.test_truth_runs import _config, _env, _train


def _slurm_job(tmp_path: Path, *, nodes: int = 1, extra: str = "") -> Path:
    conf = _config(tmp_path, {"mode": "none", "steps": 3}, launcher="slurm", ft=None, extra=extra)
    text = (conf / "job.yaml").read_text().replace("  wait: true\n", "  wait: true\n  max_requeues: 3\n")
    (conf / "job.yaml").write_text(text.replace("  nodes: 1\n", f"  nodes: {nodes}\n"))
    return conf


@pytest.mark.slurm
@pytest.mark.slow
def test_a_node_that_fails_the_health_check_is_left_out_before_any_step(slurm_cluster: tp.Any,
                                                                       tmp_path: Path) -> None:
    """A one-node job with health_check.enabled=true whose first node fails the device check: the failed rank's
    line names the node within 30 s, the attempt is a node_failure at step 0, the hook requeues the job with that
    node in ExcNodeList, and the requeued attempt runs on the other node and completes."""
    bad = tmp_path / "bad-node"
    conf = _slurm_job(tmp_path, extra="health_check:\n  enabled: true\n")
    run = tmp_path / "R"
    proc = _train(conf, run, env=_env(**{health.TEST_FAULT_FILE: str(bad)}))
    assert proc.returncode == 0, proc.stdout[-3000:]
    node = bad.read_text()
    assert node in ("node1", "node2")
    row = _status(run)
    assert row["state"] == "COMPLETED" and _classes(row) == ["node_failure", "completed"], row
    first, second = row["attempts"]
    assert first["node"] == node != second["node"] and row["excluded"] == [node], row
    assert f"health check failed on {node}: the test hook" in first["evidence"], first
    assert first["step"] == 0 and first["end"] - first["start"] < 30, first
    assert first["decision"] == (f"retried: node_failure 1 of failure_budget.node_failure=3; node {node} excluded "
                                 f"(ExcNodeList={node})")
    logs = "".join(p.read_text(errors="replace") for p in run.rglob("*.log"))
    assert re.search(rf"health check failed on {node}: ", logs + proc.stdout), proc.stdout[-3000:]
    assert slurm_cluster.job_info(row["job_ids"][0]).get("ExcNodeList") == node


@pytest.mark.slurm
@pytest.mark.slow
def test_two_node_jobs_check_by_default_cheaply_and_blame_the_failed_node(slurm_cluster: tp.Any,
                                                                         tmp_path: Path) -> None:
    """Two-node jobs, one after the other (the check is on by default there): without a fault the job completes
    and rank 0's check (which waits for every rank's) takes well under a second (printed: the seconds it adds);
    with the first node to check failing it (failure_budget.node_failure=0: no retry, the partition has no third
    node anyway), the ranks of the healthy node end too, and the ledger blames the failed node, not theirs."""
    ok = tmp_path / "ok"
    ok.mkdir()
    proc = _train(_slurm_job(ok, nodes=2), ok / "R")
    assert proc.returncode == 0, proc.stdout[-3000:]
    logs = "".join(p.read_text(errors="replace") for p in (ok / "R").rglob("*.log"))
    took = [float(s) for s in re.findall(r"health check passed on node\d in ([0-9.]+) s", logs)]
    # rank 0's line (the others log warnings only): its all-reduce waited for every rank's check
    assert len(took) == 1 and took[0] < 5, (took, logs[-3000:])
    print(f"\nhealth check on a 2-node job (4 gloo ranks): {took[0]:.2f} s on rank 0")
    bad_file = tmp_path / "bad-node"
    failed = tmp_path / "failed"
    failed.mkdir()
    proc = _train(_slurm_job(failed, nodes=2, extra="failure_budget:\n  node_failure: 0\n"), failed / "R",
                  env=_env(**{health.TEST_FAULT_FILE: str(bad_file)}))
    assert proc.returncode == 1, proc.stdout[-3000:]
    bad = bad_file.read_text()
    row = _status(failed / "R")
    assert row["state"] == "FAILED" and _classes(row) == ["node_failure"], row
    (attempt,) = row["attempts"]
    assert attempt["node"] == bad and f"health check failed on {bad}: the test hook" in attempt["evidence"], attempt
    assert attempt["step"] == 0 and attempt["end"] - attempt["start"] < 30, attempt
    logs = "".join(p.read_text(errors="replace") for p in (failed / "R").rglob("*.log"))
    assert f"health check failed on {bad} (rank" in logs, logs[-3000:]  # the healthy node's ranks say whose
