"""The ``slurm:`` section's schema (:class:`SlurmConfig`) and the Slurm defaults of a call job
(:data:`CALL_DEFAULTS`); an AutoModel file's are its kind's (:data:`automodel_hydra.automodel.kind.SLURM_DEFAULTS`).

Pure: imports only :mod:`automodel_hydra.schema` and :mod:`automodel_hydra.bootstrap`'s port constants, so
:mod:`automodel_hydra.config` (and every rank that reads a job's config) loads no backend.
:mod:`automodel_hydra.backends.slurm` plans and submits with it.
"""

from __future__ import annotations

import math
import re
import typing as tp
from dataclasses import dataclass, field

from automodel_hydra.bootstrap import DEFAULT_PORT, PORT_SPAN
from automodel_hydra.schema import ConfigError, at_least, check_port, one_line, require

#: The Slurm options of a call job (a Hydra task function that is not ours, ``hydra.launcher.slurm``) where they
#: differ from :class:`SlurmConfig`'s: one task on one node, no GPU unless asked, and ``job_name: ""`` = the Hydra
#: job's name.
CALL_DEFAULTS: dict[str, tp.Any] = {"job_name": "", "ntasks_per_node": 1, "gpus_per_node": 0}


#: Pyxis' srun options the ``slurm:`` fields own -> the field (srun would take the last one given, dropping the
#: job dir's mount, the snapshot's or HF_HOME's).
PYXIS_OWNED = {"--container-image": "container_image", "--container-mounts": "extra_mounts",
               "--container-workdir": "chdir"}


# sbatch(1), option --time: "Acceptable time formats include "minutes", "minutes:seconds", "hours:minutes:seconds",
# "days-hours", "days-hours:minutes" and "days-hours:minutes:seconds"."
_SLURM_TIME = re.compile(r"^(?:(?P<days>\d+)-(?P<dh>\d+)(?::(?P<dm>\d+)(?::(?P<ds>\d+))?)?"
                         r"|(?P<a>\d+)(?::(?P<b>\d+)(?::(?P<c>\d+))?)?)$")


def parse_slurm_time(value: str | int, key: str = "slurm.time") -> int:
    """Parse a Slurm wall-time limit into whole minutes, rounding seconds up.

    Accepts every form sbatch(1) ``--time`` documents: ``MM``, ``MM:SS``, ``HH:MM:SS``, ``D-HH``, ``D-HH:MM``,
    ``D-HH:MM:SS``, and an integer number of minutes. ``UNLIMITED``/``INFINITE`` and ``0`` (which Slurm reads as
    "no limit") are rejected: a launcher that checkpoints before the limit needs a finite one.

    Returns
    -------
    int
        Minutes, >= 1 (``"00:30:30"`` -> 31, ``"1-00:00:00"`` -> 1440, ``90`` -> 90).

    Raises
    ------
    ConfigError
        The value matches none of the forms, or is zero.
    """
    text = str(value).strip()
    m = _SLURM_TIME.match(text)
    valid = "a Slurm time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or integer minutes, > 0"
    if not m:
        raise ConfigError(key, value, valid)
    g = {k: int(v or 0) for k, v in m.groupdict().items()}
    if m["days"] is not None:
        seconds = g["days"] * 86400 + g["dh"] * 3600 + g["dm"] * 60 + g["ds"]
    elif m["c"] is not None:  # HH:MM:SS
        seconds = g["a"] * 3600 + g["b"] * 60 + g["c"]
    else:  # MM or MM:SS
        seconds = g["a"] * 60 + g["b"]
    require(seconds > 0, key, value, valid)
    return math.ceil(seconds / 60)



@dataclass
class VolumeMapping:
    """A container mount ``source`` (on the host) -> ``dest`` (in the container); both absolute."""

    source: str
    dest: str

    @classmethod
    def parse(cls, item: tp.Any, key: str) -> VolumeMapping:
        """Accept ``{source, dest}`` or ``"src:dst"``; check both are absolute (whether the source exists is a
        question for the host that runs the job: see :meth:`Slurm.preflight`).

        Raises ConfigError naming ``key`` otherwise."""
        if isinstance(item, VolumeMapping):
            vm = item
        elif isinstance(item, str) and item.count(":") == 1:
            vm = cls(*item.split(":"))
        elif isinstance(item, tp.Mapping) and set(item) == {"source", "dest"}:
            vm = cls(str(item["source"]), str(item["dest"]))
        else:
            raise ConfigError(key, item, "a mount {source: /abs/host/path, dest: /abs/container/path} or '/src:/dst'")
        require(vm.source.startswith("/"), f"{key}.source", vm.source, "must be an absolute path")
        require(vm.dest.startswith("/"), f"{key}.dest", vm.dest, "must be an absolute path")
        return vm


#: A host name, an IPv4/IPv6 address or an ssh_config(5) ``Host`` alias: nothing ssh would read as an option.
_HOST = re.compile(r"[A-Za-z0-9_.:%\[\]-]+\Z")
_USER = re.compile(r"[A-Za-z0-9_.][A-Za-z0-9_.@-]*\Z")
_OPTION = re.compile(r"[A-Za-z][A-Za-z0-9]*\Z")
#: Fields whose ``~`` is another machine's home, and whose: such a ``~`` is never this machine's (no local
#: expansion, no local path suggested in an error). The tunnel's are expanded with the login node's ``$HOME``, read
#: once at preflight; ``slurm.hf_home``'s is written as ``"$HOME"`` for the job's shell on the nodes.
HOME_ELSEWHERE = {"slurm.tunnel.job_dir": "the login node's home", "slurm.tunnel.python": "the login node's home",
                  "slurm.hf_home": "the job user's home on the nodes"}


def home_path(value: str) -> bool:
    """Whether ``value`` is ``~`` or under ``~/`` (a home path; ``~user/...`` is not one of ours)."""
    return value == "~" or value.startswith("~/")


@dataclass
class TunnelConfig:
    """Submit through SSH to a Slurm login node (``slurm.tunnel``); NeMo-Run's ``SSHTunnel`` names.

    ``job_dir`` is an absolute path on the remote host, or one under ``~/`` (the login node's home): each run's or
    sweep's dir there is ``job_dir`` plus its local path (relative to the submitting dir when inside it).
    ``identity`` is a private key file here (``~`` allowed: this machine's home); ``options`` are extra
    ssh_config(5) options (``ProxyJump``, ``UserKnownHostsFile`` ...) given as ``-o KEY=VALUE``; the user's own
    ``~/.ssh/config`` applies as well. ``python`` is the interpreter the ranks run there (the one on the job's PATH
    after ``slurm.setup``, by default; ``~/`` is the login node's home). ``reconnect_timeout_s``: how long a
    launcher that follows a job (``slurm.wait``) tries to reach the login node again when the connection drops
    before it gives up waiting (the job stays submitted). docs/remote.md.
    """

    host: tp.Optional[str] = None
    user: tp.Optional[str] = None
    port: tp.Optional[int] = None
    identity: tp.Optional[str] = None
    job_dir: str = ""
    python: str = "python"
    options: tp.Dict[str, str] = field(default_factory=dict)
    reconnect_timeout_s: float = 300.0

    def __post_init__(self) -> None:
        if self.host is None:  # no tunnel: sbatch here
            return
        require(bool(self.host) and _HOST.match(self.host) is not None and not self.host.startswith("-"),
                "slurm.tunnel.host", self.host, "a host name, address or ~/.ssh/config Host alias of the cluster's "
                "login node (no spaces, not starting with '-')")
        if self.user is not None:
            require(_USER.match(self.user) is not None, "slurm.tunnel.user", self.user,
                    "a user name on the login node (letters, digits, '_', '.', '-'), or null for ssh's own choice")
        if self.port is not None:
            require(1 <= self.port <= 65535, "slurm.tunnel.port", self.port, "a TCP port in 1..65535, or null (22 "
                    "or ~/.ssh/config's Port)")
        if self.identity is not None:
            require(bool(self.identity) and "\n" not in self.identity, "slurm.tunnel.identity", self.identity,
                    "the path of a private key file on this machine, or null (ssh's agent and ~/.ssh/config)")
        require((self.job_dir.startswith("/") or home_path(self.job_dir)) and "\n" not in self.job_dir
                and "\0" not in self.job_dir, "slurm.tunnel.job_dir", self.job_dir, "an absolute path on the login "
                "node, or one under ~/ (the login node's home), under which each run's dir goes (NeMo-Run's "
                "SSHTunnel.job_dir)")
        require(bool(self.python) and "\n" not in self.python and (home_path(self.python)
                                                                   or not self.python.startswith("~")),
                "slurm.tunnel.python", self.python, "the ranks' python on the cluster: a command on the job's PATH, "
                "an absolute path, or one under ~/ (the login node's home)")
        require(self.reconnect_timeout_s >= 0, "slurm.tunnel.reconnect_timeout_s", self.reconnect_timeout_s,
                "seconds >= 0 that a launcher following a job tries to reach the login node again (0: it stops "
                "waiting at once)")
        for key, value in self.options.items():
            require(_OPTION.match(str(key)) is not None and "\n" not in str(value), f"slurm.tunnel.options.{key}",
                    value, "an ssh_config(5) option name with a one-line value (e.g. ProxyJump: bastion)")



@dataclass
class SlurmConfig:
    """One Slurm job (sbatch + srun). Times are Slurm time strings, sizes Slurm size strings."""

    #: Fields whose shell references are not expanded by ``config.load``: ``env_vars`` and the tokens keep them
    #: for the job (the script expands them; a secret never becomes its value in a file), and ``SCRIPT_FIELDS``
    #: are bash text for the job, written to the script as they are. Every other field's references are expanded
    #: from the submitting shell, with the one grammar of automodel_hydra/envvars.py.
    SHELL_FIELDS: tp.ClassVar[tuple[str, ...]] = ("env_vars", "setup", "srun_args", "hf_token", "wandb_key")
    SCRIPT_FIELDS: tp.ClassVar[tuple[str, ...]] = ("setup", "srun_args")

    job_name: str = "llm_finetune"
    nodes: int = 1
    # tasks (= ranks) per node; one per GPU on GPU clusters
    ntasks_per_node: int = 8
    # wall-time limit: MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM, D-HH:MM:SS or integer minutes
    time: str = "04:00:00"
    account: tp.Optional[str] = None
    partition: tp.Optional[str] = None
    # Enroot/Pyxis image (srun --container-image); a stock image works: the tasks run the code snapshot, mounted
    # with the run dir and put on PYTHONPATH inside the container (docs/slurm.md, "Containers")
    container_image: tp.Optional[str] = None
    # containers: a path inside the container where this project's live source is mounted instead of the snapshot
    # (put on PYTHONPATH there); or AutoModel's form, its source on the host -> a path in the container
    # ("/src:/opt/Automodel" or {source, dest}): that is mounted and put on PYTHONPATH after this project's
    nemo_mount: tp.Any = None
    # Hugging Face cache (AutoModel's hf_home): exported as HF_HOME on the ranks, created by the job when missing,
    # and mounted at the same path when a container is used; "~/..." is the job user's home on the nodes. null = no
    # HF_HOME from here (the submitting shell's, else Hugging Face's own default ~/.cache/huggingface)
    hf_home: tp.Optional[str] = None
    # VolumeMapping {source, dest} or "src:dst"
    extra_mounts: tp.List[tp.Any] = field(default_factory=list)
    # rendezvous port base; the job uses master_port + SLURM_JOB_ID % 1000 so jobs sharing a node never collide
    master_port: int = DEFAULT_PORT
    # variables for the job; "${VAR}" = the submitting shell's $VAR, expanded in the job, never written to a file
    env_vars: tp.Dict[str, str] = field(default_factory=dict)
    # AutoModel's: the job's HF_TOKEN / WANDB_API_KEY, as a reference to a variable of the submitting shell
    # ("${HF_TOKEN}"; a token's value is never written into the script); null = the submitting shell's own
    # HF_TOKEN / WANDB_API_KEY reach the job when set (also at SBATCH_EXPORT=NONE sites)
    hf_token: tp.Optional[str] = None
    wandb_key: tp.Optional[str] = None
    # AutoModel's: the dir the tasks start in (cd before srun); null = the submitting dir (or the job's dir under
    # hydra.job.chdir=true)
    chdir: tp.Optional[str] = None
    # AutoModel's CLI fills these for its own sbatch script; here every task runs the worker and the run dir keeps
    # the script, config and logs, so they are accepted and ignored (with a warning when set)
    command: tp.Optional[str] = None
    job_dir: tp.Optional[str] = None
    repo_root: tp.Optional[str] = None
    # wrap each task in nsys profile (same switch as profile=nsys)
    nsys_enabled: bool = False
    # GPUs per node (--gpus-per-node); null or 0 = no GPU request (AutoModel's meaning: its template writes
    # --gpus-per-node only when the key is given), so a job runs on a cluster without GPUs; one GPU per task on a
    # GPU cluster: set it to ntasks_per_node
    gpus_per_node: tp.Optional[int] = None
    cpus_per_task: tp.Optional[int] = None
    # memory per node, Slurm size string (e.g. 64G)
    mem: tp.Optional[str] = None
    qos: tp.Optional[str] = None
    constraint: tp.Optional[str] = None
    exclude: tp.Optional[str] = None
    # shell lines run in the batch script before srun (module load, source venv, ...)
    setup: tp.List[str] = field(default_factory=list)
    # more #SBATCH options, {option: value} without the leading dashes (value null = a flag)
    sbatch_args: tp.Dict[str, tp.Any] = field(default_factory=dict)
    # more srun arguments, one list item per argument
    srun_args: tp.List[str] = field(default_factory=list)
    # requeues of the job, of any cause: time limit, preemption, node failure, a failure with failure_budget
    # left (0 = never)
    max_requeues: int = 3
    # seconds before the time limit at which USR2 asks every rank to checkpoint (sbatch --signal=USR2@N)
    signal_delay_s: int = 300
    # sweeps: at most this many array tasks run at once (sbatch --array=...%N)
    array_parallelism: int = 256
    # wait for the job to finish and follow its log (single runs; sweeps wait unless detach)
    wait: bool = False
    # sweeps: submit every job and return at once, leaving a manifest in the sweep dir
    detach: bool = False
    # the code the jobs run, copied at submission into launch/code (a sweep: once, in the sweep dir) so a queued
    # job runs what was submitted: git (the work tree's files, uncommitted changes included), copy (this dir),
    # none (the code where it is when the job starts), auto = git in a git work tree, else copy (docs/remote.md)
    snapshot: str = "auto"
    # the most a snapshot may copy, in MiB (checked before anything is submitted)
    snapshot_max_mb: float = 200.0
    # submit through SSH from this machine: {host, user, port, identity, job_dir} (NeMo-Run's SSHTunnel names);
    # host null = sbatch here (docs/remote.md)
    tunnel: TunnelConfig = field(default_factory=TunnelConfig)

    def __post_init__(self) -> None:
        at_least("slurm.nodes", self.nodes)
        at_least("slurm.ntasks_per_node", self.ntasks_per_node)
        minutes = parse_slurm_time(self.time)
        check_port("slurm.master_port", self.master_port)
        require(self.master_port + PORT_SPAN - 1 <= 65535, "slurm.master_port", self.master_port,
                 f"must leave room for the per-job offset (<= {65536 - PORT_SPAN})")
        at_least("slurm.gpus_per_node", self.gpus_per_node, 0)
        at_least("slurm.cpus_per_task", self.cpus_per_task)
        require(self.max_requeues >= 0, "slurm.max_requeues", self.max_requeues, "must be >= 0")
        at_least("slurm.signal_delay_s", self.signal_delay_s, 0)
        at_least("slurm.array_parallelism", self.array_parallelism)
        require(self.container_image is None or bool(self.container_image.strip()), "slurm.container_image",
                self.container_image, "an image (e.g. nvcr.io/nvidia/nemo:25.02, as srun --container-image takes it), "
                "or null to run on the nodes' own system")
        from automodel_hydra.snapshot import MODES

        require(self.snapshot in MODES, "slurm.snapshot", self.snapshot, f"one of {', '.join(MODES)}")
        require(self.snapshot_max_mb > 0, "slurm.snapshot_max_mb", self.snapshot_max_mb, "must be > 0")
        live = self.container_image is not None and bool(self.nemo_mount) and self.nemo_volume is None
        require(self.snapshot in ("auto", "none") or not live, "slurm.snapshot", self.snapshot,
                f"auto or none with slurm.nemo_mount={self.nemo_mount} (which mounts this project's live source "
                "into the container): leave nemo_mount out to run the snapshot")
        for arg in self.srun_args:  # Pyxis' options that the fields own (their values are planned and checked)
            flag = str(arg).split("=", 1)[0]
            require(flag not in PYXIS_OWNED, "slurm.srun_args", arg, f"no {flag}: set slurm.{PYXIS_OWNED.get(flag)} "
                    "instead (the job's own mounts and workdir are added to it)")
        del minutes  # parsed for its error; a short limit shrinks the margin (checkpoint_margin_s)
        self.extra_mounts = [VolumeMapping.parse(m, f"slurm.extra_mounts[{i}]")
                             for i, m in enumerate(self.extra_mounts)]
        # #SBATCH values are one line each (sbatch reads one option per line); name the field, not the line
        lines = {k: getattr(self, k) for k in ("job_name", "account", "partition", "qos", "constraint", "exclude",
                                                   "mem")}
        lines.update({f"sbatch_args.{k}": v for k, v in self.sbatch_args.items()})
        for key, value in lines.items():
            option = key.rpartition(".")[2].replace("_", "-").lstrip("-")
            one_line(f"slurm.{key}", value, f"sbatch reads one option per line (#SBATCH --{option})")
        if self.hf_home is not None:
            home = home_path(self.hf_home)
            require(home or self.hf_home.startswith("/"), "slurm.hf_home", self.hf_home,
                    "an absolute path, or one under ~/ (the job user's home on the nodes)")
            require("," not in self.hf_home and ":" not in self.hf_home, "slurm.hf_home", self.hf_home,
                    "a path without ',' or ':' (srun --container-mounts cannot express them)")
        if self.chdir is not None and self.container_image is not None:
            require(not self.chdir.startswith("~"), "slurm.chdir", self.chdir, "an absolute path in the container "
                    "(srun --container-workdir expands no ~)")
        if self.nemo_mount is not None and self.nemo_volume is None:
            require(str(self.nemo_mount).startswith("/"), "slurm.nemo_mount", self.nemo_mount,
                    "an absolute path in the container, or AutoModel's '/src:/dst' or {source, dest}")

    @property
    def ssh(self) -> TunnelConfig | None:
        """``tunnel`` when it names a host (jobs are submitted through SSH), else None (sbatch here)."""
        return self.tunnel if self.tunnel.host is not None else None

    @property
    def nemo_volume(self) -> VolumeMapping | None:
        """``nemo_mount`` in AutoModel's form (host source -> container path), else None."""
        value = self.nemo_mount
        if isinstance(value, tp.Mapping) or (isinstance(value, str) and ":" in value):
            return VolumeMapping.parse(dict(value) if isinstance(value, tp.Mapping) else value, "slurm.nemo_mount")
        return None

    @property
    def time_minutes(self) -> int:
        return parse_slurm_time(self.time)

    @property
    def world_size(self) -> int:
        return self.nodes * self.ntasks_per_node

    @property
    def checkpoint_margin_s(self) -> int:
        """Seconds before the time limit at which USR2 asks every rank to checkpoint: ``signal_delay_s``, or half
        the limit when the limit is shorter than twice that (AutoModel's default ``time: "00:05:00"`` with the
        300 s default margin would otherwise leave no time to train)."""
        limit_s = self.time_minutes * 60
        return self.signal_delay_s if 2 * self.signal_delay_s <= limit_s else limit_s // 2
