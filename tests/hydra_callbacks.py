"""A Hydra callback for tests: records what ``on_job_end`` sees, one JSON line per job, in ``path``."""

from __future__ import annotations

import json
import os
import typing as tp

from hydra.core.hydra_config import HydraConfig
from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig


class RecordJobEnd(Callback):
    """Appends ``{num, status, value, error, cwd, output_dir}`` to ``path`` at each job's end: the job's number,
    Hydra's status, its return value (or its error's text), the working dir, and HydraConfig's output dir then."""

    def __init__(self, path: str) -> None:
        self.path = path

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: tp.Any) -> None:
        value, error = None, None
        try:
            value = job_return.return_value  # re-raises the job's error when it failed
        except Exception as e:
            error = f"{type(e).__name__}: {e}"
        row = {
            "num": int(config.hydra.job.num),
            "status": job_return.status.name,
            "failed": job_return.status == JobStatus.FAILED,
            "value": value,
            "error": error,
            "cwd": os.getcwd(),
            "output_dir": HydraConfig.get().runtime.output_dir,
        }
        with open(self.path, "a") as f:
            f.write(json.dumps(row, default=str) + "\n")
