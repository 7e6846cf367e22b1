"""One line for a config key or value the schema refuses, wherever the config is composed or validated.

OmegaConf and Hydra answer an unknown key or a wrong type with a multi-line message (``full_key``,
``reference_type``, ``object_type``), and Hydra's "To append to your config use +key=value" hint leads a typed
schema's user into the next error. :func:`describe` turns them into the line a user can act on:

* unknown key: the key, the closest valid keys (``difflib``), and the section's keys when there are few::

      step_scheduler.max_step: no such key in step_scheduler; did you mean max_steps? (its keys: max_steps, ...)

* wrong type: the key, the value and the expected type, in :class:`~automodel_hydra.schema.ConfigError`'s form::

      step_scheduler.max_steps='two' is invalid: expected an integer

* a value of the wrong shape (a list for a mapping: OmegaConf's ``Cannot merge DictConfig with ListConfig`` names
  no value) or a key new to a mapping set without ``++``: the key, the value, what is valid and how to write it on
  the command line (:func:`misshapen`, which :func:`automodel_hydra.config.load` also runs on a user's file)::

      slurm.setup={'a': 1} is invalid: expected a list; on the command line: slurm.setup=[A,B,...]

* a config group option that does not exist (``launcher=slurmm``): the option, the closest and the choices.

Where the config is composed by Hydra before any code of ours runs (``train.py``'s primary config),
:func:`run_hydra_main` makes Hydra hand its error to us instead of printing it; :func:`driver.one_line` uses
:func:`describe` for what :func:`automodel_hydra.config.load` raises; our sweep launcher for each job's compose.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import errno
import functools
import os
import re
import sys
import traceback
import typing as tp
import warnings
from pathlib import Path

from automodel_hydra.schema import USER_ERROR_EXIT, ConfigError

#: A section with at most this many keys has them all listed after an unknown key.
SHORT_SECTION = 16
#: Hydra's switch that makes ``run_and_report`` re-raise instead of printing (hydra/_internal/utils.py).
_FULL_ERROR = "HYDRA_FULL_ERROR"
_set_here = False
#: The user's config file this process's command line names (:func:`run_hydra_main`), None for the bundled config.
_user_file: Path | None = None


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
        return _tilde_line(error.override, lines) or (
            " ".join(lines[:2]) + " (overrides are KEY=VALUE; quote a value with spaces or brackets)")
    cause = error.__cause__ if isinstance(error, ConfigCompositionException) else error
    if not isinstance(cause, OmegaConfBaseException):
        return None
    key = str(getattr(cause, "full_key", None) or getattr(cause, "key", None) or "")
    schema = getattr(cause, "object_type", None)
    line = _override_line(error, cause, key)
    if line is not None:
        return line
    if isinstance(cause, ConfigKeyError) or type(cause).__name__ == "ConfigAttributeError":
        name = str(getattr(cause, "key", None) or key.rpartition(".")[2])
        return unknown_key_line(key or name, name, _keys_of(schema, cause),
                                *_user_file_hints(error, typed=dataclasses.is_dataclass(schema)))
    if isinstance(cause, ValidationError) and key:
        hint = _hints(schema).get(key.rpartition(".")[2]) or _entry(getattr(cause, "ref_type", None))
        value = getattr(cause, "value", None)
        if hint is None:
            return str(ConfigError(key, value, _first_line(cause)))
        return str(invalid(key, value, hint, override=_OVERRIDE_LINE.match(str(error)) is not None))
    first = _first_line(cause)
    return f"{key}: {first}" if key and key not in first else first


#: The start of Hydra's message for a character its override lexer has no token for, followed by the override and,
#: on the next line, a ``^`` under that character (hydra/core/override_parser/overrides_parser.py).
_LEXER = "LexerNoViableAltException: "


def _tilde_line(override: str, lines: list[str]) -> str | None:
    """The line for an override whose value has an unquoted ``~`` (``checkpoint.checkpoint_dir=~/ckpt``), where
    Hydra's lexer stops: its override grammar has ``~`` only as the delete prefix of a key (``~key``), and an
    unquoted value is made of letters, digits, ``_``, ``:`` and ``/-\\+.$%*@?|`` (hydra's ``OverrideLexer.g4``,
    ``UNQUOTED_CHAR``; https://hydra.cc/docs/advanced/override_grammar/basic/). A quoted value takes any character.
    None for any other parse error."""
    caret = lines[1].find("^") if len(lines) > 1 and lines[0] == _LEXER + override else -1
    at = caret - len(_LEXER)
    if not 0 <= at < len(override) or override[at] != "~" or "=" not in override[:at]:
        return None
    key, _, value = override.partition("=")
    simple = not any(c in value for c in "[]{}(),'\" \t")
    elsewhere = _home_elsewhere(key)
    if simple and value.startswith("~") and elsewhere:  # another machine's home: never this one's path
        fix = f"""quote the value: '{key}="{value}"' (~ there is {elsewhere})"""
    elif simple and value.startswith("~"):  # a home path: no shell expands a quoted ~, nor does the recipe
        fix = (f"write the path out: {key}={os.path.expanduser(value)} (a quoted ~ reaches the recipe as the "
               f"character ~; AutoModel's recipes do not expand it), or quote the value for a literal ~: "
               f"""'{key}="{value}"'""")
    elif simple:
        fix = f"""quote the value: '{key}="{value}"'"""
    else:
        fix = 'write each home path out ($HOME/...), or quote each value that has ~: "~..."'
    return f"{override}: Hydra's override grammar does not accept an unquoted ~ in a value; on the command line {fix}"


def _home_elsewhere(key: str) -> str | None:
    """Whose home a ``~`` in the value of override ``key`` is when it is not this machine's (``slurm.tunnel.job_dir``:
    the login node's; :data:`automodel_hydra.backends.slurm_config.HOME_ELSEWHERE`), else None."""
    from automodel_hydra.backends.slurm_config import HOME_ELSEWHERE

    name = key.lstrip("+~").removeprefix("hydra.launcher.")
    return HOME_ELSEWHERE.get(name)


def one_line_warnings() -> None:
    """Print a warning this package raises as one line, ``warning: <message>`` (as errors are ``error: ...``),
    instead of Python's two (``<file>:<line>: UserWarning: <message>`` and the source line): its message names
    the key and what to do, and our source line tells a user nothing. Other packages' warnings keep Python's
    format. Replaces :func:`warnings.formatwarning`, which the warnings module documents as replaceable."""
    default = warnings.formatwarning
    if getattr(default, "_automodel_hydra", False):
        return
    package = os.path.dirname(os.path.abspath(__file__)) + os.sep

    def formatwarning(message: Warning | str, category: type[Warning], filename: str, lineno: int,
                      line: str | None = None) -> str:
        if os.path.abspath(filename).startswith(package):
            return f"warning: {message}\n"
        return default(message, category, filename, lineno, line)

    formatwarning._automodel_hydra = True  # type: ignore[attr-defined]
    warnings.formatwarning = formatwarning


def invalid(key: str, value: tp.Any, hint: tp.Any, override: bool = False) -> ConfigError:
    """``key=value is invalid: expected <hint in words>`` (:func:`type_words`); for a value given on the command
    line (``override``) where a mapping, a section or a list is expected, also how to write one there."""
    valid = f"expected {type_words(hint)}"
    origin = _origin(hint)
    if override and (origin is dict or dataclasses.is_dataclass(origin)):  # ++: also a mapping's new keys
        valid += f"; on the command line: ++{key}={{KEY:VALUE,...}}"
    elif override and origin is list:
        valid += f"; on the command line: {key}=[A,B,...]"
    return ConfigError(key, value, valid)


def misshapen(hint: tp.Any, value: tp.Any, key: str = "") -> tuple[str, tp.Any, tp.Any] | None:
    """The first place where ``value`` (plain data: dicts, lists, scalars) has a shape the annotation ``hint``
    (a schema dataclass, ``Dict[K, V]``, ``List[T]``, a scalar type, ``Optional`` of one) cannot hold: a list
    where a section or a mapping is expected, a mapping where a list is, either where a scalar is. Returns
    ``(full key, the value there, the annotation there without Optional)``, or None when every shape fits. What
    OmegaConf itself reports with its key (a wrong scalar, an unknown key of a section) is not looked for."""
    hint = _strip_optional(hint)
    origin, args = _origin(hint), tp.get_args(hint)
    shape = dict if isinstance(value, dict) else list if isinstance(value, list) else None
    wanted = (dict if origin is dict or dataclasses.is_dataclass(origin) else list if origin is list
              else "a scalar" if origin in (str, int, float, bool) else None)
    if shape is not None and wanted is not None and shape is not wanted:
        return key, value, hint
    if shape is list and wanted is list and len(args) == 1:
        entries = [(f"{key}[{i}]", v, args[0]) for i, v in enumerate(value)]
    elif shape is dict and wanted is dict:
        fields = _hints(origin) if dataclasses.is_dataclass(origin) else None  # a key it lacks: OmegaConf's
        entries = [(f"{key}.{k}" if key else str(k), v, _entry(hint) if fields is None else fields.get(str(k)))
                   for k, v in value.items()]
    else:
        return None
    for k, v, h in entries:
        found = None if h is None else misshapen(h, v, k)
        if found is not None:
            return found
    return None


def _strip_optional(hint: tp.Any) -> tp.Any:
    """``Optional[X]`` -> ``X``; any other annotation as it is."""
    if tp.get_origin(hint) is tp.Union:
        args = [a for a in tp.get_args(hint) if a is not type(None)]
        return args[0] if len(args) == 1 else hint
    return hint


def _origin(hint: tp.Any) -> tp.Any:
    """``Optional[Dict[str, str]]`` -> ``dict``; a plain class (a dataclass, ``int``) as it is."""
    hint = _strip_optional(hint)
    return tp.get_origin(hint) or hint


def _hints(schema: tp.Any) -> dict[str, tp.Any]:
    """A schema dataclass's field annotations, resolved (once per class); {} for anything else or when they
    cannot be resolved."""
    return _class_hints(schema) if isinstance(schema, type) else {}


@functools.cache
def _class_hints(schema: type) -> dict[str, tp.Any]:
    try:
        return tp.get_type_hints(schema)
    except Exception:
        return {}


#: The override Hydra was applying when OmegaConf refused it, as its message names it
#: (hydra/_internal/config_loader_impl.py: ``_apply_overrides_to_config``).
_OVERRIDE_LINE = re.compile(r"^(?:Error merging override |Could not override .*\nTo append to your config use \+)"
                            r"(?P<line>.+)$", re.S)


def _override_line(error: BaseException, cause: BaseException, key: str) -> str | None:
    """The line for an override Hydra could not apply for its shape, or None for any other error:

    * a list set for a section or a mapping (``slurm.sbatch_args=[--foo]``), or a mapping for a list: OmegaConf
      says ``Cannot merge DictConfig with ListConfig`` at that key, without the value (for a section inside a
      section set as a whole, ``slurm={tunnel:[a]}``: ``Merge error: list is not a subclass of TunnelConfig``);
    * a key new to a mapping of its own keys (``slurm.env_vars.A=1``, ``slurm.sbatch_args={qos:x}``): OmegaConf
      says the key is not in the struct, as for a misspelt key of a section; Hydra adds one only with ``+``/``++``.

    The value is the override's, parsed as Hydra parses it; :func:`misshapen` finds the wrong shape in it."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError, ConfigTypeError, ValidationError

    hint = getattr(cause, "ref_type", None)
    match = _OVERRIDE_LINE.match(str(error))
    new_key = isinstance(cause, (ConfigKeyError, ConfigAttributeError)) and _origin(hint) is dict
    merge = (isinstance(cause, ConfigTypeError) and str(cause).startswith("Cannot merge")
             or isinstance(cause, ValidationError) and str(cause).startswith("Merge error"))
    if match is None or not (new_key or merge):
        return None
    text, at = match["line"].strip(), key.rpartition(".")[0] if new_key else key
    try:
        override = OverridesParser.create().parse_override(text)
    except HydraException:
        return None
    found = misshapen(hint, override.value(), at) if str(override.key_or_group) == at else None
    if found is not None:
        return str(invalid(*found, override=True))
    if new_key:
        return f"{key}: a new key of the mapping {at}; on the command line a new key takes ++: ++{text.lstrip('+')}"
    return None


def unknown_key_line(full_key: str, name: str, valid: tp.Sequence[str],
                     listed: str = "python train.py --help lists the main keys", adds: str | None = None) -> str:
    """``full_key: no such key in <section>; did you mean X? (its keys: ...)``: the closest of ``valid`` and, when
    the section is short, all of them, else ``listed`` (where the keys are listed) when none is close; then
    ``adds`` (how to add the key), when given."""
    section = full_key.rpartition(".")[0] or "the config"
    close = difflib.get_close_matches(name, valid, n=3, cutoff=0.6)
    line = f"{full_key}: no such key in {section}"
    if close:
        line += f"; did you mean {', '.join(close)}?"
    if valid and len(valid) <= SHORT_SECTION:
        line += f" ({'its' if section != 'the config' else 'top-level'} keys: {', '.join(valid)})"
    elif not close:
        line += f" ({listed})"
    return f"{line}; {adds}" if adds else line


def _user_file_hints(error: BaseException, typed: bool) -> tuple[str, str | None] | tuple[()]:
    """For a user's config file (the one :func:`run_hydra_main` was given: what ``automodel-hydra F.yaml`` runs):
    :func:`unknown_key_line`'s ``listed`` (that file's ``--help``, not the bundled config's ``train.py``) and, for
    an override of a key the file lacks in a section no schema of ours types (not ``typed``), its ``++`` form
    (Hydra adds a key only with ``+``/``++``); ``()`` for the bundled config."""
    if _user_file is None:
        return ()
    match = _OVERRIDE_LINE.match(str(error))
    adds = f"++{match['line'].strip().lstrip('+')} adds it to the file's config" if match and not typed else None
    return f"automodel-hydra {_user_file} --help lists its keys", adds


def _keys_of(schema: tp.Any, cause: BaseException) -> list[str]:
    if dataclasses.is_dataclass(schema):
        return [f.name for f in dataclasses.fields(schema)]
    parent = getattr(cause, "parent_node", None)
    try:
        return [str(k) for k in parent] if parent is not None else []
    except Exception:
        return []


def _entry(hint: tp.Any) -> tp.Any:
    """The type of an entry of a ``Dict[K, V]`` annotation (``V``), or None for any other annotation."""
    args = tp.get_args(_strip_optional(hint))
    return args[1] if _origin(hint) is dict and len(args) == 2 else None


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


def run_hydra_main(main: tp.Callable[[], tp.Any], user_file: Path | None = None) -> tp.Any:
    """Call a ``@hydra.main`` function so that a config error of its composition is one line (:func:`describe`,
    ``error: ...``, exit status 2) instead of Hydra's report. ``user_file``: the user's config file the command
    line names (:func:`automodel_hydra.argv.user_file`), which an unknown key's line then names, for the rest of
    the process (each sweep job is composed from it too).

    Hydra prints its own report unless ``HYDRA_FULL_ERROR`` is set, when it re-raises (``run_and_report``); it is
    set here for the composition only (:func:`release`, called before any job is started, so no job inherits it),
    and only when the user has not set it: a user who set it gets Hydra's full traceback as before. Any other
    error is reported as Hydra reports it (its message for Hydra's own errors, else the traceback), exit status 1."""
    global _set_here, _user_file
    _user_file = user_file
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
        long_name = name_too_long(e)
        if line is None and long_name is not None:
            line = name_too_long_line(long_name)
        if line is not None:
            print(f"error: {line}", file=sys.stderr)
            raise SystemExit(USER_ERROR_EXIT) from None
        from hydra.errors import CompactHydraException

        if isinstance(e, CompactHydraException):
            print(str(e), file=sys.stderr)
        else:
            traceback.print_exc()
        raise SystemExit(1) from None
    finally:
        release()


def name_too_long(error: BaseException) -> OSError | None:
    """The ``ENAMETOOLONG`` error among ``error`` and its causes (``__cause__``, else ``__context__``), or None.
    Hydra's logging set-up wraps the open of the job's log file in ``ValueError("Unable to configure handler
    'file'")``."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        if isinstance(current, OSError) and current.errno == errno.ENAMETOOLONG:
            return current
        seen.add(id(current))
        current = current.__cause__ or current.__context__
    return None


def name_too_long_line(error: OSError) -> str:
    """The one line for a path Hydra could not make before the task function ran: the run dir, or the job's log
    file ``<run dir>/<hydra.job.name>.log`` (Hydra's default job_logging), naming the key whose value is too
    long (:func:`automodel_hydra.paths.too_long`)."""
    from automodel_hydra.paths import too_long

    path = Path(str(error.filename))
    why = too_long(path) or "File name too long"
    if path.suffix == ".log" and path.parent.is_dir():  # the run dir was made: the job's name is too long
        return (f"hydra.job.name={path.stem!r} is invalid: {why} (Hydra names the job's log file after it); "
                "choose a shorter hydra.job.name")
    return f"hydra.run.dir={str(path)!r} is invalid: {why}; choose a shorter hydra.run.dir (or hydra.job.name)"


def release() -> None:
    """Unset the ``HYDRA_FULL_ERROR`` that :func:`run_hydra_main` set (a no-op otherwise): composition is over,
    and what starts next (torchrun, sbatch, a call job) must not inherit it."""
    global _set_here
    if _set_here:
        os.environ.pop(_FULL_ERROR, None)
        _set_here = False
