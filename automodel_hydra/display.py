"""What the ``automodel-hydra`` commands print: rich tables, each line printed whole, one colour per state, one
number format. Imports rich only when a table is printed."""

from __future__ import annotations

import sys
import typing as tp

from automodel_hydra.states import JobState

#: The colour of each state in a table.
STYLE = {JobState.COMPLETED: "green", JobState.RUNNING: "cyan", JobState.PENDING: "dim",
         JobState.FAILED: "bold red", JobState.TIMEOUT: "red", JobState.OUT_OF_MEMORY: "red",
         JobState.NODE_FAIL: "red", JobState.BOOT_FAIL: "red", JobState.DEADLINE: "red",
         JobState.CANCELLED: "yellow", JobState.PREEMPTED: "yellow", JobState.UNKNOWN: "magenta"}


def console() -> tp.Any:
    from rich.console import Console

    # piped: as wide as the rows need, so that each row stays one line (greppable)
    return Console() if sys.stdout.isatty() else Console(width=1000)


def table() -> tp.Any:
    from rich.table import Table

    return Table()


def show(title: str, table: tp.Any, below: tp.Iterable[str] = ()) -> None:
    """Print ``title``, ``table`` and the lines said once for the whole table (``every job: ...``). Each line is
    printed whole, never markup: a terminal wraps it at its own width, a pipe keeps it one line (greppable)."""
    from rich.text import Text

    out = console()
    out.print(Text(title), soft_wrap=True)
    out.print(table)
    for line in below:
        out.print(Text(line), soft_wrap=True)


def fmt(value: tp.Any, spec: str = ".4f") -> str:
    """A cell: ``-`` for None, a float by ``spec``, anything else as text."""
    return "-" if value is None else format(value, spec) if isinstance(value, float) else str(value)
