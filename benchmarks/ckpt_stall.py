"""Training-thread stall of a checkpoint: ``CheckpointManager(async_save=True)`` vs ``async_save=False``.

Run by ``benchmarks/run.py`` in its own process (the harness never imports torch); prints one JSON line.

The state is an MLP of ``--params`` parameters with AdamW after one step: model + two optimizer moments, about 12
bytes per parameter (~48 MB by default), saved through the project's ``CheckpointManager`` and ``ModelOptimState``
exactly as the recipe saves it. The stall of one save is the wall time the training thread spends inside
``save()``: for a synchronous save the whole DCP write (``dcp.save``: serialise, write, fsync, metadata); for an
asynchronous one what ``dcp.async_save`` does before returning (staging: a CPU copy of every tensor; planning;
starting the writer thread), plus any wait for the previous save still in flight.

Saves come in rounds, as in a real run: one manager saves ``--saves`` times, ``--interval`` training steps after
each save, and only its 2nd and later saves count (steady state: a long run's saves are periodic). Sync and async
rounds alternate (S A, A S, ...) and the ratio is the median over round pairs of (median async stall / median sync
stall), so drift of a shared machine hits both alike; one warm-up pair of rounds is not counted. The step times
right after an async save, while its write runs, give ``async_step_slowdown`` (mean step time with a write in
flight / after a sync save). Old step dirs are deleted outside the timing (``keep_latest_k`` would purge inside a
synchronous ``save()`` only).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from automodel_hydra.checkpoint import MODEL_AND_OPTIM, CheckpointManager, ModelOptimState


def build(params: int, width: int = 1024) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    layers = max(1, round(params / (width * width + width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    return model, torch.optim.AdamW(model.parameters(), lr=1e-4)


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=4_000_000)
    ap.add_argument("--rounds", type=int, default=6, help="counted (sync, async) round pairs, after a warm-up pair")
    ap.add_argument("--saves", type=int, default=4, help="saves per round; the first of each is not counted")
    ap.add_argument("--interval", type=int, default=6, help="training steps after each save")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)

    model, opt = build(args.params)
    x = torch.randn(4, model[0].in_features)
    step(model, opt, x)  # the optimizer state exists from here on
    state = {MODEL_AND_OPTIM: ModelOptimState(model, opt)}
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values() if torch.is_tensor(v))

    root = Path(args.dir or tempfile.mkdtemp(prefix="ckpt_bench_"))
    stall: dict[str, list[float]] = {"sync": [], "async": []}  # per round: median of its counted saves
    after: dict[str, list[float]] = {"sync": [], "async": []}  # step times after each kind of save
    n = 1
    for r in range(args.rounds + 1):
        for mode in ("sync", "async") if r % 2 == 0 else ("async", "sync"):
            mgr = CheckpointManager(root / mode, async_save=mode == "async")
            counted = []
            for k in range(args.saves):
                n += 1
                t0 = time.perf_counter()
                mgr.save(n, state)
                dt = time.perf_counter() - t0
                times = [step(model, opt, x) for _ in range(args.interval)]
                for p in (root / mode).glob("step-*"):  # outside the timing; the newest may still be written
                    if p.name not in (f"step-{n}", f"step-{n - 1}"):
                        shutil.rmtree(p, ignore_errors=True)
                if r > 0 and k > 0:  # steady state: not the warm-up round, not a manager's first save
                    counted.append(dt)
                    after[mode] += times[: max(1, args.interval // 2)]
            mgr.close()  # the last async write finishes here, untimed (a real run overlaps it with training)
            shutil.rmtree(root / mode, ignore_errors=True)
            if counted:
                stall[mode].append(statistics.median(counted))
    shutil.rmtree(root, ignore_errors=True)
    ratios = [a / s for s, a in zip(stall["sync"], stall["async"])]
    print(json.dumps({
        "state_mb": nbytes / 2**20,
        "sync_stall_s": statistics.median(stall["sync"]),
        "async_stall_s": statistics.median(stall["async"]),
        "ratio": statistics.median(ratios),
        "round_ratios": ratios,
        "async_step_slowdown": statistics.mean(after["async"]) / statistics.mean(after["sync"]),
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
