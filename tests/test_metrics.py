"""metrics.jsonl records, rank-0-only writing, plain progress lines and truncation on resume."""

from __future__ import annotations

import json

from automodel_hydra.metrics import METRICS_FILE, MetricsLogger, truncate_after


def _steps(path):
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def test_records_are_flushed_per_line(tmp_path, capsys):
    m = MetricsLogger(tmp_path, max_steps=20, world_size=2, tty=False)
    m.log(10, loss=2.5, lr=1e-3, tokens_per_s=1000.0, val_loss=float("nan"))
    rec = json.loads((tmp_path / METRICS_FILE).read_text())  # readable before close
    assert {"step": 10, "loss": 2.5, "lr": 1e-3, "world_size": 2, "tokens_per_s": 1000.0}.items() <= rec.items()
    assert isinstance(rec["time"], float) and rec["val_loss"] is None  # NaN is not valid JSON
    m.log(20, loss=2.0, lr=1e-4, tokens_per_s=900.0)
    m.close()
    assert _steps(tmp_path / METRICS_FILE) == [10, 20]
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("step 10/20") and "loss 2.5000" in out[0] and "tok/s" in out[0]


def test_only_rank_0_writes(tmp_path, capsys):
    m = MetricsLogger(tmp_path, max_steps=5, rank=1, tty=False)
    rec = m.log(1, loss=1.0, lr=0.1, tokens_per_s=1.0)
    m.close()
    assert rec["step"] == 1
    assert not (tmp_path / METRICS_FILE).exists() and capsys.readouterr().out == ""


def test_rich_progress_on_a_tty(tmp_path):
    m = MetricsLogger(tmp_path, max_steps=3, tty=True)
    m.log(3, loss=1.0, lr=0.1, tokens_per_s=1.0)
    m.close()
    m.close()
    assert _steps(tmp_path / METRICS_FILE) == [3]


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
