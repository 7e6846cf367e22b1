"""automodel_hydra.quiet drops exactly the dependency lines it names, and nothing else: the real torchao and
megatron_fsdp of the AutoModel extra, imported in a fresh interpreter with logging set up as a run sets it up,
print their lines without the filters and none of them with; a warning of the user's, one of ours and another
torchao message still show. (The whole-run check is in tests/test_automodel_launch.py.)"""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

from tests.helpers import ROOT

#: found, not imported: collecting the suite (any tier) would otherwise import torch, torchao and megatron_fsdp
_MISSING = [name for name in ("torchao", "megatron_fsdp") if importlib.util.find_spec(name) is None]
pytestmark = [pytest.mark.automodel, pytest.mark.slow,
              pytest.mark.skipif(bool(_MISSING), reason=f"could not import {', '.join(_MISSING)}")]

#: a fragment of each line quiet.py filters, as the dependency prints it
NOISE = {
    "torchao's optional CUDA kernels": "torchao/_C_",
    "torch's _pytree deprecation for torchao's enums": "is an Enum subclass and is now natively supported",
    "megatron_fsdp's fallback": "Transformer Engine and Apex are not installed",
    "the pynvml shim's deprecation, at import torch": "The pynvml package is deprecated",
}
KEPT = ["a warning of the user's own", "a warning of ours", "torchao says something else"]

PROGRAM = """
import logging, sys, warnings
logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
if sys.argv[1] == "quiet":
    from automodel_hydra import quiet
    quiet.install()
import torch  # noqa: F401
import torchao  # noqa: F401
import megatron_fsdp.mixed_precision  # noqa: F401
warnings.warn("a warning of the user's own", UserWarning)
logging.getLogger("automodel_hydra.worker").warning("a warning of ours")
logging.getLogger("torchao").warning("torchao says something else")
"""


def run(mode: str) -> str:
    proc = subprocess.run([sys.executable, "-c", PROGRAM, mode], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout + proc.stderr


def test_the_filters_drop_the_named_dependency_lines_and_nothing_else() -> None:
    bare, quiet = run("bare"), run("quiet")
    for what, fragment in NOISE.items():
        assert fragment in bare, f"{what}: the dependency no longer prints it (update quiet.py):\n{bare[-3000:]}"
        assert fragment not in quiet, f"{what} still printed:\n{quiet[-3000:]}"
    for line in KEPT:
        assert line in bare and line in quiet, quiet[-3000:]
