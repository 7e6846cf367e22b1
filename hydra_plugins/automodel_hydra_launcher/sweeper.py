"""``hydra/sweeper=automodel_basic``: Hydra's basic sweeper (``hydra/sweeper=basic``: the cartesian product of the
``-m`` overrides, ``hydra.sweeper.params``, ``hydra.sweeper.max_batch_size``; documented at
https://hydra.cc/docs/tutorials/basic/running_your_app/multi-run/), a subclass of Hydra's ``BasicSweeper`` that
changes two things when the launcher is one of ours:

* no validation compose: ``BasicSweeper`` composes every job of a batch once only to check that it composes
  (``validate_batch_is_legal``), then the launcher composes every job again. Our launchers compose and validate
  every job before they submit any, so that first compose finds nothing the launcher would not, and costs as much.
* a failed job ends the sweep with one line per failed job (``error: ...``, ``stopped: ...`` for a cancelled
  one) and exit status 1 (130 when every failure was a stop), where ``BasicSweeper`` re-raises the first failure
  with its traceback.

With any other launcher it is ``BasicSweeper`` unchanged. ``BasicSweeper`` lives in a private module of Hydra
(``hydra._internal.core_plugins``); Hydra's own plugins (hydra-optuna-sweeper, hydra-ax-sweeper) import from
there too, and ``tests/test_sweeper.py`` checks that both give the same jobs in the same batches.
"""

from __future__ import annotations

import sys
import typing as tp

from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.utils import JobReturn, JobStatus
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext
from omegaconf import DictConfig

_LAUNCHERS = __name__.rsplit(".", 1)[0] + ".launcher"  # the module of our launcher


class AutomodelSweeper(BasicSweeper):
    """``BasicSweeper`` without its validation compose under our launcher (see the module docstring).

    Parameters
    ----------
    max_batch_size:
        Jobs per launcher call (``hydra.sweeper.max_batch_size``); None: all jobs in one call.
    params:
        ``hydra.sweeper.params``: ``{key: sweep value}`` pairs placed before the command line's overrides.

    Raises
    ------
    ValueError
        ``max_batch_size`` is not a positive whole number of jobs (or null).
    """

    def __init__(self, max_batch_size: int | None = None, params: tp.Mapping[str, str] | None = None) -> None:
        if max_batch_size is not None and (isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int)
                                           or max_batch_size < 1):
            raise ValueError(f"hydra.sweeper.max_batch_size={max_batch_size!r}: must be a positive number of jobs "
                             f"per launch, or null for all jobs in one launch")
        # BasicSweeper.__init__'s fields, set here: its ``super(BasicSweeper, self)`` names the class by its
        # module's global, which Hydra's plugin scan rebinds to a new class object when it re-executes the module,
        # so for a class made before the scan it raises TypeError
        Sweeper.__init__(self)
        self.overrides: tp.Sequence[tp.Sequence[tp.Sequence[str]]] | None = None
        self.batch_index = 0
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None

    def validate_batch_is_legal(self, batch: tp.Sequence[tp.Sequence[str]]) -> None:
        if not self._launcher_validates():
            super().validate_batch_is_legal(batch)

    def sweep(self, arguments: list[str]) -> tp.Any:
        if not self._launcher_validates():
            return super().sweep(arguments)
        from automodel_hydra.plan import JobFailedError, JobStoppedError
        from automodel_hydra.stops import CTRL_C_EXIT

        launcher = self.launcher
        assert launcher is not None
        batches: list[tp.Sequence[JobReturn]] = []

        def launch(job_overrides: tp.Sequence[tp.Sequence[str]], initial_job_idx: int) -> tp.Sequence[JobReturn]:
            batches.append(launcher.launch(job_overrides, initial_job_idx=initial_job_idx))
            return batches[-1]

        self.launcher = tp.cast(tp.Any, _Launching(launcher, launch))
        try:
            returns = super().sweep(arguments)
        except JobFailedError:  # our launcher's jobs: one line per failed job, no traceback
            errors = [_failure(r) for r in batches[-1] if r.status == JobStatus.FAILED]
            if not all(isinstance(e, JobFailedError) for e in errors):
                raise
            for e in errors:  # a cancelled job's line is a stop, not an error
                kind = "stopped" if isinstance(e, JobStoppedError) else "error"
                print(f"{kind}: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
            self._last_line(launcher)
            raise SystemExit(CTRL_C_EXIT if all(isinstance(e, JobStoppedError) for e in errors) else 1) from None
        finally:
            self.launcher = launcher
        self._last_line(launcher)
        return returns

    def _last_line(self, launcher: tp.Any) -> None:
        """The sweep's last line: its dir and ``automodel-hydra report DIR`` (nothing after a dry run)."""
        from automodel_hydra.progress import last_line

        assert self.config is not None
        line = last_line(self.config.hydra.sweep.dir, getattr(launcher, "job_states", []))
        if line:
            print(line, file=sys.stderr, flush=True)

    def _launcher_validates(self) -> bool:
        """Our launchers compose and validate every job of a batch before submitting any of them.

        Checked by class name, not ``isinstance``: Hydra's plugin scan re-executes plugin modules it finds
        already imported, which makes new class objects of the same classes."""
        launcher = self.launcher.launcher if isinstance(self.launcher, _Launching) else self.launcher
        return any(c.__name__ == "AutomodelLauncher" and c.__module__ == _LAUNCHERS for c in type(launcher).__mro__)


class _Launching:
    """The sweeper's launcher with ``launch`` going through ``launch`` (which keeps each batch's JobReturns)."""

    def __init__(self, launcher: tp.Any, launch: tp.Callable[..., tp.Sequence[JobReturn]]) -> None:
        self.launcher, self.launch = launcher, launch


def _failure(ret: JobReturn) -> BaseException | None:
    """A failed job's exception (``_core.failure``: without Hydra's "Error executing job" line)."""
    from hydra_plugins.automodel_hydra_launcher._core import failure

    return failure(ret)
