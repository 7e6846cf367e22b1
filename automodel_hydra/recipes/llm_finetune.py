"""``llm_finetune``: a small causal LM (Hugging Face ``transformers``) trained on real text, on any launcher.

SPEC section 6. Read :func:`train` top-down: build data, model, optimizer and checkpointer; restore; loop
{train step, agree on stop, log, checkpoint}; return the final metrics. The helpers it calls are above it.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
import typing as tp

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from automodel_hydra.checkpoint import MODEL_AND_OPTIM, CheckpointManager, ModelOptimState
from automodel_hydra.config import NsysConfig, OptimConfig, TrainConfig
from automodel_hydra.data import VOCAB_SIZE, ShardedWindows, build_data
from automodel_hydra.metrics import MetricsLogger

if tp.TYPE_CHECKING:
    from automodel_hydra.bootstrap import DistEnv

logger = logging.getLogger(__name__)


def build_model(cfg: TrainConfig, device: torch.device) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path)``, or a small Llama from ``cfg.model`` sizes,
    seeded by ``cfg.seed`` so every rank starts identical.

    Raises ValueError when a pretrained model's vocabulary cannot hold the 256 byte tokens."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    m = cfg.model
    if m.name_or_path:
        model = AutoModelForCausalLM.from_pretrained(m.name_or_path)
        if model.config.vocab_size < VOCAB_SIZE:
            raise ValueError(f"model.name_or_path={m.name_or_path!r} has vocab_size={model.config.vocab_size}; "
                             f"byte-level data needs >= {VOCAB_SIZE}")
    else:
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=VOCAB_SIZE, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
            num_attention_heads=m.num_heads, num_key_value_heads=m.num_heads, intermediate_size=m.intermediate_size,
            max_position_embeddings=max(cfg.data.seq_len, 128), tie_word_embeddings=True))
    return model.to(device)


def lr_at(step: int, optim: OptimConfig, max_steps: int) -> float:
    """Learning rate of optimizer step ``step`` (1-based): linear warm-up to ``optim.lr`` over ``warmup_steps``,
    then cosine decay to ``min_lr_ratio * lr`` at ``max_steps``. A pure function: nothing to checkpoint."""
    if step <= optim.warmup_steps:
        return optim.lr * step / optim.warmup_steps
    progress = min(1.0, (step - optim.warmup_steps) / max(1, max_steps - optim.warmup_steps))
    floor = optim.lr * optim.min_lr_ratio
    return floor + (optim.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))


class NsysSteps:
    """Nsight Systems capture range tied to training steps (``profile.nsys``).

    ``torch.cuda.profiler.start()`` before ``start_step`` (or the first step inside the range after a resume),
    ``stop()`` after ``stop_step``, and an NVTX range ``"step N"`` around every step; the CUDA calls happen only when
    ``cuda`` is true, but ``calls`` records ``("start"|"stop", step)`` either way (testable on CPU)."""

    def __init__(self, cfg: NsysConfig, cuda: bool | None = None) -> None:
        self.cfg, self.cuda = cfg, torch.cuda.is_available() if cuda is None else cuda
        self.calls: list[tuple[str, int]] = []
        self.active = False

    @contextlib.contextmanager
    def step(self, step: int) -> tp.Iterator[None]:
        if self.cfg.enabled and not self.active and self.cfg.start_step <= step <= self.cfg.stop_step:
            self._call("start", step)
        with torch.cuda.nvtx.range(f"step {step}") if self.cuda else contextlib.nullcontext():
            yield
        if self.active and step >= self.cfg.stop_step:
            self.stop(step)

    def stop(self, step: int) -> None:
        """End the capture now (also used when training stops early inside the range)."""
        if self.active:
            self._call("stop", step)

    def _call(self, what: str, step: int) -> None:
        self.calls.append((what, step))
        self.active = what == "start"
        if self.cuda:
            getattr(torch.cuda.profiler, what)()


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: ShardedWindows, step: int,
               lr: float, device: torch.device) -> torch.Tensor:
    """One optimizer step over ``data.grad_accumulation`` micro-batches (DDP syncs gradients on the last one).

    Returns this rank's mean loss (nats/token), a 0-dim tensor on ``device``."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    n = data.grad_accumulation
    total = torch.zeros((), device=device)
    for micro in range(n):
        inputs, targets = (t.to(device, non_blocking=True) for t in data.batch(step, micro))
        no_sync = isinstance(model, DDP) and micro < n - 1
        with model.no_sync() if no_sync else contextlib.nullcontext():
            logits = model(input_ids=inputs).logits
            loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
            (loss / n).backward()
        total += loss.detach() / n
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


@torch.no_grad()
def evaluate(model: torch.nn.Module, val_tokens: torch.Tensor, seq_len: int, device: torch.device,
             max_windows: int = 8) -> float | None:
    """Mean loss on the first held-out windows (same on every rank; no collectives). None when too little text."""
    n = min(max_windows, (val_tokens.numel() - 1) // seq_len)
    if n < 1:
        return None
    rows = val_tokens[: n * seq_len + 1]
    inputs = rows[:-1].view(n, seq_len).to(device)
    targets = rows[1:].view(n, seq_len).to(device)
    model.eval()
    logits = model(input_ids=inputs).logits
    model.train()
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten()).item()


def _distributed(env: DistEnv) -> bool:
    return env.world_size > 1 and dist.is_available() and dist.is_initialized()


def mean_over_ranks(value: torch.Tensor, env: DistEnv) -> float:
    """All-reduced mean of a 0-dim tensor (the tensor itself on one rank)."""
    if _distributed(env):
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= env.world_size
    return value.item()


def any_rank(flag: bool, env: DistEnv) -> bool:
    """True on every rank when ``flag`` is true on any rank (all_reduce MAX)."""
    if not _distributed(env):
        return bool(flag)
    t = torch.tensor([int(flag)], device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def train(cfg: TrainConfig, env: DistEnv, should_stop: tp.Callable[[], bool] = lambda: False) -> dict[str, tp.Any]:
    """Train ``cfg``'s model from the newest checkpoint (``restore_from.path``) to ``step_scheduler.max_steps``.

    ``env`` has ``rank, local_rank, world_size, device``; with ``world_size > 1`` the process group is initialised.
    ``should_stop`` is polled after every step; when it is true on any rank, every rank checkpoints that step, waits
    for the checkpoint to complete and returns with ``stopped_early=True``.

    Returns ``{"step", "loss", "stopped_early", "world_size", "tokens_per_s", "val_loss"}``: the last step run,
    the last logged loss (mean over ranks, nats/token) and throughput (tokens/s over all ranks).

    Raises ConfigError for a global batch size that does not divide over the ranks.
    """
    sched, rank0 = cfg.step_scheduler, env.rank == 0
    data, val_tokens = build_data(cfg.data, sched.local_batch_size, seed=cfg.seed, rank=env.rank,
                                  world_size=env.world_size, grad_accumulation=sched.grad_accumulation(env.world_size))
    model = build_model(cfg, env.device)
    if _distributed(env):
        model = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
                    forward_sync_buffers=False)
    raw_model = model.module if isinstance(model, DDP) else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    checkpointer = CheckpointManager(cfg.checkpoint_dir, enabled=cfg.checkpoint.enabled,
                                     async_save=cfg.checkpoint.async_save, keep_latest_k=cfg.checkpoint.keep_latest_k)
    state = {MODEL_AND_OPTIM: ModelOptimState(model, optimizer)}
    start = checkpointer.load(state, cfg.restore_from.path)
    metrics = MetricsLogger(cfg.output_dir, sched.max_steps, rank=env.rank, world_size=env.world_size,
                            start_step=start)
    profiler = NsysSteps(cfg.profile.nsys)
    tokens_per_step = data.samples_per_step * cfg.data.seq_len
    if rank0:
        logger.info("llm_finetune: %.2fM params, world_size %d, %d tokens/step, steps %d..%d",
                    sum(p.numel() for p in raw_model.parameters()) / 1e6, env.world_size, tokens_per_step,
                    start + 1, sched.max_steps)

    result: dict[str, tp.Any] = {"step": start, "loss": None, "stopped_early": False, "world_size": env.world_size,
                                 "tokens_per_s": None, "val_loss": None}
    window_start, window_steps = time.perf_counter(), 0
    try:
        for step in range(start + 1, sched.max_steps + 1):
            lr = lr_at(step, cfg.optim, sched.max_steps)
            with profiler.step(step):
                loss = train_step(model, optimizer, data, step, lr, env.device)
            window_steps += 1
            last, stop = step == sched.max_steps, any_rank(should_stop(), env)

            if step % sched.log_interval == 0 or last or stop:
                extra = {"val_loss": evaluate(raw_model, val_tokens, cfg.data.seq_len, env.device)} if last else {}
                tokens_per_s = window_steps * tokens_per_step / (time.perf_counter() - window_start)
                record = metrics.log(step, mean_over_ranks(loss, env), lr, tokens_per_s, **extra)
                result.update(step=step, loss=record["loss"], tokens_per_s=tokens_per_s, **extra)
                window_start, window_steps = time.perf_counter(), 0
            if step % sched.checkpoint_interval == 0 or last or stop:
                checkpointer.save(step, state)
            if stop:
                profiler.stop(step)
                checkpointer.wait()
                if rank0:
                    logger.warning("stop requested: checkpointed step %d, returning early", step)
                result.update(step=step, stopped_early=True)
                break
    finally:
        checkpointer.close()
        metrics.close()
    if rank0:
        logger.info("done: %s", result)
    return result
