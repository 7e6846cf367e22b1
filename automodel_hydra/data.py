"""Training data: real text with no download, or local instruction data; tokens from the model's own tokenizer.

Sources (``data.source``):

* ``pydoc``: CPython's documentation (``pydoc_data.topics``, ~465 kB of English and code that ships with every
  Python);
* ``file``: a UTF-8 text file (``data.path``);
* ``jsonl``: a local JSON Lines file (``data.path``), one example per line: ``{"prompt": ..., "answer": ...}``
  (the field names are ``data.prompt_field`` and ``data.answer_field``).

Tokens: with ``model.name_or_path`` the model's own tokenizer (``transformers.AutoTokenizer``); without one, the
UTF-8 bytes (vocab 256), so the small built-in model needs nothing downloaded.

Text sources are cut into non-overlapping windows of ``seq_len + 1`` tokens (target = the next token). A ``jsonl``
example is ``[bos] prompt answer [eos]`` cut to ``seq_len + 1`` tokens and right-padded; its targets are -100
(``torch.nn.functional.cross_entropy``'s default ``ignore_index``) on the prompt and on the padding, so the loss is
the mean over answer tokens only. Right padding needs no attention mask: with causal attention no real token
attends to a later pad.

The batch for step N is a pure function of ``(seed, step, rank, world_size)`` (and the sizes): nothing to checkpoint,
and a resumed run sees exactly the batches it would have seen. Samples are visited in a seeded permutation per
epoch; within a step every rank and micro-batch gets different samples.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import typing as tp
from pathlib import Path

import torch

from automodel_hydra.config import DataConfig

logger = logging.getLogger(__name__)

#: Byte-level tokens.
VOCAB_SIZE = 256
#: Fraction of the data (its tail) held out for validation.
VAL_FRACTION = 0.02
#: Target value of positions that carry no loss (prompt, padding): cross_entropy's default ``ignore_index``.
IGNORE = -100
#: Held-out samples evaluated at each validation (the same ones every time, on every rank).
VAL_SAMPLES = 8


# ----------------------------------------------------------------------------------------------- tokenizers


@dataclasses.dataclass(frozen=True)
class Tokenizer:
    """Text -> token ids, plus the special ids examples need.

    ``hf`` is the ``transformers`` tokenizer when there is one (saved next to the final model); None for bytes."""

    vocab_size: int
    bos_id: int | None = None
    eos_id: int | None = None
    pad_id: int = 0
    hf: tp.Any = None

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text``, no special tokens added."""
        if self.hf is None:
            return list(text.encode("utf-8"))
        return list(self.hf(text, add_special_tokens=False, return_attention_mask=False, verbose=False)["input_ids"])


BYTES = Tokenizer(VOCAB_SIZE)


def load_tokenizer(name_or_path: str | None) -> Tokenizer:
    """The tokenizer of ``model.name_or_path`` (``AutoTokenizer.from_pretrained``); bytes when it is None.

    A model without a tokenizer falls back to bytes with a warning. The pad id is the tokenizer's pad token, else
    its eos token, else 0 (pads carry no loss; any id inside the vocabulary will do)."""
    if not name_or_path:
        return BYTES
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(name_or_path)
    except (OSError, ValueError) as e:
        logger.warning("model.name_or_path=%r has no tokenizer (%s); using UTF-8 bytes as tokens",
                       name_or_path, str(e).splitlines()[0] if str(e) else type(e).__name__)
        return BYTES
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    return Tokenizer(len(tok), tok.bos_token_id, tok.eos_token_id, pad if pad is not None else 0, tok)


def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes as int64 token ids in [0, 256); shape ``[len(text.encode())]``."""
    return torch.frombuffer(bytearray(text.encode("utf-8")), dtype=torch.uint8).long()


def decode(tokens: torch.Tensor) -> str:
    """Inverse of :func:`encode` (invalid UTF-8 sequences are replaced)."""
    return bytes(tokens.to(torch.uint8).tolist()).decode("utf-8", errors="replace")


# ----------------------------------------------------------------------------------------------- sources


def load_text(cfg: DataConfig) -> str:
    """The training text for ``cfg.source`` ``pydoc`` or ``file``.

    Raises FileNotFoundError / UnicodeDecodeError for a missing or non-UTF-8 ``cfg.path``."""
    if cfg.source == "file":
        return Path(str(cfg.path)).read_text(encoding="utf-8")
    from pydoc_data.topics import topics

    return "\n\n".join(topics[k] for k in sorted(topics))


def read_jsonl(path: str | Path, prompt_field: str = "prompt", answer_field: str = "answer") -> list[tuple[str, str]]:
    """``(prompt, answer)`` of every non-blank line of a JSON Lines file.

    Raises ValueError naming the file, the line number and what is wrong (not JSON, not an object, a field missing
    or not a string); ValueError too when the file holds no example."""
    rows = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as e:
                raise ValueError(f"{path}:{n}: not JSON ({e})") from None
            for name in (prompt_field, answer_field):
                if not isinstance(row, dict) or not isinstance(row.get(name), str):  # bad content of data.path
                    raise ValueError(f"{path}:{n}: needs a string field {name!r} (data.prompt_field / "
                                     f"data.answer_field), got {line.strip()[:120]}")
            rows.append((row[prompt_field], row[answer_field]))
    if not rows:
        raise ValueError(f"{path} holds no examples (data.path)")
    return rows


def encode_example(tok: Tokenizer, prompt: str, answer: str, seq_len: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """``(inputs, targets)``, each int64 ``[seq_len]``: ``[bos] prompt answer [eos]`` cut to ``seq_len + 1`` tokens,
    inputs right-padded with ``tok.pad_id``; ``targets[t]`` is token ``t + 1`` where that token belongs to the
    answer (or eos), else :data:`IGNORE`. None when no answer token fits in ``seq_len + 1`` tokens."""
    ids = ([tok.bos_id] if tok.bos_id is not None else []) + tok.encode(prompt)
    n_prompt = len(ids)
    ids = (ids + tok.encode(answer) + ([tok.eos_id] if tok.eos_id is not None else []))[: seq_len + 1]
    first = max(n_prompt, 1)  # the first token of a sequence is never a target: nothing precedes it
    if len(ids) <= first:
        return None
    inputs = torch.full((seq_len,), tok.pad_id, dtype=torch.long)
    targets = torch.full((seq_len,), IGNORE, dtype=torch.long)
    inputs[: len(ids) - 1] = torch.tensor(ids[:-1])
    targets[first - 1: len(ids) - 1] = torch.tensor(ids[first:])
    return inputs, targets


# ----------------------------------------------------------------------------------------------- samplers


class StepSampler:
    """Which samples rank ``rank`` reads at each step: a pure function of ``(seed, step, rank, world_size)``.

    Parameters
    ----------
    num_samples: samples in the data set (windows or examples).
    batch_size: samples per rank per micro-batch.
    seed, rank, world_size: the sampler is a pure function of these and the step.
    grad_accumulation: micro-batches per step.

    Raises ValueError when the data hold fewer samples than one step needs over all ranks.
    """

    def __init__(self, num_samples: int, batch_size: int, *, seed: int, rank: int = 0, world_size: int = 1,
                 grad_accumulation: int = 1, what: str = "samples") -> None:
        self.batch_size, self.seed = batch_size, seed
        self.rank, self.world_size, self.grad_accumulation = rank, world_size, grad_accumulation
        self.samples_per_step = batch_size * world_size * grad_accumulation
        if num_samples < self.samples_per_step:
            raise ValueError(f"the data make {num_samples} {what}; one step needs {self.samples_per_step} "
                             "(local_batch_size * world_size * grad_accumulation)")
        self.num_samples = num_samples
        self._perm: tuple[int, torch.Tensor] | None = None  # cache of the current epoch's permutation

    def _permutation(self, epoch: int) -> torch.Tensor:
        if self._perm is None or self._perm[0] != epoch:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perm = (epoch, torch.randperm(self.num_samples, generator=g))
        return self._perm[1]

    def sample_ids(self, step: int, micro: int = 0) -> list[int]:
        """Global sample numbers of this rank's micro-batch ``micro`` at ``step`` (steps count from 1)."""
        if step < 1 or not 0 <= micro < self.grad_accumulation:
            raise ValueError(f"step must be >= 1 and micro in [0, {self.grad_accumulation}), got {step}, {micro}")
        first = (step - 1) * self.samples_per_step + (self.rank * self.grad_accumulation + micro) * self.batch_size
        return list(range(first, first + self.batch_size))

    def window_ids(self, step: int, micro: int = 0) -> list[int]:
        """Indices into the data set of :meth:`sample_ids`; epochs reshuffle with a seeded permutation."""
        n = self.num_samples
        return [int(self._permutation(i // n)[i % n]) for i in self.sample_ids(step, micro)]

    def batch(self, step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
        """``(inputs, targets)``, each int64 of shape ``[batch_size, seq_len]``."""
        return self.rows(torch.tensor(self.window_ids(step, micro)))

    def rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class ShardedWindows(StepSampler):
    """(input, target) windows of ``seq_len`` tokens of one token stream; ``targets[:, t] = inputs[:, t+1]`` in the
    text. Window ``i`` is ``tokens[i*seq_len : i*seq_len + seq_len + 1]``."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, batch_size: int, **kw: tp.Any) -> None:
        self.tokens, self.seq_len = tokens, seq_len
        super().__init__((tokens.numel() - 1) // seq_len, batch_size, what=f"windows of seq_len={seq_len}", **kw)

    def rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.tokens[ids[:, None] * self.seq_len + torch.arange(self.seq_len + 1)]
        return rows[:, :-1], rows[:, 1:]


class ShardedExamples(StepSampler):
    """Encoded examples: ``inputs`` and ``targets`` of shape ``[num_examples, seq_len]`` (see
    :func:`encode_example`)."""

    def __init__(self, inputs: torch.Tensor, targets: torch.Tensor, batch_size: int, **kw: tp.Any) -> None:
        self.inputs, self.targets = inputs, targets
        super().__init__(inputs.shape[0], batch_size, what="examples", **kw)

    def rows(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.inputs[ids], self.targets[ids]


# ----------------------------------------------------------------------------------------------- building


def split(tokens: torch.Tensor, val_fraction: float = VAL_FRACTION) -> tuple[torch.Tensor, torch.Tensor]:
    """``(train, val)``: the last ``val_fraction`` of the tokens is held out."""
    cut = int(tokens.numel() * (1 - val_fraction))
    return tokens[:cut], tokens[cut:]


@dataclasses.dataclass
class Data:
    """The training sampler of this rank, held-out ``(inputs, targets)`` (None when too little data) and the
    tokenizer that made them."""

    train: StepSampler
    val: tuple[torch.Tensor, torch.Tensor] | None
    tokenizer: Tokenizer


def build_data(cfg: DataConfig, batch_size: int, *, seed: int, rank: int, world_size: int,
               grad_accumulation: int = 1, tokenizer: Tokenizer = BYTES) -> Data:
    """The training sampler for this rank and up to :data:`VAL_SAMPLES` held-out samples.

    Raises ValueError for a ``jsonl`` file with a bad line, or whose examples all have no answer token within
    ``seq_len + 1`` tokens, and when the data make fewer samples than one step needs."""
    kw = {"seed": seed, "rank": rank, "world_size": world_size, "grad_accumulation": grad_accumulation}
    if cfg.source == "jsonl":
        rows = read_jsonl(str(cfg.path), cfg.prompt_field, cfg.answer_field)
        encoded = [e for p, a in rows if (e := encode_example(tokenizer, p, a, cfg.seq_len)) is not None]
        if len(encoded) < len(rows) and rank == 0:
            logger.warning("%d of %d examples in %s have no answer token within data.seq_len=%d tokens; skipped",
                           len(rows) - len(encoded), len(rows), cfg.path, cfg.seq_len)
        if not encoded:
            raise ValueError(f"data.seq_len={cfg.seq_len} leaves no answer token in any example of {cfg.path}")
        inputs, targets = (torch.stack(t) for t in zip(*encoded))
        n_val = int(len(encoded) * VAL_FRACTION)
        cut = len(encoded) - n_val
        val = (inputs[cut:][:VAL_SAMPLES], targets[cut:][:VAL_SAMPLES]) if n_val else None
        return Data(ShardedExamples(inputs[:cut], targets[:cut], batch_size, **kw), val, tokenizer)
    text = load_text(cfg)
    tokens = encode(text) if tokenizer.hf is None else torch.tensor(tokenizer.encode(text), dtype=torch.long)
    train, held_out = split(tokens)
    n = min(VAL_SAMPLES, (held_out.numel() - 1) // cfg.seq_len)
    val = ShardedWindows(held_out, cfg.seq_len, n, seed=0).rows(torch.arange(n)) if n >= 1 else None
    return Data(ShardedWindows(train, cfg.seq_len, batch_size, **kw), val, tokenizer)
