"""The one torch.distributed bootstrap that runs in every task, whichever launcher started it.

:meth:`DistEnv.from_environ` reads the task's place in the job from the variables its launcher sets. Each launcher
is a row of :data:`ENV_MAPS` (a map of variable names, as submitit's ``JobEnvironment._env``), not new code; a tuple
of names means "the first of these that is set":

============ ======================= ================== ====================== ===================================
launcher     RANK                    LOCAL_RANK         WORLD_SIZE             MASTER_ADDR
============ ======================= ================== ====================== ===================================
torchrun     RANK                    LOCAL_RANK         WORLD_SIZE             MASTER_ADDR
slurm        SLURM_PROCID            SLURM_LOCALID      SLURM_NTASKS           first host of SLURM_STEP_NODELIST
skypilot     node_rank*nproc+local   LOCAL_RANK or 0    nodes*nproc            first line of SKYPILOT_NODE_IPS
single       0                       0                  1                      127.0.0.1
============ ======================= ================== ====================== ===================================

and ``submitit_local`` (submitit's local executor, ``hydra/launcher=submitit_local``: one node, 127.0.0.1):
``SUBMITIT_LOCAL_GLOBALID``, ``SUBMITIT_LOCAL_LOCALID``, ``SUBMITIT_LOCAL_NTASKS``.

Slurm does not give every task every variable: which ones a task gets depends on the options of the job
(``SLURM_NTASKS`` only with ``--ntasks``, ``SLURM_NTASKS_PER_NODE`` only with ``--ntasks-per-node``), the Slurm
version and the container runtime. :func:`complete_slurm_environ` fills each missing one from the variables that
stand in for it, by the relations sbatch(1) and srun(1) document under "OUTPUT ENVIRONMENT VARIABLES"; the error
names the variable only when nothing can stand in for it.

``MASTER_PORT`` is taken from the environment when set (torchrun, or the sbatch script's per-job port); otherwise
``AUTOMODEL_MASTER_PORT`` (default 13742) plus, under Slurm, ``SLURM_JOB_ID % 1000``, so that two jobs sharing a
node never rendezvous on the same port while every task of one job agrees on it.

:func:`init_distributed` exports RANK/LOCAL_RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT, binds one CUDA device per
local rank (``cuda:LOCAL_RANK % device_count``), meets the other ranks (:func:`rendezvous`: fails within seconds on
an address or port that cannot work, and names the ranks that never arrived when it gives up) and initialises the
process group (nccl with CUDA, gloo without).
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
import re
import socket
import time
import typing as tp

log = logging.getLogger(__name__)

DEFAULT_PORT = 13742
#: Port offset span under Slurm: MASTER_PORT = base + SLURM_JOB_ID % PORT_SPAN.
PORT_SPAN = 1000
#: Default timeout of the process group (each collective) and of the rendezvous, in seconds: torch's own default for
#: NCCL (10 minutes; 30 for gloo), so a rank waits as long for late peers as a collective waits for a slow one.
#: NeMo AutoModel's ``dist_env.timeout_minutes`` is the same setting in minutes (``timeout_minutes=`` below).
DEFAULT_TIMEOUT_S = 600.0
#: While a rank waits for its peers it logs the ranks still missing this often, in seconds.
PROGRESS_S = 60.0
#: The key each rank sets in the rendezvous store once it is there (value: its host name).
ARRIVED_KEY = "arrived/{rank}"


class RendezvousError(RuntimeError):
    """The ranks of a job could not meet. The message is one line naming the address, port or ranks at fault."""


def first_host(nodelist: str) -> str:
    """First host of a Slurm hostlist expression, under Slurm's full grammar (via python-hostlist).

    ``"gpu-b7,gpu-a[001-003,010]"`` -> ``"gpu-b7"``; ``"node[08-10]"`` -> ``"node08"``.

    Raises ValueError on an expression hostlist cannot parse."""
    return expand_hostlist(nodelist)[0]


def expand_hostlist(nodelist: str) -> list[str]:
    """All hosts of a Slurm hostlist expression, in order (``scontrol show hostnames`` semantics)."""
    import hostlist  # python-hostlist, maintained by NSC; same grammar as Slurm

    hosts: list[str] = hostlist.expand_hostlist(nodelist)
    if not hosts:
        raise ValueError(f"empty Slurm nodelist {nodelist!r}")
    return hosts


_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?")


def tasks_per_node(value: str, var: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Expand Slurm's per-node count list: ``"2(x3),1"`` -> ``[2, 2, 2, 1]``, one count per node in nodelist order.

    The form is sbatch(1)/srun(1)'s for ``SLURM_TASKS_PER_NODE`` (also ``SLURM_STEP_TASKS_PER_NODE``): counts
    separated by commas, a count followed by ``(x#)`` repeated on # consecutive nodes. Raises ValueError naming
    ``var`` and the value when it is not of that form."""
    counts: list[int] = []
    for item in value.split(","):
        m = _COUNT.fullmatch(item.strip())
        if m is None:
            raise ValueError(f"${var}={value!r} is not Slurm's per-node count list (such as '2(x3),1')")
        counts += [int(m[1])] * int(m[2] or 1)
    return counts


def task_nodes(counts: tp.Sequence[int], distribution: str | None = None,
               plane_size: int | None = None) -> list[int] | None:
    """The node index of each task, by rank, when node ``i`` runs ``counts[i]`` tasks of the step.

    ``distribution`` is srun's ``-m/--distribution`` (``SLURM_DISTRIBUTION``); only its first method, the
    distribution of tasks to nodes, matters (srun(1)): ``block``, consecutive tasks share a node; ``cyclic``,
    consecutive tasks go to consecutive nodes, round-robin among the nodes with tasks left; ``plane=<size>``, blocks
    of ``size`` tasks round-robin (size from ``=<size>`` or ``plane_size``, i.e. ``SLURM_DIST_PLANESIZE``). Unset or
    ``*``: Slurm's default, block when tasks outnumber nodes, else cyclic. Returns None when the placement cannot be
    derived (``arbitrary``, which follows SLURM_HOSTFILE, or a method this does not know).

    ``task_nodes([2, 2, 2, 1])`` -> ``[0, 0, 1, 1, 2, 2, 3]``; with ``"cyclic"`` -> ``[0, 1, 2, 3, 0, 1, 2]``."""
    method = (distribution or "*").split(":")[0].split(",")[0].strip().lower()
    if method in ("", "*"):
        method = "block" if sum(counts) > len(counts) else "cyclic"
    if method == "block":
        size = max(counts, default=0)
    elif method == "cyclic":
        size = 1
    elif method.split("=")[0] == "plane":
        given = method.partition("=")[2]
        size = int(given) if given.isdigit() else plane_size or 0
        if size < 1:
            return None
    else:
        return None
    left, nodes = list(counts), []
    while any(n > 0 for n in left):
        for i, n in enumerate(left):
            take = min(size, n)
            nodes += [i] * take
            left[i] -= take
    return nodes


Names: tp.TypeAlias = str | tuple[str, ...] | None  # one variable, its aliases in order (first set wins), or none


def _names(names: Names) -> tuple[str, ...]:
    return (names,) if isinstance(names, str) else names or ()


def _pick(env: tp.Mapping[str, str], names: Names) -> str | None:
    """The first of ``names`` set in ``env``, or None."""
    return next((n for n in _names(names) if n in env), None)


def _int(env: tp.Mapping[str, str], names: Names) -> int | None:
    """The integer value of the first of ``names`` that is set; None when none is. ValueError when not an integer."""
    var = _pick(env, names)
    if var is None:
        return None
    try:
        return int(env[var])
    except ValueError:
        raise ValueError(f"${var}={env[var]!r} is not an integer") from None


@dataclasses.dataclass(frozen=True)
class EnvMap:
    """How one launcher tells a task its place. Each entry is an environment variable name, a tuple of names (the
    first one set is used; aliases, most specific first), or None when the launcher does not set it (then the value
    is derived). @plugin-dev: add a launcher by adding a row; ``complete`` and ``rank_hosts`` are the only code."""

    detect: str  # the variable whose presence identifies this launcher
    rank: Names
    local_rank: Names
    world_size: Names
    nodelist: Names = None  # Slurm hostlist expression; MASTER_ADDR is its first host
    node_ips: Names = None  # newline-separated IPs (SkyPilot); MASTER_ADDR is the first line
    node_rank: Names = None
    num_nodes: Names = None
    nproc_per_node: Names = None
    job_id: Names = None
    #: Fills the row's variables a task lacks from those that stand in for them (raises ValueError naming the
    #: variable when nothing does); returns the completed environment.
    complete: tp.Callable[[EnvMap, tp.Mapping[str, str]], tp.Mapping[str, str]] | None = None
    #: The host of every rank, by rank, from the completed environment; () where the launcher does not say.
    rank_hosts: tp.Callable[[EnvMap, tp.Mapping[str, str]], tuple[str, ...]] | None = None


#: What can stand in for each Slurm variable, in the words of the error that names it.
_SLURM_STAND_INS = {
    "SLURM_NTASKS": "SLURM_NPROCS, SLURM_STEP_NUM_TASKS, the sum of SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE, "
                    "SLURM_NTASKS_PER_NODE x the number of nodes",
    "SLURM_STEP_NUM_NODES": "SLURM_JOB_NUM_NODES, SLURM_NNODES, the length of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST, "
                            "SLURM_NODELIST, SLURM_STEP_TASKS_PER_NODE or SLURM_TASKS_PER_NODE, "
                            "SLURM_NTASKS / SLURM_NTASKS_PER_NODE",
    "SLURM_NODEID": "SLURMD_NODENAME's place in SLURM_STEP_NODELIST, or the task layout (SLURM_STEP_TASKS_PER_NODE, "
                    "SLURM_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE with a block, cyclic or plane SLURM_DISTRIBUTION)",
    "SLURM_LOCALID": "this rank's place in SLURM_GTIDS, or the task layout (SLURM_STEP_TASKS_PER_NODE, "
                     "SLURM_TASKS_PER_NODE or SLURM_NTASKS_PER_NODE with a block, cyclic or plane SLURM_DISTRIBUTION)",
}


def _missing(launcher: str, var: str, stand_ins: str) -> ValueError:
    return ValueError(f"{launcher} task without ${var}, and nothing stands in for it ({stand_ins}): "
                      "cannot place this task in the job")


def complete_slurm_environ(m: EnvMap, env: tp.Mapping[str, str]) -> dict[str, str]:
    """``env`` with the Slurm row's variables filled in where the task lacks them, from their documented stand-ins.

    The relations are those of sbatch(1) and srun(1), "OUTPUT ENVIRONMENT VARIABLES" (Slurm 22.05): the step's
    values win over the job's (a task belongs to its step; an ``srun`` inside ``sbatch`` spans the whole job unless
    told otherwise), and

    * ``SLURM_NTASKS`` (alias ``SLURM_NPROCS``; ``SLURM_STEP_NUM_TASKS``) = the sum of ``SLURM_STEP_TASKS_PER_NODE``
      or ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"`` = 2+2+2+1), or ``SLURM_NTASKS_PER_NODE`` x the number of nodes;
    * the number of nodes (``SLURM_STEP_NUM_NODES``, ``SLURM_JOB_NUM_NODES``, alias ``SLURM_NNODES``) = the
      length of the nodelist (``SLURM_STEP_NODELIST``, ``SLURM_JOB_NODELIST``, alias ``SLURM_NODELIST``) or of the
      per-node task counts, or ``SLURM_NTASKS / SLURM_NTASKS_PER_NODE``;
    * ``SLURM_NODEID`` = the place of ``SLURMD_NODENAME`` in the step's nodelist, or the node that the task layout
      (per-node counts and srun's ``--distribution``, see :func:`task_nodes`) gives ``SLURM_PROCID``;
    * ``SLURM_LOCALID`` = the place of ``SLURM_PROCID`` in ``SLURM_GTIDS`` (the global task ids of this node), or
      its place among the ranks the task layout puts on its node;
    * ``SLURM_JOB_ID`` = ``SLURM_JOBID`` (the older name).

    ``SLURM_PROCID`` must be set: it is how a task of a step is recognised (srun always sets it). The per-node task
    counts found to agree with the task and node counts are written to ``SLURM_STEP_TASKS_PER_NODE``.

    Raises
    ------
    ValueError
        A variable is not an integer or not of Slurm's form, the rank is outside ``[0, SLURM_NTASKS)``, or a variable
        is missing and nothing stands in for it; the message names the variable (and its stand-ins).
    """
    out = dict(env)
    rank = _int(env, m.rank)
    assert rank is not None  # the detect variable

    def hosts(names: Names) -> list[str] | None:
        var = _pick(env, names)
        return expand_hostlist(env[var]) if var else None

    def counts(var: str) -> list[int] | None:
        return tasks_per_node(env[var], var) if var in env else None

    step_hosts, job_hosts = hosts("SLURM_STEP_NODELIST"), hosts(("SLURM_JOB_NODELIST", "SLURM_NODELIST"))
    step_counts, job_counts = counts("SLURM_STEP_TASKS_PER_NODE"), counts("SLURM_TASKS_PER_NODE")
    per_node = _int(env, "SLURM_NTASKS_PER_NODE")
    lengths = (len(x) if x else None for x in (step_hosts, step_counts, job_hosts, job_counts))
    nodes = next((n for n in (_int(env, m.num_nodes), *lengths) if n), None)
    world = _int(env, m.world_size)
    if world is None:
        sums = [sum(c) for c in (step_counts, job_counts) if c]
        world = sums[0] if sums else per_node * nodes if per_node and nodes else None
    if world is None:
        raise _missing("slurm", "SLURM_NTASKS", _SLURM_STAND_INS["SLURM_NTASKS"])
    if not 0 <= rank < world:
        raise ValueError(f"slurm: rank {rank} is not in [0, world_size={world})")
    if nodes is None:
        nodes = world // per_node if per_node and world % per_node == 0 else 1 if world == 1 else None
    if nodes is None:
        raise _missing("slurm", "SLURM_STEP_NUM_NODES", _SLURM_STAND_INS["SLURM_STEP_NUM_NODES"])
    out.update(SLURM_NTASKS=str(world), SLURM_STEP_NUM_NODES=str(nodes))

    layouts = (step_counts, job_counts, [per_node] * nodes if per_node else None, [1] * nodes, [world])
    layout = next((c for c in layouts if c and len(c) == nodes and sum(c) == world), None)
    order = None
    if layout is not None:
        out["SLURM_STEP_TASKS_PER_NODE"] = ",".join(map(str, layout))
        order = task_nodes(layout, env.get("SLURM_DISTRIBUTION"), _int(env, "SLURM_DIST_PLANESIZE"))
    node_hosts = step_hosts or job_hosts

    node = _int(env, m.node_rank)
    if node is None:
        name = env.get("SLURMD_NODENAME")
        if name and node_hosts and len(node_hosts) == nodes and name in node_hosts:
            node = node_hosts.index(name)
        elif order is not None:
            node = order[rank]
        else:
            raise _missing("slurm", "SLURM_NODEID", _SLURM_STAND_INS["SLURM_NODEID"])
        out["SLURM_NODEID"] = str(node)

    if _pick(env, m.local_rank) is None:
        gtids = env.get("SLURM_GTIDS", "")
        try:
            on_node = [int(t) for t in gtids.split(",")] if gtids.strip() else []
        except ValueError:
            raise ValueError(f"$SLURM_GTIDS={gtids!r} is not a comma-separated list of task ids") from None
        if rank in on_node:
            local = on_node.index(rank)
        elif order is not None and order[rank] == node:
            local = order[:rank].count(node)
        else:
            raise _missing("slurm", "SLURM_LOCALID", _SLURM_STAND_INS["SLURM_LOCALID"])
        out["SLURM_LOCALID"] = str(local)
    return out


def slurm_rank_hosts(m: EnvMap, env: tp.Mapping[str, str]) -> tuple[str, ...]:
    """The host of every rank of a completed Slurm environment (:func:`complete_slurm_environ`): the step's
    nodelist placed by its per-node task counts and ``SLURM_DISTRIBUTION``; () where those do not say."""
    var = _pick(env, m.nodelist)
    if var is None or "SLURM_STEP_TASKS_PER_NODE" not in env:
        return ()
    hosts = expand_hostlist(env[var])
    layout = tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"], "SLURM_STEP_TASKS_PER_NODE")
    order = task_nodes(layout, env.get("SLURM_DISTRIBUTION"), _int(env, "SLURM_DIST_PLANESIZE"))
    if order is None or len(hosts) != len(layout):
        return ()
    return tuple(hosts[n] for n in order)


#: Checked in order; torchrun first, because torchrun inside a Slurm or SkyPilot job owns the ranks.
ENV_MAPS: dict[str, EnvMap] = {
    "torchrun": EnvMap(detect="TORCHELASTIC_RUN_ID", rank="RANK", local_rank="LOCAL_RANK", world_size="WORLD_SIZE"),
    "slurm": EnvMap(
        detect="SLURM_PROCID", rank="SLURM_PROCID", local_rank="SLURM_LOCALID",
        world_size=("SLURM_NTASKS", "SLURM_NPROCS", "SLURM_STEP_NUM_TASKS"),
        nodelist=("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST"), node_rank="SLURM_NODEID",
        num_nodes=("SLURM_STEP_NUM_NODES", "SLURM_JOB_NUM_NODES", "SLURM_NNODES"),
        job_id=("SLURM_JOB_ID", "SLURM_JOBID"), complete=complete_slurm_environ, rank_hosts=slurm_rank_hosts,
    ),
    "skypilot": EnvMap(
        detect="SKYPILOT_NODE_RANK", rank=None, local_rank="LOCAL_RANK", world_size=None, node_ips="SKYPILOT_NODE_IPS",
        node_rank="SKYPILOT_NODE_RANK", num_nodes="SKYPILOT_NUM_NODES", nproc_per_node="AUTOMODEL_NPROC_PER_NODE",
    ),
    # submitit's LocalExecutor (hydra/launcher=submitit_local): its JobEnvironment's names (submitit/local/local.py)
    "submitit_local": EnvMap(
        detect="SUBMITIT_LOCAL_GLOBALID", rank="SUBMITIT_LOCAL_GLOBALID", local_rank="SUBMITIT_LOCAL_LOCALID",
        world_size="SUBMITIT_LOCAL_NTASKS", node_rank="SUBMITIT_LOCAL_NODEID", num_nodes="SUBMITIT_LOCAL_JOB_NUM_NODES",
        job_id="SUBMITIT_LOCAL_JOB_ID",
    ),
}


#: What an elastic agent (torchrun, ft_launcher) sets in each rank it starts, and the ``env://`` variables: left in a
#: shell (a notebook started under torchrun, an earlier job's leftovers), they are never passed to a job's agent
#: or ranks (the agent sets its own).
AGENT_VARS = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                        "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_NAME", "ROLE_WORLD_SIZE",
                        "FT_RANK_MONITOR_IPC_SOCKET", "FT_LAUNCHER_IPC_SOCKET"})
AGENT_PREFIXES = ("TORCHELASTIC_",)
#: What a scheduler sets in the jobs it runs: kept out of a job this shell submits to a scheduler (Slurm), whose
#: own values the job gets.
SCHEDULER_PREFIXES = ("SLURM_", "SLURMD_", "SRUN_", "SUBMITIT_", "SKYPILOT_")


def is_launcher_var(name: str, schedulers: bool = True) -> bool:
    """Whether ``name`` is one of the variables a launcher sets in the processes it starts (:data:`AGENT_VARS`,
    ``TORCHELASTIC_*``; with ``schedulers`` also Slurm's, submitit's and SkyPilot's)."""
    return (name in AGENT_VARS or name.startswith(AGENT_PREFIXES)
            or (schedulers and name.startswith(SCHEDULER_PREFIXES)))


#: The row of :data:`ENV_MAPS` for each way a plan starts a rank (the worker's ``--started-by``, :data:`STARTERS`):
#: ft_launcher gives its ranks torchrun's variables; ``single`` is the one process of a one-rank job. A rank whose
#: plan names its starter reads that row only: a variable of another launcher left in the environment
#: (``TORCHELASTIC_RUN_ID`` from a notebook, ``SKYPILOT_NODE_RANK``) decides nothing.
STARTED_BY = {"torchrun": "torchrun", "ft_launcher": "torchrun", "srun": "slurm", "single": "single"}
#: Who starts a job's ranks, as the plan says (the worker's ``--started-by``): torchrun's agent, ft_launcher's,
#: srun itself (one task per rank), or nothing (the only rank); and the scheduler it runs under (``--scheduler``).
STARTERS = tuple(STARTED_BY)
SCHEDULERS = ("local", "slurm", "skypilot")


@dataclasses.dataclass(frozen=True)
class DistEnv:
    """This task's place in the job. Ranks are 0-based; ``world_size`` = nodes x processes per node.

    ``hosts`` is the host of every rank, by rank, where the launcher says (Slurm: the step's nodelist placed by its
    task layout), else (); ``master_addr_from``/``master_port_from`` say which variables the address and port came
    from, for error messages."""

    launcher: str
    rank: int
    local_rank: int
    world_size: int
    master_addr: str
    master_port: int
    node_rank: int = 0
    num_nodes: int = 1
    hosts: tuple[str, ...] = dataclasses.field(default=(), compare=False)
    master_addr_from: str = "$MASTER_ADDR"
    master_port_from: str = "$MASTER_PORT"

    @classmethod
    def from_environ(cls, environ: tp.Mapping[str, str] | None = None, started_by: str | None = None) -> DistEnv:
        """This task's place, read from the variables of the launcher that started it: ``started_by`` (a key of
        :data:`STARTED_BY`, from the job's plan), else (a rank started by hand) whichever launcher's variables are
        set, in :data:`ENV_MAPS`' order (``single`` when none are).

        Raises
        ------
        ValueError
            A variable is missing (and nothing stands in for it) or out of range; the message names it and its value.
        """
        env = os.environ if environ is None else environ
        if started_by is not None:
            if started_by not in STARTED_BY:
                raise ValueError(f"started by {started_by!r}: expected one of {', '.join(STARTED_BY)}")
            row = STARTED_BY[started_by]
            if row != "single":
                m = ENV_MAPS[row]
                if m.detect not in env:
                    raise ValueError(f"the job's plan has {started_by} start this rank, and ${m.detect}, which "
                                     f"{started_by} sets in every rank, is not set: cannot place this task in the job")
                return cls._from_map(row, m, env)
        else:
            for name, m in ENV_MAPS.items():
                if m.detect in env:
                    return cls._from_map(name, m, env)
        port, port_from = _port(env, None)
        addr = env.get("MASTER_ADDR", "127.0.0.1")
        return cls("single", 0, 0, 1, addr, port, master_addr_from="$MASTER_ADDR" if "MASTER_ADDR" in env else
                   "the default (one process)", master_port_from=port_from)

    @classmethod
    def _from_map(cls, launcher: str, m: EnvMap, env: tp.Mapping[str, str]) -> DistEnv:
        if m.complete is not None:
            env = m.complete(m, env)

        def get(names: Names, default: int | None = None) -> int:
            value = _int(env, names)
            if value is None:
                if default is None:
                    also = "".join(f" or ${n}" for n in _names(names)[1:])
                    raise ValueError(f"{launcher} task without ${_names(names)[0]}{also}: cannot place this task "
                                     "in the job")
                return default
            return value

        node_rank, num_nodes = get(m.node_rank, 0), get(m.num_nodes, 1)
        local_rank = get(m.local_rank, 0)
        if m.rank is None:  # one process per node (or LOCAL_RANK given): ranks follow node order
            nproc = get(m.nproc_per_node, 1)
            rank, world_size = node_rank * nproc + local_rank, num_nodes * nproc
        else:
            rank, world_size = get(m.rank), get(m.world_size)
        nodelist, node_ips = _pick(env, m.nodelist), _pick(env, m.node_ips)
        if nodelist and "MASTER_ADDR" not in env:
            master_addr, addr_from = first_host(env[nodelist]), f"first host of ${nodelist}"
        elif node_ips:
            ips = [line.strip() for line in env[node_ips].splitlines() if line.strip()]
            if not ips:
                raise ValueError(f"${node_ips} is empty: cannot find the head node")
            master_addr, addr_from = ips[0], f"first line of ${node_ips}"
        elif "MASTER_ADDR" in env:
            master_addr, addr_from = env["MASTER_ADDR"], "$MASTER_ADDR"
        elif num_nodes == 1:
            master_addr, addr_from = "127.0.0.1", "the default (one node)"
        else:
            where = "".join(f" or ${n}" for n in _names(m.nodelist))
            raise ValueError(f"{launcher} task on {num_nodes} nodes without $MASTER_ADDR{where}: cannot find rank "
                             "0's node")
        port, port_from = _port(env, _pick(env, m.job_id))
        if not 0 <= rank < world_size:
            raise ValueError(f"{launcher}: rank {rank} is not in [0, world_size={world_size})")
        hosts = m.rank_hosts(m, env) if m.rank_hosts is not None else ()
        return cls(launcher, rank, local_rank, world_size, master_addr, port, node_rank, num_nodes,
                   hosts if len(hosts) == world_size else (), addr_from, port_from)

    def export(self, environ: tp.MutableMapping[str, str] | None = None) -> None:
        """Set the torch.distributed ``env://`` variables (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT)."""
        env = os.environ if environ is None else environ
        env.update(RANK=str(self.rank), LOCAL_RANK=str(self.local_rank), WORLD_SIZE=str(self.world_size),
                   MASTER_ADDR=self.master_addr, MASTER_PORT=str(self.master_port))

    def __repr__(self) -> str:  # rank(total) pairs for log lines, as submitit does
        return (f"DistEnv[{self.launcher}] rank {self.rank}({self.world_size}) local {self.local_rank} "
                f"node {self.node_rank}({self.num_nodes}) master {self.master_addr}:{self.master_port}")


def _port(env: tp.Mapping[str, str], job_id: str | None) -> tuple[int, str]:
    """MASTER_PORT and where it came from: $MASTER_PORT, else $AUTOMODEL_MASTER_PORT (default 13742) plus the job
    id modulo PORT_SPAN when the launcher has a job id."""
    if "MASTER_PORT" in env:
        return tp.cast(int, _int(env, "MASTER_PORT")), "$MASTER_PORT"
    base = _int(env, "AUTOMODEL_MASTER_PORT")
    port, source = ((base, "$AUTOMODEL_MASTER_PORT") if base is not None
                    else (DEFAULT_PORT, f"the default {DEFAULT_PORT}"))
    if job_id is not None:
        return port + tp.cast(int, _int(env, job_id)) % PORT_SPAN, f"{source} + ${job_id} % {PORT_SPAN}"
    return port, source


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
    """The initialised process group of this task: ``env`` plus ``device``. Use as a context manager.

    ``step_log``: where :meth:`log` writes (:class:`automodel_hydra.metrics.StepLog`), set by
    :func:`automodel_hydra.recipes.run_recipe` for a function recipe; ``logged``: how many steps it logged, and
    ``last_step`` the last one's number: a function recipe's progress where it trains without a torch optimizer
    (:mod:`automodel_hydra.failures`, the rank's end record)."""

    def __init__(self, env: DistEnv, device: tp.Any) -> None:
        self.env, self.device = env, device
        self.step_log: tp.Any = None
        self.logged = 0
        self.last_step: int | None = None

    def log(self, step: int, **metrics: tp.Any) -> dict[str, tp.Any]:
        """Log one step of a function recipe: on rank 0 one record ``{"step": step, **metrics, "time": ...}``
        appended to the job's ``metrics.jsonl`` (the file the bundled recipe writes, which ``automodel-hydra
        report`` draws and ``status`` reads) and a progress line in the job log; nothing on other ranks, so call it
        on every rank alike (e.g. with a loss already averaged over ranks). Returns the record. Raises RuntimeError
        outside a job's recipe, TypeError/ValueError for a step or metric that cannot be logged
        (:meth:`automodel_hydra.metrics.StepLog.log`)."""
        if self.step_log is None:
            raise RuntimeError("dist.log: no job to log to (it is set up for a recipe function the worker runs)")
        record = tp.cast(dict[str, tp.Any], self.step_log.log(step, **metrics))
        self.logged += 1
        self.last_step = int(record["step"])
        return record

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

    def __enter__(self) -> tp.Self:
        return self

    def __exit__(self, *exc: object) -> None:
        destroy_distributed()


def _positive(name: str, value: float, unit: str) -> float:
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
        raise ValueError(f"init_distributed({name}={value!r}): must be a positive number of {unit}")
    return float(value)


def init_distributed(env: DistEnv | None = None, timeout_s: float = DEFAULT_TIMEOUT_S, *,
                     rendezvous_timeout_s: float | None = None, timeout_minutes: float | None = None) -> Distributed:
    """Initialise torch.distributed for this task (a no-op group of one when ``world_size == 1``).

    Parameters
    ----------
    env
        This task's place; default :meth:`DistEnv.from_environ`.
    timeout_s
        Timeout of the process group, in seconds: how long a collective may wait (torch's ``init_process_group``
        ``timeout``). Default :data:`DEFAULT_TIMEOUT_S` (600 s).
    rendezvous_timeout_s
        How long this rank waits, in seconds, for the rendezvous store and for every other rank to arrive
        (:func:`rendezvous`); default ``timeout_s``.
    timeout_minutes
        ``timeout_s`` in minutes, as NeMo AutoModel's ``dist_env.timeout_minutes``; replaces ``timeout_s`` when given.

    Returns a :class:`Distributed` whose ``device`` is this rank's ``torch.device``. Warns and reuses the group
    when one is already initialised (torchtitan's ``init_distributed`` does the same).

    Raises
    ------
    ValueError
        A timeout that is not a positive number (the message names the parameter).
    RendezvousError
        The ranks could not meet: MASTER_ADDR does not resolve, MASTER_PORT is not a port or is taken, rank 0's store
        never answered, or some ranks never arrived (named, with their hosts where known).
    """
    import torch
    import torch.distributed as dist

    if timeout_minutes is not None:
        timeout_s = _positive("timeout_minutes", timeout_minutes, "minutes") * 60
    timeout_s = _positive("timeout_s", timeout_s, "seconds")
    rdzv_s = _positive("rendezvous_timeout_s", timeout_s if rendezvous_timeout_s is None else rendezvous_timeout_s,
                       "seconds")
    env = env or DistEnv.from_environ()
    env.export()
    device = torch.device(device_for(env.local_rank, torch.cuda.device_count() if torch.cuda.is_available() else 0))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if env.world_size > 1 and not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        log.info("init_process_group(%s) %r", backend, env)
        store = rendezvous(env, rdzv_s)
        store.set_timeout(datetime.timedelta(seconds=timeout_s))
        dist.init_process_group(backend=backend, rank=env.rank, world_size=env.world_size, store=store,
                                timeout=datetime.timedelta(seconds=timeout_s),
                                device_id=device if device.type == "cuda" else None)
    elif dist.is_initialized():
        log.warning("torch.distributed is already initialised; reusing the process group")
    return Distributed(env, device)


def _where(env: DistEnv) -> str:
    """``host:port (MASTER_ADDR from ..., MASTER_PORT from ...)`` for messages."""
    return (f"{env.master_addr}:{env.master_port} (MASTER_ADDR from {env.master_addr_from}, "
            f"MASTER_PORT from {env.master_port_from})")


def check_rendezvous(env: DistEnv, resolve_budget_s: float = 30.0) -> list[str]:
    """Check, on this node and before waiting for anyone, that the rendezvous can work at all.

    ``MASTER_PORT`` must be a TCP port (1..65535; 0 would let rank 0 pick any port, which no other rank could find)
    and ``MASTER_ADDR`` must resolve here (``socket.getaddrinfo``; a temporary resolver failure, EAI_AGAIN, is retried
    for up to ``resolve_budget_s`` seconds). Returns the addresses MASTER_ADDR resolves to.

    Raises RendezvousError, one line naming the variable, its value, where it came from and this host."""
    here = socket.gethostname()
    if not 1 <= env.master_port <= 65535:
        raise RendezvousError(f"MASTER_PORT={env.master_port} (from {env.master_port_from}) is not a TCP port: "
                              "valid ports are 1..65535")
    if not env.master_addr.strip():
        raise RendezvousError(f"MASTER_ADDR is empty (from {env.master_addr_from}): it must name rank 0's node")
    deadline = time.monotonic() + resolve_budget_s
    while True:
        try:
            infos = socket.getaddrinfo(env.master_addr, env.master_port, type=socket.SOCK_STREAM)
            return sorted({str(info[4][0]) for info in infos})
        except socket.gaierror as e:
            if e.errno == socket.EAI_AGAIN and time.monotonic() < deadline:
                time.sleep(1.0)
                continue
            raise RendezvousError(f"MASTER_ADDR={env.master_addr!r} (from {env.master_addr_from}) does not resolve on "
                                  f"{here} ({e.strerror}): it must name rank 0's node so that every node can resolve "
                                  "it") from None


def _is_local(addresses: tp.Iterable[str]) -> bool:
    """Whether this node owns one of ``addresses`` (it can bind a socket to it)."""
    for addr in addresses:
        family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.bind((addr, 0))
            return True
        except OSError:
            continue
    return False


def rendezvous(env: DistEnv, timeout_s: float = DEFAULT_TIMEOUT_S) -> tp.Any:
    """Meet every rank of ``env``; returns the store for ``init_process_group(store=...)``.

    1. :func:`check_rendezvous` (seconds, on every rank).
    2. The store: under torchrun's agent store (``TORCHELASTIC_USE_AGENT_STORE=True``) the agent's TCPStore at
       MASTER_ADDR:MASTER_PORT, under a prefix per restart attempt (see :func:`_attempt_store`); otherwise rank 0
       serves a ``torch.distributed.TCPStore`` there and the other ranks connect to it (what ``env://`` does).
    3. :func:`wait_for_ranks`: every rank sets ``arrived/<rank>`` and waits for all the others.

    ``timeout_s`` bounds steps 2 and 3 together. The returned store is a ``PrefixStore("pg", ...)`` on that store.

    Raises RendezvousError (one line): a check fails; rank 0 cannot listen on MASTER_PORT; another rank finds no store
    at MASTER_ADDR:MASTER_PORT within ``timeout_s``; or ranks are missing after ``timeout_s`` (named)."""
    from torch.distributed import DistError, PrefixStore, TCPStore

    start = time.monotonic()
    addresses = check_rendezvous(env)
    here = socket.gethostname()
    store = _attempt_store(env, timeout_s) if env.launcher == "torchrun" else None
    if store is None:
        if env.rank == 0 and not _is_local(addresses):
            log.warning("rank 0 runs on %s, but MASTER_ADDR=%s (from %s) resolves to %s, none of them an address of "
                        "this node: the other ranks will look for the rendezvous store elsewhere",
                        here, env.master_addr, env.master_addr_from, ", ".join(addresses))
        try:
            store = TCPStore(env.master_addr, env.master_port, env.world_size, is_master=env.rank == 0,
                             timeout=datetime.timedelta(seconds=timeout_s), wait_for_workers=False, multi_tenant=True)
        except DistError as e:
            if env.rank == 0:
                raise RendezvousError(f"rank 0 cannot serve the rendezvous store on {here} at {_where(env)}: "
                                      f"{_first_line(e)}; choose a free MASTER_PORT") from None
            raise RendezvousError(f"rank {env.rank} on {here} found no rendezvous store at {_where(env)} within "
                                  f"{timeout_s:g} s: rank 0{_on(env, 0)} serves it and has not started, has failed, "
                                  f"or is not reachable from {here}") from None
    wait_for_ranks(store, env, timeout_s, started=start)
    return PrefixStore("pg", store)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _on(env: DistEnv, rank: int) -> str:
    return f" (on {env.hosts[rank]})" if env.hosts else ""


def describe_ranks(ranks: tp.Sequence[int], hosts: tp.Sequence[str] = (), limit: int = 16) -> str:
    """Ranks as runs, with their host where known: ``[1]`` -> ``"rank 1"``; ``[4, 5, 6, 7, 9]`` with hosts ->
    ``"ranks 4-7 (gpu-a002), 9 (gpu-a003)"``. At most ``limit`` runs, then ``"... and N more"``."""
    runs: list[list[int]] = []
    for r in sorted(ranks):
        if runs and r == runs[-1][-1] + 1 and (not hosts or hosts[r] == hosts[runs[-1][0]]):
            runs[-1].append(r)
        else:
            runs.append([r])
    parts = [(f"{run[0]}-{run[-1]}" if len(run) > 1 else f"{run[0]}") + (f" ({hosts[run[0]]})" if hosts else "")
             for run in runs[:limit]]
    more = sum(len(run) for run in runs[limit:])
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(parts) + (f", ... and {more} more" if more else "")


def wait_for_ranks(store: tp.Any, env: DistEnv, timeout_s: float, progress_s: float = PROGRESS_S, *,
                   started: float | None = None) -> None:
    """Register this rank in ``store`` (key ``arrived/<rank>``, value its host name) and wait until every rank of
    ``env`` has, logging the ranks still missing every ``progress_s`` seconds.

    ``timeout_s`` counts from ``started`` (a ``time.monotonic()`` stamp; default now), so that a caller can bound a
    whole rendezvous; the wait lasts at least ``min(timeout_s, 1)`` seconds after this rank has registered.

    ``store`` is a ``torch.distributed.Store`` (``set``/``check``/``wait``, public API). Raises RendezvousError
    after ``timeout_s`` seconds naming the ranks whose key is absent, with their hosts where ``env.hosts`` says; or,
    when the store goes away while waiting (rank 0 gave up or died), saying so."""
    from torch.distributed import DistError, DistStoreError

    here = socket.gethostname()
    keys = [ARRIVED_KEY.format(rank=r) for r in range(env.world_size)]
    now = time.monotonic()
    deadline = max(now + min(timeout_s, 1.0), (now if started is None else started) + timeout_s)
    try:
        store.set(keys[env.rank], here)
        while True:
            try:
                store.wait(keys, datetime.timedelta(seconds=max(min(deadline - time.monotonic(), progress_s), 0.001)))
                return
            except DistStoreError:  # this wait timed out
                missing = [r for r, key in enumerate(keys) if not store.check([key])]
            if not missing:
                return
            if time.monotonic() >= deadline:
                raise RendezvousError(
                    f"rendezvous at {_where(env)} timed out after {timeout_s:g} s on rank {env.rank} ({here}): "
                    f"{len(missing)} of {env.world_size} ranks never arrived: {describe_ranks(missing, env.hosts)}; "
                    f"they did not start, failed before init_distributed, or cannot reach "
                    f"{env.master_addr}:{env.master_port}")
            log.warning("rank %d: waiting at %s:%d for %s (%.0f s left)", env.rank, env.master_addr, env.master_port,
                        describe_ranks(missing, env.hosts), deadline - time.monotonic())
    except RendezvousError:
        raise
    except DistError as e:
        raise RendezvousError(f"rank {env.rank} on {here} lost the rendezvous store at {_where(env)} while waiting "
                              f"for the other ranks ({_first_line(e)}): rank 0{_on(env, 0)} gave up or died; its log "
                              "names the missing ranks") from None


def _attempt_store(env: DistEnv, timeout_s: float) -> tp.Any:
    """The rendezvous store of this torchrun attempt, or None outside torchrun's agent store.

    torchrun with ``--master_addr/--master_port`` (static rendezvous: our interactive and SkyPilot launchers) hands
    its workers the agent's TCPStore (``TORCHELASTIC_USE_AGENT_STORE=True``) and keeps that store across restarts
    (``--max_restarts``), while ``env://`` adds no per-attempt prefix. A restarted rank could then read the previous
    attempt's keys (a dead rank's gloo address: "connectFullMesh failed ... Connection refused") and the restart
    failed whenever rank 0 came up a little later than the others (cf. pytorch/pytorch#135712). Each attempt's keys
    (the arrival keys of :func:`wait_for_ranks` and the process group's) go under their own prefix; every worker of
    one agent agrees on ``TORCHELASTIC_RESTART_COUNT``."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != str(True):
        return None
    from torch.distributed import DistError, PrefixStore, TCPStore

    try:
        agent = TCPStore(env.master_addr, env.master_port, env.world_size, is_master=False,
                         timeout=datetime.timedelta(seconds=timeout_s))
    except DistError as e:
        raise RendezvousError(f"rank {env.rank} cannot reach torchrun's agent store at {_where(env)}: "
                              f"{_first_line(e)}") from None
    return PrefixStore(f"automodel/attempt_{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}", agent)


def destroy_distributed() -> None:
    """Tear down the process group if this task created one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
