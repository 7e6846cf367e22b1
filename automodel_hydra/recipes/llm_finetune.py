"""``llm_finetune``: a causal LM (Hugging Face ``transformers``) fine-tuned on real text or instruction data, on any
launcher.

Read :func:`train` top-down: build tokenizer, data, model, optimizer and checkpointer; restore; loop {train step,
agree on stop, log, validate, checkpoint}; export the final model; return the final metrics. The helpers it calls
are above it.

With ``model.name_or_path`` the model and its own tokenizer come from ``from_pretrained``; without, a small Llama
over byte tokens is built from the ``model`` sizes (no download). At the end of a completed run rank 0 writes
``<output_dir>/final_model/``: ``save_pretrained`` of the model (safetensors + config.json) and of the tokenizer when
there is one, loadable with ``AutoModelForCausalLM.from_pretrained``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import shutil
import time
import typing as tp
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from automodel_hydra.checkpoint import MODEL_AND_OPTIM, CheckpointManager, ModelOptimState
from automodel_hydra.config import NsysConfig, OptimConfig, TrainConfig
from automodel_hydra.data import IGNORE, StepSampler, Tokenizer, build_data, load_tokenizer
from automodel_hydra.metrics import MetricsLogger
from automodel_hydra.schema import ConfigError

logger = logging.getLogger(__name__)

#: Under the job's output dir: the consolidated Hugging Face export of a completed run.
FINAL_MODEL = "final_model"


class RankEnv(tp.Protocol):
    """Where this process trains (``bootstrap.init_distributed``'s result): its rank, local rank, the world size,
    and its ``torch.device``. With ``world_size > 1`` the process group is initialised."""

    rank: int
    local_rank: int
    world_size: int
    device: torch.device


def build_model(cfg: TrainConfig, device: torch.device, vocab_size: int) -> torch.nn.Module:
    """``AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path)``, or a small Llama from ``cfg.model`` sizes
    with ``vocab_size`` tokens, seeded by ``cfg.seed`` so every rank starts identical.

    Raises ValueError when the pretrained model's embedding holds fewer than ``vocab_size`` tokens (the tokenizer
    would produce ids it has no row for)."""
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(cfg.seed)
    m = cfg.model
    model: tp.Any
    if m.name_or_path:
        model = AutoModelForCausalLM.from_pretrained(m.name_or_path)
        rows = int(model.get_input_embeddings().weight.shape[0])
        if rows < vocab_size:
            raise ValueError(f"model.name_or_path={m.name_or_path!r} embeds {rows} tokens; its tokenizer (or the "
                             f"byte tokens used without one) needs {vocab_size}")
    else:
        model = LlamaForCausalLM(LlamaConfig(
            vocab_size=vocab_size, hidden_size=m.hidden_size, num_hidden_layers=m.num_layers,
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


def token_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats/token) of ``logits [B, T, V]`` against ``targets [B, T]`` over the targets that are
    not :data:`~automodel_hydra.data.IGNORE` (prompt and padding of instruction examples)."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, data: StepSampler, step: int,
               lr: float, device: torch.device) -> torch.Tensor:
    """One optimizer step over ``data.grad_accumulation`` micro-batches (DDP syncs gradients on the last one).

    Returns this rank's mean loss (nats/token, the mean of the micro-batches' :func:`token_loss`, computed before
    the update), a 0-dim tensor on ``device``."""
    for group in optimizer.param_groups:
        group["lr"] = lr
    n = data.grad_accumulation
    total = torch.zeros((), device=device)
    for micro in range(n):
        inputs, targets = (t.to(device, non_blocking=True) for t in data.batch(step, micro))
        no_sync = isinstance(model, DDP) and micro < n - 1
        with tp.cast(DDP, model).no_sync() if no_sync else contextlib.nullcontext():
            loss = token_loss(model(input_ids=inputs).logits, targets)
            (loss / n).backward()
        total += loss.detach() / n
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return total


@torch.no_grad()
def evaluate(model: torch.nn.Module, val: tuple[torch.Tensor, torch.Tensor] | None,
             device: torch.device) -> float | None:
    """:func:`token_loss` on the held-out ``(inputs, targets)`` (the same on every rank; no collectives). None
    without held-out data."""
    if val is None:
        return None
    model.eval()
    loss = token_loss(model(input_ids=val[0].to(device)).logits, val[1].to(device)).item()
    model.train()
    return loss


def export_final(model: torch.nn.Module, tokenizer: Tokenizer, output_dir: str | os.PathLike) -> Path:
    """Write ``<output_dir>/final_model/``: ``model.save_pretrained`` (safetensors weights, ``config.json``) and the
    tokenizer's ``save_pretrained`` when it has one. Written to a temporary dir first and renamed, so a
    ``final_model/`` that exists is whole. Rank 0 only; returns the dir."""
    final = Path(output_dir) / FINAL_MODEL
    tmp = final.with_name(f".{FINAL_MODEL}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tp.cast(tp.Any, model).save_pretrained(tmp)
    if tokenizer.hf is not None:
        tokenizer.hf.save_pretrained(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    logger.info("final model: %s (AutoModelForCausalLM.from_pretrained loads it)", final)
    return final


def _distributed(env: RankEnv) -> bool:
    return env.world_size > 1 and dist.is_available() and dist.is_initialized()


def mean_over_ranks(value: torch.Tensor, env: RankEnv) -> float:
    """All-reduced mean of a 0-dim tensor (the tensor itself on one rank)."""
    if _distributed(env):
        value = value.clone()
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        value /= env.world_size
    return value.item()


def any_rank(flag: bool, env: RankEnv) -> bool:
    """True on every rank when ``flag`` is true on any rank (all_reduce MAX)."""
    if not _distributed(env):
        return bool(flag)
    t = torch.tensor([int(flag)], device=env.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return bool(t.item())


def train(cfg: TrainConfig, env: RankEnv, should_stop: tp.Callable[[], bool] = lambda: False) -> dict[str, tp.Any]:
    """Train ``cfg``'s model from the newest checkpoint (``restore_from.path``) to ``step_scheduler.max_steps``.

    ``env`` has ``rank, local_rank, world_size, device``; with ``world_size > 1`` the process group is initialised.
    ``should_stop`` is polled after every step; when it is true on any rank, every rank checkpoints that step, waits
    for the checkpoint to complete and returns with ``stopped_early=True``.

    Returns ``{"step", "loss", "stopped_early", "world_size", "tokens_per_s", "val_loss", "final_model"}``: the
    last step run, the last logged loss (mean over ranks, nats/token), throughput (tokens/s over all ranks, padding
    included) and, when the run completed, the export dir (on rank 0; None elsewhere).

    Raises ConfigError for a global batch size that does not divide over the ranks; ValueError for data that cannot
    feed one step or a model whose vocabulary is smaller than its tokenizer's.
    """
    sched, rank0 = cfg.step_scheduler, env.rank == 0
    tokenizer = load_tokenizer(cfg.model.name_or_path)
    data = build_data(cfg.data, sched.local_batch_size, seed=cfg.seed, rank=env.rank, world_size=env.world_size,
                      grad_accumulation=sched.grad_accumulation(env.world_size), tokenizer=tokenizer)
    model = build_model(cfg, env.device, tokenizer.vocab_size)
    if _distributed(env):
        model = DDP(model, device_ids=[env.device.index] if env.device.type == "cuda" else None,
                    forward_sync_buffers=False)
    raw_model = model.module if isinstance(model, DDP) else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr, weight_decay=cfg.optim.weight_decay)
    checkpointer = CheckpointManager(cfg.checkpoint_dir, enabled=cfg.checkpoint.enabled,
                                     async_save=cfg.checkpoint.async_save, keep_latest_k=cfg.checkpoint.keep_latest_k)
    state = {MODEL_AND_OPTIM: ModelOptimState(model, optimizer)}
    start = checkpointer.load(state, cfg.restore_from.path)
    if start > sched.max_steps:  # the driver refuses this before starting; here for ranks it could not check
        raise ConfigError("step_scheduler.max_steps", sched.max_steps, f"the job resumed from step {start}, past it")
    metrics = MetricsLogger(cfg.output_dir, sched.max_steps, rank=env.rank, world_size=env.world_size,
                            start_step=start)
    profiler = NsysSteps(cfg.profile.nsys)
    tokens_per_step = data.train.samples_per_step * cfg.data.seq_len
    if rank0:
        logger.info("llm_finetune: %.2fM params, %s tokens (vocab %d), %s data (%d samples), world_size %d, "
                    "%d tokens/step, steps %d..%d", sum(p.numel() for p in raw_model.parameters()) / 1e6,
                    "byte" if tokenizer.hf is None else "tokenizer", tokenizer.vocab_size, cfg.data.source,
                    data.train.num_samples, env.world_size, tokens_per_step, start + 1, sched.max_steps)
        if start == sched.max_steps:
            logger.warning("already at step %d (step_scheduler.max_steps): nothing left to train", start)

    result: dict[str, tp.Any] = {"step": start, "loss": None, "stopped_early": False, "world_size": env.world_size,
                                 "tokens_per_s": None, "val_loss": None, "final_model": None}
    window_start, window_steps = time.perf_counter(), 0
    try:
        for step in range(start + 1, sched.max_steps + 1):
            lr = lr_at(step, cfg.optim, sched.max_steps)
            with profiler.step(step):
                loss = train_step(model, optimizer, data.train, step, lr, env.device)
            window_steps += 1
            last, stop = step == sched.max_steps, any_rank(should_stop(), env)
            validate = last or (sched.val_every_steps is not None and step % sched.val_every_steps == 0)

            if step % sched.log_interval == 0 or last or stop or validate:
                tokens_per_s = window_steps * tokens_per_step / (time.perf_counter() - window_start)
                extra = {"val_loss": evaluate(raw_model, data.val, env.device)} if validate else {}
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
    if rank0 and not result["stopped_early"]:
        # also when nothing was trained (resumed at max_steps): an export of the restored weights, the same model,
        # never an earlier final_model/ that may be another run's
        result["final_model"] = str(export_final(raw_model, tokenizer, cfg.output_dir))
    if rank0:
        logger.info("done: %s", result)
    return result
