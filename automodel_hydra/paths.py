"""The paths a job writes: relative ones made the job's own, shared ones refused, unwritable ones found early.

The rule (docs/architecture.md, "Paths a job writes"):

* **A relative path a job writes is relative to its job dir** (``output_dir``: Hydra's ``hydra.run.dir`` or its
  sweep subdir), on every launcher and whatever the ranks' working dir is (torchrun here starts them in the
  launching dir unless ``hydra.job.chdir=true``; sbatch in the submitting dir; SkyPilot in its synced workdir).
  That is what a Hydra user expects (Hydra's own outputs live in the job dir), and it makes AutoModel's default
  ``checkpoint.checkpoint_dir: checkpoints/`` one dir per sweep point. The written dirs are the bundled recipe's
  ``checkpoint.dir`` and ``profile.nsys.output_dir`` (:class:`automodel_hydra.config.TrainConfig`) and, in the
  sections of any other recipe, every key named in :data:`WRITTEN_DIR_KEYS` (AutoModel's
  ``checkpoint.checkpoint_dir``, where its recipe also writes ``training.jsonl``). The rank applies it
  (:func:`anchored_sections`), against the ``output_dir`` it has: on a SkyPilot node that is the node's dir.
  Paths a job reads (``data.path``, ``restore_from.path``, a model dir) keep Hydra's meaning.
* **No two jobs of a sweep write one path**: the job dirs (``result.json``, ``metrics.jsonl``, logs, ``launch/``),
  the checkpoint dirs, the profile dirs. An absolute path (or a ``hydra.sweep.subdir`` without the job's number)
  that two points share is refused before anything is written or submitted, in one line naming the key, the path
  and the jobs (:func:`refuse_shared`); also against the jobs an earlier launch of the same sweep recorded in its
  manifest (a sweeper that launches in batches).
* **The local paths a job reads reach its ranks, or the job is refused before anything starts**
  (:func:`local_reads`): where the ranks do not see this machine's filesystem (SkyPilot nodes, a Slurm container),
  every model dir, tokenizer, teacher and dataset file or dir the ranks will read (:func:`read_paths`) must be an
  absolute path that exists here; the backend ships it to the same path (a SkyPilot file mount, a container
  mount), so the recipe's sections reach the ranks unchanged. A relative or ``~`` path (it would mean another
  dir there) and a path that does not exist here are one line naming the key, the value and what to write. A Hub
  id is not a path and is left alone.
* **A path built from names the user chose fits the filesystem, or the job is refused before it is made**
  (:func:`too_long`, :func:`name_problems`): a sweep's job dir (``hydra.sweep.dir`` and ``hydra.sweep.subdir``,
  e.g. ``${hydra.job.override_dirname}`` of many overrides), the job log and the nsys reports named after
  ``hydra.job.name``, the written dirs. A name over the filesystem's limit (``NAME_MAX``, 255 bytes on Linux's
  filesystems) or a path over ``PATH_MAX`` is one line naming the key, the limit and the way out, instead of an
  ``OSError: File name too long`` traceback.
* **Unwritable dirs are found before any rank starts** (:func:`write_problems`), where this machine can know:
  the job dir always (the launch writes ``launch/`` there and reads ``result.json`` back from it, so it is on a
  filesystem this machine shares with the ranks), and every other written dir on the interactive launcher and
  on bare-metal Slurm (the backends' ``preflight``, with :func:`automodel_hydra.config.host_problems`).
"""

from __future__ import annotations

import os
import re
import tempfile
import typing as tp
from pathlib import Path

from automodel_hydra.schema import ConfigError, UserError

if tp.TYPE_CHECKING:
    from automodel_hydra.config import TrainConfig

#: A checkpoint dir's pointer to its newest complete step dir, and DCP's index file in every checkpoint
#: (automodel_hydra.checkpoint has the layout; named here so that planning knows them without importing torch).
POINTER = "latest"
METADATA = ".metadata"
#: The bundled recipe's checkpoint dir when ``checkpoint.dir`` is null, under the job's output dir (AutoModel's own
#: default, ``checkpoint.checkpoint_dir: checkpoints/``, is the same name: automodel_hydra.automodel.resume).
DEFAULT_CHECKPOINT_DIR = "checkpoints"
#: A checkpoint's step dir, ``step-N``: N is the optimizer step it was saved after (:func:`step_dir_name`).
STEP_DIR = re.compile(r"^step-(\d+)$")


def step_dir_name(step: int) -> str:
    """The name of the step dir of a checkpoint saved after ``step``: ``step-50``."""
    return f"step-{step}"


def step_of(name: str) -> int | None:
    """The step a step dir's name gives (``step-50`` -> 50); None for any other name."""
    m = STEP_DIR.match(name)
    return int(m.group(1)) if m else None


def pointer_dir(path: str | os.PathLike | None) -> Path | None:
    """The checkpoint dir ``D`` that ``restore_from.path`` names in the form ``D/latest`` (:data:`POINTER`, the
    pointer file's own path), else None: for ``latest`` itself, None, a path with another last component, and a
    dir named ``latest`` that holds a checkpoint (``.metadata``: an explicit step dir, as any other)."""
    if path is None or str(path) == POINTER:
        return None
    p = Path(path)
    if p.name != POINTER or (p / METADATA).is_file():
        return None
    return p.parent


#: Leaf key names, anywhere in a recipe's sections (not the bundled recipe's), whose value is a dir the job writes:
#: AutoModel's ``checkpoint.checkpoint_dir`` and the names recipes commonly use for a written dir.
WRITTEN_DIR_KEYS = ("checkpoint_dir", "ckpt_dir", "save_dir", "log_dir", "output_dir")


def path_form(value: str) -> tp.Literal["absolute", "home", "relative"] | None:
    """What ``value`` is by its form alone: ``absolute`` (``/...``), ``home`` (``~...``: the home of whoever
    reads it), ``relative`` (``.``, ``./...``, ``../...``, or more ``/`` than a Hub id has), else None: a
    URL (``hf://``, ``s3://``) or what may be a Hub id (``name`` or ``org/name``, huggingface_hub's form), which is
    a local path only if it exists where it is read (transformers' ``from_pretrained`` and AutoModel's
    ``_str_is_hf_repo_id`` both look for the path first). Pure: reads no filesystem."""
    if "://" in value:
        return None
    if value.startswith("/"):
        return "absolute"
    if value.startswith("~"):
        return "home"
    if value in (".", "..") or value.startswith(("./", "../")) or value.count("/") > 1:
        return "relative"
    return None


def _relative(value: tp.Any) -> bool:
    """A plain relative path: a non-empty string, no interpolation or shell reference (those are resolved where
    the rank runs, and mean there what they mean)."""
    return isinstance(value, str) and bool(value.strip()) and "$" not in value and not value.startswith(("/", "~"))


def _walk(node: tp.Any, prefix: str) -> tp.Iterator[tuple[str, tp.Any, dict[str, tp.Any], str]]:
    """``(full key, value, parent mapping, leaf key)`` of every written-dir key under ``node``."""
    if not isinstance(node, dict):
        return
    for k, v in node.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            yield from _walk(v, f"{key}.")
        elif k in WRITTEN_DIR_KEYS and isinstance(v, str):
            yield key, v, node, str(k)


def anchored_sections(sections: tp.Mapping[str, tp.Any], output_dir: str | os.PathLike) -> dict[str, tp.Any]:
    """A copy of a recipe's sections (plain containers, interpolations unresolved) with every relative written dir
    (:data:`WRITTEN_DIR_KEYS`) joined onto ``output_dir``; the top-level ``output_dir`` (ours) is left alone."""
    import copy

    out = copy.deepcopy(dict(sections))
    for _key, value, parent, leaf in list(_walk({k: v for k, v in out.items() if k != "output_dir"}, "")):
        if _relative(value):
            parent[leaf] = str(Path(output_dir) / value)
    return out


def written_keys(sections: tp.Mapping[str, tp.Any]) -> list[tuple[str, str]]:
    """``(dotted key, value)`` of every written-dir key (:data:`WRITTEN_DIR_KEYS`) anywhere in a recipe's
    sections whose value is a string, as written, in order."""
    return [(key, value) for key, value, _, _ in _walk(dict(sections), "")]


def written_dirs(cfg: TrainConfig, job_dir: Path) -> list[tuple[str, Path]]:
    """``(key, absolute path)`` of every dir the job writes, as the ranks will resolve it (relative ones under
    ``job_dir``): the job dir (key ``output_dir``), then the recipe's own (its kind's answer,
    :meth:`automodel_hydra.recipe_kind.RecipeKind.written_dirs`: the checkpoint and profile dirs). Values the
    submitting side cannot resolve (``${VAR}``, interpolations) are left out."""
    found: list[tuple[str, Path]] = [("output_dir", job_dir), *cfg.kind.written_dirs(cfg, job_dir)]
    return [(k, Path(os.path.normpath(p))) for k, p in found]


def refuse_shared(jobs: tp.Sequence[tuple[int | None, Path, list[tuple[str, Path]]]],
                  earlier: tp.Mapping[str, tp.Mapping[str, str]] | None = None) -> None:
    """Refuse a sweep in which two jobs write one dir. ``jobs``: ``(job num, job dir, written_dirs)`` of each job of
    this launch; ``earlier``: job dir -> {key: path} an earlier launch of the same sweep recorded (its other jobs
    count too; a job relaunched in its own dir does not collide with itself).

    Raises ConfigError naming the key, the path and the jobs that share it."""
    users: dict[Path, list[tuple[str, str]]] = {}  # path -> [(key, who)]
    for num, job_dir, dirs in jobs:
        for key, path in dirs:
            users.setdefault(path, []).append((key, f"job {num}" if num is not None else str(job_dir)))
    mine = {str(job_dir) for _, job_dir, _ in jobs}
    for other, recorded in (earlier or {}).items():
        if other in mine:
            continue
        for key, text in recorded.items():
            if Path(text) in users:
                users[Path(text)].append((key, f"job {other} of an earlier launch of this sweep"))
    for path, who in users.items():
        names = list(dict.fromkeys(w for _, w in who))
        if len(names) < 2:
            continue
        key = who[0][0]
        fix = ("give each job its own dir: Hydra's hydra.sweep.subdir must name the job (default ${hydra.job.num})"
               if key == "output_dir" else
               f"give each job its own: a relative {key} is each job's own, under its job dir")
        raise ConfigError(key, str(path), f"sweep {' and '.join(names)} would all write there (each would read, "
                          f"resume from or overwrite the others' files); {fix}")


def _nearest_existing(path: Path) -> Path:
    p = path
    while not p.exists() and p.parent != p:
        p = p.parent
    return p


def unwritable(path: Path) -> str | None:
    """Why the job could not create or write ``path`` (a dir), or None when it can: the path or its nearest
    existing ancestor is not a dir, or a probe file cannot be created there (a read-only filesystem, another
    user's dir; probing also holds for root, whom mode bits do not stop). The probe is removed at once; nothing
    is created when ``path`` does not exist yet."""
    base = _nearest_existing(Path(path))
    if not base.is_dir():
        return f"{base} is not a directory"
    try:
        fd, probe = tempfile.mkstemp(prefix=".automodel-probe-", dir=base)
    except OSError as e:
        return f"{base} is not writable ({e.strerror or e})"
    os.close(fd)
    os.unlink(probe)
    return None


def write_problems(cfg: TrainConfig, job_dir: Path | None = None, everywhere: bool = True) -> list[ConfigError]:
    """The written dirs of ``cfg`` (:func:`written_dirs`; ``job_dir`` default ``cfg.output_dir``) that cannot be
    written: the job dir always, the others when ``everywhere`` (the ranks see this machine's filesystem) or when
    they lie inside the job dir. One ConfigError each (key, path, why and what is valid)."""
    job_dir = Path(job_dir if job_dir is not None else cfg.output_dir)
    problems = []
    for key, path in written_dirs(cfg, job_dir):
        if not (everywhere or key == "output_dir" or job_dir in (path, *path.parents)):
            continue
        why = unwritable(path)
        if why is not None:
            name = "hydra.run.dir (the job dir)" if key == "output_dir" else key
            problems.append(ConfigError(name, str(path), f"the job could not write there: {why}; valid: a dir "
                                        "this user can create or write"))
    return problems


def read_paths(cfg: TrainConfig) -> list[tuple[str, str]]:
    """``(key, value)`` of every Hub id or local path the job's ranks read, as written (its kind's answer,
    :meth:`automodel_hydra.recipe_kind.RecipeKind.read_paths`): for the bundled recipe its ``data.path``
    (``data.source`` file or jsonl) and ``model.name_or_path``; for another recipe every model and dataset key of
    its sections (:func:`automodel_hydra.automodel.files.read_path_values`)."""
    return cfg.kind.read_paths(cfg)


def local_reads(cfg: TrainConfig, where: str, how: str, *, check_here: bool = True, relative_ok: bool = False,
                inside: tp.Sequence[str] = ()) -> list[tuple[str, str, str]]:
    """The local paths among :func:`read_paths` that must reach ranks running in ``where`` (e.g. "the SkyPilot
    nodes"), shipped there the ``how`` way (e.g. "uploaded to ... at the same path"), as ``(key, path the ranks
    read, source here)``: the path normalised (no trailing ``/``), the source its real path here.

    A value is a local path by :func:`path_form`, or when it exists here (a bare
    ``name`` / ``org/name`` that is not a dir or file here is a Hub id, as transformers and AutoModel decide).
    ``check_here=False``: the paths are another machine's (a Slurm login node through ``slurm.tunnel``), so
    nothing is looked up here and absolute paths are taken as they are. ``relative_ok``: a relative path is left
    to the ranks (``slurm.chdir``: they start in a dir of the container). ``inside``: dirs that already exist where
    the ranks run (a container mount's destination): paths under them are left alone.

    Raises ConfigError, one line naming the key, the value and what to write: a relative or ``~`` path (it would
    name another dir there: the absolute path here is given), an absolute path that does not exist here."""
    out = []
    for key, value in read_paths(cfg):
        form = path_form(value)
        if form is None and check_here and os.path.exists(value):
            form = "relative"
        if form is None or form == "relative" and relative_ok:
            continue
        here = os.path.abspath(os.path.expanduser(value)) if check_here else None
        if form != "absolute":
            whose = ("the home of the ranks' user there" if form == "home" else
                     "read from the ranks' own working dir there")
            fix = ("" if here is None else f": {here}" if os.path.exists(here) else
                   f" of a file or dir on this machine ({here} does not exist)")
            raise ConfigError(key, value, f"an absolute path on {where} (a {form} path is {whose}, not the one it "
                              f"names here); write the absolute path{fix}")
        path = os.path.normpath(value)
        if path.endswith(".parquet") and (here is None or os.path.isfile(here)):
            # AutoModel loads a parquet file's dir (nemo_automodel/components/datasets/llm/chat_dataset.py)
            path, here = os.path.dirname(path), here and os.path.dirname(here)
        if any(path == d or path.startswith(d.rstrip("/") + "/") for d in inside):
            continue
        if here is not None and not os.path.exists(here):
            raise ConfigError(key, value, f"a file or dir that exists on this machine (it is {how} {where} at the "
                              "same path), or a Hub id")
        out.append((key, path, os.path.realpath(here) if here is not None else path))
    return out


def outermost(paths: tp.Iterable[str]) -> list[str]:
    """The distinct paths of ``paths`` (absolute, normalised) that are not inside another of them, sorted."""
    kept: list[str] = []
    for p in sorted(set(paths)):
        if not any(p == k or p.startswith(k.rstrip("/") + "/") for k in kept):
            kept.append(p)
    return kept


#: The longest file name and path, in bytes, where the filesystem does not say (``pathconf(3)``: ``NAME_MAX`` and
#: ``PATH_MAX`` on Linux; ext4, xfs, NFS, Lustre and GPFS all take 255-byte names).
NAME_MAX, PATH_MAX = 255, 4096
#: How much longer than ``hydra.job.name`` the longest file named after it is: an nsys report,
#: ``<name>_<host>_rank<N>_requeue<K>_attempt<A>.nsys-rep`` (a host name is at most 64 bytes, HOST_NAME_MAX).
NAMED_AFTER_JOB = len("_" + "h" * 64 + "_rank99999_requeue999_attempt999.nsys-rep")


def limits(path: str | os.PathLike[str]) -> tuple[int, int]:
    """``(NAME_MAX, PATH_MAX)`` of the filesystem ``path`` is (or would be) on: its nearest existing ancestor's
    ``os.pathconf``, else :data:`NAME_MAX` and :data:`PATH_MAX`."""
    base = Path(os.path.abspath(path))
    while base.parent != base:  # the nearest existing ancestor (a name too long fails even to stat)
        try:
            if base.exists():
                break
        except OSError:
            pass
        base = base.parent
    out = []
    for name, default in (("PC_NAME_MAX", NAME_MAX), ("PC_PATH_MAX", PATH_MAX)):
        try:
            out.append(int(os.pathconf(base, name)) or default)
        except (OSError, ValueError):
            out.append(default)
    return out[0], out[1]


def too_long(path: str | os.PathLike[str], extra: int = 0) -> str | None:
    """Why ``path`` cannot be made (one clause), or None when it fits: a component over the filesystem's name
    limit (``extra``: bytes a file named after the last component adds) or the whole over its path limit."""
    name_max, path_max = limits(path)
    parts = Path(os.path.abspath(path)).parts
    for i, part in enumerate(parts):
        size = len(os.fsencode(part)) + (extra if i == len(parts) - 1 else 0)
        if size > name_max:
            shown = part if len(part) <= 60 else f"{part[:28]}...{part[-28:]}"
            return (f"it makes a name of {size} bytes ({shown!r}{' and what is named after it' if extra else ''}), "
                    f"over the file system's {name_max}-byte limit for a name")
    total = len(os.fsencode(os.path.abspath(path))) + extra
    if total > path_max:
        return f"it makes a path of {total} bytes, over the file system's {path_max}-byte limit for a path"
    return None


class PathTooLongError(ConfigError):
    """A path made from a name the user chose is too long for the filesystem (:func:`too_long`)."""


def sweep_dir_problem(sweep_dir: str, subdir: str, subdir_text: str, overrides: tp.Sequence[str] = ()
                      ) -> PathTooLongError | None:
    """The one line for a sweep job's dir ``sweep_dir/subdir`` (``subdir_text``: ``hydra.sweep.subdir`` as the
    config writes it) that is too long to make, naming the key whose part is too long and the way out; None when
    it fits."""
    why = too_long(os.path.join(sweep_dir, subdir))
    if why is None:
        return None
    if too_long(sweep_dir) is not None:
        return PathTooLongError("hydra.sweep.dir", sweep_dir, f"{why}; choose a shorter hydra.sweep.dir")
    longest = sorted(overrides, key=len, reverse=True)[:3]  # the overrides that make most of the name
    keys = list(dict.fromkeys(o.lstrip("+~").partition("=")[0] for o in longest))
    exclude = f"hydra.job.config.override_dirname.exclude_keys=[{','.join(keys)}]" if keys else (
        "hydra.job.config.override_dirname.exclude_keys=[...]")
    return PathTooLongError("hydra.sweep.subdir", subdir_text, f"{why}; leave keys out of the name with {exclude} "
                            "(they stay in .hydra/overrides.yaml), or choose a shorter subdir such as "
                            "hydra.sweep.subdir=${hydra.job.num}")


def name_problems(cfg: TrainConfig, job_dir: Path, job_name: str) -> list[UserError]:
    """The paths a job makes from names the user chose that the filesystem cannot hold (:func:`too_long`): its
    job log and nsys reports, named after ``hydra.job.name``; every written dir (:func:`written_dirs`). One line
    each, naming the key and the limit."""
    problems: list[UserError] = []
    nsys = cfg.profile.nsys
    named = (Path(job_dir) / (nsys.output_dir or "") / job_name if nsys.enabled else Path(job_dir) / job_name)
    why = too_long(named, extra=NAMED_AFTER_JOB if nsys.enabled else len(".log"))
    if why is not None:
        problems.append(PathTooLongError("hydra.job.name", job_name, f"{why}: the job log and the nsys reports are "
                                         "named after it; choose a shorter hydra.job.name"))
    for key, path in written_dirs(cfg, Path(job_dir)):
        why = too_long(path)
        if why is not None:
            name = "hydra.run.dir (the job dir)" if key == "output_dir" else key
            problems.append(PathTooLongError(name, str(path), f"{why}; choose a shorter one"))
    return problems
