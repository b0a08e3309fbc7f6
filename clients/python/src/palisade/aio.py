"""The asyncio client, on ``grpc.aio``: the blocking API's rules with ``await``.

    from palisade import aio

    client = await aio.Client.connect(["127.0.0.1:7457"])
    async with client.lock("jobs/nightly", ttl=10) as grant:
        print(grant.token, grant.sequencer)
        # grant.lost is an asyncio.Event, set if the session is lost

The session's keepalive is a task on the running loop: the same stream, proven lease, stuck
stream detection and fallback to unary ``Renew`` as :class:`palisade.Session`. Endpoints, retries,
request ids and errors are shared with the blocking client (:mod:`palisade._core`,
:mod:`palisade.errors`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Awaitable, Callable, Optional, Sequence, Union

import grpc
import grpc.aio

from . import _core, errors
from ._core import Failure
from ._proto import palisade_pb2 as pb
from ._proto import palisade_pb2_grpc as pb_grpc
from .client import AcquireResult, LockStatus, SessionCredential, _check_interval, _session_gone, lock_status
from .sequencer import KeySet, PublicKey

log = logging.getLogger("palisade")

OnLost = Callable[["Grant", str], Union[None, Awaitable[None]]]


def _failure(error: BaseException) -> Failure:
    if isinstance(error, grpc.aio.AioRpcError):
        return _core.failure_from_status(error.code(), error.details(), error.trailing_metadata())
    if isinstance(error, asyncio.TimeoutError):
        return Failure(Failure.UNKNOWN, "no answer in time")
    return Failure(Failure.UNKNOWN, str(error))


class Client:
    """An asyncio connection to the lock service; make one with :meth:`Client.connect`."""

    def __init__(self, channels: dict, endpoints: _core.Endpoints, request_timeout: float, retry_budget: float):
        self._channels = channels
        self._endpoints = endpoints
        self.request_timeout = request_timeout
        self.retry_budget = retry_budget

    @staticmethod
    async def connect(
        endpoints: Union[Sequence[str], str],
        *,
        token: Union[str, _core.BearerToken, None] = None,
        connect_timeout: float = 5.0,
        request_timeout: float = 10.0,
        retry_budget: float = 10.0,
    ) -> "Client":
        """Connects to the first of ``endpoints`` (``host:port``, at most 16) that accepts a
        connection; the others connect when first used. ``token``: the bearer token every call
        carries, else ``$PALISADE_AUTH_TOKEN`` if set (see :class:`palisade.Client`)."""
        targets = _core.parse_endpoints(endpoints)
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
                channels[target] = grpc.aio.insecure_channel(target, options=_core.CHANNEL_OPTIONS)
            return channels[target]

        failures = []
        first = None
        for index, target in enumerate(targets):
            try:
                await asyncio.wait_for(channel(target).channel_ready(), connect_timeout)
            except asyncio.TimeoutError:
                failures.append(f"{target}: no connection within {connect_timeout:g} s")
                continue
            first = index
            break
        if first is None:
            for ch in channels.values():
                await ch.close()
            raise errors.Unreachable(
                f"cannot connect to the lock service at {','.join(targets)}: {'; '.join(failures)}; "
                "is `palisade serve` running there?"
            )
        endpoints_ = _core.Endpoints(
            targets, first, lambda t: _core.AuthorizedStub(pb_grpc.LocksStub(channel(t)), bearer)
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
        retry = _core.Retry(self.retry_budget)
        while True:
            if callable(request):
                message, timeout = request()
            else:
                message, timeout = request, self.request_timeout
            current = self._endpoints.current()
            try:
                return await getattr(current.stub, method)(message, timeout=timeout)
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
        self, name: str, ttl: float = 10.0, *, wait: Optional[float] = None, on_lost: Optional[OnLost] = None
    ) -> AsyncIterator["Grant"]:
        """Holds lock ``name`` for the ``async with`` block, in a session of its own (see
        :meth:`palisade.Client.lock`)."""
        session = await self.session(ttl)
        try:
            async with session.lock(name, wait=wait, on_lost=on_lost) as grant:
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
        response = await self._call(
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

    async def acquire(self, credential: SessionCredential, lock: str, *, wait: Optional[float] = None) -> AcquireResult:
        _core.validate_lock_name(lock)
        wait_s = _core.wait_seconds(wait)
        request_id = _core.request_id()
        deadline = None if wait_s is None else time.monotonic() + wait_s

        def attempt() -> tuple[pb.AcquireRequest, Optional[float]]:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            message = pb.AcquireRequest(
                session=credential.id,
                lock=lock,
                request_id=request_id,
                wait_ms=0 if remaining is None else int(remaining * 1000),
                wait_forever=wait_s is None,
                session_secret=credential.secret,
            )
            return message, None if remaining is None else remaining + self.request_timeout

        response = await self._call("Acquire", attempt, f"acquire of lock {lock!r} in session {credential.id}")
        _core.check_grant(response, credential.id, lock)
        return AcquireResult(response.lock, response.session, response.token, response.sequencer)

    async def release(self, credential: SessionCredential, lock: str) -> Optional[int]:
        _core.validate_lock_name(lock)
        request = pb.ReleaseRequest(
            session=credential.id, lock=lock, request_id=_core.request_id(), session_secret=credential.secret
        )
        response = await self._call("Release", request, f"release of lock {lock!r} by session {credential.id}")
        if response.HasField("token") and response.token == 0:
            raise errors.ProtocolError(f"release of lock {lock!r} reported token 0")
        return response.token if response.HasField("token") else None

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


class Grant:
    """One grant of a lock; ``lost`` is an :class:`asyncio.Event` (see :class:`palisade.Grant`)."""

    def __init__(self, session: "Session", result: AcquireResult, on_lost: Optional[OnLost]) -> None:
        self.lock = result.lock
        self.token = result.token
        self.sequencer = result.sequencer
        self.session_id = result.session
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

    async def release(self) -> None:
        if self.released:
            return
        self.released = True
        self._session._forget(self)
        if self.lost.is_set():
            raise errors.SessionLost(self.lost_reason or errors.LOST_CLOSED)
        token = await self._session._client.release(self._session.credential, self.lock)
        if token != self.token:
            raise errors.ProtocolError(
                f"release of lock {self.lock!r} with token {self.token} ended "
                + ("a wait instead" if token is None else f"token {token}")
            )


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
        interval = ttl / 3 if keepalive_interval is None else keepalive_interval
        self._interval = min(max(float(interval), 0.01), ttl)
        self._lease_deadline = first_sent_at + _core.proven_lease(ttl)
        self.ended: Optional[str] = None
        self.lost = asyncio.Event()
        self._grants: list[Grant] = []
        self._stop = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(self._keepalive(), name=f"palisade-keepalive-{self.id}")

    def lease_remaining(self) -> Optional[float]:
        if self.ended is not None:
            return None
        return max(0.0, self._lease_deadline - time.monotonic())

    async def acquire(self, name: str, *, wait: Optional[float] = None, on_lost: Optional[OnLost] = None) -> Grant:
        if self.ended is not None:
            raise errors.SessionLost(self.ended)
        acquire = asyncio.ensure_future(self._client.acquire(self.credential, name, wait=wait))
        lost = asyncio.ensure_future(self.lost.wait())
        try:
            await asyncio.wait({acquire, lost}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            lost.cancel()
        if not acquire.done():
            acquire.cancel()
            raise errors.SessionLost(self.ended or errors.LOST_CLOSED)
        grant = Grant(self, acquire.result(), on_lost)
        if self.ended is not None:
            await grant._mark_lost(self.ended)
        else:
            self._grants.append(grant)
        return grant

    @contextlib.asynccontextmanager
    async def lock(self, name: str, *, wait: Optional[float] = None, on_lost: Optional[OnLost] = None) -> AsyncIterator[Grant]:
        grant = await self.acquire(name, wait=wait, on_lost=on_lost)
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
        self._task.cancel()
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
        try:
            reason = await self._until_lost(proving=True)
            if await self._end(reason) is None and reason != errors.LOST_CLOSED:
                log.info("session %d lost: %s", self.id, errors.describe_lost(reason))
            if reason == errors.LOST_LEASE_UNPROVEN:
                await self._until_lost(proving=False)
        except asyncio.CancelledError:
            raise
        except Exception:
            log.exception("keepalive of session %d failed", self.id)
            await self._end(errors.LOST_LEASE_UNPROVEN)

    def _proven(self, sent: float, remaining_s: float) -> None:
        proven = sent + _core.proven_lease(min(remaining_s, self.ttl))
        if self.ended is None and proven > self._lease_deadline:
            self._lease_deadline = proven

    async def _until_lost(self, proving: bool) -> str:
        backoff = _core.Backoff(self.ttl)
        while not self._stop.is_set():
            end = await self._one_stream(proving, backoff)
            if end is not None:
                return end
        return errors.LOST_CLOSED

    async def _get(self, events: asyncio.Queue, until: float) -> Optional[tuple[str, Any]]:
        try:
            return await asyncio.wait_for(events.get(), max(0.0, until - time.monotonic()))
        except asyncio.TimeoutError:
            return None

    async def _one_stream(self, proving: bool, backoff: _core.Backoff) -> Optional[str]:
        ping = _core.keep_alive_request(self.id, self.credential.secret)
        sent_at: collections.deque[float] = collections.deque()
        current = self._client._endpoints.current()
        call = current.stub.KeepAlive()
        events: asyncio.Queue = asyncio.Queue()

        async def read() -> None:
            try:
                async for ack in call:
                    events.put_nowait(("ack", ack))
                events.put_nowait(("end", None))
            except asyncio.CancelledError:
                raise
            except BaseException as error:  # noqa: BLE001 - every failure ends the stream
                events.put_nowait(("error", error))

        reader = asyncio.ensure_future(read())
        failure: Optional[Failure] = None
        next_ping = time.monotonic()
        try:
            while True:
                now = time.monotonic()
                if now >= next_ping:
                    if sent_at and now - sent_at[0] >= self._interval:
                        failure = Failure(Failure.UNKNOWN, "the keepalive stream is stuck")
                        break
                    sent_at.append(now)
                    try:
                        await call.write(ping)
                    except Exception as error:  # the stream failed; its reader reports why
                        failure = _failure(error)
                        event = await self._get(events, time.monotonic() + 0.5)
                        if event is not None and event[0] == "error":
                            failure = _failure(event[1])
                        if _session_gone(failure):
                            return errors.LOST_NOT_FOUND
                        if failure.code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                            return await self._renew_by_call(proving, backoff)
                        break
                    next_ping = now + self._interval
                deadline = self._lease_deadline if proving else None
                event = await self._get(events, next_ping if deadline is None else min(next_ping, deadline))
                if proving and time.monotonic() >= self._lease_deadline:
                    return errors.LOST_LEASE_UNPROVEN
                if event is None:
                    continue
                if event[0] == "ack":
                    if event[1].session == self.id and sent_at:
                        self._proven(sent_at.popleft(), event[1].ttl_remaining_ms / 1000)
                        backoff.reset()
                    continue
                if event[0] == "end":
                    failure = Failure(Failure.NOT_APPLIED, "the keepalive stream ended")
                    break
                failure = _failure(event[1])
                if _session_gone(failure):
                    return errors.LOST_NOT_FOUND
                if failure.code is grpc.StatusCode.RESOURCE_EXHAUSTED:
                    return await self._renew_by_call(proving, backoff)
                break
        finally:
            call.cancel()
            reader.cancel()
        log.debug("keepalive stream of session %d failed: %s", self.id, failure.message)
        self._client._endpoints.after_failure(current.generation, failure)
        if failure.kind == Failure.NOT_LEADER and backoff.at_once():
            return None
        return await self._pause(proving, backoff)

    async def _renew_by_call(self, proving: bool, backoff: _core.Backoff) -> Optional[str]:
        sent = time.monotonic()
        try:
            remaining = await self._client.renew(self.credential)
        except errors.SessionNotFound:
            return errors.LOST_NOT_FOUND
        except errors.PalisadeError as error:
            log.debug("renewal of session %d by Renew failed: %s", self.id, error)
            return await self._pause(proving, backoff)
        self._proven(sent, remaining)
        backoff.reset()
        return await self._sleep(proving, sent + self._interval)

    async def _pause(self, proving: bool, backoff: _core.Backoff) -> Optional[str]:
        delay = backoff.next_delay()
        if delay is None:
            delay = _core.BACKOFF_MAX_S
        if not proving:
            delay = min(delay, self._interval)
        return await self._sleep(proving, time.monotonic() + delay)

    async def _sleep(self, proving: bool, until: float) -> Optional[str]:
        """Sleeps until ``until``; the session is lost if its lease runs out first."""
        if proving:
            until = min(until, self._lease_deadline)
        await asyncio.sleep(max(0.0, until - time.monotonic()))
        if proving and time.monotonic() >= self._lease_deadline:
            return errors.LOST_LEASE_UNPROVEN
        return None
