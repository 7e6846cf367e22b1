"""Slurm backend: one sbatch job per run, one job array per sweep group.

Planning is pure: :meth:`Slurm.plan` renders ``launch/sbatch.sh`` from ``cfg.slurm``; :meth:`Slurm.batches`
renders a sweep group's array script once (``<sweep dir>/launch/sbatch.sh``, split at the cluster's MaxArraySize,
which :meth:`Slurm.preflight` reads with ``scontrol show config``). :meth:`Slurm.submit` runs ``sbatch`` on the
files planning wrote and writes nothing else into ``launch/``.

What each srun task runs: the plain worker command, ``python -u -m automodel_hydra.worker
"$AUTOMODEL_JOB_DIR"/launch/job.yaml --log-file ...``, not a pickle runner. Why:

* the script reads as what it does and can be resubmitted by hand (``sbatch launch/sbatch.sh``); the config is
  ``launch/job.yaml``, not a pickle;
* a requeued job must resume from its checkpoint, not report the pickled result of its first attempt;
* the coordinated checkpoint on USR2/SIGTERM is the worker's (every rank, one step);
* a job array needs no per-task pickle in place before it starts: task i reads ``job_dirs[i]``.

With ``fault_tolerance.enabled=true`` srun runs one task per node (``--ntasks-per-node=1``), ``ft_launcher``,
which starts that node's ``ntasks_per_node`` ranks; the launchers meet through c10d rendezvous at MASTER_ADDR:
MASTER_PORT (``--rdzv-id`` = the job id) and restart the worker group in place, in the same allocation and job
(docs/fault-tolerance.md). Once those restarts are spent, the job fails and the rules below apply as without it.

Rank 0 writes ``<job dir>/result.json`` (atomically) and :meth:`Slurm.wait` reads it once the job's state is
COMPLETED.

A call job (a Hydra task function that is not ours, :mod:`automodel_hydra.call`) is planned by the same code and
rendered by the same renderer: the script runs one task (``srun --ntasks=1``) of ``python -u -m
automodel_hydra.call "$AUTOMODEL_JOB_DIR"/launch/call.pkl``, without the rendezvous, the task defaults
(``OMP_NUM_THREADS``, ``NCCL_DEBUG``) or the time-limit signal (``--signal=USR2``: the function has no handler for
it, and USR2's default action would kill it before its time is up); its result is ``launch/call_result.pkl``.

Files: ``launch/sbatch.sh`` in a job dir is that job's own script (``sbatch`` it to rerun the job alone); a sweep
submits ``<sweep dir>/launch/sbatch.sh``, the array whose task i runs ``job_dirs[i]``. Logs:
``slurm/<id>_<rank>_log.out`` in the job dir (arrays: ``slurm/<array id>_<task>_<rank>_log.out`` in the sweep dir).

Runtime contract (set in the script, read by :mod:`automodel_hydra.bootstrap`): MASTER_ADDR = first host of
``scontrol show hostnames "$SLURM_JOB_NODELIST"``; MASTER_PORT = ``slurm.master_port + SLURM_JOB_ID % 1000``,
computed once in the batch step so every task of a job agrees, different for jobs (array tasks included) that
share a node, moved up by 1000 while a port is already in use on the master node, and logged.
"""

from __future__ import annotations

import codecs
import dataclasses
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import typing as tp
import warnings
from pathlib import Path, PurePosixPath

from automodel_hydra import fault_tolerance
from automodel_hydra.backends.slurm_config import AUTOMODEL_DEFAULTS as AUTOMODEL_DEFAULTS
from automodel_hydra.backends.slurm_config import CALL_DEFAULTS as CALL_DEFAULTS
from automodel_hydra.backends.slurm_config import SlurmConfig as SlurmConfig
from automodel_hydra.backends.slurm_config import VolumeMapping as VolumeMapping
from automodel_hydra.backends.slurm_config import parse_slurm_time as parse_slurm_time
from automodel_hydra.backends.slurm_script import (
    SRUN_EXPORT_ARGS,
    ShellWord,
    parse_job_id,
    pattern_literal,
    render_sbatch,
    sbatch_export_args,
)
from automodel_hydra.backends.slurm_tunnel import (
    Connection,
    Endpoint,
    Probe,
    TunnelError,
    connect,
    no_sbatch_line,
    remote_path,
)
from automodel_hydra.bootstrap import PORT_SPAN
from automodel_hydra.envvars import UnsetReference, export_lines, missing_refs, parse_env_vars
from automodel_hydra.paths import local_reads, outermost
from automodel_hydra.plan import (
    CALL_FILE,
    RUN_ID_FILE,
    TORCHRUN_LOG_DIR,
    Backend,
    Batch,
    JobResult,
    JobSpec,
    Plan,
    PreflightError,
    Submission,
    SubmitError,
    call_argv,
    error_stamps,
    launch_dir,
    rank_error,
    read_result,
    worker_argv,
    written_by_this_launch,
)
from automodel_hydra.profile import nsys_check_lines, nsys_prefix
from automodel_hydra.schema import ConfigError, UserValueError
from automodel_hydra.snapshot import Source
from automodel_hydra.states import JobState, StateInfo

if tp.TYPE_CHECKING:
    from automodel_hydra.config import TrainConfig

log = logging.getLogger(__name__)

SCRIPT = "sbatch.sh"
#: The variable holding the job's output dir inside the script (array task i: ``job_dirs[i]``).
JOB_DIR_VAR = "AUTOMODEL_JOB_DIR"
_JOB_DIR = "/@AUTOMODEL_JOB_DIR@"  # stands for "$AUTOMODEL_JOB_DIR" while argv is built
#: What NeMo AutoModel's sbatch template fixed for every job, kept for an AutoModel recipe (an AutoModel file
#: runs with the settings its recipes were developed under); each can be changed (docs/slurm.md,
#: "AutoModel's template"). Environment: task defaults (the submitting shell's value or an ``env_vars`` entry
#: wins): one CUDA work queue per device (``CUDA_DEVICE_MAX_CONNECTIONS=1``, which tensor- and sequence-parallel
#: communication overlap relies on to order its kernels), no ``recordStream`` on NCCL collectives' tensors
#: (``TORCH_NCCL_AVOID_RECORD_STREAMS=1``: their memory is freed when the collective ends, not when the caching
#: allocator next syncs) and NVLink SHARP off (``NCCL_NVLS_ENABLE=0``: NVLS needs CUDA multicast/IMEX, which
#: containers often lack, and reserves extra GPU memory).
AUTOMODEL_TASK_ENV = {"CUDA_DEVICE_MAX_CONNECTIONS": "1", "TORCH_NCCL_AVOID_RECORD_STREAMS": "1",
                      "NCCL_NVLS_ENABLE": "0"}
#: AutoModel's ``#SBATCH --mail-type=FAIL`` (mail to the submitting user when the job fails), kept likewise;
#: ``slurm.sbatch_args: {mail-type: false}`` leaves it out, ``{mail-user: ...}`` sets the address.
AUTOMODEL_SBATCH = {"mail-type": "FAIL"}
#: AutoModel's token fields of ``slurm:`` -> the variable the job gets (a reference, never a value in the script).
TOKEN_FIELDS = {"hf_token": "HF_TOKEN", "wandb_key": "WANDB_API_KEY"}
#: Where this project's source is mounted in a container when ``slurm.nemo_mount`` mounts AutoModel's source.
PROJECT_MOUNT = "/opt/automodel-hydra"
#: How a recipe's local model and dataset paths reach a container's ranks (:func:`read_mounts`).
MOUNTED = "mounted (--container-mounts) into"
#: Slurm's default MaxArraySize (slurm.conf(5)): array indices 0..MaxArraySize-1.
DEFAULT_MAX_ARRAY_SIZE = 1001
#: Defaults every task gets; the submitting shell's value or an ``env_vars`` entry wins.
TASK_DEFAULTS = {
    "NCCL_DEBUG": "WARN",  # NCCL prints warnings and errors, not its INFO chatter
    "OMP_NUM_THREADS": "${SLURM_CPUS_PER_TASK:-1}",  # srun (unlike torchrun) sets no thread count
}




# ----------------------------------------------------------------------------------------------- planning (pure)


@dataclasses.dataclass(frozen=True)
class Remote:
    """Where planned jobs live on the login node (``slurm.tunnel``, docs/remote.md): each local run dir under
    ``job_dir`` by its path relative to ``local_root`` (the submitting dir; :func:`slurm_tunnel.remote_path`)."""

    endpoint: Endpoint
    job_dir: str
    local_root: Path
    python: str = "python"
    sbatch_export: str = ""  # the login shell's SBATCH_EXPORT

    def path(self, local: Path | str) -> Path:
        """The login node's path of a local run dir or a path in it."""
        return Path(str(remote_path(local, self.local_root, self.job_dir)))


def node_job(job: JobSpec, remote: Remote | None) -> JobSpec:
    """``job`` with the paths the ranks see: itself, or under a tunnel its dirs on the login node (pure)."""
    if remote is None:
        return job
    return dataclasses.replace(job, job_dir=remote.path(job.job_dir),
                               workdir=remote.path(job.workdir) if job.workdir is not None else None,
                               code_dir=remote.path(job.code_dir) if job.code_dir is not None else None)


@dataclasses.dataclass(frozen=True)
class Request:
    """Everything a job's script needs except its output dir; equal requests share one job array."""

    sbatch: tuple[tuple[str, object], ...]  # sbatch options, in order (slurm_script.render_sbatch)
    array_parallelism: int
    setup: tuple[str, ...]  # script lines before srun, after the job-dir line
    container_image: str | None
    mounts: tuple[str, ...]  # "src:dst" for --container-mounts, besides the output dirs and HF_HOME
    mount_hf_home: bool  # mount "$HF_HOME" (set by the script) at the same path in the container
    srun_args: tuple[str, ...]
    command: str  # what each task runs; refers to "$AUTOMODEL_JOB_DIR"
    env_refs: tuple[str, ...]  # submitting-shell variables env_vars refers to ("${HF_TOKEN}" -> HF_TOKEN)
    #: the code snapshot submit copies to the job's ``code_dir`` (None: none); the script's lines name it
    snapshot: Source | None = dataclasses.field(default=None, compare=False)
    #: a container job's snapshot dir, mounted at the same path unless under the mounted output dir
    code_dir: str | None = None
    #: a container job's working dir in it (``slurm.chdir``; None: the output dir)
    workdir: str | None = None
    #: ``slurm.tunnel``: the login node that submits the job, and where its dirs are there (None: sbatch here)
    remote: Remote | None = None


@dataclasses.dataclass(frozen=True)
class Facts:
    """What :meth:`Slurm.preflight` read from the cluster: its MaxArraySize (``scontrol show config``)."""

    max_array_size: int = DEFAULT_MAX_ARRAY_SIZE
    #: (slurm.snapshot, slurm.snapshot_max_mb) -> what a submission snapshots (:func:`find_snapshots`)
    snapshots: tp.Mapping[tuple[str, float], Source | None] = dataclasses.field(default_factory=dict)
    #: ``slurm.tunnel``: the submitting dir, and what each login node answered (:meth:`Connection.probe`)
    cwd: Path | None = None
    remote: tp.Mapping[Endpoint, Probe] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class RemoteRef:
    """A job submitted through ``slurm.tunnel``: the login node, the job's dir and rank-0 log there, and where
    copies of that log land here (``local_log``)."""

    endpoint: Endpoint
    job_dir: str
    log: str
    local_log: str


@dataclasses.dataclass(frozen=True)
class SlurmRef:
    """A Slurm job: ``job_id`` is ``123``, or ``123_4`` for array task 4; ``submitted_at`` in epoch seconds;
    ``remote``: submitted through ``slurm.tunnel`` (None: from this machine)."""

    job_id: str
    submitted_at: float = 0.0
    remote: RemoteRef | None = None

    @property
    def ids(self) -> list[str]:
        return [self.job_id]


def _sh(arg: str) -> str:
    """Quote one argument for bash, turning the job-dir stand-in into ``"$AUTOMODEL_JOB_DIR"``."""
    parts = str(arg).split(_JOB_DIR)
    return f'"${JOB_DIR_VAR}"'.join(shlex.quote(p) if p or len(parts) == 1 else "" for p in parts)


def _directives(sc: SlurmConfig, automodel: bool = False) -> tuple[tuple[str, object], ...]:
    """``cfg.slurm`` as sbatch options (sbatch(1) long names), in the order they are written; unset ones left out.
    ``automodel``: add :data:`AUTOMODEL_SBATCH`. ``sbatch_args`` come last and may add or change any option (null =
    a bare flag, false = left out)."""
    options: dict[str, object | None] = {
        "job-name": sc.job_name, "time": sc.time_minutes, "nodes": sc.nodes, "ntasks-per-node": sc.ntasks_per_node,
        "gpus-per-node": sc.gpus_per_node or None, "cpus-per-task": sc.cpus_per_task, "mem": sc.mem,
        "account": sc.account,
        "partition": sc.partition, "qos": sc.qos, "constraint": sc.constraint, "exclude": sc.exclude,
        # the time-limit warning: every rank checkpoints, then the job requeues itself (docs/slurm.md)
        "signal": f"USR2@{sc.checkpoint_margin_s}",
        # --requeue lets Slurm requeue the job after a preemption or a node failure; without requeues the job must
        # say --no-requeue, or the cluster's JobRequeue=1 default requeues it anyway (slurm.conf(5))
        "requeue": True if sc.max_requeues > 0 else None, "no-requeue": True if sc.max_requeues == 0 else None,
        "open-mode": "append",  # a requeued job appends to its log instead of truncating it
        **(AUTOMODEL_SBATCH if automodel else {}),
    }
    for key, value in sc.sbatch_args.items():
        name = str(key).lstrip("-").replace("_", "-")
        options[name] = None if value is False else True if value is None else value
    return tuple((k, v) for k, v in options.items() if v is not None and v != "")


def node_path(path: str) -> str:
    """``path`` for bash on the nodes: ``~`` and ``~/...`` become the job user's ``"$HOME"`` there (as an unquoted
    ``~`` in AutoModel's ``export HF_HOME=~/...`` does), anything else is quoted as it is."""
    if path == "~" or path.startswith("~/"):
        rest = path[2:]
        return '"$HOME"' + (f"/{shlex.quote(rest)}" if rest else "")
    return shlex.quote(path)


def _mount(source: str, dest: str, key: str) -> str:
    for path in (source, dest):
        if "," in path or ":" in path:
            raise UserValueError(f"{key}: {path!r} contains ',' or ':', which srun --container-mounts cannot "
                                 "express")
    return f"{source}:{dest}"


def container_dirs(sc: SlurmConfig, job_dir: Path, hf_home: str | None = None) -> list[str]:
    """Paths that a container job's tasks already have (pure): the destinations of ``nemo_mount`` (or
    :data:`PROJECT_MOUNT`) and ``extra_mounts``, the run dir (the output dir is mounted at its own path) and an
    absolute ``hf_home``. A path a rank reads under one of them needs no mount of its own."""
    dirs = [sc.nemo_volume.dest if sc.nemo_volume is not None else sc.nemo_mount or PROJECT_MOUNT, PROJECT_MOUNT,
            *(m.dest for m in sc.extra_mounts), str(job_dir)]
    return [os.path.normpath(d) for d in [*dirs, *([hf_home] if hf_home and hf_home.startswith("/") else [])]]


def read_mounts(cfg: TrainConfig, job_dir: Path, check_here: bool = True) -> list[str]:
    """The ``--container-mounts`` entries (``path:path``) that bring the local model and dataset paths the ranks
    read (:func:`automodel_hydra.paths.local_reads`: the model dir, tokenizer, teacher, a dataset file or dir)
    into ``slurm.container_image`` at the same paths, so the recipe's sections work there as written; paths under
    :func:`container_dirs` are there already. ``check_here=False`` reads no filesystem (planning; preflight
    checked). Raises ConfigError (one line, naming the key) for a relative path (unless ``slurm.chdir`` says
    where the ranks start), a ``~`` one, one missing on the submitting host, and UserValueError for a path that
    ``--container-mounts`` cannot write (``,`` or ``:``)."""
    sc = cfg.slurm
    assert sc is not None and sc.container_image is not None
    reads = local_reads(cfg, f"the container ({sc.container_image})", MOUNTED, check_here=check_here,
                        relative_ok=sc.chdir is not None, inside=container_dirs(sc, job_dir, sc.hf_home))
    keys = {path: key for key, path, _ in reversed(reads)}  # the first key naming each path
    return [_mount(path, path, keys[path]) for path in outermost(keys)]


def _plan_request(cfg: TrainConfig, job: JobSpec, source: Source | None = None, remote: Remote | None = None
                  ) -> Request:
    sc = cfg.slurm
    assert sc is not None, "the slurm backend plans configs with a slurm: section"
    hf_home = sc.hf_home
    in_container = sc.container_image is not None
    python = "python" if in_container else remote.python if remote is not None else sys.executable
    volume = sc.nemo_volume
    if job.code_dir is None or (in_container and sc.nemo_mount and volume is None):
        source = None  # (a container path in nemo_mount: this project's live source is mounted there instead)
    # in a container: what the task puts first on PYTHONPATH inside it (container_pythonpath has the rule)
    inside = container_pythonpath(sc, source, job.code_dir) if in_container else []
    if in_container:  # the host's PYTHONPATH means nothing there; the task sets it inside (see the srun command)
        pythonpath = f"export PYTHONPATH={':'.join(shlex.quote(e) for e in inside)}"
    elif remote is not None:  # this machine's checkout means nothing on the cluster (slurm.snapshot: none)
        pythonpath = "# PYTHONPATH: automodel_hydra is expected to be installed on the cluster"
    else:
        pythonpath = f"export PYTHONPATH={shlex.quote(str(job.project_root))}${{PYTHONPATH:+:$PYTHONPATH}}"
    margin = sc.checkpoint_margin_s
    call = job.call is not None
    setup = [
        f"# {sc.job_name}: one task running the Hydra job's task function (launch/call.pkl); planned by "
        "automodel-hydra" if call else
        f"# {sc.job_name}: {sc.nodes} node(s) x {sc.ntasks_per_node} task(s) = world size {sc.world_size}; "
        "planned by automodel-hydra",
        pythonpath,
        "export PYTHONUNBUFFERED=1",
    ]
    rendezvous = [
        f"export AUTOMODEL_MAX_REQUEUES={sc.max_requeues}  # requeues after the time-limit warning",
        "# rendezvous: the first host of the allocation, and a port per job, the same for all its tasks:",
        f"# slurm.master_port + job id % {PORT_SPAN}, moved up by {PORT_SPAN} while taken on the master",
        'export MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        f"export MASTER_PORT=$(({sc.master_port} + SLURM_JOB_ID % {PORT_SPAN}))",
        'if [ "${SLURMD_NODENAME:-}" = "$MASTER_ADDR" ]; then',
        f'  while [ "$MASTER_PORT" -le {65535 - PORT_SPAN} ] && (: <"/dev/tcp/127.0.0.1/$MASTER_PORT") 2>/dev/null; '
        f"do MASTER_PORT=$((MASTER_PORT + {PORT_SPAN})); done",
        "fi",
        # an array task is named as squeue and sacct name it (ARRAYID_TASK), not by its raw job id
        'job="${SLURM_ARRAY_JOB_ID:+${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}}"',
        'echo "automodel-hydra: job ${job:-$SLURM_JOB_ID} rendezvous at ${MASTER_ADDR}:${MASTER_PORT}" >&2',
        "# task defaults (the submitting shell's value or slurm.env_vars wins)",
        *[f'export {k}="${{{k}:-{v}}}"' for k, v in TASK_DEFAULTS.items()],
    ]
    if not call:
        setup += rendezvous
    if margin != sc.signal_delay_s and not call:
        setup.insert(4, f"# checkpoint margin {margin}s: slurm.signal_delay_s={sc.signal_delay_s}s does not fit "
                        f"twice in slurm.time={sc.time}")
    if source is not None and job.code_dir is not None:
        setup[1:2] = _snapshot_lines(source, job.code_dir)
    if remote is not None and call:  # the call's Hydra job writes the job dir there, not this machine's path
        setup.append(f'export AUTOMODEL_CALL_DIR="${JOB_DIR_VAR}"')
    if remote is not None:  # the submitting dir is not there: start in its copy (or the job dir)
        start = source.pythonpath(job.code_dir)[0] if source is not None and job.code_dir is not None else job.job_dir
        setup.append(f"cd {shlex.quote(str(start))}  # slurm.tunnel: tasks start in "
                     + ("the snapshot's copy of the submitting dir" if source is not None else "the job dir"))
    if job.env:
        setup += ["# hydra.job.env_set", *(f"export {k}={shlex.quote(v)}" for k, v in job.env)]
    if cfg.automodel:
        setup += ["# AutoModel's template settings (the submitting shell's value or slurm.env_vars wins)",
                  *[f'export {k}="${{{k}:-{v}}}"' for k, v in AUTOMODEL_TASK_ENV.items()]]
    if hf_home:
        setup.append(f"export HF_HOME={node_path(hf_home)}  # slurm.hf_home")
    env = parse_env_vars(sc.env_vars, "slurm.env_vars")
    for key, name in TOKEN_FIELDS.items():
        value = getattr(sc, key)
        if value is None:
            continue
        (secret,) = parse_env_vars({name: value}, "slurm")
        if secret.ref is None:
            raise ConfigError(f"slurm.{key}", "<a literal value>", f"a reference to a variable of the submitting "
                              f"shell, e.g. '${{{name}}}': a token's value is never written into the job's script")
        env = [e for e in env if e.name != name] + [secret]
    for key in ("command", "job_dir", "repo_root"):
        if getattr(sc, key) is not None:
            warnings.warn(f"slurm.{key} is set by AutoModel's own CLI for its sbatch script; here every task runs "
                          "the worker and the run dir keeps the script, config and logs: it is ignored", stacklevel=2)
    if env:
        setup += ["# slurm.env_vars (\"${VAR}\" = the submitting shell's variable, expanded here)", *export_lines(env)]
    spec = JobSpec(Path(_JOB_DIR), job.job_name)  # the job's paths inside the script
    mounts = []
    if in_container:
        if volume is not None:  # AutoModel's source; this project's comes from the snapshot, else mounted beside it
            mounts.append(_mount(volume.source, volume.dest, "slurm.nemo_mount"))
        if source is None:
            mounts.append(_mount(str(job.project_root), sc.nemo_mount if sc.nemo_mount and volume is None
                                 else PROJECT_MOUNT, "slurm.nemo_mount"))
        mounts += [_mount(m.source, m.dest, f"slurm.extra_mounts[{i}]") for i, m in enumerate(sc.extra_mounts)]
        mounts += read_mounts(cfg, job.job_dir, check_here=False)  # the recipe's local models and data
    else:  # nsys runs in the batch step's environment; in a container the task checks it there (task_prologue)
        setup += nsys_check_lines(cfg.profile.nsys, _sh(str(spec.log_file)))
    if sc.setup:
        setup += ["# slurm.setup", *sc.setup]
    if in_container and hf_home:  # mounted at srun: the source must exist (env_vars or setup may have moved it)
        setup.append('mkdir -p "$HF_HOME"')
    if job.workdir is not None:
        setup.append(f"cd {shlex.quote(str(job.workdir))}  # hydra.job.chdir")
    if sc.chdir is not None:
        setup.append(f"cd {shlex.quote(sc.chdir)}  # slurm.chdir")
    ft = cfg.fault_tolerance.enabled and not call
    prefix = nsys_prefix(cfg.profile.nsys, _JOB_DIR, job.job_name, rank_var="RANK" if ft else "SLURM_PROCID")
    argv = call_argv(spec, python=python) if call else worker_argv(spec, python=python)
    command = " ".join(_sh(a) for a in [*prefix, *argv])
    ft_srun: tuple[str, ...] = ()
    if ft:  # one ft_launcher per node starts the node's ranks (docs/fault-tolerance.md)
        bare = in_container or "/" not in python  # a python found on PATH: its ft_launcher too
        launcher = "ft_launcher" if bare else str(Path(python).parent / "ft_launcher")
        if not bare:  # the nodes share this machine's install (bare metal): found here, missing is one line
            line = fault_tolerance.missing_launcher_line(f"at {launcher} on the nodes")
            setup.append(f"[ -x {shlex.quote(launcher)} ] || {{ echo {shlex.quote('error: ' + line)} | tee -a "
                         f"{_sh(str(spec.log_file))} >&2; exit 1; }}")
        setup.append("# fault tolerance: in-job restarts keep the allocation, the job id and the rendezvous")
        # ft_launcher creates its --log-dir with check-then-create (no exist_ok): two launchers on one host race
        # to it and one dies with FileExistsError, so the dir exists before they start
        setup.append(f"mkdir -p {_sh(str(spec.launch_dir / TORCHRUN_LOG_DIR))}")
        command = " ".join([_sh(launcher), *map(_sh, fault_tolerance.ft_args(cfg.fault_tolerance)),
                            f"--nnodes={sc.nodes}", f"--nproc-per-node={sc.ntasks_per_node}", "--rdzv-backend=c10d",
                            '--rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}"', '--rdzv-id="${SLURM_JOB_ID}"',
                            # each launcher makes its own <run id>_<random>/ under it: nodes never collide
                            _sh(f"--log-dir={spec.launch_dir / TORCHRUN_LOG_DIR}"),
                            *(["--no-python"] if prefix else []),
                            " ".join(_sh(a) for a in ([*prefix, *argv] if prefix else argv[2:]))])
        ft_srun = (f"--ntasks={sc.nodes}", "--ntasks-per-node=1",
                   ShellWord('--cpus-per-task="${SLURM_CPUS_ON_NODE}"'))
    if in_container:  # run inside the image: PYTHONPATH (an image's own ENV wins over the host's) and nsys there
        command = f"{task_prologue(inside, nsys_check_lines(cfg.profile.nsys, _sh(str(spec.log_file))))} {command}"
    directives = tuple((k, v) for k, v in _directives(sc, automodel=cfg.automodel) if not (call and k == "signal"))
    return Request(sbatch=directives, array_parallelism=sc.array_parallelism, setup=tuple(setup),
                   container_image=sc.container_image, mounts=tuple(mounts),
                   mount_hf_home=in_container and bool(hf_home),
                   srun_args=(*(("--ntasks=1",) if call else ()), *ft_srun, *sc.srun_args),
                   command=command,
                   env_refs=(*dict.fromkeys(r.name for e in env for r in e.refs), *(
                       n for k, n in TOKEN_FIELDS.items()
                       if getattr(sc, k) is None)), snapshot=source, remote=remote,
                   code_dir=str(job.code_dir) if in_container and source is not None else None,
                   workdir=sc.chdir if in_container else None)


def container_pythonpath(sc: SlurmConfig, source: Source | None, code_dir: Path | None) -> list[str]:
    """What a task in ``slurm.container_image`` puts first on ``PYTHONPATH``, so that a stock image (NeMo's, which
    lacks this project) runs the worker: the code snapshot's entries (:meth:`snapshot.Source.pythonpath`: its dir
    is under the run's launch dir, mounted at the same path), else this project's source mounted at
    ``nemo_mount`` (a container path) or :data:`PROJECT_MOUNT`; then AutoModel's source for its
    ``nemo_mount: "/src:/dst"`` form."""
    volume = sc.nemo_volume
    if source is not None and code_dir is not None:
        entries = source.pythonpath(code_dir)
    else:
        entries = [sc.nemo_mount if sc.nemo_mount and volume is None else PROJECT_MOUNT]
    return entries + ([volume.dest] if volume is not None else [])


def task_prologue(pythonpath: tp.Sequence[str], checks: tp.Sequence[str] = ()) -> str:
    """The words that start a task's command inside a container (AutoModel's template likewise runs its command
    with ``bash -c`` in the container, ``PYTHONPATH`` set there): ``bash -c '<lines>; exec "$@"' automodel-hydra``,
    followed by the command. The lines put ``pythonpath`` before the container's own ``PYTHONPATH`` (Pyxis gives a
    variable the image defines the image's value, not the one exported in the batch script), then run ``checks``
    (shell lines that exit with an error where the task runs, e.g. :func:`automodel_hydra.profile.nsys_check_lines`).
    """
    entries = ":".join(pythonpath)
    lines = [f"export PYTHONPATH={shlex.quote(entries)}${{PYTHONPATH:+:$PYTHONPATH}}", *checks, 'exec "$@"']
    return f"bash -c {shlex.quote('; '.join(lines))} automodel-hydra"


def _snapshot_lines(source: Source, code_dir: Path) -> list[str]:
    """The script's lines that make every task import the snapshot at ``code_dir`` (:mod:`automodel_hydra.snapshot`):
    its copies first on PYTHONPATH, the dir a task starts in off ``sys.path`` (PYTHONSAFEPATH), and where the copy's
    source was (a call job maps its pickled ``sys.path`` onto the copy)."""
    from automodel_hydra.snapshot import SRC_DIR

    what = f"commit {source.commit[:12]}" if source.commit else "no commit"
    state = {True: ", with uncommitted changes", False: ", clean", None: ""}[source.dirty]
    head = (f"# code: the snapshot taken at submission ({what}{state} of {source.root})" if source.kind == "git"
            else f"# code: the snapshot taken at submission (a copy of {source.root})")
    entries = ":".join(shlex.quote(e) for e in source.pythonpath(code_dir))
    return [head, f"export PYTHONPATH={entries}${{PYTHONPATH:+:$PYTHONPATH}}",
            "export PYTHONSAFEPATH=1  # the dir a task starts in is not on sys.path: the snapshot's copy is",
            f"export AUTOMODEL_CODE_ROOT={shlex.quote(str(source.root))} "
            f"AUTOMODEL_CODE_SRC={shlex.quote(str(code_dir / SRC_DIR))}"]


def render(request: Request, job_dirs: tp.Sequence[Path], array: bool = False) -> str:
    """The sbatch script for one job (``array=False``) or for a job array whose task i runs ``job_dirs[i]``.

    Logs go to ``<root>/slurm/%j_%t_log.out`` (arrays: ``%A_%a_%t``), root = the job dir, or for an array the
    common parent of its job dirs. Raises ValueError naming the option (slurm_script.render_sbatch's rules)."""
    root = log_root(job_dirs, array)
    log_name = "%A_%a_%t_log.out" if array else "%j_%t_log.out"
    output = f"{pattern_literal(root)}/slurm/{log_name}"
    directives = list(request.sbatch)
    if array:
        directives.append(("array", f"0-{len(job_dirs) - 1}%{min(len(job_dirs), request.array_parallelism)}"))
    directives.append(("output", output.replace("%t", "0")))  # the batch step's own output: task 0's file
    if array:
        select = ["# array task i runs the job in job_dirs[i]", "job_dirs=(", *[f"  {shlex.quote(str(d))}"
                  for d in job_dirs], ")", f'export {JOB_DIR_VAR}="${{job_dirs[$SLURM_ARRAY_TASK_ID]}}"']
    else:
        select = [f"export {JOB_DIR_VAR}={shlex.quote(str(job_dirs[0]))}"]
    srun = ["--unbuffered", f"--output={output}", "--kill-on-bad-exit=1", *SRUN_EXPORT_ARGS]
    if request.container_image:
        code = request.code_dir  # the snapshot: in the output dir, except a sweep job's own script's (sweep dir's)
        extra = [_mount(code, code, "slurm.snapshot")] if code and Path(root) not in Path(code).parents else []
        mounts = ",".join([*request.mounts, *extra, _mount(str(root), str(root), "output dir")])
        srun += [f"--container-image={request.container_image}",
                 ShellWord(f'--container-mounts="$HF_HOME:$HF_HOME",{shlex.quote(mounts)}') if request.mount_hf_home
                 else f"--container-mounts={mounts}",
                 f"--container-workdir={request.workdir or root}"]
    srun += request.srun_args
    setup = [request.setup[0], *select, *request.setup[1:]]
    return render_sbatch(directives=directives, setup=setup, srun_args=srun, command=request.command)


def log_root(job_dirs: tp.Sequence[Path], array: bool) -> Path:
    """Where the ``slurm/`` log folder lives: the job dir, or for an array the common parent of its job dirs."""
    if not array:
        return Path(job_dirs[0])
    return Path(os.path.commonpath([str(Path(d).parent) for d in job_dirs]))


def _arrays(plans: tp.Sequence[Plan[Request]], size: int) -> list[tuple[str, list[Plan[Request]]]]:
    """Split one group into arrays of at most ``size`` tasks, each script named after its first job."""
    out = []
    for i in range(0, len(plans), size):
        chunk = list(plans[i:i + size])
        num = chunk[0].job.job_num
        out.append((SCRIPT if not num else f"sbatch_{num}.sh", chunk))
    return out


# ----------------------------------------------------------------------------------------------- the backend


class Slurm(Backend[Request, SlurmRef, Facts]):
    """Slurm: a job per run, a job array per sweep group."""

    name = "slurm"
    wait_setting = ("slurm.detach", False)

    def preflight(self, cfgs: tp.Sequence[TrainConfig]) -> Facts:
        """sbatch's cluster answers (MaxArraySize read from it); container mount sources and ``${VAR}`` references
        of ``env_vars`` exist here. Raises PreflightError / ConfigError naming what is missing."""
        from automodel_hydra.config import host_problems
        from automodel_hydra.paths import write_problems

        conf = os.environ.get("SLURM_CONF")
        ssh = [c.slurm.ssh for c in cfgs if c.slurm is not None and c.slurm.ssh is not None]
        tunnels = {Endpoint.of(tc) for tc in ssh}
        local = len(ssh) < len(cfgs)  # some jobs are submitted here
        if conf and not Path(conf).is_file() and local:
            raise PreflightError(f"SLURM_CONF={conf} is not a file: point it at the cluster's slurm.conf, or unset it "
                                 "on a login node")
        snapshots = find_snapshots(cfgs)
        for cfg in cfgs:
            sc = cfg.slurm
            assert sc is not None
            if self.ranks_see_local_files(cfg) and sc.ssh is None:
                for problem in host_problems(cfg):
                    raise problem
            # the job dir is shared with the nodes (launch/ is written, result.json read back there); a dir outside
            # it may be node-local (/scratch, /tmp) and is not knowable from here
            for problem in write_problems(cfg, everywhere=False):
                raise problem
            # (slurm.hf_home is created by the job itself: a cache dir need not exist before the first download)
            sources = [(f"slurm.extra_mounts[{i}].source", m.source) for i, m in enumerate(sc.extra_mounts)]
            if sc.nemo_volume is not None:
                sources.append(("slurm.nemo_mount.source", sc.nemo_volume.source))
            if sc.container_image is not None and snapshots.get((sc.snapshot, sc.snapshot_max_mb)) is None:
                # no snapshot: this project's source itself is mounted (nemo_mount, else PROJECT_MOUNT)
                sources.append(("slurm.nemo_mount" if sc.nemo_mount and sc.nemo_volume is None else "slurm.snapshot",
                                str(JobSpec.project_root)))
            for key, source in sources:
                if sc.container_image is None or sc.ssh is not None:
                    continue  # (through a tunnel the sources are the cluster's paths, not this host's)
                if not Path(source).exists():
                    raise ConfigError(key, source, "a path that exists on the submitting host (it is mounted into "
                                      "the container)")
                if not os.access(source, os.R_OK | (os.X_OK if Path(source).is_dir() else 0)):
                    raise ConfigError(key, source, "a path the job's user can read (it is mounted into the "
                                      "container, where the ranks read it as this user)")
            if sc.container_image is not None and sc.ssh is None:  # (through a tunnel: the cluster's paths)
                read_mounts(cfg, Path(cfg.output_dir))  # the ranks' local models and data exist here
            tokens = {n: getattr(sc, k) for k, n in TOKEN_FIELDS.items() if getattr(sc, k)}
            fields = {n: k for k, n in TOKEN_FIELDS.items() if getattr(sc, k)}  # HF_TOKEN -> hf_token: the key written
            for entry, var in missing_refs(parse_env_vars({**sc.env_vars, **tokens}, "slurm.env_vars"), os.environ):
                raise UnsetReference(f"slurm.{fields[entry]}" if entry in fields else f"slurm.env_vars.{entry}", var)
        remote = {endpoint: probe(endpoint) for endpoint in sorted(tunnels, key=repr)}
        sizes = [p.max_array_size or DEFAULT_MAX_ARRAY_SIZE for p in remote.values()]
        return Facts(min([*sizes, *([max_array_size()] if local or not sizes else [])]), snapshots,
                     Path.cwd() if remote else None, remote)

    def world_size(self, cfg: TrainConfig, facts: Facts | None = None) -> int:
        assert cfg.slurm is not None
        return cfg.slurm.world_size

    def ranks_see_local_files(self, cfg: TrainConfig) -> bool:
        assert cfg.slurm is not None
        # bare metal: the nodes share this host's filesystem; through a tunnel they see the cluster's
        return cfg.slurm.container_image is None and cfg.slurm.ssh is None

    def plan(self, cfg: TrainConfig, job: JobSpec, facts: Facts | None = None) -> Plan[Request]:
        """Plan one Slurm job (pure): ``launch/sbatch.sh`` for ``cfg.slurm`` and the job dir ``job.job_dir``.

        Raises
        ------
        ValueError
            A value cannot be written into the script: a newline in an ``#SBATCH`` option (sbatch reads one option
            per line), or ``,``/``:`` in a container mount path (Pyxis' ``--container-mounts`` syntax).
        """
        assert cfg.slurm is not None
        facts = facts or Facts()
        remote = _remote(cfg.slurm, facts)
        ranks_job = node_job(job, remote)
        request = _plan_request(cfg, ranks_job, facts.snapshots.get((cfg.slurm.snapshot, cfg.slurm.snapshot_max_mb)),
                                remote)
        wait = cfg.slurm.wait if job.job_num is None else not cfg.slurm.detach
        return Plan(self.name, job, {SCRIPT: render(request, [ranks_job.job_dir])}, request, wait=wait,
                    group_key=request,
                    # slurm.job_name or sbatch_args' job-name; none: sbatch names the job after its script
                    name=str(dict(request.sbatch).get("job-name", SCRIPT)))

    def batches(self, plans: tp.Sequence[Plan[Request]], sweep_dir: Path | None,
                facts: Facts | None = None) -> list[Batch[Request]]:
        """A single run is its own batch; a sweep group is one job array per MaxArraySize tasks, its script in
        ``<sweep dir>/launch/`` (``sbatch.sh``, then ``sbatch_<first job num>.sh`` past MaxArraySize)."""
        if sweep_dir is None:
            return super().batches(plans, sweep_dir)
        groups: dict[tp.Hashable, list[Plan[Request]]] = {}
        for p in plans:
            groups.setdefault(p.group_key, []).append(p)
        out = []
        for group in groups.values():
            for name, chunk in _arrays(group, (facts or Facts()).max_array_size):
                script = launch_dir(sweep_dir) / name
                files = {p.job.launch_dir / n: t for p in chunk for n, t in p.files.items()}
                files[script] = render(chunk[0].request, [node_job(p.job, p.request.remote).job_dir for p in chunk],
                                       array=True)
                out.append(Batch(tuple(chunk), files))
        return out

    def submit(self, batch: Batch[Request]) -> list[Submission[SlurmRef]]:
        """``sbatch`` the batch's script (a job's ``launch/sbatch.sh`` or the sweep's array script); returns at once.
        Raises RuntimeError with sbatch's own message when sbatch fails; TunnelError (one line) when the login node
        of ``slurm.tunnel`` cannot be reached."""
        if batch.plans[0].request.remote is not None:
            return _submit_remote(batch)
        if shutil.which("sbatch") is None:
            raise PreflightError("sbatch is not on PATH: run on a Slurm login node, or make the Slurm client "
                                 "available (HPC: `module load slurm`; Debian/Ubuntu: `apt-get install slurm-client`)")
        dirs = [p.job.job_dir for p in batch.plans]
        own = set(dirs)
        array = [path for path in batch.files if path.parent.parent not in own]
        script = array[0] if array else batch.plans[0].job.launch_dir / SCRIPT
        root = log_root(dirs, bool(array))  # once: it compares every job dir
        (root / "slurm").mkdir(parents=True, exist_ok=True)  # sbatch does not create it
        code = _write_snapshot(batch.plans[0])
        started = time.time()
        stamps = [error_stamps(p.job) for p in batch.plans]  # what an earlier launch left (rank_error)
        job_id = _sbatch(script, batch.plans[0].request.env_refs)
        subs = []
        for i, p in enumerate(batch.plans):
            jid = f"{job_id}_{i}" if array else job_id
            out = root / "slurm" / (f"{job_id}_{i}_0_log.out" if array else f"{job_id}_0_log.out")
            subs.append(Submission(p, SlurmRef(jid, started), log_path=str(out), code=code,
                                   error_stamps=stamps[i]))
        return subs

    def wait(self, subs: tp.Sequence[Submission[SlurmRef]], max_poll_s: float = 30.0,
             lost_after_s: float = 300.0) -> list[JobResult]:
        """Block until every job has a final state (requeues included); a single waited-for job has its rank-0 log
        followed on stdout. One result per submission, with ``<job dir>/result.json`` as the value.

        Slurm is asked (one query for all jobs) after 2 s, then less and less often up to every ``max_poll_s``,
        and at once when a job's result.json appears. A job no tool has known for ``lost_after_s`` ends UNKNOWN."""
        single = len(subs) == 1 and subs[0].plan.job.job_num is None
        follow = _Follower(Path(str(subs[0].log_path)), _remote_reader(subs[0].ref)) if single else None
        results: dict[int, JobResult] = {}
        seen = {i: time.time() for i in range(len(subs))}
        fresh: set[int] = set()
        delay, next_check = 2.0, time.time() + 2.0
        while len(results) < len(subs):
            pending = [i for i in range(len(subs)) if i not in results]
            new = {i for i in pending if i not in fresh and _fresh_result(subs[i])}
            fresh |= new
            if new or time.time() >= next_check:
                infos = self.states([subs[i].ref for i in pending])
                fetch_back([subs[i] for i, info in zip(pending, infos) if info.state.final])
                for i, info in zip(pending, infos):
                    if info.state is not JobState.UNKNOWN:
                        seen[i] = time.time()
                    elif time.time() - seen[i] > lost_after_s:
                        results[i] = JobResult(JobState.UNKNOWN,
                                               error=f"job {subs[i].ref.job_id}: neither sacct nor squeue knows it")
                    if info.state.final:
                        results[i] = _result(subs[i], info.state)
                delay = 2.0 if new else min(delay * 1.5, max_poll_s)
                next_check = time.time() + delay
            if follow is not None:
                follow.poll()
            if len(results) < len(subs):
                time.sleep(1.0)
        if follow is not None:
            follow.poll()
        return [results[i] for i in range(len(subs))]

    def states(self, refs: tp.Sequence[SlurmRef]) -> list[StateInfo]:
        """One ``sacct`` call for all jobs (``squeue`` for those it does not know, or when accounting is off); for
        jobs submitted through ``slurm.tunnel``, the same on their login node, over its one connection. A login
        node that cannot be reached gives UNKNOWN with the reason."""
        from automodel_hydra.backends.slurm_states import query

        out: dict[int, StateInfo] = {}
        for endpoint, idx in _by_endpoint(refs).items():
            ids = [refs[i].job_id for i in idx]
            if endpoint is None:
                found = query(ids)
            else:
                try:
                    found = query(ids, run=_remote_runner(endpoint))
                except TunnelError as e:
                    found = {job_id: StateInfo(JobState.UNKNOWN, str(e)) for job_id in ids}
            out.update({i: found.get(refs[i].job_id, StateInfo(JobState.UNKNOWN)) for i in idx})
        return [out[i] for i in range(len(refs))]

    def cancel(self, refs: tp.Sequence[SlurmRef]) -> None:
        """``scancel`` each job (on its login node for ``slurm.tunnel``, one command for all of them there): it
        checkpoints on SIGTERM, ends CANCELLED and is not requeued."""
        for endpoint, idx in _by_endpoint(refs).items():
            if endpoint is None:
                for i in idx:
                    subprocess.run(["scancel", refs[i].job_id], capture_output=True, env=_submit_env())
            else:
                connect(endpoint).run(shlex.join(["scancel", *(refs[i].job_id for i in idx)]), timeout=60)

    def ref_from_record(self, record: tp.Mapping[str, tp.Any]) -> SlurmRef:
        ref = record.get("ref") or {}
        job_id = ref.get("job_id") or (record.get("job_ids") or [""])[0]
        remote = ref.get("remote")
        return SlurmRef(str(job_id), float(ref.get("submitted_at", 0.0)),
                        RemoteRef(Endpoint.from_record(remote["endpoint"]), str(remote["job_dir"]),
                                  str(remote["log"]), str(remote["local_log"])) if remote else None)


# ----------------------------------------------------------------------------------------------- side effects


def _remote(sc: SlurmConfig, facts: Facts) -> Remote | None:
    """The planned login node of ``sc.tunnel`` (None without one), from what preflight read."""
    tc = sc.ssh
    if tc is None:
        return None
    endpoint = Endpoint.of(tc)
    answered = facts.remote.get(endpoint)
    return Remote(endpoint, tc.job_dir, facts.cwd or Path("/"), tc.python,
                  answered.sbatch_export if answered is not None else "")


def probe(endpoint: Endpoint) -> Probe:
    """Log in to the login node and ask it once for sbatch, MaxArraySize and SBATCH_EXPORT. Raises TunnelError
    (one line) when it does not answer, refuses the key, or has no sbatch."""
    answer = connect(endpoint).probe()
    if answer.sbatch is None:
        raise TunnelError(no_sbatch_line(endpoint))
    return answer


def _by_endpoint(refs: tp.Sequence[SlurmRef]) -> dict[Endpoint | None, list[int]]:
    groups: dict[Endpoint | None, list[int]] = {}
    for i, ref in enumerate(refs):
        groups.setdefault(ref.remote.endpoint if ref.remote is not None else None, []).append(i)
    return groups


def _remote_runner(endpoint: Endpoint) -> tp.Callable[[list[str], float], str]:
    """``slurm_states.query``'s command runner on the login node: stdout, or "" when the command failed."""
    conn = connect(endpoint)

    def run(argv: list[str], timeout_s: float) -> str:
        proc = conn.run(shlex.join(argv), timeout=timeout_s)
        return proc.stdout.decode(errors="replace") if proc.returncode == 0 else ""

    return run


def _remote_reader(ref: SlurmRef) -> tp.Callable[[int], tuple[int, bytes] | None] | None:
    """Reads the job's remote rank-0 log from an offset (:meth:`Connection.read_from`); None for a local job."""
    remote = ref.remote
    if remote is None:
        return None
    return lambda pos: connect(remote.endpoint).read_from(remote.log, pos)


#: What a job submitted through ``slurm.tunnel`` writes back that this machine reads: its result and metrics, its
#: logs, the rank error files and fault-tolerance records, a call job's JobReturn and Hydra's ``.hydra/``. Never
#: a checkpoint, never the code snapshot.
FETCHED = ("result.json", "metrics.jsonl", "*.log", ".hydra", "launch/error.rank*.json", "launch/call_result.pkl",
           "launch/call_error.pkl", f"launch/{TORCHRUN_LOG_DIR}", "launch/ft")


def fetch_back(subs: tp.Sequence[Submission[SlurmRef]]) -> None:
    """Copy what the remote jobs of ``subs`` wrote back into their local dirs (:data:`FETCHED`, and the rank-0
    log), one ``tar`` per login node; local jobs need nothing. A login node that cannot be reached leaves the
    local copies as they are."""
    fetch_jobs([(sub.ref, sub.plan.job.job_dir) for sub in subs])


def fetch_records(records: tp.Sequence[tp.Mapping[str, tp.Any]]) -> None:
    """:func:`fetch_back` for submission records (``automodel-hydra status|report``)."""
    backend = Slurm()
    fetch_jobs([(backend.ref_from_record(r), Path(r["job_dir"])) for r in records if r.get("backend") == "slurm"])


def fetch_jobs(jobs: tp.Sequence[tuple[SlurmRef, Path]]) -> None:
    """:func:`fetch_back` for ``(reference, local job dir)`` pairs."""
    by: dict[Endpoint, list[tuple[PurePosixPath, Path, tp.Sequence[str]]]] = {}
    for ref, job_dir in jobs:
        remote = ref.remote
        if remote is None:
            continue
        node_log = PurePosixPath(remote.log)
        by.setdefault(remote.endpoint, []).extend([
            (PurePosixPath(remote.job_dir), job_dir, FETCHED),
            (node_log.parent, Path(remote.local_log).parent, (node_log.name,))])
    for endpoint, items in by.items():
        try:
            connect(endpoint).fetch(items)
        except TunnelError as e:
            log.warning("the results on %s were not copied back: %s", endpoint.where, e)


def _submit_remote(batch: Batch[Request]) -> list[Submission[SlurmRef]]:
    """``sbatch`` on the login node of ``slurm.tunnel``: first one ``tar`` stream with the batch's launch files and
    (once per sweep, not per job) the code snapshot, then ``sbatch`` there; the local run dir keeps ``.hydra/``,
    ``launch/`` and the records. The variables ``env_vars`` refer to (a token) go from this shell to sbatch's
    environment there on ssh's stdin: never a value in a file, on either side."""
    first = batch.plans[0]
    remote = first.request.remote
    assert remote is not None
    conn = connect(remote.endpoint)
    dirs = [p.job.job_dir for p in batch.plans]
    own = set(dirs)
    array = [path for path in batch.files if path.parent.parent not in own]
    script = array[0] if array else first.job.launch_dir / SCRIPT
    root = log_root(dirs, bool(array))
    node_root = remote.path(root)
    files: dict[PurePosixPath, Path | bytes] = {}
    for path in batch.files:
        files[PurePosixPath(remote.path(path))] = path
    for p in batch.plans:
        for name in (CALL_FILE, RUN_ID_FILE):
            if (p.job.launch_dir / name).is_file():
                files[PurePosixPath(remote.path(p.job.launch_dir / name))] = p.job.launch_dir / name
        if p.job.job_file.is_file():
            files[PurePosixPath(remote.path(p.job.job_file))] = _node_spec(p.job.job_file, remote, [p.job.job_dir,
                                                                                                   root])
    renames = []
    code = None
    source, code_dir = first.request.snapshot, first.job.code_dir
    if source is not None and code_dir is not None:
        node_code = PurePosixPath(remote.path(code_dir))
        key = (remote.endpoint, str(node_code))
        code = _REMOTE_SNAPSHOTS.get(key) if first.job.job_num is not None else None
        if code is None:
            from automodel_hydra.snapshot import LIB_DIR, PACKAGE, SRC_DIR

            tmp = node_code.with_name(f".{node_code.name}.{os.getpid()}.tmp")
            for rel in source.files:
                files[tmp / SRC_DIR / rel] = source.root / rel
            if not source.project_inside:
                package = source.project_root / PACKAGE
                for path in sorted(package.rglob("*")):
                    if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
                        files[tmp / LIB_DIR / PACKAGE / path.relative_to(package).as_posix()] = path
            renames.append((tmp, node_code))
            code = {**source.record(Path(str(node_code))), "host": remote.endpoint.destination}
            if first.job.job_num is not None:
                _REMOTE_SNAPSHOTS[key] = code
    conn.ship(remote.job_dir, files, dirs=[PurePosixPath(node_root) / "slurm"], renames=renames)
    started = time.time()
    job_id = _sbatch_remote(conn, PurePosixPath(remote.path(script)), first.request)
    subs = []
    for i, p in enumerate(batch.plans):
        jid = f"{job_id}_{i}" if array else job_id
        name = f"{job_id}_{i}_0_log.out" if array else f"{job_id}_0_log.out"
        node_log = PurePosixPath(node_root) / "slurm" / name
        ref = SlurmRef(jid, started, RemoteRef(remote.endpoint, str(remote.path(p.job.job_dir)), str(node_log),
                                               str(root / "slurm" / name)))
        subs.append(Submission(p, ref, log_path=f"{remote.endpoint.destination}:{node_log}", code=code))
    return subs


def _node_spec(job_file: Path, remote: Remote, roots: tp.Sequence[Path]) -> bytes:
    """The rank-side spec (``launch/job.yaml``) as the login node's ranks read it: every value that is a path in
    the job's (or sweep's) local dir, ``output_dir`` first, named by its path there. The local file keeps this
    machine's paths."""
    import yaml

    prefixes = [str(r) for r in roots]

    def node(value: tp.Any) -> tp.Any:
        if isinstance(value, str) and any(value == r or value.startswith(r.rstrip("/") + "/") for r in prefixes):
            return str(remote.path(value))
        if isinstance(value, dict):
            return {k: node(v) for k, v in value.items()}
        if isinstance(value, list):
            return [node(v) for v in value]
        return value

    dumper: tp.Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    spec = node(yaml.safe_load(job_file.read_text()))
    return yaml.dump(spec, Dumper=dumper, sort_keys=False).encode()


#: The sweep code dirs this process shipped to a login node, and their records.
_REMOTE_SNAPSHOTS: dict[tuple[Endpoint, str], dict[str, tp.Any]] = {}


def _sbatch_remote(conn: Connection, script: PurePosixPath, request: Request) -> str:
    """``sbatch --parsable SCRIPT`` on the login node, the submitting shell's values of ``request.env_refs`` read
    from stdin into sbatch's environment (never on a command line or in a file). Returns the job id; raises
    SubmitError with sbatch's own message."""
    names = [n for n in dict.fromkeys(request.env_refs) if n in os.environ]
    for name in names:
        if "\n" in os.environ[name] or "\0" in os.environ[name]:
            raise SubmitError(f"${name} holds a line break, which cannot be passed to sbatch through slurm.tunnel")
    site = {"SBATCH_EXPORT": request.remote.sbatch_export} if request.remote is not None else {}
    argv = ["sbatch", "--parsable", *sbatch_export_args(site, request.env_refs), str(script)]
    reads = "".join(f"IFS= read -r {n}; export {n}; " for n in names)
    proc = conn.run(f"{reads}cd {shlex.quote(str(script.parent))} && exec {shlex.join(argv)}",
                    input="".join(os.environ[n] + "\n" for n in names).encode(), timeout=120)
    out, err = proc.stdout.decode(errors="replace"), proc.stderr.decode(errors="replace")
    if proc.returncode != 0:
        said = (err.strip() or out.strip()).splitlines()
        hint = next((h for pattern, h in _SBATCH_HINTS if any(pattern in line for line in said)), "")
        raise SubmitError(f"sbatch {script} on {conn.endpoint.where} failed ({proc.returncode}): "
                          f"{' | '.join(said[-3:])}{hint}")
    try:
        return parse_job_id(out)
    except SubmitError as e:
        raise SubmitError(f"sbatch {script} on {conn.endpoint.where}: {e}") from None


def find_snapshots(cfgs: tp.Sequence[TrainConfig]) -> dict[tuple[str, float], Source | None]:
    """What each distinct ``slurm.snapshot`` setting of ``cfgs`` snapshots from this dir (a container job: none).
    Raises SnapshotError (a ConfigError) naming the field: too large, not a git work tree."""
    from automodel_hydra.snapshot import find

    out: dict[tuple[str, float], Source | None] = {}
    for cfg in cfgs:
        sc = cfg.slurm
        assert sc is not None
        key = (sc.snapshot, sc.snapshot_max_mb)
        live = sc.container_image is not None and sc.nemo_mount and sc.nemo_volume is None
        if key not in out and not live:  # (live: nemo_mount mounts this project's source itself)
            out[key] = find(sc.snapshot, Path.cwd(), JobSpec.project_root, sc.snapshot_max_mb,
                            exclude=[Path(cfg.output_dir)])
    return out


def _write_snapshot(plan: Plan[Request]) -> dict[str, tp.Any] | None:
    """Copy the plan's snapshot to its code dir; its record. A sweep's code dir is written once per process: every
    batch of the sweep (its arrays, and the launches of a sweeper that submits in several batches) shares it."""
    from automodel_hydra.snapshot import write

    source, code_dir = plan.request.snapshot, plan.job.code_dir
    if source is None or code_dir is None:
        return None
    if plan.job.job_num is None or code_dir not in _SWEEP_SNAPSHOTS:
        write(source, code_dir)
        if plan.job.job_num is not None:
            _SWEEP_SNAPSHOTS[code_dir] = source.record(code_dir)
    return _SWEEP_SNAPSHOTS.get(code_dir) or source.record(code_dir)


#: The sweep code dirs this process wrote, and their records.
_SWEEP_SNAPSHOTS: dict[Path, dict[str, tp.Any]] = {}


def max_array_size() -> int:
    """The cluster's MaxArraySize (``scontrol show config``); Slurm's default 1001 when it cannot be read."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return DEFAULT_MAX_ARRAY_SIZE
    m = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.MULTILINE)
    return int(m.group(1)) if m else DEFAULT_MAX_ARRAY_SIZE


def _submit_env() -> dict[str, str]:
    """This environment without the variables of an enclosing Slurm job (submitit's ``clean_env``), keeping
    SLURM_CONF, which names the cluster."""
    drop = ("SLURM_", "SLURMD_", "SRUN_", "SUBMITIT_")
    dist = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    return {k: v for k, v in os.environ.items() if k == "SLURM_CONF" or not (k.startswith(drop) or k in dist)}


#: sbatch's words for a request the cluster cannot meet or for "no cluster to talk to", and what the user is
#: missing (slurm.conf(5): SLURM_CONF names the configuration; a configless cluster answers only on its login nodes).
_SBATCH_HINTS = (
    ("Unable to process configuration file", ": the Slurm configuration cannot be read; set SLURM_CONF to the "
     "cluster's slurm.conf, or submit from a login node"),
    ("Could not establish a configuration source", ": this machine has the Slurm client but no configuration; "
     "set SLURM_CONF to the cluster's slurm.conf, or submit from a login node"),
    ("Invalid generic resource (gres) specification", ": slurm.gpus_per_node (#SBATCH --gpus-per-node) asks for "
     "GPUs that this cluster or partition does not have: leave slurm.gpus_per_node out (no GPU request) or set "
     "it to what the nodes have (sinfo -o '%P %G')"),
    ("Unable to contact slurm controller", ": the Slurm controller does not answer from here; submit from a login "
     "node, or check SLURM_CONF (scontrol ping)"),
    ("resolve", ": the Slurm controller's host name does not resolve here; submit from a login node, or check "
     "SLURM_CONF (scontrol ping)"),
)


def _sbatch(script: Path, env_refs: tp.Sequence[str] = ()) -> str:
    """Submit ``script`` (``sbatch --parsable``, with the ``--export`` a site's SBATCH_EXPORT needs so that the
    job sees ``env_refs``); returns the job id. Raises SubmitError with sbatch's own message on failure."""
    argv = ["sbatch", "--parsable", *sbatch_export_args(os.environ, env_refs), str(script)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=_submit_env())
    if proc.returncode != 0:
        said = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        hint = next((h for pattern, h in _SBATCH_HINTS if any(pattern in line for line in said)), "")
        raise SubmitError(f"sbatch {script} failed ({proc.returncode}): {' | '.join(said[-3:])}{hint}")
    try:
        return parse_job_id(proc.stdout)
    except SubmitError as e:
        raise SubmitError(f"sbatch {script}: {e}") from None


def _fresh_result(sub: Submission[SlurmRef]) -> bool:
    """Whether the job wrote ``result.json`` in this launch (it carries ``launch/run_id``'s id), not a leftover
    of an earlier one. Never from mtimes: the nodes and the file server need not share this host's clock."""
    return written_by_this_launch(sub.plan.job)


def _result(sub: Submission[SlurmRef], state: JobState) -> JobResult:
    if state is JobState.COMPLETED and _fresh_result(sub):
        restarted = fault_tolerance.restart_summary(sub.plan.job.launch_dir)
        if restarted:
            log.warning("slurm job %s completed, %s", sub.ref.job_id, restarted)
        return JobResult(JobState.COMPLETED, read_result(sub.plan.job))
    tail = ""
    copy = sub.ref.remote.local_log if sub.ref.remote is not None else sub.log_path  # a remote log's copy here
    if copy and Path(copy).exists():
        tail = "\n" + "\n".join(Path(copy).read_text(errors="replace").splitlines()[-30:])
    why = "no result.json was written" if state is JobState.COMPLETED else f"Slurm state {state.value}"
    # a hung rank (fault tolerance: its stack is in launch/ft/), else the failed rank's exception
    failed_rank = (fault_tolerance.final_hang(sub.plan.job.launch_dir)
                   or rank_error(sub.plan.job, sub.error_stamps))
    if failed_rank:
        why = f"{failed_rank}; {why}"
    restarts = fault_tolerance.restart_summary(sub.plan.job.launch_dir)
    if restarts:
        why = f"{why}; {restarts}"
    return JobResult(JobState.FAILED if state is JobState.COMPLETED else state,
                     error=f"job {sub.ref.job_id}: {why} (log {sub.log_path}){tail}")


class _Follower:
    """Prints what a log file gains (``tail -f``), from its start; ``read`` reads it elsewhere (a remote log:
    ``(offset, data)`` from an offset, or None while there is none)."""

    def __init__(self, path: Path, read: tp.Callable[[int], tuple[int, bytes] | None] | None = None) -> None:
        self.path, self.pos, self.read = path, 0, read
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")  # a read may end mid-character

    def poll(self) -> None:
        if self.read is not None:
            got = self.read(self.pos)
            if got is None:
                return
            self.pos, data = got
        elif not self.path.exists():
            return
        else:
            with self.path.open("rb") as f:
                f.seek(self.pos)
                data = f.read()
        self.pos += len(data)
        if data:
            sys.stdout.write(self.decoder.decode(data))
            sys.stdout.flush()
