"""``metrics.jsonl`` (one JSON object per logged step, rank 0) and progress lines in the job log.

Two writers append to a job's ``metrics.jsonl``: the bundled recipe's :class:`MetricsLogger` and a function
recipe's ``dist.log(step, **metrics)`` (:class:`StepLog`). Every record says which attempt of the job logged it
when that is not the first (:func:`attempt`): ``restart`` (the in-job restart: torchrun's and ft_launcher's
``TORCHELASTIC_RESTART_COUNT``) and ``requeue`` (Slurm's ``SLURM_RESTART_COUNT``), so ``automodel-hydra report``
marks both on the curve from the records alone.

Every logged step also becomes one progress line, ``step N/M  loss L  lr R  T tok/s`` (and ``val_loss V`` when
there is one), logged by rank 0 through the ``automodel_hydra.metrics`` logger at INFO. The worker's logging setup
sends rank 0's INFO records to stderr and appends them to the job log (``<output_dir>/<job_name>.log``), so
``automodel-hydra logs`` shows training progress on every launcher, and Slurm output files stay readable. When
stdout is a terminal a ``rich`` progress bar shows the same numbers there instead, and the line goes only to the
log files (the root logger's ``logging.FileHandler``s), so the bar is not torn by log lines.
"""

from __future__ import annotations

import json
import logging
import math
import os
import sys
import time
import typing as tp
from pathlib import Path

METRICS_FILE = "metrics.jsonl"
#: The record fields that name the attempt that logged it, and the variable each is read from: torchrun's (and
#: ft_launcher's) restart count of the worker group, and Slurm's count of the job's restarts (requeues).
ATTEMPT_FIELDS = {"restart": "TORCHELASTIC_RESTART_COUNT", "requeue": "SLURM_RESTART_COUNT"}

logger = logging.getLogger(__name__)


#: Set (true) on the first record of a launch that went on from the records of an earlier launch of the job dir
#: (a resumed sweep member, a run started again in its dir), where no attempt field says so: where
#: ``automodel-hydra report`` draws the resume.
RESUMED_FIELD = "resumed"


def _continues(path: Path, attempt_fields: tp.Mapping[str, int]) -> bool:
    """Whether this process, the first attempt of its launch, appends to records an earlier launch wrote."""
    try:
        return not attempt_fields and path.stat().st_size > 0
    except OSError:
        return False


def attempt(environ: tp.Mapping[str, str] = os.environ) -> dict[str, int]:
    """``{"restart": N, "requeue": M}`` for this process, each only when it is not 0 (:data:`ATTEMPT_FIELDS`)."""
    out = {}
    for field, var in ATTEMPT_FIELDS.items():
        try:
            n = int(environ.get(var, "0"))
        except ValueError:
            n = 0
        if n > 0:
            out[field] = n
    return out


def read_records(path: str | os.PathLike) -> list[dict[str, tp.Any]]:
    """The JSON objects of a JSON Lines file, in order (a missing file: none; a line that is not a JSON object, such
    as a last line torn by a crash, is skipped)."""
    rows: list[dict[str, tp.Any]] = []
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return rows
    for line in text.splitlines():
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            rows.append(row)
    return rows


def truncate_after(path: str | os.PathLike, step: int) -> int:
    """Drop every line of the metrics file whose ``step`` is greater than ``step``, atomically (tmp + os.replace).

    Used on resume from checkpoint ``step``: the dropped steps were logged after that checkpoint and will be redone.
    Lines that are not JSON (a line torn by a crash) are dropped too. Returns how many lines were dropped; a missing
    file is left missing.
    """
    path = Path(path)
    if not path.is_file():
        return 0
    kept, dropped = [], 0
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            ok = json.loads(line)["step"] <= step
        except (ValueError, KeyError, TypeError):
            ok = False
        if ok:
            kept.append(line + "\n")
        else:
            dropped += 1
    if dropped:
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text("".join(kept), encoding="utf-8")
        os.replace(tmp, path)
    return dropped


def _json_safe(value: tp.Any) -> tp.Any:
    return None if isinstance(value, float) and not math.isfinite(value) else value


def last_record(path: str | os.PathLike, tail: int = 65536) -> dict[str, tp.Any] | None:
    """The last JSON object of a JSON Lines file, read from its last ``tail`` bytes only (a file that grows by a
    record per step is not read whole); None when there is none."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - tail))
            chunk = f.read()
    except OSError:
        return None
    for line in reversed(chunk.decode(errors="replace").splitlines()):
        try:
            row = json.loads(line)
        except ValueError:
            continue
        if isinstance(row, dict):
            return row
    return None


class MetricsLogger:
    """Appends logged steps to ``<output_dir>/metrics.jsonl`` and shows progress; only rank 0 writes or prints.

    Parameters
    ----------
    output_dir: the job's output dir (created if missing).
    max_steps: total steps, for the progress display.
    rank, world_size: this process; ``world_size`` is written into every record.
    start_step: the step training resumes from (0 = fresh). Lines with a greater step are dropped from an existing
        file first, so that after the run every step appears exactly once.
    tty: force the rich display (True) or plain lines (False); None = ``sys.stdout.isatty()``.
    """

    def __init__(self, output_dir: str | os.PathLike, max_steps: int, *, rank: int = 0, world_size: int = 1,
                 start_step: int = 0, tty: bool | None = None) -> None:
        self.path = Path(output_dir) / METRICS_FILE
        self.max_steps, self.rank, self.world_size = max_steps, rank, world_size
        self._attempt = attempt()
        self._file: tp.TextIO | None = None
        self._progress = self._task = None
        if rank != 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        truncate_after(self.path, start_step)
        self._resumed = _continues(self.path, self._attempt)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (closed by close())
        if sys.stdout.isatty() if tty is None else tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self._task = self._progress.add_task("train", total=max_steps, completed=start_step, info="")
            self._progress.start()

    def log(self, step: int, loss: float, lr: float, tokens_per_s: float, **extra: tp.Any) -> dict[str, tp.Any]:
        """Write one record (``step, loss, lr, world_size, tokens_per_s, time``, the :func:`attempt` fields, then
        ``extra``) and flush it.

        Returns the record (on every rank; only rank 0 writes it)."""
        record = {"step": step, "loss": loss, "lr": lr, "world_size": self.world_size,
                  "tokens_per_s": tokens_per_s, "time": time.time(), **self._attempt, **extra}
        if self._file is None:
            return record
        if self._resumed:
            record[RESUMED_FIELD], self._resumed = True, False
        self._file.write(json.dumps({k: _json_safe(v) for k, v in record.items()}) + "\n")
        self._file.flush()
        info = f"loss {loss:.4f}  lr {lr:.2e}  {tokens_per_s:,.0f} tok/s"
        if isinstance(extra.get("val_loss"), float):
            info += f"  val_loss {extra['val_loss']:.4f}"
        line = f"step {step}/{self.max_steps}  {info}"
        if self._progress is not None:
            self._progress.update(tp.cast(tp.Any, self._task), completed=step, info=info)
            to_log_files(line)
        else:
            logger.info(line)
        return record

    def close(self) -> None:
        """Close the file and stop the progress display (idempotent)."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if self._file is not None:
            self._file.close()
            self._file = None


class StepLog:
    """What a function recipe's ``dist.log(step, **metrics)`` writes: on rank 0, one record per call appended to
    ``<output_dir>/metrics.jsonl`` (the bundled recipe's file) and flushed, ``{"step": step, **metrics, "time": t}``
    with the :func:`attempt` fields, and a progress line in the job log (``step 5  loss 2.1000  acc 0.5``); other
    ranks write nothing. A requeued or restarted job calls the function again from its start: this process's first
    record drops the file's records of its step and every later one (they are being redone), so that every step is
    in the file once, as the bundled recipe keeps it.

    Parameters
    ----------
    output_dir: the job's output dir (created if missing).
    rank: this process's rank.
    """

    def __init__(self, output_dir: str | os.PathLike, rank: int) -> None:
        self.path, self.rank = Path(output_dir) / METRICS_FILE, rank
        self._file: tp.TextIO | None = None
        self._attempt = attempt()

    def log(self, step: int, **metrics: tp.Any) -> dict[str, tp.Any]:
        """Log step ``step`` (an int >= 0) with ``metrics`` (numbers, text, booleans or None; a tensor or numpy
        scalar is taken as its ``.item()``); returns the record on every rank. Raises TypeError/ValueError naming
        the argument for anything else (before anything is written)."""
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ValueError(f"dist.log(step={step!r}): the step is an int >= 0")
        values = {}
        for key, value in metrics.items():
            if hasattr(value, "item") and callable(value.item):
                value = value.item()
            if value is not None and not isinstance(value, (int, float, str, bool)):
                raise TypeError(f"dist.log({key}={value!r}): a metric is a number, text, a boolean or None")
            if key in ("step", "time", *ATTEMPT_FIELDS, RESUMED_FIELD):
                raise ValueError(f"dist.log({key}=...): {key!r} is a field of every record; name the metric otherwise")
            values[key] = value
        record = {"step": step, **values, "time": time.time(), **self._attempt}
        if self.rank != 0:
            return record
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            truncate_after(self.path, step - 1)
            if _continues(self.path, self._attempt):
                record[RESUMED_FIELD] = True
            self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (closed by close())
        self._file.write(json.dumps({k: _json_safe(v) for k, v in record.items()}) + "\n")
        self._file.flush()
        shown = "  ".join(f"{k} {v:.4f}" if isinstance(v, float) else f"{k} {v}" for k, v in values.items())
        logger.info(f"step {step}  {shown}".rstrip())
        return record

    def close(self) -> None:
        """Close the file (idempotent)."""
        if self._file is not None:
            self._file.close()
            self._file = None


def to_log_files(message: str, level: int = logging.INFO) -> None:
    """Hand ``message`` as a record of this module's logger to the root logger's file handlers only (the job log),
    not to its console handlers."""
    record = logger.makeRecord(logger.name, level, __file__, 0, message, (), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and level >= handler.level:
            handler.handle(record)
