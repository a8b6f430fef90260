"""Stopping a run cleanly: SIGINT/SIGTERM set a flag that the loop checks after every step."""

from __future__ import annotations

import signal
import threading
from typing import Any, Optional

__all__ = ["StopFlag"]


class StopFlag:
    """Set by SIGINT/SIGTERM (or by code); the loop finishes its step, saves, and returns.

    A second signal while stopping raises KeyboardInterrupt, for when saving itself hangs.
    """

    def __init__(self) -> None:
        self.signal_name: Optional[str] = None
        self._previous: dict[int, Any] = {}

    def set(self, name: str = "stop") -> None:
        self.signal_name = name

    def __bool__(self) -> bool:
        return self.signal_name is not None

    def _handle(self, signum: int, frame: Any) -> None:
        if self:
            raise KeyboardInterrupt
        self.set(signal.Signals(signum).name)
        print(f"\n{self.signal_name} received: finishing this step and saving a checkpoint "
              f"(send it again to abort without saving)", flush=True)

    def install(self) -> None:
        """Handle SIGINT and SIGTERM (only possible in the main thread; elsewhere a no-op)."""
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()
