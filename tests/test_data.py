"""Data: byte-level text, the model's own tokenizer, instruction JSONL with the loss on the answer only, and the
stateless, rank-sharded sampler.

:func:`make_tiny_model` builds a real local model + tokenizer (a BPE trained with ``tokenizers`` on CPython's docs, a
2-layer Llama sized to its vocabulary, both ``save_pretrained``): no Hub. The recipe tests use it too.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from automodel_hydra.config import DataConfig
from automodel_hydra.schema import ConfigError
from automodel_hydra.data import (
    BYTES,
    IGNORE,
    ShardedWindows,
    build_data,
    decode,
    encode,
    encode_example,
    load_text,
    load_tokenizer,
    read_jsonl,
    split,
)


def make_tiny_model(path: Path, *, tokenizer: bool = True, vocab_size: int = 400) -> Path:
    """A local causal LM at ``path``: LlamaConfig hidden 64, 2 layers, vocabulary of a byte-level BPE trained on
    CPython's docs with <s>, </s>, <pad> (``tokenizer=False``: the model alone, 256 + 3 rows)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([load_text(DataConfig())[:50_000]], trainer=trainer)
    hf = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(hf) if tokenizer else 259, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=256, bos_token_id=hf.bos_token_id,
        eos_token_id=hf.eos_token_id, pad_token_id=hf.pad_token_id))
    model.save_pretrained(path)
    if tokenizer:
        hf.save_pretrained(path)
    return path


def write_jsonl(path: Path, n: int = 100, prompt: str = "prompt", answer: str = "answer") -> Path:
    """``n`` instruction rows: "what is A plus B?" -> "A+B is C." (real structure for a model to learn)."""
    rows = [{prompt: f"Question: what is {i % 10} plus {i // 10 % 10}?\nAnswer:",
             answer: f" {i % 10}+{i // 10 % 10} is {i % 10 + i // 10 % 10}."} for i in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")


def test_pydoc_text_is_real_and_encodes_to_bytes():
    text = load_text(DataConfig())
    assert len(text) > 100_000 and "def " in text and "class" in text
    tokens = encode(text)
    assert tokens.dtype == torch.int64 and 0 <= int(tokens.min()) and int(tokens.max()) < 256
    assert decode(encode("héllo ✓")) == "héllo ✓"


def test_file_source(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("abc" * 100, encoding="utf-8")
    assert load_text(DataConfig(source="file", path=str(path), seq_len=8)) == "abc" * 100


def _sampler(rank=0, world_size=2, seed=0, accum=1, n=10_000, seq_len=16, batch=4):
    tokens = torch.arange(n) % 256
    return ShardedWindows(tokens, seq_len, batch, seed=seed, rank=rank, world_size=world_size,
                          grad_accumulation=accum)


def test_batch_shapes_and_shift():
    tokens = encode(load_text(DataConfig()))
    s = ShardedWindows(tokens, 32, 4, seed=1)
    x, y = s.batch(1)
    assert x.shape == y.shape == (4, 32)
    assert torch.equal(x[:, 1:], y[:, :-1])
    start = s.window_ids(1)[0] * 32
    assert torch.equal(x[0], tokens[start:start + 32]) and torch.equal(y[0], tokens[start + 1:start + 33])


def test_pure_function_of_seed_step_rank():
    a, b = _sampler(seed=3), _sampler(seed=3)
    for step in range(1, 6):  # a walks every step, b jumps straight to step 7: no iterator state
        a.batch(step)
    assert torch.equal(a.batch(7)[0], b.batch(7)[0])
    assert not torch.equal(a.batch(7)[0], a.batch(8)[0])
    assert not torch.equal(_sampler(seed=4).batch(7)[0], b.batch(7)[0])
    assert not torch.equal(_sampler(rank=1, seed=3).batch(7)[0], b.batch(7)[0])


@pytest.mark.parametrize("world_size,accum", [(2, 1), (4, 3)])
def test_ranks_and_micro_batches_are_disjoint(world_size, accum):
    for step in (1, 2, 50):
        seen: list[int] = []
        for rank in range(world_size):
            s = _sampler(rank=rank, world_size=world_size, accum=accum)
            for micro in range(accum):
                seen += s.window_ids(step, micro)
        assert len(seen) == len(set(seen)) == 4 * world_size * accum


def test_an_epoch_visits_every_window_once_then_reshuffles():
    s = _sampler(world_size=1, n=16 * 40 + 1)  # 40 windows, 4 per step: 10 steps per epoch
    epoch1 = [w for step in range(1, 11) for w in s.window_ids(step)]
    epoch2 = [w for step in range(11, 21) for w in s.window_ids(step)]
    assert sorted(epoch1) == sorted(epoch2) == list(range(40))
    assert epoch1 != epoch2


def test_bad_arguments():
    with pytest.raises(ValueError, match="one step needs"):
        ShardedWindows(torch.arange(20), 16, 4, seed=0)
    with pytest.raises(ValueError, match="step must be"):
        _sampler().batch(0)


def test_validation_tail_is_held_out():
    tokens = encode(load_text(DataConfig()))
    train, val = split(tokens)
    assert train.numel() + val.numel() == tokens.numel() and 0 < val.numel() < train.numel() // 10
    data = build_data(DataConfig(seq_len=64), 4, seed=0, rank=0, world_size=1)
    assert data.train.tokens.numel() == train.numel() and data.tokenizer is BYTES
    inputs, targets = data.val
    assert inputs.shape == targets.shape == (8, 64)
    assert torch.equal(inputs[1], val[64:128]) and torch.equal(targets[1], val[65:129])


# ----------------------------------------------------------------------------------------------- model tokenizer


@pytest.mark.slow  # imports transformers and builds a model (~5-10 s)
def test_text_is_tokenized_by_the_models_own_tokenizer(tiny_model):
    tok = load_tokenizer(str(tiny_model))
    assert tok.hf is not None and tok.vocab_size == len(tok.hf) and tok.pad_id == tok.hf.pad_token_id
    data = build_data(DataConfig(seq_len=32), 4, seed=0, rank=0, world_size=1, tokenizer=tok)
    text = load_text(DataConfig())
    assert data.train.tokens.numel() < 0.7 * len(text.encode())  # BPE tokens, not bytes
    assert int(data.train.tokens.max()) < tok.vocab_size
    x, y = data.train.batch(1)
    assert torch.equal(x[:, 1:], y[:, :-1])
    assert tok.hf.decode(x[0].tolist()) in text  # a window is a piece of the real text


@pytest.mark.slow  # imports transformers and builds a model (~5-10 s)
def test_a_model_without_a_tokenizer_falls_back_to_bytes(tmp_path, caplog):
    path = make_tiny_model(tmp_path / "m", tokenizer=False)
    assert load_tokenizer(str(path)) is BYTES
    assert "has no tokenizer" in caplog.text and str(path) in caplog.text
    assert load_tokenizer(None) is BYTES


# ----------------------------------------------------------------------------------------------- instruction data


@pytest.mark.slow  # imports transformers and builds a model (~5-10 s)
def test_jsonl_loss_is_on_the_answer_tokens_only(tiny_model, tmp_path):
    tok = load_tokenizer(str(tiny_model))
    path = write_jsonl(tmp_path / "d.jsonl", n=100)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    data = build_data(DataConfig(source="jsonl", path=str(path), seq_len=48), 4, seed=0, rank=0, world_size=1,
                      tokenizer=tok)
    assert data.train.num_samples == 98 and data.val[0].shape == (2, 48)  # the last 2% held out
    inputs, targets = data.train.batch(1)
    for row_id, x, y in zip(data.train.window_ids(1), inputs, targets):
        prompt = [tok.bos_id, *tok.hf(rows[row_id]["prompt"], add_special_tokens=False)["input_ids"]]
        answer = [*tok.hf(rows[row_id]["answer"], add_special_tokens=False)["input_ids"], tok.eos_id]
        n = len(prompt) + len(answer)
        assert x[:n - 1].tolist() == (prompt + answer)[:-1]  # inputs: the example, then padding
        assert (x[n - 1:] == tok.pad_id).all()
        assert (y[:len(prompt) - 1] == IGNORE).all() and (y[n - 1:] == IGNORE).all()  # prompt and padding
        assert y[len(prompt) - 1:n - 1].tolist() == answer  # every answer token and eos is a target
        assert tok.hf.decode(y[y != IGNORE].tolist(), skip_special_tokens=True) == rows[row_id]["answer"]


def test_jsonl_field_names_are_configurable_and_bad_rows_are_named(tmp_path):
    path = write_jsonl(tmp_path / "q.jsonl", n=20, prompt="question", answer="response")
    assert read_jsonl(path, "question", "response")[0] == ("Question: what is 0 plus 0?\nAnswer:", " 0+0 is 0.")
    cfg = DataConfig(source="jsonl", path=str(path), seq_len=64, prompt_field="question", answer_field="response")
    assert build_data(cfg, 2, seed=0, rank=0, world_size=1).train.num_samples == 20  # bytes; 2% of 20 rounds to 0
    with pytest.raises(ValueError, match=r"q.jsonl:1: needs a string field 'prompt'"):
        read_jsonl(path)
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "a", "answer": "b"}\n\n{"prompt": "a", "answer": "b"\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:3: not JSON"):
        read_jsonl(bad)
    with pytest.raises(ConfigError, match="data.path=None is invalid: a UTF-8 file when data.source=jsonl"):
        DataConfig(source="jsonl")


def test_examples_are_cut_to_seq_len_and_answerless_ones_skipped():
    assert encode_example(BYTES, "x" * 10, "abc", seq_len=8) is None  # the prompt fills the window
    inputs, targets = encode_example(BYTES, "12345", "abcdefgh", seq_len=8)
    assert decode(inputs) == "12345abc" and decode(targets[4:]) == "abcd"  # 9 tokens: 8 inputs, 8 targets
    assert (targets[:4] == IGNORE).all()
    inputs, targets = encode_example(BYTES, "", "ab", seq_len=4)  # nothing before the first token: no target
    assert targets.tolist() == [ord("b"), IGNORE, IGNORE, IGNORE]
