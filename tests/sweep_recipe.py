"""A user recipe function (``recipe: tests.sweep_recipe:main``) for the sweep resume tests: ``sweep_test.steps``
steps of a few milliseconds each, a checkpoint after every step (``<sweep_test.out>/checkpoints/latest.json``, the
step it reached; ``sweep_test.out`` is the job dir, ``${hydra:runtime.output_dir}``), and a fresh start resumes
from that checkpoint, as the bundled recipe resumes from ``checkpoints/latest``. It fails (``RuntimeError``) after
step ``sweep_test.fail_after`` while the marker file ``<sweep_test.fail_dir>/fail-<sweep_test.point>`` exists: the
test removes the marker before resuming.

Its result: ``{"loss", "step", "started_from"}`` (the step of the checkpoint it resumed from, 0 for none)."""

from __future__ import annotations

import json
import time
import typing as tp
from pathlib import Path


def main(cfg: tp.Any, dist: tp.Any, should_stop: tp.Callable[[], bool]) -> dict[str, tp.Any]:
    t = cfg.sweep_test
    ckpt = Path(str(t.out)) / "checkpoints" / "latest.json"
    started_from = json.loads(ckpt.read_text())["step"] if ckpt.is_file() else 0
    marker = Path(str(t.fail_dir)) / f"fail-{t.point}"
    loss = 1.0
    for step in range(started_from + 1, int(t.steps) + 1):
        if should_stop():
            return {"loss": loss, "step": step - 1, "started_from": started_from}
        if step == int(t.fail_after) + 1 and marker.exists():
            raise RuntimeError(f"failing at step {step}: {marker} exists")
        time.sleep(float(t.get("step_s", 0.01)))
        loss = 1.0 / step
        dist.log(step, loss=loss)
        if dist.rank == 0:
            ckpt.parent.mkdir(parents=True, exist_ok=True)
            ckpt.write_text(json.dumps({"step": step}))
    return {"loss": loss, "step": int(t.steps), "started_from": started_from}
