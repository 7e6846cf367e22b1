"""``hydra/sweeper=automodel_basic``: Hydra's basic sweep (cartesian product of the ``-m`` overrides) without the
second compose of every job when one of our launchers runs the batch.

Hydra's ``BasicSweeper`` composes every job of a batch once just to check that it composes
(``Sweeper.validate_batch_is_legal``), then hands the batch to the launcher, which composes every job again. Our
launchers compose and validate every job before they submit anything, so that first compose finds nothing the
launcher would not, and costs as much as the launcher's own. This sweeper skips it when the launcher is one of ours
and keeps it for any other launcher.

Everything else is the basic sweeper's behaviour (Hydra's ``hydra/sweeper=basic``, documented at
https://hydra.cc/docs/tutorials/basic/running_your_app/multi-run/ and
https://hydra.cc/docs/advanced/override_grammar/extended/): ``a=1,2``, ``range()``, ``choice()``, ``glob()``,
``+``/``++``/``~`` overrides, config group overrides, ``hydra.sweeper.params`` (placed before the command line's
overrides, so the command line wins) and ``hydra.sweeper.max_batch_size``. Hydra exports ``BasicSweeper`` only
from a private module, so this is a small sweeper of its own on Hydra's public ``Sweeper`` plugin interface and
override parser.
"""

from __future__ import annotations

import itertools
import logging
import sys
import typing as tp
from pathlib import Path

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus
from hydra.errors import HydraException
from hydra.plugins.launcher import Launcher
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

log = logging.getLogger(__name__)

_LAUNCHERS = __name__.rsplit(".", 1)[0] + ".launcher"  # the module of our launcher


def job_overrides(overrides: tp.Sequence[Override]) -> list[list[str]]:
    """Every job of the cartesian product of ``overrides``, each as its list of ``key=value`` override strings.

    A sweep override (``a=1,2``, ``range(0,3)``, ``choice(x,y)``, ``glob(*)``) contributes one value per job; a
    plain one appears in every job. A key given twice keeps its first position and its last value (the command
    line overrides ``hydra.sweeper.params``). The first override varies slowest: ``a=1,2 b=x,y`` gives
    ``[a=1 b=x], [a=1 b=y], [a=2 b=x], [a=2 b=y]``. Returns ``[[]]`` (one job, no overrides) when ``overrides``
    is empty.

    Raises HydraException for a sweep with no finite list of values (``interval()``)."""
    by_key: dict[str, list[str]] = {}
    for override in overrides:
        key = override.get_key_element()  # with its +, ++ or ~ prefix and @package
        if override.is_sweep_override():
            if not override.is_discrete_sweep():
                assert override.value_type is not None
                raise HydraException(f"{AutomodelSweeper.__name__} does not support sweep type : "
                                     f"{override.value_type.name} ({override.input_line}); use a list, range(), "
                                     f"choice() or glob()")
            by_key[key] = [f"{key}={value}" for value in override.sweep_string_iterator()]
        else:
            by_key[key] = [f"{key}={override.get_value_element_as_str()}"]
    return [list(job) for job in itertools.product(*by_key.values())]


def batches(jobs: list[list[str]], max_batch_size: int | None) -> list[list[list[str]]]:
    """``jobs`` in order, in batches of at most ``max_batch_size`` jobs (one batch when None)."""
    if max_batch_size is None:
        return [jobs]
    return [jobs[i:i + max_batch_size] for i in range(0, len(jobs), max_batch_size)]


class AutomodelSweeper(Sweeper):
    """Hydra's basic sweep; with one of our launchers, each job is composed once (by the launcher) instead of
    twice.

    Parameters
    ----------
    max_batch_size:
        Jobs per launcher call (``hydra.sweeper.max_batch_size``); None: all jobs in one call. Batches run one
        after the other, each job numbered on from the previous batch.
    params:
        ``hydra.sweeper.params``: ``{key: sweep value}`` pairs placed before the command line's overrides.

    Raises
    ------
    ValueError
        ``max_batch_size`` is not a positive whole number of jobs (or null).
    """

    def __init__(self, max_batch_size: int | None = None, params: tp.Mapping[str, str] | None = None) -> None:
        super().__init__()
        if max_batch_size is not None and (isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int)
                                           or max_batch_size < 1):
            raise ValueError(f"hydra.sweeper.max_batch_size={max_batch_size!r}: must be a positive number of jobs "
                             f"per launch, or null for all jobs in one launch")
        self.max_batch_size = max_batch_size
        self.params = dict(params or {})
        self.hydra_context: HydraContext | None = None
        self.config: DictConfig | None = None
        self.launcher: Launcher | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.hydra_context, self.config = hydra_context, config
        self.launcher = Plugins.instance().instantiate_launcher(hydra_context=hydra_context,
                                                                task_function=task_function, config=config)

    def job_batches(self, arguments: tp.Sequence[str]) -> list[list[list[str]]]:
        """The sweep's jobs (override lists), in launch batches: ``hydra.sweeper.params`` then ``arguments``."""
        assert self.hydra_context is not None
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)  # glob() lists groups
        overrides = parser.parse_overrides([f"{k}={v}" for k, v in self.params.items()] + list(arguments))
        return batches(job_overrides(overrides), self.max_batch_size)

    def sweep(self, arguments: list[str]) -> list[tp.Sequence[JobReturn]]:
        """Launch every batch of the sweep in turn; returns each batch's ``JobReturn`` list.

        Writes ``<hydra.sweep.dir>/multirun.yaml`` (the sweep's config) first, as Hydra's basic sweeper does.
        A job that failed raises its exception once its batch has returned."""
        assert self.config is not None and self.launcher is not None
        job_batches = self.job_batches(arguments)
        sweep_dir = Path(self.config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        OmegaConf.save(self.config, sweep_dir / "multirun.yaml")
        validate = not self._launcher_validates()
        returns: list[tp.Sequence[JobReturn]] = []
        first = 0
        for batch in job_batches:
            if validate:
                self.validate_batch_is_legal(batch)
            results = self.launcher.launch(batch, initial_job_idx=first)
            first += len(batch)
            returns.append(results)
            failed = [r for r in results if r.status == JobStatus.FAILED]
            if failed and not validate:  # our launcher's jobs: one line per failed job, no traceback
                from automodel_hydra.plan import JobFailedError, JobStoppedError

                errors = [_failure(r) for r in failed]
                if all(isinstance(e, JobFailedError) for e in errors):
                    for e in errors:  # a cancelled job's line is a stop, not an error
                        kind = "stopped" if isinstance(e, JobStoppedError) else "error"
                        print(f"{kind}: {str(e).splitlines()[0]}", file=sys.stderr, flush=True)
                    raise SystemExit(130 if all(isinstance(e, JobStoppedError) for e in errors) else 1)
            for r in results:
                _ = r.return_value  # raises the job's exception when it failed
        return returns

    def _launcher_validates(self) -> bool:
        """Our launchers compose and validate every job of a batch before submitting any of them.

        Checked by class name, not ``isinstance``: Hydra's plugin scan re-executes plugin modules it finds
        already imported, which makes new class objects of the same classes."""
        return any(c.__name__ == "AutomodelLauncher" and c.__module__ == _LAUNCHERS
                   for c in type(self.launcher).__mro__)


def _failure(ret: JobReturn) -> BaseException | None:
    """A failed job's exception, through Hydra's public ``return_value`` (which raises it)."""
    try:
        ret.return_value  # noqa: B018
    except Exception as e:
        return e
    return None
