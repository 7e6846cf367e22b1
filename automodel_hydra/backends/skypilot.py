"""SkyPilot backend: one task per job; a managed job (``sky.jobs.launch``) when ``use_spot``, so preemptions are
recovered, else ``sky.launch`` on a named cluster that stops itself when idle. Every key of NeMo AutoModel's
``skypilot:`` section works with AutoModel's meaning; docs/skypilot.md has the table of keys, AutoModel's defaults
and ours, and the facts of SkyPilot 0.14.1 relied on.

The contract's steps (:mod:`automodel_hydra.plan`):

* :meth:`SkyPilot.preflight` reads what planning needs from this machine and returns it as :class:`Facts`: the
  per-user bucket name for ``checkpoint_bucket: auto`` (user and host name), which of ``HF_TOKEN`` /
  ``WANDB_API_KEY`` are set (names only), and each ``job_dir`` as an absolute path.
* :func:`make_plan` is pure (no ``import sky``, reads only its arguments): ``launch/sky_task.yaml`` (the task) and
  ``launch/job.sky.yaml`` (the rank-side spec with node paths, mounted at ``~/automodel/<key>/launch/job.yaml``).
* :meth:`SkyPilot.check` runs SkyPilot's own schema and ``sky.Task`` construction on every planned task and
  expands every shell reference in this shell (an unset one fails, naming the field), before anything is written.
* :meth:`SkyPilot.submit` first asks SkyPilot in this process whether the task's cloud has credentials (what
  ``sky check`` asks), so a machine without them fails in seconds without starting SkyPilot's local API server;
  a launch that fails after that server was started by this launch stops it again (``sky.api_stop``).

Node paths hang off the run key (:func:`run_key`), which a managed job keeps across recoveries. With a bucket
(required for spot) the output dir and checkpoints live in ``<checkpoint_mount>/<key>``, mounted ``MOUNT_CACHED``;
a recovered job runs the same command on fresh nodes, finds ``checkpoints/latest`` there and resumes. Without:
``~/automodel/<key>`` on the node's disk. A failing ``setup`` line fails the launch (``set -eo pipefail``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import hashlib
import logging
import os
import shlex
import socket
import typing as tp
import warnings
from pathlib import Path

import yaml

from automodel_hydra import fault_tolerance
from automodel_hydra.backends.skypilot_config import CANNOT_STOP as CANNOT_STOP
from automodel_hydra.backends.skypilot_config import SKYPILOT_CLOUDS as SKYPILOT_CLOUDS
from automodel_hydra.backends.skypilot_config import SkyPilotConfig as SkyPilotConfig
from automodel_hydra.backends.skypilot_config import sky_name
from automodel_hydra.backends.skypilot_env import SECRET_FIELDS, EnvEntry, task_env
from automodel_hydra.backends.skypilot_sdk import RESULT_MARK as RESULT_MARK
from automodel_hydra.backends.skypilot_sdk import STATE as STATE
from automodel_hydra.backends.skypilot_sdk import TASK_FILE as TASK_FILE
from automodel_hydra.backends.skypilot_sdk import SkyPilotPlanError as SkyPilotPlanError
from automodel_hydra.backends.skypilot_sdk import SkyRef as SkyRef
from automodel_hydra.backends.skypilot_sdk import parse_result as parse_result
from automodel_hydra.envvars import expand, parse
from automodel_hydra.fault_tolerance import FaultToleranceConfig
from automodel_hydra.plan import Backend, Batch, JobResult, JobSpec, Plan, Submission, job_batch, tracker_env
from automodel_hydra.profile import nsys_prefix
from automodel_hydra.schema import ConfigError
from automodel_hydra.states import JobState, StateInfo

if tp.TYPE_CHECKING:
    from automodel_hydra.config import TrainConfig

log = logging.getLogger(__name__)

NODE_JOB_FILE = "job.sky.yaml"
#: Why a Hydra task function that is not ours (a call job, automodel_hydra.call) does not run on SkyPilot.
CALL_REFUSAL = ("a task function not declared @automodel_hydra.driver.launchable runs on interactive or slurm only: "
                "on a SkyPilot node its Hydra job dir (.hydra/, its log, every file it writes) would be on the "
                "cloud node, not in the sweep dir here, and its own modules and Python packages are not there; "
                "use hydra.launcher.backend=interactive|slurm, or declare the function @launchable")
#: Seconds between status polls in :func:`wait`.
POLL_S = 15.0


@dataclasses.dataclass(frozen=True)
class Facts:
    """What :meth:`SkyPilot.preflight` read on the submitting machine, so that planning reads nothing.

    ``auto_bucket``: the bucket for ``checkpoint_bucket: auto`` (:func:`default_bucket`); ``set_vars``: which of
    ``HF_TOKEN`` / ``WANDB_API_KEY`` are set in this shell (names only, never values); ``job_dirs``: each
    ``skypilot.job_dir`` as written -> the absolute dir it means here; ``paths``: ``data.path`` and a local
    ``model.name_or_path`` as written, and another recipe's local model and dataset paths
    (:func:`automodel_hydra.paths.local_reads`) -> the absolute path uploaded to the nodes."""

    auto_bucket: str
    set_vars: frozenset[str] = frozenset()
    job_dirs: tp.Mapping[str, str] = dataclasses.field(default_factory=dict)
    paths: tp.Mapping[str, str] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Request:
    """What :meth:`SkyPilot.submit` needs. ``task`` is the planned dict: values with a shell reference appear as
    ``null`` (secrets by name only); ``env`` holds them, expanded at launch, in memory."""

    task: dict[str, tp.Any]
    env: tuple[EnvEntry, ...]
    managed: bool  # sky.jobs.launch (use_spot) vs sky.launch
    name: str  # run key: task name, managed job name
    cluster_name: str | None
    idle_minutes_to_autostop: int | None
    down: bool
    cloud: str | None  # whose credentials submit checks first (None: any cloud SkyPilot knows)
    copy_dir: str | None = None  # <job_dir>/<key>: a second copy of the task files

    @property
    def secrets(self) -> tuple[tuple[str, str], ...]:
        """(secret name, config key) of every secret of the task."""
        return tuple((e.name, e.key) for e in self.env if e.secret)


# ----------------------------------------------------------------------------------------------- names and paths



def run_key(sc: SkyPilotConfig, job: JobSpec) -> str:
    """The run's name on the cloud (task, managed job, default cluster, bucket dir ``<checkpoint_mount>/<key>``).

    :func:`sky_name` of ``skypilot.run_name`` when set (the one way two runs share a bucket dir: a later run under
    that name resumes there), else ``<job name>-<6 hex of the run/sweep dir>``, the job name being
    ``skypilot.job_name`` (AutoModel's task name, the same in every run of a file) or Hydra's, cut to 24 characters;
    sweep points add ``-<job num>``. Same run dir, same key: a relaunch in it resumes from the same bucket dir;
    another run dir never gets the same key unless ``run_name`` says so."""
    sweep = job.job_num is not None
    if sc.run_name is not None:
        base = sky_name(sc.run_name)
    else:
        digest = hashlib.sha1(str(job.job_dir.parent if sweep else job.job_dir).encode()).hexdigest()[:6]
        name = sky_name(sc.job_name) if sc.job_name is not None else sky_name(job.job_name)
        base = f"{(name or 'job')[:24].rstrip('-')}-{digest}"
    return f"{base}-{job.job_num}" if sweep else base


def default_bucket(user: str, host: str) -> str:
    """``checkpoint_bucket: auto``: ``automodel-<user>-<8 hex of user@host>``, one bucket per user and submitting
    host (bucket names are global, so the hash keeps them apart); SkyPilot creates it on first use."""
    digest = hashlib.sha1(f"{user}@{host}".encode()).hexdigest()[:8]
    return f"automodel-{(sky_name(user) or 'user')[:30].rstrip('-')}-{digest}"


def _storage(bucket: str, store: str | None) -> dict[str, tp.Any]:
    """A SkyPilot storage mount (YAML ``file_mounts`` form): a URI is a ``source``, a plain name a ``name``."""
    where = {"source": bucket} if "://" in bucket else {"name": bucket}
    return {**where, **({"store": store} if store else {}), "mode": "MOUNT_CACHED"}


def _yaml_path(node_path: str) -> str:
    """A node path for the job config: ``~`` -> ``${oc.env:HOME}``, resolved by the worker on the node."""
    return "${oc.env:HOME}" + node_path[1:] if node_path.startswith("~/") else node_path


def _sh(arg: str) -> str:
    """Quote one word for bash, keeping a node path's leading ``~/`` (also after ``--opt=``) as ``"$HOME"/``."""
    head, sep, tail = arg.partition("=~/") if not arg.startswith("~/") else ("", "~/", arg[2:])
    if not sep:
        return shlex.quote(arg)
    return (shlex.quote(head + "=") if head else "") + '"$HOME"/' + shlex.quote(tail)


# ----------------------------------------------------------------------------------------------- planning (pure)


#: This project's install on every node, run before ``skypilot.setup`` (the ranks import it, hydra-core, omegaconf).
PROJECT_INSTALL = "python -m pip install -e"
#: How the recipe's local model and dataset paths reach the nodes (:func:`automodel_hydra.paths.local_reads`).
UPLOADED = "uploaded (a file mount) to"
#: Where the project is mounted when ``skypilot.workdir`` is another dir (else the workdir is the project).
PROJECT_MOUNT = "~/automodel-hydra"


def render_setup(user: str | None, install: str) -> str:
    """The task's ``setup``: ``install`` (this project), then the user's lines, under ``set -eo pipefail`` so any
    failing line fails the launch. (``-u`` is left out: conda's and many rc files' activation scripts read unset
    variables.) A user setup such as AutoModel's ``pip install nemo-automodel`` adds to the nodes, never replaces
    this project."""
    lines = ["set -eo pipefail", "# automodel-hydra itself (what every rank imports)", install]
    if user and user.strip():
        lines += ["# skypilot.setup", user.rstrip()]
    return "\n".join(lines) + "\n"


def render_run(key: str, nproc: int, master_port: int, worker: list[str], prefix: list[str], out_dir: str,
               ft: FaultToleranceConfig | None = None) -> str:
    """The task's ``run``, identical on every node: torchrun over ``$SKYPILOT_NUM_NODES`` nodes, this node's rank
    ``$SKYPILOT_NODE_RANK``, master = first line of the newline-separated ``"$SKYPILOT_NODE_IPS"`` (quoted: an
    unquoted ``echo`` would join the lines). Node 0 then prints ``result.json`` on one line after
    :data:`RESULT_MARK`, which :func:`wait` reads back from the job's log (the final loss for Hydra's sweeper).

    With ``ft`` (``fault_tolerance.enabled``): ``ft_launcher`` instead, one per node, meeting through c10d
    rendezvous at the master's ``master_port`` (``--rdzv-id`` = ``$SKYPILOT_TASK_ID``, SkyPilot's id of the task,
    the same on every node), restarting the worker group in place on a hang or a failed rank; a managed job's
    recovery after a preemption comes on top, as without it. A node without ``ft_launcher`` stops at once with
    one line."""
    tail = ["--no-python", *prefix, "python", "-u", *worker] if prefix else worker
    result = _sh(f"{out_dir}/result.json")
    what = "ft_launcher" if ft is not None else "torchrun"
    if ft is None:
        launch = ('torchrun --nnodes="$SKYPILOT_NUM_NODES" --node_rank="$SKYPILOT_NODE_RANK" '
                  f'--nproc_per_node={nproc} --master_addr="$MASTER_ADDR" --master_port={master_port} ')
        check = []
    else:
        launch = (" ".join(["ft_launcher", *fault_tolerance.ft_args(ft)]) + ' --nnodes="$SKYPILOT_NUM_NODES" '
                  f'--nproc-per-node={nproc} --rdzv-backend=c10d --rdzv-endpoint="$MASTER_ADDR:{master_port}" '
                  '--rdzv-id="$SKYPILOT_TASK_ID" ')
        line = "error: " + fault_tolerance.missing_launcher_line("on this node")
        check = [f"command -v ft_launcher >/dev/null || {{ echo {_sh(line)} >&2; exit 1; }}"]
    return "\n".join([
        "set -euo pipefail",
        f"# {key}: {what} on each of $SKYPILOT_NUM_NODES nodes, {nproc} worker(s) per node (automodel-hydra)",
        'export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"',
        "export PYTHONUNBUFFERED=1",
        *check,
        "MASTER_ADDR=$(printf '%s\\n' \"$SKYPILOT_NODE_IPS\" | head -n1)",
        'echo "node $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES: master $MASTER_ADDR:' + str(master_port) + '"',
        f"mkdir -p {_sh(out_dir)}",
        launch + " ".join(_sh(a) for a in tail),
        f'if [ "$SKYPILOT_NODE_RANK" = 0 ]; then echo "{RESULT_MARK}$(tr -d \'\\n\' < {result})"; fi',
        "",
    ])


def make_plan(cfg: TrainConfig, job: JobSpec, facts: Facts) -> Plan[Request]:
    """Plan ``cfg``'s SkyPilot task: files ``sky_task.yaml`` and ``job.sky.yaml``, request :class:`Request`.
    Pure: reads only its arguments (``facts``: what preflight read on this machine), no ``import sky``.

    The task's ``envs``: the job's tracker run (``WANDB_RUN_ID``, ``WANDB_RESUME``, ``WANDB_RUN_GROUP``:
    :func:`automodel_hydra.plan.tracker_env`; a spot recovery runs the same task, so the same run), ``HF_HOME``
    (``hf_home``), Hydra's ``hydra.job.env_set`` (every node, every rank), then ``env_vars`` (the later win);
    ``HF_TOKEN`` / ``WANDB_API_KEY`` and single-reference ``env_vars`` are secrets
    (:mod:`automodel_hydra.backends.skypilot_env`). ``job.workdir`` (``hydra.job.chdir``) is a path on this machine
    and has no meaning on the nodes: the ranks start in the synced workdir.

    Raises
    ------
    ConfigError
        A rule that spans sections: spot needs ``checkpoint.enabled`` and ``restore_from.path: latest`` (or
        ``<checkpoint_mount>/latest``; a recovered job must resume), and for an AutoModel recipe
        ``checkpoint.enabled`` not false and ``checkpoint.checkpoint_dir`` relative or under the mount;
        ``restore_from.path`` must be ``latest``, ``<checkpoint_mount>/latest`` or null (a local path is not on
        the nodes); a
        variable set twice (``env_vars`` and ``env_set``/``hf_token``/``wandb_key``); a malformed reference;
        a relative or ``~`` local model or dataset path of another recipe (:func:`automodel_hydra.paths.local_reads`:
        it would name another dir on the nodes).

    Another recipe's local model and dataset paths (absolute: preflight refused the others) are file mounts at the
    same paths on the nodes, so its sections reach the ranks as written; sources from ``facts.paths``.
    """
    sc = cfg.skypilot
    assert sc is not None, "the skypilot backend plans configs with a skypilot: section"
    _check(cfg)
    key = run_key(sc, job)
    bucket = _bucket(sc, facts)
    root = f"~/automodel/{key}"
    out = f"{sc.checkpoint_mount}/{key}" if bucket else root
    job_file = f"{root}/launch/job.yaml"
    file_mounts: dict[str, tp.Any] = {job_file: str(job.launch_dir / NODE_JOB_FILE)}
    from automodel_hydra.config import rank_spec

    node = rank_spec(cfg)
    node.update(output_dir=_yaml_path(out))
    # the recipe's keys that change on the nodes (the bundled recipe's checkpoint dir, data file and model dir, a
    # <mount>/latest resume key) and its local reads there (another recipe's sections reach the nodes as written,
    # its reads at the same paths, its relative written dirs anchored under output_dir there)
    changed, mounts = cfg.kind.on_nodes(cfg, root=root, out=out, mount=sc.checkpoint_mount, uploaded=facts.paths,
                                     inside=[sc.checkpoint_mount] if bucket else [], where="the SkyPilot nodes",
                                     how=UPLOADED)
    for dotted, value in changed.items():
        node = _with_key(node, dotted.split("."), _yaml_path(value))
    file_mounts.update(mounts)
    if bucket:
        file_mounts[sc.checkpoint_mount] = _storage(bucket, sc.checkpoint_store)
    elif sc.num_nodes > 1:
        warnings.warn(f"skypilot.checkpoint_bucket=null with skypilot.num_nodes={sc.num_nodes}: each node keeps its "
                      "own checkpoint files; resuming needs a bucket shared by all nodes", stacklevel=2)
    ft = cfg.fault_tolerance if cfg.fault_tolerance.enabled else None
    extra = _extras(cfg, sc)
    install = f"{PROJECT_INSTALL} {_sh('.' + extra)}"
    if sc.workdir is not None:  # the workdir is the user's: this project travels beside it
        file_mounts[PROJECT_MOUNT] = str(job.project_root)
        install = f"{PROJECT_INSTALL} {_sh(PROJECT_MOUNT + '/' + extra)}"

    env = task_env(sc.env_vars, {f: getattr(sc, f) for f in SECRET_FIELDS}, sc.hf_home, job.env, facts.set_vars,
                   defaults=tracker_env(job))
    worker = ["-m", "automodel_hydra.worker", job_file, "--log-file", f"{out}/{job.job_name}.log", "--started-by",
              "ft_launcher" if ft is not None else "torchrun", "--scheduler", "skypilot"]
    prefix = nsys_prefix(cfg.profile.nsys, out, job.job_name, rank_var="RANK",
                         attempt_vars=(("attempt", "TORCHELASTIC_RESTART_COUNT"),))
    infra = "/".join([sc.cloud or "*", sc.region or "*", sc.zone or "*"]).rstrip("/*")
    # job_recovery (managed jobs): preemptions are always recovered, user-code failures max_restarts_on_errors times
    resources = {"infra": infra or None, "accelerators": sc.accelerators, "instance_type": sc.instance_type,
                 "use_spot": sc.use_spot, "disk_size": sc.disk_size,
                 "job_recovery": {"max_restarts_on_errors": sc.max_restarts_on_errors} if sc.use_spot else None}
    task = {"name": key, "resources": {k: v for k, v in resources.items() if v is not None}, "num_nodes": sc.num_nodes,
            "workdir": str(sc.workdir or job.project_root), "file_mounts": file_mounts,
            "envs": {e.name: e.literal for e in env if not e.secret} or None,
            "secrets": {e.name: None for e in env if e.secret} or None,
            "setup": render_setup(sc.setup, install)}
    task = {k: v for k, v in task.items() if v is not None}
    task["run"] = render_run(key, sc.nproc, sc.master_port, worker, prefix, out, ft)

    # on-demand: skypilot.cluster_name (a sweep point adds -<num>: one cluster each) or the key
    cluster = sc.cluster_name and (sc.cluster_name if job.job_num is None else f"{sc.cluster_name}-{job.job_num}")
    cluster = None if sc.use_spot else cluster or key
    down = sc.down if sc.down is not None else _down(sc, bucket)
    copy_dir = facts.job_dirs[sc.job_dir] + f"/{key}" if sc.job_dir is not None else None
    request = Request(task, tuple(e for e in env if e.literal is None or e.secret), sc.use_spot, key, cluster,
                      sc.idle_minutes_to_autostop, down, sc.cloud, copy_dir)
    files = {TASK_FILE: _header(request) + yaml.dump(task, Dumper=_Dumper, sort_keys=False, width=1000),
             # !r, so a newline in the job name cannot end the comment and add YAML keys
             NODE_JOB_FILE: f"# {job.job_name!r} on the SkyPilot nodes: launch/job.yaml with node paths, mounted at "
                            f"{job_file}\n" + yaml.safe_dump(node, sort_keys=False)}
    return Plan(SkyPilot.name, job, files, request, wait=sc.wait, group_key=None, name=key)  # the task's name


def _with_key(node: dict[str, tp.Any], key: list[str], value: str) -> dict[str, tp.Any]:
    """``node`` with the dotted ``key`` set to ``value``, each mapping on the way copied (the spec's mappings may
    be the config's own: another recipe's sections)."""
    head, rest = key[0], key[1:]
    return {**node, head: _with_key(dict(node.get(head) or {}), rest, value) if rest else value}


def _extras(cfg: TrainConfig, sc: SkyPilotConfig) -> str:
    """This project's extras the nodes install (``[a,b]`` or ``""``): the recipe kind's (NeMo AutoModel for an
    AutoModel recipe, as AutoModel's own launcher installs its package in the task's setup:
    :meth:`automodel_hydra.recipe_kind.RecipeKind.node_extras`); ft_launcher with ``fault_tolerance.enabled``."""
    names = list(cfg.kind.node_extras(sc.accelerators))
    if cfg.fault_tolerance.enabled:
        names.append(fault_tolerance.EXTRA)
    return f"[{','.join(names)}]" if names else ""


def _bucket(sc: SkyPilotConfig, facts: Facts) -> str | None:
    """The bucket of the job's outputs. ``auto``: the per-user bucket when the job needs one (spot: a recovered job
    resumes from it; several nodes: one shared checkpoint), except a kubernetes on-demand job (a cluster often has
    no object store credentials: node disk, with a warning for several nodes)."""
    if sc.checkpoint_bucket != "auto":
        return sc.checkpoint_bucket
    needed = sc.use_spot or (sc.num_nodes > 1 and sc.cloud != "kubernetes")
    return facts.auto_bucket if needed else None


def _down(sc: SkyPilotConfig, bucket: str | None) -> bool:
    """``skypilot.down: null``: tear the idle cluster down when nothing is lost (the outputs are in a bucket) or
    the cloud cannot stop it; stop it when its disk holds the outputs; never when it is kept up."""
    return sc.idle_minutes_to_autostop is not None and (bucket is not None or sc.cloud in CANNOT_STOP)


def _check(cfg: TrainConfig) -> None:
    """The recipe's resume keys on SkyPilot, where only the job's own checkpoints are on the nodes (its kind's rule:
    :meth:`automodel_hydra.recipe_kind.RecipeKind.skypilot_problems`)."""
    sc = cfg.skypilot
    assert sc is not None
    for problem in cfg.kind.skypilot_problems(cfg, sc.checkpoint_mount, sc.use_spot):
        raise problem


def _header(p: Request) -> str:
    """How the task is launched, and the equivalent command line: variables with shell references as ``--env`` /
    ``--secret`` with those references (bash expands them as launch does); a secret's value is never written."""
    by_hand = "".join(" " + e.by_hand() for e in p.env)
    if p.managed:
        call, cli = f"sky.jobs.launch(task, name={p.name!r}): a managed job", f"sky jobs launch -n {p.name}"
    else:
        call = (f"sky.launch(task, cluster_name={p.cluster_name!r}, "
                f"idle_minutes_to_autostop={p.idle_minutes_to_autostop!r}, down={p.down!r})")
        cli = f"sky launch -c {p.cluster_name}" + (f" -i {p.idle_minutes_to_autostop}"
                                                   if p.idle_minutes_to_autostop is not None else "")
        cli += " --down" if p.down else ""
    lines = [f"# SkyPilot task planned by automodel-hydra; launched as {call}.",
             f"# By hand: {cli} launch/{TASK_FILE}{by_hand}"]
    return "".join(line.replace("\n", " ").replace("\r", " ") + "\n" for line in lines)


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (setup, run) as literal blocks."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


class SkyPilot(Backend[Request, SkyRef, Facts]):
    """SkyPilot: one task per job; a managed job when ``use_spot``, else ``sky.launch`` on a named cluster."""

    name = "skypilot"
    wait_setting = ("skypilot.wait", True)
    ranks_write_job_dir = False  # on the nodes (their disks or the bucket): the result is read back from the log

    def __init__(self) -> None:
        self._access: dict[str | None, str | None] = {}  # cloud -> its credential problem, asked once

    def preflight(self, cfgs: tp.Sequence[TrainConfig]) -> Facts:
        """Read what planning needs from this machine (:class:`Facts`): the ``auto`` bucket name (user and host
        name), which of ``HF_TOKEN`` / ``WANDB_API_KEY`` are set, each ``job_dir`` (shell references, ``~`` and a
        relative path resolved here), the local files uploaded to the nodes. Raises ConfigError for a
        ``data.path`` that is not a file here, for a local model or dataset path of another recipe that is
        relative, ``~`` or missing here (:func:`automodel_hydra.paths.local_reads`), PreflightError for an unset
        reference in ``job_dir``."""
        job_dirs: dict[str, str] = {}
        paths: dict[str, str] = {}
        for cfg in cfgs:
            sc = cfg.skypilot
            assert sc is not None
            if sc.job_dir is not None:
                text = expand(parse(sc.job_dir, "skypilot.job_dir"), os.environ, "skypilot.job_dir")
                job_dirs[sc.job_dir] = os.path.abspath(os.path.expanduser(text))
            # the local files the ranks read (make_plan mounts them; a relative or missing one is refused here)
            paths.update(cfg.kind.upload_sources(cfg, "the SkyPilot nodes", UPLOADED))
        user = os.environ.get("USER", "user")
        with contextlib.suppress(KeyError, OSError):
            user = getpass.getuser()
        return Facts(default_bucket(user, socket.gethostname()),
                     frozenset(n for n in SECRET_FIELDS.values() if os.environ.get(n)), job_dirs, paths)

    def world_size(self, cfg: TrainConfig, facts: Facts | None = None) -> int:
        sc = cfg.skypilot
        assert sc is not None
        return sc.num_nodes * sc.nproc

    def env_vars(self, cfg: TrainConfig) -> tp.Mapping[str, str]:
        return cfg.skypilot.env_vars if cfg.skypilot is not None else {}

    def ranks_see_local_files(self, cfg: TrainConfig) -> bool:
        return False  # cloud nodes: their own disks, this project synced, outputs in a bucket or on the node

    def plan(self, cfg: TrainConfig, job: JobSpec, facts: Facts | None = None) -> Plan[Request]:
        """:func:`make_plan` with the facts :meth:`preflight` read (SkyPilot's schema check is :meth:`check`).

        A call job (a Hydra task function that is not ours) is refused: :data:`CALL_REFUSAL` says why."""
        if job.call is not None:
            raise ConfigError("hydra.launcher.backend", "skypilot", CALL_REFUSAL)
        if facts is None:
            raise RuntimeError("SkyPilot.plan needs the facts SkyPilot.preflight(cfgs) returns: planning reads no "
                               "machine")
        return make_plan(cfg, job, facts)

    def check(self, plans: tp.Sequence[Plan[Request]]) -> None:
        """SkyPilot's own schema and ``sky.Task`` construction for every planned task, and every shell reference
        expanded in this shell (values discarded); before anything is written or launched."""
        from automodel_hydra.backends import skypilot_bridge, skypilot_sdk

        for p in plans:
            skypilot_sdk.launch_values(p.request, os.environ)
        skypilot_bridge.call("validate_all", [p.request.task for p in plans])

    def batches(self, plans: tp.Sequence[Plan[Request]], sweep_dir: Path | None,
                facts: Facts | None = None) -> list[Batch[Request]]:
        """One batch per job: its launch files, and the same task files under ``<job_dir>/<key>/`` when
        ``skypilot.job_dir`` is set (AutoModel keeps a job's files there)."""
        out = []
        for p in plans:
            batch = job_batch(p)
            if p.request.copy_dir is not None:
                copies = {Path(p.request.copy_dir) / name: text for name, text in p.files.items()}
                batch = Batch(batch.plans, {**batch.files, **copies})
            out.append(batch)
        return out

    def submit(self, batch: Batch[Request]) -> list[Submission[SkyRef]]:
        """Launch one task (:func:`automodel_hydra.backends.skypilot_sdk.launch`): no credentials or no network
        fails in seconds with one line naming the cause and ``sky check``, and leaves no API server it started.
        Raises PreflightError, or SkyPilot's own error (e.g. setup failed)."""
        from automodel_hydra.backends import skypilot_bridge

        (p,) = batch.plans
        ref = skypilot_bridge.call("launch", p.request, self._access)
        return [Submission(p, ref, log_path=ref.cli("logs"))]

    def wait(self, subs: tp.Sequence[Submission[SkyRef]], poll_s: float | None = None,
             retries: int = 4) -> list[JobResult]:
        """Poll SkyPilot every ``poll_s`` seconds (default :data:`POLL_S`) until every job is finished, logging each
        change of state (recoveries included). COMPLETED carries node 0's ``result.json`` read back from the job's
        log (:data:`RESULT_MARK`). After ``retries`` failed queries in a row the jobs are reported UNKNOWN. Ctrl-C
        stops waiting, not the jobs (the message says how to cancel them)."""
        from automodel_hydra.backends import skypilot_bridge

        return tp.cast(list[JobResult], skypilot_bridge.call("wait", list(subs), POLL_S if poll_s is None else poll_s,
                                                             retries))

    def states(self, refs: tp.Sequence[SkyRef]) -> list[StateInfo]:
        """Each job's state from SkyPilot. Never starts SkyPilot's API server (its SDK starts a local one, ~1 GB in
        8 processes left running, on the first request): when the local server is down, every state is UNKNOWN
        and says how to start it (the busy-dir check and ``automodel-hydra status`` ask this)."""
        from automodel_hydra.backends import skypilot_bridge

        names = skypilot_bridge.call("states_here", list(refs))
        if names is None:
            why = "SkyPilot's API server is not running here; start it with `sky api start` and ask again"
            return [StateInfo(JobState.UNKNOWN, why, answered=False) for _ in refs]
        return [StateInfo(JobState(STATE.get(name, "UNKNOWN"))) for name in names]

    def cancel(self, refs: tp.Sequence[SkyRef], pending_only: bool = False) -> None:
        """``sky.jobs.cancel`` (managed) or ``sky.cancel`` on the job's cluster (``pending_only``: SkyPilot has no
        such filter; the refs given are cancelled)."""
        from automodel_hydra.backends import skypilot_bridge

        skypilot_bridge.call("cancel", list(refs))

    def ref_from_record(self, record: tp.Mapping[str, tp.Any]) -> SkyRef:
        ref = record.get("ref") or {}
        if ref:
            return SkyRef(str(ref["job_id"]), ref.get("cluster"))
        cluster, _, num = str((record.get("job_ids") or [""])[0]).rpartition(":")
        return SkyRef(num, cluster or None)
