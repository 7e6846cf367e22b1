"""``metrics.jsonl`` (one JSON object per logged step, rank 0) and progress lines in the job log.

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

logger = logging.getLogger(__name__)


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
        self._file: tp.TextIO | None = None
        self._progress = self._task = None
        if rank != 0:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        truncate_after(self.path, start_step)
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115  (closed by close())
        if sys.stdout.isatty() if tty is None else tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

            self._progress = Progress(TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[info]}"), TimeRemainingColumn())
            self._task = self._progress.add_task("train", total=max_steps, completed=start_step, info="")
            self._progress.start()

    def log(self, step: int, loss: float, lr: float, tokens_per_s: float, **extra: tp.Any) -> dict[str, tp.Any]:
        """Write one record (``step, loss, lr, world_size, tokens_per_s, time`` + ``extra``) and flush it.

        Returns the record (on every rank; only rank 0 writes it)."""
        record = {"step": step, "loss": loss, "lr": lr, "world_size": self.world_size,
                  "tokens_per_s": tokens_per_s, "time": time.time(), **extra}
        if self._file is None:
            return record
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


def to_log_files(message: str, level: int = logging.INFO) -> None:
    """Hand ``message`` as a record of this module's logger to the root logger's file handlers only (the job log),
    not to its console handlers."""
    record = logger.makeRecord(logger.name, level, __file__, 0, message, (), None)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler) and level >= handler.level:
            handler.handle(record)
