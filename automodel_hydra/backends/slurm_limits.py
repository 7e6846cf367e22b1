"""What a Slurm partition can ever hold, and the one line for a request it never can (pure).

A job that asks more than any node of its partition has (8 tasks per node on nodes of 2 CPUs), more nodes than
the partition has or lets one job use (MaxNodes), or a longer time limit than its MaxTime, is accepted by sbatch
at a site with ``EnforcePartLimits=NO`` (slurm.conf(5), the default) and then stays PENDING for ever, with the
reason ``PartitionConfig``, ``PartitionNodeLimit`` or ``PartitionTimeLimit`` (squeue(1), "JOB REASON CODES").
:func:`refusal` compares the planned sbatch options with the partition's nodes, read once per launch with
:data:`~automodel_hydra.backends.slurm_transport.SINFO_FORMAT` (the transport's probe, the same command as
the other answers), and names the key at fault. Only what no node can ever hold is refused: ``--constraint``,
``--exclude``, reservations and the QOS's limits only narrow what fits, so leaving them out never refuses a job
that could run. A cluster whose answer is missing or unreadable is not checked (the job is submitted as before).

:func:`pending_key` maps a pending job's reason to the key that would change it, for ``automodel-hydra status``.
"""

from __future__ import annotations

import dataclasses
import re
import typing as tp

from automodel_hydra.backends.slurm_config import SlurmConfig, parse_slurm_time
from automodel_hydra.schema import ConfigError

_SIZE = re.compile(r"(\d+)([KMGT]?)B?\Z", re.IGNORECASE)
_UNITS_MB = {"K": 1 / 1024, "": 1, "M": 1, "G": 1024, "T": 1024 * 1024}


@dataclasses.dataclass(frozen=True)
class Nodes:
    """``count`` nodes of one configuration: CPUs (CPUTot), GPUs (Gres ``gpu``) and memory (RealMemory, MB)."""

    count: int
    cpus: int
    gpus: int
    mem_mb: int | None


@dataclasses.dataclass(frozen=True)
class Partition:
    """A partition's nodes and its per-job limits (None: unlimited)."""

    name: str
    default: bool
    nodes: tuple[Nodes, ...]
    max_minutes: int | None
    max_nodes: int | None

    @property
    def total(self) -> int:
        return sum(n.count for n in self.nodes)


def parse_sinfo(text: str) -> dict[str, Partition]:
    """``sinfo --noheader --format=SINFO_FORMAT`` output (:data:`~automodel_hydra.backends.slurm_transport.
    SINFO_FORMAT`) as ``{partition: Partition}``; a line of another shape (a site's wrapper's chatter, a field
    sinfo prints as ``N/A``) is skipped, and a partition with no readable line is absent (not checked)."""
    found: dict[str, dict[str, tp.Any]] = {}
    for line in text.splitlines():
        fields = [f.strip() for f in line.split("|")]
        if len(fields) != 7 or not fields[0]:
            continue
        name, cpus, gres, count, limit, size, mem = fields
        if not (cpus.isdigit() and count.isdigit()):
            continue
        part = found.setdefault(name.rstrip("*"), {"default": name.endswith("*"), "nodes": [],
                                                   "max_minutes": _minutes(limit), "max_nodes": _max_nodes(size)})
        part["nodes"].append(Nodes(int(count), int(cpus), gpus_of(gres), int(mem) if mem.isdigit() else None))
    return {name: Partition(name, p["default"], tuple(p["nodes"]), p["max_minutes"], p["max_nodes"])
            for name, p in found.items()}


def gpus_of(gres: str) -> int:
    """The GPUs in a node's Gres: ``gpu:8``, ``gpu:h100:8(S:0-1)``, ``gpu:a100:4,nvme:1`` -> 8, 8, 4;
    ``(null)`` -> 0 (slurm.conf(5), ``Gres``)."""
    total = 0
    for item in re.split(r",(?![^()]*\))", gres):
        parts = item.split("(", 1)[0].split(":")
        if parts[0] == "gpu":
            total += int(parts[-1]) if len(parts) > 1 and parts[-1].isdigit() else 1 if len(parts) <= 2 else 0
    return total


def _minutes(limit: str) -> int | None:
    """sinfo's ``%l`` (``infinite``, ``D-HH:MM:SS``, ``HH:MM:SS``, any of sbatch's ``--time`` forms) -> minutes,
    seconds rounded up; None: no limit, or unreadable."""
    try:
        return parse_slurm_time(limit)
    except ConfigError:
        return None


def _max_nodes(size: str) -> int | None:
    top = size.rpartition("-")[2]
    return int(top) if top.isdigit() else None


def size_mb(value: object) -> int | None:
    """A Slurm memory size (``64G``, ``500M``, ``1024``: MB by default; sbatch(1) ``--mem``) in MB; None for
    ``0`` (all of the node's memory) or an unreadable value."""
    m = _SIZE.match(str(value).strip())
    if m is None or int(m.group(1)) == 0:
        return None
    return int(int(m.group(1)) * _UNITS_MB[m.group(2).upper()])


def _count(value: object) -> int | None:
    """An sbatch count (``8``, ``h100:8`` for --gpus-per-node, ``2-4`` for --nodes: the minimum) as an int."""
    text = str(value).strip().split("-", 1)[0].rpartition(":")[2]
    return int(text) if text.isdigit() else None


def refusal(options: tp.Mapping[str, object], keys: tp.Mapping[str, str],
            partitions: tp.Mapping[str, Partition]) -> str | None:
    """The one line saying why no node of the job's partition can ever run it, or None when one can (or when
    the partition is not in ``partitions``: not known, not checked).

    Parameters
    ----------
    options
        the planned sbatch options (long names: ``nodes``, ``ntasks-per-node``, ``cpus-per-task``,
        ``gpus-per-node``, ``mem``, ``time`` in minutes or a Slurm time, ``partition``).
    keys
        option -> ``key=value`` as the user wrote it (``slurm.ntasks_per_node=8``, ``slurm.sbatch_args.nodes=3``).
    partitions
        :func:`parse_sinfo`'s table. ``partition`` unset: the default partition; ``a,b``: refused only when
        neither can run it (the first one's line).
    """
    named = str(options.get("partition") or "")
    wanted = [p.strip() for p in named.split(",") if p.strip()] or [n for n, p in partitions.items() if p.default]
    lines = [_refusal(options, keys, partitions[p]) for p in wanted if p in partitions]
    if not lines or len(lines) < len(wanted) or not all(lines):
        return None
    return lines[0]


def _refusal(options: tp.Mapping[str, object], keys: tp.Mapping[str, str], part: Partition) -> str | None:
    def key(*names: str) -> str:
        return " with ".join(keys.get(n, f"--{n}={options[n]}") for n in names if n in options)

    tasks = _count(options.get("ntasks-per-node", 1)) or 1
    per_task = _count(options.get("cpus-per-task", 1)) or 1
    cpus, gpus = tasks * per_task, _count(options.get("gpus-per-node", 0)) or 0
    mem = size_mb(options["mem"]) if "mem" in options else None
    nodes = _count(options.get("nodes", 1)) or 1
    where = f"partition {part.name}'s nodes have at most"
    if cpus > max(n.cpus for n in part.nodes):
        return (f"{key('ntasks-per-node', 'cpus-per-task')} asks {cpus} CPUs per node; {where} "
                f"{max(n.cpus for n in part.nodes)} (CPUTot)")
    if gpus > max(n.gpus for n in part.nodes):
        return f"{key('gpus-per-node')} asks {gpus} GPUs per node; {where} {max(n.gpus for n in part.nodes)} (Gres gpu)"
    known_mem = [n.mem_mb for n in part.nodes if n.mem_mb is not None]
    if mem is not None and known_mem and mem > max(known_mem):
        return f"{key('mem')} asks {mem} MB per node; {where} {max(known_mem)} MB (RealMemory)"
    if part.max_nodes is not None and nodes > part.max_nodes:
        return f"{key('nodes')} asks {nodes} nodes; partition {part.name} lets a job have at most {part.max_nodes} " \
               "(MaxNodes)"
    fit = sum(n.count for n in part.nodes if n.cpus >= cpus and n.gpus >= gpus
              and (mem is None or n.mem_mb is None or n.mem_mb >= mem))
    if nodes > fit:
        such = "" if fit == part.total else f" that hold {cpus} CPUs{f' and {gpus} GPUs' if gpus else ''} each"
        return f"{key('nodes')} asks {nodes} nodes; partition {part.name} has {fit} nodes{such}"
    minutes = _time_minutes(options.get("time"))
    if part.max_minutes is not None and minutes is not None and minutes > part.max_minutes:
        return f"{key('time')} asks {minutes} minutes; partition {part.name} allows at most {part.max_minutes} " \
               "(MaxTime)"
    return None


def _time_minutes(value: object) -> int | None:
    return value if isinstance(value, int) else None if value is None else _minutes(str(value).strip())


#: squeue(1) "JOB REASON CODES" of a pending job that will not start as submitted -> the ``slurm.`` keys that
#: change it. A reason not listed has no key of its own (``JobHeldAdmin``: an administrator's hold).
REASON_KEYS: dict[str, tuple[str, ...]] = {
    "PartitionConfig": ("slurm.ntasks_per_node", "slurm.cpus_per_task", "slurm.gpus_per_node", "slurm.mem",
                        "slurm.partition"),
    "PartitionNodeLimit": ("slurm.nodes", "slurm.partition"),
    "PartitionTimeLimit": ("slurm.time", "slurm.partition"),
    "PartitionDown": ("slurm.partition",),
    "PartitionInactive": ("slurm.partition",),
    "ReqNodeNotAvail": ("slurm.exclude", "slurm.constraint", "slurm.nodes", "slurm.partition"),
    "BadConstraints": ("slurm.constraint",),
    "InvalidAccount": ("slurm.account",),
    "AccountNotAllowed": ("slurm.account", "slurm.partition"),
    "InvalidQOS": ("slurm.qos",),
    "QOSNotAllowed": ("slurm.qos", "slurm.partition"),
    "AssocMaxJobsLimit": ("slurm.account",),
    "QOSMaxCpuPerUserLimit": ("slurm.ntasks_per_node", "slurm.cpus_per_task", "slurm.nodes", "slurm.qos"),
    "QOSMaxGRESPerUser": ("slurm.gpus_per_node", "slurm.nodes", "slurm.qos"),
    "QOSMaxNodePerJobLimit": ("slurm.nodes", "slurm.qos"),
    "QOSMaxWallDurationPerJobLimit": ("slurm.time", "slurm.qos"),
    "AssocMaxWallDurationPerJobLimit": ("slurm.time", "slurm.account"),
    "AssocMaxNodesPerJobLimit": ("slurm.nodes", "slurm.account"),
    "AssocMaxCpuPerJobLimit": ("slurm.ntasks_per_node", "slurm.cpus_per_task", "slurm.nodes", "slurm.account"),
    "DependencyNeverSatisfied": ("slurm.sbatch_args.dependency",),
}


#: squeue(1) "JOB REASON CODES" of a pending job that will not start as submitted (the others wait for something
#: that changes by itself: Resources, Priority, a user's other jobs under a per-user limit).
NEVER_REASONS = ("PartitionConfig", "PartitionDown", "PartitionInactive", "PartitionNodeLimit", "PartitionTimeLimit",
                 "ReqNodeNotAvail", "InvalidAccount", "InvalidQOS", "AccountNotAllowed", "QOSNotAllowed",
                 "BadConstraints", "DependencyNeverSatisfied", "JobHeldAdmin", "QOSMaxNodePerJobLimit",
                 "QOSMaxWallDurationPerJobLimit", "AssocMaxWallDurationPerJobLimit", "AssocMaxNodesPerJobLimit",
                 "AssocMaxCpuPerJobLimit")


def pending_note(reason: str) -> str:
    """A pending job's reason as ``automodel-hydra status`` shows it: flagged, with the keys at fault, when it
    means the job will not start as submitted (``"PartitionTimeLimit (will not start as submitted: change
    slurm.time or slurm.partition and resubmit)"``); with the keys that ask for the limited resource when it waits
    on a per-user limit; else as Slurm says it."""
    head = re.split(r"[ ,(]", reason.strip(), maxsplit=1)[0]
    keys = " or ".join(pending_key(reason))
    if head in NEVER_REASONS:
        fix = f"change {keys}" if keys else "ask the cluster's administrators"
        return f"{reason} (will not start as submitted: {fix} and resubmit)"
    if keys:
        return f"{reason} (waits for your other jobs under this limit; it asks through {keys})"
    return reason


def pending_key(reason: str) -> tuple[str, ...]:
    """The keys that change a pending job whose squeue reason is ``reason`` (``"PartitionTimeLimit"``, or the
    reason with a detail after it: ``"ReqNodeNotAvail, UnavailableNodes:node3"``); () when none is known."""
    head = re.split(r"[ ,(]", reason.strip(), maxsplit=1)[0]
    return REASON_KEYS.get(head, ())


class Unfit(ConfigError):
    """A request no node of its partition can ever hold: :func:`refusal`'s one line, naming the key at fault."""

    def __init__(self, key: str, value: tp.Any, line: str) -> None:
        self.key, self.value, self.valid = key, value, line
        Exception.__init__(self, line)


#: The sbatch options :func:`refusal` compares -> the ``slurm:`` field that sets them.
FIELDS = {"nodes": "nodes", "ntasks-per-node": "ntasks_per_node", "cpus-per-task": "cpus_per_task",
          "gpus-per-node": "gpus_per_node", "mem": "mem", "time": "time"}


def option_keys(sc: SlurmConfig) -> dict[str, str]:
    """Each compared option as the user set it: ``slurm.sbatch_args.<k>=v`` where ``sbatch_args`` sets it (it
    wins, :func:`slurm_plan._directives`), else ``slurm.<field>=v``."""
    keys = {option: f"slurm.{field}={getattr(sc, field)}" for option, field in FIELDS.items()}
    for k, v in sc.sbatch_args.items():
        option = str(k).lstrip("-").replace("_", "-")
        if option in FIELDS:
            keys[option] = f"slurm.sbatch_args.{k}={v}"
    return keys


def refuse_unfit(options: tp.Mapping[str, object], sc: SlurmConfig, partitions: tp.Mapping[str, Partition]) -> None:
    """Raise :class:`Unfit` with :func:`refusal`'s line when no node of the job's partition can ever run it."""
    keys = option_keys(sc)
    line = refusal(options, keys, partitions)
    if line is not None:
        key = line.split("=", 1)[0]
        raise Unfit(key, line.split("=", 1)[1].split(" ", 1)[0], line)


__all__ = ["FIELDS", "NEVER_REASONS", "REASON_KEYS", "Nodes", "Partition", "Unfit", "gpus_of",
           "option_keys", "parse_sinfo", "pending_key", "pending_note", "refusal", "refuse_unfit", "size_mb"]
