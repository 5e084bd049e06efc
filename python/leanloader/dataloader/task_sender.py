"""Messages to workers, written by one thread of their own.

The main process must never block on a write to a worker: a worker blocked
writing its result (both pipes full: a 16,384-sample index list going one
way, a batch template with strings coming back) would wait for the main
process, which would wait for the worker. So every message to the workers
goes into a queue, and a daemon thread writes them in order; the main
process only ever blocks reading results, which drains the workers' side.
"""

from __future__ import annotations

import queue
import threading
from typing import Any

_STOP = object()


class TaskSender:
    """Writes (connection, message) pairs in the order they were queued."""

    def __init__(self, name: str) -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def send(self, conn: Any, message: Any) -> None:
        self._queue.put((conn, message))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is _STOP:
                return
            conn, message = item
            try:
                conn.send(message)
            except (OSError, ValueError):
                pass  # a dead or closed worker: the main process reports it

    def close(self, timeout: float) -> bool:
        """Stops after the messages queued so far; False when the thread is
        still blocked on a write after `timeout` (its worker must be killed
        before its connection is closed)."""
        self._queue.put(_STOP)
        self._thread.join(timeout)
        return not self._thread.is_alive()
