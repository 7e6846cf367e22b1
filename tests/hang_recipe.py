"""A user recipe function (``recipe: tests.hang_recipe:main``) whose rank 1 hangs inside step 3: it sleeps there
for an hour while rank 0 waits for it in ``all_reduce``. Neither reads ``should_stop`` again: what a stuck NCCL
collective or a rank blocked on a file system looks like to the launcher. Used by the stop tests."""

from __future__ import annotations

import time
import typing as tp
from pathlib import Path

HANG_STEP = 3


def main(cfg: tp.Any, dist: tp.Any, should_stop: tp.Callable[[], bool]) -> dict[str, tp.Any]:
    import torch
    import torch.distributed as tdist

    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out = Path(str(cfg.hang_dir))  # +hang_dir=DIR on the command line: where the marks go
    for step in range(1, 1000):
        if should_stop():
            return {"stopped_early": True, "step": step}
        loss = model(torch.ones(2, 4)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step == HANG_STEP:
            (out / f"hung.rank{dist.rank}").write_text(f"{step}\n")  # the test waits for both marks
            if dist.rank == 1:
                time.sleep(3600)
        t = loss.detach().reshape(1)
        if dist.world_size > 1:
            tdist.all_reduce(t)  # rank 0 blocks here while rank 1 sleeps
    return {"loss": float(loss)}
