"""Local stand-ins for what an AutoModel fine-tuning YAML fetches from the Hugging Face Hub, made in the test's
tmp dir (no network): a tiny Llama checkpoint with its tokenizer, and a SQuAD-shaped dataset dir.

Use as fixtures (``pytest_plugins`` or import the fixtures into a test module)::

    def test_x(tiny_llama_dir: Path, squad_dir: Path) -> None: ...

Also: :data:`SQUAD_YAML` (the AutoModel-shaped fine-tuning YAML under ``tests/data/automodel/``),
:func:`cpu_overrides` (the command-line style overrides that make it small enough for two CPU ranks) and
:func:`rank_env` (the environment every rank process gets: offline Hugging Face, one thread, and the CPU stand-in
on ``PYTHONPATH``).
"""

from __future__ import annotations

import json
import os
import typing as tp
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: AutoModel's examples/llm_finetune/llama3_2/llama3_2_1b_squad.yaml, plus a checkpoint block (see the file).
SQUAD_YAML = ROOT / "tests" / "data" / "automodel" / "llama3_2_1b_squad.yaml"
#: The CPU stand-in for AutoModel's hard-coded CUDA calls (tests only; see its docstring).
CPU_STANDIN = ROOT / "tests" / "standins" / "automodel_cpu"

VOCAB_SIZE = 1000
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")


def make_tiny_llama(path: Path) -> Path:
    """Write a ~210k-parameter ``LlamaForCausalLM`` (hidden 64, intermediate 128, 2 layers, 4 heads, vocab 1000,
    fp32, seeded) and a byte-level BPE tokenizer trained on the Python docs' topic text into ``path``, both with
    ``save_pretrained``: a directory ``from_pretrained`` loads like a Hub snapshot. Returns ``path``."""
    from pydoc_data.topics import topics

    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    path.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=list(SPECIAL_TOKENS),
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    bpe.train_from_iterator(list(topics.values()), trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tok.save_pretrained(path)

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
                         bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.pad_token_id, tie_word_embeddings=False, dtype="float32")
    model = LlamaForCausalLM(config)
    assert all(p.dtype == torch.float32 for p in model.parameters())
    model.save_pretrained(path)
    return path


def make_squad_dir(path: Path, n_train: int = 96, n_val: int = 16) -> Path:
    """Write ``train.jsonl`` and ``validation.jsonl`` in SQuAD's shape (``id``, ``title``, ``context``,
    ``question``, ``answers: {text: [str], answer_start: [int]}``) into ``path``; ``datasets.load_dataset(path)``
    reads it as the splits ``train`` and ``validation``. The answer is a span of the context. Returns ``path``."""
    path.mkdir(parents=True, exist_ok=True)
    colours = ["red", "green", "blue", "amber", "violet", "white", "black", "grey"]
    animals = ["fox", "heron", "otter", "lynx", "crane", "badger", "stoat", "wren"]

    def row(i: int) -> dict[str, tp.Any]:
        colour, animal = colours[i % len(colours)], animals[(i // len(colours)) % len(animals)]
        context = f"In the story number {i}, the {animal} lives by the river and its coat is {colour}."
        return {"id": f"q{i}", "title": f"story {i}", "context": context,
                "question": f"What colour is the {animal} in story {i}?",
                "answers": {"text": [colour], "answer_start": [context.index(colour)]}}

    for name, rows in (("train", range(n_train)), ("validation", range(n_train, n_train + n_val))):
        (path / f"{name}.jsonl").write_text("".join(json.dumps(row(i)) + "\n" for i in rows))
    return path


def cpu_overrides(model_dir: Path, data_dir: Path, checkpoint_dir: Path, *, max_steps: int = 6,
                  ckpt_every_steps: int = 3, val_every_steps: int = 3) -> list[str]:
    """``KEY=VALUE`` overrides (AutoModel's ``--key=value`` without the dashes) that run :data:`SQUAD_YAML`
    unmodified on two gloo CPU ranks: local model and data, small batches, few steps, a given checkpoint dir."""
    return [
        "dist_env.backend=gloo",
        f"model.pretrained_model_name_or_path={model_dir}",
        f"dataset.dataset_name={data_dir}",
        f"validation_dataset.dataset_name={data_dir}",
        "validation_dataset.limit_dataset_samples=8",
        "step_scheduler.global_batch_size=8",
        "step_scheduler.local_batch_size=2",
        f"step_scheduler.max_steps={max_steps}",
        f"step_scheduler.ckpt_every_steps={ckpt_every_steps}",
        f"step_scheduler.val_every_steps={val_every_steps}",
        f"checkpoint.checkpoint_dir={checkpoint_dir}",
    ]


def rank_env(extra_pythonpath: tp.Sequence[str | Path] = ()) -> dict[str, str]:
    """The environment of a test's rank processes: this one, plus Hugging Face offline (nothing is fetched), one
    OpenMP thread per rank (two ranks share two cores), and the CPU stand-in first on ``PYTHONPATH``."""
    path = [str(CPU_STANDIN), *map(str, extra_pythonpath), str(ROOT), os.environ.get("PYTHONPATH", "")]
    return {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
            "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false",
            "PYTHONPATH": os.pathsep.join(p for p in path if p)}


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny Llama checkpoint + tokenizer dir (:func:`make_tiny_llama`), made once per session."""
    pytest.importorskip("tokenizers")
    return make_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))


@pytest.fixture(scope="session")
def squad_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQuAD-shaped local dataset dir (:func:`make_squad_dir`), made once per session."""
    return make_squad_dir(tmp_path_factory.mktemp("squad"))
