"""The llm_finetune recipe in-process (world_size 1) and on 2 gloo ranks: loss falls, metrics.jsonl holds every
logged step once across resumes, a stop request checkpoints the current step on every rank, a local model is
fine-tuned with its own tokenizer on instruction data (loss on the answer only), and a completed run's final_model/
loads with ``from_pretrained`` and gives the trained model's logits.

Tests that train are marked slow: each imports transformers and runs real steps (seconds on 2 CPU cores)."""

from __future__ import annotations

import json
import math
import os
import socket
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from automodel_hydra.checkpoint import MODEL_AND_OPTIM, CheckpointManager, ModelOptimState, find_latest, is_complete
from automodel_hydra.config import (
    CheckpointConfig,
    DataConfig,
    ModelConfig,
    NsysConfig,
    OptimConfig,
    RestoreFromConfig,
    StepSchedulerConfig,
    TrainConfig,
)
from automodel_hydra.data import build_data, load_tokenizer
from automodel_hydra.recipes.llm_finetune import FINAL_MODEL, NsysSteps, build_model, lr_at, train, train_step
from tests.test_data import make_tiny_model, write_jsonl

ENV1 = SimpleNamespace(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))


def _cfg(tmp_path, max_steps, ckpt=5, log=1, **kw) -> TrainConfig:
    sched = StepSchedulerConfig(max_steps=max_steps, checkpoint_interval=ckpt, log_interval=log,
                                global_batch_size=kw.pop("global_batch_size", None),
                                val_every_steps=kw.pop("val_every_steps", None))
    return TrainConfig(output_dir=str(tmp_path), step_scheduler=sched, **kw)


def _trained(cfg: TrainConfig, vocab_size: int) -> torch.nn.Module:
    """The model as trained: built like the recipe builds it, then restored from the run's final DCP checkpoint."""
    model = build_model(cfg, torch.device("cpu"), vocab_size)
    state = {MODEL_AND_OPTIM: ModelOptimState(model, torch.optim.AdamW(model.parameters()))}
    assert CheckpointManager(cfg.checkpoint_dir).load(state, "latest") == cfg.step_scheduler.max_steps
    return model.eval()


def _same_logits(exported: Path, trained: torch.nn.Module, vocab_size: int) -> None:
    from transformers import AutoModelForCausalLM

    loaded = AutoModelForCausalLM.from_pretrained(exported).eval()
    ids = torch.randint(0, vocab_size, (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = loaded(input_ids=ids).logits, trained(input_ids=ids).logits
    assert a.shape == (2, 24, vocab_size)
    torch.testing.assert_close(a, b, rtol=0, atol=1e-6)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def _metrics(tmp_path) -> list[dict]:
    return [json.loads(line) for line in (Path(tmp_path) / "metrics.jsonl").read_text().splitlines()]


def _stop_after(n: int):
    calls = iter(range(1, 10**6))
    return lambda: next(calls) >= n


def test_lr_schedule():
    optim = OptimConfig(lr=1e-3, warmup_steps=4, min_lr_ratio=0.1)
    assert lr_at(1, optim, 20) == pytest.approx(2.5e-4)
    assert lr_at(4, optim, 20) == pytest.approx(1e-3)
    assert lr_at(12, optim, 20) == pytest.approx(1e-4 + 0.9e-3 * 0.5)
    assert lr_at(20, optim, 20) == pytest.approx(1e-4)
    assert lr_at(1, OptimConfig(lr=1e-3, warmup_steps=0), 10) < 1e-3


def test_nsys_capture_range():
    def run(cfg, steps, stop_at=None):
        p = NsysSteps(cfg, cuda=False)
        for s in steps:
            with p.step(s):
                pass
            if s == stop_at:
                p.stop(s)
                break
        return p.calls

    cfg = NsysConfig(enabled=True, start_step=3, stop_step=5)
    assert run(cfg, range(1, 10)) == [("start", 3), ("stop", 5)]
    assert run(cfg, range(5, 10)) == [("start", 5), ("stop", 5)]  # resumed inside the range
    assert run(cfg, range(6, 10)) == []  # resumed after it
    assert run(cfg, range(1, 10), stop_at=4) == [("start", 3), ("stop", 4)]  # stopped early inside it
    assert run(NsysConfig(enabled=False), range(1, 10)) == []


@pytest.mark.slow
def test_trains_and_loss_falls(tmp_path):
    result = train(_cfg(tmp_path, max_steps=25, ckpt=10, log=5), ENV1)
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [5, 10, 15, 20, 25]
    assert {"loss", "lr", "world_size", "tokens_per_s", "time"} <= metrics[0].keys()
    assert metrics[-1]["loss"] < metrics[0]["loss"] < math.log(256)
    assert result["val_loss"] < 4.0 and result["step"] == 25 and not result["stopped_early"]
    assert result["tokens_per_s"] > 0 and result["world_size"] == 1
    assert find_latest(tmp_path / "checkpoints") == tmp_path / "checkpoints" / "step-25"
    assert {p.name for p in (tmp_path / "checkpoints").glob("step-*")} == {"step-10", "step-20", "step-25"}


@pytest.mark.slow
def test_resume_redoes_the_steps_after_the_checkpoint_exactly(tmp_path):
    first = train(_cfg(tmp_path, max_steps=10, ckpt=4), ENV1)
    before = {m["step"]: m["loss"] for m in _metrics(tmp_path)}
    # the job died while writing step-10: DCP's files and the marker never made it
    for name in (".metadata", ".complete"):
        (tmp_path / "checkpoints" / "step-10" / name).unlink()
    second = train(_cfg(tmp_path, max_steps=10, ckpt=4), ENV1)  # resumes from step-8 by itself
    after = _metrics(tmp_path)
    assert [m["step"] for m in after] == list(range(1, 11))
    for m in after[8:]:  # the same batches from the same state give the same losses
        assert m["loss"] == pytest.approx(before[m["step"]], abs=1e-5)
    assert second["loss"] == pytest.approx(first["loss"], abs=1e-5)
    assert is_complete(tmp_path / "checkpoints" / "step-10")


@pytest.mark.slow
def test_should_stop_checkpoints_the_current_step(tmp_path):
    result = train(_cfg(tmp_path, max_steps=20, ckpt=5, log=5), ENV1, should_stop=_stop_after(3))
    assert result["stopped_early"] and result["step"] == 3
    assert find_latest(tmp_path / "checkpoints") == tmp_path / "checkpoints" / "step-3"
    assert [m["step"] for m in _metrics(tmp_path)] == [3]
    assert result["final_model"] is None and not (tmp_path / FINAL_MODEL).exists()  # not a completed run
    result = train(_cfg(tmp_path, max_steps=12, ckpt=5, log=5), ENV1)  # the requeued job continues
    assert not result["stopped_early"] and result["step"] == 12
    assert [m["step"] for m in _metrics(tmp_path)] == [3, 5, 10, 12]
    assert result["final_model"] == str(tmp_path / FINAL_MODEL)


@pytest.mark.slow
def test_the_latest_3_checkpoints_are_kept_by_default(tmp_path):
    train(_cfg(tmp_path, max_steps=6, ckpt=1, log=3), ENV1)
    assert sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*")) == ["step-4", "step-5", "step-6"]


@pytest.mark.slow
def test_a_completed_run_exports_a_model_that_from_pretrained_loads(tmp_path):
    cfg = _cfg(tmp_path, max_steps=6, ckpt=3, log=3)
    result = train(cfg, ENV1)
    final = tmp_path / FINAL_MODEL
    assert result["final_model"] == str(final)
    assert {"config.json", "model.safetensors"} <= {p.name for p in final.iterdir()}
    assert not list(tmp_path.glob(".final_model*"))  # written beside, then renamed into place
    _same_logits(final, _trained(cfg, 256), 256)  # byte-level model: no tokenizer to save


@pytest.mark.slow
def test_masked_loss_on_one_batch_equals_a_hand_computation(tiny_model, tmp_path):
    data_cfg = DataConfig(source="jsonl", path=str(write_jsonl(tmp_path / "d.jsonl")), seq_len=40)
    cfg = _cfg(tmp_path, max_steps=4, model=ModelConfig(name_or_path=str(tiny_model)), data=data_cfg)
    tok = load_tokenizer(str(tiny_model))
    data = build_data(cfg.data, 4, seed=cfg.seed, rank=0, world_size=1, tokenizer=tok)
    model = build_model(cfg, torch.device("cpu"), tok.vocab_size)
    rows = [json.loads(line) for line in Path(data_cfg.path).read_text().splitlines()]
    # by hand, from the raw rows: each example alone (no padding), -log p(token) of every answer token and eos
    terms = []
    with torch.no_grad():
        for row_id in data.train.window_ids(1):
            prompt = [tok.bos_id, *tok.hf(rows[row_id]["prompt"], add_special_tokens=False)["input_ids"]]
            seq = prompt + tok.hf(rows[row_id]["answer"], add_special_tokens=False)["input_ids"] + [tok.eos_id]
            logp = torch.log_softmax(model(input_ids=torch.tensor([seq[:-1]])).logits[0].double(), -1)
            terms += [-logp[p - 1, seq[p]] for p in range(len(prompt), len(seq))]
    expected = torch.stack(terms).mean().item()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = train_step(model, optimizer, data.train, 1, 1e-3, torch.device("cpu")).item()
    assert loss == pytest.approx(expected, abs=1e-5)
    assert len(terms) > 4 * 3  # several answer tokens per example: a real average, not a single term


@pytest.mark.slow
def test_fine_tunes_a_local_model_with_its_tokenizer_on_instruction_data(tiny_model, tmp_path):
    from transformers import AutoTokenizer

    data_cfg = DataConfig(source="jsonl", path=str(write_jsonl(tmp_path / "d.jsonl", n=400)), seq_len=40)
    cfg = _cfg(tmp_path, max_steps=30, ckpt=30, log=5, val_every_steps=10, model=ModelConfig(name_or_path=str(tiny_model)),
               data=data_cfg, optim=OptimConfig(lr=1e-2, warmup_steps=2))
    result = train(cfg, ENV1)
    metrics = _metrics(tmp_path)
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 1.0, [m["loss"] for m in metrics]
    assert [m["step"] for m in metrics if m.get("val_loss") is not None] == [10, 20, 30]
    assert result["val_loss"] == metrics[-1]["val_loss"] < 3.0
    final = Path(result["final_model"])
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= {
        p.name for p in final.iterdir()}
    assert AutoTokenizer.from_pretrained(final)("what is 1 plus 2?")["input_ids"] == \
        AutoTokenizer.from_pretrained(tiny_model)("what is 1 plus 2?")["input_ids"]
    vocab = load_tokenizer(str(tiny_model)).vocab_size
    _same_logits(final, _trained(cfg, vocab), vocab)


@pytest.mark.slow
def test_async_checkpoints_with_keep_latest_k_and_accumulation(tmp_path):
    cfg = _cfg(tmp_path, max_steps=8, ckpt=2, log=4, global_batch_size=8,
               checkpoint=CheckpointConfig(async_save=True, keep_latest_k=2))
    result = train(cfg, ENV1, should_stop=_stop_after(7))
    assert result["stopped_early"] and result["step"] == 7
    ckpts = tmp_path / "checkpoints"
    assert sorted(p.name for p in ckpts.glob("step-*")) == ["step-6", "step-7"]
    assert find_latest(ckpts) == ckpts / "step-7"


@pytest.mark.slow
def test_restore_from_null_and_disabled_checkpoints(tmp_path):
    train(_cfg(tmp_path, max_steps=3), ENV1)
    cfg = _cfg(tmp_path, max_steps=2, restore_from=RestoreFromConfig(path=None),
               checkpoint=CheckpointConfig(enabled=False, dir=str(tmp_path / "off")))
    result = train(cfg, ENV1)
    assert result["step"] == 2 and not (tmp_path / "off").exists()
    assert [m["step"] for m in _metrics(tmp_path)] == [1, 2]  # a fresh start rewrites the history


def _two_rank_worker(rank: int, port: int, root: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        env = SimpleNamespace(rank=rank, local_rank=rank, world_size=2, device=torch.device("cpu"))
        # only rank 1 is signalled (after its 7th step): both ranks must stop and checkpoint at step 7
        stop = _stop_after(7) if rank == 1 else (lambda: False)
        first = train(_cfg(root, max_steps=30, ckpt=10, log=5), env, should_stop=stop)
        second = train(_cfg(root, max_steps=30, ckpt=10, log=5), env)
        Path(root, f"result{rank}.json").write_text(json.dumps([first, second]))
    finally:
        dist.destroy_process_group()


@pytest.mark.slow
def test_two_ranks_stop_together_resume_and_learn(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_two_rank_worker, args=(port, str(tmp_path)), nprocs=2, join=True)
    (a1, a2), (b1, b2) = (json.loads((tmp_path / f"result{r}.json").read_text()) for r in (0, 1))
    assert a1["stopped_early"] and b1["stopped_early"] and a1["step"] == b1["step"] == 7
    assert a2["step"] == b2["step"] == 30 and a2["loss"] == b2["loss"]  # the loss is averaged over ranks
    metrics = _metrics(tmp_path)
    assert [m["step"] for m in metrics] == [5, 7, 10, 15, 20, 25, 30]
    assert all(m["world_size"] == 2 for m in metrics)
    assert metrics[-1]["loss"] < metrics[0]["loss"] - 0.5
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["latest", "step-10", "step-20", "step-30", "step-7"]
