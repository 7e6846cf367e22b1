"""Rendezvous fails fast and says why: checks before waiting, and the ranks that never arrived named on timeout.

Fast tests use a real ``torch.distributed.TCPStore`` in this process; the ``slow`` ones start real gloo ranks (and
torchrun) as subprocesses and time them."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import typing as tp
from datetime import timedelta
from pathlib import Path

import pytest

from automodel_hydra.bootstrap import (
    DistEnv,
    RendezvousError,
    check_rendezvous,
    describe_ranks,
    init_distributed,
    rendezvous,
    wait_for_ranks,
)
from tests.helpers import ROOT, free_port


def two_ranks(rank: int, port: int, addr: str = "127.0.0.1") -> DistEnv:
    return DistEnv("slurm", rank, rank, 2, addr, port, hosts=("node1", "node2"))


# ----------------------------------------------------------------------------------------- checks before waiting


@pytest.mark.parametrize("port", [0, -1, 65536, 70000])
def test_port_outside_1_to_65535_is_refused_naming_the_variable(port: int) -> None:
    env = DistEnv.from_environ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost",
                                "MASTER_PORT": str(port)})
    with pytest.raises(RendezvousError, match=rf"MASTER_PORT={port} \(from \$MASTER_PORT\) is not a TCP port: "
                                              r"valid ports are 1\.\.65535"):
        check_rendezvous(env)


def test_port_from_the_slurm_job_id_names_where_it_came_from() -> None:
    env = DistEnv.from_environ({"SLURM_PROCID": "0", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "localhost",
                                "SLURM_JOB_ID": "999", "AUTOMODEL_MASTER_PORT": "65000"})
    with pytest.raises(RendezvousError, match=r"MASTER_PORT=65999 \(from \$AUTOMODEL_MASTER_PORT \+ \$SLURM_JOB_ID"):
        check_rendezvous(env)


def test_unresolvable_master_addr_is_refused_at_once_naming_it() -> None:
    env = DistEnv.from_environ({"SLURM_PROCID": "1", "SLURM_NTASKS": "2", "SLURM_JOB_NODELIST": "no-such-host.invalid",
                                "MASTER_PORT": "29500"})
    t0 = time.monotonic()
    with pytest.raises(RendezvousError, match=r"MASTER_ADDR='no-such-host.invalid' \(from first host of "
                                              r"\$SLURM_JOB_NODELIST\) does not resolve on "):
        check_rendezvous(env)
    assert time.monotonic() - t0 < 5


def test_resolvable_master_addr_passes() -> None:
    assert "127.0.0.1" in check_rendezvous(two_ranks(1, 29500, "localhost"))


def test_port_held_by_another_process_is_named_by_rank_0() -> None:
    import torch.distributed  # noqa: F401 - imported before the clock starts

    with socket.socket() as holder:
        holder.bind(("", 0))
        holder.listen()
        port = holder.getsockname()[1]
        t0 = time.monotonic()
        with pytest.raises(RendezvousError, match=rf"rank 0 cannot serve the rendezvous store on .* at "
                                                  rf"127\.0\.0\.1:{port} .*MASTER_PORT"):
            rendezvous(two_ranks(0, port), timeout_s=30)
        assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("name, value", [("timeout_s", 0), ("timeout_minutes", -1), ("rendezvous_timeout_s", 0)])
def test_timeouts_must_be_positive(name: str, value: float) -> None:
    with pytest.raises(ValueError, match=rf"init_distributed\({name}={value}\): must be a positive number"):
        init_distributed(two_ranks(0, 29500), **{name: value})


# ----------------------------------------------------------------------------------------- who never arrived


def store_with(arrived: list[int]) -> tp.Any:
    """A real TCPStore served by this process, where ``arrived`` ranks have already registered."""
    from torch.distributed import TCPStore

    store = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=10), wait_for_workers=False)
    for rank in arrived:
        store.set(f"arrived/{rank}", f"host{rank}")
    return store


def test_missing_ranks_are_named_with_their_hosts() -> None:
    store = store_with([2])
    env = DistEnv("slurm", 0, 0, 5, "127.0.0.1", store.port, hosts=("a", "a", "b", "b", "c"))
    t0 = time.monotonic()
    with pytest.raises(RendezvousError, match=r"timed out after 0.3 s on rank 0 .*: 3 of 5 ranks never arrived: "
                                              r"ranks 1 \(a\), 3 \(b\), 4 \(c\);"):
        wait_for_ranks(store, env, timeout_s=0.3)
    assert 0.3 <= time.monotonic() - t0 < 1.5
    assert store.get("arrived/0") == socket.gethostname().encode()  # this rank registered itself


def test_every_rank_arrived_returns_at_once() -> None:
    store = store_with([0, 2, 3])
    t0 = time.monotonic()
    wait_for_ranks(store, DistEnv("slurm", 1, 1, 4, "127.0.0.1", store.port), timeout_s=30)
    assert time.monotonic() - t0 < 1


def test_ranks_are_described_as_runs_by_host() -> None:
    hosts = ["h"] * 4 + ["a"] * 4 + ["b"] * 4
    assert describe_ranks([4, 5, 6, 7, 9], hosts) == "ranks 4-7 (a), 9 (b)"
    assert describe_ranks([3, 4], hosts) == "ranks 3 (h), 4 (a)"  # a run never spans two hosts
    assert describe_ranks([1]) == "rank 1"
    assert describe_ranks(list(range(0, 100, 2)), limit=3) == "ranks 0, 2, 4, ... and 47 more"


# ----------------------------------------------------------------------------------------- real ranks, timed

#: One rank: its place from Slurm's variables, init_distributed with the timeouts in PROBE_KW, an all_reduce.
PROBE = """
import json, os, sys, time
import torch, torch.distributed as dist
from automodel_hydra.bootstrap import RendezvousError, init_distributed
t0 = time.monotonic()
try:
    with init_distributed(**json.loads(os.environ["PROBE_KW"])) as d:
        x = torch.ones(1)
        dist.all_reduce(x)
        print(f"rank {d.rank} sum {x.item():.0f}", flush=True)
except RendezvousError as e:
    print(f"RendezvousError after {time.monotonic() - t0:.1f} s: {e}", flush=True)
    sys.exit(3)
"""


def start_rank(tmp_path: Path, rank: int, port: int, nodelist: str = "localhost", **kw: float) -> subprocess.Popen:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("SLURM_", "TORCHELASTIC_", "MASTER_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    env.update(PYTHONPATH=str(ROOT), SLURM_PROCID=str(rank), SLURM_NTASKS="2", SLURM_JOB_NODELIST=nodelist,
               MASTER_PORT=str(port), PROBE_KW=json.dumps(kw))
    return subprocess.Popen([sys.executable, str(probe)], env=env, cwd=tmp_path, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, timeout: float = 120) -> str:
    out, _ = proc.communicate(timeout=timeout)
    return out


@pytest.mark.slow
def test_two_gloo_ranks_meet_and_reduce(tmp_path: Path) -> None:
    port = free_port()
    procs = [start_rank(tmp_path, rank, port, rendezvous_timeout_s=60) for rank in (0, 1)]
    outs = [finish(p) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert "rank 0 sum 2" in outs[0] and "rank 1 sum 2" in outs[1]


@pytest.mark.slow
def test_rank_whose_peer_never_starts_names_it_and_gives_up_in_time(tmp_path: Path) -> None:
    t0 = time.monotonic()
    proc = start_rank(tmp_path, 0, free_port(), rendezvous_timeout_s=5)
    out = finish(proc)
    took = time.monotonic() - t0
    assert proc.returncode == 3, out[-3000:]
    assert "timed out after 5 s on rank 0" in out and "1 of 2 ranks never arrived: rank 1 (localhost)" in out
    assert took < 30, took


@pytest.mark.slow
def test_rank_without_rank_0_names_the_store_it_never_found(tmp_path: Path) -> None:
    t0 = time.monotonic()
    port = free_port()
    proc = start_rank(tmp_path, 1, port, timeout_minutes=0.1)  # 6 s, AutoModel's unit
    out = finish(proc)
    took = time.monotonic() - t0
    assert proc.returncode == 3, out[-3000:]
    assert f"rank 1 on {socket.gethostname()} found no rendezvous store at localhost:{port}" in out
    assert "within 6 s: rank 0 (on localhost) serves it" in out
    assert took < 30, took


@pytest.mark.slow
def test_unresolvable_master_addr_fails_within_seconds(tmp_path: Path) -> None:
    proc = start_rank(tmp_path, 1, free_port(), nodelist="no-such-host.invalid")  # default 600 s timeouts
    out = finish(proc, timeout=60)
    assert proc.returncode == 3, out[-3000:]
    assert "MASTER_ADDR='no-such-host.invalid' (from first host of $SLURM_JOB_NODELIST) does not resolve" in out
    took = float(out.split("RendezvousError after ")[1].split(" s")[0])
    assert took < 10, took


#: Under torchrun (agent store): rank 1 never calls init_distributed; rank 0 must name it.
TORCHRUN_PROBE = """
import os, time
from automodel_hydra.bootstrap import init_distributed
print("agent store:", os.environ.get("TORCHELASTIC_USE_AGENT_STORE"), flush=True)
if os.environ["RANK"] == "1":
    time.sleep(60)
else:
    init_distributed(rendezvous_timeout_s=5)
"""


@pytest.mark.slow
def test_torchrun_agent_store_carries_the_arrivals(tmp_path: Path) -> None:
    (tmp_path / "probe.py").write_text(TORCHRUN_PROBE)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nnodes=1", "--nproc_per_node=2",
                           f"--master_port={free_port()}", str(tmp_path / "probe.py")], check=False, env=env,
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "agent store: True" in out  # the arrivals went through torchrun's own store, under the attempt prefix
    assert "1 of 2 ranks never arrived: rank 1" in out, out[-3000:]
    assert time.monotonic() - t0 < 40
