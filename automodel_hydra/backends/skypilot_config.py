"""The ``skypilot:`` section's schema (:class:`SkyPilotConfig`), with NeMo AutoModel's keys and names.

Pure: imports only :mod:`automodel_hydra.schema` and :mod:`automodel_hydra.bootstrap`'s port constant, so
:mod:`automodel_hydra.config` (and every rank that reads a job's config) loads no backend;
:mod:`automodel_hydra.backends.skypilot` plans and launches with it.
"""

from __future__ import annotations

import re
import typing as tp
from dataclasses import dataclass, field

from automodel_hydra.bootstrap import DEFAULT_PORT
from automodel_hydra.schema import at_least, check_port, require

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

    #: Fields whose shell references ``config.load`` keeps (read with automodel_hydra/envvars.py's grammar) for
    #: the backend, which expands them at launch; ``SCRIPT_FIELDS`` are bash text for the nodes, kept as written.
    SHELL_FIELDS: tp.ClassVar[tuple[str, ...]] = ("env_vars", "hf_token", "wandb_key", "hf_home", "job_dir", "setup")
    SCRIPT_FIELDS: tp.ClassVar[tuple[str, ...]] = ("setup",)

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
    # workers (ranks) per node; null = the accelerator count (1 without accelerators); gpus_per_node: AutoModel's
    # name for it (config.ALIASES)
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
    # resumes there), made a valid SkyPilot name (my_run -> my-run); null = <job_name>-<hash of the output dir>;
    # sweeps add -<num>. Only this key makes two runs share a bucket dir: that is what it is for
    run_name: tp.Optional[str] = None
    # AutoModel's name of the task and cluster: the readable part of the default run name, which keeps the hash of
    # the output dir (a file's job_name is the same in every run of that file, so it must not key the bucket dir:
    # a second run would resume from the first one's checkpoints); null = the Hydra job name
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
        for key in ("run_name", "job_name"):
            require(getattr(self, key) is None or bool(sky_name(getattr(self, key))), f"skypilot.{key}",
                    getattr(self, key), "a name with at least one letter or digit")
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


#: S3/GCS bucket names; SkyPilot cluster names (``CLUSTER_NAME_VALID_REGEX`` of sky/skylet/constants.py).
_BUCKET_NAME = r"[a-z0-9][a-z0-9.\-]{1,61}[a-z0-9]"
_SKY_NAME = r"[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?"


def sky_name(text: str) -> str:
    """A name every cloud accepts for a SkyPilot task, cluster and bucket dir: lowercase letters, digits and single
    dashes, starting with a letter (``llama3_2_1b_squad`` -> ``llama3-2-1b-squad``); "" when nothing is left."""
    slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")
    return slug if not slug or slug[:1].isalpha() else f"j-{slug}"
