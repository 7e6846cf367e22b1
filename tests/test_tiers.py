"""The tiers' check (tests/tiers.py): a test outside ``slow`` and ``slurm`` that starts a Python interpreter fails,
naming the command and the marker to add; a shell or git does not count."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest

from tests.helpers import ROOT
from tests.tiers import is_python

pytest_plugins = ["pytester"]


def _script(path: Path, head: str) -> Path:
    path.write_text(f"{head}\n")  # a line that both a shell and Python run
    path.chmod(0o755)
    return path


def test_an_interpreter_or_a_script_it_runs_is_python_a_shell_is_not(tmp_path: Path) -> None:
    assert is_python(sys.executable) and is_python("python3")
    assert is_python(_script(tmp_path / "torchrun", "#!/usr/bin/env python3"))  # a console script's head
    assert is_python("torchrun", path=str(tmp_path))  # looked up on the PATH it is started with
    assert not is_python(_script(tmp_path / "sbatch", "#!/bin/sh")) and not is_python("bash")
    assert not is_python("git") and not is_python(tmp_path / "no-such-program")


@pytest.mark.slow
def test_a_fast_test_that_starts_python_fails_naming_it(pytester: pytest.Pytester,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    script = _script(pytester.path / "entry", f"#!{sys.executable}")
    pytester.makeini("[pytest]\nmarkers =\n    slow: real processes\n    slurm: the cluster\n")
    pytester.makepyfile(test_inner=textwrap.dedent(f"""
        import os, subprocess, sys
        import pytest

        def test_python():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_console_script():
            subprocess.run([{str(script)!r}], check=True)

        def test_os_system():
            assert os.system(f"{{sys.executable}} -c pass") == 0

        def test_shell_true():
            subprocess.run(f"{{sys.executable}} -c pass", shell=True, check=True)

        @pytest.fixture
        def started():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_python_in_a_fixture(started):
            pass

        def test_shell_and_git():
            subprocess.run(["bash", "-c", "true"], check=True)
            subprocess.run(["git", "--version"], check=True, capture_output=True)

        @pytest.mark.slow
        def test_slow_python():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        @pytest.mark.slurm
        def test_slurm_python():
            subprocess.run([sys.executable, "-c", "pass"], check=True)
    """))
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    result = pytester.runpytest_subprocess("-p", "tests.tiers", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=3, failed=5)
    out = result.stdout.str()
    for name, command in [("test_python", f"{sys.executable} -c pass"), ("test_console_script", str(script)),
                          ("test_os_system", f"{sys.executable} -c pass"),
                          ("test_shell_true", f"{sys.executable} -c pass"),
                          ("test_python_in_a_fixture", f"{sys.executable} -c pass")]:
        section = out.split(f" {name} _", 1)[1].split("\n_", 1)[0]
        assert (f"a fast test started a Python interpreter: {command}; mark it @pytest.mark.slow "
                "(docs/testing.md)") in section, section
