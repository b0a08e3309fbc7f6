"""A fence for Redis (redis-py): one Lua script checks the scope's accepted token and, if the
sequencer is accepted, advances it and applies the caller's ops.

The script (``redis.lua``, shipped in this package) is the Rust adapter's
``palisade_fence::RedisFence`` script byte for byte, with the same arguments, and the fence hash
of a scope is ``palisade:fence:<scope>`` with fields ``lock``, ``token`` and ``session``: a Rust
writer and a Python writer fence the same keys.

**Claim first, then read, then write.** A plain ``GET`` is not ordered; read through the fence:

- :meth:`RedisFence.read` advances the scope's token and returns the keys' values in one script;
- :meth:`RedisFence.write` applies ops (``set``, ``delete``, ``rpush``, ``incr_by``, ``get``) in
  the same step as the check;
- :meth:`RedisFence.write_if` adds conditions (``equals``, ``absent``) checked against the data
  before the ops: a compare-and-set, applied all or nothing.

:meth:`RedisFence.read` is a read, which any grant may make, a shared one (a reader of a read-write
lock) included; :meth:`RedisFence.write` and :meth:`RedisFence.write_if` refuse a shared grant
(:class:`~palisade.fence.SharedWrite`). The script's session argument is ``s`` for a shared grant:
it stores holder 0 and refuses any op but ``get`` from it, for every client.

Before its first write the script checks that every op can apply (types, integer overflow), so a
request is applied in full or not at all. Redis 7.0 or later.

**Durability.** Redis acknowledges once the script ran in memory; replication is asynchronous, so
after a failover a superseded holder's old token can be accepted again. Use it where losing
recent writes on a crash or failover is acceptable; use PostgreSQL or SQLite where it is not.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
from typing import Any, Optional, Sequence, Union

from . import (
    READ,
    WRITE,
    Corrupt,
    FenceState,
    Intent,
    InvalidRequest,
    OutcomeUnknown,
    SharedWrite,
    Stale,
    Storage,
    TokenReissued,
    WrongLock,
    precheck,
    stored_holder,
    validate_scope,
)
from ..sequencer import VerifiedSequencer

#: Most ops one fenced script call may apply (and most keys one read returns).
REDIS_OPS_MAX = 64
#: Most conditions one :meth:`RedisFence.write_if` may check.
REDIS_CONDITIONS_MAX = 64
#: Default prefix of the fence hashes: ``palisade:fence:<scope>``.
FENCE_KEY_PREFIX_DEFAULT = "palisade:fence:"
#: Longest key or value of one op, in bytes (a Redis string can be 512 MiB; a fenced request
#: of that size is a mistake).
VALUE_BYTES_MAX = 16 * 1024 * 1024

SCRIPT = importlib.resources.files(__package__).joinpath("redis.lua").read_text(encoding="utf-8")

Bytes = Union[bytes, str]


def _bytes(value: Bytes) -> bytes:
    data = value.encode() if isinstance(value, str) else bytes(value)
    if len(data) > VALUE_BYTES_MAX:
        raise InvalidRequest(f"invalid fenced request: a value of {len(data)} bytes, the limit is {VALUE_BYTES_MAX}")
    return data


@dataclasses.dataclass(frozen=True)
class Op:
    """One op the script applies, in order, if the sequencer is accepted."""

    kind: str
    key: str
    value: bytes = b""

    @staticmethod
    def set(key: str, value: Bytes) -> "Op":
        """``SET key value``; replies ``True``."""
        return Op("set", key, _bytes(value))

    @staticmethod
    def delete(key: str) -> "Op":
        """``DEL key``; replies 1 if the key existed, else 0."""
        return Op("del", key)

    @staticmethod
    def rpush(key: str, value: Bytes) -> "Op":
        """``RPUSH key value``; replies the list's length after the push."""
        return Op("rpush", key, _bytes(value))

    @staticmethod
    def incr_by(key: str, delta: int) -> "Op":
        """``INCRBY key delta`` on a 64-bit integer (absent counts as 0); replies the new value."""
        if isinstance(delta, bool) or not isinstance(delta, int) or not -(1 << 63) <= delta < (1 << 63):
            raise InvalidRequest("invalid fenced request: an increment is a 64-bit integer")
        return Op("incrby", key, str(delta).encode())

    @staticmethod
    def get(key: str) -> "Op":
        """``GET key`` as the earlier ops left it; replies the value or ``None``."""
        return Op("get", key)


@dataclasses.dataclass(frozen=True)
class Condition:
    """A condition :meth:`RedisFence.write_if` checks against the data before the ops."""

    kind: str
    key: str
    value: bytes = b""

    @staticmethod
    def equals(key: str, value: Bytes) -> "Condition":
        return Condition("equals", key, _bytes(value))

    @staticmethod
    def absent(key: str) -> "Condition":
        return Condition("absent", key)


@dataclasses.dataclass(frozen=True)
class CompareFailed:
    """A condition did not hold: nothing was written and the token was not advanced."""

    condition: int
    #: The key's value now, if it holds a string.
    current: Optional[bytes]


class RedisFence:
    """Fences writes to a Redis database, per scope."""

    def __init__(self, *, key_prefix: str = FENCE_KEY_PREFIX_DEFAULT, expect_lock: Optional[str] = None) -> None:
        if not key_prefix:
            raise InvalidRequest("invalid fenced request: the fence key prefix is empty")
        self.key_prefix = key_prefix
        self.expect_lock = expect_lock

    def fence_key(self, scope: str) -> str:
        """The key of the hash holding ``scope``'s state."""
        return f"{self.key_prefix}{scope}"

    def write(self, conn: Any, scope: str, sequencer: VerifiedSequencer, ops: Sequence[Op]) -> list[Any]:
        """Applies ``ops`` if ``sequencer`` is accepted for ``scope``, advancing the scope's token
        in the same script; returns one reply per op. On any error nothing was written, except
        :class:`~palisade.fence.OutcomeUnknown`."""
        return self._write(conn, scope, sequencer, ops, WRITE)

    def _write(self, conn: Any, scope: str, sequencer: VerifiedSequencer, ops: Sequence[Op], intent: Intent) -> list[Any]:
        outcome = self._run(conn, scope, sequencer, (), ops, intent)
        if isinstance(outcome, CompareFailed):
            raise Corrupt(
                f"fence state of scope {scope!r} is corrupt: the script reported condition "
                f"{outcome.condition} failed, but the request had none"
            )
        return outcome

    def write_if(
        self, conn: Any, scope: str, sequencer: VerifiedSequencer, conditions: Sequence[Condition], ops: Sequence[Op]
    ) -> Union[list[Any], CompareFailed]:
        """:meth:`write` under ``conditions``: the replies if every condition held, else a
        :class:`CompareFailed` (nothing written)."""
        return self._run(conn, scope, sequencer, conditions, ops, WRITE)

    def read(self, conn: Any, scope: str, sequencer: VerifiedSequencer, keys: Sequence[str]) -> list[Optional[bytes]]:
        """A fenced read: advances the scope's token and returns the values of ``keys`` (``None``
        for a missing key) in one script. Once it returns, no older grant can write here. Any grant
        may read, a shared one included."""
        return self._write(conn, scope, sequencer, [Op.get(key) for key in keys], READ)

    def fence_state(self, conn: Any, scope: str) -> Optional[FenceState]:
        """The scope's state, if any sequencer was accepted."""
        import redis as redis_py

        validate_scope(scope)
        try:
            lock, token, session = conn.hmget(self.fence_key(scope), ["lock", "token", "session"])
        except redis_py.RedisError as error:
            raise Storage(f"fence storage error: redis error: {error}") from None
        if lock is None and token is None and session is None:
            return None
        if lock is None or token is None or session is None:
            raise Corrupt(f"fence state of scope {scope!r} is corrupt: the fence hash lacks its lock, token or session")
        return FenceState(
            _text(lock),
            _canonical(scope, "token", token, (1 << 63) - 1, minimum=1),
            _canonical(scope, "session", session, (1 << 64) - 1),
        )

    def _run(
        self,
        conn: Any,
        scope: str,
        sequencer: VerifiedSequencer,
        conditions: Sequence[Condition],
        ops: Sequence[Op],
        intent: Intent,
    ) -> Union[list[Any], CompareFailed]:
        import redis as redis_py

        validate_scope(scope)
        if len(ops) > REDIS_OPS_MAX:
            raise InvalidRequest(f"invalid fenced request: {len(ops)} redis ops in one fenced request, the limit is {REDIS_OPS_MAX}")
        if len(conditions) > REDIS_CONDITIONS_MAX:
            raise InvalidRequest(
                f"invalid fenced request: {len(conditions)} conditions in one fenced request, the limit is {REDIS_CONDITIONS_MAX}"
            )
        for item in list(conditions) + list(ops):
            if item.key.startswith(self.key_prefix):
                raise _reserved(item.key)
        # The expected binding and a shared write need no stored state: refused before Redis (the
        # script refuses a shared grant's write too, for every client).
        precheck(self.expect_lock, sequencer, intent)
        keys = [self.fence_key(scope)]
        args: list[Any] = [
            sequencer.binding,
            str(sequencer.token),
            "s" if sequencer.access.kind == "shared" else str(sequencer.session),
            self.key_prefix,
            str(len(conditions)),
        ]
        for condition in conditions:
            keys.append(condition.key)
            args += [condition.kind, condition.value]
        for op in ops:
            keys.append(op.key)
            args += [op.kind, op.value]
        script = conn.register_script(SCRIPT)
        try:
            reply = script(keys=keys, args=args)
        except redis_py.RedisError as error:
            raise _script_failure(error) from None
        return _decode(scope, sequencer, ops, reply)


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def _canonical(scope: str, field: str, raw: Any, maximum: int, minimum: int = 0) -> int:
    text = _text(raw)
    if not text.isascii() or not text.isdigit() or str(int(text)) != text or not minimum <= int(text) <= maximum:
        raise Corrupt(f"fence state of scope {scope!r} is corrupt: the stored {field} {text!r} is not a canonical decimal in range")
    return int(text)


def _reserved(key: str) -> InvalidRequest:
    return InvalidRequest(
        f"invalid fenced request: key {key!r} is under the fence key prefix, which holds the fences of every scope; nothing was written"
    )


def _unexpected(detail: str) -> OutcomeUnknown:
    return OutcomeUnknown(f"outcome unknown: unexpected reply from the fence script: {detail}")


def _decode(scope: str, sequencer: VerifiedSequencer, ops: Sequence[Op], reply: Any) -> Union[list[Any], CompareFailed]:
    if not isinstance(reply, list) or not reply:
        raise _unexpected(repr(reply))

    def text(index: int) -> str:
        if index >= len(reply) or reply[index] is None:
            raise _unexpected(f"field {index} is missing: {reply!r}")
        try:
            return _text(reply[index])
        except UnicodeDecodeError:
            raise _unexpected(f"field {index} is not UTF-8") from None

    def index(position: int) -> int:
        value = text(position)
        if not value.isdigit():
            raise _unexpected(f"{value!r} is not an index")
        return int(value)

    status = text(0)
    if status == "ok":
        pairs = reply[1:]
        if len(pairs) != 2 * len(ops):
            raise _unexpected(f"{len(pairs) // 2} replies for {len(ops)} ops")
        # One per op: True for a done, the value (bytes, or None when missing) for a get, the
        # new value for an incr_by.
        replies: list[Union[bool, bytes, int, None]] = []
        for kind, value in zip(pairs[0::2], pairs[1::2]):
            kind = _text(kind) if kind is not None else None
            if kind == "done":
                replies.append(True)
            elif kind == "value":
                replies.append(None if value is None else bytes(value))
            elif kind == "int" and value is not None:
                try:
                    replies.append(int(_text(value)))
                except ValueError:
                    raise _unexpected(f"op reply {value!r} is not an integer") from None
            else:
                raise _unexpected(f"op reply {kind!r} {value!r}")
        return replies
    if status == "stale":
        accepted = _canonical(scope, "token", reply[1], (1 << 63) - 1, minimum=1)
        holder = _canonical(scope, "session", reply[2], (1 << 64) - 1)
        if accepted <= sequencer.token:
            raise Corrupt(
                f"fence state of scope {scope!r} is corrupt: redis called the stored token {accepted} newer than token {sequencer.token}"
            )
        raise Stale(sequencer.binding, sequencer.token, accepted, holder)
    if status == "token_reissued":
        accepted = _canonical(scope, "token", reply[1], (1 << 63) - 1, minimum=1)
        first = _canonical(scope, "session", reply[2], (1 << 64) - 1)
        if accepted != sequencer.token or first == stored_holder(sequencer):
            raise Corrupt(
                f"fence state of scope {scope!r} is corrupt: redis called token {sequencer.token} of session "
                f"{sequencer.session} a re-issue of token {accepted} of session {first}"
            )
        raise TokenReissued(sequencer.binding, accepted, first, sequencer.session)
    if status == "wrong_lock":
        raise WrongLock(text(1), sequencer.binding)
    if status == "shared_write":
        if sequencer.access.kind != "shared":
            raise _unexpected(f"redis called a write of a {sequencer.access} grant a shared write")
        raise SharedWrite(sequencer.lock, sequencer.token)
    if status == "corrupt":
        raise Corrupt(f"fence state of scope {scope!r} is corrupt: {text(1)}")
    if status == "compare_failed":
        current = reply[2] if len(reply) > 2 else None
        return CompareFailed(index(1), None if current is None else bytes(current))
    if status == "reserved_key":
        raise _reserved(text(1))
    if status == "wrong_type":
        raise InvalidRequest(
            f"invalid fenced request: op {index(1)} needs key {text(2)!r} to hold a {text(4)} or not exist, "
            f"but it holds a {text(3)} (after the ops before it); nothing was written"
        )
    if status == "not_integer":
        raise InvalidRequest(
            f"invalid fenced request: op {index(1)} increments key {text(2)!r}, which does not hold a 64-bit "
            "integer (after the ops before it); nothing was written"
        )
    if status == "overflow":
        raise InvalidRequest(
            f"invalid fenced request: op {index(1)} would take key {text(2)!r} beyond the 64-bit integer range; nothing was written"
        )
    if status == "invalid":
        raise InvalidRequest(f"invalid fenced request: {text(1)}")
    raise _unexpected(repr(reply))


# Errors Redis answers with instead of running a script.
_REFUSED_CODES = ("NOSCRIPT", "LOADING", "TRYAGAIN", "CLUSTERDOWN", "MASTERDOWN", "READONLY", "CROSSSLOT",
                  "MOVED", "ASK", "NOPERM", "BUSY", "OOM", "NOAUTH", "WRONGPASS", "MISCONF", "NOREPLICAS")


def _script_failure(error: Exception) -> Exception:
    import redis as redis_py

    message = str(error)
    refused = isinstance(error, (redis_py.AuthenticationError, redis_py.exceptions.ReadOnlyError, redis_py.exceptions.NoScriptError))
    if isinstance(error, redis_py.ConnectionError) and not isinstance(error, redis_py.TimeoutError):
        lowered = message.lower()
        refused = refused or "connecting to" in lowered or "connection refused" in lowered
    if isinstance(error, redis_py.ResponseError) and message.split(" ", 1)[0] in _REFUSED_CODES:
        refused = True
    if refused:
        return Storage(f"fence storage error: redis error: {message}")
    return OutcomeUnknown(
        f"outcome unknown: redis error after the fence script was sent: {message}; the write may or may "
        "not have been applied, read it back under a claim before retrying"
    )
