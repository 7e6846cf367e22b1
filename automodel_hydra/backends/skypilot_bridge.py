"""Where SkyPilot's SDK runs: in this process when ``sky`` imports here, else in SkyPilot's own Python.

SkyPilot and NeMo AutoModel cannot share one environment (``skypilot==0.14.1`` pins ``click<8.2``; the
``huggingface_hub`` of AutoModel's ``transformers==5.18.0`` needs ``click>=8.4.2``; no SkyPilot release lifts the
pin), and SkyPilot is commonly installed as a tool of its own (``uv tool install skypilot``, pipx). So every call
the SkyPilot backend makes into :mod:`automodel_hydra.backends.skypilot_sdk` goes through :func:`call`, which runs
it here or, in SkyPilot's interpreter, as one short subprocess:

* ``AUTOMODEL_HYDRA_SKY_PYTHON`` names SkyPilot's Python (e.g. ``.venv-sky/bin/python``, made by ``scripts/setup``);
* else ``sky`` importable in this interpreter: in this process (no bridge);
* else the interpreter of the ``sky`` command next to this Python (``.venv/bin/sky``, a link ``scripts/setup``
  makes) or on ``PATH`` (its ``#!`` line).

The child imports this package from its own directory only (nothing else of this environment reaches SkyPilot's),
reads ``(op, args)`` pickled on stdin and writes ``(kind, value, args)`` to a pipe of its own, so SkyPilot's log
stream (provisioning, setup) reaches this terminal on stdout/stderr as it does in-process. Secrets never cross:
the child inherits this environment and expands the task's references itself. An error of SkyPilot's comes back
as a RuntimeError with its type and message; this package's own errors (PreflightError, SkyPilotPlanError) come
back as themselves. Cost per call: one interpreter start and ``import sky`` (docs/install.md has the numbers).
"""

from __future__ import annotations

import importlib.util
import os
import pickle
import shutil
import subprocess
import sys
import typing as tp
from pathlib import Path

from automodel_hydra.plan import PreflightError
from automodel_hydra.schema import ConfigError

#: names SkyPilot's Python: the SDK runs there, not here
ENV_VAR = "AUTOMODEL_HYDRA_SKY_PYTHON"

#: the child's start: this package from its own directory only, then :func:`_serve`
_BOOT = ("import sys, types; m = types.ModuleType('automodel_hydra'); m.__path__ = [sys.argv[1]]; "
         "sys.modules['automodel_hydra'] = m; from automodel_hydra.backends import skypilot_bridge as b; "
         "b._serve(int(sys.argv[2]))")


def _shebang(command: str) -> str | None:
    """The interpreter on the ``#!`` line of the script ``command`` (a console script of a venv), or None."""
    try:
        with open(command, "rb") as f:
            first = f.readline(4096).decode(errors="replace")
    except OSError:
        return None
    if not first.startswith("#!"):
        return None
    words = first[2:].split()
    return words[0] if words and Path(words[0]).name.startswith("python") else None


def sky_python() -> str | None:
    """SkyPilot's interpreter, or None when the SDK runs in this process (module docstring: the order asked).
    Raises PreflightError, one line naming the ways to install SkyPilot, when there is none."""
    named = os.environ.get(ENV_VAR)
    if named:
        if not (os.path.isfile(named) and os.access(named, os.X_OK)):
            raise PreflightError(f"{ENV_VAR}={named!r} is not an executable file; valid: the Python of an "
                                 "environment with skypilot installed (e.g. .venv-sky/bin/python)")
        return named
    if importlib.util.find_spec("sky") is not None:
        return None
    for command in (str(Path(sys.executable).parent / "sky"), shutil.which("sky")):
        python = _shebang(command) if command else None
        if python and os.access(python, os.X_OK):
            return python
    raise PreflightError("SkyPilot is not installed for this launcher: pip install 'automodel-hydra[skypilot]' "
                         f"here, or give SkyPilot its own environment (scripts/setup with EXTRAS=...,skypilot) and "
                         f"put its `sky` on PATH or set {ENV_VAR} to its Python (docs/install.md)")


def call(op: str, *args: tp.Any) -> tp.Any:
    """``skypilot_sdk.<op>(*args)`` where SkyPilot is (:func:`sky_python`). A dict argument the op updates (a
    cache) is updated here too. Raises what the op raises (SkyPilot's own errors as RuntimeError "Type: message"),
    PreflightError when SkyPilot is not installed or its process ends without an answer."""
    python = sky_python()
    if python is None:
        from automodel_hydra.backends import skypilot_sdk

        return getattr(skypilot_sdk, op)(*args)
    package = str(Path(__file__).resolve().parents[1])
    read, write = os.pipe()
    try:
        proc = subprocess.Popen([python, "-I", "-c", _BOOT, package, str(write)], stdin=subprocess.PIPE,
                                pass_fds=(write,))
    except OSError as e:
        os.close(read)
        os.close(write)
        raise PreflightError(f"cannot start SkyPilot's Python {python!r}: {e}") from e
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        assert proc.stdin is not None
        try:
            proc.stdin.write(pickle.dumps((op, args)))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        data = answer.read()
    code = proc.wait()
    if not data:
        raise PreflightError(f"SkyPilot's Python {python!r} ended (exit code {code}) without an answer to {op}; "
                             "its own message is above")
    kind, value, new_args = pickle.loads(data)
    for old, new in zip(args, new_args):
        if isinstance(old, dict) and isinstance(new, dict):
            old.clear()
            old.update(new)
    if kind == "config":
        raise ConfigError(*value)
    if kind == "error":
        raise value
    return value


def _portable(error: Exception) -> tuple[str, tp.Any]:
    """``error`` as it crosses back: this package's own errors as themselves (PreflightError, SkyPilotPlanError;
    ConfigError by its fields), any other as RuntimeError "Type: message" (SkyPilot's own types do not exist in
    the caller's environment)."""
    if isinstance(error, ConfigError):
        return "config", (error.key, error.value, error.valid)
    from automodel_hydra.backends.skypilot_sdk import SkyPilotPlanError

    if isinstance(error, (PreflightError, SkyPilotPlanError)):
        return "error", type(error)(str(error))
    return "error", RuntimeError(f"{type(error).__name__}: {error}")


def _serve(fd: int) -> None:
    """The child's side of :func:`call`: one op, its answer pickled to ``fd``."""
    import logging

    logging.basicConfig(level=logging.INFO, format="[%(asctime)s][%(name)s][%(levelname)s] - %(message)s")
    from automodel_hydra.backends import skypilot_sdk

    op, args = pickle.loads(sys.stdin.buffer.read())
    try:
        answer: tuple[str, tp.Any, tp.Any] = ("ok", getattr(skypilot_sdk, op)(*args), args)
    except Exception as e:
        answer = (*_portable(e), args)
    with os.fdopen(fd, "wb") as out:
        out.write(pickle.dumps(answer))
