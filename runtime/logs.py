"""The console every command writes its messages, progress and logs to (stderr), and the logging
set-up of ``dpmarket -v``: apart from :mod:`dpmarket.runtime.cli` so that the root command sets up
logging without loading grpc or the mTLS options (:mod:`dpmarket.deploy.cli`)."""

from __future__ import annotations

import logging

from rich.console import Console

__all__ = ["console", "ensure_info_logging", "setup_logging"]

logger = logging.getLogger("dpmarket")

#: Messages, progress bars and log records: stderr, so that stdout carries only results (--json).
console = Console(stderr=True)


def setup_logging(verbose: int) -> None:
    """Rich output on a terminal; one plain, unwrapped line per record otherwise (services
    writing to a log file or a container's log)."""
    level = logging.WARNING if verbose == 0 else logging.INFO if verbose == 1 else logging.DEBUG
    if console.is_terminal:
        from rich.logging import RichHandler

        logging.basicConfig(
            level=level,
            format="%(message)s",
            handlers=[RichHandler(console=console, show_path=False, rich_tracebacks=False)],
        )
    else:
        logging.basicConfig(
            level=level,
            format="%(asctime)s %(levelname)s %(name)s: %(message)s",
            datefmt="%Y-%m-%dT%H:%M:%S%z",
        )


def ensure_info_logging() -> None:
    """Log at INFO at least (services report their start-up and sessions), whatever ``-v``."""
    if logger.getEffectiveLevel() > logging.INFO:
        logging.getLogger().setLevel(logging.INFO)
