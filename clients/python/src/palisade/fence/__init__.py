"""The resource side: verify a sequencer, then claim its scope inside the caller's transaction.

These helpers share the storage layout of the Rust crate ``palisade-fence`` exactly (the
``palisade_fence`` table of PostgreSQL and SQLite, its columns and its one conditional upsert;
the Redis hash ``palisade:fence:<scope>`` with fields ``lock``, ``token``, ``session`` and the
same Lua script), so a Rust writer and a Python writer fence the same rows: whichever presents
the newer token first shuts the other out.

**Claim first, then read, then write**, all in one transaction::

    sequencer = verifier.verify(os.environ["PALISADE_SEQUENCER"])   # Forged / Malformed / Missing
    with conn.transaction():
        postgres.claim(conn, "reports/nightly", sequencer)       # Stale if a newer grant claimed
        ... read, compute, write ...

A claim advances the scope's accepted token (the highest ever presented there) and refuses an
older one, in the same commit as the caller's writes. It accepts the accepted token again only from
the session that presented it first: another session presenting it means the lock service issued
it twice, and is refused (:class:`TokenReissued`). A superseded holder, however long it was
paused, is refused at the resource.

**Shared grants and permits.** A read-write lock's readers share one token per phase, so a scope
stores holder session 0 for a maximum accepted from a shared grant ("a shared phase"); a
semaphore's permit binds its scope to its slot (:attr:`~palisade.sequencer.VerifiedSequencer.binding`:
the lock, U+001F, the slot), so each slot keeps a maximum of its own. :func:`check` states the rule,
with the caller's *intent* (``"read"`` for a claim before a read, ``"write"`` for a write or a
claim that authorizes the writes after it):

1. another binding than the scope's (or the expected one) is :class:`WrongLock`;
2. a shared grant that writes is :class:`SharedWrite`;
3. a token below the maximum is :class:`Stale`;
4. the maximum again is accepted, unchanged, from a shared grant while the stored holder is 0,
   and from an exclusive grant or a permit while the stored holder is its session; anything else
   is :class:`TokenReissued`;
5. a larger token is accepted and stored, with holder 0 for a shared grant.

The SQL helpers' ``claim`` is for a transaction that writes (a shared grant is refused);
a reader's transaction claims with ``claim_read``. Redis's and S3's ``read`` are reads.

Every :class:`FenceError` is exactly one of: *final* (``Stale``, ``TokenReissued``, ``SharedWrite``, ``WrongLock``, ``Missing``,
``Malformed``, ``Forged``, ``InvalidScope``, ``InvalidRequest``, ``Corrupt``: retrying cannot
succeed), *retryable* (``Storage``: nothing was applied) or *outcome unknown*
(``OutcomeUnknown``: read back under a claim before deciding). ``kind`` is the same
machine-readable name the Rust ``FenceError`` has.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Literal, Optional, Union

from ..sequencer import (
    Forged as _SequencerForged,
)
from ..sequencer import (
    KeySet,
    PublicKey,
    SequencerError,
    VerifiedSequencer,
    display_binding,
)
from ..sequencer import (
    verify as _verify,
)

#: Longest scope name, in bytes of UTF-8.
SCOPE_BYTES_MAX = 512
#: The largest token the service grants.
TOKEN_MAX = (1 << 63) - 1
#: How many verified sequencer texts a :class:`Verifier` remembers before it starts over.
VERIFIED_SEQUENCERS_CACHED_MAX = 4096


class FenceError(Exception):
    """Why a fenced claim, read or write did not happen, or why its outcome is unknown."""

    kind = "storage"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    @property
    def is_rejection(self) -> bool:
        """The sequencer was refused; retrying with it cannot succeed."""
        return self.kind in ("stale", "token_reissued", "shared_write", "wrong_lock", "missing", "malformed", "forged")

    @property
    def is_retryable(self) -> bool:
        """Nothing was applied and the same request may succeed when retried."""
        return self.kind == "storage"

    @property
    def is_outcome_unknown(self) -> bool:
        return self.kind == "outcome_unknown"

    @property
    def is_final(self) -> bool:
        return not self.is_retryable and not self.is_outcome_unknown


class Stale(FenceError):
    """A newer grant of the lock has claimed, read or written here: the presenter was superseded."""

    kind = "stale"

    def __init__(self, lock: str, presented: int, accepted: int, holder_session: Optional[int]) -> None:
        lock = display_binding(lock)
        holder = ""
        if holder_session == 0:
            holder = " (set by a shared phase's readers)"
        elif holder_session is not None:
            holder = f" (set by session {holder_session})"
        super().__init__(
            f"stale sequencer for lock {lock!r}: token {presented} is older than the accepted token "
            f"{accepted}{holder}; a newer holder has claimed, read or written here, so re-acquire the "
            "lock and re-read before writing"
        )
        self.lock = lock
        self.presented = presented
        self.accepted = accepted
        self.holder_session = holder_session


class TokenReissued(FenceError):
    """The accepted token was presented again by another session. One grant has one session, so
    the lock service issued this token twice (it was restored from a backup, or lost or rolled
    back its log). The resource keeps to the session that presented the token first."""

    kind = "token_reissued"

    def __init__(self, lock: str, token: int, first_session: int, presented_session: int) -> None:
        lock = display_binding(lock)
        first = "the readers of a shared phase" if first_session == 0 else f"session {first_session}"
        super().__init__(
            f"token {token} of lock {lock!r} was first presented here by {first}, and session "
            f"{presented_session} presents it now: the lock service issued this token twice (restored from a "
            "backup, or its log was lost or rolled back), so this grant is refused; tell the lock service's "
            "operator, then release the lock and acquire it again for a newer token"
        )
        self.lock = lock
        self.token = token
        self.first_session = first_session
        self.presented_session = presented_session


class SharedWrite(FenceError):
    """A shared grant (a reader of a read-write lock's shared phase) tried to write. Readers share
    their phase's token, so a fence cannot tell one reader's write from another's: only an
    exclusive grant (or a semaphore's permit) writes."""

    kind = "shared_write"

    def __init__(self, lock: str, token: int) -> None:
        super().__init__(
            f"a reader (shared grant) cannot write: token {token} of lock {lock!r} is a shared grant, so this "
            "write is refused; acquire the lock exclusive to write"
        )
        self.lock = lock
        self.token = token


class WrongLock(FenceError):
    kind = "wrong_lock"

    def __init__(self, expected: str, presented: str) -> None:
        expected, presented = display_binding(expected), display_binding(presented)
        super().__init__(
            f"sequencer is for lock {presented!r}, but this resource is protected by lock {expected!r}: "
            f"acquire {expected!r} instead"
        )
        self.expected = expected
        self.presented = presented


class Missing(FenceError):
    kind = "missing"

    def __init__(self) -> None:
        super().__init__("no sequencer presented: fenced writes need the sequencer of the lock holder")


class Malformed(FenceError):
    kind = "malformed"


class Forged(FenceError):
    kind = "forged"


class InvalidScope(FenceError):
    kind = "invalid_scope"


class Corrupt(FenceError):
    kind = "corrupt"


class InvalidRequest(FenceError):
    kind = "invalid_request"


class Storage(FenceError):
    kind = "storage"


class OutcomeUnknown(FenceError):
    kind = "outcome_unknown"


@dataclasses.dataclass(frozen=True)
class FenceState:
    """What a scope has accepted so far, stored with its data: ``lock`` is its binding (the lock,
    or a permit's lock and slot), ``holder_session`` the session that presented ``token_max``
    first, 0 for a shared phase."""

    lock: str
    token_max: int
    holder_session: int


#: What the caller does with an accepted sequencer: ``"read"`` (a claim before a read, or a read:
#: any grant may) or ``"write"`` (a write, or a claim that authorizes the writes after it:
#: exclusive grants and permits only).
Intent = Literal["read", "write"]
READ: Intent = "read"
WRITE: Intent = "write"


def stored_holder(sequencer: VerifiedSequencer) -> int:
    """The holder session a scope stores when it accepts ``sequencer``: its session, or 0 for a
    shared grant. A scope accepts its token again exactly when the stored holder equals this,
    which is how the SQL statements and the Lua script state rule 4."""
    return 0 if sequencer.access.kind == "shared" else sequencer.session


def validate_scope(scope: object) -> str:
    if not isinstance(scope, str) or not scope:
        raise InvalidScope("invalid fence scope: scope name is empty" if scope == "" else "a scope name is a str")
    size = len(scope.encode("utf-8", "surrogatepass"))
    if size > SCOPE_BYTES_MAX:
        raise InvalidScope(f"invalid fence scope: scope name is {size} bytes, the limit is {SCOPE_BYTES_MAX}")
    return scope


def verify_presented(presented: Optional[str], keys: Union[KeySet, PublicKey, str]) -> VerifiedSequencer:
    """Verifies the sequencer a client presented; ``None`` or blank is :class:`Missing`, text that
    is no sequencer :class:`Malformed`, a bad signature or an untrusted key :class:`Forged`."""
    if presented is None or not presented.strip():
        raise Missing()
    try:
        return _verify(presented, keys)
    except _SequencerForged as error:
        raise Forged(f"forged sequencer: {error}") from None
    except SequencerError as error:
        raise Malformed(f"malformed sequencer: {error}") from None


class Verifier:
    """Verifies sequencers with the lock service's public keys, remembering recent successes
    (by exact text, forgotten when the keys change), so each sequencer pays for one check."""

    def __init__(self, keys: Union[KeySet, PublicKey, str]) -> None:
        try:
            self._keys = KeySet.of(keys)
        except SequencerError as error:
            raise Malformed(f"invalid public keys: {error}") from None
        self._verified: dict[str, VerifiedSequencer] = {}
        self._mutex = threading.Lock()

    @property
    def keys(self) -> KeySet:
        return self._keys

    def set_keys(self, keys: Union[KeySet, PublicKey, str]) -> None:
        """Trusts ``keys`` from now on instead, and forgets every remembered sequencer."""
        new = KeySet.of(keys)
        with self._mutex:
            self._keys = new
            self._verified.clear()

    def verify(self, presented: Optional[str]) -> VerifiedSequencer:
        text = (presented or "").strip()
        with self._mutex:
            hit = self._verified.get(text)
            keys = self._keys
        if hit is not None:
            return hit
        verified = verify_presented(text, keys)
        with self._mutex:
            if self._keys is keys:
                if len(self._verified) >= VERIFIED_SEQUENCERS_CACHED_MAX:
                    self._verified.clear()
                self._verified[text] = verified
        return verified


def check(
    accepted: Optional[FenceState], expected_lock: Optional[str], sequencer: VerifiedSequencer, intent: Intent
) -> FenceState:
    """The pure decision every backend runs under its own atomicity: the state to store, or the
    refusal, by the rule of the module docs. Accepts a token equal to the maximum from the grant
    that presented it first (one grant may write many times; every reader of a shared phase may
    claim), and refuses it from any other (:class:`TokenReissued`). ``expected_lock`` (a lock
    name, or a permit's binding) refuses other bindings even for the first access."""
    if not isinstance(sequencer, VerifiedSequencer):
        raise TypeError("the fence takes only a VerifiedSequencer: verify the sequencer first")
    if intent not in (READ, WRITE):
        raise ValueError(f"an intent is 'read' or 'write', not {intent!r}")
    assert 1 <= sequencer.token <= TOKEN_MAX
    binding = sequencer.binding
    if expected_lock is not None and binding != expected_lock:
        raise WrongLock(expected_lock, binding)
    if accepted is not None and binding != accepted.lock:
        raise WrongLock(accepted.lock, binding)
    if sequencer.access.kind == "shared" and intent == WRITE:
        raise SharedWrite(sequencer.lock, sequencer.token)
    holder = stored_holder(sequencer)
    if accepted is None:
        return FenceState(binding, sequencer.token, holder)
    if sequencer.token < accepted.token_max:
        raise Stale(accepted.lock, sequencer.token, accepted.token_max, accepted.holder_session)
    if sequencer.token == accepted.token_max and holder != accepted.holder_session:
        # One grant has one session (one phase, holder 0): the same token from another was
        # issued twice.
        raise TokenReissued(accepted.lock, accepted.token_max, accepted.holder_session, sequencer.session)
    return FenceState(accepted.lock, sequencer.token, holder)


def precheck(expected_lock: Optional[str], sequencer: VerifiedSequencer, intent: Intent) -> None:
    """Refuses what :func:`check` refuses without stored state (an unexpected binding, a shared
    grant's write); the backends run it before their I/O."""
    check(None, expected_lock, sequencer, intent)


def explain_refusal(scope: str, accepted: FenceState, sequencer: VerifiedSequencer, intent: Intent) -> FenceError:
    """Why a database refused ``sequencer`` given the row that refused it; a row that would have
    accepted is corruption, never success."""
    try:
        check(accepted, None, sequencer, intent)
    except FenceError as refusal:
        return refusal
    return Corrupt(
        f"fence state of scope {scope!r} is corrupt: the database refused token {sequencer.token} "
        f"but the stored state {accepted} accepts it"
    )


def stored_state(scope: str, lock: str, token_max: int, holder_session: int) -> FenceState:
    """A state read back from storage, checked: a token outside 1..=TOKEN_MAX is corruption."""
    if not 1 <= token_max <= TOKEN_MAX:
        raise Corrupt(f"fence state of scope {scope!r} is corrupt: stored token {token_max} is outside 1..={TOKEN_MAX}")
    return FenceState(lock, token_max, holder_session & 0xFFFF_FFFF_FFFF_FFFF)


def confirm_advanced(scope: str, stored: int, presented: int) -> None:
    if stored != presented:
        raise Corrupt(
            f"fence state of scope {scope!r} is corrupt: the fence row holds token {stored} after "
            f"advancing to {presented}; something other than the fence changed it"
        )


def to_signed(session: int) -> int:
    """A ``u64`` session id stored bit-for-bit in a signed 64-bit column, as the Rust adapters do."""
    return session - (1 << 64) if session >= 1 << 63 else session


__all__ = [
    "Corrupt",
    "FenceError",
    "FenceState",
    "Forged",
    "Intent",
    "InvalidRequest",
    "InvalidScope",
    "Malformed",
    "Missing",
    "OutcomeUnknown",
    "READ",
    "SharedWrite",
    "Stale",
    "Storage",
    "TokenReissued",
    "Verifier",
    "WRITE",
    "WrongLock",
    "check",
    "precheck",
    "stored_holder",
    "verify_presented",
]
