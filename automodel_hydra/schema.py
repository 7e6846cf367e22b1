"""Validation helpers shared by every config section: the user-error type and the checks that raise it.

Each section's dataclass (the recipe's in :mod:`automodel_hydra.config`, each launcher's beside its backend in
:mod:`automodel_hydra.backends`) checks its own values in ``__post_init__`` with these helpers, so every bad value
fails the same way: one line naming the full key, the bad value and what is valid.
"""

from __future__ import annotations

import typing as tp

#: The exit status of a command that ends on a mistake the user can fix (a :class:`UserError`, a wrong command line),
#: as argparse's and Hydra's own usage errors end; a failed or stopped launch ends otherwise (1, 128 + the signal).
USER_ERROR_EXIT = 2


class UserError(Exception):
    """A mistake the user can fix (a config value, a file or a tool missing on this machine), with a message meant
    to be read as one line. The one base of every such error: the driver, our Hydra launcher and the CLI print a
    UserError as ``error: <line>`` without a traceback; any other exception is not a user's mistake and keeps its
    traceback (:func:`automodel_hydra.driver.fail_unexpected`)."""


class UserValueError(UserError, ValueError):
    """A value the user gave that cannot be used, where no single config key names it (an ``sbatch`` option in
    ``slurm.sbatch_args``, a backend name); the message is one line."""


class ConfigError(UserError, ValueError):
    """A config value is invalid. The message names the full key, the bad value and what is valid."""

    def __init__(self, key: str, value: tp.Any, valid: str) -> None:
        self.key, self.value, self.valid = key, value, valid
        shown = str(value).lower() if isinstance(value, bool) else repr(value)  # as the user wrote it: YAML's true
        super().__init__(f"{key}={shown} is invalid: {valid}")


def require(ok: bool, key: str, value: tp.Any, valid: str) -> None:
    """Raise :class:`ConfigError` for ``key=value`` unless ``ok``."""
    if not ok:
        raise ConfigError(key, value, valid)


def at_least(key: str, value: int | None, minimum: int = 1) -> None:
    """``value`` is None or an integer >= ``minimum``."""
    if value is not None:
        require(value >= minimum, key, value, f"must be an integer >= {minimum}")


def check_port(key: str, port: int) -> None:
    """A TCP port a rank may bind without privileges: 1024..65535."""
    require(1024 <= port <= 65535, key, port, "a TCP port in 1024..65535")


def one_line(key: str, value: tp.Any, what: str) -> None:
    """``value`` has no line break (``what`` says where it is written, e.g. ``#SBATCH --job-name``)."""
    require(not (isinstance(value, str) and ("\n" in value or "\r" in value)), key, value,
            f"a single line: {what}")
