"""Slurm planning, pure: a job's :class:`Request` and its sbatch script, for this machine or a login node.

:func:`plan_request` turns ``cfg.slurm`` and a job into a :class:`Request` in named parts (the code the tasks
import, the rendezvous, the environment, container mounts, the task command); :func:`render` writes a job's or a
job array's script from it (:func:`automodel_hydra.backends.slurm_script.render_sbatch`). Where the job lives is a
:class:`Cluster`: this machine (every path as it is here), or the login node of ``slurm.tunnel``, where each local
run dir is ``job_dir`` plus its path relative to the submitting dir; both are planned with the paths the cluster's
ranks read, so a dry run writes exactly what runs there (:func:`tunnel_spec`: the ranks' ``launch/job.yaml`` with
the login node's paths). Nothing here reads a file, the environment or a clock.

What each srun task runs: the plain worker command, ``python -u -m automodel_hydra.worker
"$AUTOMODEL_JOB_DIR"/launch/job.yaml --log-file ...``, not a pickle runner. Why:

* the script reads as what it does and can be resubmitted by hand (``sbatch launch/sbatch.sh``); the config is
  ``launch/job.yaml``, not a pickle (through a tunnel, ``launch/job.tunnel.yaml``: the same with the login node's
  paths, planned with the script);
* a requeued job must resume from its checkpoint, not report the pickled result of its first attempt;
* the coordinated checkpoint on USR2/SIGTERM is the worker's (every rank, one step);
* a job array needs no per-task pickle in place before it starts: task i reads ``job_dirs[i]``.

With ``fault_tolerance.enabled=true`` srun runs one task per node (``--ntasks-per-node=1``), ``ft_launcher``,
which starts that node's ``ntasks_per_node`` ranks; the launchers meet through c10d rendezvous at MASTER_ADDR:
MASTER_PORT (``--rdzv-id`` = the job id) and restart the worker group in place, in the same allocation and job
(docs/fault-tolerance.md). Once those restarts are spent, the job fails and the rules below apply as without it.

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

import dataclasses
import os
import shlex
import typing as tp
import warnings
from pathlib import Path

from automodel_hydra import agent, fault_tolerance
from automodel_hydra.backends.slurm_config import SlurmConfig, TunnelConfig, home_path
from automodel_hydra.backends.slurm_script import (
    SRUN_EXPORT_ARGS,
    ShellWord,
    array_spec,
    pattern_literal,
    render_sbatch,
)
from automodel_hydra.backends.slurm_transport import Probe
from automodel_hydra.backends.slurm_tunnel import Endpoint, remote_path
from automodel_hydra.bootstrap import PORT_SPAN
from automodel_hydra.envvars import EnvValue, export_lines, parse_env_vars
from automodel_hydra.paths import local_reads, outermost
from automodel_hydra.plan import (
    JOB_FILE,
    LAUNCH_DIR,
    TORCHRUN_LOG_DIR,
    TRACKER_ID_FILE,
    TRACKER_VARS,
    JobSpec,
    Plan,
    call_argv,
    tracker_env,
    worker_argv,
)
from automodel_hydra.profile import nsys_check_lines, nsys_prefix
from automodel_hydra.schema import ConfigError, UserValueError
from automodel_hydra.snapshot import Source

if tp.TYPE_CHECKING:
    from automodel_hydra.config import TrainConfig

SCRIPT = "sbatch.sh"
#: The variable holding the job's output dir inside the script (array task i: ``job_dirs[i]``).
JOB_DIR_VAR = "AUTOMODEL_JOB_DIR"
_JOB_DIR = "/@AUTOMODEL_JOB_DIR@"  # stands for "$AUTOMODEL_JOB_DIR" while argv is built
#: AutoModel's token fields of ``slurm:`` -> the variable the job gets (a reference, never a value in the script).
TOKEN_FIELDS = {"hf_token": "HF_TOKEN", "wandb_key": "WANDB_API_KEY"}
#: Where this project's source is mounted in a container when ``slurm.nemo_mount`` mounts AutoModel's source.
PROJECT_MOUNT = "/opt/automodel-hydra"
#: How a recipe's local model and dataset paths reach a container's ranks (:func:`read_mounts`).
MOUNTED = "mounted (--container-mounts) into"
#: The variable the script sets to the job's requeue count (``SLURM_RESTART_COUNT``, which Slurm sets only once
#: the job was requeued, or 0): nsys names each attempt's report with it (``%q{...}`` needs a set variable).
REQUEUE_VAR = "AUTOMODEL_REQUEUE"
REQUEUE_LINE = (f'export {REQUEUE_VAR}="${{SLURM_RESTART_COUNT:-0}}"'
                "  # requeues so far (sbatch(1)): names attempts' files")
#: Defaults every task gets; the submitting shell's value or an ``env_vars`` entry wins.
TASK_DEFAULTS = {
    "NCCL_DEBUG": "WARN",  # NCCL prints warnings and errors, not its INFO chatter
    "OMP_NUM_THREADS": "${SLURM_CPUS_PER_TASK:-1}",  # srun (unlike torchrun) sets no thread count
}


#: The ranks' spec under ``slurm.tunnel`` (``launch/job.tunnel.yaml``): ``launch/job.yaml`` with the login node's
#: paths, planned with the script and read by the ranks there under this name.
TUNNEL_JOB_FILE = "job.tunnel.yaml"


@dataclasses.dataclass(frozen=True)
class Cluster:
    """Where planned jobs are submitted and live (pure). ``endpoint`` None: this machine, whose nodes see its paths
    as they are. Else the login node of ``slurm.tunnel`` (docs/remote.md): each local run dir is ``job_dir`` plus
    its absolute path here (:func:`slurm_tunnel.remote_path`), whatever dir the command runs from.

    ``python`` is the ranks' interpreter on bare metal; ``sbatch_export`` the ``SBATCH_EXPORT`` that ``sbatch``
    sees there (None: the submitting shell's own, read where sbatch runs), ``sbatch_vars`` likewise the names of
    the ``SBATCH_*`` variables set there; ``reconnect_timeout_s`` how long a
    launcher following the jobs tries to reach the login node again."""

    endpoint: Endpoint | None = None
    job_dir: str = ""
    python: str = "python"
    sbatch_export: str | None = None
    reconnect_timeout_s: float = 0.0
    #: the ``SBATCH_*`` variables set where sbatch runs (names; None: this machine's, read when it runs)
    sbatch_vars: tuple[str, ...] | None = None

    @classmethod
    def of(cls, tc: TunnelConfig | None, python_here: str, answered: Probe | None = None) -> Cluster:
        """The cluster of a ``slurm.tunnel`` section (None: this machine, whose ranks run ``python_here``), from
        what the login node answered at preflight: a ``~`` in ``job_dir`` or
        ``python`` is the login node's ``$HOME``. Raises ConfigError naming the field when that home is not known
        (planned without a preflight, or the login shell has no ``$HOME``)."""
        if tc is None:
            return cls(python=python_here)
        home = answered.home if answered is not None else None
        return cls(Endpoint.of(tc), _there_home(tc.job_dir, home, "slurm.tunnel.job_dir"),
                   _there_home(tc.python, home, "slurm.tunnel.python"),
                   answered.sbatch_export if answered is not None else "", tc.reconnect_timeout_s,
                   answered.sbatch_vars if answered is not None else ())

    @property
    def local_paths(self) -> bool:
        """Whether the ranks see this machine's paths as they are (no tunnel): its checkout, its submitting dir,
        a call job's pickled job dir."""
        return self.endpoint is None

    @property
    def spec_file(self) -> str:
        """The name of the spec the ranks read in the job's launch dir."""
        return JOB_FILE if self.local_paths else TUNNEL_JOB_FILE

    def path(self, local: Path | str) -> Path:
        """The cluster's path of a local run dir or of a path in it (this machine: the path itself)."""
        return Path(local) if self.local_paths else Path(str(remote_path(local, self.job_dir)))

    def job(self, job: JobSpec) -> JobSpec:
        """``job`` with the paths the ranks see: its dirs on the cluster."""
        return dataclasses.replace(job, job_dir=self.path(job.job_dir),
                                   workdir=self.path(job.workdir) if job.workdir is not None else None,
                                   code_dir=self.path(job.code_dir) if job.code_dir is not None else None)

    def ranks_path(self, job: JobSpec, path: Path) -> str | None:
        """Where the ranks of ``job`` write ``path`` through ``slurm.tunnel``: ``user@host:PATH`` there (a path in
        the job's dir, or a sweep job's sweep dir, is the cluster's copy of it, as :func:`tunnel_spec` plans it;
        any other is the cluster's own, as written); None on this machine's cluster (the nodes share its paths)."""
        if self.endpoint is None:
            return None
        roots = [job.job_dir, *([job.job_dir.parent] if job.job_num is not None else [])]
        inside = any(path == root or root in path.parents for root in roots)
        return f"{self.endpoint.destination}:{self.path(path) if inside else path}"

    def code_record(self, source: Source, code_dir: Path) -> dict[str, tp.Any]:
        """What a submission record says of the snapshot the jobs run (at ``code_dir`` there), and on which host."""
        host = {"host": self.endpoint.destination} if self.endpoint is not None else {}
        return {**source.record(code_dir), **host}


def _there_home(value: str, home: str | None, key: str) -> str:
    """``value`` with a leading ``~`` as the login node's ``home`` (``~/jobs`` -> ``/home/me/jobs``)."""
    if not home_path(value):
        return value
    if not home or not home.startswith("/"):
        raise ConfigError(key, value, "an absolute path: the login node's home is not known here (its login shell "
                          "set no $HOME), so a ~ cannot be read as it")
    return home.rstrip("/") + value[1:] if value != "~" else home


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
    #: where the job is submitted and lives (this machine, or the login node of ``slurm.tunnel``)
    cluster: Cluster = Cluster()
    #: script lines after srun: the requeue hook (:func:`requeue_hook_lines`)
    after: tuple[str, ...] = ()


def _sh(arg: str) -> str:
    """Quote one argument for bash, turning the job-dir stand-in into ``"$AUTOMODEL_JOB_DIR"``."""
    parts = str(arg).split(_JOB_DIR)
    return f'"${JOB_DIR_VAR}"'.join(shlex.quote(p) if p or len(parts) == 1 else "" for p in parts)


def _directives(sc: SlurmConfig, extra: tp.Mapping[str, object] | None = None) -> tuple[tuple[str, object], ...]:
    """``cfg.slurm`` as sbatch options (sbatch(1) long names), in the order they are written; unset ones left out.
    ``extra``: the recipe kind's own (AutoModel's template's ``--mail-type``:
    :attr:`automodel_hydra.recipe_kind.RecipeKind.sbatch_options`). ``sbatch_args`` come last and may add or
    change any option (null = a bare flag, false = left out)."""
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
        **(extra or {}),
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


def plan_request(cfg: TrainConfig, job: JobSpec, source: Source | None = None,
                 cluster: Cluster = Cluster()) -> Request:
    """The request of one job (pure): ``job`` has the cluster's paths (:meth:`Cluster.job`), ``source`` is the
    snapshot preflight found (None: none). Raises ConfigError naming the key for a value that cannot be planned
    (a literal token), UserValueError for a mount path ``--container-mounts`` cannot write."""
    sc = cfg.slurm
    assert sc is not None, "the slurm backend plans configs with a slurm: section"
    in_container = sc.container_image is not None
    if job.code_dir is None or (in_container and sc.nemo_mount and sc.nemo_volume is None):
        source = None  # (a container path in nemo_mount: this project's live source is mounted there instead)
    if in_container and source is None and not cluster.local_paths and sc.nemo_mount and sc.nemo_volume is None:
        raise ConfigError("slurm.nemo_mount", sc.nemo_mount, "AutoModel's '/src:/dst' form with a source on the "
                          "cluster, or null: a container path mounts this machine's checkout, which the nodes of "
                          "slurm.tunnel do not have (without it the code snapshot is shipped and mounted)")
    # in a container: what the task puts first on PYTHONPATH inside it (container_pythonpath has the rule)
    project_mounted = source is None and cluster.local_paths  # this machine's checkout, mounted
    inside = container_pythonpath(sc, source, job.code_dir, project_mounted) if in_container else []
    spec = JobSpec(Path(_JOB_DIR), job.job_name)  # the job's paths inside the script
    env = _job_env(sc)
    _warn_ignored(sc)
    setup = [*_code_lines(cfg, job, source, cluster, inside), *_environment_lines(cfg, job, env)]
    mounts = _container_mounts(cfg, job, project_mounted) if in_container else []
    if not in_container:  # nsys runs in the batch step's environment; in a container the task checks it there
        setup += nsys_check_lines(cfg.profile.nsys, _sh(str(spec.log_file)))
    if sc.setup:
        setup += ["# slurm.setup", *sc.setup]
    if in_container and sc.hf_home:  # mounted at srun: the source must exist (env_vars or setup may have moved it)
        setup.append('mkdir -p "$HF_HOME"')
    if job.workdir is not None:
        setup.append(f"cd {shlex.quote(str(job.workdir))}  # hydra.job.chdir")
    if sc.chdir is not None:
        setup.append(f"cd {node_path(sc.chdir)}  # slurm.chdir")
    call = job.call is not None
    command, srun_args, lines = _task(cfg, spec, "python" if in_container else cluster.python, cluster.spec_file,
                                      call)
    setup += lines
    if in_container:  # run inside the image: PYTHONPATH (an image's own ENV wins over the host's) and nsys there
        command = f"{task_prologue(inside, nsys_check_lines(cfg.profile.nsys, _sh(str(spec.log_file))))} {command}"
    directives = tuple((k, v) for k, v in _directives(sc, cfg.kind.sbatch_options) if not (call and k == "signal"))
    after = () if call or in_container else requeue_hook_lines(cluster.python)
    return Request(sbatch=directives, array_parallelism=sc.array_parallelism, setup=tuple(setup),
                   container_image=sc.container_image, mounts=tuple(mounts),
                   mount_hf_home=in_container and bool(sc.hf_home),
                   srun_args=(*(("--ntasks=1",) if call else ()), *srun_args, *sc.srun_args),
                   command=command,
                   env_refs=(*dict.fromkeys(r.name for e in env for r in e.refs),
                             *(n for k, n in TOKEN_FIELDS.items() if getattr(sc, k) is None)),
                   snapshot=source, cluster=cluster,
                   code_dir=str(job.code_dir) if in_container and source is not None else None,
                   workdir=sc.chdir if in_container else None, after=after)


def requeue_hook_lines(python: str) -> tuple[str, ...]:
    """The batch script's lines after srun (bare metal): the requeue hook (:mod:`automodel_hydra.retry`) decides
    whether a failed attempt is requeued, by ``failure_budget``; the script exits with the step's status."""
    return ("status=$?",
            "# failure_budget: requeue a failed attempt while its class has retries left (docs/failures.md)",
            f'{_sh(python)} -m automodel_hydra.retry "${JOB_DIR_VAR}" "$status"',
            'exit "$status"')


#: What an array's requeue hook is given as well: the array's task ids and their job dirs, so that a node it
#: blames is left out of the tasks still pending, each recorded in its own job dir (:mod:`automodel_hydra.retry`).
ARRAY_HOOK_ARGS = ' --array "${!job_dirs[@]}" -- "${job_dirs[@]}"'


def _array_hook(after: tp.Sequence[str]) -> tuple[str, ...]:
    return tuple(line + ARRAY_HOOK_ARGS if " -m automodel_hydra.retry " in line else line for line in after)


def _code_lines(cfg: TrainConfig, job: JobSpec, source: Source | None, cluster: Cluster,
                inside: tp.Sequence[str]) -> list[str]:
    """The script's first lines: what the job is, the code its tasks import (the snapshot, this project's
    checkout, the container's copy, or the cluster's install), the rendezvous (a recipe job), and where a task
    starts when the submitting dir is not on the cluster."""
    sc = cfg.slurm
    assert sc is not None
    call = job.call is not None
    if call:
        head = (f"# {sc.job_name}: one task running the Hydra job's task function (launch/call.pkl); planned by "
                "automodel-hydra")
    else:
        head = (f"# {sc.job_name}: {sc.nodes} node(s) x {sc.ntasks_per_node} task(s) = world size {sc.world_size}; "
                "planned by automodel-hydra")
    if source is not None and job.code_dir is not None:
        code = _snapshot_lines(source, job.code_dir)
    elif sc.container_image is not None and inside:  # the host's PYTHONPATH means nothing there; the task sets it
        code = [f"export PYTHONPATH={':'.join(shlex.quote(e) for e in inside)}"]
    elif sc.container_image is not None:  # slurm.tunnel, slurm.snapshot: none: this machine's checkout is not there
        code = ["# PYTHONPATH: automodel_hydra is expected to be installed in the image"]
    elif not cluster.local_paths:  # this machine's checkout means nothing on the cluster (slurm.snapshot: none)
        code = ["# PYTHONPATH: automodel_hydra is expected to be installed on the cluster"]
    else:
        code = [f"export PYTHONPATH={shlex.quote(str(job.project_root))}${{PYTHONPATH:+:$PYTHONPATH}}"]
    lines = [head, *code, "export PYTHONUNBUFFERED=1", REQUEUE_LINE, *([] if call else _rendezvous_lines(sc))]
    if not cluster.local_paths:
        if call:  # the call's Hydra job writes the job dir there, not this machine's path
            lines.append(f'export AUTOMODEL_CALL_DIR="${JOB_DIR_VAR}"')
        start = source.pythonpath(job.code_dir)[0] if source is not None and job.code_dir is not None else job.job_dir
        lines.append(f"cd {shlex.quote(str(start))}  # slurm.tunnel: tasks start in "
                     + ("the snapshot's copy of the submitting dir" if source is not None else "the job dir"))
    return lines


def _rendezvous_lines(sc: SlurmConfig) -> list[str]:
    """The batch step's MASTER_ADDR/MASTER_PORT (the runtime contract of the module docstring), the requeue budget
    and the task defaults."""
    margin = []
    if sc.checkpoint_margin_s != sc.signal_delay_s:
        margin = [f"# checkpoint margin {sc.checkpoint_margin_s}s: slurm.signal_delay_s={sc.signal_delay_s}s does "
                  f"not fit twice in slurm.time={sc.time}"]
    return [
        f"export AUTOMODEL_MAX_REQUEUES={sc.max_requeues}  # requeues of any cause (slurm.max_requeues)",
        *margin,
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


def _job_env(sc: SlurmConfig) -> list[EnvValue]:
    """``slurm.env_vars`` with AutoModel's token fields as references to the submitting shell's variables.
    Raises ConfigError for a token given as a literal value."""
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
    return env


def _warn_ignored(sc: SlurmConfig) -> None:
    for key in ("command", "job_dir", "repo_root"):
        if getattr(sc, key) is not None:
            warnings.warn(f"slurm.{key} is set by AutoModel's own CLI for its sbatch script; here every task runs "
                          "the worker and the run dir keeps the script, config and logs: it is ignored", stacklevel=3)


def _environment_lines(cfg: TrainConfig, job: JobSpec, env: tp.Sequence[EnvValue]) -> list[str]:
    """The job's tracker run, Hydra's ``env_set``, AutoModel's template settings, HF_HOME and ``slurm.env_vars``,
    in that order (a later one wins)."""
    sc = cfg.slurm
    assert sc is not None
    lines = tracker_lines(job)
    if job.env:
        lines += ["# hydra.job.env_set", *(f"export {k}={shlex.quote(v)}" for k, v in job.env)]
    if cfg.kind.task_env:
        lines += ["# AutoModel's template settings (the submitting shell's value or slurm.env_vars wins)",
                  *[f'export {k}="${{{k}:-{v}}}"' for k, v in cfg.kind.task_env.items()]]
    if sc.hf_home:
        lines.append(f"export HF_HOME={node_path(sc.hf_home)}  # slurm.hf_home")
    if env:
        lines += ["# slurm.env_vars (\"${VAR}\" = the submitting shell's variable, expanded here)", *export_lines(env)]
    return lines


def tracker_lines(job: JobSpec) -> list[str]:
    """The batch script's exports of the job's tracker run (:func:`automodel_hydra.plan.tracker_env`): the id read
    from the job dir's ``launch/tracker_id`` when the task starts (every task of an array runs one script: task i
    reads job i's), the rest as values; before ``hydra.job.env_set`` and ``slurm.env_vars``, which win."""
    env = dict(tracker_env(job))
    if not env:
        return []
    ident = TRACKER_VARS["id"]
    return ["# one W&B run per job for its whole life, requeues and in-job restarts included: launch/tracker_id",
            f'export {ident}="$(< "${JOB_DIR_VAR}/{LAUNCH_DIR}/{TRACKER_ID_FILE}")"',
            *(f"export {k}={shlex.quote(v)}" for k, v in env.items() if k != ident)]


def _container_mounts(cfg: TrainConfig, job: JobSpec, project_mounted: bool) -> list[str]:
    """A container job's ``--container-mounts`` besides its output dirs and HF_HOME: AutoModel's source, this
    project's checkout (``project_mounted``: no snapshot, on this machine's cluster), ``extra_mounts`` and the
    recipe's local models and data (:func:`read_mounts`)."""
    sc = cfg.slurm
    assert sc is not None
    volume = sc.nemo_volume
    mounts = []
    if volume is not None:  # AutoModel's source; this project's comes from the snapshot, else mounted beside it
        mounts.append(_mount(volume.source, volume.dest, "slurm.nemo_mount"))
    if project_mounted:
        mounts.append(_mount(str(job.project_root), sc.nemo_mount if sc.nemo_mount and volume is None
                             else PROJECT_MOUNT, "slurm.nemo_mount"))
    mounts += [_mount(m.source, m.dest, f"slurm.extra_mounts[{i}]") for i, m in enumerate(sc.extra_mounts)]
    return mounts + read_mounts(cfg, job.job_dir, check_here=False)


def _task(cfg: TrainConfig, spec: JobSpec, python: str, spec_file: str, call: bool
          ) -> tuple[str, tuple[str, ...], list[str]]:
    """What each task runs: ``(command, srun arguments, setup lines it needs)``, ``spec`` with the script's
    paths. A recipe job runs the worker on ``launch/<spec_file>`` (with ``fault_tolerance.enabled``, one
    ``ft_launcher`` per node that starts the node's ranks: docs/fault-tolerance.md), a call job (``call``)
    ``automodel_hydra.call``; nsys wraps either."""
    sc = cfg.slurm
    assert sc is not None
    ft = cfg.fault_tolerance.enabled and not call
    # every requeue (and under ft_launcher every in-job restart) keeps its own report
    attempts = (("requeue", REQUEUE_VAR), *((("attempt", "TORCHELASTIC_RESTART_COUNT"),) if ft else ()))
    prefix = nsys_prefix(cfg.profile.nsys, _JOB_DIR, spec.job_name, rank_var="RANK" if ft else "SLURM_PROCID",
                         attempt_vars=attempts)
    argv = call_argv(spec, python=python) if call else worker_argv(
        spec, python=python, spec_file=spec_file, started_by="ft_launcher" if ft else "srun", scheduler="slurm")
    command = " ".join(_sh(a) for a in [*prefix, *argv])
    if not ft:
        return command, (), []
    lines = []
    bare = sc.container_image is not None or "/" not in python  # a python found on PATH: its ft_launcher too
    launcher = "ft_launcher" if bare else str(Path(python).parent / "ft_launcher")
    if not bare:  # the nodes share this machine's install (bare metal): found here, missing is one line
        line = fault_tolerance.missing_launcher_line(f"at {launcher} on the nodes")
        lines.append(f"[ -x {shlex.quote(launcher)} ] || {{ echo {shlex.quote('error: ' + line)} | tee -a "
                     f"{_sh(str(spec.log_file))} >&2; exit 1; }}")
    lines.append("# fault tolerance: in-job restarts keep the allocation, the job id and the rendezvous")
    # ft_launcher creates its --log-dir with check-then-create (no exist_ok): two launchers on one host race
    # to it and one dies with FileExistsError, so the dir exists before they start
    lines.append(f"mkdir -p {_sh(str(spec.launch_dir / TORCHRUN_LOG_DIR))}")
    # run by automodel_hydra.agent: ft_launcher's own output goes to launch/agent.<host>.log, one per node
    command = " ".join([*map(_sh, agent.argv(spec.launch_dir, fault_tolerance.LAUNCHER, python)),
                        *map(_sh, fault_tolerance.ft_args(cfg.fault_tolerance)),
                        f"--nnodes={sc.nodes}", f"--nproc-per-node={sc.ntasks_per_node}", "--rdzv-backend=c10d",
                        '--rdzv-endpoint="${MASTER_ADDR}:${MASTER_PORT}"', '--rdzv-id="${SLURM_JOB_ID}"',
                        # each launcher makes its own <run id>_<random>/ under it: nodes never collide
                        _sh(f"--log-dir={spec.launch_dir / TORCHRUN_LOG_DIR}"),
                        *(["--no-python"] if prefix else []),
                        " ".join(_sh(a) for a in ([*prefix, *argv] if prefix else argv[2:]))])
    srun = (f"--ntasks={sc.nodes}", "--ntasks-per-node=1", ShellWord('--cpus-per-task="${SLURM_CPUS_ON_NODE}"'))
    return command, srun, lines


def container_pythonpath(sc: SlurmConfig, source: Source | None, code_dir: Path | None,
                         project_mounted: bool = True) -> list[str]:
    """What a task in ``slurm.container_image`` puts first on ``PYTHONPATH``, so that a stock image (NeMo's, which
    lacks this project) runs the worker: the code snapshot's entries (:meth:`snapshot.Source.pythonpath`: its dir
    is under the run's launch dir, mounted at the same path), else this project's source mounted at
    ``nemo_mount`` (a container path) or :data:`PROJECT_MOUNT` (``project_mounted``; through ``slurm.tunnel`` this
    machine's checkout is not there to mount: the image has the project); then AutoModel's source for its
    ``nemo_mount: "/src:/dst"`` form."""
    volume = sc.nemo_volume
    if source is not None and code_dir is not None:
        entries = source.pythonpath(code_dir)
    else:
        entries = [sc.nemo_mount if sc.nemo_mount and volume is None else PROJECT_MOUNT] if project_mounted else []
    return entries + ([volume.dest] if volume is not None else [])


def task_prologue(pythonpath: tp.Sequence[str], checks: tp.Sequence[str] = ()) -> str:
    """The words that start a task's command inside a container (AutoModel's template likewise runs its command
    with ``bash -c`` in the container, ``PYTHONPATH`` set there): ``bash -c '<lines>; exec "$@"' automodel-hydra``,
    followed by the command. The lines put ``pythonpath`` before the container's own ``PYTHONPATH`` (Pyxis gives a
    variable the image defines the image's value, not the one exported in the batch script), then run ``checks``
    (shell lines that exit with an error where the task runs, e.g. :func:`automodel_hydra.profile.nsys_check_lines`).
    """
    entries = ":".join(pythonpath)
    first = [f"export PYTHONPATH={shlex.quote(entries)}${{PYTHONPATH:+:$PYTHONPATH}}"] if entries else []
    lines = [*first, *checks, 'exec "$@"']
    return f"bash -c {shlex.quote('; '.join(lines))} automodel-hydra"


def _snapshot_lines(source: Source, code_dir: Path) -> list[str]:
    """The script's lines that make every task import the snapshot at ``code_dir`` (:mod:`automodel_hydra.snapshot`):
    its copies first on PYTHONPATH, the dir a task starts in off ``sys.path`` (PYTHONSAFEPATH), and where the copy's
    source was (a call job maps its pickled ``sys.path`` onto the copy)."""
    from automodel_hydra.snapshot import CODE_ROOT_VAR, CODE_SRC_VAR, SRC_DIR

    what = f"commit {source.commit[:12]}" if source.commit else "no commit"
    state = {True: ", with uncommitted changes", False: ", clean", None: ""}[source.dirty]
    head = (f"# code: the snapshot taken at submission ({what}{state} of {source.root})" if source.kind == "git"
            else f"# code: the snapshot taken at submission (a copy of {source.root})")
    entries = ":".join(shlex.quote(e) for e in source.pythonpath(code_dir))
    return [head, f"export PYTHONPATH={entries}${{PYTHONPATH:+:$PYTHONPATH}}",
            "export PYTHONSAFEPATH=1  # the dir a task starts in is not on sys.path: the snapshot's copy is",
            f"export {CODE_ROOT_VAR}={shlex.quote(str(source.root))} "
            f"{CODE_SRC_VAR}={shlex.quote(str(code_dir / SRC_DIR))}"]


def render(request: Request, job_dirs: tp.Sequence[Path], array: bool = False,
           ids: tp.Sequence[int] | None = None) -> str:
    """The sbatch script for one job (``array=False``) or for a job array whose task ``ids[i]`` (default i) runs
    ``job_dirs[i]`` (:func:`task_ids`).

    Logs go to ``<root>/slurm/%j_%t_log.out`` (arrays: ``%A_%a_%t``), root = the job dir, or for an array the
    common parent of its job dirs. Raises ValueError naming the option (slurm_script.render_sbatch's rules)."""
    root = log_root(job_dirs, array)
    log_name = "%A_%a_%t_log.out" if array else "%j_%t_log.out"
    output = f"{pattern_literal(root)}/slurm/{log_name}"
    directives = list(request.sbatch)
    tasks = list(ids) if ids is not None else list(range(len(job_dirs)))
    if array:
        directives.append(("array", f"{array_spec(tasks)}%{min(len(job_dirs), request.array_parallelism)}"))
    directives.append(("output", output.replace("%t", "0")))  # the batch step's own output: task 0's file
    if array and tasks == list(range(len(job_dirs))):
        select = ["# array task i runs the job in job_dirs[i]", "job_dirs=(", *[f"  {shlex.quote(str(d))}"
                  for d in job_dirs], ")", f'export {JOB_DIR_VAR}="${{job_dirs[$SLURM_ARRAY_TASK_ID]}}"']
    elif array:
        select = ["# array task i runs the job in job_dirs[i]", "job_dirs=(", *[f"  [{t}]={shlex.quote(str(d))}"
                  for t, d in zip(tasks, job_dirs)], ")", f'export {JOB_DIR_VAR}="${{job_dirs[$SLURM_ARRAY_TASK_ID]}}"']
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
    return render_sbatch(directives=directives, setup=setup, srun_args=srun, command=request.command,
                         after=_array_hook(request.after) if array else request.after)


def log_root(job_dirs: tp.Sequence[Path], array: bool) -> Path:
    """Where the ``slurm/`` log folder lives: the job dir, or for an array the common parent of its job dirs."""
    if not array:
        return Path(job_dirs[0])
    return Path(os.path.commonpath([str(Path(d).parent) for d in job_dirs]))


def arrays(plans: tp.Sequence[Plan[Request]], size: int) -> list[tuple[str, list[Plan[Request]]]]:
    """Split one group into arrays of at most ``size`` tasks, each script named after its first job."""
    out = []
    for i in range(0, len(plans), size):
        chunk = list(plans[i:i + size])
        num = chunk[0].job.job_num
        out.append((SCRIPT if not num else f"sbatch_{num}.sh", chunk))
    return out


def tunnel_spec(cfg: TrainConfig, job: JobSpec, cluster: Cluster) -> str:
    """The ranks' spec for a login node (``launch/job.tunnel.yaml``): :func:`automodel_hydra.config.rank_spec`
    with every value that is a path in the job's local dir (and, for a sweep's job, the sweep dir holding it),
    ``output_dir`` first, named by the cluster's path. The local ``launch/job.yaml`` keeps this machine's."""
    import yaml

    from automodel_hydra.config import rank_spec

    roots = [str(job.job_dir), *([str(job.job_dir.parent)] if job.job_num is not None else [])]

    def there(value: tp.Any) -> tp.Any:
        if isinstance(value, str) and any(value == r or value.startswith(r.rstrip("/") + "/") for r in roots):
            return str(cluster.path(value))
        if isinstance(value, dict):
            return {k: there(v) for k, v in value.items()}
        if isinstance(value, list):
            return [there(v) for v in value]
        return value

    dumper: tp.Any = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
    head = (f"# {job.job_name!r} on the cluster of slurm.tunnel: launch/job.yaml with the login node's paths, "
            f"read by the ranks at {cluster.path(job.launch_dir / TUNNEL_JOB_FILE)}\n")
    return head + yaml.dump(there(rank_spec(cfg)), Dumper=dumper, sort_keys=False)
