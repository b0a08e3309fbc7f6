"""The keepalive engine: a session's keepalive rules as a state machine without I/O.

The blocking driver (:class:`palisade.Session`'s thread) and the asyncio driver
(:class:`palisade.aio.Session`'s task) feed it timed events (:meth:`Keepalive.on`) and perform
the actions it returns; they hold no rules of their own. The same engine is written in Rust
(``crates/client/src/keepalive.rs``) and Go, and all of them pass the shared vectors in
``spec/keepalive/v2`` (its README states every rule). Times are integer milliseconds on the
client's monotonic clock.

Where the three earlier copies disagreed, the engine takes the safe side:

- an event at or after the lease deadline makes the session lost before it is looked at (the
  blocking client used to take in an ack first): the application may already have acted on a
  lease that ran out, and a lost session never comes back;
- a ``Renew`` call may take only what is left of the lease, and the session is lost at the
  deadline while the call is in flight (the blocking client waited for its budget to run out);
- a refusal (``RESOURCE_EXHAUSTED``) renews by call whenever it comes (the Rust client paused
  after one on an open stream): a renewal is idempotent and bounded by the lease, a pause is not;
- the next ping is due an interval after the stream opened (its headers came), as in the Rust
  and asyncio clients (the blocking one counted from the call); a stream that has not opened an
  interval after it was asked for is closed as stuck and the lease renewed by call, as after a
  refusal: a refusal that comes late and a member that accepts the stream and never answers
  (HTTP/2's keepalive does not notice a wedged handler) both renew by call, and neither leaves
  the session waiting on a silent stream until its lease ends (vector 027);
- the backoff runs on the engine's clock (the Rust client's ran on the wall of the process even
  under a test clock).
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Optional, Union

#: Lost reasons, as :mod:`palisade.errors` spells them.
LEASE_UNPROVEN = "lease_unproven"
NOT_FOUND = "not_found"

BACKOFF_INITIAL_MS = 50
BACKOFF_MAX_MS = 1000
RETRIES_AT_ONCE_MAX = 3
INTERVAL_MIN_MS = 10

_MASK64 = (1 << 64) - 1


def proven_lease(remaining_ms: int) -> int:
    """How much of a reported lease remainder the client counts on: less 20 ms for a late timer
    and 0.2 % (rounded up) for the two machines' clock rates differing."""
    return max(0, remaining_ms - 20 - (2 * remaining_ms + 999) // 1000)


class SplitMix64:
    """The jitter's generator; the same numbers in every client, so the vectors can fix them."""

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK64

    def fraction(self) -> float:
        """A number in [0, 1)."""
        self._state = (self._state + 0x9E3779B97F4A7C15) & _MASK64
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        z ^= z >> 31
        return (z >> 11) * (2.0**-53)


class Backoff:
    """Exponential backoff within a budget, with a few attempts at once, on the engine's clock."""

    def __init__(self, now: int, budget_ms: int, rng: Optional[SplitMix64]) -> None:
        self._budget_ms = budget_ms
        self._rng = rng
        self.reset(now)

    def reset(self, now: int) -> None:
        self._step = BACKOFF_INITIAL_MS
        self._give_up_at = now + self._budget_ms
        self._at_once_left = RETRIES_AT_ONCE_MAX

    def at_once(self, now: int) -> bool:
        if self._at_once_left == 0 or now >= self._give_up_at:
            return False
        self._at_once_left -= 1
        return True

    def next_delay(self, now: int) -> Optional[int]:
        if now >= self._give_up_at:
            return None
        step = self._step
        if self._rng is not None:
            step = int(step * (0.5 + self._rng.fraction() / 2))
        delay = min(step, self._give_up_at - now)
        self._step = min(self._step * 2, BACKOFF_MAX_MS)
        self._at_once_left = RETRIES_AT_ONCE_MAX
        return delay


# --- events -------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Start:
    pass


@dataclasses.dataclass(frozen=True)
class Tick:
    pass


@dataclasses.dataclass(frozen=True)
class StreamOpened:
    pass


@dataclasses.dataclass(frozen=True)
class Ack:
    ttl_remaining_ms: int


@dataclasses.dataclass(frozen=True)
class StreamBroken:
    leader_named: bool = False


@dataclasses.dataclass(frozen=True)
class StreamRefused:
    pass


@dataclasses.dataclass(frozen=True)
class SessionGone:
    pass


@dataclasses.dataclass(frozen=True)
class RenewAnswered:
    ttl_remaining_ms: int


@dataclasses.dataclass(frozen=True)
class RenewFailed:
    pass


Event = Union[Start, Tick, StreamOpened, Ack, StreamBroken, StreamRefused, SessionGone, RenewAnswered, RenewFailed]

# --- actions ------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class OpenStream:
    pass


@dataclasses.dataclass(frozen=True)
class SendPing:
    pass


@dataclasses.dataclass(frozen=True)
class CloseStream:
    reason: str  # "stuck" or "lease_ended"


@dataclasses.dataclass(frozen=True)
class Renew:
    until: Optional[int]


@dataclasses.dataclass(frozen=True)
class CancelRenew:
    pass


@dataclasses.dataclass(frozen=True)
class Pause:
    until: int


@dataclasses.dataclass(frozen=True)
class Lost:
    reason: str  # LEASE_UNPROVEN or NOT_FOUND


@dataclasses.dataclass(frozen=True)
class Stop:
    pass


Action = Union[OpenStream, SendPing, CloseStream, Renew, CancelRenew, Pause, Lost, Stop]

# --- the engine ---------------------------------------------------------------------------

_IDLE = "idle"
_STREAMING = "streaming"
_RENEWING = "renewing"
_WAITING = "waiting"
_STOPPED = "stopped"


class Keepalive:
    """One session's keepalive. Feed :meth:`on` events; perform what it returns; feed a
    :class:`Tick` by :attr:`wake` at the latest."""

    def __init__(
        self,
        ttl_ms: int,
        interval_ms: Optional[int],
        opened_at_ms: int,
        jitter_seed: Optional[int],
    ) -> None:
        self.ttl_ms = ttl_ms
        interval = ttl_ms // 3 if interval_ms is None else interval_ms
        self.interval_ms = min(max(interval, INTERVAL_MIN_MS), ttl_ms)
        #: The proven lease deadline, or ``None`` once the session is lost.
        self.lease_deadline: Optional[int] = opened_at_ms + proven_lease(ttl_ms)
        self._rng = None if jitter_seed is None else SplitMix64(jitter_seed)
        self._backoff = Backoff(opened_at_ms, ttl_ms, self._rng)
        self._state = _IDLE
        self._sent_at: collections.deque[int] = collections.deque()
        self._next_ping: Optional[int] = None  # None until the stream opened
        self._open_by = 0  # while it has not opened: when the stream is given up
        self._renew_sent = 0
        self._until = 0

    @property
    def stopped(self) -> bool:
        return self._state == _STOPPED

    @property
    def wake(self) -> Optional[int]:
        """The latest time to feed a :class:`Tick`, or ``None``."""
        if self._state == _STREAMING:
            at: Optional[int] = self._open_by if self._next_ping is None else self._next_ping
        elif self._state == _WAITING:
            at = self._until
        elif self._state == _RENEWING:
            at = None
        else:
            return None
        if self.lease_deadline is None:
            return at
        return self.lease_deadline if at is None else min(at, self.lease_deadline)

    def on(self, event: Event, now: int) -> list[Action]:
        """Takes in ``event`` at ``now``; returns what to do, in order."""
        actions: list[Action] = []
        if self._state == _STOPPED:
            return actions
        if self.lease_deadline is not None and now >= self.lease_deadline:
            self._lose(now, actions)
            return actions
        state = self._state
        if isinstance(event, Start):
            if state == _IDLE:
                self._open(now, actions)
        elif isinstance(event, StreamOpened):
            if state == _STREAMING and self._next_ping is None:
                self._next_ping = now + self.interval_ms
        elif isinstance(event, Tick):
            if state == _STREAMING and self._next_ping is not None and now >= self._next_ping:
                if self._sent_at and now - self._sent_at[0] >= self.interval_ms:
                    actions.append(CloseStream("stuck"))
                    self._failed(now, False, actions)
                else:
                    self._sent_at.append(now)
                    self._next_ping = now + self.interval_ms
                    actions.append(SendPing())
            elif state == _STREAMING and self._next_ping is None and now >= self._open_by:
                actions.append(CloseStream("stuck"))  # never opened: renew as after a refusal
                self._renew(now, actions)
            elif state == _WAITING and now >= self._until:
                self._open(now, actions)
        elif isinstance(event, Ack):
            if state == _STREAMING and self._sent_at:
                self._proven(self._sent_at.popleft(), event.ttl_remaining_ms)
                self._backoff.reset(now)
        elif isinstance(event, StreamBroken):
            if state == _STREAMING:
                self._failed(now, event.leader_named, actions)
        elif isinstance(event, StreamRefused):
            if state == _STREAMING:
                self._renew(now, actions)
        elif isinstance(event, SessionGone):
            if state in (_STREAMING, _RENEWING):
                if self.lease_deadline is not None:
                    actions.append(Lost(NOT_FOUND))
                    self.lease_deadline = None
                self._state = _STOPPED
                actions.append(Stop())
        elif isinstance(event, RenewAnswered):
            if state == _RENEWING:
                self._proven(self._renew_sent, event.ttl_remaining_ms)
                self._backoff.reset(now)
                until = self._renew_sent + self.interval_ms
                if until > now:
                    self._state = _WAITING
                    self._until = until
                    actions.append(Pause(until))
                else:
                    self._open(now, actions)
        elif isinstance(event, RenewFailed):
            if state == _RENEWING:
                self._pause(now, actions)
        return actions

    def _open(self, now: int, actions: list[Action]) -> None:
        self._state = _STREAMING
        self._sent_at = collections.deque([now])
        self._next_ping = None
        self._open_by = now + self.interval_ms
        actions.append(OpenStream())

    def _renew(self, now: int, actions: list[Action]) -> None:
        self._state = _RENEWING
        self._renew_sent = now
        actions.append(Renew(self.lease_deadline))

    def _proven(self, sent: int, remaining_ms: int) -> None:
        proven = sent + proven_lease(min(remaining_ms, self.ttl_ms))
        if self.lease_deadline is not None and proven > self.lease_deadline:
            self.lease_deadline = proven

    def _failed(self, now: int, leader_named: bool, actions: list[Action]) -> None:
        if leader_named and self._backoff.at_once(now):
            self._open(now, actions)
        else:
            self._pause(now, actions)

    def _pause(self, now: int, actions: list[Action]) -> None:
        delay = self._backoff.next_delay(now)
        if delay is None:
            delay = BACKOFF_MAX_MS
        if self.lease_deadline is None:
            delay = min(delay, self.interval_ms)
        self._state = _WAITING
        self._until = now + delay
        actions.append(Pause(self._until))

    def _lose(self, now: int, actions: list[Action]) -> None:
        if self._state == _STREAMING:
            actions.append(CloseStream("lease_ended"))
        elif self._state == _RENEWING:
            actions.append(CancelRenew())
        actions.append(Lost(LEASE_UNPROVEN))
        self.lease_deadline = None
        self._backoff = Backoff(now, self.ttl_ms, self._rng)
        self._open(now, actions)
