"""What a fence accepted and refused, counted per lock, for the application to read (the Rust
crate's ``FenceStats``, with the same names and limits).

Every Python fence helper that serves requests (the ASGI middleware, the adapters) calls
:meth:`FenceStats.record` after each fenced request with the lock of the verified sequencer
(``None`` when none verified) and the refusal, if any. Only rejections (``is_rejection``) count
as refused; a storage failure or an unknown outcome is not counted. The last refusal of each lock
is kept, so the presented and accepted token of a :class:`~palisade.fence.Stale` can be read
back. At most :data:`FENCE_STATS_LOCKS_MAX` locks are counted by name; further locks are counted
together under :data:`OTHER_LOCKS`, and refusals without a verified lock under
:data:`UNVERIFIED`.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Optional

from . import FenceError

#: How many locks a :class:`FenceStats` counts by name.
FENCE_STATS_LOCKS_MAX = 1024
#: Where the locks beyond :data:`FENCE_STATS_LOCKS_MAX` are counted together (no lock name has a space).
OTHER_LOCKS = "(other locks)"
#: Where refusals of sequencers that did not verify (missing, malformed, forged) are counted.
UNVERIFIED = "(unverified)"


@dataclasses.dataclass
class LockStats:
    accepted: int = 0
    refused: int = 0
    last_refusal: Optional[FenceError] = None


class FenceStats:
    """Accepted and refused requests per lock, bounded and thread-safe."""

    def __init__(self) -> None:
        self._locks: dict[str, LockStats] = {}
        self._mutex = threading.Lock()

    def record(self, lock: Optional[str], refusal: Optional[FenceError] = None) -> Optional[str]:
        """Counts one request: accepted when ``refusal`` is ``None``, refused when it is a
        rejection, not at all otherwise. Returns the name it was counted under (``lock``,
        :data:`OTHER_LOCKS` or :data:`UNVERIFIED`: a bounded metrics label), or ``None``."""
        if refusal is not None and not refusal.is_rejection:
            return None
        with self._mutex:
            if lock is None:
                name = UNVERIFIED
            elif lock in self._locks or self._named() < FENCE_STATS_LOCKS_MAX:
                name = lock
            else:
                name = OTHER_LOCKS
            counts = self._locks.setdefault(name, LockStats())
            if refusal is None:
                counts.accepted += 1
            else:
                counts.refused += 1
                counts.last_refusal = refusal
        return name

    def get(self, lock: str) -> Optional[LockStats]:
        with self._mutex:
            counts = self._locks.get(lock)
            return None if counts is None else dataclasses.replace(counts)

    def snapshot(self) -> dict[str, LockStats]:
        with self._mutex:
            return {lock: dataclasses.replace(counts) for lock, counts in self._locks.items()}

    def _named(self) -> int:
        return len(self._locks) - (OTHER_LOCKS in self._locks) - (UNVERIFIED in self._locks)
