"""One line for a config key or value the schema refuses, wherever the config is composed or validated.

OmegaConf and Hydra answer an unknown key or a wrong type with a multi-line message (``full_key``,
``reference_type``, ``object_type``), and Hydra's "To append to your config use +key=value" hint leads a typed
schema's user into the next error. :func:`describe` turns them into the line a user can act on:

* unknown key: the key, the closest valid keys (``difflib``), and the section's keys when there are few::

      step_scheduler.max_step: no such key in step_scheduler; did you mean max_steps? (its keys: max_steps, ...)

* wrong type: the key, the value and the expected type, in :class:`~automodel_hydra.schema.ConfigError`'s form::

      step_scheduler.max_steps='two' is invalid: expected an integer

* a config group option that does not exist (``launcher=slurmm``): the option, the closest and the choices.

Where the config is composed by Hydra before any code of ours runs (``train.py``'s primary config),
:func:`run_hydra_main` makes Hydra hand its error to us instead of printing it; :func:`driver.one_line` uses
:func:`describe` for what :func:`automodel_hydra.config.load` raises; our sweep launcher for each job's compose.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import os
import sys
import traceback
import typing as tp

#: A section with at most this many keys has them all listed after an unknown key.
SHORT_SECTION = 16
#: Hydra's switch that makes ``run_and_report`` re-raise instead of printing (hydra/_internal/utils.py).
_FULL_ERROR = "HYDRA_FULL_ERROR"
_set_here = False


def describe(error: BaseException) -> str | None:
    """The one line for a config error (an OmegaConf key or type error, a Hydra composition error caused by one,
    a missing config group option, an override that does not parse), or None for any other error."""
    from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
    from omegaconf.errors import ConfigKeyError, OmegaConfBaseException, ValidationError

    if isinstance(error, MissingConfigException) and error.options:
        wanted = str(error.missing_cfg_file or "")
        group, _, option = wanted.rpartition("/")
        close = difflib.get_close_matches(option, error.options, n=3)
        mean = f"did you mean {', '.join(close)}? " if close else ""
        return f"{group}={option}: no such option; {mean}({group}: {', '.join(error.options)})"
    if isinstance(error, OverrideParseException):
        lines = str(error).splitlines()
        return " ".join(lines[:2]) + " (overrides are KEY=VALUE; quote a value with spaces or brackets)"
    cause = error.__cause__ if isinstance(error, ConfigCompositionException) else error
    if not isinstance(cause, OmegaConfBaseException):
        return None
    key = str(getattr(cause, "full_key", None) or getattr(cause, "key", None) or "")
    schema = getattr(cause, "object_type", None)
    if isinstance(cause, ConfigKeyError) or type(cause).__name__ == "ConfigAttributeError":
        name = str(getattr(cause, "key", None) or key.rpartition(".")[2])
        return unknown_key_line(key or name, name, _keys_of(schema, cause))
    if isinstance(cause, ValidationError) and key:
        from automodel_hydra.schema import ConfigError

        expected = _expected(schema, key.rpartition(".")[2]) or _first_line(cause)
        return str(ConfigError(key, getattr(cause, "value", None), f"expected {expected}"))
    first = _first_line(cause)
    return f"{key}: {first}" if key and key not in first else first


def unknown_key_line(full_key: str, name: str, valid: tp.Sequence[str]) -> str:
    """``full_key: no such key in <section>; did you mean X? (its keys: ...)``: the closest of ``valid`` and, when
    the section is short, all of them."""
    section = full_key.rpartition(".")[0] or "the config"
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    line = f"{full_key}: no such key in {section}"
    if close:
        line += f"; did you mean {', '.join(close)}?"
    if valid and len(valid) <= SHORT_SECTION:
        line += f" ({'its' if section != 'the config' else 'top-level'} keys: {', '.join(valid)})"
    elif not close:
        line += " (python train.py --help lists the main keys)"
    return line


def _keys_of(schema: tp.Any, cause: BaseException) -> list[str]:
    if dataclasses.is_dataclass(schema):
        return [f.name for f in dataclasses.fields(schema)]
    parent = getattr(cause, "parent_node", None)
    try:
        return [str(k) for k in parent] if parent is not None else []
    except Exception:
        return []


def _expected(schema: tp.Any, name: str) -> str | None:
    """The expected type of ``schema``'s field ``name`` in words (``an integer``, ``a number or null``)."""
    if not dataclasses.is_dataclass(schema):
        return None
    try:
        hint = tp.get_type_hints(schema).get(name)
    except Exception:
        return None
    return None if hint is None else type_words(hint)


def type_words(hint: tp.Any) -> str:
    """A type annotation in words: ``int`` -> ``an integer``, ``Optional[str]`` -> ``a string or null``."""
    args = [a for a in tp.get_args(hint) if a is not type(None)]
    if tp.get_origin(hint) is tp.Union:
        words = " or ".join(type_words(a) for a in args)
        return f"{words} or null" if len(args) < len(tp.get_args(hint)) else words
    origin = tp.get_origin(hint) or hint
    if isinstance(origin, type) and issubclass(origin, enum.Enum):
        return f"one of {', '.join(m.name for m in origin)}"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list",
             dict: "a mapping (KEY: VALUE)"}
    if origin in names:
        return names[origin]
    if dataclasses.is_dataclass(origin):
        return "a section (KEY: VALUE entries)"
    return "any value" if hint is tp.Any else getattr(hint, "__name__", str(hint))


def _first_line(error: BaseException) -> str:
    text = str(error)
    return text.splitlines()[0] if text else type(error).__name__


def run_hydra_main(main: tp.Callable[[], tp.Any]) -> tp.Any:
    """Call a ``@hydra.main`` function so that a config error of its composition is one line (:func:`describe`,
    ``error: ...``, exit status 2) instead of Hydra's report.

    Hydra prints its own report unless ``HYDRA_FULL_ERROR`` is set, when it re-raises (``run_and_report``); it is
    set here for the composition only (:func:`release`, called before any job is started, so no job inherits it),
    and only when the user has not set it: a user who set it gets Hydra's full traceback as before. Any other
    error is reported as Hydra reports it (its message for Hydra's own errors, else the traceback), exit status 1."""
    global _set_here
    if _FULL_ERROR in os.environ:
        return main()
    os.environ[_FULL_ERROR] = "1"
    _set_here = True
    try:
        return main()
    except Exception as e:
        if not _set_here and _FULL_ERROR in os.environ:  # set since by the user's own code: theirs to see
            raise
        line = describe(e)
        if line is not None:
            print(f"error: {line}", file=sys.stderr)
            raise SystemExit(2) from None
        from hydra.errors import CompactHydraException

        if isinstance(e, CompactHydraException):
            print(str(e), file=sys.stderr)
        else:
            traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        release()


def release() -> None:
    """Unset the ``HYDRA_FULL_ERROR`` that :func:`run_hydra_main` set (a no-op otherwise): composition is over,
    and what starts next (torchrun, sbatch, a call job) must not inherit it."""
    global _set_here
    if _set_here:
        os.environ.pop(_FULL_ERROR, None)
        _set_here = False
