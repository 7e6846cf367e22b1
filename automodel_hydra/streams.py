"""Output to a terminal or a pipe is best effort: a reader that goes away never fails a job or loses a file.

``python train.py ... 2>&1 | head -3`` closes the pipe after three lines; a terminal that went away (an ssh session
dropped) answers every write with EIO. Whoever writes next to stdout or stderr fails with it: a progress bar
(transformers' "Writing model shards" while the final model is exported), a ``print``, a logging handler, the
interpreter's flush at exit. :func:`best_effort` makes both streams of the process forgiving: the first write that
fails because nobody reads any more (``EPIPE``, ``EIO``, ``ENXIO``) points that file descriptor at ``/dev/null``
(``os.dup2``), so that every later write, ours, a library's or a C extension's, and the final flush, succeeds
unread. Nothing else changes: the streams keep their file descriptors, encodings and ``isatty()`` (a live
progress display stays live while someone reads), and what the job writes to its files (the job log, metrics,
checkpoints, ``final_model/``, ``result.json``) never went through them.

Called first thing by the launching command (:mod:`automodel_hydra.train`), by every rank
(:mod:`automodel_hydra.worker`), by a call job (:mod:`automodel_hydra.call`) and by the ``automodel-hydra`` commands
(:mod:`automodel_hydra.cli`: ``status | head -1`` exits 0 and ``report | head`` still writes its files). Python
ignores SIGPIPE (writes fail with ``EPIPE`` instead of killing the process), so the write's error is where a
reader's absence shows.
"""

from __future__ import annotations

import errno
import os
import sys
import typing as tp

#: A write's errno when its reader is gone: a closed pipe or socket, a terminal that hung up or was revoked.
GONE = frozenset({errno.EPIPE, errno.EIO, errno.ENXIO, errno.ECONNRESET})


class BestEffort:
    """A text stream whose writes never fail for want of a reader (see the module); everything else is the
    wrapped stream's."""

    def __init__(self, stream: tp.TextIO) -> None:
        self.stream = stream
        self.gone = False

    def write(self, text: str) -> int:
        try:
            return self.stream.write(text)
        except OSError as e:
            if e.errno not in GONE:
                raise
            self._lost()
            return len(text)

    def writelines(self, lines: tp.Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        try:
            self.stream.flush()
        except OSError as e:
            if e.errno not in GONE:
                raise
            self._lost()

    def _lost(self) -> None:
        """Point the stream's file descriptor at /dev/null: later writes (and the bytes still buffered) go there."""
        self.gone = True
        try:
            fd = self.stream.fileno()
        except (OSError, ValueError):
            return
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, fd)
        finally:
            os.close(null)
        try:
            self.stream.flush()
        except (OSError, ValueError):
            pass

    def __getattr__(self, name: str) -> tp.Any:
        return getattr(self.stream, name)


def best_effort() -> None:
    """Make ``sys.stdout`` and ``sys.stderr`` of this process best effort (idempotent)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if stream is not None and not isinstance(stream, BestEffort):
            setattr(sys, name, BestEffort(stream))
