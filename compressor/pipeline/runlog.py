"""The run's log: what the stages log under the `compressor` logger, on the console and in `<output_dir>/run.log`.

The preflight runs before the run's directory is claimed, and it can take minutes (it times the latency tables and a
reference's shape), so its records cannot go to a file yet. Between `hold` and `open_run_log` they are printed and
kept (`held` drops them when the block it wraps fails); `open_run_log` writes them at the top of the run.log it
opens, so the log says what the preflight measured.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger("compressor")
CONSOLE = logging.Formatter("%(asctime)s %(message)s", "%H:%M:%S")
FILE = logging.Formatter("%(asctime)s %(levelname)s %(message)s")
RUN_LOG = "run.log"


class _Held(logging.Handler):
    """Keeps the records logged until the run's log opens."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def _restart(main: bool) -> None:
    """The logger at INFO with a console handler on the main process (nothing on the others), every earlier handler
    closed: a file left from an earlier run (another `--seeds` repeat) stops receiving this one's lines."""
    log.setLevel(logging.INFO)
    log.propagate = False
    for handler in log.handlers:
        handler.close()
    log.handlers.clear()
    console = logging.StreamHandler()
    console.setFormatter(CONSOLE)
    log.addHandler(console if main else logging.NullHandler())


def hold(main: bool) -> None:
    """From now until `open_run_log`, print (on the main process) and keep what is logged. A second call while
    holding keeps what the first kept."""
    if any(isinstance(h, _Held) for h in log.handlers):
        return
    _restart(main)
    log.addHandler(_Held())


@contextmanager
def held(main: bool) -> Iterator[None]:
    """`hold` around a block that may fail (the preflight): on an exception what was held is dropped, having been
    printed already, so a later run in the same process (`compressor.prune` called again) does not write a failed
    run's lines at the top of its own log."""
    hold(main)
    try:
        yield
    except BaseException:
        _restart(main)
        raise


def open_run_log(out: Path, main: bool) -> None:
    """Log to the console and, on the main process, append to `out/run.log`, starting with the records held since
    `hold` (with their own times)."""
    held = [r for h in log.handlers if isinstance(h, _Held) for r in h.records]
    _restart(main)
    if not main:
        return
    out.mkdir(parents=True, exist_ok=True)
    handler = logging.FileHandler(out / RUN_LOG)
    handler.setFormatter(FILE)
    log.addHandler(handler)
    for record in held:
        handler.handle(record)
