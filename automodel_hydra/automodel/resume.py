"""What an AutoModel recipe's job resumes from: the resume keys a user can write, checked at plan time and resolved
on rank 0 at job start, in AutoModel's own checkpoint layout.

AutoModel's layout (``nemo_automodel/components/checkpoint/``, 0.7.0): a checkpoint dir ``C``
(``checkpoint.checkpoint_dir``) holds ``epoch_E_step_N/`` dirs and a ``LATEST`` pointer (a symlink, or
``LATEST.txt`` where symlinks fail); a dir an interrupted save left has an in-progress marker and never counts
(``utils.find_latest_checkpoint``). Its recipe reads one key, ``checkpoint.restore_from``
(``recipes/base_recipe.py`` ``load_checkpoint``, ``utils.resolve_restore_from_to_checkpoint_dir``): unset = the
newest complete checkpoint in ``C`` when there is one (auto-detected), ``LATEST`` (any case) = the same, a name
without ``/`` = that entry of ``C`` (a step dir or a pointer such as ``LOWEST_VAL``), any other path = that dir.

The keys, and what each means for an AutoModel recipe:

========================================= ==============================================================================
key                                        meaning
========================================= ==============================================================================
``checkpoint.restore_from``                AutoModel's, as above; passed to its recipe as written
``restore_from.path: latest`` / ``LATEST`` the newest complete checkpoint in ``C`` (a fresh start when none)
``restore_from.path: D/latest``            the newest complete checkpoint in ``C`` when it has one (the job's own
(or ``D/LATEST``)                          progress: a requeued or recovered job continues), else the newest in ``D``
                                           (``D`` must exist where the ranks see this machine: :func:`host_problems`)
``restore_from.path: P``                   checkpoint dir ``P`` (an ``epoch_E_step_N`` dir)
``restore_from.path: null``                refused: AutoModel's recipe resumes from ``C`` whenever it has a
                                           checkpoint; a fresh start is a new ``checkpoint.checkpoint_dir``
========================================= ==============================================================================

``restore_from.path`` is this project's key (the bundled recipe's, ``automodel_hydra/checkpoint.py``, same rule);
for an AutoModel recipe it reaches the ranks as its own top-level section and :func:`resolve` turns it, on rank 0
at job start (what is newest changes between preemptions), into the ``checkpoint.restore_from`` AutoModel honours:
the resolved checkpoint dir, or nothing for a fresh start, and logs one line saying which and why. Both keys set to
different values is refused at plan time. This module is pure: it imports neither torch nor AutoModel; the caller
passes AutoModel's ``find_latest_checkpoint``.
"""

from __future__ import annotations

import dataclasses
import os
import typing as tp
from pathlib import Path

from automodel_hydra.paths import METADATA, POINTER
from automodel_hydra.schema import ConfigError

#: AutoModel's pointer to the newest complete checkpoint in a checkpoint dir (``lifecycle.py``).
AUTOMODEL_POINTER = "LATEST"
#: AutoModel's ``checkpoint.checkpoint_dir`` when a file leaves it out (``CheckpointingConfig``,
#: ``nemo_automodel/components/checkpoint/config.py``; its recipe then checkpoints there, relative to the cwd).
AUTOMODEL_CHECKPOINT_DIR = "checkpoints/"
#: This project's resume key, and AutoModel's.
KEY, _AM_KEY = "restore_from.path", "checkpoint.restore_from"
_VALID = ("'latest' (the newest checkpoint in checkpoint.checkpoint_dir), D/latest (the job's own newest, else "
          "checkpoint dir D's), or an epoch_E_step_N checkpoint dir")


def _is_pointer_name(text: str) -> bool:
    return text in (POINTER, AUTOMODEL_POINTER)


def pointer_source(path: str) -> str | None:
    """``D`` for ``D/latest`` or ``D/LATEST`` (the pointer's own path), else None (also for ``latest`` itself)."""
    head, _, tail = path.rstrip("/").rpartition("/")
    return (head or "/") if "/" in path.rstrip("/") and _is_pointer_name(tail) else None


@dataclasses.dataclass(frozen=True)
class Requested:
    """The resume key a job's sections set: ``key`` (``restore_from.path`` or ``checkpoint.restore_from``) and its
    value as written; None from :func:`requested` when neither is set (AutoModel's own default applies)."""

    key: str
    value: str


def requested(sections: tp.Mapping[str, tp.Any]) -> Requested | None:
    """The resume key of an AutoModel recipe's sections (plain data, as the file has them).

    Raises
    ------
    ConfigError
        ``restore_from`` not a mapping; ``restore_from.path`` null or not a string; both keys set to different
        values (one line naming both and what to write).
    """
    top = sections.get("restore_from")
    ckpt = sections.get("checkpoint")
    am = ckpt.get("restore_from") if isinstance(ckpt, dict) else None
    if top is None:
        return Requested(_AM_KEY, str(am)) if am is not None else None
    if not isinstance(top, dict) or "path" not in top or set(top) - {"path"}:
        raise ConfigError("restore_from", top, "a mapping with one key, path: " + _VALID)
    path = top["path"]
    if path is None:
        raise ConfigError(KEY, None, "AutoModel's recipe resumes from the newest checkpoint in "
                          "checkpoint.checkpoint_dir whenever it has one, so null cannot mean a fresh start: give a "
                          "new checkpoint.checkpoint_dir for one; or " + _VALID)
    if not isinstance(path, str) or not path:
        raise ConfigError(KEY, path, _VALID)
    if am is not None and str(am) != path:
        raise ConfigError(_AM_KEY, am, f"{KEY}={path!r} is set too: set one of the two ({_AM_KEY} is "
                          f"AutoModel's key, {KEY} this project's: {_VALID})")
    return Requested(KEY, path)


def checkpoint_enabled(sections: tp.Mapping[str, tp.Any]) -> bool:
    """``checkpoint.enabled`` as AutoModel reads it (default true)."""
    ckpt = sections.get("checkpoint")
    return not (isinstance(ckpt, dict) and ckpt.get("enabled") is False)


def problems(sections: tp.Mapping[str, tp.Any]) -> list[ConfigError]:
    """Plan-time rules that hold wherever the job runs: :func:`requested`'s, and a resume key with
    ``checkpoint.enabled: false`` (AutoModel then resumes nothing)."""
    try:
        req = requested(sections)
    except ConfigError as e:
        return [e]
    if req is not None and not checkpoint_enabled(sections):
        return [ConfigError(req.key, req.value, "with checkpoint.enabled=false AutoModel's recipe resumes nothing "
                            "(it prints 'Enable checkpointing to resume'): set checkpoint.enabled=true or drop "
                            f"{req.key}")]
    return []


def _written_here(value: str) -> bool:
    """Whether a path can be checked on this machine: no variable of the ranks' environment in it."""
    return "${" not in value and "$" not in value


def host_problems(sections: tp.Mapping[str, tp.Any], own: str | os.PathLike | None = None) -> list[ConfigError]:
    """Paths an AutoModel recipe's resume key names, checked where the ranks see this machine's files (local runs,
    bare-metal Slurm; relative paths as the ranks' cwd has them: this process's): ``D/latest`` needs ``D`` to be an
    existing dir (a ``D`` not there would be a fresh start that nothing reports: rank 0 finds no checkpoint in it),
    unless ``D`` is ``own``, the job's own checkpoint dir as its ranks resolve it (absolute), which a first run
    creates, as for ``latest``; a checkpoint dir must exist and be AutoModel's (not the bundled recipe's ``step-N``
    with ``.metadata``). A name without ``/`` in ``checkpoint.restore_from`` is an entry of the job's checkpoint
    dir, which AutoModel checks itself."""
    try:
        req = requested(sections)
    except ConfigError:
        return []  # problems() has that line
    if req is None or not _written_here(req.value) or _is_pointer_name(req.value):
        return []
    if req.key == _AM_KEY and "/" not in req.value:
        return []
    source = pointer_source(req.value) if req.key == KEY else None  # AutoModel's key: D/LATEST is a path
    if source is not None:
        d = Path(source)
        if d.exists() and not d.is_dir():
            return [ConfigError(req.key, req.value, f"{d} is not a directory; valid: {_VALID}")]
        if not d.exists() and (own is None or os.path.abspath(d) != os.path.normpath(own)):
            return [ConfigError(req.key, req.value, f"{d} does not exist here, where the ranks run (the job would "
                                "start fresh); valid: D/latest for an existing checkpoint dir D, 'latest' (the "
                                "job's own checkpoint.checkpoint_dir, a fresh start while it has none), or an "
                                "epoch_E_step_N checkpoint dir")]
        return []
    p = Path(req.value)
    if not p.is_dir():
        return [ConfigError(req.key, req.value, f"no such directory here, where the ranks run; valid: {_VALID}")]
    if (p / METADATA).is_file() and not (p / "model").is_dir():
        return [ConfigError(req.key, req.value, "a checkpoint of the bundled recipe (step-N, .metadata), which "
                            "AutoModel's recipe cannot load; valid: an AutoModel epoch_E_step_N dir")]
    steps = sorted(q.name for q in p.glob("*step_*") if q.is_dir())
    if not (p / "model").is_dir() and steps:
        return [ConfigError(req.key, req.value, f"a checkpoint dir (it holds {steps[-1]} ...), not a checkpoint: "
                            f"write {req.value.rstrip('/')}/latest for its newest")]
    return []


def skypilot_problems(sections: tp.Mapping[str, tp.Any], mount: str, use_spot: bool) -> list[ConfigError]:
    """An AutoModel recipe's resume key on SkyPilot, where only the job's own checkpoints (its dir in the bucket
    under ``mount``) are on the nodes: ``restore_from.path`` must be ``latest`` or ``<mount>/latest`` (both: the
    job's own newest), ``checkpoint.restore_from`` ``LATEST`` or (not on spot, where a recovered job must continue
    its own progress) a name in the job's checkpoint dir. The bundled recipe's rule (backends/skypilot.py)."""
    try:
        req = requested(sections)
    except ConfigError:
        return []
    if req is None or _is_pointer_name(req.value) or req.key == KEY and is_mount_pointer(req.value, mount):
        return []
    mine = (f"'latest' or '{mount.rstrip('/')}/{POINTER}' (both: this job's newest checkpoint, in its bucket) or "
            "unset")
    if req.key == _AM_KEY and "/" not in req.value and not use_spot:
        return []
    if req.key == _AM_KEY and "/" not in req.value:
        return [ConfigError(req.key, req.value, f"LATEST or unset with skypilot.use_spot=true: a recovered job "
                            f"continues from its own newest checkpoint, not from {req.value} again")]
    if req.key == _AM_KEY and is_mount_pointer(req.value, mount):  # AutoModel reads it as a path: the bucket's root
        return [ConfigError(req.key, req.value, f"LATEST (AutoModel's name for this job's newest checkpoint), or "
                            f"restore_from.path: {req.value}: in checkpoint.restore_from AutoModel reads a path, "
                            "and the bucket's root holds no checkpoint of this job")]
    if req.key == _AM_KEY:  # the valid values of the key the user set, not of restore_from.path
        mine = ("LATEST, " + ("" if use_spot else "a checkpoint's name in this job's checkpoint dir, ") +
                "unset, or restore_from.path: latest (this job's newest checkpoint, in its bucket)")
    return [ConfigError(req.key, req.value, f"{mine} on SkyPilot: a local checkpoint path does not exist on the "
                        "nodes; put it in the bucket and use skypilot.run_name to resume from it")]


def is_mount_pointer(path: str, mount: str) -> bool:
    """Whether ``path`` is ``<mount>/latest`` (or ``/LATEST``): on SkyPilot's nodes the mount holds the job's own
    checkpoints, so this means ``latest`` there. Pure: compares text only."""
    source = pointer_source(path)
    return source is not None and os.path.normpath(source) == os.path.normpath(mount.rstrip("/") or "/")


def checkpoint_dir(sections: tp.Mapping[str, tp.Any]) -> str:
    """``checkpoint.checkpoint_dir`` as AutoModel reads it (its default when left out)."""
    ckpt = sections.get("checkpoint")
    value = ckpt.get("checkpoint_dir") if isinstance(ckpt, dict) else None
    return str(value) if value is not None else AUTOMODEL_CHECKPOINT_DIR


def resolve(sections: tp.Mapping[str, tp.Any],
            find_latest: tp.Callable[[str], str | os.PathLike | None]) -> tuple[str | None, str] | None:
    """What AutoModel's ``checkpoint.restore_from`` must be for the job's ``restore_from.path``, now: ``(value,
    line)``, ``value`` None for a fresh start (the job's checkpoint dir has none, so AutoModel's auto-detection
    finds none either), ``line`` the log line saying what is resumed and why. None when ``restore_from.path`` is
    not set (``checkpoint.restore_from`` and AutoModel's default keep AutoModel's meaning).

    ``sections``: the rank's recipe sections, written dirs already absolute. ``find_latest(dir)``: AutoModel's
    ``find_latest_checkpoint``. Relative paths are the rank's cwd's. Raises ConfigError as :func:`requested`."""
    req = requested(sections)
    if req is None or req.key != KEY:
        return None
    own = checkpoint_dir(sections)
    path = req.value
    head = f"{KEY}={path!r}"
    if _is_pointer_name(path):
        found = find_latest(own)
        return (os.fspath(found), f"{head}: resuming from {found}, the newest complete checkpoint in {own}") \
            if found is not None else (None, f"{head}: no complete checkpoint in {own}: fresh start")
    source = pointer_source(path)
    if source is None:
        target = os.path.abspath(path)
        return target, f"{head}: resuming from {target}"
    found = find_latest(own)
    if found is not None:
        return os.fspath(found), (f"{head}: resuming from {found}, the newest complete checkpoint in the job's own "
                                  f"{own} (its own progress comes first; {source} is read only while it has none)")
    found = find_latest(os.path.abspath(source))
    if found is not None:
        return os.fspath(found), (f"{head}: resuming from {found}, the newest complete checkpoint in {source} "
                                  f"(the job's own {own} has none yet)")
    return None, f"{head}: no complete checkpoint in {own} or {source}: fresh start"
