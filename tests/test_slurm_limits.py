"""A request no node of its partition can ever hold is refused in one line naming the key (pure: sinfo's answer
as text; the refusal on the real cluster is in tests/test_slurm_cluster_faults.py)."""

from __future__ import annotations

import pytest

from automodel_hydra import config
from automodel_hydra.backends import slurm, slurm_limits
from automodel_hydra.backends.slurm_config import SlurmConfig
from automodel_hydra.backends.slurm_transport import Probe
from automodel_hydra.backends.slurm_tunnel import Endpoint
from automodel_hydra.plan import JobSpec
from tests.helpers import compose_cfg

#: What the test cluster's sinfo answers (2 nodes of 2 CPUs), plus a GPU partition of mixed nodes, one with limits.
SINFO = """\
debug*|2|(null)|2|infinite|1-infinite|9642
gpu|64|gpu:h100:8(S:0-1)|3|2-00:00:00|1-2|512000
gpu|32|gpu:h100:4|5|2-00:00:00|1-2|256000
this is a site wrapper's chatter
short|2|(null)|4|30:00|1-infinite|N/A
"""
TABLE = slurm_limits.parse_sinfo(SINFO)


def line(sc: SlurmConfig, **options: object) -> str | None:
    base = {"nodes": sc.nodes, "ntasks-per-node": sc.ntasks_per_node, "time": sc.time_minutes,
            **({"partition": sc.partition} if sc.partition else {})}
    return slurm_limits.refusal({**base, **options}, slurm_limits.option_keys(sc), TABLE)


def test_sinfo_is_read_per_partition_with_its_default_and_limits() -> None:
    assert set(TABLE) == {"debug", "gpu", "short"}
    assert TABLE["debug"].default and not TABLE["gpu"].default
    assert TABLE["gpu"].total == 8 and TABLE["gpu"].max_nodes == 2 and TABLE["gpu"].max_minutes == 2880
    assert TABLE["short"].max_minutes == 30 and TABLE["short"].nodes[0].mem_mb is None
    assert [n.gpus for n in TABLE["gpu"].nodes] == [8, 4]


def test_readme_command_names_ntasks_per_node_and_the_cpus_of_the_nodes() -> None:
    sc = SlurmConfig(nodes=2, partition="debug")  # README's command: 8 tasks per node by default
    assert line(sc) == ("slurm.ntasks_per_node=8 asks 8 CPUs per node; partition debug's nodes have at most 2 "
                        "(CPUTot)")
    assert line(SlurmConfig(nodes=2)) == line(sc)  # no partition: the default one (sinfo's "*")
    assert line(SlurmConfig(nodes=2, ntasks_per_node=2, partition="debug")) is None


def test_each_limit_names_its_own_key() -> None:
    assert line(SlurmConfig(ntasks_per_node=1, cpus_per_task=4), **{"cpus-per-task": 4}) == (
        "slurm.ntasks_per_node=1 with slurm.cpus_per_task=4 asks 4 CPUs per node; partition debug's nodes have at "
        "most 2 (CPUTot)")
    assert line(SlurmConfig(nodes=3, ntasks_per_node=2)) == "slurm.nodes=3 asks 3 nodes; partition debug has 2 nodes"
    assert line(SlurmConfig(ntasks_per_node=1, mem="20G"), mem="20G") == (
        "slurm.mem=20G asks 20480 MB per node; partition debug's nodes have at most 9642 MB (RealMemory)")
    gpu = SlurmConfig(ntasks_per_node=8, partition="gpu", gpus_per_node=16)
    assert line(gpu, **{"gpus-per-node": 16}) == (
        "slurm.gpus_per_node=16 asks 16 GPUs per node; partition gpu's nodes have at most 8 (Gres gpu)")
    assert line(SlurmConfig(nodes=3, ntasks_per_node=8, partition="gpu")) == (
        "slurm.nodes=3 asks 3 nodes; partition gpu lets a job have at most 2 (MaxNodes)")
    assert line(SlurmConfig(nodes=2, ntasks_per_node=8, partition="gpu", time="3-00:00:00")) == (
        "slurm.time=3-00:00:00 asks 4320 minutes; partition gpu allows at most 2880 (MaxTime)")
    assert line(SlurmConfig(ntasks_per_node=1, partition="short", time="01:00:00")) == (
        "slurm.time=01:00:00 asks 60 minutes; partition short allows at most 30 (MaxTime)")


def test_only_nodes_that_hold_the_whole_request_count() -> None:
    # 8 GPUs per node: 3 nodes have them, a job may have 2: fits; 48 CPUs and 8 GPUs: still the 3 big nodes
    assert line(SlurmConfig(nodes=2, ntasks_per_node=8, partition="gpu"), **{"gpus-per-node": 8}) is None
    mixed = slurm_limits.parse_sinfo("p*|64|gpu:8|1|infinite|1-infinite|1000\np*|32|gpu:4|5|infinite|1-infinite|1000")
    assert slurm_limits.refusal({"nodes": 2, "ntasks-per-node": 8, "gpus-per-node": 8}, {"nodes": "slurm.nodes=2"},
                                mixed) == ("slurm.nodes=2 asks 2 nodes; partition p has 1 nodes that hold 8 CPUs and "
                                           "8 GPUs each")


def test_sbatch_args_win_and_are_named_as_written() -> None:
    sc = SlurmConfig(ntasks_per_node=1, sbatch_args={"nodes": "3-4"})
    assert line(sc, nodes="3-4") == "slurm.sbatch_args.nodes=3-4 asks 3 nodes; partition debug has 2 nodes"


@pytest.mark.parametrize("text", ["", "sinfo: error: Unable to contact slurm controller\n", "x|y|z\n"])
def test_no_or_unreadable_answer_checks_nothing(text: str) -> None:
    table = slurm_limits.parse_sinfo(text)
    assert slurm_limits.refusal({"nodes": 99, "ntasks-per-node": 99}, {}, table) is None


def test_an_unknown_partition_or_one_of_several_that_fits_is_left_to_sbatch() -> None:
    assert line(SlurmConfig(ntasks_per_node=8, partition="nosuch")) is None
    assert line(SlurmConfig(ntasks_per_node=8, partition="debug,gpu")) is None  # gpu's nodes hold 8
    assert line(SlurmConfig(ntasks_per_node=8, partition="debug,short")) is not None


def test_plan_refuses_with_the_clusters_answer_and_plans_without_one(tmp_path) -> None:
    cfg = config.load(compose_cfg(["launcher=slurm", "slurm.nodes=2", "slurm.partition=debug"], tmp_path))
    job = JobSpec(tmp_path, "train")
    facts = slurm.Facts(partitions=SINFO)
    with pytest.raises(slurm_limits.Unfit, match=r"^slurm.ntasks_per_node=8 asks 8 CPUs per node") as e:
        slurm.Slurm().plan(cfg, job, facts)
    assert e.value.key == "slurm.ntasks_per_node"
    assert slurm.Slurm().plan(cfg, job, slurm.Facts()).request is not None  # no answer: not checked


def test_through_a_tunnel_the_login_nodes_answer_is_the_one_compared(tmp_path) -> None:
    tunnel = ["slurm.tunnel.host=login.example.org", "slurm.tunnel.job_dir=/scratch/me/jobs", "slurm.snapshot=none"]
    cfg = config.load(compose_cfg(["launcher=slurm", "slurm.nodes=2", *tunnel], tmp_path))
    endpoint = Endpoint.of(cfg.slurm.tunnel)
    login = slurm.Facts(remote={endpoint: Probe("/usr/bin/sbatch", 1001, "", "/home/me", SINFO)})
    with pytest.raises(slurm_limits.Unfit, match="partition debug's nodes have at most 2"):
        slurm.Slurm().plan(cfg, JobSpec(tmp_path, "train"), login)
    here_only = slurm.Facts(remote={endpoint: Probe("/usr/bin/sbatch", 1001, "")}, partitions=SINFO)
    assert slurm.Slurm().plan(cfg, JobSpec(tmp_path, "train"), here_only).request is not None  # not this machine's


@pytest.mark.parametrize(("reason", "keys"), [
    ("PartitionTimeLimit", ("slurm.time", "slurm.partition")),
    ("ReqNodeNotAvail, UnavailableNodes:node3", ("slurm.exclude", "slurm.constraint", "slurm.nodes",
                                                 "slurm.partition")),
    ("QOSMaxCpuPerUserLimit", ("slurm.ntasks_per_node", "slurm.cpus_per_task", "slurm.nodes", "slurm.qos")),
    ("Priority", ()),
])
def test_pending_reasons_name_the_keys(reason: str, keys: tuple[str, ...]) -> None:
    assert slurm_limits.pending_key(reason) == keys


def test_status_note_names_the_keys_of_a_pending_reason() -> None:
    assert slurm_limits.pending_note("PartitionTimeLimit") == (
        "PartitionTimeLimit (will not start as submitted: change slurm.time or slurm.partition and resubmit)")
    assert slurm_limits.pending_note("JobHeldAdmin") == (
        "JobHeldAdmin (will not start as submitted: ask the cluster's administrators and resubmit)")
    assert "slurm.gpus_per_node" in slurm_limits.pending_note("QOSMaxGRESPerUser")
    assert "will not start" not in slurm_limits.pending_note("AssocMaxJobsLimit")  # starts when others end
    assert slurm_limits.pending_note("Resources") == "Resources"
