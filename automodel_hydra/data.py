"""Real text with no download, byte-level tokens, and a stateless rank-sharded sampler.

``data.source: pydoc`` is CPython's documentation (``pydoc_data.topics``, ~465 kB of English and code that ships
with every Python); ``data.source: file`` reads a UTF-8 file. Tokens are the UTF-8 bytes (vocab 256), so there is no
tokenizer to download.

The batch for step N is a pure function of ``(seed, step, rank, world_size)`` (and the sizes): nothing to checkpoint,
and a resumed run sees exactly the batches it would have seen. Samples are non-overlapping windows of
``seq_len + 1`` bytes, visited in a seeded permutation per epoch; within a step every rank and micro-batch gets
different windows.
"""

from __future__ import annotations

from pathlib import Path

import torch

from automodel_hydra.config import DataConfig

#: Byte-level tokens.
VOCAB_SIZE = 256
#: Fraction of the text (its tail) held out for validation.
VAL_FRACTION = 0.02


def load_text(cfg: DataConfig) -> str:
    """The training text for ``cfg.source``.

    Raises FileNotFoundError / UnicodeDecodeError for a missing or non-UTF-8 ``cfg.path``."""
    if cfg.source == "file":
        return Path(str(cfg.path)).read_text(encoding="utf-8")
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes as int64 token ids in [0, 256); shape ``[len(text.encode())]``."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def decode(tokens: torch.Tensor) -> str:
    """Inverse of :func:`encode` (invalid UTF-8 sequences are replaced)."""
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


class ShardedWindows:
    """(input, target) windows of ``seq_len`` tokens, sharded over ranks, addressed by step.

    Parameters
    ----------
    tokens: 1-D token ids.
    seq_len: tokens per sample; a window is ``seq_len + 1`` tokens (target = input shifted by one).
    batch_size: samples per rank per micro-batch.
    seed, rank, world_size: the sampler is a pure function of these and the step.
    grad_accumulation: micro-batches per step.

    Raises ValueError when ``tokens`` hold fewer windows than one step needs over all ranks.
    """

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, *, seed: int, rank: int = 0,
                 world_size: int = 1, grad_accumulation: int = 1) -> None:
        self.seq_len, self.batch_size, self.seed = seq_len, batch_size, seed
        self.rank, self.world_size, self.grad_accumulation = rank, world_size, grad_accumulation
        n = (tokens.numel() - 1) // seq_len  # window i = tokens[i*L : i*L + L + 1]
        self.samples_per_step = batch_size * world_size * grad_accumulation
        if n < self.samples_per_step:
            raise ValueError(f"{tokens.numel()} tokens make {n} windows of seq_len={seq_len}; one step needs "
                             f"{self.samples_per_step} (batch_size * world_size * grad_accumulation)")
        self.tokens, self.num_windows = tokens, n
        self._perm: tuple[int, torch.Tensor] | None = None  # cache of the current epoch's permutation

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = (epoch, torch.randperm(self.num_windows, generator=g))
        return self._perm[1]

    def sample_ids(self, step: int, micro: int = 0) -> list[int]:
        """Global sample numbers of this rank's micro-batch ``micro`` at ``step`` (steps count from 1)."""
        if step < 1 or not 0 <= micro < self.grad_accumulation:
            raise ValueError(f"step must be >= 1 and micro in [0, {self.grad_accumulation}), got {step}, {micro}")
        first = (step - 1) * self.samples_per_step + (self.rank * self.grad_accumulation + micro) * self.batch_size
        return list(range(first, first + self.batch_size))

    def window_ids(self, step: int, micro: int = 0) -> list[int]:
        """Window indices (into the text) of :meth:`sample_ids`; epochs reshuffle with a seeded permutation."""
        n = self.num_windows
        return [int(self._permutation(i // n)[i % n]) for i in self.sample_ids(step, micro)]

    def batch(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)``, each int64 of shape ``[batch_size, seq_len]``; ``targets[:, t] = inputs[:, t+1]``
        in the text."""
        starts = torch.tensor(self.window_ids(step, micro)) * self.seq_len
        rows = self.tokens[starts[:, None] + torch.arange(self.seq_len + 1)]
        return rows[:, :-1], rows[:, 1:]


def split(tokens: torch.Tensor, val_fraction: float = VAL_FRACTION) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, val)``: the last ``val_fraction`` of the tokens is held out."""
    cut = int(tokens.numel() * (1 - val_fraction))
    return tokens[:cut], tokens[cut:]


def build_data(cfg: DataConfig, batch_size: int, *, seed: int, rank: int, world_size: int,
               grad_accumulation: int = 1) -> tuple[ShardedWindows, torch.Tensor]:
    """The training sampler for this rank and the held-out validation tokens."""
    train, val = split(encode(load_text(cfg)))
    sampler = ShardedWindows(train, cfg.seq_len, batch_size, seed=seed, rank=rank, world_size=world_size,
                             grad_accumulation=grad_accumulation)
    return sampler, val
