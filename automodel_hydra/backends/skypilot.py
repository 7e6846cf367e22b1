"""SkyPilot backend: one task per job; a managed job (``sky.jobs.launch``) when ``use_spot``, so preemptions are
recovered, else ``sky.launch`` on a named cluster. Facts of SkyPilot 0.14.1 it relies on: docs/skypilot.md.

:func:`make_plan` is pure (no ``import sky``): ``launch/sky_task.yaml`` (the task) and ``launch/job.sky.yaml`` (the
rank-side spec with node paths, mounted at ``~/automodel/<key>/launch/job.yaml``). :meth:`SkyPilot.check` runs
:func:`validate` (SkyPilot's own schema and ``sky.Task`` construction) on every planned task, so a bad field fails
before anything is written or launched.

Node paths hang off the run key (:func:`run_key`), which a managed job keeps across recoveries. With a bucket
(required for spot) the output dir and checkpoints live in ``<checkpoint_mount>/<key>``, mounted ``MOUNT_CACHED``
(SkyPilot's training guide: appends and renames work, uploads flushed at job end); a recovered job runs the same
command on fresh nodes, finds ``checkpoints/latest`` there and resumes. Without: ``~/automodel/<key>`` per node.

Secrets (``env_vars`` ``"${VAR}"``) are listed under ``secrets:`` by name only (null = supplied at launch, as
``sky launch --secret NAME``); :meth:`SkyPilot.submit` puts the values from this shell into the in-memory ``sky.Task``. A
failing ``setup`` fails the launch: SkyPilot raises ``Failed to setup with return code N``
(``sky/backends/cloud_vm_ray_backend.py``) or marks a managed job ``FAILED_SETUP`` (``sky/jobs/controller.py``);
run never starts. Setup runs under ``set -eo pipefail``, so every line counts, not only the last.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import getpass
import hashlib
import io
import json
import logging
import os
import re
import shlex
import socket
import time
import typing as tp
import warnings
from pathlib import Path

import yaml

from dataclasses import dataclass, field

from automodel_hydra.bootstrap import DEFAULT_PORT
from automodel_hydra.envvars import parse_env_vars
from automodel_hydra.plan import Backend, Batch, JobResult, JobSpec, Plan, PreflightError, Submission
from automodel_hydra.profile import nsys_prefix
from automodel_hydra.schema import ConfigError, at_least, check_port, require
from automodel_hydra.states import JobState, StateInfo

if tp.TYPE_CHECKING:
    from automodel_hydra.config import TrainConfig

log = logging.getLogger(__name__)

TASK_FILE = "sky_task.yaml"
NODE_JOB_FILE = "job.sky.yaml"
#: Node 0 prints ``<RESULT_MARK><result.json on one line>`` after training (read back by :func:`wait`).
RESULT_MARK = "automodel-result: "
#: Seconds between status polls in :func:`wait`.
POLL_S = 15.0
#: SkyPilot job states (managed ``ManagedJobStatus`` and cluster ``JobStatus``) -> the product's state names
#: (Slurm's): a recovering managed job is PENDING (it will run again); SkyPilot's failure kinds are FAILED.
STATE = {
    "INIT": "PENDING", "PENDING": "PENDING", "SUBMITTED": "PENDING", "STARTING": "PENDING", "SETTING_UP": "PENDING",
    "RUNNING": "RUNNING", "WINDING_DOWN": "RUNNING", "CANCELLING": "RUNNING", "RECOVERING": "PENDING",
    "SUCCEEDED": "COMPLETED", "CANCELLED": "CANCELLED",
    "FAILED": "FAILED", "FAILED_SETUP": "FAILED", "FAILED_PRECHECKS": "FAILED", "FAILED_NO_RESOURCE": "FAILED",
    "FAILED_CONTROLLER": "FAILED", "FAILED_DRIVER": "FAILED",
}


class SkyPilotPlanError(ValueError):
    """SkyPilot's own schema or ``sky.Task`` construction rejected the planned task; the message names the field."""


# ----------------------------------------------------------------------------------------------- schema


#: Clouds SkyPilot's launcher section accepts .
SKYPILOT_CLOUDS = ("aws", "gcp", "azure", "lambda", "kubernetes")


@dataclass
class SkyPilotConfig:
    """One SkyPilot task per job. Spot jobs run as SkyPilot managed jobs (preemptions recovered);
    on-demand jobs run on a named cluster (``sky.launch``). See :mod:`automodel_hydra.backends.skypilot`."""

    # aws | gcp | azure | lambda | kubernetes
    cloud: str = "aws"
    # NAME:COUNT, e.g. H100:8 or A100-80GB:4; null = CPU instances
    accelerators: tp.Optional[str] = "H100:8"
    # instances (nodes), >= 1
    num_nodes: int = 1
    # preemptible instances, run as a SkyPilot managed job so preemptions are recovered (needs checkpoint_bucket)
    use_spot: bool = False
    # disk per node in GB, > 0; null = SkyPilot's default
    disk_size: tp.Optional[int] = None
    # cloud region (kubernetes: the context); null = any
    region: tp.Optional[str] = None
    # shell run in the workdir before training on every node, under `set -euo pipefail`: a failing line fails the launch
    setup: tp.Optional[str] = "python -m pip install -e ."
    # variables for the job; "${VAR}" values travel as SkyPilot secrets, resolved from this shell at launch
    env_vars: tp.Dict[str, str] = field(default_factory=dict)
    # rendezvous port on the head node (each job has its own cluster)
    master_port: int = DEFAULT_PORT
    # workers per node; null = the accelerator count (1 without accelerators)
    nproc_per_node: tp.Optional[int] = None
    # synced to every node as the working directory; null = this project's root
    workdir: tp.Optional[str] = None
    # bucket holding the job's output dir and checkpoints, mounted at checkpoint_mount (MOUNT_CACHED): a bucket name
    # (created by SkyPilot when missing), a URI (s3://b, gs://b/prefix, ...), "auto" (a per-user bucket when the job
    # needs one: use_spot or num_nodes > 1; else the node's disk) or null (node disk; not allowed with use_spot)
    checkpoint_bucket: tp.Optional[str] = "auto"
    # store for a bucket given by name (s3, gcs, azure, r2, ...); null = the task's cloud
    checkpoint_store: tp.Optional[str] = None
    # where the bucket is mounted on every node (absolute)
    checkpoint_mount: str = "/checkpoints"
    # the run's name on the cloud: task / managed job name, bucket dir (a recovered or relaunched job with the same
    # name resumes there) and default cluster name; null = <job name>-<hash of the output dir>; sweeps add -<num>
    run_name: tp.Optional[str] = None
    # on-demand only: cluster name (null = run_name) and its lifetime after the job
    cluster_name: tp.Optional[str] = None
    # on-demand only: stop the cluster after this many idle minutes (null = never)
    idle_minutes_to_autostop: tp.Optional[int] = None
    # on-demand only: tear the cluster down after the job (after idle_minutes_to_autostop when set)
    down: bool = False
    # managed (spot) jobs: also restart after this many user-code failures (preemptions are always recovered)
    max_restarts_on_errors: int = 0
    # wait for the job(s) and return their final state (single runs and sweeps); false = return right after launch
    wait: bool = True
    # not supported here: requeue is a Slurm feature; spot recovery is use_spot=true
    max_requeues: tp.Optional[int] = None

    def __post_init__(self) -> None:
        require(self.cloud in SKYPILOT_CLOUDS, "skypilot.cloud", self.cloud, f"one of {list(SKYPILOT_CLOUDS)}")
        if self.accelerators is not None:
            ok = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(:[1-9][0-9]*)?", str(self.accelerators))
            require(bool(ok), "skypilot.accelerators", self.accelerators, "NAME or NAME:COUNT, e.g. 'H100:8'")
        at_least("skypilot.num_nodes", self.num_nodes)
        at_least("skypilot.disk_size", self.disk_size)
        at_least("skypilot.nproc_per_node", self.nproc_per_node)
        at_least("skypilot.idle_minutes_to_autostop", self.idle_minutes_to_autostop, 0)
        check_port("skypilot.master_port", self.master_port)
        require(self.max_restarts_on_errors >= 0, "skypilot.max_restarts_on_errors", self.max_restarts_on_errors,
                 "must be >= 0")
        require(self.max_requeues is None, "skypilot.max_requeues", self.max_requeues,
                 "requeue is a Slurm feature; on SkyPilot use skypilot.use_spot=true (a managed job recovers "
                 "preemptions) and skypilot.max_restarts_on_errors for failures")
        bucket = self.checkpoint_bucket
        require(bucket is not None or not self.use_spot, "skypilot.checkpoint_bucket", bucket,
                 "spot jobs need checkpoints on storage that outlives the instance: a bucket name, a URI "
                 "(s3://..., gs://...) or 'auto' (skypilot.use_spot=true)")
        if bucket is not None and bucket != "auto":
            ok = re.fullmatch(_BUCKET_NAME, bucket) or re.fullmatch(r"[a-z0-9]+://[^\s]+", bucket)
            require(bool(ok), "skypilot.checkpoint_bucket", bucket,
                     "'auto', a bucket name (3-63 of a-z 0-9 . -) or a URI such as s3://bucket or gs://bucket/prefix")
            require(self.checkpoint_store is None or "://" not in bucket, "skypilot.checkpoint_store",
                     self.checkpoint_store, "null when skypilot.checkpoint_bucket is a URI (its scheme is the store)")
        mount = self.checkpoint_mount
        require(mount.startswith("/") and mount != "/" and not mount.endswith("/") and " " not in mount,
                 "skypilot.checkpoint_mount", mount, "an absolute path on the nodes, not /, without a trailing /")
        for key in ("run_name", "cluster_name"):
            value = getattr(self, key)
            require(value is None or bool(re.fullmatch(_SKY_NAME, value)), f"skypilot.{key}", value,
                     "lowercase letters, digits and '-', starting with a letter, at most 40 characters")

    @property
    def gpus_per_node(self) -> int:
        if not self.accelerators:
            return 0
        _, _, count = str(self.accelerators).partition(":")
        return int(count or 1)


#: S3/GCS bucket names; SkyPilot cluster/job names as this launcher makes them (a subset of what SkyPilot accepts).
_BUCKET_NAME = r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]"
_SKY_NAME = r"[a-z](?:[a-z0-9-]{0,38}[a-z0-9])?"



@dataclasses.dataclass(frozen=True)
class Request:
    """What :meth:`SkyPilot.submit` needs. ``task`` is the planned dict (secret names only, never values)."""

    task: dict[str, tp.Any]
    secrets: tuple[tuple[str, str], ...]  # (secret name in the task, variable of the submitting shell)
    managed: bool  # sky.jobs.launch (use_spot) vs sky.launch
    name: str  # run key: task name, managed job name
    cluster_name: str | None
    idle_minutes_to_autostop: int | None
    down: bool


@dataclasses.dataclass(frozen=True)
class SkyRef:
    """A SkyPilot job: a managed job (``cluster`` None) or job ``job_id`` on an on-demand ``cluster``."""

    job_id: str
    cluster: str | None = None

    @property
    def ids(self) -> list[str]:
        return [f"{self.cluster}:{self.job_id}" if self.cluster else self.job_id]

    def cli(self, verb: str) -> str:
        """The SkyPilot command for this job (``sky jobs logs 12``, ``sky logs dev 3``)."""
        return f"sky {verb} {self.cluster} {self.job_id}" if self.cluster else f"sky jobs {verb} {self.job_id}"


# ----------------------------------------------------------------------------------------------- names and paths


def _slug(text: str) -> str:
    """Lowercase letters, digits and single dashes, starting with a letter (SkyPilot cluster/task names)."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug if slug[:1].isalpha() else f"j-{slug}".rstrip("-")


def run_key(sc: SkyPilotConfig, job: JobSpec) -> str:
    """The run's name on the cloud: ``skypilot.run_name`` or ``<job name>-<6 hex of the run/sweep dir>``; sweep
    points add ``-<job num>``. Same job dir, same key: a relaunch resumes from the same bucket dir."""
    sweep = job.job_num is not None
    base = sc.run_name
    if base is None:
        digest = hashlib.sha1(str(job.job_dir.parent if sweep else job.job_dir).encode()).hexdigest()[:6]
        base = f"{_slug(job.job_name)[:24].rstrip('-')}-{digest}"
    return f"{base}-{job.job_num}" if sweep else base


def default_bucket(user: str | None = None, host: str | None = None) -> str:
    """``checkpoint_bucket: auto``: ``automodel-<user>-<8 hex of user@host>``, one bucket per user and submitting
    host (bucket names are global, so the hash keeps them apart); SkyPilot creates it on first use."""
    with contextlib.suppress(KeyError, OSError):
        user = user or getpass.getuser()
    user, host = user or os.environ.get("USER", "user"), host or socket.gethostname()
    digest = hashlib.sha1(f"{user}@{host}".encode()).hexdigest()[:8]
    return f"automodel-{_slug(user)[:30].rstrip('-')}-{digest}"


def _bucket(sc: SkyPilotConfig) -> str | None:
    if sc.checkpoint_bucket == "auto":
        return default_bucket() if sc.use_spot or sc.num_nodes > 1 else None
    return sc.checkpoint_bucket


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


def render_setup(setup: str | None) -> str | None:
    """The task's ``setup``: the user's lines under ``set -eo pipefail``, so any failing line fails the launch.
    (``-u`` is left out: conda's and many rc files' activation scripts read unset variables.)"""
    return f"set -eo pipefail\n{setup.rstrip()}\n" if setup else None


def render_run(key: str, nproc: int, master_port: int, worker: list[str], prefix: list[str], out_dir: str) -> str:
    """The task's ``run``, identical on every node: torchrun over ``$SKYPILOT_NUM_NODES`` nodes, this node's rank
    ``$SKYPILOT_NODE_RANK``, master = first line of the newline-separated ``"$SKYPILOT_NODE_IPS"`` (quoted: an
    unquoted ``echo`` would join the lines). Node 0 then prints ``result.json`` on one line after
    :data:`RESULT_MARK`, which :func:`wait` reads back from the job's log (the final loss for Hydra's sweeper)."""
    tail = ["--no-python", *prefix, "python", "-u", *worker] if prefix else worker
    result = _sh(f"{out_dir}/result.json")
    return "\n".join([
        "set -euo pipefail",
        f"# {key}: torchrun on each of $SKYPILOT_NUM_NODES nodes, {nproc} worker(s) per node (automodel-hydra)",
        'export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"',
        "export PYTHONUNBUFFERED=1",
        "MASTER_ADDR=$(printf '%s\\n' \"$SKYPILOT_NODE_IPS\" | head -n1)",
        'echo "node $SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES: master $MASTER_ADDR:' + str(master_port) + '"',
        f"mkdir -p {_sh(out_dir)}",
        'torchrun --nnodes="$SKYPILOT_NUM_NODES" --node_rank="$SKYPILOT_NODE_RANK" '
        f'--nproc_per_node={nproc} --master_addr="$MASTER_ADDR" --master_port={master_port} '
        + " ".join(_sh(a) for a in tail),
        f'if [ "$SKYPILOT_NODE_RANK" = 0 ]; then echo "{RESULT_MARK}$(tr -d \'\\n\' < {result})"; fi',
        "",
    ])


def parse_result(log_text: str) -> dict[str, tp.Any] | None:
    """The job's final metrics from its log: the last :data:`RESULT_MARK` line (None when there is none)."""
    for line in reversed(log_text.splitlines()):
        if RESULT_MARK in line:
            with contextlib.suppress(ValueError):
                return json.loads(line.split(RESULT_MARK, 1)[1])
    return None


def make_plan(cfg: TrainConfig, job: JobSpec) -> Plan[Request]:
    """Plan ``cfg``'s SkyPilot task: files ``sky_task.yaml`` and ``job.sky.yaml``, request :class:`Request`.
    Pure: no ``import sky``, writes nothing (reads only the user and host name, for ``checkpoint_bucket: auto``).

    Raises
    ------
    ConfigError
        A rule that spans sections: spot needs ``checkpoint.enabled`` and ``restore_from.path: latest`` (a recovered
        job must resume); ``restore_from.path`` must be ``latest`` or null (a local path is not on the nodes).
    """
    sc = cfg.skypilot
    assert sc is not None, "the skypilot backend plans configs with a skypilot: section"
    _check(cfg)
    key = run_key(sc, job)
    bucket = _bucket(sc)
    root = f"~/automodel/{key}"
    out = f"{sc.checkpoint_mount}/{key}" if bucket else root
    job_file = f"{root}/launch/job.yaml"
    file_mounts: dict[str, tp.Any] = {job_file: str(job.launch_dir / NODE_JOB_FILE)}
    from automodel_hydra.config import rank_spec

    node = rank_spec(cfg)
    node.update(output_dir=_yaml_path(out))
    node["checkpoint"]["dir"] = _yaml_path(f"{out}/checkpoints")
    if cfg.data.source == "file" and cfg.data.path:  # the local text file travels with the job
        file_mounts[f"{root}/launch/data/{Path(cfg.data.path).name}"] = str(Path(cfg.data.path).resolve())
        node["data"]["path"] = _yaml_path(f"{root}/launch/data/{Path(cfg.data.path).name}")
    if cfg.model.name_or_path and Path(cfg.model.name_or_path).exists():  # a local model dir, not a hub id
        file_mounts[f"{root}/launch/model"] = str(Path(cfg.model.name_or_path).resolve())
        node["model"]["name_or_path"] = _yaml_path(f"{root}/launch/model")
    if bucket:
        file_mounts[sc.checkpoint_mount] = _storage(bucket, sc.checkpoint_store)
    elif sc.num_nodes > 1:
        warnings.warn(f"skypilot.checkpoint_bucket=null with skypilot.num_nodes={sc.num_nodes}: each node keeps its "
                      "own checkpoint files; resuming needs a bucket shared by all nodes", stacklevel=2)

    env = parse_env_vars(sc.env_vars, "skypilot.env_vars")
    nproc = sc.nproc_per_node or sc.gpus_per_node or 1
    worker = ["-m", "automodel_hydra.worker", job_file, "--log-file", f"{out}/{job.job_name}.log"]
    prefix = nsys_prefix(cfg.profile.nsys, out, job.job_name, rank_var="RANK")
    # job_recovery (managed jobs): preemptions are always recovered, user-code failures max_restarts_on_errors times
    resources = {"infra": sc.cloud + (f"/{sc.region}" if sc.region else ""), "accelerators": sc.accelerators,
                 "use_spot": sc.use_spot, "disk_size": sc.disk_size,
                 "job_recovery": {"max_restarts_on_errors": sc.max_restarts_on_errors} if sc.use_spot else None}
    secrets = tuple((e.name, e.ref) for e in env if e.ref is not None)
    task = {"name": key, "resources": {k: v for k, v in resources.items() if v is not None}, "num_nodes": sc.num_nodes,
            "workdir": str(sc.workdir or job.project_root), "file_mounts": file_mounts,
            "envs": {e.name: e.literal or "" for e in env if e.ref is None} or None,
            "secrets": {name: None for name, _ in secrets} or None, "setup": render_setup(sc.setup)}
    task = {k: v for k, v in task.items() if v is not None}
    task["run"] = render_run(key, nproc, sc.master_port, worker, prefix, out)

    # on-demand: skypilot.cluster_name (a sweep point adds -<num>: one cluster each) or the key
    cluster = sc.cluster_name and (sc.cluster_name if job.job_num is None else f"{sc.cluster_name}-{job.job_num}")
    cluster = None if sc.use_spot else cluster or key
    request = Request(task, secrets, sc.use_spot, key, cluster, sc.idle_minutes_to_autostop, sc.down)
    files = {TASK_FILE: _header(request) + yaml.dump(task, Dumper=_Dumper, sort_keys=False, width=1000),
             # !r, so a newline in the job name cannot end the comment and add YAML keys
             NODE_JOB_FILE: f"# {job.job_name!r} on the SkyPilot nodes: launch/job.yaml with node paths, mounted at "
                            f"{job_file}\n" + yaml.safe_dump(node, sort_keys=False)}
    return Plan(SkyPilot.name, job, files, request, wait=sc.wait, group_key=None)


def _check(cfg: TrainConfig) -> None:
    sc = cfg.skypilot
    assert sc is not None
    path = cfg.restore_from.path
    if path not in (None, "latest"):
        raise ConfigError("restore_from.path", path, "'latest' or null on SkyPilot (a local checkpoint path does not "
                          "exist on the nodes; put it in the bucket and use skypilot.run_name to resume from it)")
    if sc.use_spot and not cfg.checkpoint.enabled:
        raise ConfigError("checkpoint.enabled", False, "true with skypilot.use_spot=true: a recovered job resumes "
                          "from its newest checkpoint")
    if sc.use_spot and path != "latest":
        raise ConfigError("restore_from.path", path, "'latest' with skypilot.use_spot=true: a recovered job resumes")
    if sc.workdir is not None and not Path(sc.workdir).is_dir():
        raise ConfigError("skypilot.workdir", sc.workdir, "an existing local directory (synced to every node)")


def _header(p: Request) -> str:
    """How the task is launched, and the equivalent command line (secrets by name: the CLI reads this shell)."""
    by_hand = "".join(f" --secret {n}" if n == ref else f' --secret {n}="${ref}"' for n, ref in p.secrets)
    if p.managed:
        call, cli = f"sky.jobs.launch(task, name={p.name!r}): a managed job", f"sky jobs launch -n {p.name}"
    else:
        call = (f"sky.launch(task, cluster_name={p.cluster_name!r}, "
                f"idle_minutes_to_autostop={p.idle_minutes_to_autostop!r}, down={p.down!r})")
        cli = f"sky launch -c {p.cluster_name}" + (f" -i {p.idle_minutes_to_autostop}"
                                                   if p.idle_minutes_to_autostop is not None else "")
        cli += " --down" if p.down else ""
    return (f"# SkyPilot task planned by automodel-hydra; launched as {call}.\n"
            f"# By hand: {cli} launch/{TASK_FILE}{by_hand}\n")


class _Dumper(yaml.SafeDumper):
    """YAML with multi-line strings (setup, run) as literal blocks."""


_Dumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


def _sky() -> tp.Any:
    """``import sky`` (~2 s, creates ~/.sky), keeping its database migrations' INFO lines out of the job log."""
    logging.getLogger("alembic").setLevel(max(logging.WARNING, logging.getLogger("alembic").level))
    import sky

    return sky


def validate(task: tp.Mapping[str, tp.Any]) -> None:
    """Check a task dict offline with SkyPilot's own schema (``common_utils.validate_schema``) and construction
    (``sky.Task.from_yaml_config``: resources, storage). Catches unknown fields, bad infra, accelerator format,
    ``disk_size``/``num_nodes`` <= 0, non-bool ``use_spot``, env names; not regions or accelerators a cloud lacks
    (that needs SkyPilot's catalog). Raises SkyPilotPlanError quoting SkyPilot's message, which names the field."""
    sky = _sky()
    from sky.utils import common_utils, schemas

    try:
        common_utils.validate_schema(copy.deepcopy(dict(task)), schemas.get_task_schema(), "Invalid task YAML: ")
        sky.Task.from_yaml_config(copy.deepcopy(dict(task)))  # it pops keys from its argument
    except Exception as e:  # ValueError, InvalidSkyPilotConfigError, StorageSpecError, ...
        raise SkyPilotPlanError(f"SkyPilot rejects the planned task ({TASK_FILE}): {e}") from e


# ----------------------------------------------------------------------------------------------- side effects


def build_task(request: Request, environ: tp.Mapping[str, str]) -> tp.Any:
    """The ``sky.Task`` to launch, with secret values taken from ``environ`` (in memory only).

    Raises PreflightError naming the ``skypilot.env_vars`` entry whose variable is not set (as ``sky launch
    --secret`` does), before anything is launched."""
    sky = _sky()
    _check_secrets(request, environ)
    overrides = [(name, environ[ref]) for name, ref in request.secrets]
    return sky.Task.from_yaml_config(copy.deepcopy(request.task), secrets_overrides=overrides or None)


def _check_secrets(request: Request, environ: tp.Mapping[str, str]) -> None:
    missing = [f"skypilot.env_vars.{n} (${{{ref}}})" for n, ref in request.secrets if ref not in environ]
    if missing:
        raise PreflightError(f"{', '.join(missing)}: not set in this shell; export it, or remove the entry")


def _raw_states(refs: tp.Sequence[SkyRef]) -> list[str]:
    """SkyPilot's status name for each job (managed jobs in one queue call; cluster jobs per cluster)."""
    sky = _sky()
    out = {r: "UNKNOWN" for r in refs}
    managed = [int(r.job_id) for r in refs if r.cluster is None]
    if managed:
        records = sky.get(sky.jobs.queue_v2(refresh=False, job_ids=managed))
        records = records[0] if isinstance(records, tuple) else records
        by_id = {str(r.get("job_id")): getattr(r.get("status"), "value", str(r.get("status"))) for r in records}
        out.update({r: by_id.get(r.job_id, "UNKNOWN") for r in refs if r.cluster is None})
    by_cluster: dict[str, list[SkyRef]] = {}
    for r in refs:
        if r.cluster is not None:
            by_cluster.setdefault(r.cluster, []).append(r)
    for cluster, crefs in by_cluster.items():
        statuses = sky.get(sky.job_status(cluster, job_ids=[int(r.job_id) for r in crefs]))
        for r in crefs:
            status = statuses.get(int(r.job_id))
            out[r] = getattr(status, "value", str(status)) if status is not None else "UNKNOWN"
    return [out[r] for r in refs]


def _fetch_result(ref: SkyRef) -> dict[str, tp.Any] | None:
    """Node 0's result line from the finished job's log (``sky.jobs.tail_logs`` / ``sky.tail_logs``, not followed)."""
    sky, buf = _sky(), io.StringIO()
    try:
        if ref.cluster:
            sky.tail_logs(ref.cluster, int(ref.job_id), follow=False, output_stream=buf)
        else:
            sky.jobs.tail_logs(job_id=int(ref.job_id), follow=False, output_stream=buf)
    except Exception as e:  # the result is a convenience: the job's state is what counts
        log.warning("could not read the log of SkyPilot job %s: %s", ref.ids[0], e)
    return parse_result(buf.getvalue())


class SkyPilot(Backend[Request, SkyRef]):
    """SkyPilot: one task per job; a managed job when ``use_spot``, else ``sky.launch`` on a named cluster."""

    name = "skypilot"

    def world_size(self, cfg: TrainConfig) -> int:
        sc = cfg.skypilot
        assert sc is not None
        return sc.num_nodes * (sc.nproc_per_node or sc.gpus_per_node or 1)

    def plan(self, cfg: TrainConfig, job: JobSpec) -> Plan[Request]:
        """:func:`make_plan` (pure; SkyPilot's schema check is :meth:`check`)."""
        return make_plan(cfg, job)

    def check(self, plans: tp.Sequence[Plan[Request]]) -> None:
        """SkyPilot's own schema and ``sky.Task`` construction for every planned task, and the secrets they name
        set in this shell; before anything is written or launched."""
        for p in plans:
            validate(p.request.task)
            _check_secrets(p.request, os.environ)

    def submit(self, batch: Batch[Request]) -> list[Submission[SkyRef]]:
        """Launch one task: ``sky.jobs.launch`` (spot) or ``sky.launch`` (on-demand cluster), followed
        (``sky.stream_and_get``: provisioning and setup logs) until it returns its id. Raises SkyPilot's error when
        the launch fails (e.g. setup failed)."""
        sky = _sky()
        (p,) = batch.plans
        rq = p.request
        task = build_task(rq, os.environ)
        request = (sky.jobs.launch(task, name=rq.name) if rq.managed else
                   sky.launch(task, cluster_name=rq.cluster_name, idle_minutes_to_autostop=rq.idle_minutes_to_autostop,
                              down=rq.down))
        job_id, _handle = sky.stream_and_get(request)
        ref = SkyRef(str(job_id[0] if isinstance(job_id, (list, tuple)) else job_id),
                     None if rq.managed else rq.cluster_name)
        return [Submission(p, ref, log_path=ref.cli("logs"))]

    def wait(self, subs: tp.Sequence[Submission[SkyRef]], poll_s: float | None = None,
             retries: int = 4) -> list[JobResult]:
        """Poll SkyPilot every ``poll_s`` seconds (default :data:`POLL_S`) until every job is finished, logging each
        change of state (recoveries included). COMPLETED carries node 0's ``result.json`` read back from the job's
        log (:data:`RESULT_MARK`). After ``retries`` failed queries in a row the jobs are reported UNKNOWN. Ctrl-C
        stops waiting, not the jobs (the message says how to cancel them)."""
        results: dict[int, JobResult] = {}
        last: dict[int, str] = {}
        failures = 0
        try:
            while len(results) < len(subs):
                pending = [i for i in range(len(subs)) if i not in results]
                try:
                    raw, failures = _raw_states([subs[i].ref for i in pending]), 0
                except Exception as e:  # API server unreachable, cluster already torn down, ...
                    raw, failures = [], failures + 1
                    log.warning("cannot query SkyPilot (%d/%d): %s", failures, retries, e)
                    if failures >= retries:
                        results.update({i: JobResult(JobState.UNKNOWN, error=f"cannot query SkyPilot: {e}; logs: "
                                                     f"{subs[i].log_path}") for i in pending})
                for i, name in zip(pending, raw):
                    s, state = subs[i], JobState(STATE.get(name, "UNKNOWN"))
                    if last.get(i) != name:
                        log.info("SkyPilot job %s (%s): %s", s.ref.ids[0], s.plan.request.name, name)
                        last[i] = name
                    if state is JobState.COMPLETED:
                        results[i] = JobResult(state, _fetch_result(s.ref) or {"sky_status": name})
                    elif state.final:
                        results[i] = JobResult(state, {"sky_status": name}, f"SkyPilot {name}; logs: {s.log_path}")
                if len(results) < len(subs):
                    time.sleep(POLL_S if poll_s is None else poll_s)
        except KeyboardInterrupt:
            log.warning("stopped waiting; the jobs go on. Cancel: %s", "; ".join(s.ref.cli("cancel") for s in subs))
            raise
        return [results[i] for i in range(len(subs))]

    def states(self, refs: tp.Sequence[SkyRef]) -> list[StateInfo]:
        return [StateInfo(JobState(STATE.get(name, "UNKNOWN"))) for name in _raw_states(refs)]

    def cancel(self, refs: tp.Sequence[SkyRef]) -> None:
        """``sky.jobs.cancel`` (managed) or ``sky.cancel`` on the job's cluster."""
        sky = _sky()
        for ref in refs:
            sky.get(sky.cancel(ref.cluster, job_ids=[int(ref.job_id)]) if ref.cluster
                    else sky.jobs.cancel(job_ids=[int(ref.job_id)]))

    def ref_from_record(self, record: tp.Mapping[str, tp.Any]) -> SkyRef:
        ref = record.get("ref") or {}
        if ref:
            return SkyRef(str(ref["job_id"]), ref.get("cluster"))
        cluster, _, num = str((record.get("job_ids") or [""])[0]).rpartition(":")
        return SkyRef(num, cluster or None)
