"""Shared fixtures. The real Slurm test cluster comes from tests/slurm_cluster.py (session-scoped)."""

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest_plugins = ["tests.slurm_cluster", "tests.ssh_server"]


@pytest.fixture(autouse=True)
def _restore_hydra_singletons(hydra_restore_singletons: None) -> None:
    """Every test starts from Hydra's pristine global state (HydraConfig, ConfigStore): tests that compose
    configs set HydraConfig, which would otherwise leak into Hydra's own launcher suites."""


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
