"""pytest plugin: the test tiers, and the check that keeps the fast tier free of Python processes.

Loaded from ``tests/conftest.py``. The tiers (docs/testing.md):

- **fast** (``-m "not slow and not slurm"``): logic in this process. A fast test may run a shell, ``git`` or a
  stand-in of a Slurm client (milliseconds each), never a Python interpreter.
- **slow**: a test that starts a Python interpreter (``train.py``, the CLI, ``python -c`` or ``-m``, torchrun,
  ft_launcher, a rank, SkyPilot's Python in ``.venv-sky``), or that takes over ~1 s. A fresh interpreter costs
  0.1-3 s of imports before the code under test runs: in the fast tier, 33 of them were a quarter of its time.
- **slurm**: a test that needs the real Slurm test cluster (``tests/slurm_cluster.py``).

The check: while a test without ``slow`` or ``slurm`` sets up and runs, every ``subprocess.Popen`` (which
``subprocess.run``, ``check_output`` and asyncio's subprocesses make) and ``os.system`` is looked at; one whose
program is a Python interpreter (its name starts with ``python``, or its ``#!`` line names python: a console
script such as ``torchrun``) fails the test, naming the command and the marker to add. ``Popen.__init__`` and
``os.system`` are wrapped rather than watched through an audit hook (``sys.addaudithook``): a hook is called for
every audited event, ``id()`` included, which made ``copy.deepcopy`` (Hydra's and OmegaConf's) 1.3-2.6 times
slower. What a shell script started by the test runs is not seen, nor ``multiprocessing``'s own spawning.
"""

from __future__ import annotations

import functools
import inspect
import os
import shlex
import shutil
import subprocess
import typing as tp

import pytest

#: the markers of the tiers that may start Python interpreters
REAL_PROCESS_MARKERS = ("slow", "slurm")


class _Watch:
    """The Python interpreters the current fast test started (while ``on``)."""

    on = False
    started: tp.ClassVar[list[str]] = []


def is_python(program: str | os.PathLike[str] | bytes, path: str | None = None) -> bool:
    """Whether ``program`` (a name looked up on ``path``, default ``$PATH``, or a path) is a Python interpreter or a
    script whose ``#!`` line runs one."""
    name = os.fsdecode(program)
    found = shutil.which(name, path=path) or name
    if os.path.basename(found).startswith("python"):
        return True
    try:
        with open(found, "rb") as f:
            head = f.readline(256)
    except OSError:
        return False
    return head.startswith(b"#!") and b"python" in head


def _note(words: list[str], program: str | os.PathLike[str] | bytes, env: tp.Mapping[str, str] | None) -> None:
    if program and is_python(program, (env if env is not None else os.environ).get("PATH")):
        _Watch.started.append(shlex.join(words)[:200])


_popen_init = subprocess.Popen.__init__
_popen_signature = inspect.signature(_popen_init)
_system = os.system


@functools.wraps(_popen_init)
def _watched_popen_init(self: subprocess.Popen[tp.Any], *args: tp.Any, **kwargs: tp.Any) -> None:
    if _Watch.on:
        try:
            given = _popen_signature.bind(self, *args, **kwargs).arguments
            argv, executable, shell = given["args"], given.get("executable"), given.get("shell")
            if isinstance(argv, (str, bytes, os.PathLike)):
                words = shlex.split(os.fsdecode(argv)) if shell else [os.fsdecode(argv)]
            else:
                words = [os.fsdecode(a) for a in argv]
        except (TypeError, ValueError):  # a call Popen itself refuses: its own error follows
            pass
        else:
            _note(words, executable if executable is not None and not shell else words[0] if words else "",
                  given.get("env"))
    _popen_init(self, *args, **kwargs)


@functools.wraps(_system)
def _watched_system(command: tp.Any) -> int:
    if _Watch.on:
        words = shlex.split(os.fsdecode(command)) if command else []
        _note(words, words[0] if words else "", None)
    return _system(command)


subprocess.Popen.__init__ = _watched_popen_init  # type: ignore[method-assign]
os.system = _watched_system


def _fast(item: pytest.Item) -> bool:
    return not any(item.get_closest_marker(name) for name in REAL_PROCESS_MARKERS)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> tp.Generator[None, None, None]:
    _Watch.started.clear()
    _Watch.on = _fast(item)
    try:
        return (yield)
    finally:
        _Watch.on = False


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> tp.Generator[None, None, None]:
    _Watch.on = _fast(item)
    try:
        result = yield
    finally:
        _Watch.on = False
    if _Watch.started:
        pytest.fail(f"a fast test started a Python interpreter: {_Watch.started[0]}"
                    f"{f' (and {len(_Watch.started) - 1} more)' if len(_Watch.started) > 1 else ''}; "
                    "mark it @pytest.mark.slow (docs/testing.md)", pytrace=False)
    return result
