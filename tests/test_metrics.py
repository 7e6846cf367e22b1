"""metrics.jsonl records, rank-0-only writing, progress lines in the job log and truncation on resume."""

from __future__ import annotations

import json
import logging
import typing as tp

import pytest

from automodel_hydra.metrics import METRICS_FILE, MetricsLogger, truncate_after
from automodel_hydra.worker import setup_logging


def _steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


@pytest.fixture
def worker_logging() -> tp.Iterator[tp.Callable[[int, str], None]]:
    """The worker's own logging setup (``setup_logging(rank, log_file)``), undone after the test."""
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    yield setup_logging
    for h in root.handlers:
        if h not in saved[0]:
            h.close()
    root.handlers[:], root.level = saved


def test_records_are_flushed_per_line(tmp_path):
    m = MetricsLogger(tmp_path, max_steps=20, world_size=2, tty=False)
    m.log(10, loss=2.5, lr=1e-3, tokens_per_s=1000.0, val_loss=float("nan"))
    rec = json.loads((tmp_path / METRICS_FILE).read_text())  # readable before close
    assert {"step": 10, "loss": 2.5, "lr": 1e-3, "world_size": 2, "tokens_per_s": 1000.0}.items() <= rec.items()
    assert isinstance(rec["time"], float) and rec["val_loss"] is None  # NaN is not valid JSON
    m.log(20, loss=2.0, lr=1e-4, tokens_per_s=900.0)
    m.close()
    assert _steps(tmp_path / METRICS_FILE) == [10, 20]


def test_rank_0_progress_lines_land_in_the_job_log(tmp_path, worker_logging, capsys):
    log_file = tmp_path / "train.log"
    worker_logging(0, str(log_file))
    m = MetricsLogger(tmp_path, max_steps=20, tty=False)
    m.log(10, loss=2.5, lr=1e-3, tokens_per_s=1234.0)
    m.log(20, loss=2.0, lr=1e-4, tokens_per_s=900.0, val_loss=2.25)
    m.close()
    lines = [line for line in log_file.read_text().splitlines() if "[automodel_hydra.metrics]" in line]
    assert len(lines) == 2 and "[rank0]" in lines[0]
    assert lines[0].endswith("step 10/20  loss 2.5000  lr 1.00e-03  1,234 tok/s")
    assert lines[1].endswith("step 20/20  loss 2.0000  lr 1.00e-04  900 tok/s  val_loss 2.2500")
    err = capsys.readouterr().err  # the same lines on the rank's stderr (a Slurm log, torchrun.out, a terminal)
    assert "step 10/20  loss 2.5000" in err and "val_loss 2.2500" in err


def test_on_a_terminal_the_bar_shows_progress_and_the_job_log_gets_the_lines(tmp_path, worker_logging, capsys):
    log_file = tmp_path / "train.log"
    worker_logging(0, str(log_file))
    m = MetricsLogger(tmp_path, max_steps=3, tty=True)
    m.log(3, loss=1.0, lr=0.1, tokens_per_s=1.0)
    m.close()
    m.close()
    assert _steps(tmp_path / METRICS_FILE) == [3]
    assert "step 3/3  loss 1.0000" in log_file.read_text()
    assert "step 3/3" not in capsys.readouterr().err  # no log line tearing the bar


def test_only_rank_0_writes(tmp_path, worker_logging, capsys):
    log_file = tmp_path / "train.log"
    worker_logging(1, str(log_file))
    m = MetricsLogger(tmp_path, max_steps=5, rank=1, tty=False)
    rec = m.log(1, loss=1.0, lr=0.1, tokens_per_s=1.0)
    m.close()
    assert rec["step"] == 1
    assert not (tmp_path / METRICS_FILE).exists() and "step 1/5" not in log_file.read_text()
    captured = capsys.readouterr()
    assert captured.out == "" and "step 1/5" not in captured.err


def test_truncate_after(tmp_path):
    path = tmp_path / METRICS_FILE
    lines = [json.dumps({"step": s, "loss": 1.0}) for s in (1, 2, 3, 4)] + ['{"step": 5, "lo']  # torn last line
    path.write_text("\n".join(lines))
    assert truncate_after(path, 2) == 3
    assert _steps(path) == [1, 2]
    assert truncate_after(path, 2) == 0
    assert not list(tmp_path.glob(".*tmp"))
    assert truncate_after(tmp_path / "missing.jsonl", 0) == 0


def test_resume_drops_steps_after_the_checkpoint(tmp_path):
    m = MetricsLogger(tmp_path, max_steps=6, tty=False)
    for step in range(1, 6):
        m.log(step, loss=1.0, lr=0.1, tokens_per_s=1.0)
    m.close()
    m = MetricsLogger(tmp_path, max_steps=6, start_step=3, tty=False)  # resumed from the step-3 checkpoint
    for step in range(4, 7):
        m.log(step, loss=1.0, lr=0.1, tokens_per_s=1.0)
    m.close()
    assert _steps(tmp_path / METRICS_FILE) == [1, 2, 3, 4, 5, 6]


def test_a_later_launch_marks_where_it_went_on_and_the_report_draws_it(tmp_path, monkeypatch):
    """The bundled recipe's logger: the first record of a launch that appends to an earlier launch's records
    carries ``resumed`` (a restart within the launch has its own field instead), and the report's curve has the
    resume at that step."""
    import json

    from automodel_hydra.report import job_curve

    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    for start, steps in ((0, range(1, 4)), (3, range(4, 6))):  # a first launch, then one resumed from step 3
        m = MetricsLogger(tmp_path, max_steps=6, start_step=start, tty=False)
        for step in steps:
            m.log(step, loss=1.0, lr=0.1, tokens_per_s=1.0)
        m.close()
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")  # an in-job restart of that launch: not a resume
    m = MetricsLogger(tmp_path, max_steps=6, start_step=5, tty=False)
    m.log(6, loss=1.0, lr=0.1, tokens_per_s=1.0)
    m.close()
    rows = [json.loads(line) for line in (tmp_path / METRICS_FILE).read_text().splitlines()]
    assert [r["step"] for r in rows if r.get("resumed")] == [4]
    curve = job_curve(tmp_path)[0]
    assert curve.resumes == [4] and curve.restarts == [6]
