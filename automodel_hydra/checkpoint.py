"""Step-N checkpoints with ``torch.distributed.checkpoint`` (DCP) and a pointer to the newest complete one.

Layout under the checkpoint dir::

    step-50/   .metadata  __0_0.distcp ...  .complete
    step-100/  ...
    latest     "step-100"  (rank 0 moves it with os.replace, only after step-100 is complete)

A checkpoint counts as complete once DCP has written its ``.metadata`` and rank 0 has written ``.complete`` after the
save returned (sync) or its future resolved (async). :func:`find_latest` never returns anything else, so a job killed
mid-save resumes from the previous checkpoint.

``restore_from.path`` names what a job starts from: ``latest`` (the newest complete checkpoint in the job's own dir),
a step dir, or ``D/latest`` (the pointer file's own path: the newest complete checkpoint in checkpoint dir ``D``,
:func:`resume_target`), the form of the spot-resume key ``restore_from: {path: /checkpoints/latest}``. A job that
already has a complete checkpoint of its own resumes that one instead (a requeued or recovered job continues its own
progress; torchtitan's ``initial_load_path`` follows the same rule); with none in either dir it starts fresh.

Retention (``checkpoint.keep_latest_k``, default 3): after each completed save the older step dirs beyond the newest K
complete ones are deleted, except the one this run resumed from; 0 keeps all. A new save of a step that already has
a complete checkpoint (a fresh start over an old run) is written to ``.step-N.partial`` and renamed over the old one
only once complete, so a complete checkpoint is never deleted before its replacement exists.

Like torchtitan's ``BaseCheckpointManager``, the public ``save/load/wait/close`` check ``enabled`` once and call the
``_`` hooks; a subclass (another storage, another format) overrides only the hooks.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import typing as tp
import warnings
from concurrent.futures import Future
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful

from automodel_hydra.paths import METADATA as METADATA
from automodel_hydra.paths import POINTER as POINTER
from automodel_hydra.paths import pointer_dir as pointer_dir
from automodel_hydra.paths import step_dir_name as step_dir_name
from automodel_hydra.paths import step_of

logger = logging.getLogger(__name__)

#: State-dict keys (module constants, torchtitan style).
MODEL_AND_OPTIM = "app"
TRAIN_STATE = "train_state"
#: Written into a step dir by rank 0 after the save finished; DCP's own index file is ``.metadata`` (METADATA).
COMPLETE_MARKER = ".complete"


class ModelOptimState(Stateful):
    """Model + optimizer as one DCP ``Stateful``; ``get_state_dict`` unwraps DDP, so keys match with or without it."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer

    def state_dict(self) -> dict[str, tp.Any]:
        model_sd, optim_sd = get_state_dict(self.model, self.optimizer)
        return {"model": model_sd, "optim": optim_sd}

    def load_state_dict(self, state_dict: dict[str, tp.Any]) -> None:
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


def _dist_on() -> bool:
    return dist.is_available() and dist.is_initialized()


def _rank() -> int:
    return dist.get_rank() if _dist_on() else 0


#: Without a process group (one rank) DCP saves/loads in this process alone, as intended here, but warns each time.
_SINGLE_PROCESS_WARNING = "torch.distributed is disabled, unavailable or uninitialized"


@contextlib.contextmanager
def _single_process_ok() -> tp.Iterator[None]:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)
        yield


def is_complete(path: str | os.PathLike) -> bool:
    """True when ``path`` is a step dir with DCP's ``.metadata`` and this module's completion marker."""
    p = Path(path)
    return (p / METADATA).is_file() and (p / COMPLETE_MARKER).is_file()


def _partial(path: Path) -> Path:
    """Where a new save of a step goes while a complete checkpoint of that step exists (not a ``step-N`` name, so
    :func:`find_latest` never sees it)."""
    return path.with_name(f".{path.name}.partial")


def _step_dirs(ckpt_dir: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every ``step-N`` dir, oldest first (complete or not)."""
    if not ckpt_dir.is_dir():
        return []
    found = [(step, p) for p in ckpt_dir.iterdir() if p.is_dir() and (step := step_of(p.name)) is not None]
    return sorted(found)


def find_latest(ckpt_dir: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint in ``ckpt_dir``, or None when there is none.

    Reads the ``latest`` pointer and accepts its target when it has ``.metadata``; when the pointer is missing or
    bad, falls back to the newest ``step-N`` dir that has both ``.metadata`` and the completion marker.
    """
    ckpt_dir = Path(ckpt_dir)
    try:
        name = (ckpt_dir / POINTER).read_text().strip()
        if step_of(name) is not None and (ckpt_dir / name / METADATA).is_file():
            return ckpt_dir / name
        logger.warning("checkpoint pointer %s -> %r is not a complete checkpoint; scanning", ckpt_dir / POINTER, name)
    except OSError:
        pass
    complete = [p for _, p in _step_dirs(ckpt_dir) if is_complete(p)]
    return complete[-1] if complete else None


def resume_target(ckpt_dir: str | os.PathLike, path: str | os.PathLike | None) -> Path | None:
    """The checkpoint a job with checkpoint dir ``ckpt_dir`` starts from, for ``restore_from.path`` ``path``, or
    None for a fresh start: ``latest`` -> :func:`find_latest` of ``ckpt_dir``; ``D/latest`` (:func:`pointer_dir`)
    -> the newest complete checkpoint of ``ckpt_dir`` when it has one (the job's own progress), else of ``D``;
    any other path -> that path as given (checked by the loader); None -> None."""
    if path is None:
        return None
    if str(path) == POINTER:
        return find_latest(ckpt_dir)
    source = pointer_dir(path)
    if source is None:
        return Path(path)
    return find_latest(ckpt_dir) or find_latest(source)


class CheckpointManager:
    """Saves and restores ``{name: Stateful | tensor | value}`` state as ``<dir>/step-N`` DCP checkpoints.

    Parameters
    ----------
    ckpt_dir: where step dirs and the ``latest`` pointer go (shared by all ranks).
    enabled: False makes every public method a no-op (``load`` returns 0).
    async_save: ``dcp.async_save`` on a dedicated gloo process group (its collectives run on a background thread
        and must not interleave with training collectives); completion is checked at the next save/wait/close.
    keep_latest_k: after each completed save of step N, rank 0 deletes the step dirs below N that are neither among
        the newest K complete ones (by step) nor the checkpoint this manager loaded from (a restarted job loads it
        again while ``restore_from.path`` names it); half-written leftovers below N go too. 0 = keep all. So the
        save just completed (the ``latest`` pointer's target) and the highest complete step are never deleted.

    Every rank must construct the manager (with ``async_save`` and more than one rank it creates a process group).
    """

    def __init__(self, ckpt_dir: str | os.PathLike, *, enabled: bool = True, async_save: bool = False,
                 keep_latest_k: int = 3) -> None:
        self.dir, self.enabled, self.async_save, self.keep_latest_k = Path(ckpt_dir), enabled, async_save, keep_latest_k
        self._pending: tuple[int, Path, Future] | None = None
        self.resumed_from: Path | None = None  # set by load: the checkpoint training started from
        self._pg = None
        # one stager for the whole run: it stages into the same CPU buffers every save instead of allocating a copy
        # of the whole state each time (most of the training-thread stall); safe because _save waits for the
        # previous save before staging again (benchmarks/ckpt_stall.py measures the stall)
        self._stager = DefaultStager(StagingOptions(False, False, False, False)) if enabled and async_save else None
        if enabled and async_save and _dist_on() and dist.get_world_size() > 1:
            self._pg = dist.new_group(backend="gloo")
        elif enabled and async_save and not _dist_on():  # DCP warns from its background thread, out of our reach
            warnings.filterwarnings("ignore", message=_SINGLE_PROCESS_WARNING)

    # --- public guards ------------------------------------------------------------------------------------------

    def save(self, step: int, state: dict[str, tp.Any]) -> None:
        """Write ``state`` plus ``{"step": step}`` to ``<dir>/step-<step>``; collective (call on every rank).

        Sync: returns once the checkpoint is complete and the pointer moved. Async: returns after staging (a copy of
        the tensors); a previous async save is waited for first."""
        if self.enabled:
            self._save(step, state)

    def load(self, state: dict[str, tp.Any], path: str | os.PathLike | None = POINTER) -> int:
        """Restore ``state`` in place from ``"latest"`` (newest complete checkpoint in the dir), ``D/latest`` (the
        newest complete one of this dir, else of ``D``: :func:`resume_target`), a step dir, or None.

        Returns the restored step, 0 for a fresh start (None, disabled, or "latest" / ``D/latest`` with no complete
        checkpoint).

        Raises
        ------
        FileNotFoundError
            An explicit ``path`` that is not a DCP checkpoint (no ``.metadata``).
        """
        return self._load(state, path) if self.enabled and path is not None else 0

    def wait(self) -> None:
        """Block until an in-flight async save is complete (and the pointer moved)."""
        if self.enabled:
            self._wait()

    def close(self) -> None:
        """Finish pending saves and release the async process group."""
        if self.enabled:
            self._close()

    # --- hooks --------------------------------------------------------------------------------------------------

    def _save(self, step: int, state: dict[str, tp.Any]) -> None:
        self._wait()
        path = self.dir / step_dir_name(step)
        # a complete checkpoint of this step (an earlier run's) stays readable until its replacement is complete
        target = _partial(path) if is_complete(path) else path
        if _rank() == 0:  # a leftover of an abandoned save must not pass for the new checkpoint
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True, exist_ok=True)
        if _dist_on():
            dist.barrier()
        sd = {**state, TRAIN_STATE: {"step": step}}
        if self.async_save:
            with _single_process_ok():
                fut = dcp.async_save(sd, checkpoint_id=str(target), process_group=self._pg, async_stager=self._stager)
            self._pending = (step, target, tp.cast(Future, fut))
        else:
            with _single_process_ok(), _disk_full_named(target):
                dcp.save(sd, checkpoint_id=str(target))
            self._finalize(step, target)

    def _finalize(self, step: int, target: Path) -> None:
        """Rank 0, after DCP finished writing ``target`` (``.metadata`` written last): marker, rename into place
        when it was written beside a complete checkpoint of the same step, pointer, purge."""
        if _rank() != 0:
            return
        path = self.dir / step_dir_name(step)
        (target / COMPLETE_MARKER).write_text(f"{step}\n")
        if target != path:  # swap: the old one is moved out of the way only now, and deleted after the swap
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(target, path)
            shutil.rmtree(old, ignore_errors=True)
        tmp = self.dir / f".{POINTER}.tmp"
        tmp.write_text(step_dir_name(step) + "\n")
        os.replace(tmp, self.dir / POINTER)
        logger.info("checkpoint complete: %s", path)
        self._purge(step)

    def _purge(self, newest: int) -> None:
        """Rank 0, after step ``newest`` completed: apply ``keep_latest_k`` (see the class docstring)."""
        if self.keep_latest_k <= 0:
            return
        dirs = _step_dirs(self.dir)
        complete = [s for s, p in dirs if is_complete(p)]
        keep = {newest, *complete[-self.keep_latest_k:]}
        resumed = self.resumed_from.resolve() if self.resumed_from is not None else None
        for s, p in dirs:  # older than this save: complete ones beyond K, and half-written leftovers
            if s in keep or s > newest or p.resolve() == resumed:
                continue
            logger.info("checkpoint.keep_latest_k=%d: removing %s", self.keep_latest_k, p)
            shutil.rmtree(p, ignore_errors=True)

    def _load(self, state: dict[str, tp.Any], path: str | os.PathLike) -> int:
        target = resume_target(self.dir, path)
        if _dist_on() and dist.get_world_size() > 1:  # every rank loads what rank 0 saw
            box = [target]
            dist.broadcast_object_list(box, src=0)
            target = box[0]
        if target is None:
            if _rank() == 0:
                source = pointer_dir(path)
                where = f"{self.dir} or {source}" if source is not None else str(self.dir)
                logger.info("no complete checkpoint in %s: fresh start", where)
            return 0
        if not (Path(target) / METADATA).is_file():
            raise FileNotFoundError(f"restore_from.path={str(target)!r} is not a checkpoint (no {METADATA})")
        sd = {**state, TRAIN_STATE: {"step": 0}}
        with _single_process_ok():
            dcp.load(sd, checkpoint_id=str(target))
        step = int(sd[TRAIN_STATE]["step"])
        self.resumed_from = Path(target)
        if _rank() == 0:
            logger.info("restored step %d from %s", step, target)
        return step

    def _wait(self) -> None:
        if self._pending is not None:
            step, target, fut = self._pending
            self._pending = None
            fut.result()
            self._finalize(step, target)

    def _close(self) -> None:
        self._wait()
        if self._stager is not None:
            self._stager.close()
            self._stager = None
        if self._pg is not None:
            dist.destroy_process_group(self._pg)
            self._pg = None


#: A filesystem with less free space than this after a failed save was full (bytes; or under 1% of its size).
FULL_BELOW_BYTES = 1 << 20


@contextlib.contextmanager
def _disk_full_named(target: Path) -> tp.Iterator[None]:
    """Name a full disk as the cause of a failed save. torch's zip writer reports a short write as
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos N vs M``, never ENOSPC, and DCP wraps
    it in a ``CheckpointException``; so when a save fails and ``target``'s filesystem has under
    :data:`FULL_BELOW_BYTES` (or 1% of its size) free (``os.statvfs``), raise ``OSError(ENOSPC)`` naming the
    dir and the free space, from the original failure."""
    try:
        yield
    except (SystemExit, KeyboardInterrupt):
        raise
    except BaseException as e:
        try:
            st = os.statvfs(target)
        except OSError:
            raise e from None
        free, size = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
        if free < FULL_BELOW_BYTES or free < size // 100:
            raise OSError(errno.ENOSPC, f"No space left on device: saving {target} failed with {free} bytes free "
                                        f"of {size} on its filesystem") from e
        raise

