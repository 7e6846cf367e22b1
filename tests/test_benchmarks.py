"""benchmarks/run.py's small helpers, without running any benchmark: which NeMo-Run interpreter the peer figures
use (``nemo_run_python``). Fast: no cluster, no NeMo-Run import (a missing path is refused before any process
starts; a present one is this project's interpreter, which does not have ``nemo_run``)."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench() -> Iterator[ModuleType]:
    """benchmarks/run.py as a module (benchmarks/ is not a package)."""
    spec = importlib.util.spec_from_file_location("bench_run", ROOT / "benchmarks" / "run.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        del sys.modules[spec.name]


def _nemo_run_here() -> bool:
    return importlib.util.find_spec("nemo_run") is not None


def test_a_nemo_run_python_that_does_not_exist_is_a_skip_naming_it(bench: ModuleType, tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An explicit ``$NEMO_RUN_PYTHON`` is the only interpreter tried: a wrong path is the skip reason, not a
    quiet fallback to ``.venv-nemo-run`` (which may hold another NeMo-Run) or to this interpreter."""
    missing = tmp_path / "no-such-venv" / "bin" / "python"
    monkeypatch.setenv("NEMO_RUN_PYTHON", str(missing))
    with pytest.raises(bench.Unavailable) as e:
        bench.nemo_run_python()
    assert str(e.value).startswith(f"NeMo-Run is not installed: NEMO_RUN_PYTHON={missing} does not exist (")
    assert "benchmarks/setup-nemo-run" in str(e.value)


@pytest.mark.slow
@pytest.mark.skipif(_nemo_run_here(), reason="this interpreter imports nemo_run: the case needs one that does not")
def test_a_nemo_run_python_without_nemo_run_is_a_skip_naming_it(bench: ModuleType,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """``$NEMO_RUN_PYTHON`` set to an interpreter that exists but cannot import ``nemo_run`` (this project's own:
    NeMo-Run lives in its own environment, benchmarks/setup-nemo-run) is refused with that reason, even where
    ``.venv-nemo-run`` would import it."""
    monkeypatch.setenv("NEMO_RUN_PYTHON", sys.executable)
    with pytest.raises(bench.Unavailable, match=r"NEMO_RUN_PYTHON=\S+ does not import nemo_run \(unset it"):
        bench.nemo_run_python()
