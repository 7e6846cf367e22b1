"""The one distributed bootstrap: each launcher's variables -> RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/PORT."""

from __future__ import annotations

import pytest

from automodel_hydra.bootstrap import DistEnv, device_for, expand_hostlist, first_host, init_distributed


def test_single_process_defaults() -> None:
    env = DistEnv.from_environ({})
    assert (env.launcher, env.rank, env.local_rank, env.world_size, env.master_addr) == ("single", 0, 0, 1, "127.0.0.1")
    assert env.master_port == 13742


def test_torchrun_wins_inside_slurm() -> None:
    environ = {"TORCHELASTIC_RUN_ID": "x", "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "MASTER_ADDR": "h0",
               "MASTER_PORT": "29500", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    env = DistEnv.from_environ(environ)
    assert (env.launcher, env.rank, env.local_rank, env.world_size, env.master_addr, env.master_port) == (
        "torchrun", 3, 1, 4, "h0", 29500)


def test_slurm_row() -> None:
    environ = {"SLURM_PROCID": "5", "SLURM_LOCALID": "1", "SLURM_NTASKS": "8", "SLURM_NODEID": "2",
               "SLURM_JOB_NUM_NODES": "4", "SLURM_JOB_NODELIST": "gpu-b7,gpu-a[001-003,010]", "SLURM_JOB_ID": "4242",
               "AUTOMODEL_MASTER_PORT": "13742"}
    env = DistEnv.from_environ(environ)
    assert (env.rank, env.local_rank, env.world_size, env.node_rank, env.num_nodes) == (5, 1, 8, 2, 4)
    assert env.master_addr == "gpu-b7"
    assert env.master_port == 13742 + 242


def test_slurm_port_differs_between_jobs_and_agrees_within_one() -> None:
    def port(job_id: str, procid: str) -> int:
        return DistEnv.from_environ({"SLURM_PROCID": procid, "SLURM_LOCALID": procid, "SLURM_NTASKS": "2",
                                     "SLURM_JOB_NODELIST": "node1", "SLURM_JOB_ID": job_id}).master_port

    assert port("101", "0") == port("101", "1")
    assert port("101", "0") != port("102", "0")


@pytest.mark.parametrize("nodelist, first, count", [
    ("gpu-b7,gpu-a[001-003,010]", "gpu-b7", 5),
    ("node[08-10]", "node08", 3),
    ("a[1-2],b[3-4]", "a1", 4),
    ("single", "single", 1),
])
def test_hostlist_grammar(nodelist: str, first: str, count: int) -> None:
    assert first_host(nodelist) == first
    assert len(expand_hostlist(nodelist)) == count


def test_skypilot_row_one_process_per_node() -> None:
    environ = {"SKYPILOT_NODE_RANK": "1", "SKYPILOT_NUM_NODES": "2", "SKYPILOT_NODE_IPS": "10.0.0.12\n10.0.0.5\n"}
    env = DistEnv.from_environ(environ)
    assert (env.rank, env.world_size, env.master_addr) == (1, 2, "10.0.0.12")


def test_bad_rank_is_reported() -> None:
    with pytest.raises(ValueError, match="rank 4"):
        DistEnv.from_environ({"SLURM_PROCID": "4", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n1"})
    with pytest.raises(ValueError, match="SLURM_PROCID=.x. is not an integer"):
        DistEnv.from_environ({"SLURM_PROCID": "x", "SLURM_NTASKS": "4"})


@pytest.mark.parametrize("local_rank, gpus, device", [
    (0, 0, "cpu"), (3, 0, "cpu"), (5, 8, "cuda:5"), (7, 8, "cuda:7"), (5, 1, "cuda:0"),
])
def test_one_cuda_device_per_local_rank(local_rank: int, gpus: int, device: str) -> None:
    assert device_for(local_rank, gpus) == device


def test_more_ranks_than_gpus_is_an_error() -> None:
    with pytest.raises(ValueError, match="LOCAL_RANK=4"):
        device_for(4, 2)


def test_single_process_init_and_teardown(monkeypatch) -> None:
    import torch.distributed as dist

    for var in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    env = DistEnv.from_environ({})
    with init_distributed(env) as d:
        assert d.world_size == 1 and str(d.device) == "cpu"
    assert not dist.is_initialized()
