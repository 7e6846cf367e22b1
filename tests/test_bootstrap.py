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


# ------------------------------------------------------------------------ Slurm variables that a site leaves out
# What each case lacks is in its id; the expected values follow sbatch(1)/srun(1), OUTPUT ENVIRONMENT VARIABLES.

#: (rank, local_rank, world_size, node_rank, num_nodes, master_addr)
Place = tuple[int, int, int, int, int, str]

SLURM_STAND_INS = [
    pytest.param({"SLURM_PROCID": "3", "SLURM_LOCALID": "1", "SLURM_NODEID": "1", "SLURM_NTASKS_PER_NODE": "2",
                  "SLURM_JOB_NUM_NODES": "3", "SLURM_JOB_NODELIST": "n[1-3]"},
                 (3, 1, 6, 1, 3, "n1"), id="no NTASKS: --ntasks-per-node x nodes"),
    pytest.param({"SLURM_PROCID": "6", "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_JOB_NODELIST": "n[1-4]"},
                 (6, 0, 7, 3, 4, "n1"), id="only the compressed TASKS_PER_NODE: sum, nodes, block placement"),
    pytest.param({"SLURM_PROCID": "2", "SLURM_STEP_TASKS_PER_NODE": "3,1", "SLURM_TASKS_PER_NODE": "4(x2)",
                  "SLURM_STEP_NODELIST": "g[7-8]", "SLURM_JOB_NODELIST": "g[7-8]"},
                 (2, 2, 4, 0, 2, "g7"), id="step layout wins over the job's"),
    pytest.param({"SLURM_PROCID": "1", "SLURM_NPROCS": "2", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
                  "SLURM_NNODES": "1", "SLURM_NODELIST": "solo"},
                 (1, 1, 2, 0, 1, "solo"), id="only the backward-compatible names NPROCS NNODES NODELIST"),
    pytest.param({"SLURM_PROCID": "1", "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NUM_NODES": "2",
                  "SLURM_STEP_NODELIST": "b[1-2]", "SLURM_JOB_NODELIST": "a1,b[1-2]", "SLURMD_NODENAME": "b2"},
                 (1, 0, 2, 1, 2, "b1"), id="step on part of the job: step values, NODEID from SLURMD_NODENAME"),
    pytest.param({"SLURM_PROCID": "6", "SLURM_GTIDS": "4,5,6,7", "SLURM_NTASKS": "8", "SLURM_NODEID": "1",
                  "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_DISTRIBUTION": "arbitrary"},
                 (6, 2, 8, 1, 2, "n1"), id="no LOCALID: place in GTIDS"),
    pytest.param({"SLURM_PROCID": "5", "SLURM_TASKS_PER_NODE": "2(x3),1", "SLURM_DISTRIBUTION": "cyclic",
                  "SLURM_JOB_NODELIST": "n[1-4]"},
                 (5, 1, 7, 1, 4, "n1"), id="no LOCALID NODEID: cyclic placement"),
    pytest.param({"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NUM_NODES": "2",
                  "SLURM_JOB_NODELIST": "a,b", "SLURM_DISTRIBUTION": "plane=2"},
                 (5, 3, 8, 0, 2, "a"), id="no LOCALID NODEID: plane=2 placement"),
    pytest.param({"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "solo"},
                 (3, 3, 4, 0, 1, "solo"), id="no LOCALID on one node: LOCALID = PROCID"),
    pytest.param({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_LOCALID": "0", "SLURM_JOB_NODELIST": "n[1-2]"},
                 (1, 0, 2, 1, 2, "n1"), id="no JOB_NUM_NODES NODEID: nodelist length, one task per node"),
]


@pytest.mark.parametrize("environ, place", SLURM_STAND_INS)
def test_slurm_variable_missing_is_derived_from_its_stand_ins(environ: dict[str, str], place: Place) -> None:
    env = DistEnv.from_environ(environ)
    assert (env.rank, env.local_rank, env.world_size, env.node_rank, env.num_nodes, env.master_addr) == place


SLURM_NOTHING_STANDS_IN = [
    pytest.param({"SLURM_PROCID": "0"}, r"without \$SLURM_NTASKS, and nothing stands in .*SLURM_TASKS_PER_NODE",
                 id="no task count at all"),
    pytest.param({"SLURM_PROCID": "1", "SLURM_NTASKS": "4"}, r"without \$SLURM_STEP_NUM_NODES.*SLURM_JOB_NUM_NODES",
                 id="no node count at all"),
    pytest.param({"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "n[1-2]",
                  "SLURM_DISTRIBUTION": "arbitrary"}, r"without \$SLURM_LOCALID, .*SLURM_GTIDS",
                 id="no LOCALID under an arbitrary distribution"),
    pytest.param({"SLURM_PROCID": "1", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "0",
                  "SLURM_JOB_NUM_NODES": "2"}, r"on 2 nodes without \$MASTER_ADDR or \$SLURM_STEP_NODELIST or "
                 r"\$SLURM_JOB_NODELIST", id="no nodelist on two nodes"),
    pytest.param({"SLURM_PROCID": "1", "SLURM_TASKS_PER_NODE": "2(x)", "SLURM_JOB_NODELIST": "n1"},
                 r"\$SLURM_TASKS_PER_NODE='2\(x\)' is not Slurm's per-node count list", id="malformed count list"),
]


@pytest.mark.parametrize("environ, message", SLURM_NOTHING_STANDS_IN)
def test_slurm_variable_missing_with_nothing_to_stand_in_is_named(environ: dict[str, str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DistEnv.from_environ(environ)


def test_slurm_hosts_of_every_rank_follow_the_task_layout() -> None:
    environ = {"SLURM_PROCID": "0", "SLURM_TASKS_PER_NODE": "2(x2),1", "SLURM_JOB_NODELIST": "gpu-a[001-003]"}
    assert DistEnv.from_environ(environ).hosts == ("gpu-a001", "gpu-a001", "gpu-a002", "gpu-a002", "gpu-a003")
    cyclic = DistEnv.from_environ({**environ, "SLURM_DISTRIBUTION": "cyclic:block"})
    assert cyclic.hosts == ("gpu-a001", "gpu-a002", "gpu-a003", "gpu-a001", "gpu-a002")


def test_slurm_old_job_id_name_still_spreads_the_port() -> None:
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": "1", "SLURM_JOB_NODELIST": "n1", "SLURM_JOBID": "4242"}
    env = DistEnv.from_environ(environ)
    assert env.master_port == 13742 + 242 and "$SLURM_JOBID" in env.master_port_from


def test_master_addr_in_the_environment_wins_over_the_nodelist() -> None:
    environ = {"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "n[1-2]", "MASTER_ADDR": "10.1.2.3"}
    env = DistEnv.from_environ(environ)
    assert (env.master_addr, env.master_addr_from) == ("10.1.2.3", "$MASTER_ADDR")
