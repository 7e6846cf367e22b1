"""Precise filters for messages NeMo AutoModel's dependencies print on every import that tell a user nothing.

Each filter names the logger or module that emits the message and the message's own text; nothing else is hidden
(no blanket filter). They cover a CPU machine or one without the optional GPU kernels, where these lines appear on
each run:

* ``torchao`` (logger): ``Failed to load .../torchao/_C_*.so`` — torchao's optional CUDA kernels (``_C_mxfp8``,
  ``_C_cutlass_90a``) cannot load without a GPU; torchao falls back by itself.
* ``torch.utils._pytree`` (logger): ``<enum ...> is an Enum subclass and is now natively supported by
  torch.compile ... register_constant() ... deprecated`` — torchao registering its enums the old way.
* ``nemo_automodel._transformers.v4_patches.layer_types`` (logger, INFO): ``extended ALLOWED_LAYER_TYPES with
  ...`` — AutoModel patching transformers at import, the same on every run.
* ``torch.cuda`` (a FutureWarning, raised by the ``pynvml`` package's import redirector when ``import torch``
  imports ``pynvml``): ``The pynvml package is deprecated. Please install nvidia-ml-py instead`` — ``pynvml`` 13
  is a shim over ``nvidia-ml-py`` that nvidia-resiliency-ext (the fault-tolerance extra) requires; nothing the
  user installed or can change, printed by every process that imports torch (each rank).
* ``megatron_fsdp.mixed_precision`` (a UserWarning): ``Transformer Engine and Apex are not installed. Falling back
  to local implementations`` — the documented fallback on a machine without them.
"""

from __future__ import annotations

import logging
import re
import warnings

#: logger name -> the message it logs, as a regular expression matched at the start of the message
LOG_FILTERS = {
    "torchao": re.compile(r"Failed to load \S*/torchao/_C\w*\.\S*\.so: "),
    "nemo_automodel._transformers.v4_patches.layer_types": re.compile(
        r"\[v4_patches\.layer_types\] extended ALLOWED_(ATTN_)?LAYER_TYPES with "),
    "torch.utils._pytree": re.compile(r"<enum '\w+'> is an Enum subclass and is now natively supported by "
                                      r"torch\.compile as an opaque value type\. Calling register_constant\(\)"),
}


class _Drop(logging.Filter):
    def __init__(self, pattern: re.Pattern[str]) -> None:
        super().__init__()
        self.pattern = pattern

    def filter(self, record: logging.LogRecord) -> bool:
        return record.levelno > logging.WARNING or not self.pattern.match(record.getMessage())


def install() -> None:
    """Add the filters (idempotent); call before importing ``torch`` or ``nemo_automodel``."""
    for name, pattern in LOG_FILTERS.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _Drop) for f in logger.filters):
            logger.addFilter(_Drop(pattern))
    warnings.filterwarnings("ignore", message=r"Transformer Engine and Apex are not installed\. Falling back",
                            category=UserWarning, module=r"megatron_fsdp\.mixed_precision")
    warnings.filterwarnings("ignore", message=r"The pynvml package is deprecated\. Please install nvidia-ml-py",
                            category=FutureWarning, module=r"torch\.cuda")
