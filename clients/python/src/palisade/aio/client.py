"""The asyncio client, on ``grpc.aio``: :class:`Client`, :class:`Session`, :class:`Grant` and
:class:`LockEvents`, as :mod:`palisade.client` is for the blocking API.

The session's keepalive is a task on the running loop that drives the same engine as the
blocking session's thread (:mod:`palisade._keepalive`). Endpoints, retries, request ids and
errors are shared with the blocking client (:mod:`palisade._core`, :mod:`palisade.errors`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence, TypeVar, Union

import grpc
import grpc.aio

from .. import _core, errors
from .. import _keepalive as ka
from .._core import Failure
from .._proto import palisade_pb2 as pb
from .._proto import palisade_pb2_grpc as pb_grpc
from ..client import (
    AcquireResult,
    LockEvent,
    LockStatus,
    SessionCredential,
    _check_interval,
    lock_event,
    lock_status,
)
from ..sequencer import KeySet, PublicKey
from ..tls import Tls

log = logging.getLogger("palisade")

OnLost = Callable[["Grant", str], Union[None, Awaitable[None]]]
T = TypeVar("T")


def _failure(error: BaseException) -> Failure:
    if isinstance(error, grpc.aio.AioRpcError):
        return _core.failure_from_status(error.code(), error.details(), error.trailing_metadata())
    if isinstance(error, asyncio.TimeoutError):
        return Failure(Failure.UNKNOWN, "no answer in time")
    return Failure(Failure.UNKNOWN, str(error))


class Client:
    """An asyncio connection to the lock service; make one with :meth:`Client.connect`."""

    def __init__(
        self,
        channels: dict[str, grpc.aio.Channel],
        endpoints: _core.Endpoints[_core.AuthorizedStub],
        request_timeout: float,
        retry_budget: float,
    ) -> None:
        self._channels = channels
        self._endpoints = endpoints
        self.request_timeout = request_timeout
        self.retry_budget = retry_budget

    @staticmethod
    async def connect(
        endpoints: Union[Sequence[str], str],
        *,
        token: Union[str, _core.BearerToken, None] = None,
        tls: Optional[Tls] = None,
        connect_timeout: float = 5.0,
        request_timeout: float = 10.0,
        retry_budget: float = 10.0,
    ) -> "Client":
        """Connects to the first of ``endpoints`` (``host:port``, at most 16) that accepts a
        connection; the others connect when first used. ``token``: the bearer token every call
        carries, else ``$PALISADE_AUTH_TOKEN`` if set; ``tls``: a :class:`palisade.Tls` for TLS to
        every endpoint (see :class:`palisade.Client`)."""
        if tls is not None and not isinstance(tls, Tls):
            raise errors.Misconfigured(f"tls is a palisade.Tls, not {type(tls).__name__}")
        credentials = None if tls is None else tls.credentials()
        targets = _core.parse_endpoints(endpoints, tls is not None)
        bearer = _core.bearer_token(token)
        for name, value in (
            ("connect_timeout", connect_timeout),
            ("request_timeout", request_timeout),
            ("retry_budget", retry_budget),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 3600:
                raise errors.InvalidArgument(f"{name} is seconds in (0, 3600], not {value!r}")
        channels: dict[str, grpc.aio.Channel] = {}

        def channel(target: str) -> grpc.aio.Channel:
            if target not in channels:
                if credentials is None:
                    channels[target] = grpc.aio.insecure_channel(target, options=_core.CHANNEL_OPTIONS)
                else:
                    channels[target] = grpc.aio.secure_channel(target, credentials, options=_core.CHANNEL_OPTIONS)
            return channels[target]

        failures = []
        first = None
        for index, target in enumerate(targets):
            try:
                await asyncio.wait_for(channel(target).channel_ready(), connect_timeout)
            except asyncio.TimeoutError:
                try:  # what gRPC knows of why: refused, a failed handshake, ...
                    await pb_grpc.LocksStub(channel(target)).PublicKey(
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
            for ch in channels.values():
                await ch.close()
            raise _core.unreachable(targets, failures, tls)
        endpoints_ = _core.Endpoints(
            targets, first, lambda t: _core.AuthorizedStub(pb_grpc.LocksStub(channel(t)), bearer), tls=tls is not None
        )
        return Client(channels, endpoints_, request_timeout, retry_budget)

    @property
    def endpoint(self) -> str:
        return self._endpoints.current().target

    async def close(self) -> None:
        for channel in list(self._channels.values()):
            await channel.close()

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()

    async def _call(self, method: str, request: Any, what: str) -> Any:
        async def attempt(stub: Any) -> Any:
            if callable(request):
                message, timeout = request()
            else:
                message, timeout = request, self.request_timeout
            return await getattr(stub, method)(message, timeout=timeout)

        return (await self._run(attempt, what))[0]

    async def _run(self, attempt: Callable[[Any], Awaitable[Any]], what: str) -> tuple[Any, int]:
        """``await attempt(stub)`` at the current endpoint, retried within the budget; returns
        its result and the generation of the endpoint that gave it."""
        retry = _core.Retry(self.retry_budget)
        while True:
            current = self._endpoints.current()
            try:
                return await attempt(current.stub), current.generation
            except grpc.aio.AioRpcError as error:
                failure = _failure(error)
            self._endpoints.after_failure(current.generation, failure)
            step = retry.after(failure)
            if isinstance(step, Failure):
                raise step.error(what) from None
            if step is not _core.Retry.AT_ONCE:
                await asyncio.sleep(step)

    # --- sessions and locks ------------------------------------------------------------------

    async def session(self, ttl: float = 10.0, *, keepalive_interval: Optional[float] = None) -> "Session":
        """Opens a session kept alive by a task on the running loop until it is closed."""
        _check_interval(keepalive_interval)
        credential, granted, first_sent_at = await self._open_session(ttl)
        return Session(self, credential, granted, first_sent_at, keepalive_interval)

    @contextlib.asynccontextmanager
    async def lock(
        self,
        name: str,
        ttl: float = 10.0,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        on_lost: Optional[OnLost] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> AsyncIterator["Grant"]:
        """Holds lock ``name`` for the ``async with`` block, in a session of its own (see
        :meth:`palisade.Client.lock`)."""
        _core.wire_value(value)  # refused before a session is opened
        _core.acquire_mode(shared, permits)
        session = await self.session(ttl)
        try:
            async with session.lock(
                name, wait=wait, value=value, on_lost=on_lost, shared=shared, permits=permits
            ) as grant:
                yield grant
        finally:
            try:
                await session.close()
            except errors.PalisadeError as error:
                log.debug("closing the session of lock %r failed: %s", name, error)

    async def _open_session(self, ttl: float) -> tuple[SessionCredential, float, float]:
        request = pb.OpenSessionRequest(ttl_ms=_core.ttl_ms(ttl), open_key=_core.open_key())
        first_sent_at = time.monotonic()
        response = await self._call("OpenSession", request, "opening a session")
        session, secret, granted = _core.check_open(response)
        return SessionCredential(session, secret), granted, first_sent_at

    async def open_session_without_keepalive(self, ttl: float) -> tuple[SessionCredential, float]:
        credential, granted, _ = await self._open_session(ttl)
        return credential, granted

    async def renew(self, credential: SessionCredential) -> float:
        response: pb.KeepAliveResponse = await self._call(
            "Renew", _core.keep_alive_request(credential.id, credential.secret), f"renewal of session {credential.id}"
        )
        if response.session != credential.id:
            raise errors.ProtocolError(f"renewal of session {credential.id} answered for session {response.session}")
        return response.ttl_remaining_ms / 1000

    async def close_session(self, credential: SessionCredential) -> None:
        await self._call(
            "CloseSession",
            pb.CloseSessionRequest(session=credential.id, session_secret=credential.secret),
            f"closing session {credential.id}",
        )

    async def acquire(
        self,
        credential: SessionCredential,
        lock: str,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> AcquireResult:
        """See :meth:`palisade.Client.acquire`."""
        attempts = _core.AcquireAttempts(
            credential,
            lock,
            self.request_timeout,
            wait=wait,
            value=value,
            shared=shared,
            permits=permits,
        )
        response = await self._call("Acquire", attempts, f"acquire of lock {lock!r} in session {credential.id}")
        access = _core.check_grant(response, credential.id, lock)
        return AcquireResult(response.lock, response.session, response.token, response.sequencer, access)

    async def release_then_acquire(
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
        """See :meth:`palisade.Client.release_then_acquire`."""
        acquire = _core.AcquireAttempts(
            credential,
            lock,
            self.request_timeout,
            wait=wait,
            value=value,
            shared=shared,
            permits=permits,
        )
        return await self._release_then_acquire(credential, release, acquire)

    async def _release_then_acquire(
        self, credential: SessionCredential, release: str, acquire: _core.AcquireAttempts
    ) -> tuple[Optional[int], AcquireResult]:
        """:meth:`release_then_acquire` of an acquire whose arguments are checked already."""
        lock = acquire.lock
        response = await self._call(
            "ReleaseThenAcquire",
            acquire.after_release(release),
            f"release of lock {release!r} then acquire of lock {lock!r} in session {credential.id}",
        )
        released, access = _core.check_handoff(response, credential.id, release, lock)
        grant = response.grant
        return released, AcquireResult(grant.lock, grant.session, grant.token, grant.sequencer, access)

    async def acquire_all(
        self,
        credential: SessionCredential,
        parts: Sequence[Union[str, _core.LockPart]],
        *,
        wait: Optional[float] = None,
    ) -> list[AcquireResult]:
        """See :meth:`palisade.Client.acquire_all`."""
        wire_parts = _core.acquire_parts(parts)
        locks = [part.lock for part in wire_parts]
        window = _core.WaitWindow.start(wait)
        request_id = _core.request_id()

        def attempt() -> tuple[pb.AcquireAllRequest, Optional[float]]:
            wait_fields, timeout = window.attempt(self.request_timeout)
            message = pb.AcquireAllRequest(
                session=credential.id,
                request_id=request_id,
                **wait_fields,
                session_secret=credential.secret,
                parts=wire_parts,
            )
            return message, timeout

        response = await self._call("AcquireAll", attempt, f"acquire of locks {locks!r} in session {credential.id}")
        access = _core.check_grants(response, credential.id, locks)
        return [
            AcquireResult(grant.lock, grant.session, grant.token, grant.sequencer, each)
            for grant, each in zip(response.grants, access)
        ]

    async def release(self, credential: SessionCredential, lock: str) -> Optional[int]:
        _core.validate_lock_name(lock)
        request = pb.ReleaseRequest(
            session=credential.id, lock=lock, request_id=_core.request_id(), session_secret=credential.secret
        )
        response = await self._call("Release", request, f"release of lock {lock!r} by session {credential.id}")
        return _core.released_token(response, "token", lock)

    async def proclaim(self, credential: SessionCredential, lock: str, token: int, value: Optional[str]) -> None:
        """See :meth:`palisade.Client.proclaim`."""
        _core.validate_lock_name(lock)
        wire_value = _core.wire_value(value)
        if isinstance(token, bool) or not isinstance(token, int) or not 0 < token < 1 << 64:
            raise errors.InvalidArgument(f"a token is a positive 64-bit int, not {token!r}")
        request = pb.ProclaimRequest(
            session=credential.id, lock=lock, token=token, value=wire_value, session_secret=credential.secret
        )
        await self._call("Proclaim", request, f"proclaim on lock {lock!r} by session {credential.id}")

    async def watch(self, lock: str) -> "LockEvents":
        """Follows ``lock``: an async iterator of :class:`palisade.LockEvent` (see
        :meth:`palisade.Client.watch`), opened before it returns."""
        _core.validate_lock_name(lock)
        events = LockEvents(self, lock)
        await events._open()
        return events

    async def _open_watch(self, lock: str) -> tuple[Any, pb.WatchEvent, int]:
        request = pb.WatchRequest(lock=lock)

        async def attempt(stub: Any) -> tuple[Any, pb.WatchEvent]:
            call = stub.Watch(request)  # no deadline: a watch lasts
            try:
                first = await call.read()
            except BaseException:
                call.cancel()
                raise
            if first is grpc.aio.EOF:
                raise errors.ProtocolError(f"watch of lock {lock!r} ended before its snapshot")
            return call, first

        (call, first), generation = await self._run(attempt, f"watch of lock {lock!r}")
        return call, first, generation

    async def status(self, lock: str, *, stale: bool = False) -> LockStatus:
        _core.validate_lock_name(lock)
        info = await self._call("Status", pb.StatusRequest(lock=lock, stale=stale), f"status of lock {lock!r}")
        status = lock_status(info)
        if status.lock != lock:
            raise errors.ProtocolError(f"status of lock {lock!r} answered for lock {status.lock!r}")
        return status

    async def list_locks(self, prefix: str = "", *, stale: bool = False) -> list[LockStatus]:
        """Every lock whose name starts with ``prefix``, in name order (follows pagination)."""
        if len(prefix.encode()) > _core.LOCK_NAME_BYTES_MAX:
            raise errors.InvalidArgument(f"a prefix is at most {_core.LOCK_NAME_BYTES_MAX} bytes")
        locks: list[LockStatus] = []
        start_after = ""
        for _ in range(_core.LIST_PAGES_MAX):
            page = await self._call(
                "ListLocks",
                pb.ListLocksRequest(prefix=prefix, start_after=start_after, stale=stale),
                f"list of locks under {prefix!r}",
            )
            for info in page.locks:
                status = lock_status(info)
                in_order = (not locks or locks[-1].lock < status.lock) and (not start_after or start_after < status.lock)
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

    async def public_keys(self) -> KeySet:
        response = await self._call("PublicKey", pb.PublicKeyRequest(), "reading the public keys")
        try:
            signing = PublicKey.parse(response.public_key)
            published = KeySet.parse(",".join(response.public_keys)) if response.public_keys else KeySet([signing])
        except ValueError as error:
            raise errors.ProtocolError(f"the lock service published an invalid key: {error}") from None
        if published.get(signing.key_id) is None:
            raise errors.ProtocolError(f"the signing key {signing} is not among the published keys {published}")
        return published


class LockEvents:
    """The events of one lock, from :meth:`Client.watch`: an async iterator of
    :class:`palisade.LockEvent` that reopens its stream as :class:`palisade.client.LockEvents`
    does."""

    def __init__(self, client: Client, lock: str) -> None:
        self._client = client
        self.lock = lock
        self._closed = False
        self._call: Any = None
        self._pending: Optional[pb.WatchEvent] = None
        self._generation = 0

    async def _open(self) -> None:
        call, first, self._generation = await self._client._open_watch(self.lock)
        if self._closed:
            call.cancel()
            return
        self._call, self._pending = call, first

    def __aiter__(self) -> "LockEvents":
        return self

    async def __anext__(self) -> LockEvent:
        while True:
            if self._closed or self._call is None:
                raise StopAsyncIteration
            if self._pending is not None:
                event, self._pending = self._pending, None
                return lock_event(self.lock, event)
            try:
                raw = await self._call.read()
            except grpc.aio.AioRpcError as error:
                if self._closed:
                    raise StopAsyncIteration from None
                failure = _failure(error)
            except asyncio.CancelledError:
                # close() cancels the call: the read ends with CancelledError in this task, which
                # is the end of the events unless the task itself is being cancelled.
                cancelling = getattr(asyncio.current_task(), "cancelling", None)  # 3.11+
                if self._closed and not (cancelling is not None and cancelling()):
                    raise StopAsyncIteration from None
                raise
            else:
                if raw is grpc.aio.EOF:
                    self._call = None
                    raise StopAsyncIteration
                return lock_event(self.lock, raw)
            self._call = None
            if failure.kind not in (Failure.NOT_APPLIED, Failure.NOT_LEADER, Failure.UNKNOWN):
                raise failure.error(f"watch of lock {self.lock!r}")
            log.debug("watch of lock %r failed (%s); reopening", self.lock, failure.message)
            self._client._endpoints.after_failure(self._generation, failure)
            await self._open()

    async def close(self) -> None:
        """Ends the stream."""
        self._closed = True
        call = self._call
        if call is not None:
            call.cancel()

    async def __aenter__(self) -> "LockEvents":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.close()


class Grant:
    """One grant of a lock; ``lost`` is an :class:`asyncio.Event` (see :class:`palisade.Grant`)."""

    def __init__(self, session: "Session", result: AcquireResult, on_lost: Optional[OnLost]) -> None:
        self.lock = result.lock
        self.token = result.token
        self.sequencer = result.sequencer
        self.session_id = result.session
        self.access = result.access
        self.slot = result.access.slot
        self.lost = asyncio.Event()
        self.lost_reason: Optional[str] = None
        self.released = False
        self._session = session
        self._on_lost = on_lost

    async def _mark_lost(self, reason: str) -> None:
        if self.released or self.lost.is_set():
            return
        self.lost_reason = reason
        self.lost.set()
        if self._on_lost is not None and reason != errors.LOST_CLOSED:
            try:
                result = self._on_lost(self, reason)
                if asyncio.iscoroutine(result):
                    await result
            except Exception:
                log.exception("on_lost callback of lock %r failed", self.lock)

    async def proclaim(self, value: Optional[str]) -> None:
        """See :meth:`palisade.Grant.proclaim`."""
        await self._session._client.proclaim(self._session.credential, self.lock, self.token, value)

    async def release(self) -> None:
        if self.released:
            return
        self._finish()
        token = await self._session._client.release(self._session.credential, self.lock)
        _core.check_released("release of", self.lock, self.token, token)

    async def release_then_acquire(
        self,
        name: str,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        on_lost: Optional[OnLost] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> "Grant":
        """Gives this lock up and takes lock ``name`` in one call, returning the new grant; this
        grant is finished either way (see :meth:`palisade.Grant.release_then_acquire`). If the
        session is lost while it waits, :class:`errors.SessionLost` is raised."""
        if self.released:
            raise errors.NotHolder(
                f"handoff from lock {self.lock!r}: its grant with token {self.token} was released already"
            )
        session = self._session
        client = session._client
        acquire = _core.AcquireAttempts(  # invalid arguments are refused before the grant ends
            session.credential,
            name,
            client.request_timeout,
            wait=wait,
            value=value,
            shared=shared,
            permits=permits,
        )
        self._finish()
        released, result = await session._unless_lost(
            client._release_then_acquire(session.credential, self.lock, acquire)
        )
        (grant,) = await session._adopt([result], on_lost)
        try:
            _core.check_released("handoff from", self.lock, self.token, released)
        except errors.ProtocolError:
            with contextlib.suppress(errors.PalisadeError):
                await grant.release()
            raise
        return grant

    def _finish(self) -> None:
        """See :meth:`palisade.Grant._finish`."""
        self.released = True
        self._session._forget(self)
        if self.lost.is_set():
            raise errors.SessionLost(self.lost_reason or errors.LOST_CLOSED)


class Session:
    """A session kept alive by a task on the running loop until :meth:`close`."""

    def __init__(
        self,
        client: Client,
        credential: SessionCredential,
        ttl: float,
        first_sent_at: float,
        keepalive_interval: Optional[float],
    ) -> None:
        self._client = client
        self.credential = credential
        self.id = credential.id
        self.ttl = ttl
        self._engine = _core.keepalive_engine(ttl, keepalive_interval, first_sent_at)
        self.ended: Optional[str] = None
        self.lost = asyncio.Event()
        self._grants: list[Grant] = []
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._keepalive(), name=f"palisade-keepalive-{self.id}")

    def lease_remaining(self) -> Optional[float]:
        deadline = self._engine.lease_deadline
        if self.ended is not None or deadline is None:
            return None
        return max(0.0, deadline / 1000 - time.monotonic())

    async def acquire(
        self,
        name: str,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        on_lost: Optional[OnLost] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> Grant:
        if self.ended is not None:
            raise errors.SessionLost(self.ended)
        _core.validate_lock_name(name)
        _core.wire_value(value)
        _core.acquire_mode(shared, permits)
        result = await self._unless_lost(
            self._client.acquire(self.credential, name, wait=wait, value=value, shared=shared, permits=permits)
        )
        (grant,) = await self._adopt([result], on_lost)
        return grant

    async def acquire_all(
        self,
        parts: Sequence[Union[str, _core.LockPart]],
        *,
        wait: Optional[float] = None,
        on_lost: Optional[OnLost] = None,
    ) -> list[Grant]:
        """See :meth:`palisade.Session.acquire_all`."""
        if self.ended is not None:
            raise errors.SessionLost(self.ended)
        _core.acquire_parts(parts)
        results = await self._unless_lost(self._client.acquire_all(self.credential, parts, wait=wait))
        return await self._adopt(results, on_lost)

    async def _unless_lost(self, call: Awaitable[T]) -> T:
        """What ``call`` (an acquire) returns, unless the session is lost first: then the call
        is cancelled and :class:`errors.SessionLost` raised."""
        acquire = asyncio.ensure_future(call)
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({acquire, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if not acquire.done():
            acquire.cancel()
            raise errors.SessionLost(self.ended or errors.LOST_CLOSED)
        return acquire.result()

    async def _adopt(self, results: list[AcquireResult], on_lost: Optional[OnLost]) -> list[Grant]:
        """The grants of ``results``, taken in this session: lost at once if it has ended."""
        grants = [Grant(self, result, on_lost) for result in results]
        for grant in grants:
            if self.ended is not None:
                await grant._mark_lost(self.ended)
            else:
                self._grants.append(grant)
        return grants

    @contextlib.asynccontextmanager
    async def lock(
        self,
        name: str,
        *,
        wait: Optional[float] = None,
        value: Optional[str] = None,
        on_lost: Optional[OnLost] = None,
        shared: bool = False,
        permits: Optional[int] = None,
    ) -> AsyncIterator[Grant]:
        grant = await self.acquire(name, wait=wait, value=value, on_lost=on_lost, shared=shared, permits=permits)
        try:
            yield grant
        finally:
            if not grant.released and not grant.lost.is_set():
                try:
                    await grant.release()
                except errors.PalisadeError as error:
                    log.debug("releasing lock %r failed: %s", name, error)
            grant.released = True

    def _forget(self, grant: Grant) -> None:
        if grant in self._grants:
            self._grants.remove(grant)

    async def close(self) -> None:
        """Ends the session: stops the keepalive, releases every lock, withdraws every wait."""
        self._stop.set()
        # Cancelled until it ends: before Python 3.12 asyncio.wait_for loses a cancel that lands
        # in the step its inner future finishes in, and the keepalive would run on.
        while not self._task.done():
            self._task.cancel()
            await asyncio.wait({self._task}, timeout=0.1)
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await self._task
        earlier = await self._end(errors.LOST_CLOSED)
        if earlier == errors.LOST_NOT_FOUND:
            raise errors.SessionNotFound(f"session {self.id} does not exist (it had already expired or been closed)")
        if earlier == errors.LOST_CLOSED:
            return
        await self._client.close_session(self.credential)

    async def _end(self, reason: str) -> Optional[str]:
        if self.ended is not None:
            return self.ended
        self.ended = reason
        grants, self._grants = self._grants, []
        self.lost.set()
        for grant in grants:
            await grant._mark_lost(reason)
        return None

    async def _keepalive(self) -> None:
        """The task that drives the keepalive engine (:mod:`palisade._keepalive`): it feeds the
        engine what the stream and the ``Renew`` calls answer and performs what it returns."""
        events: asyncio.Queue[tuple[str, int, Any]] = asyncio.Queue()
        stream: Optional[_KeepaliveStream] = None
        renewal: Optional[asyncio.Task[None]] = None
        number = 0  # of the stream or Renew call whose events are taken
        event: ka.Event = ka.Start()
        try:
            while True:
                for action in self._engine.on(event, _core.monotonic_ms()):
                    if isinstance(action, ka.OpenStream):
                        number += 1
                        stream = _KeepaliveStream(self, number, events)
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
                        number += 1
                        renewal = asyncio.ensure_future(self._renew_once(number, events))
                    elif isinstance(action, ka.CancelRenew) and renewal is not None:
                        renewal.cancel()
                        renewal = None
                    elif isinstance(action, ka.Lost):
                        if await self._end(action.reason) is None:
                            log.info("session %d lost: %s", self.id, errors.describe_lost(action.reason))
                    elif isinstance(action, ka.Stop):
                        return
                    # Pause: nothing to do but wait.
                event, stream = await self._next_event(events, number, stream, self._engine.wake)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("keepalive of session %d failed", self.id)
            await self._end(errors.LOST_LEASE_UNPROVEN)
        finally:
            if stream is not None:
                stream.close()
            if renewal is not None:
                renewal.cancel()

    async def _next_event(
        self,
        events: asyncio.Queue[tuple[str, int, Any]],
        number: int,
        stream: Optional["_KeepaliveStream"],
        wake: Optional[int],
    ) -> tuple[ka.Event, Optional["_KeepaliveStream"]]:
        """The next event of stream or Renew call ``number``, or a tick at ``wake``; the stream,
        or ``None`` once it ended."""
        while True:
            timeout = None if wake is None else max(0, wake - _core.monotonic_ms()) / 1000
            try:
                kind, of, payload = await asyncio.wait_for(events.get(), timeout)
            except asyncio.TimeoutError:
                return ka.Tick(), stream
            if of != number:
                continue  # from a stream closed, or a call abandoned, earlier
            if kind == "renewed":
                return payload, stream
            if stream is None:
                continue
            event = _core.stream_event(kind, payload, self.id, self._client._endpoints, stream.generation)
            if event is None:
                continue
            if kind in ("opened", "ack"):
                return event, stream
            stream.close()
            return event, None

    async def _renew_once(self, number: int, events: asyncio.Queue[tuple[str, int, Any]]) -> None:
        """One ``Renew``, for a connection with no keepalive stream to spare; the engine cancels
        it at the lease deadline."""
        event: ka.Event
        try:
            event = ka.RenewAnswered(round(await self._client.renew(self.credential) * 1000))
        except errors.SessionNotFound:
            event = ka.SessionGone()
        except errors.PalisadeError as error:
            log.debug("renewal of session %d by Renew failed: %s", self.id, error)
            event = ka.RenewFailed()
        events.put_nowait(("renewed", number, event))


class _KeepaliveStream:
    """One keepalive stream of an asyncio session. A writer task sends its pings in order, the
    first once the server's headers came: a write to a stream the server has refused fails, and
    grpc.aio then replaces the server's status (RESOURCE_EXHAUSTED, which sends the session to
    Renew) by INTERNAL if it has not arrived yet (grpc/grpc#36066). A reader task hands the
    answers and the stream's end to the keepalive task."""

    def __init__(self, session: Session, number: int, events: asyncio.Queue[tuple[str, int, Any]]) -> None:
        current = session._client._endpoints.current()
        self.generation = current.generation
        self._call = call = current.stub.KeepAlive()
        ping = _core.keep_alive_request(session.id, session.credential.secret)
        self._pings: asyncio.Queue[None] = asyncio.Queue()
        self._pings.put_nowait(None)  # the first ping goes out with the stream
        pings = self._pings

        async def write() -> None:
            # Through a task of its own, so that the reader's task runs first: it takes a
            # refusal's status before a write can spoil it.
            await asyncio.ensure_future(call.initial_metadata())
            events.put_nowait(("opened", number, None))
            while True:
                await pings.get()
                # Not to a call that is over (a refusal comes with the headers): its reader
                # reports how it ended.
                if call.done():
                    return
                # A write waits for the stream's flow control; the engine finds a stream that
                # takes no more writes stuck, and closes it.
                await call.write(ping)

        async def read() -> None:
            try:
                async for ack in call:
                    events.put_nowait(("ack", number, ack))
                events.put_nowait(("end", number, Failure(Failure.NOT_APPLIED, "the keepalive stream ended")))
            except asyncio.CancelledError:
                raise
            except BaseException as error:  # noqa: BLE001 - every failure ends the stream
                events.put_nowait(("error", number, _failure(error)))

        async def quietly(work: Callable[[], Awaitable[None]]) -> None:
            # A failed write ends nothing by itself: the call is over, and the reader reports
            # how (a refused stream's status comes from the reader).
            with contextlib.suppress(Exception):
                await work()

        self._tasks = [asyncio.ensure_future(read()), asyncio.ensure_future(quietly(write))]

    def ping(self) -> None:
        self._pings.put_nowait(None)

    def close(self) -> None:
        self._call.cancel()
        for task in self._tasks:
            task.cancel()


