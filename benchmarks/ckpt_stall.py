"""Training-thread stall of a checkpoint: ``CheckpointManager(async_save=True)`` vs ``async_save=False``.

Run by ``benchmarks/run.py`` in its own process (so torch is never imported by the harness); prints one JSON line.

What is timed: a single-process training loop (an MLP of ``--params`` parameters with AdamW, so the saved state is
model + two optimizer moments, about 12 bytes per parameter) calls ``CheckpointManager.save`` every
``--interval`` training steps, exactly as the recipe does. The stall of one save is the wall time the training
thread spends inside ``save()``: for a synchronous save the whole DCP write; for an asynchronous one the staging
copy and planning, plus any wait for the previous save still in flight (``save`` waits for it first). The write
that overlaps the next ``--interval`` steps is *not* stall, but it competes with them for CPU; that slowdown is
reported separately (``async_step_slowdown``: mean step time with a save in flight / without).

Sync and async rounds are interleaved (S A S A ...) so drift on a shared machine hits both alike; the first round
of each is a warm-up (DCP's first call sets up its thread pool and imports) and is not counted.
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
from automodel_hydra.checkpoint import MODEL_AND_OPTIM, CheckpointManager, ModelOptimState  # noqa: E402


def build(params: int, width: int = 1024) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    layers = max(1, round(params / (width * width + width)))
    torch.manual_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(width, width) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    return model, opt


def step(model: torch.nn.Module, opt: torch.optim.Optimizer, x: torch.Tensor) -> float:
    t0 = time.perf_counter()
    model(x).square().mean().backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--params", type=int, default=4_000_000)
    ap.add_argument("--rounds", type=int, default=4, help="counted rounds per mode (after one warm-up each)")
    ap.add_argument("--saves", type=int, default=3, help="saves per round")
    ap.add_argument("--interval", type=int, default=6, help="training steps between saves")
    ap.add_argument("--dir", default=None)
    args = ap.parse_args()
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)

    model, opt = build(args.params)
    x = torch.randn(4, model[0].in_features)
    step(model, opt, x)  # optimizer state exists from here on
    state = {MODEL_AND_OPTIM: ModelOptimState(model, opt)}
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(v.numel() * v.element_size() for s in opt.state.values() for v in s.values()
                  if torch.is_tensor(v))

    root = Path(args.dir or tempfile.mkdtemp(prefix="ckpt_bench_"))
    stalls: dict[str, list[float]] = {"sync": [], "async": []}
    per_round: dict[str, list[list[float]]] = {"sync": [], "async": []}
    plain_steps: list[float] = []  # step times with no save in flight
    inflight_steps: list[float] = []  # step times right after an async save returned
    step_no = 1
    inflight = False  # an async save returned and may still be writing
    for r in range(args.rounds + 1):
        for mode in ("sync", "async"):
            d = root / f"{mode}-{r}"
            mgr = CheckpointManager(d, async_save=(mode == "async"))
            this_round: list[float] = []
            for _ in range(args.saves):
                times = [step(model, opt, x) for _ in range(args.interval)]
                step_no += args.interval
                if mode == "sync" and r > 0:
                    plain_steps += times
                elif mode == "async" and r > 0 and inflight:
                    inflight_steps += times[: max(1, args.interval // 2)]
                t0 = time.perf_counter()
                mgr.save(step_no, state)
                dt = time.perf_counter() - t0
                inflight = mode == "async"
                if r > 0:
                    stalls[mode].append(dt)
                    this_round.append(dt)
            if r > 0:
                per_round[mode].append(this_round)
            mgr.close()  # end of the round: the last async save's write (not counted: a real run overlaps it)
            inflight = False
            shutil.rmtree(d, ignore_errors=True)
    shutil.rmtree(root, ignore_errors=True)
    sync_med, async_med = statistics.median(stalls["sync"]), statistics.median(stalls["async"])
    # one ratio per round (its sync and async saves ran back to back), median over rounds
    ratios = [statistics.median(a) / statistics.median(s)
              for s, a in zip(per_round["sync"], per_round["async"])]
    print(json.dumps({
        "state_mb": nbytes / 2**20,
        "sync_stall_s": sync_med,
        "async_stall_s": async_med,
        "ratio": statistics.median(ratios),
        "round_ratios": ratios,
        "sync_all": stalls["sync"],
        "async_all": stalls["async"],
        "async_step_slowdown": (statistics.mean(inflight_steps) / statistics.mean(plain_steps))
        if inflight_steps and plain_steps else None,
        "torch": torch.__version__,
    }))


if __name__ == "__main__":
    main()
