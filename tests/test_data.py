"""Byte-level data and the stateless, rank-sharded sampler."""

from __future__ import annotations

import pytest
import torch

from automodel_hydra.config import DataConfig
from automodel_hydra.data import ShardedWindows, build_data, decode, encode, load_text, split


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
    sampler, val_tokens = build_data(DataConfig(seq_len=64), 4, seed=0, rank=0, world_size=1)
    assert torch.equal(val_tokens, val)
    assert sampler.tokens.numel() == train.numel()
