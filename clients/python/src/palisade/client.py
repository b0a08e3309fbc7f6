"""The blocking client: :class:`Client`, :class:`Session` and :class:`Grant`.

A :class:`Session` keeps its lease alive from a background thread that drives the keepalive
engine (:mod:`palisade._keepalive`, the rules of every Palisade client, checked against the
shared vectors in ``spec/keepalive/v2``), over one KeepAlive stream after another: a ping every
``ttl / 3``; the lease is *proven* until a
ping's send time plus the remainder the service reported; a stream whose oldest ping has gone
unanswered for a whole interval is stuck and reopened elsewhere; when the service has no
keepalive stream to spare (``RESOURCE_EXHAUSTED``) the session is renewed by the unary ``Renew``
once per interval and a stream tried again. When the lease can no longer be proven, or the
service says the session is gone, the session is **lost**: every held grant's ``lost`` event is
set and its ``on_lost`` callback runs. A session lost for want of a proven lease is not closed by
the library: it is renewed best effort until its owner closes it, so its locks are not handed on
while the owner is still stopping.

Holding a lock is still advisory (a paused process learns of the loss late); what makes it safe
is that resources check the grant's ``sequencer`` (see :mod:`palisade.fence`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import queue
import threading
import time
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import grpc

from . import _core, errors
from . import _keepalive as ka
from ._core import Failure
from ._proto import palisade_pb2 as pb
from ._proto import palisade_pb2_grpc as pb_grpc
from .sequencer import EXCLUSIVE, Access, KeySet, PublicKey
from .tls import Tls

log = logging.getLogger("palisade")

OnLost = Callable[["Grant", str], None]


@dataclasses.dataclass(frozen=True)
class Holder:
    session: int
    token: int
    #: Lease remaining on the holding session when the service answered, in seconds.
    lease_remaining: float
    #: The grant's value (the acquire's ``value=``, or the last :meth:`Grant.proclaim`); ``None``
    #: if it has none.
    value: Optional[str] = None
    #: Exclusive, shared (a reader of the phase whose token this is) or a semaphore's slot.
    access: Access = EXCLUSIVE


@dataclasses.dataclass(frozen=True)
class LockStatus:
    lock: str
    #: ``None`` when the lock is free.
    holder: Optional[Holder]
    #: The last token granted for this lock (0 if none since the lock was last forgotten).
    last_token: int
    #: Waiting sessions, first in line first.
    waiters: tuple[int, ...]
    #: Time left in lock-delay after a holder's session expired, in seconds.
    lock_delay_remaining: Optional[float]
    #: The readers of the current shared phase, or a semaphore's permit holders (docs/locks.md).
    sharers: tuple[Holder, ...] = ()
    #: A semaphore's number of permits; ``None`` for a lock.
    permits: Optional[int] = None


def lock_status(info: pb.LockInfo) -> LockStatus:
    def holder_of(h: pb.Holder) -> Holder:
        if h.token == 0 or h.token > info.last_token:
            raise errors.ProtocolError(
                f"lock {info.lock!r} is held with token {h.token} but its last token is {info.last_token}"
            )
        return Holder(h.session, h.token, h.lease_remaining_ms / 1000, h.value or None, _core.access_of(h))

    holder = holder_of(info.holder) if info.HasField("holder") else None
    delay = info.lock_delay_remaining_ms / 1000 if info.HasField("lock_delay_remaining_ms") else None
    permits = info.permits if info.HasField("permits") else None
    sharers = tuple(holder_of(h) for h in info.sharers)
    return LockStatus(info.lock, holder, info.last_token, tuple(info.waiters), delay, sharers, permits)


#: The kinds of :class:`LockEvent`, by the wire's ``WatchEvent.Kind``; any other number is
#: ``"other"`` (a kind of a newer service).
EVENT_KINDS = {
    pb.WatchEvent.KIND_SNAPSHOT: "snapshot",
    pb.WatchEvent.KIND_GRANTED: "granted",
    pb.WatchEvent.KIND_RELEASED: "released",
    pb.WatchEvent.KIND_EXPIRED: "expired",
    pb.WatchEvent.KIND_VALUE_SET: "value_set",
}


@dataclasses.dataclass(frozen=True)
class LockEvent:
    """One change of a lock's holder, from :meth:`Client.watch`."""

    #: ``"snapshot"`` (the state when the watch (re)opened), ``"granted"``, ``"released"``,
    #: ``"expired"``, ``"value_set"`` (the holder proclaimed a new value), or ``"other"`` (a kind
    #: of a newer service: :attr:`kind_number` is its number).
    kind: str
    lock: str
    #: The holder after a snapshot, a grant or a proclaim, or the former holder after a release
    #: or an expiry; ``None`` if there is none.
    session: Optional[int]
    #: The token of that holder's grant.
    token: Optional[int]
    #: Sessions waiting for the lock.
    waiters: int
    #: The holding's value after a snapshot, a grant or a proclaim; ``None`` if it has none, and
    #: after a release or an expiry.
    value: Optional[str]
    #: The wire's ``WatchEvent.Kind`` number.
    kind_number: int
    #: How the grant holds the lock (after a grant, in a snapshot); exclusive otherwise.
    access: Access = EXCLUSIVE


def lock_event(lock: str, event: pb.WatchEvent) -> LockEvent:
    """A watch event of ``lock``, checked as the Rust client checks it."""
    if event.lock != lock:
        raise errors.ProtocolError(f"watch of lock {lock!r} sent an event for lock {event.lock!r}")
    kind = EVENT_KINDS.get(event.kind, "other")
    if kind in ("granted", "value_set") and (event.session == 0 or event.token == 0):
        raise errors.ProtocolError(
            f"watch of lock {lock!r} sent a {kind} of session {event.session} with token {event.token}"
        )
    return LockEvent(
        kind=kind,
        lock=event.lock,
        session=event.session or None,
        token=event.token or None,
        waiters=event.waiters,
        value=event.value or None,
        kind_number=event.kind,
        access=_core.access_of(event),
    )


@dataclasses.dataclass(frozen=True)
class SessionCredential:
    """A session's id and secret: what every call for the session presents.

    Its text form ``<id>.<64 hex digits>`` is what ``palisade acquire`` prints as
    ``PALISADE_SESSION``. Treat it as a password: whoever has it can release the session's locks.
    """

    id: int
    secret: bytes = dataclasses.field(repr=False)

    def __str__(self) -> str:
        return f"{self.id}.{self.secret.hex()}"

    @staticmethod
    def parse(text: str) -> "SessionCredential":
        text = text.strip()
        ident, dot, digits = text.partition(".")
        if not dot:
            if ident.isascii() and ident.isdigit():
                raise errors.InvalidArgument(
                    f"{ident} is a bare session id, which no longer acts for a session: pass the whole "
                    "PALISADE_SESSION value (<id>.<secret>)"
                )
            raise errors.InvalidArgument("not a session credential: expected <id>.<64 lowercase hex digits>")
        canonical = ident.isascii() and ident.isdigit() and (ident == "0" or not ident.startswith("0"))
        if (
            not canonical
            or int(ident) >= 1 << 64
            or len(digits) != 2 * _core.SESSION_SECRET_BYTES
            or any(c not in "0123456789abcdef" for c in digits)
        ):
            raise errors.InvalidArgument("not a session credential: expected <id>.<64 lowercase hex digits>")
        return SessionCredential(int(ident), bytes.fromhex(digits))


@dataclasses.dataclass(frozen=True)
class AcquireResult:
    """One grant of a lock, as the one-shot :meth:`Client.acquire` returns it."""

    lock: str
    session: int
    token: int
    sequencer: str
    #: Exclusive, shared (a reader of the phase whose token this is) or a semaphore's slot.
    access: Access = EXCLUSIVE


class _Calls:
    """The retry loop of the blocking API over one :class:`_core.Endpoints`."""

    def __init__(self, endpoints: _core.Endpoints[_core.AuthorizedStub], request_timeout: float, retry_budget: float):
        self.endpoints = endpoints
        self.request_timeout = request_timeout
        self.retry_budget = retry_budget

    def call(
        self,
        method: str,
        request: Union[Any, Callable[[], tuple[Any, Optional[float]]]],
        what: str,
        budget: Optional[float] = None,
    ) -> Any:
        """Calls ``method`` at the current endpoint, retried within the budget (``budget``
        seconds, else the client's); ``request`` is a message (same for every attempt) or a
        function giving each attempt's message and timeout."""

        def attempt(stub: Any) -> Any:
            if callable(request):
                message, timeout = request()
            else:
                message, timeout = request, self.request_timeout
            return getattr(stub, method)(message, timeout=timeout)

        return self.run(attempt, what, budget)[0]

    def run(self, attempt: Callable[[Any], Any], what: str, budget: Optional[float] = None) -> tuple[Any, int]:
        """``attempt(stub)`` at the current endpoint, retried within the budget as :meth:`call`
        is; returns its result and the generation of the endpoint that gave it."""
        retry = _core.Retry(self.retry_budget if budget is None else budget)
        while True:
            current = self.endpoints.current()
            try:
                return attempt(current.stub), current.generation
            except grpc.RpcError as error:
                failure = _core.failure_from_rpc_error(error)
            self.endpoints.after_failure(current.generation, failure)
            step = retry.after(failure)
            if isinstance(step, Failure):
                raise step.error(what) from None
            if step is not _core.Retry.AT_ONCE:
                time.sleep(step)


class Client:
    """A connection to the lock service: one server, or the members of a cluster.

    ``endpoints`` is a list of ``host:port`` (or one comma-separated string), at most 16. The
    client connects to the first that accepts a connection and keeps lazily connected channels
    to the others; calls follow the leader (see :mod:`palisade._core`). Thread-safe.

    ``token`` is the bearer token every call carries (``authorization: Bearer <token>``), for a
    lock service with a token file and a policy; when it is ``None``, ``$PALISADE_AUTH_TOKEN`` is
    used if set, else no token is sent. The client never shows the token (``repr``, logs,
    errors).

    ``tls`` (a :class:`palisade.Tls`) makes every connection TLS, checked against its CA, with
    the client's certificate for mutual TLS; endpoints may then start with ``https://``. With
    TLS, a leader hint naming a member outside ``endpoints`` is followed; without, it is not
    (nothing would prove that address a member).
    """

    def __init__(
        self,
        endpoints: Union[Sequence[str], str],
        *,
        token: Union[str, _core.BearerToken, None] = None,
        tls: Optional[Tls] = None,
        connect_timeout: float = 5.0,
        request_timeout: float = 10.0,
        retry_budget: float = 10.0,
    ) -> None:
        self._channels: dict[str, grpc.Channel] = {}
        self._closed = False
        if tls is not None and not isinstance(tls, Tls):
            raise errors.Misconfigured(f"tls is a palisade.Tls, not {type(tls).__name__}")
        self._credentials = None if tls is None else tls.credentials()
        targets = _core.parse_endpoints(endpoints, tls is not None)
        bearer = _core.bearer_token(token)
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("request_timeout", request_timeout),
            ("retry_budget", retry_budget),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise errors.InvalidArgument(f"{name} is seconds in (0, 3600], not {value!r}")
        failures = []
        first = None
        for index, target in enumerate(targets):
            channel = self._channel(target)
            try:
                grpc.channel_ready_future(channel).result(timeout=connect_timeout)
            except grpc.FutureTimeoutError:
                try:  # what gRPC knows of why: refused, a failed handshake, ...
                    pb_grpc.LocksStub(channel).PublicKey(
                        pb.PublicKeyRequest(), timeout=_core.WHY_UNREACHABLE_TIMEOUT_S
                    )
                    why = None
                except grpc.RpcError as error:
                    why = _core.why_unreachable(error)
                if why is not None:
                    failures.append(f"{target}: no connection within {connect_timeout:g} s ({why})")
                    continue
            first = index
            break
        if first is None:
            self.close()
            raise _core.unreachable(targets, failures, tls)
        self._endpoints = _core.Endpoints(
            targets,
            first,
            lambda t: _core.AuthorizedStub(pb_grpc.LocksStub(self._channel(t)), bearer),
            tls=tls is not None,
        )
        self._calls = _Calls(self._endpoints, request_timeout, retry_budget)

    def _channel(self, target: str) -> grpc.Channel:
        channel = self._channels.get(target)
        if channel is None:
            if self._credentials is None:
                channel = grpc.insecure_channel(target, options=_core.CHANNEL_OPTIONS)
            else:
                channel = grpc.secure_channel(target, self._credentials, options=_core.CHANNEL_OPTIONS)
            self._channels[target] = channel
        return channel

    @property
    def endpoint(self) -> str:
        """The endpoint calls go to now: the leader, as far as this client knows."""
        return self._endpoints.current().target

    @property
    def endpoints(self) -> list[str]:
        return list(self._endpoints.configured)

    def close(self) -> None:
        """Closes every channel. Sessions of this client stop being renewed."""
        self._closed = True
        for channel in list(self._channels.values()):
            channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # --- sessions and locks ------------------------------------------------------------------

    def session(self, ttl: float = 10.0, *, keepalive_interval: Optional[float] = None) -> "Session":
        """Opens a session whose lease (``ttl`` seconds, 1 s to 1 day) is kept alive by a
        background thread until it is closed."""
        return Session(self, ttl, keepalive_interval)

    @contextlib.contextmanager
    def lock(
        self,
        name: str,
        ttl: float = 10.0,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        on_lost: Optional[OnLost] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> Iterator["Grant"]:
        """Holds lock ``name`` for the ``with`` block, in a session of its own.

        ``wait``: ``None`` waits until granted (FIFO), ``0`` tries once (:class:`errors.Busy` if
        held), a number waits that many seconds (:class:`errors.WaitEnded`). ``value``: what the
        grant tells everyone who reads the lock (``status``, ``list_locks``, ``watch``), 1 to
        1024 bytes of UTF-8 without control characters; ``None`` for none. The grant's
        ``lost`` event is set, and ``on_lost(grant, reason)`` called from the keepalive thread,
        if the session is lost while the block runs. On exit the lock is released and the
        session closed. ``shared=True`` takes the lock as a reader, ``permits=N`` one permit of
        the semaphore ``name`` of N permits (its slot is ``grant.slot``): see docs/locks.md.
        """
        _core.wire_value(value)  # refused before a session is opened
        _core.acquire_mode(shared, permits)
        session = self.session(ttl)
        try:
            with session.lock(
                name, wait=wait, value=value, on_lost=on_lost, shared=shared, permits=permits
            ) as grant:
                yield grant
        finally:
            try:
                session.close()
            except errors.PalisadeError as error:
                log.debug("closing the session of lock %r failed: %s", name, error)

    # --- one-shot operations -----------------------------------------------------------------

    def open_session_without_keepalive(self, ttl: float) -> tuple[SessionCredential, float]:
        """Opens a session that nothing renews: it expires ``ttl`` after it was opened or last
        renewed with :meth:`renew`. Returns its credential and the TTL the service granted."""
        credential, granted, _ = self._open_session(ttl)
        return credential, granted

    def _open_session(self, ttl: float) -> tuple[SessionCredential, float, float]:
        # One key for every attempt: a retry after an unknown outcome gets the session the
        # first attempt may have opened, not a second one.
        request = pb.OpenSessionRequest(ttl_ms=_core.ttl_ms(ttl), open_key=_core.open_key())
        first_sent_at = time.monotonic()
        response = self._calls.call("OpenSession", request, "opening a session")
        session, secret, granted = _core.check_open(response)
        return SessionCredential(session, secret), granted, first_sent_at

    def renew(self, credential: SessionCredential) -> float:
        """Renews a session once; returns the lease remaining (seconds) as the service applied it."""
        return self._renew(credential, None)

    def _renew(self, credential: SessionCredential, within: Optional[float]) -> float:
        """:meth:`renew`, given up after ``within`` seconds (retries included) unless ``None``."""
        message = _core.keep_alive_request(credential.id, credential.secret)
        request: Any = message
        if within is not None:
            end = time.monotonic() + within
            timeout = self._calls.request_timeout

            def bounded() -> tuple[Any, float]:  # each attempt's timeout ends with `within`
                return message, max(0.001, min(timeout, end - time.monotonic()))

            request = bounded
        response: pb.KeepAliveResponse = self._calls.call(
            "Renew", request, f"renewal of session {credential.id}", budget=within
        )
        if response.session != credential.id:
            raise errors.ProtocolError(
                f"renewal of session {credential.id} answered for session {response.session}"
            )
        return response.ttl_remaining_ms / 1000

    def close_session(self, credential: SessionCredential) -> None:
        """Ends a session: releases its locks and withdraws its waits."""
        self._calls.call(
            "CloseSession",
            pb.CloseSessionRequest(session=credential.id, session_secret=credential.secret),
            f"closing session {credential.id}",
        )

    def acquire(
        self,
        credential: SessionCredential,
        lock: str,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> AcquireResult:
        """Takes ``lock`` for the session, waiting as ``wait`` says, the grant carrying
        ``value``, shared or by permit (see :meth:`lock`). Every retry reuses one random request id, so a retry cannot
        grant twice. A retry, or an acquire by a session that holds or waits for the lock
        already, keeps the value the first acquire brought."""
        attempts = _core.AcquireAttempts(
            credential,
            lock,
            self._calls.request_timeout,
            wait=wait,
            value=value,
            shared=shared,
            permits=permits,
        )
        response = self._calls.call("Acquire", attempts, f"acquire of lock {lock!r} in session {credential.id}")
        access = _core.check_grant(response, credential.id, lock)
        return AcquireResult(response.lock, response.session, response.token, response.sequencer, access)

    def release_then_acquire(
        self,
        credential: SessionCredential,
        release: str,
        lock: str,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> tuple[Optional[int], AcquireResult]:
        """Gives up ``release`` (or withdraws the session's wait for it), then takes ``lock`` as
        :meth:`acquire` does (``wait``, ``value``, ``shared``, ``permits``), in one call and one
        log write where :meth:`release` and :meth:`acquire` take two: a handoff to the next lock,
        or to the same lock again (behind its waiters, with a new token). Returns the token of
        the grant the release ended (``None`` if it withdrew a wait) and the new grant.

        A refused release (:class:`errors.SessionNotFound`, :class:`errors.NotHolder`,
        :class:`errors.InvalidArgument`) changes nothing; after any other error, raised as
        :meth:`acquire` raises it, the release took effect and ``lock`` is not held (unless the
        outcome is unknown: :class:`errors.OutcomeUnknown`). A server too old for it answers
        :class:`errors.ProtocolError` with ``code`` ``UNIMPLEMENTED``, having released nothing.
        Every retry reuses the release's and the acquire's request ids (two different ones), so
        a retry neither grants twice nor releases the grant an earlier attempt took."""
        acquire = _core.AcquireAttempts(
            credential,
            lock,
            self._calls.request_timeout,
            wait=wait,
            value=value,
            shared=shared,
            permits=permits,
        )
        return self._release_then_acquire(credential, release, acquire)

    def _release_then_acquire(
        self, credential: SessionCredential, release: str, acquire: _core.AcquireAttempts
    ) -> tuple[Optional[int], AcquireResult]:
        """:meth:`release_then_acquire` of an acquire whose arguments are checked already."""
        lock = acquire.lock
        response = self._calls.call(
            "ReleaseThenAcquire",
            acquire.after_release(release),
            f"release of lock {release!r} then acquire of lock {lock!r} in session {credential.id}",
        )
        released, access = _core.check_handoff(response, credential.id, release, lock)
        grant = response.grant
        return released, AcquireResult(grant.lock, grant.session, grant.token, grant.sequencer, access)

    def acquire_all(
        self,
        credential: SessionCredential,
        parts: Sequence[Union[str, _core.LockPart]],
        *,
        wait: Optional[float] = None,
    ) -> list[AcquireResult]:
        """Takes every lock of ``parts`` (names, or :class:`LockPart` objects for shared or permit
        parts) for the session at once, or none: waits as ``wait`` says (see :meth:`lock`) until
        all of them can be granted, holding none meanwhile, so two sessions naming the same
        locks in another order cannot deadlock. Returns one grant per lock, in the order named,
        each with its own token and sequencer, each released on its own (:meth:`release`). 1 to
        32 locks, each named once, none held or waited for by the session already. Every retry
        reuses one random request id, so a retry cannot grant twice."""
        wire_parts = _core.acquire_parts(parts)
        locks = [part.lock for part in wire_parts]
        window = _core.WaitWindow.start(wait)
        request_id = _core.request_id()
        request_timeout = self._calls.request_timeout

        def attempt() -> tuple[pb.AcquireAllRequest, Optional[float]]:
            wait_fields, timeout = window.attempt(request_timeout)
            message = pb.AcquireAllRequest(
                session=credential.id,
                request_id=request_id,
                **wait_fields,
                session_secret=credential.secret,
                parts=wire_parts,
            )
            return message, timeout

        response = self._calls.call("AcquireAll", attempt, f"acquire of locks {locks!r} in session {credential.id}")
        access = _core.check_grants(response, credential.id, locks)
        return [
            AcquireResult(grant.lock, grant.session, grant.token, grant.sequencer, each)
            for grant, each in zip(response.grants, access)
        ]

    def release(self, credential: SessionCredential, lock: str) -> Optional[int]:
        """Gives up ``lock`` (or withdraws a wait); returns the token of the grant that ended, or
        ``None`` if a wait was withdrawn."""
        _core.validate_lock_name(lock)
        request = pb.ReleaseRequest(
            session=credential.id, lock=lock, request_id=_core.request_id(), session_secret=credential.secret
        )
        response = self._calls.call("Release", request, f"release of lock {lock!r} by session {credential.id}")
        return _core.released_token(response, "token", lock)

    def proclaim(self, credential: SessionCredential, lock: str, token: int, value: Optional[str]) -> None:
        """Replaces the value of the session's grant ``token`` of ``lock`` (``None`` removes
        it): what a leader proclaims. Refused with :class:`errors.NotHolder` unless that grant is
        the lock's current holding (:class:`errors.SessionNotFound` if the session has ended). Setting a value twice is harmless, so a call of unknown
        outcome is retried like any other."""
        _core.validate_lock_name(lock)
        wire_value = _core.wire_value(value)
        if isinstance(token, bool) or not isinstance(token, int) or not 0 < token < 1 << 64:
            raise errors.InvalidArgument(f"a token is a positive 64-bit int, not {token!r}")
        request = pb.ProclaimRequest(
            session=credential.id, lock=lock, token=token, value=wire_value, session_secret=credential.secret
        )
        self._calls.call("Proclaim", request, f"proclaim on lock {lock!r} by session {credential.id}")

    def watch(self, lock: str) -> "LockEvents":
        """Follows ``lock``: an iterator of :class:`LockEvent`, the first a ``"snapshot"`` of its
        state now, then one per change. A stream that fails in a way a new one may get past (the
        member is not or no longer the leader, the connection broke) is reopened at the next
        endpoint, starting again with a snapshot, which covers whatever happened in between; if
        none can be reopened within the retry budget, the error is raised and the events end.
        ``close()`` (or leaving a ``with`` block) ends it."""
        _core.validate_lock_name(lock)
        return LockEvents(self, lock)

    def _open_watch(self, lock: str) -> tuple[Any, pb.WatchEvent, int]:
        """Opens a watch stream, retried: the stream, its first event and the generation of
        the endpoint that sent it. A stream's first event is its snapshot, so an open is only
        counted once the member has answered."""
        request = pb.WatchRequest(lock=lock)

        def attempt(stub: Any) -> tuple[Any, pb.WatchEvent]:
            # No deadline: a watch lasts. A dead connection is found by HTTP/2 keepalive.
            call = stub.Watch(request)
            try:
                first = next(call)
            except StopIteration:
                raise errors.ProtocolError(f"watch of lock {lock!r} ended before its snapshot") from None
            except BaseException:
                call.cancel()
                raise
            return call, first

        (call, first), generation = self._calls.run(attempt, f"watch of lock {lock!r}")
        return call, first, generation

    def status(self, lock: str, *, stale: bool = False) -> LockStatus:
        """The state of one lock (linearizable unless ``stale``)."""
        _core.validate_lock_name(lock)
        info = self._calls.call("Status", pb.StatusRequest(lock=lock, stale=stale), f"status of lock {lock!r}")
        status = lock_status(info)
        if status.lock != lock:
            raise errors.ProtocolError(f"status of lock {lock!r} answered for lock {status.lock!r}")
        return status

    def list_locks(self, prefix: str = "", *, stale: bool = False) -> list[LockStatus]:
        """Every lock whose name starts with ``prefix``, in name order (follows pagination)."""
        if len(prefix.encode()) > _core.LOCK_NAME_BYTES_MAX:
            raise errors.InvalidArgument(f"a prefix is at most {_core.LOCK_NAME_BYTES_MAX} bytes")
        locks: list[LockStatus] = []
        start_after = ""
        for _ in range(_core.LIST_PAGES_MAX):
            page = self._calls.call(
                "ListLocks",
                pb.ListLocksRequest(prefix=prefix, start_after=start_after, stale=stale),
                f"list of locks under {prefix!r}",
            )
            for info in page.locks:
                status = lock_status(info)
                in_order = (not locks or locks[-1].lock < status.lock) and (
                    not start_after or start_after < status.lock
                )
                if not status.lock.startswith(prefix) or not in_order:
                    raise errors.ProtocolError(
                        f"lock list for prefix {prefix!r} returned {status.lock!r} out of order or outside the prefix"
                    )
                locks.append(status)
            if not page.next_start_after:
                return locks
            if page.next_start_after <= start_after:
                raise errors.ProtocolError(f"lock list did not advance past {start_after!r}")
            start_after = page.next_start_after
        raise errors.ProtocolError(f"lock list for prefix {prefix!r} did not end after {_core.LIST_PAGES_MAX} pages")

    def public_keys(self) -> KeySet:
        """Every key resources must trust now (the signing key, and during a rotation the key on
        its way in or out): what to give :mod:`palisade.fence`."""
        response = self._calls.call("PublicKey", pb.PublicKeyRequest(), "reading the public keys")
        try:
            signing = PublicKey.parse(response.public_key)
            published = KeySet.parse(",".join(response.public_keys)) if response.public_keys else KeySet([signing])
        except ValueError as error:
            raise errors.ProtocolError(f"the lock service published an invalid key: {error}") from None
        if published.get(signing.key_id) is None:
            raise errors.ProtocolError(f"the signing key {signing} is not among the published keys {published}")
        return published


class LockEvents:
    """The events of one lock, from :meth:`Client.watch`: an iterator of :class:`LockEvent`
    that reopens its stream when it fails in a way a new one may get past."""

    def __init__(self, client: Client, lock: str) -> None:
        self._client = client
        self.lock = lock
        self._closed = False
        self._call, first, self._generation = client._open_watch(lock)
        self._pending: Optional[pb.WatchEvent] = first

    def __iter__(self) -> "LockEvents":
        return self

    def __next__(self) -> LockEvent:
        while True:
            if self._closed or self._call is None:
                raise StopIteration
            if self._pending is not None:
                event, self._pending = self._pending, None
                return lock_event(self.lock, event)
            try:
                return lock_event(self.lock, next(self._call))
            except StopIteration:
                self._call = None
                raise
            except grpc.RpcError as error:
                if self._closed:
                    raise StopIteration from None
                failure = _core.failure_from_rpc_error(error)
            self._call = None
            if failure.kind not in (Failure.NOT_APPLIED, Failure.NOT_LEADER, Failure.UNKNOWN):
                raise failure.error(f"watch of lock {self.lock!r}")
            log.debug("watch of lock %r failed (%s); reopening", self.lock, failure.message)
            self._client._endpoints.after_failure(self._generation, failure)
            call, first, self._generation = self._client._open_watch(self.lock)
            if self._closed:
                call.cancel()
                raise StopIteration
            self._call, self._pending = call, first

    def close(self) -> None:
        """Ends the stream (also from another thread: a ``next`` waiting in it stops)."""
        self._closed = True
        call = self._call
        if call is not None:
            call.cancel()

    def __enter__(self) -> "LockEvents":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"LockEvents(lock={self.lock!r}, closed={self._closed})"


class Grant:
    """One grant of a lock, held while its session lives.

    ``token`` is the fencing token, ``sequencer`` the signed text to present to resources.
    ``lost`` is a :class:`threading.Event` set when the session is lost or closed while the
    grant is held: from then on another holder may have the lock, so stop writing.
    """

    def __init__(self, session: "Session", result: AcquireResult, on_lost: Optional[OnLost]) -> None:
        self.lock = result.lock
        self.token = result.token
        self.sequencer = result.sequencer
        self.session_id = result.session
        #: Exclusive, shared or a semaphore's slot (see :attr:`slot`).
        self.access = result.access
        #: The slot of a semaphore's permit, ``None`` for a lock.
        self.slot = result.access.slot
        self.lost = threading.Event()
        #: Why the grant was lost (an ``errors.LOST_*`` reason), once ``lost`` is set.
        self.lost_reason: Optional[str] = None
        self._on_lost = on_lost
        self._session = session
        self.released = False

    def _mark_lost(self, reason: str) -> None:
        if self.released or self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        if self._on_lost is not None and reason != errors.LOST_CLOSED:
            try:
                self._on_lost(self, reason)
            except Exception:  # a callback's failure must not stop the keepalive
                log.exception("on_lost callback of lock %r failed", self.lock)

    def proclaim(self, value: Optional[str]) -> None:
        """Replaces the value this grant tells everyone who reads the lock (``None`` removes
        it). Refused with :class:`errors.NotHolder` once the grant is no longer the lock's
        holding (released, or the lock passed on), :class:`errors.SessionNotFound` once the
        session has ended, and :class:`errors.InvalidArgument` for an invalid value before
        anything is sent."""
        self._session._client.proclaim(self._session.credential, self.lock, self.token, value)

    def release(self) -> None:
        """Gives the lock up; raises if the service did not confirm it."""
        if self.released:
            return
        self._finish()
        token = self._session._client.release(self._session.credential, self.lock)
        _core.check_released("release of", self.lock, self.token, token)

    def release_then_acquire(
        self,
        name: str,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        on_lost: Optional[OnLost] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> "Grant":
        """Gives this lock up and takes lock ``name`` (another, or this one again: behind its
        waiters, with a new token) in one call and one log write
        (:meth:`Client.release_then_acquire`): a handoff from one lock to the next. ``wait``,
        ``value``, ``on_lost``, ``shared`` and ``permits`` as in :meth:`Session.acquire`.
        Returns the new grant, in the same session, to release in its turn; this grant is
        finished either way, as after :meth:`release`, unless the arguments are invalid
        (:class:`errors.InvalidArgument`, raised before anything is sent).

        Errors are the acquire's (:class:`errors.Busy`, :class:`errors.WaitEnded`, …), and after
        them this lock is released and ``name`` not held. A refused release changes nothing: the
        grant had ended already (:class:`errors.NotHolder`, :class:`errors.SessionNotFound`; a
        grant released by this process raises :class:`errors.NotHolder` before anything is sent,
        a lost one :class:`errors.SessionLost`). A server too old for the call raises
        :class:`errors.ProtocolError` with ``code`` ``UNIMPLEMENTED`` and releases nothing: the
        lock stays held until the session is closed."""
        if self.released:
            raise errors.NotHolder(
                f"handoff from lock {self.lock!r}: its grant with token {self.token} was released already"
            )
        session = self._session
        client = session._client
        acquire = _core.AcquireAttempts(  # invalid arguments are refused before the grant ends
            session.credential,
            name,
            client._calls.request_timeout,
            wait=wait,
            value=value,
            shared=shared,
            permits=permits,
        )
        self._finish()
        released, result = client._release_then_acquire(session.credential, self.lock, acquire)
        (grant,) = session._adopt([result], on_lost)
        try:
            _core.check_released("handoff from", self.lock, self.token, released)
        except errors.ProtocolError:
            with contextlib.suppress(errors.PalisadeError):
                grant.release()
            raise
        return grant

    def _finish(self) -> None:
        """Marks the grant released, before the call that gives it up is sent; raises
        :class:`errors.SessionLost` instead of sending it if the session was lost."""
        self.released = True
        self._session._forget(self)
        if self.lost.is_set():
            raise errors.SessionLost(self.lost_reason or errors.LOST_CLOSED)

    def __repr__(self) -> str:
        return f"Grant(lock={self.lock!r}, token={self.token}, session={self.session_id}, lost={self.lost.is_set()})"


class Session:
    """A session whose lease is kept alive by a background thread until :meth:`close`."""

    def __init__(self, client: Client, ttl: float, keepalive_interval: Optional[float] = None) -> None:
        self._client = client
        _check_interval(keepalive_interval)
        credential, granted, first_sent_at = client._open_session(ttl)
        self.credential = credential
        self.id = credential.id
        self.ttl = granted
        self._mutex = threading.Lock()
        self._engine = _core.keepalive_engine(granted, keepalive_interval, first_sent_at)  # under _mutex
        #: Why the session ended (an ``errors.LOST_*`` reason), or ``None`` while it lives.
        self.ended: Optional[str] = None
        #: Set when the session ends: lost, or closed.
        self.lost = threading.Event()
        self._grants: list[Grant] = []
        self._stopping = threading.Event()
        #: What the keepalive thread waits for: ("stop", 0, None), or (kind, stream number, payload)
        #: from a stream's reader.
        self._events: "queue.Queue[tuple[str, int, Any]]" = queue.Queue()
        self._thread = threading.Thread(target=self._keepalive, name=f"palisade-keepalive-{self.id}", daemon=True)
        self._thread.start()

    def __enter__(self) -> "Session":
        return self

    def __exit__(self, *exc: Any) -> None:
        with contextlib.suppress(errors.PalisadeError):
            self.close()

    def lease_remaining(self) -> Optional[float]:
        """The lease this process can prove, in seconds, or ``None`` once the session ended."""
        with self._mutex:
            deadline = self._engine.lease_deadline
            if self.ended is not None or deadline is None:
                return None
        return max(0.0, deadline / 1000 - time.monotonic())

    def acquire(
        self,
        name: str,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        on_lost: Optional[OnLost] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> Grant:
        """Takes lock ``name`` in this session (``wait``, ``value``, ``shared`` and ``permits``
        as in :meth:`Client.lock`)."""
        if self.ended is not None:
            raise errors.SessionLost(self.ended)
        result = self._client.acquire(self.credential, name, wait=wait, value=value, shared=shared, permits=permits)
        (grant,) = self._adopt([result], on_lost)
        return grant

    def acquire_all(
        self,
        parts: Sequence[Union[str, _core.LockPart]],
        *,
        wait: Optional[float] = None,
        on_lost: Optional[OnLost] = None,
    ) -> list[Grant]:
        """Takes every lock of ``parts`` in this session at once, or none (see
        :meth:`Client.acquire_all`): one :class:`Grant` per lock, in the order named, each
        released on its own."""
        if self.ended is not None:
            raise errors.SessionLost(self.ended)
        results = self._client.acquire_all(self.credential, parts, wait=wait)
        return self._adopt(results, on_lost)

    def _adopt(self, results: list[AcquireResult], on_lost: Optional[OnLost]) -> list[Grant]:
        """The grants of ``results``, taken in this session: lost at once if it has ended."""
        grants = [Grant(self, result, on_lost) for result in results]
        with self._mutex:
            ended = self.ended
            if ended is None:
                self._grants.extend(grants)
        if ended is not None:
            for grant in grants:
                grant._mark_lost(ended)
        return grants

    @contextlib.contextmanager
    def lock(
        self,
        name: str,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        on_lost: Optional[OnLost] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> Iterator[Grant]:
        """Holds lock ``name`` for the ``with`` block, releasing it on exit."""
        grant = self.acquire(name, wait=wait, value=value, on_lost=on_lost, shared=shared, permits=permits)
        try:
            yield grant
        finally:
            if not grant.released and not grant.lost.is_set():
                try:
                    grant.release()
                except errors.PalisadeError as error:
                    log.debug("releasing lock %r failed: %s", name, error)
            grant.released = True

    def _forget(self, grant: Grant) -> None:
        with self._mutex:
            if grant in self._grants:
                self._grants.remove(grant)

    def close(self) -> None:
        """Ends the session: stops the keepalive, releases every lock, withdraws every wait.
        After a loss for want of a proven lease, this is what gives the locks up."""
        self._stopping.set()
        self._events.put(("stop", 0, None))
        earlier = self._end(errors.LOST_CLOSED)
        if earlier == errors.LOST_NOT_FOUND:
            raise errors.SessionNotFound(f"session {self.id} does not exist (it had already expired or been closed)")
        if earlier == errors.LOST_CLOSED:
            return
        self._client.close_session(self.credential)

    # --- the keepalive -----------------------------------------------------------------------

    def _end(self, reason: str) -> Optional[str]:
        """Marks the session ended unless it already is; returns the earlier end if there was one."""
        with self._mutex:
            earlier = self.ended
            if earlier is not None:
                return earlier
            self.ended = reason
            grants = list(self._grants)
            self._grants.clear()
        self.lost.set()
        for grant in grants:
            grant._mark_lost(reason)
        return None

    def _keepalive(self) -> None:
        """The thread that drives the keepalive engine (:mod:`palisade._keepalive`): it feeds the
        engine what the stream and the ``Renew`` calls answer and performs what it returns."""
        stream: Optional[_KeepaliveStream] = None
        streams = 0
        event: ka.Event = ka.Start()
        try:
            while True:
                with self._mutex:
                    actions = self._engine.on(event, _core.monotonic_ms())
                    wake = self._engine.wake
                following: Optional[ka.Event] = None
                for action in actions:
                    if isinstance(action, ka.OpenStream):
                        streams += 1
                        stream = _KeepaliveStream(self, streams)
                    elif isinstance(action, ka.SendPing) and stream is not None:
                        stream.ping()
                    elif isinstance(action, ka.CloseStream) and stream is not None:
                        stream.close()
                        if action.reason == "stuck":
                            log.debug("keepalive stream of session %d is stuck; moving on from its endpoint", self.id)
                            failure = Failure(Failure.UNKNOWN, "the keepalive stream is stuck")
                            self._client._endpoints.after_failure(stream.generation, failure)
                        stream = None
                    elif isinstance(action, ka.Renew):
                        following = self._renew_once(action.until)
                    elif isinstance(action, ka.Lost):
                        if self._end(action.reason) is None:
                            log.info("session %d lost: %s", self.id, errors.describe_lost(action.reason))
                    elif isinstance(action, ka.Stop):
                        return
                    # Pause: nothing to do but wait; CancelRenew: the blocking Renew is over.
                if following is not None:
                    event = following
                    continue
                if self._stopping.is_set() or self._client._closed:
                    return
                event, stream = self._next_event(stream, wake)
        except _Stopped:
            return
        except Exception:  # never die silently: the session is lost as far as we can tell
            log.exception("keepalive of session %d failed", self.id)
            self._end(errors.LOST_LEASE_UNPROVEN)
        finally:
            if stream is not None:
                stream.close()

    def _next_event(
        self, stream: Optional["_KeepaliveStream"], wake: Optional[int]
    ) -> tuple[ka.Event, Optional["_KeepaliveStream"]]:
        """The next event of the open stream, or a tick at ``wake``; the stream, or ``None`` once
        it ended. Raises :class:`_Stopped` when the session is closed."""
        while True:
            timeout = None if wake is None else max(0, wake - _core.monotonic_ms()) / 1000
            try:
                kind, number, payload = self._events.get(timeout=timeout)
            except queue.Empty:
                return ka.Tick(), stream
            if kind == "stop":
                raise _Stopped()
            if stream is None or number != stream.number:
                continue  # from a stream closed earlier
            event = _core.stream_event(kind, payload, self.id, self._client._endpoints, stream.generation)
            if event is None:
                continue
            if kind in ("opened", "ack"):
                return event, stream
            stream.close()
            return event, None

    def _renew_once(self, until: Optional[int]) -> ka.Event:
        """One ``Renew``, for a connection with no keepalive stream to spare; it may take only
        until ``until`` (the lease deadline), retries included."""
        within = None if until is None else max(0, until - _core.monotonic_ms()) / 1000
        try:
            remaining = self._client._renew(self.credential, within)
        except errors.SessionNotFound:
            return ka.SessionGone()
        except errors.PalisadeError as error:
            log.debug("renewal of session %d by Renew failed: %s", self.id, error)
            return ka.RenewFailed()
        return ka.RenewAnswered(round(remaining * 1000))


class _Stopped(Exception):
    """The session was closed: its keepalive thread ends."""


class _KeepaliveStream:
    """One keepalive stream of a blocking session: its pings go through a queue, and a reader
    thread hands its answers and its end to the session's keepalive thread."""

    def __init__(self, session: Session, number: int) -> None:
        self.number = number
        self._ping = _core.keep_alive_request(session.id, session.credential.secret)
        self._pings: "queue.Queue[Optional[pb.KeepAliveRequest]]" = queue.Queue()
        self._pings.put(self._ping)  # the first ping goes out with the stream
        current = session._client._endpoints.current()
        self.generation = current.generation
        pings = self._pings

        def requests() -> Iterator[pb.KeepAliveRequest]:
            while (item := pings.get()) is not None:
                yield item

        self._call = current.stub.KeepAlive(requests())
        events = session._events
        call = self._call

        def read() -> None:
            try:
                call.initial_metadata()  # the headers, or the end of a refused stream
                events.put(("opened", number, None))
                for ack in call:
                    events.put(("ack", number, ack))
                events.put(("end", number, Failure(Failure.NOT_APPLIED, "the keepalive stream ended")))
            except grpc.RpcError as error:
                events.put(("error", number, _core.failure_from_rpc_error(error)))
            except Exception as error:  # the channel was closed under us
                events.put(("error", number, Failure(Failure.NOT_APPLIED, str(error))))

        threading.Thread(target=read, name=f"palisade-keepalive-read-{session.id}", daemon=True).start()

    def ping(self) -> None:
        self._pings.put(self._ping)

    def close(self) -> None:
        self._pings.put(None)
        self._call.cancel()


def _check_interval(interval: Any) -> None:
    """A keepalive interval: ``None`` (a third of the ttl) or seconds, at least 10 ms."""
    if interval is None:
        return
    if isinstance(interval, bool) or not isinstance(interval, (int, float)) or not 0.01 <= interval <= 86_400:
        raise errors.InvalidArgument(f"keepalive_interval is None or seconds in 0.01..=86400, not {interval!r}")
