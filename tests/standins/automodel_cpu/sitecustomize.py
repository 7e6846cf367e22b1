"""STAND-IN for tests only: lets NeMo AutoModel's fine-tuning recipe run on a CPU-only torch build.

The product never patches AutoModel. This module exists because the test machines have no GPU, and AutoModel
0.7.0's plain fine-tuning path (FSDP2 data parallel, no PEFT / packing / compile / TP) makes three CUDA calls that
no config key avoids:

1. ``recipes/llm/train_ft.py`` calls ``torch.cuda.reset_peak_memory_stats()`` in ``setup()`` and after each log
   step; a CPU build of torch raises there.
2. ``_transformers/auto_model.py`` builds ``torch.device("cuda", torch.cuda.current_device())`` for the model's
   parallelisation (from_pretrained, from_config, and the encoder builder): "Torch not compiled with CUDA enabled".
3. The same module materialises the weights on ``torch.cuda.current_device()``.

Python imports ``sitecustomize`` at interpreter start from ``sys.path``; the tests put this directory first on
``PYTHONPATH`` of the rank processes (never of the test process itself). Nothing is imported at start-up; when
``nemo_automodel._transformers.auto_model`` is first imported (``train_ft`` imports it at module level, before
``setup()`` runs) and CUDA is unavailable, it

* makes ``torch.cuda.reset_peak_memory_stats`` a no-op (1), and
* replaces that one module's ``torch`` global with a
  view of torch whose ``cuda.current_device()`` is the CPU device and whose ``device("cuda", ...)`` is the CPU
  device (2, 3). Every other module keeps the real torch.

It applies nothing when ``AUTOMODEL_CPU_STANDIN=0``.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
import types
import typing as tp

_TARGET = "nemo_automodel._transformers.auto_model"


class _CpuDeviceMeta(type):
    """``device("cuda", n)`` -> the CPU device; ``isinstance(x, device)`` keeps torch's meaning."""

    def __call__(cls, *args: tp.Any, **kwargs: tp.Any) -> tp.Any:
        import torch

        first = args[0] if args else kwargs.get("type")
        if isinstance(first, str) and first.startswith("cuda"):
            return torch.device("cpu")
        return torch.device(*args, **kwargs)

    def __instancecheck__(cls, obj: object) -> bool:
        import torch

        return isinstance(obj, torch.device)


class _CpuDevice(metaclass=_CpuDeviceMeta):
    pass


class _CpuCuda(types.SimpleNamespace):
    def __getattr__(self, name: str) -> tp.Any:
        import torch

        return getattr(torch.cuda, name)

    @staticmethod
    def current_device() -> tp.Any:
        import torch

        return torch.device("cpu")


class _CpuTorch(types.ModuleType):
    """torch, seen by one module, with CUDA device requests sent to the CPU."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.device = _CpuDevice
        self.cuda = _CpuCuda()

    def __getattr__(self, name: str) -> tp.Any:
        import torch

        return getattr(torch, name)


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself; wraps the real loader of ``_TARGET`` so the module is patched right after it runs."""

    def find_spec(self, fullname: str, path: tp.Any, target: tp.Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)  # find the real spec with the remaining finders, once
        try:
            import importlib.util

            spec = importlib.util.find_spec(fullname)
        finally:
            sys.meta_path.insert(0, self)
        if spec is None or spec.loader is None:
            return spec
        real_exec = spec.loader.exec_module

        def exec_module(module: types.ModuleType) -> None:
            real_exec(module)
            import torch

            if torch.cuda.is_available():
                return
            torch.cuda.reset_peak_memory_stats = lambda device=None: None  # type: ignore[assignment]
            module.torch = _CpuTorch()  # type: ignore[attr-defined]

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _install() -> None:
    if os.environ.get("AUTOMODEL_CPU_STANDIN", "1") != "0":
        sys.meta_path.insert(0, _PatchAfterImport())


_install()
