"""A user's recipe function (``recipe: tests.early_recipe:main``) whose rank 1 returns early: its data ends after
step 3, so it returns while rank 0 is in step 4's all-reduce. Rank 0 then fails with gloo's "Connection closed by
peer" (or "Connection reset by peer"): only the echo of rank 1's return. It trains without a torch optimizer and
logs each step with ``dist.log`` (the step its end record carries). A tester's recipe, as they wrote it; used by
tests/test_early_runs.py."""

from __future__ import annotations

import typing as tp


def main(cfg: tp.Any, dist: tp.Any, should_stop: tp.Callable[[], bool]) -> dict[str, tp.Any]:
    import torch
    import torch.distributed as td

    for step in range(1, 6):
        if dist.rank == 1 and step == 4:
            return {"loss": 0.0}
        t = torch.ones(1)
        td.all_reduce(t)
        dist.log(step, loss=1.0 / step)
    return {"loss": 0.2, "step": 5}
