"""The one torch.distributed bootstrap that runs in every task, whichever launcher started it.

:meth:`DistEnv.from_environ` reads the task's place in the job from the variables its launcher sets. Each launcher
is a row of :data:`ENV_MAPS` (a map of variable names, as submitit's ``JobEnvironment._env``), not new code:

============ ======================= ================== ====================== ===================================
launcher     RANK                    LOCAL_RANK         WORLD_SIZE             MASTER_ADDR
============ ======================= ================== ====================== ===================================
torchrun     RANK                    LOCAL_RANK         WORLD_SIZE             MASTER_ADDR
slurm        SLURM_PROCID            SLURM_LOCALID      SLURM_NTASKS           first host of SLURM_JOB_NODELIST
skypilot     node_rank*nproc+local   LOCAL_RANK or 0    nodes*nproc            first line of SKYPILOT_NODE_IPS
single       0                       0                  1                      127.0.0.1
============ ======================= ================== ====================== ===================================

``MASTER_PORT`` is taken from the environment when set (torchrun, or the sbatch script's per-job port); otherwise
``AUTOMODEL_MASTER_PORT`` (default 13742) plus, under Slurm, ``SLURM_JOB_ID % 1000``, so that two jobs sharing a
node never rendezvous on the same port while every task of one job agrees on it.

:func:`init_distributed` exports RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, binds one CUDA device per
local rank (``cuda:LOCAL_RANK % device_count``), and initialises the process group (nccl with CUDA, gloo without).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import typing as tp

log = logging.getLogger(__name__)

DEFAULT_PORT = 13742
#: Port offset span under Slurm: MASTER_PORT = base + SLURM_JOB_ID % PORT_SPAN.
PORT_SPAN = 1000


def first_host(nodelist: str) -> str:
    """First host of a Slurm hostlist expression, under Slurm's full grammar (via python-hostlist).

    ``"gpu-b7,gpu-a[001-003,010]"`` -> ``"gpu-b7"``; ``"node[08-10]"`` -> ``"node08"``.

    Raises ValueError on an expression hostlist cannot parse."""
    return expand_hostlist(nodelist)[0]


def expand_hostlist(nodelist: str) -> list[str]:
    """All hosts of a Slurm hostlist expression, in order (``scontrol show hostnames`` semantics)."""
    import hostlist  # python-hostlist, maintained by NSC; same grammar as Slurm

    hosts = hostlist.expand_hostlist(nodelist)
    if not hosts:
        raise ValueError(f"empty Slurm nodelist {nodelist!r}")
    return hosts


@dataclasses.dataclass(frozen=True)
class EnvMap:
    """How one launcher tells a task its place. Each entry is an environment variable name, or None when the
    launcher does not set it (then the value is derived). @plugin-dev: add a launcher by adding a row."""

    detect: str  # the variable whose presence identifies this launcher
    rank: str | None
    local_rank: str | None
    world_size: str | None
    nodelist: str | None = None  # Slurm hostlist expression; MASTER_ADDR is its first host
    node_ips: str | None = None  # newline-separated IPs (SkyPilot); MASTER_ADDR is the first line
    node_rank: str | None = None
    num_nodes: str | None = None
    nproc_per_node: str | None = None
    job_id: str | None = None


#: Checked in order; torchrun first, because torchrun inside a Slurm or SkyPilot job owns the ranks.
ENV_MAPS: dict[str, EnvMap] = {
    "torchrun": EnvMap(detect="TORCHELASTIC_RUN_ID", rank="RANK", local_rank="LOCAL_RANK", world_size="WORLD_SIZE"),
    "slurm": EnvMap(
        detect="SLURM_PROCID", rank="SLURM_PROCID", local_rank="SLURM_LOCALID", world_size="SLURM_NTASKS",
        nodelist="SLURM_JOB_NODELIST", node_rank="SLURM_NODEID", num_nodes="SLURM_JOB_NUM_NODES", job_id="SLURM_JOB_ID",
    ),
    "skypilot": EnvMap(
        detect="SKYPILOT_NODE_RANK", rank=None, local_rank="LOCAL_RANK", world_size=None, node_ips="SKYPILOT_NODE_IPS",
        node_rank="SKYPILOT_NODE_RANK", num_nodes="SKYPILOT_NUM_NODES", nproc_per_node="AUTOMODEL_NPROC_PER_NODE",
    ),
}


@dataclasses.dataclass(frozen=True)
class DistEnv:
    """This task's place in the job. Ranks are 0-based; ``world_size`` = nodes x processes per node."""

    launcher: str
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    node_rank: int = 0
    num_nodes: int = 1

    @classmethod
    def from_environ(cls, environ: tp.Mapping[str, str] | None = None) -> DistEnv:
        """Read the environment of whichever launcher started this task (``single`` when none did).

        Raises
        ------
        ValueError
            A variable is missing or out of range; the message names it and its value.
        """
        env = os.environ if environ is None else environ
        for name, m in ENV_MAPS.items():
            if m.detect in env:
                return cls._from_map(name, m, env)
        port = int(env.get("MASTER_PORT") or env.get("AUTOMODEL_MASTER_PORT") or DEFAULT_PORT)
        return cls("single", 0, 0, 1, env.get("MASTER_ADDR", "127.0.0.1"), port)

    @classmethod
    def _from_map(cls, launcher: str, m: EnvMap, env: tp.Mapping[str, str]) -> DistEnv:
        def get(var: str | None, default: int | None = None) -> int:
            if var is None or var not in env:
                if default is None:
                    raise ValueError(f"{launcher} task without ${var}: cannot place this task in the job")
                return default
            try:
                return int(env[var])
            except ValueError:
                raise ValueError(f"${var}={env[var]!r} is not an integer") from None

        node_rank, num_nodes = get(m.node_rank, 0), get(m.num_nodes, 1)
        local_rank = get(m.local_rank, 0)
        if m.rank is None:  # one process per node (or LOCAL_RANK given): ranks follow node order
            nproc = get(m.nproc_per_node, 1)
            rank, world_size = node_rank * nproc + local_rank, num_nodes * nproc
        else:
            rank, world_size = get(m.rank), get(m.world_size)
        if m.nodelist and m.nodelist in env and "MASTER_ADDR" not in env:
            master_addr = first_host(env[m.nodelist])
        elif m.node_ips and m.node_ips in env:
            ips = [line.strip() for line in env[m.node_ips].splitlines() if line.strip()]
            if not ips:
                raise ValueError(f"${m.node_ips} is empty: cannot find the head node")
            master_addr = ips[0]
        else:
            master_addr = env.get("MASTER_ADDR", "127.0.0.1")
        if "MASTER_PORT" in env:
            port = get("MASTER_PORT")
        else:
            port = int(env.get("AUTOMODEL_MASTER_PORT", DEFAULT_PORT))
            if m.job_id and m.job_id in env:
                port += get(m.job_id) % PORT_SPAN
        if not 0 <= rank < world_size:
            raise ValueError(f"{launcher}: rank {rank} is not in [0, world_size={world_size})")
        return cls(launcher, rank, local_rank, world_size, master_addr, port, node_rank, num_nodes)

    def export(self, environ: tp.MutableMapping[str, str] | None = None) -> None:
        """Set the torch.distributed ``env://`` variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
        env = os.environ if environ is None else environ
        env.update(RANK=str(self.rank), LOCAL_RANK=str(self.local_rank), WORLD_SIZE=str(self.world_size),
                   MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))

    def __repr__(self) -> str:  # rank(total) pairs for log lines, as submitit does
        return (f"DistEnv[{self.launcher}] rank {self.rank}({self.world_size}) local {self.local_rank} "
                f"node {self.node_rank}({self.num_nodes}) master {self.master_addr}:{self.master_port}")


def device_for(local_rank: int, cuda_device_count: int) -> str:
    """One CUDA device per local rank: ``cuda:LOCAL_RANK`` when the task sees every GPU of its node, and
    ``cuda:0`` when it sees only its own (CUDA_VISIBLE_DEVICES narrowed by Slurm or the user); ``cpu`` without
    CUDA. Raises ValueError when several GPUs are visible but fewer than local ranks need."""
    if cuda_device_count == 0:
        return "cpu"
    if cuda_device_count == 1:
        return "cuda:0"
    if local_rank >= cuda_device_count:
        raise ValueError(f"LOCAL_RANK={local_rank} but only {cuda_device_count} GPUs are visible: "
                         "use at most one task per GPU (slurm.ntasks_per_node / interactive.nproc_per_node)")
    return f"cuda:{local_rank}"


class Distributed:
    """The initialised process group of this task: ``env`` plus ``device``. Use as a context manager."""

    def __init__(self, env: DistEnv, device: tp.Any) -> None:
        self.env, self.device = env, device

    # the recipe reads these directly
    @property
    def rank(self) -> int:
        return self.env.rank

    @property
    def local_rank(self) -> int:
        return self.env.local_rank

    @property
    def world_size(self) -> int:
        return self.env.world_size

    def __enter__(self) -> Distributed:
        return self

    def __exit__(self, *exc: object) -> None:
        destroy_distributed()


def init_distributed(env: DistEnv | None = None, timeout_s: float = 600.0) -> Distributed:
    """Initialise torch.distributed for this task (a no-op group of one when ``world_size == 1``).

    Returns a :class:`Distributed` whose ``device`` is this rank's ``torch.device``. Warns and reuses the group
    when one is already initialised (torchtitan's ``init_distributed`` does the same)."""
    import torch
    import torch.distributed as dist

    env = env or DistEnv.from_environ()
    env.export()
    device = torch.device(device_for(env.local_rank, torch.cuda.device_count() if torch.cuda.is_available() else 0))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if env.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        log.info("init_process_group(%s) %r", backend, env)
        store = _attempt_store(env, timeout_s)  # issue 7: None = env:// as before
        rendezvous: dict[str, tp.Any] = {"store": store} if store is not None else {"init_method": "env://"}
        dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None, **rendezvous)
    elif dist.is_initialized():
        log.warning("torch.distributed is already initialised; reusing the process group")
    return Distributed(env, device)


def _attempt_store(env: DistEnv, timeout_s: float) -> tp.Any:
    """issue 7: the rendezvous store of this torchrun attempt, or None outside torchrun's agent store.

    torchrun with ``--master_addr/--master_port`` (static rendezvous: our interactive and SkyPilot launchers) hands
    its workers the agent's TCPStore (``TORCHELASTIC_USE_AGENT_STORE=True``) and keeps that store across restarts
    (``--max_restarts``), while ``env://`` adds no per-attempt prefix. A restarted rank could then read the previous
    attempt's keys (a dead rank's gloo address: "connectFullMesh failed ... Connection refused") and the restart
    failed whenever rank 0 came up a little later than the others (cf. pytorch/pytorch#135712). Each attempt's keys
    go under their own prefix; every worker of one agent agrees on ``TORCHELASTIC_RESTART_COUNT``."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    from torch.distributed import PrefixStore, TCPStore

    agent = TCPStore(env.master_addr, env.master_port, env.world_size, is_master=False,
                     timeout=datetime.timedelta(seconds=timeout_s))
    return PrefixStore(f"automodel/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", agent)


def destroy_distributed() -> None:
    """Tear down the process group if this task created one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
