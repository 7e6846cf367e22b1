"""The health check before training: every rank checks its devices and joins one short all-reduce, right after the
process group is up and before the recipe runs, so a bad node costs seconds, not a training attempt.

``health_check.enabled`` (null: on for a Slurm job on more than one node, off otherwise; docs/failures.md says
why). Each rank checks, bounded by ``health_check.timeout_s`` (30 s) in all:

* its devices: where the scheduler gave GPUs (``SLURM_GPUS_ON_NODE``, Slurm's count of this node's GPUs;
  sbatch(1) "OUTPUT ENVIRONMENT VARIABLES"), CUDA must be available and see at least one GPU per local rank;
* the collective: an all-reduce of one number over the job's process group (nccl with CUDA, gloo without),
  which also tells every rank which ranks failed their device check.

A rank that fails says so in one line, ``health check failed on node2: CUDA is not available (SLURM_GPUS_ON_NODE=4)``,
and raises :class:`HealthCheckError`, whose class is ``node_failure`` (:func:`automodel_hydra.failures.classify`):
the Slurm requeue hook requeues the job with that node in ``ExcNodeList`` (:mod:`automodel_hydra.retry`). The
ranks that passed raise the same error after the failed ranks' end records are written (``ended``), so the ledger
blames the failed rank's node, the first to fail.

Test hook, in tests only: ``AUTOMODEL_TEST_HEALTH_FAULT_FILE=PATH`` makes the device check fail on the node
named in the file PATH; the first rank to check writes its own node there when the file does not exist yet (so the
first attempt's node is the bad one, wherever Slurm placed it). The stand-in for a node that lost its GPUs, on a
test cluster without GPUs.
"""

from __future__ import annotations

import datetime
import logging
import os
import time
import typing as tp

log = logging.getLogger(__name__)

#: The test hook (tests only): the device check fails on the node named in the file this variable names.
TEST_FAULT_FILE = "AUTOMODEL_TEST_HEALTH_FAULT_FILE"
#: The default bound of the whole check, in seconds.
DEFAULT_TIMEOUT_S = 30.0


class HealthCheckError(RuntimeError):
    """This node (or another rank's) failed the health check before training: class ``node_failure``."""


def wanted(enabled: bool | None, slurm: bool, num_nodes: int) -> bool:
    """Whether the check runs: ``enabled`` when set; by default (None) for a Slurm job on more than one node,
    where one bad node stops every rank and a requeue can leave it out. Pure."""
    return enabled if enabled is not None else (slurm and num_nodes > 1)


def node_name(environ: tp.Mapping[str, str]) -> str:
    """The node as Slurm names it (``SLURMD_NODENAME``, what ``ExcNodeList`` takes), else the host name."""
    import socket

    return environ.get("SLURMD_NODENAME") or socket.gethostname()


def nodes(env: tp.Any, environ: tp.Mapping[str, str]) -> int:
    """The job's node count: the rank's place (``DistEnv.num_nodes``), or Slurm's ``SLURM_JOB_NUM_NODES`` where
    torchrun started the rank inside a Slurm job (torchrun's variables do not say)."""
    given = environ.get("SLURM_JOB_NUM_NODES", "").strip()
    return max(int(env.num_nodes or 1), int(given) if given.isdigit() else 1)


def _test_fault_node(path: str, node: str) -> str:
    """The test hook's bad node: the one in ``path``, written as ``node`` by the first rank to get there."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        for _ in range(50):  # the first rank may not have written it yet
            with open(path) as f:
                named = f.read().strip()
            if named:
                return named
            time.sleep(0.1)
        return ""
    with os.fdopen(fd, "w") as f:
        f.write(node)
    return node


def device_problem(environ: tp.Mapping[str, str], local_ranks: int, cuda_available: bool,
                   cuda_count: int) -> str | None:
    """What is wrong with this node's devices, or None: where Slurm gave GPUs (``SLURM_GPUS_ON_NODE`` > 0), CUDA must
    be available and see at least ``min(local_ranks, SLURM_GPUS_ON_NODE)`` GPUs (one per local rank; a task that
    sees only its own sees one). Pure."""
    node = node_name(environ)
    if environ.get(TEST_FAULT_FILE) and _test_fault_node(environ[TEST_FAULT_FILE], node) == node:
        return f"the test hook {TEST_FAULT_FILE} names this node"
    given = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    gpus = int(given) if given.isdigit() else 0
    if gpus <= 0:
        return None
    if not cuda_available:
        return f"CUDA is not available (SLURM_GPUS_ON_NODE={gpus})"
    need = 1 if cuda_count == 1 else min(local_ranks, gpus)
    if cuda_count < need:
        return f"CUDA sees {cuda_count} GPUs, {need} expected (SLURM_GPUS_ON_NODE={gpus})"
    return None


def check(dist_env: tp.Any, timeout_s: float = DEFAULT_TIMEOUT_S,
          ended: tp.Callable[[tp.Sequence[int]], bool] | None = None,
          environ: tp.Mapping[str, str] = os.environ) -> float:
    """Run the check on this rank of ``dist_env`` (:class:`automodel_hydra.bootstrap.Distributed`); returns its
    seconds. ``ended(ranks)``: whether those ranks' end records are written (the passing ranks wait for them, up to
    the bound, before raising). Raises :class:`HealthCheckError` on every rank when any rank failed, naming the
    failed nodes; a collective that does not finish within ``timeout_s`` fails it too."""
    import torch
    import torch.distributed as dist

    t0 = time.monotonic()
    env = dist_env.env
    node = node_name(environ)
    local = max(1, env.world_size // nodes(env, environ))
    problem = device_problem(environ, local, torch.cuda.is_available(),
                             torch.cuda.device_count() if torch.cuda.is_available() else 0)
    if env.world_size > 1 and dist.is_initialized():
        flags = torch.zeros(env.world_size, device=dist_env.device)
        flags[env.rank] = 1.0 if problem else 0.0
        try:
            work = dist.all_reduce(flags, async_op=True)
            work.wait(timeout=datetime.timedelta(seconds=timeout_s))
        except Exception as e:  # every way the collective fails is the node's failure
            said = next(iter(str(e).splitlines()), "")
            line = f"health check failed on {node}: all-reduce: {type(e).__name__}: {said}"
            log.error("%s", line)
            raise HealthCheckError(line) from e
        bad = [r for r, f in enumerate(flags.tolist()) if f > 0]
    else:
        bad = [env.rank] if problem else []
    if problem:
        line = f"health check failed on {node}: {problem}"
        log.error("%s", line)
        raise HealthCheckError(line)
    if bad:
        hosts = env.hosts or ()
        names = sorted({hosts[r] for r in bad if r < len(hosts)}) or [f"rank {r}" for r in bad]
        while ended is not None and not ended(bad) and time.monotonic() - t0 < timeout_s:
            time.sleep(0.1)
        raise HealthCheckError(f"health check failed on {', '.join(names)} (rank{'s' if len(bad) > 1 else ''} "
                               f"{', '.join(map(str, bad))}); this rank passed")
    seconds = time.monotonic() - t0
    log.info("health check passed on %s in %.2f s", node, seconds)
    return seconds


def before_training(section: tp.Any, slurm: bool, dist_env: tp.Any, launch: tp.Any, restart: int,
                    requeue: int) -> float | None:
    """The worker's call: :func:`check` where ``section`` (``health_check``) and the job want it (:func:`wanted`;
    ``slurm``: Slurm started the rank), the passing ranks waiting for the failed ranks' end records of this attempt
    (``launch/ranks/rank<R>.<attempt>.json``). Returns the check's seconds, None when it did not run."""
    from automodel_hydra import outcome

    if not wanted(section.enabled, slurm, nodes(dist_env.env, os.environ)):
        return None
    return check(dist_env, section.timeout_s,
                 ended=lambda ranks: all(outcome.end_file(launch, r, restart, requeue).exists() for r in ranks))
