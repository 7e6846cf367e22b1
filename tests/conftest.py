"""Shared fixtures. The real Slurm test cluster comes from tests/slurm_cluster.py (session-scoped)."""

import copy
import gc
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hydra.core.config_store import ConfigStore
from hydra.core.plugins import Plugins
from hydra.core.singleton import Singleton

pytest_plugins = ["tests.slurm_cluster", "tests.ssh_server", "tests.tiers"]


class _HydraAtStart:
    """Hydra's global state as the session's first test found it, put back after every test.

    Hydra's own ``hydra_restore_singletons`` deep-copies the whole state before each test and, after it, makes a
    new ``Plugins``, which scans ``hydra_plugins`` again and re-runs every plugin module (each re-stores its
    configs): 0.1-0.3 s per test, half the fast tier's teardown. Here the scan happens once (the first
    ``Plugins`` is put back, as Hydra itself never rescans in one process), and the ConfigStore is deep-copied
    again only when a test stored into it: the nodes of its ``repo`` are compared by identity, which is enough
    because Hydra hands out only deep copies of a stored node (``ConfigStore.load``). Every other instance
    (``SourcesRegistry``) and OmegaConf's resolvers are copies of the first state each time. ``HydraConfig``,
    ``GlobalHydra``, ``JobRuntime`` and whatever else a test made are dropped, as with Hydra's fixture."""

    def __init__(self) -> None:
        self.plugins = Plugins.instance()
        self.state = Singleton.get_state()  # deep copies, without Plugins
        self.store: ConfigStore | None = None
        self.nodes: list[tuple[str, int]] = []

    @staticmethod
    def _nodes(store: ConfigStore) -> list[tuple[str, int]]:
        found: list[tuple[str, int]] = []
        todo: list[tuple[str, dict[str, object]]] = [("", store.repo)]
        while todo:
            path, group = todo.pop()
            for name, entry in group.items():
                if isinstance(entry, dict):
                    todo.append((f"{path}{name}/", entry))
                else:
                    found.append((path + name, id(entry)))
        return found

    def restore(self) -> None:
        instances = {cls: copy.deepcopy(obj) for cls, obj in self.state["instances"].items() if cls is not ConfigStore}
        if self.store is None or self._nodes(self.store) != self.nodes:
            self.store = copy.deepcopy(self.state["instances"][ConfigStore])
            self.nodes = self._nodes(self.store)
        Singleton.set_state({"instances": {**instances, ConfigStore: self.store, Plugins: self.plugins},
                             "omegaconf_resolvers": self.state["omegaconf_resolvers"]})  # set_state copies these


_hydra_at_start: list[_HydraAtStart] = []


@pytest.fixture(autouse=True)
def _restore_hydra_singletons() -> Iterator[None]:
    """Every test starts from Hydra's pristine global state (HydraConfig, ConfigStore, OmegaConf's resolvers):
    tests that compose configs set HydraConfig, which would otherwise leak into Hydra's own launcher suites."""
    if not _hydra_at_start:
        _hydra_at_start.append(_HydraAtStart())
        _hydra_at_start[0].restore()
    yield
    _hydra_at_start[0].restore()


#: how many modules were loaded when the long-lived objects were last frozen (:func:`pytest_runtest_teardown`)
_frozen_at_modules = [0]


def pytest_collection_finish(session: pytest.Session) -> None:
    _freeze_what_imports_made()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    if len(sys.modules) != _frozen_at_modules[0]:
        _freeze_what_imports_made()


def _freeze_what_imports_made() -> None:
    """Move every object alive now into the collector's permanent generation (``gc.freeze``), after a collection,
    whenever new modules were imported. The fast tier imports torch, transformers and NeMo AutoModel: ~0.8 M
    long-lived objects, which each of CPython's full collections walks (0.3-0.5 s each, ~80 of them: a quarter of
    the fast tier's time). Objects made by a test are still collected as before; only what was alive after a new
    import (modules, classes, caches) is never walked again, as in a process that forked after its imports (the
    ``gc.freeze`` docs)."""
    gc.collect()
    gc.freeze()
    _frozen_at_modules[0] = len(sys.modules)


@pytest.fixture(autouse=True)
def _restore_environ() -> Iterator[None]:
    """Every test starts from the session's environment: an in-process ``init_distributed`` exports MASTER_PORT and
    the ranks' variables, which a later subprocess (a sweep submitted through submitit, which exports the
    submitter's environment) would otherwise inherit as its own rendezvous port."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


# ----------------------------------------------------------------------------------------------- weird paths


#: A file name that is code if a shell reads it unquoted: spaces, both quotes, ";", "$( )", backticks, a backslash,
#: "$HOME" and a newline. Run from the test's tmp dir, a leak leaves MARK* files there.
WEIRD_NAME = "we ird 'q' \"dq\" ; touch MARK1 $(touch MARK2) `touch MARK3` \\ $HOME\nnl"


@pytest.fixture
def weird_path(tmp_path: Path) -> Path:
    """``tmp_path / WEIRD_NAME``, created (as submitit's ``weird_tmp_path``, all the cases in one name: each use
    is a real run). ``weird_path.with_name(weird_path.name.replace("\\n", " "))`` for sbatch, which cannot take a
    newline in ``#SBATCH --output``."""
    path = tmp_path / WEIRD_NAME
    path.mkdir()
    return path


@pytest.fixture(scope="module")
def sky(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """``import sky`` once per test module, with HOME in a temp dir (the import creates ~/.sky); skipped where
    SkyPilot is not installed (CI runs those tests in .venv-sky)."""
    from tests.helpers import SKY_ELSEWHERE

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HOME", str(tmp_path_factory.mktemp("home")))
        yield pytest.importorskip("sky", reason=SKY_ELSEWHERE)
