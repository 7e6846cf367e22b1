"""automodel-hydra: one training recipe, launched anywhere (torchrun on this node, Slurm, SkyPilot), swept with
Hydra's ``-m``. docs/architecture.md maps the modules.

``__version__`` is the installed distribution's version (package metadata), read on first use, so importing the
package (every rank does) reads no metadata; ``"0+unknown"`` when the source runs without being installed.
:func:`version_line` is what ``--version`` prints, however the app is started.
"""

from __future__ import annotations

import typing as tp

#: The distribution this package is installed as (``pip show automodel-hydra``).
DISTRIBUTION = "automodel-hydra"


def __getattr__(name: str) -> tp.Any:
    if name == "__version__":
        from importlib.metadata import PackageNotFoundError, version

        try:
            return version(DISTRIBUTION)
        except PackageNotFoundError:
            return "0+unknown"
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def version_line() -> str:
    """``automodel-hydra 0.1.0``: the one line ``--version`` prints, for ``automodel-hydra --version``,
    ``automodel-hydra FILE.yaml --version`` and ``python train.py --version`` alike (not Hydra's version, which
    Hydra's own ``--version`` would print for ``train.py``)."""
    return f"{DISTRIBUTION} {__getattr__('__version__')}"
