"""SkyPilot backend: one task per job; a managed job (``sky.jobs.launch``) when ``use_spot``, so preemptions are
recovered, else ``sky.launch`` on a named cluster that stops itself when idle. Every key of NeMo AutoModel's
``skypilot:`` section works with AutoModel's meaning; docs/skypilot.md has the table of keys, AutoModel's defaults
and ours, and the facts of SkyPilot 0.14.1 relied on.

The contract's steps (:mod:`automodel_hydra.plan`):

* :meth:`SkyPilot.preflight` reads what planning needs from this machine and keeps it as :class:`Facts`: the
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
import json
import logging
import os
import re
import shlex
import socket
import typing as tp
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from automodel_hydra.backends.skypilot_env import SECRET_FIELDS, EnvEntry, expand, parse, task_env
from automodel_hydra.bootstrap import DEFAULT_PORT
from automodel_hydra.plan import Backend, Batch, JobResult, JobSpec, Plan, Submission, job_batch
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
#: Why a Hydra task function that is not ours (a call job, automodel_hydra.call) does not run on SkyPilot.
CALL_REFUSAL = ("a task function not declared @automodel_hydra.driver.launchable runs on interactive or slurm only: "
                "on a SkyPilot node its Hydra job dir (.hydra/, its log, every file it writes) would be on the "
                "cloud node, not in the sweep dir here, and its own modules and Python packages are not there; "
                "use hydra.launcher.backend=interactive|slurm, or declare the function @launchable")
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


#: Clouds AutoModel's SkyPilot launcher accepts (``nemo_automodel``'s ``SUPPORTED_CLOUDS``), case-insensitive.
SKYPILOT_CLOUDS = ("aws", "gcp", "azure", "lambda", "kubernetes")
#: Clouds whose clusters cannot be stopped, only torn down (SkyPilot: ``CloudImplementationFeatures.STOP``).
CANNOT_STOP = ("kubernetes", "lambda")


@dataclass
class SkyPilotConfig:
    """One SkyPilot task per job, with NeMo AutoModel's ``skypilot:`` keys and defaults where they decide the
    hardware or the bill. Spot jobs run as SkyPilot managed jobs (preemptions recovered); on-demand jobs run on a
    named cluster (``sky.launch``) that stops itself when idle. docs/skypilot.md: every key, AutoModel's default
    and ours, and why they differ."""

    #: Fields holding shell text, taken raw by ``config.load`` and given their shell meaning here.
    SHELL_FIELDS: tp.ClassVar[tuple[str, ...]] = ("env_vars", "hf_token", "wandb_key", "hf_home", "job_dir", "setup")

    # aws | gcp | azure | lambda | kubernetes (any case); null = the cheapest cloud `sky check` enabled
    cloud: tp.Optional[str] = None
    # NAME:COUNT per node, e.g. H100:8 or A100-80GB:4; null = CPU instances
    accelerators: tp.Optional[str] = "T4:1"
    # instances (nodes), >= 1
    num_nodes: int = 1
    # preemptible instances, run as a SkyPilot managed job so preemptions are recovered (needs checkpoint_bucket)
    use_spot: bool = True
    # disk per node in GB, >= 1; null = SkyPilot's default
    disk_size: tp.Optional[int] = 100
    # cloud region (kubernetes: the context), zone within it, instance type; null = SkyPilot chooses
    region: tp.Optional[str] = None
    zone: tp.Optional[str] = None
    instance_type: tp.Optional[str] = None
    # shell lines run on every node after this project's own install (`pip install -e`), under `set -eo pipefail`
    setup: tp.Optional[str] = None
    # variables for the job; shell references ($VAR, ${VAR}, ${VAR:-default}) are expanded from this shell at launch
    env_vars: tp.Dict[str, str] = field(default_factory=dict)
    # HF_HOME on the nodes; null = not set
    hf_home: tp.Optional[str] = "~/.cache/huggingface"
    # HF_TOKEN / WANDB_API_KEY on the nodes, as SkyPilot secrets; null = this shell's $HF_TOKEN / $WANDB_API_KEY
    # when set; "" = none; "${VAR}" = this shell's $VAR
    hf_token: tp.Optional[str] = None
    wandb_key: tp.Optional[str] = None
    # a local dir that also gets the task files, under <job_dir>/<run name>/; null = only the run dir's launch/
    job_dir: tp.Optional[str] = None
    # rendezvous port on the head node (each job has its own cluster)
    master_port: int = DEFAULT_PORT
    # workers (ranks) per node; null = the accelerator count (1 without accelerators); gpus_per_node: AutoModel's name
    nproc_per_node: tp.Optional[int] = None
    gpus_per_node: tp.Optional[int] = None
    # synced to every node as the working directory; null = this project's root
    workdir: tp.Optional[str] = None
    # bucket holding the job's output dir and checkpoints, mounted at checkpoint_mount (MOUNT_CACHED): a bucket name
    # (created by SkyPilot when missing), a URI (s3://b, gs://b/prefix, ...), "auto" (a per-user bucket when the job
    # needs one: use_spot, or num_nodes > 1 off kubernetes; else the node's disk) or null (node disk; not with spot)
    checkpoint_bucket: tp.Optional[str] = "auto"
    # store for a bucket given by name (s3, gcs, azure, r2, ...); null = the task's cloud
    checkpoint_store: tp.Optional[str] = None
    # where the bucket is mounted on every node (absolute)
    checkpoint_mount: str = "/checkpoints"
    # the run's name on the cloud (task, managed job, default cluster name, bucket dir: a relaunch with the same name
    # resumes there), made a valid SkyPilot name (my_run -> my-run); null = <job name>-<hash of the output dir>;
    # sweeps add -<num>. job_name: AutoModel's name for it
    run_name: tp.Optional[str] = None
    job_name: tp.Optional[str] = None
    # on-demand only: cluster name (null = the run name)
    cluster_name: tp.Optional[str] = None
    # on-demand only: stop the cluster after this many idle minutes; null = keep it up until `sky stop`/`sky down`
    idle_minutes_to_autostop: tp.Optional[int] = 10
    # on-demand only: tear the cluster down instead of stopping it; null = down when the outputs are in a bucket or
    # the cloud cannot stop (kubernetes, lambda), else stop (the node disk keeps the outputs)
    down: tp.Optional[bool] = None
    # managed (spot) jobs: also restart after this many user-code failures (preemptions are always recovered)
    max_restarts_on_errors: int = 0
    # wait for the job(s) and return their final state (single runs and sweeps); false = return right after launch
    wait: bool = True
    # not supported here: requeue is a Slurm feature; spot recovery is use_spot=true
    max_requeues: tp.Optional[int] = None

    def __post_init__(self) -> None:
        self.nproc_per_node = _alias("nproc_per_node", self.nproc_per_node, "gpus_per_node", self.gpus_per_node)
        self.run_name = _alias("run_name", self.run_name, "job_name", self.job_name)
        self.gpus_per_node = self.job_name = None  # normalised once: the canonical key holds the value
        if self.cloud is not None:
            require(self.cloud.lower() in SKYPILOT_CLOUDS, "skypilot.cloud", self.cloud,
                    f"one of {list(SKYPILOT_CLOUDS)}, or null for the cheapest cloud `sky check` enabled")
            self.cloud = self.cloud.lower()
        if self.accelerators is not None:
            ok = re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*(:[1-9][0-9]*)?", str(self.accelerators))
            require(bool(ok), "skypilot.accelerators", self.accelerators, "NAME or NAME:COUNT, e.g. 'H100:8'")
        for key in ("region", "zone", "instance_type"):
            value = getattr(self, key)
            slash_ok = key == "region" and self.cloud == "kubernetes"  # a context name may hold '/'
            require(value is None or bool(re.fullmatch(r"[^\s/]+" if not slash_ok else r"\S+", value)),
                    f"skypilot.{key}", value, "a name without spaces or '/'")
        require(self.zone is None or self.cloud != "kubernetes", "skypilot.zone", self.zone,
                "null on kubernetes (skypilot.region names the context)")
        at_least("skypilot.num_nodes", self.num_nodes)
        at_least("skypilot.disk_size", self.disk_size)
        at_least("skypilot.nproc_per_node", self.nproc_per_node)
        at_least("skypilot.idle_minutes_to_autostop", self.idle_minutes_to_autostop, 0)
        require(not (self.down is False and self.cloud in CANNOT_STOP and self.idle_minutes_to_autostop is not None),
                "skypilot.down", self.down, f"true or null on {self.cloud}, which cannot stop a cluster (only tear it "
                "down); skypilot.idle_minutes_to_autostop=null keeps it up")
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
        require(self.run_name is None or bool(sky_name(self.run_name)), "skypilot.run_name", self.run_name,
                "a name with at least one letter or digit")
        require(self.cluster_name is None or bool(re.fullmatch(_SKY_NAME, self.cluster_name)),
                "skypilot.cluster_name", self.cluster_name,
                "a SkyPilot cluster name: letters, digits, '-', '_', '.', starting with a letter")

    @property
    def accelerator_count(self) -> int:
        """Accelerators per node (``H100:8`` -> 8, ``T4`` -> 1, none -> 0)."""
        if not self.accelerators:
            return 0
        _, _, count = str(self.accelerators).partition(":")
        return int(count or 1)

    @property
    def nproc(self) -> int:
        """torchrun workers per node: ``nproc_per_node``, else the accelerator count, else 1 (AutoModel's rule)."""
        return self.nproc_per_node or self.accelerator_count or 1


def _alias(key: str, value: tp.Any, alias: str, alias_value: tp.Any) -> tp.Any:
    """The value of ``skypilot.<key>``, given AutoModel's name for it; both set to different values is an error."""
    if alias_value is None or alias_value == value:
        return value
    require(value is None, f"skypilot.{alias}", alias_value,
            f"skypilot.{alias} is AutoModel's name for skypilot.{key}, which is set to {value!r}: set one of the two")
    return alias_value


#: S3/GCS bucket names; SkyPilot cluster names (``CLUSTER_NAME_VALID_REGEX`` of sky/skylet/constants.py).
_BUCKET_NAME = r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]"
_SKY_NAME = r"[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?"


@dataclasses.dataclass(frozen=True)
class Facts:
    """What :meth:`SkyPilot.preflight` read on the submitting machine, so that planning reads nothing.

    ``auto_bucket``: the bucket for ``checkpoint_bucket: auto`` (:func:`default_bucket`); ``set_vars``: which of
    ``HF_TOKEN`` / ``WANDB_API_KEY`` are set in this shell (names only, never values); ``job_dirs``: each
    ``skypilot.job_dir`` as written -> the absolute dir it means here; ``paths``: ``data.path`` and a local
    ``model.name_or_path`` as written -> the absolute path uploaded to the nodes."""

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


def sky_name(text: str) -> str:
    """A name every cloud accepts for a SkyPilot task, cluster and bucket dir: lowercase letters, digits and single
    dashes, starting with a letter (``llama3_2_1b_squad`` -> ``llama3-2-1b-squad``); "" when nothing is left."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug if not slug or slug[:1].isalpha() else f"j-{slug}"


def run_key(sc: SkyPilotConfig, job: JobSpec) -> str:
    """The run's name on the cloud: :func:`sky_name` of ``skypilot.run_name`` (or AutoModel's ``job_name``), else
    ``<job name>-<6 hex of the run/sweep dir>``; sweep points add ``-<job num>``. Same job dir, same key: a relaunch
    resumes from the same bucket dir."""
    sweep = job.job_num is not None
    if sc.run_name is not None:
        base = sky_name(sc.run_name)
    else:
        digest = hashlib.sha1(str(job.job_dir.parent if sweep else job.job_dir).encode()).hexdigest()[:6]
        base = f"{(sky_name(job.job_name) or 'job')[:24].rstrip('-')}-{digest}"
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


def make_plan(cfg: TrainConfig, job: JobSpec, facts: Facts) -> Plan[Request]:
    """Plan ``cfg``'s SkyPilot task: files ``sky_task.yaml`` and ``job.sky.yaml``, request :class:`Request`.
    Pure: reads only its arguments (``facts``: what preflight read on this machine), no ``import sky``.

    The task's ``envs``: ``HF_HOME`` (``hf_home``), Hydra's ``hydra.job.env_set`` (every node, every rank), then
    ``env_vars``; ``HF_TOKEN`` / ``WANDB_API_KEY`` and single-reference ``env_vars`` are secrets
    (:mod:`automodel_hydra.backends.skypilot_env`). ``job.workdir`` (``hydra.job.chdir``) is a path on this machine
    and has no meaning on the nodes: the ranks start in the synced workdir.

    Raises
    ------
    ConfigError
        A rule that spans sections: spot needs ``checkpoint.enabled`` and ``restore_from.path: latest`` (a recovered
        job must resume); ``restore_from.path`` must be ``latest`` or null (a local path is not on the nodes); a
        variable set twice (``env_vars`` and ``env_set``/``hf_token``/``wandb_key``); a malformed reference.
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
    node["checkpoint"]["dir"] = _yaml_path(f"{out}/checkpoints")
    if cfg.data.source == "file" and cfg.data.path:  # the local text file travels with the job
        file_mounts[f"{root}/launch/data/{Path(cfg.data.path).name}"] = facts.paths[cfg.data.path]
        node["data"]["path"] = _yaml_path(f"{root}/launch/data/{Path(cfg.data.path).name}")
    model = cfg.model.name_or_path
    if model is not None and model in facts.paths:  # a local model dir, not a hub id
        file_mounts[f"{root}/launch/model"] = facts.paths[model]
        node["model"]["name_or_path"] = _yaml_path(f"{root}/launch/model")
    if bucket:
        file_mounts[sc.checkpoint_mount] = _storage(bucket, sc.checkpoint_store)
    elif sc.num_nodes > 1:
        warnings.warn(f"skypilot.checkpoint_bucket=null with skypilot.num_nodes={sc.num_nodes}: each node keeps its "
                      "own checkpoint files; resuming needs a bucket shared by all nodes", stacklevel=2)
    install = f"{PROJECT_INSTALL} ."
    if sc.workdir is not None:  # the workdir is the user's: this project travels beside it
        file_mounts[PROJECT_MOUNT] = str(job.project_root)
        install = f"{PROJECT_INSTALL} {_sh(PROJECT_MOUNT + '/')}"

    env = task_env(sc.env_vars, {f: getattr(sc, f) for f in SECRET_FIELDS}, sc.hf_home, job.env, facts.set_vars)
    worker = ["-m", "automodel_hydra.worker", job_file, "--log-file", f"{out}/{job.job_name}.log"]
    prefix = nsys_prefix(cfg.profile.nsys, out, job.job_name, rank_var="RANK")
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
    task["run"] = render_run(key, sc.nproc, sc.master_port, worker, prefix, out)

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


class SkyPilot(Backend[Request, SkyRef]):
    """SkyPilot: one task per job; a managed job when ``use_spot``, else ``sky.launch`` on a named cluster."""

    name = "skypilot"

    def __init__(self) -> None:
        self.facts: Facts | None = None
        self._access: dict[str | None, str | None] = {}  # cloud -> its credential problem, asked once

    def preflight(self, cfgs: tp.Sequence[TrainConfig]) -> None:
        """Read what planning needs from this machine (:class:`Facts`): the ``auto`` bucket name (user and host
        name), which of ``HF_TOKEN`` / ``WANDB_API_KEY`` are set, each ``job_dir`` (shell references, ``~`` and a
        relative path resolved here), the local files uploaded to the nodes. Raises ConfigError for a
        ``data.path`` that is not a file here, PreflightError for an unset reference in ``job_dir``."""
        job_dirs: dict[str, str] = {}
        paths: dict[str, str] = {}
        for cfg in cfgs:
            sc = cfg.skypilot
            assert sc is not None
            if sc.job_dir is not None:
                text = expand(parse(sc.job_dir, "skypilot.job_dir"), os.environ, "skypilot.job_dir")
                job_dirs[sc.job_dir] = os.path.abspath(os.path.expanduser(text))
            if cfg.data.source == "file" and cfg.data.path:
                data = Path(cfg.data.path).expanduser()
                require(data.is_file(), "data.path", cfg.data.path, "an existing file here (it is uploaded to the "
                        "nodes)")
                paths[cfg.data.path] = str(data.resolve())
            model = cfg.model.name_or_path
            if model and Path(model).expanduser().exists():  # a local model dir, else a hub id
                paths[model] = str(Path(model).expanduser().resolve())
        user = os.environ.get("USER", "user")
        with contextlib.suppress(KeyError, OSError):
            user = getpass.getuser()
        self.facts = Facts(default_bucket(user, socket.gethostname()),
                           frozenset(n for n in SECRET_FIELDS.values() if os.environ.get(n)), job_dirs, paths)

    def world_size(self, cfg: TrainConfig) -> int:
        sc = cfg.skypilot
        assert sc is not None
        return sc.num_nodes * sc.nproc

    def plan(self, cfg: TrainConfig, job: JobSpec) -> Plan[Request]:
        """:func:`make_plan` with the facts :meth:`preflight` read (SkyPilot's schema check is :meth:`check`).

        A call job (a Hydra task function that is not ours) is refused: :data:`CALL_REFUSAL` says why."""
        if job.call is not None:
            raise ConfigError("hydra.launcher.backend", "skypilot", CALL_REFUSAL)
        if self.facts is None:
            raise RuntimeError("SkyPilot.preflight(cfgs) must run before plan: planning reads no machine")
        return make_plan(cfg, job, self.facts)

    def check(self, plans: tp.Sequence[Plan[Request]]) -> None:
        """SkyPilot's own schema and ``sky.Task`` construction for every planned task, and every shell reference
        expanded in this shell (values discarded); before anything is written or launched."""
        from automodel_hydra.backends import skypilot_bridge, skypilot_sdk

        for p in plans:
            skypilot_sdk.launch_values(p.request, os.environ)
        skypilot_bridge.call("validate_all", [p.request.task for p in plans])

    def batches(self, plans: tp.Sequence[Plan[Request]], sweep_dir: Path | None) -> list[Batch[Request]]:
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
            return [StateInfo(JobState.UNKNOWN, why) for _ in refs]
        return [StateInfo(JobState(STATE.get(name, "UNKNOWN"))) for name in names]

    def cancel(self, refs: tp.Sequence[SkyRef]) -> None:
        """``sky.jobs.cancel`` (managed) or ``sky.cancel`` on the job's cluster."""
        from automodel_hydra.backends import skypilot_bridge

        skypilot_bridge.call("cancel", list(refs))

    def ref_from_record(self, record: tp.Mapping[str, tp.Any]) -> SkyRef:
        ref = record.get("ref") or {}
        if ref:
            return SkyRef(str(ref["job_id"]), ref.get("cluster"))
        cluster, _, num = str((record.get("job_ids") or [""])[0]).rpartition(":")
        return SkyRef(num, cluster or None)
