"""How rollart's processes format Python logging: the driver (`rollart train`/`eval`) and every Ray worker
process of a job that rollart starts or joins (Ray's `worker_process_setup_hook`, see runtime.py).

In: a level name (`observability.log_level`). Out: the root logger writes `<time> <LEVEL> <logger>: <message>`
at that level; httpx's per-request INFO lines (reward HTTP calls, an agent's `openai` client) stay quiet.
Guaranteed: calling it again changes nothing (`logging.basicConfig` keeps the first handler).
"""

from __future__ import annotations

import logging
import os

LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
LOG_LEVEL_VAR = "ROLLART_LOG_LEVEL"  # how a worker learns the run's level (the job's runtime env sets it)


def configure_logging(level: str) -> None:
    logging.basicConfig(level=level, format=LOG_FORMAT)
    logging.getLogger("httpx").setLevel(logging.WARNING)


def configure_worker_logging() -> None:
    """Ray's `worker_process_setup_hook`: a worker's logs look like the driver's, at the run's level."""
    configure_logging(os.environ.get(LOG_LEVEL_VAR, "INFO"))
