"""``Progress``: the batch counter of long model passes (encoding, scoring, a static student's initialisation)."""

from __future__ import annotations

import sys
import time


class Progress:
    """A batch counter: tqdm when installed, else a single self-overwriting stderr line; silent when disabled.

    ``leave``: tqdm keeps the finished bar; ``decimals``: of the seconds on the stderr line."""

    def __init__(self, total: int, description: str, enabled: bool, leave: bool = False, decimals: int = 1):
        self.total, self.description, self.decimals = total, description, decimals
        self.enabled = enabled and total > 0
        self.done = 0
        self.started = time.perf_counter()
        self.bar = None
        if self.enabled:
            try:
                from tqdm.auto import tqdm
            except ImportError:
                tqdm = None
            if tqdm is not None:
                self.bar = tqdm(total=total, desc=description, unit="batch", leave=leave)

    def update(self) -> None:
        self.done += 1
        if not self.enabled:
            return
        if self.bar is not None:
            self.bar.update(1)
            return
        elapsed = time.perf_counter() - self.started
        sys.stderr.write(f"\r{self.description}: {self.done}/{self.total} batches, {elapsed:.{self.decimals}f}s")
        if self.done == self.total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
