"""How rollart's processes format Python logging: the driver (`rollart train`/`eval`) and every Ray worker
process of a job that rollart starts or joins (Ray's `worker_process_setup_hook`, see runtime.py).

In: a level name (`observability.log_level`). Out: records print as `<time> <LEVEL> <logger>: <message>`;
rollart's own loggers (`rollart.*`) at that level, every other library's at WARNING and above — HTTP
clients log a line per request at INFO (reward calls, an agent's `openai` client through httpx/httpx2),
which would bury the run's own lines.
A second call only sets the levels again: `logging.basicConfig` keeps the first handler.
A log line may quote what a dataset row, a run directory or a policy holds (a row's text in a drop reason, an
env's exception): the handler's formatter escapes control characters (`rollart.base.untrusted.printable`), so a
terminal escape in one is shown, never obeyed.
"""

from __future__ import annotations

import logging
import os

from rollart.base.untrusted import printable

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVEL_VAR = "ROLLART_LOG_LEVEL"  # how a worker learns the run's level (the job's runtime env sets it)


class EscapingFormatter(logging.Formatter):
    """`LOG_FORMAT`, with control characters shown as escapes (newlines and tabs kept: tracebacks read)."""

    def format(self, record: logging.LogRecord) -> str:
        return printable(super().format(record))


def configure_logging(level: str) -> None:
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter(LOG_FORMAT))
    logging.basicConfig(level=max(logging.WARNING, logging.getLevelName(level)), handlers=[handler])
    logging.getLogger("rollart").setLevel(level)


def configure_worker_logging() -> None:
    """Ray's `worker_process_setup_hook`: a worker's logs look like the driver's, at the run's level."""
    configure_logging(os.environ.get(LOG_LEVEL_VAR, "INFO"))
