"""A user's recipe function (``recipe: tests.fault_recipe:main``) with one fault on one rank, chosen by its own
section: Adam on a tiny model, the gradients all-reduced by hand each step (every rank waits for every other),
``fault.steps`` steps, and on rank ``fault.rank`` after ``fault.step`` completed steps:

* ``return``: the rank's data ends and it returns its metrics (the others are in the next step's all-reduce);
* ``raise``: ``ValueError("bad batch at step N")``;
* ``hang``: it sleeps inside the step for ``fault.sleep_s`` seconds, sending no heartbeat and joining no
  collective;
* ``import``: it imports a module that does not exist (what a restart repeats);
* ``oom``: ``MemoryError`` (what a host out of memory raises; a restart repeats it);
* ``comm``: torch's ``DistBackendError`` (what a failed NCCL or gloo collective raises);
* ``kill``: the rank kills itself with SIGKILL (a STAND-IN for the kernel's OOM killer): it leaves no record;
* ``none``: no fault.

``fault.attempts`` says in which attempts (``TORCHELASTIC_RESTART_COUNT`` + ``SLURM_RESTART_COUNT``) the fault
happens: ``first`` or ``every``. ``fault.write``, when set, is a file rank 0 writes (the test reads what the
recipe saw there). ``fault.step: 0`` faults before the first optimizer step. Used by tests/test_truth_runs.py and
tests/test_failure_runs.py."""

from __future__ import annotations

import os
import signal
import time
import typing as tp
from pathlib import Path


def main(cfg: tp.Any, dist: tp.Any, should_stop: tp.Callable[[], bool]) -> dict[str, tp.Any]:
    import torch
    import torch.distributed as tdist

    f = cfg.fault
    # in-job restarts and Slurm requeues alike
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) + int(os.environ.get("SLURM_RESTART_COUNT", "0"))
    faulty = dist.rank == int(f.rank) and (str(f.attempts) == "every" or attempt == 0)
    if f.get("write") and dist.rank == 0:
        Path(str(f.write)).write_text(str(cfg.get("seen", "")))
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    loss = torch.zeros(())
    for step in range(1, int(f.steps) + 1):
        if faulty and step == int(f.step) + 1:
            if f.mode == "return":
                return {"loss": float(loss.detach()), "step": step - 1}
            if f.mode == "raise":
                raise ValueError(f"bad batch at step {step}")
            if f.mode == "import":
                import no_such_module_in_this_job  # noqa: F401
            if f.mode == "oom":
                raise MemoryError
            if f.mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if f.mode == "comm":
                raise tdist.DistBackendError(f"NCCL error at step {step}: unhandled system error (a stand-in)")
            if f.mode == "hang":
                time.sleep(float(f.get("sleep_s", 600)))  # HANG HERE: no heartbeat, no collective
        loss = (model(torch.randn(8, 4)) - 1.0).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if dist.world_size > 1:
            for p in model.parameters():
                assert p.grad is not None
                tdist.all_reduce(p.grad)
        opt.step()
        time.sleep(float(f.get("step_s", 0.1)))
    return {"loss": float(loss.detach()), "step": int(f.steps)}
