"""Run a blocking call (an operator's ``execute``, a stream) in a thread and keep what it returned."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any


class BackgroundCall(threading.Thread):
    """``fn()`` in a daemon thread; afterwards ``result`` or ``error`` (whatever it raised)."""

    def __init__(self, fn: Callable[[], Any]):
        super().__init__(daemon=True)
        self.fn = fn
        self.result: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self.result = self.fn()
        except BaseException as exc:  # the caller inspects it
            self.error = exc
