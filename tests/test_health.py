"""The health check before training (automodel_hydra.health): when it runs, what a node's devices must show, and
that its failure is a node_failure. Pure rules; the real runs are in tests/test_health_runs.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from automodel_hydra import config, failures, health


@pytest.mark.parametrize(("enabled", "slurm", "nodes", "want"), [
    (None, True, 2, True), (None, True, 1, False), (None, False, 4, False),
    (False, True, 2, False), (True, False, 1, True),
])
def test_on_by_default_for_multi_node_slurm_jobs_only(enabled: bool | None, slurm: bool, nodes: int,
                                                      want: bool) -> None:
    assert health.wanted(enabled, slurm, nodes) is want


def test_the_config_key_and_its_bad_value() -> None:
    cfg = config.TrainConfig()
    assert cfg.health_check.enabled is None and cfg.health_check.timeout_s == 30.0
    with pytest.raises(config.ConfigError, match="health_check.timeout_s"):
        config.HealthCheckConfig(timeout_s=0)


def test_devices_where_slurm_gave_gpus() -> None:
    env = {"SLURMD_NODENAME": "node2", "SLURM_GPUS_ON_NODE": "4"}
    assert health.device_problem(env, 4, False, 0) == "CUDA is not available (SLURM_GPUS_ON_NODE=4)"
    assert health.device_problem(env, 4, True, 2) == "CUDA sees 2 GPUs, 4 expected (SLURM_GPUS_ON_NODE=4)"
    assert health.device_problem(env, 4, True, 4) is None
    assert health.device_problem(env, 4, True, 1) is None  # each task sees only its own GPU
    assert health.device_problem({"SLURMD_NODENAME": "node2"}, 2, False, 0) is None  # no GPUs asked


def test_the_test_hook_fails_the_first_node_to_check_only(tmp_path: Path) -> None:
    hook = {health.TEST_FAULT_FILE: str(tmp_path / "bad")}
    assert health.device_problem({**hook, "SLURMD_NODENAME": "node1"}, 2, False, 0) is not None
    assert health.device_problem({**hook, "SLURMD_NODENAME": "node1"}, 2, False, 0) is not None
    assert health.device_problem({**hook, "SLURMD_NODENAME": "node2"}, 2, False, 0) is None


def test_a_failed_health_check_is_a_node_failure() -> None:
    error = health.HealthCheckError("health check failed on node2: CUDA is not available (SLURM_GPUS_ON_NODE=4)")
    found = failures.of_exception(error, progressed=False)  # before any step: still the node's, not user_error
    assert found == failures.Failure(failures.NODE_FAILURE, f"HealthCheckError: {error}")
    try:
        try:
            raise RuntimeError("Connection closed by peer")
        except RuntimeError as e:
            raise health.HealthCheckError("health check failed on node2: all-reduce: ...") from e
    except health.HealthCheckError as e:
        assert failures.of_exception(e).kind == failures.NODE_FAILURE
