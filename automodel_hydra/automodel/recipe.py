"""Run a NeMo AutoModel recipe class inside a rank that automodel-hydra's bootstrap placed.

:func:`run` does what AutoModel's CLI does in a torchrun worker (``nemo_automodel/cli/app.py`` and
``components/launcher/interactive.py``)::

    cfg = <AutoModel's ConfigNode of the recipe sections>
    r = cls(cfg); r.setup(); r.run_train_validation_loop()

with three differences, all documented in docs/recipes.md:

* **The config object.** The recipe sections (everything but the launcher's,
  :data:`automodel_hydra.sections.NEVER_THE_RECIPES`) are handed *unresolved* to AutoModel's loader (``ConfigNode``), so
  ``${VAR}`` / ``${VAR,default}`` / ``${oc.env:VAR}`` / ``$VAR`` keep AutoModel's meaning (this rank's environment)
  and ``_target_`` its import rules. The optional ``wandb.enable`` switch is applied as AutoModel's CLI applies it
  (a small own equivalent: its function is private).
* **The process group.** The worker initialises it before the recipe
  (:func:`automodel_hydra.bootstrap.init_distributed`: nccl with CUDA, gloo without, a per-attempt store under
  torchrun restarts, 600 s timeout); AutoModel's ``initialize_distributed`` finds it initialised and reuses it (it
  prints "torch distributed is already initialized, skipping initialization."). The YAML's ``dist_env.backend`` and
  ``dist_env.timeout_minutes`` are then not used; :func:`run` logs so when they differ from the group's.
* **Stop signals.** AutoModel's ``StepScheduler`` installs its own handler for ``step_scheduler.preemption_signal``
  (default ``SIGTERM`` only): on the signal, all ranks agree (all_gather) at the next step, save a checkpoint of
  that step (without validation), leave the loop and return normally. :func:`run` adds ``SIGUSR2`` (Slurm's
  time-limit warning) to that list unless the YAML sets the key to null, checks once after ``setup()`` whether a
  signal came earlier (then no step runs), and reports ``stopped_early`` from ``step_scheduler.sigterm_flag``.
"""

from __future__ import annotations

import contextlib
import copy
import json
import logging
import typing as tp
from collections.abc import Mapping
from pathlib import Path

from automodel_hydra.automodel import resume
from automodel_hydra.automodel.files import split_sections

if tp.TYPE_CHECKING:
    from automodel_hydra.bootstrap import Distributed

log = logging.getLogger(__name__)

#: Signals that stop an AutoModel recipe with a checkpoint (added to ``step_scheduler.preemption_signal``).
STOP_SIGNALS = ("SIGTERM", "SIGUSR2")


def recipe_sections(cfg: Mapping[str, tp.Any]) -> dict[str, tp.Any]:
    """The recipe sections of a job config (dict or DictConfig) as a plain, unresolved, deep-copied dict."""
    return copy.deepcopy(split_sections(cfg)[1])


def with_checkpoint_dir(sections: dict[str, tp.Any]) -> dict[str, tp.Any]:
    """``sections`` with AutoModel's default ``checkpoint.checkpoint_dir`` written out when the file leaves it out
    (a copy; the input is not changed), so that the job's relative-dir rule (``automodel_hydra.paths``) anchors it
    under the job's output dir like a written one: on a SkyPilot node that is the run's dir in its bucket, where a
    recovered spot job finds its checkpoints, instead of the synced workdir on the lost node's disk. A
    ``checkpoint:`` that is not a mapping is left to AutoModel's loader."""
    node = sections.get("checkpoint")
    if node is not None and not isinstance(node, dict) or isinstance(node, dict) and "checkpoint_dir" in node:
        return sections
    out = dict(sections)
    out["checkpoint"] = {**(node or {}), "checkpoint_dir": resume.AUTOMODEL_CHECKPOINT_DIR}
    return out


def with_stop_signals(sections: dict[str, tp.Any]) -> dict[str, tp.Any]:
    """``sections`` with :data:`STOP_SIGNALS` added to ``step_scheduler.preemption_signal`` (a copy; the input is
    not changed). Absent key: AutoModel's default ``SIGTERM`` plus ``SIGUSR2``. An explicit null stays null
    (AutoModel then installs no handler, and neither signal checkpoints). Names are AutoModel's forms: a number, a
    name such as ``"SIGTERM"``, or a list of them."""
    out = copy.deepcopy(sections)
    sched = out.setdefault("step_scheduler", {})
    if not isinstance(sched, dict):
        return out
    if "preemption_signal" in sched and sched["preemption_signal"] is None:
        return out
    given = sched.get("preemption_signal", "SIGTERM")
    listed = list(given) if isinstance(given, (list, tuple)) else [given]
    have = {_signal_name(s) for s in listed}
    sched["preemption_signal"] = listed + [s for s in STOP_SIGNALS if s not in have]
    return out


#: In the line :func:`cuda_problem` returns: what the benchmark of AutoModel's examples counts as "plans, but needs
#: a GPU host" (benchmarks/automodel_examples.py).
NEEDS_GPU_HOST = "needs a GPU host"


def cuda_problem(recipe_cls: type, name: str) -> str | None:
    """Why AutoModel recipe class ``recipe_cls`` (``recipe=name``) cannot run in this environment, as one line; None
    when it can or this cannot tell.

    AutoModel 0.7.0's training recipes call CUDA with no config switch around it: ``setup()`` calls
    ``torch.cuda.reset_peak_memory_stats()`` (``recipes/llm/train_ft.py`` and nine other recipe modules), which a
    CPU build of torch cannot run (``torch._C`` has no ``_cuda_resetPeakMemoryStats``: AttributeError), nor a CUDA
    build without a usable GPU (RuntimeError). So, in a process that has imported the recipe's module (as the
    ranks do, in the same environment when they are this host's torchrun workers), with no CUDA device visible
    (``torch.cuda.is_available()`` false), this asks the ranks' own question: it makes that call. A recipe class
    that is not AutoModel's nor derived from one is not asked about. Whatever makes the call work on the ranks
    makes it work here too (a runtime shim on ``PYTHONPATH``, as the tests' named CPU stand-in); docs/automodel.md
    has the design."""
    import inspect

    import torch

    if torch.cuda.is_available():
        return None
    if not any(c.__module__.startswith("nemo_automodel.recipes.") for c in inspect.getmro(recipe_cls)):
        return None
    try:
        torch.cuda.reset_peak_memory_stats()
    except Exception as e:  # any failure of the call is the ranks' failure
        why = f"{type(e).__name__}: {e}".splitlines()[0]
    else:
        return None
    from importlib.metadata import PackageNotFoundError, version

    try:
        am = f"NeMo AutoModel {version('nemo-automodel')}"
    except PackageNotFoundError:
        am = "NeMo AutoModel"
    return (f"recipe={name} {NEEDS_GPU_HOST}: {am}'s recipe calls torch.cuda.reset_peak_memory_stats() in "
            f"setup(), unconditionally, and torch {torch.__version__} here has no CUDA ({why}), so every rank "
            "would fail there; run it on a GPU host, or with launcher=slurm or launcher=skypilot")


def build_config(sections: Mapping[str, tp.Any]) -> tp.Any:
    """AutoModel's config object (``ConfigNode``) for the recipe sections, as its CLI builds it: loaded by
    ``ConfigNode`` (``_target_`` imported, ``${VAR}`` expanded from this process's environment), then the
    ``wandb.enable`` switch applied; :func:`with_stop_signals` first.

    Raises what AutoModel's loader raises (ImportError for a ``_target_``, KeyError for an unset variable)."""
    from automodel_hydra import quiet

    quiet.install()
    from nemo_automodel.components.config.loader import ConfigNode

    node = ConfigNode(with_stop_signals(dict(sections)))
    wandb = node.get("wandb", None)
    if isinstance(wandb, ConfigNode):  # AutoModel CLI: a wandb block is on unless enable: false; the flag is dropped
        enabled = bool(wandb.get("enable", True))
        wandb.__dict__.pop("enable", None)
        if not enabled:
            node.__dict__.pop("wandb", None)
    return node


def run(recipe_cls: type, cfg: Mapping[str, tp.Any], dist: Distributed,
        should_stop: tp.Callable[[], bool] = lambda: False) -> dict[str, tp.Any]:
    """Run AutoModel recipe class ``recipe_cls`` on this rank with the recipe sections of ``cfg``.

    ``cfg`` is the job config (dict or DictConfig; launcher sections are dropped, interpolations must still be
    unresolved). ``should_stop`` is the worker's stop flag: a signal that reached it before AutoModel installed its
    own handler (during imports and ``setup()``) stops the job right after ``setup()``, on every rank alike.

    Returns ``{"step", "epoch", "stopped_early", "world_size"}`` plus, on rank 0, ``"loss"`` and ``"val_loss"``
    (the last rows of AutoModel's ``training.jsonl`` / ``validation.jsonl`` in its checkpoint dir) when present.

    Raises RecipeSectionError (one line naming the key and this host) when a section does not load here, e.g. a
    ``_target_`` this rank's environment cannot import; whatever the recipe raises."""
    node = build_config(checked_here(with_resume(recipe_sections(cfg), dist), dist))
    _log_superseded_dist_env(node, dist)
    with _keep_logging():
        recipe = recipe_cls(node)
        recipe.setup()
        sched = recipe.step_scheduler
        try:
            if _any_rank(bool(should_stop()), dist):
                log.warning("stop requested before training started: no step run, nothing new to checkpoint")
                return _result(recipe, dist, stopped=True)
            recipe.run_train_validation_loop()
        finally:
            _release_signal_handler(sched)  # the worker's own handlers come back
        return _result(recipe, dist, stopped=bool(sched.sigterm_flag))


def with_resume(sections: dict[str, tp.Any], dist: Distributed) -> dict[str, tp.Any]:
    """``sections`` with the job's ``restore_from.path`` turned into the ``checkpoint.restore_from`` AutoModel's
    recipe honours (:func:`automodel_hydra.automodel.resume.resolve`: the newest complete checkpoint is looked up
    now, with AutoModel's ``find_latest_checkpoint``, on rank 0; every rank gets rank 0's answer), and the one line
    that says what is resumed logged on rank 0. A copy; unchanged when ``restore_from.path`` is not set (AutoModel's
    own key and default keep their meaning). Call it after the written dirs were made absolute."""
    import torch.distributed as td

    wanted = resume.requested(sections)
    if wanted is None or wanted.key != resume.KEY:  # the same on every rank: nothing to agree on
        return sections
    resolved: tuple[str | None, str] | None = None
    group = td.is_available() and td.is_initialized() and td.get_world_size() > 1
    if dist.rank == 0 or not group:
        from nemo_automodel.components.checkpoint.utils import find_latest_checkpoint

        resolved = resume.resolve(sections, find_latest_checkpoint)
    if group:
        box = [resolved]
        td.broadcast_object_list(box, src=0)
        resolved = box[0]
    if resolved is None:
        return sections
    value, line = resolved
    if dist.rank == 0:
        log.info("%s", line)
    out = copy.deepcopy(sections)
    out.pop("restore_from", None)  # this project's key, consumed here: AutoModel reads checkpoint.restore_from
    ckpt = out["checkpoint"] = dict(out.get("checkpoint") or {})
    ckpt.pop("restore_from", None)
    if value is not None:
        ckpt["restore_from"] = value
    return out


def checked_here(sections: dict[str, tp.Any], dist: Distributed) -> dict[str, tp.Any]:
    """``sections``, after each value was loaded with AutoModel's loader on this rank, where the job runs: the plan
    leaves a ``_target_`` that does not import on the submitting machine to the ranks
    (:func:`automodel_hydra.automodel.files.validate_recipe_sections`), so here its failure is one line naming the
    key, AutoModel's reason and this host, in the rank's error file and the job's last line. Raises
    RecipeSectionError."""
    import socket

    from automodel_hydra.automodel.files import RecipeSectionError, validate_recipe_sections

    try:
        validate_recipe_sections(with_stop_signals(sections))
    except RecipeSectionError as e:
        raise RecipeSectionError(e.key, f"{str(e)[len(e.key) + 2:]} (on rank {dist.rank}, host "
                                 f"{socket.gethostname()}, where the job runs)") from None
    return sections


@contextlib.contextmanager
def _keep_logging() -> tp.Iterator[None]:
    """Give the worker its logging back after the recipe, also when it raises.

    AutoModel's ``setup()`` calls its ``setup_logging()``: it sets the root level, replaces the formatter of every
    root handler (ANSI colours, also in a job log file), and adds a ``RankFilter`` to every handler and logger that
    calls ``logging.disable(CRITICAL)`` on any rank but 0, so a failing rank 1 could no longer log its traceback.
    This restores the root level, the global disable level, the root handlers' formatters and filters, and the
    filters of loggers that existed before; loggers AutoModel created keep their settings."""
    root = logging.getLogger()
    manager = logging.Logger.manager
    disabled, level, root_filters = manager.disable, root.level, list(root.filters)
    handlers = [(h, h.formatter, list(h.filters)) for h in root.handlers]
    loggers = {name: list(lg.filters) for name, lg in manager.loggerDict.items() if isinstance(lg, logging.Logger)}
    try:
        yield
    finally:
        logging.disable(disabled)
        root.setLevel(level)
        for h, formatter, filters in handlers:
            h.setFormatter(formatter)
            h.filters = filters
        root.filters = root_filters
        for name, filters in loggers.items():
            lg = manager.loggerDict.get(name)
            if isinstance(lg, logging.Logger):
                lg.filters = filters


def _result(recipe: tp.Any, dist: Distributed, stopped: bool) -> dict[str, tp.Any]:
    sched = recipe.step_scheduler
    out: dict[str, tp.Any] = {"step": int(sched.step), "epoch": int(sched.epoch), "stopped_early": stopped,
                              "world_size": dist.world_size}
    if dist.rank == 0:
        ckpt_dir = Path(str(recipe.checkpointer.config.checkpoint_dir))
        for key, file, field in (("loss", "training.jsonl", "loss"), ("val_loss", "validation.jsonl", "val_loss")):
            row = _last_row(ckpt_dir / file)
            if row and field in row:
                out[key] = row[field]
    return out


def _last_row(path: Path) -> dict[str, tp.Any] | None:
    if not path.is_file():
        return None
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    try:
        return json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None


def _any_rank(flag: bool, dist: Distributed) -> bool:
    """True on every rank when ``flag`` is true on any (one ``all_reduce``; local without a process group)."""
    import torch
    import torch.distributed as td

    if not (td.is_available() and td.is_initialized()) or td.get_world_size() == 1:
        return flag
    t = torch.tensor([int(flag)], device=dist.device)
    td.all_reduce(t, op=td.ReduceOp.MAX)
    return bool(t.item())


def _release_signal_handler(sched: tp.Any) -> None:
    handler = getattr(sched, "sig_handler", None)
    if handler is not None:
        handler.release()  # AutoModel's DistributedSignalHandler: restores the handlers it replaced


def _log_superseded_dist_env(node: tp.Any, dist: Distributed) -> None:
    import torch.distributed as td

    if not (td.is_available() and td.is_initialized()) or dist.rank != 0:
        return
    dist_env = node.get("dist_env", None)
    wanted = dist_env.get("backend", None) if dist_env is not None else None
    actual = td.get_backend()
    if wanted is not None and str(wanted) != str(actual):
        log.info("process group already initialised by automodel-hydra with backend %s; the YAML's "
                 "dist_env.backend=%s and dist_env.timeout_minutes are not used", actual, wanted)


def _signal_name(sig: tp.Any) -> str:
    import signal

    try:
        return signal.Signals(int(sig)).name
    except (TypeError, ValueError):
        name = str(sig).upper()
        return name if name.startswith("SIG") else f"SIG{name}"
