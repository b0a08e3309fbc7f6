"""The fence in front of any ASGI application (Starlette, FastAPI, Django's ASGI handler…):
Chubby's ``CheckSequencer`` as a middleware, with the same header, rules and refusal bodies as
the Rust ``palisade_fence::http::FenceLayer`` (both run ``crates/fence/tests/http_fence_cases.json``).

The pattern to copy::

    from palisade.fence import Verifier
    from palisade.fence.asgi import FenceMiddleware, MemoryFence, PostgresFence

    app = FenceMiddleware(app, Verifier(public_keys), PostgresFence(psycopg.connect(dsn)))
    # app.stats: accepted and refused requests per lock

Before the application sees an ``http`` (or ``websocket``) request, the middleware reads the
sequencer from the ``Palisade-Sequencer`` header (what ``palisade lock`` hands a holder as
``$PALISADE_SEQUENCER``), verifies it, and checks and advances the scope's accepted token in a
:class:`FenceBackend`: :class:`MemoryFence` (tests, one process) or :class:`PostgresFence`
(every replica shares the ``palisade_fence`` table with the Rust fences). The scope is the
sequencer's binding (its lock, or for a semaphore's permit the lock and the slot, so each slot
has a scope of its own) unless ``scope=`` gives a function of the ASGI scope and the sequencer.

``GET`` and ``HEAD`` requests are reads: any grant may make them, the readers of a read-write
lock's shared phase included. Every other method, and a websocket (which may write once open),
is a write, which a shared grant may not make (``shared_write``, 403).

A refusal is the fenced store's JSON body with its status: ``stale`` and ``token_reissued`` 409
(with ``lock``, ``presented``, ``accepted``, ``holder_session`` / ``token``, ``first_session``,
``presented_session``), ``wrong_lock``, ``shared_write`` (with ``lock``, ``token``) and ``forged`` 403, ``malformed`` 400, ``missing`` 428 (a
precondition, like ``If-Match``; not a credential), ``storage`` 503. A refused websocket is
closed before it is accepted (the server answers the handshake with 403).

The check commits before the application runs, not with its effects: once a request of token 11
was admitted no request of token 10 is, but one admitted earlier may still be running. Where the
application writes to a database, claim in that transaction too (``palisade.fence.postgres``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from typing import Any, Awaitable, Callable, MutableMapping, Optional, Protocol

from ..sequencer import VerifiedSequencer
from . import (
    READ,
    WRITE,
    FenceError,
    FenceState,
    Intent,
    InvalidRequest,
    Malformed,
    SharedWrite,
    Stale,
    TokenReissued,
    Verifier,
    WrongLock,
    check,
    validate_scope,
)
from .stats import FenceStats

#: The request header carrying the holder's sequencer (ASGI spells header names in lower case).
SEQUENCER_HEADER = "palisade-sequencer"
#: How many scopes a :class:`MemoryFence` remembers; it forgets none, and refuses a new one beyond.
MEMORY_FENCE_SCOPES_MAX = 65_536

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: The HTTP status of each refusal kind (the fenced store's, and Rust's ``FenceError::http_status``).
HTTP_STATUS = {
    "stale": 409,
    "token_reissued": 409,
    "wrong_lock": 403,
    "shared_write": 403,
    "forged": 403,
    "missing": 428,
    "malformed": 400,
    "invalid_scope": 400,
    "invalid_request": 400,
    "corrupt": 500,
    "storage": 503,
    "outcome_unknown": 504,
}


class FenceBackend(Protocol):
    """Where each scope's accepted token lives: check ``sequencer`` for ``intent`` (``"read"`` for
    ``GET`` and ``HEAD``, ``"write"`` otherwise) against it and advance it, atomically, or raise
    the :class:`~palisade.fence.FenceError` of the refusal."""

    async def check_and_advance(self, scope: str, sequencer: VerifiedSequencer, intent: Intent) -> None: ...


class MemoryFence:
    """Every scope's state in this process's memory (tests, single-process services)."""

    def __init__(self) -> None:
        self._scopes: dict[str, FenceState] = {}
        self._mutex = threading.Lock()

    def fence_state(self, scope: str) -> Optional[FenceState]:
        with self._mutex:
            return self._scopes.get(scope)

    async def check_and_advance(self, scope: str, sequencer: VerifiedSequencer, intent: Intent) -> None:
        with self._mutex:
            accepted = self._scopes.get(scope)
            if accepted is None and len(self._scopes) >= MEMORY_FENCE_SCOPES_MAX:
                raise InvalidRequest(
                    f"invalid fenced request: this in-memory fence already tracks {MEMORY_FENCE_SCOPES_MAX} "
                    "scopes and forgets none; use a durable fence (PostgreSQL) or fewer scopes"
                )
            self._scopes[scope] = check(accepted, None, sequencer, intent)


class PostgresFence:
    """The accepted tokens in PostgreSQL's ``palisade_fence`` table, shared by every replica (and
    with the Rust fences). Each admission is one transaction (claim, commit) on ``conn`` (a
    psycopg 3 connection, not in autocommit mode), taken in turn on a worker thread."""

    def __init__(self, conn: Any) -> None:
        from . import postgres

        postgres.ensure_schema(conn)
        conn.commit()
        self._conn = conn
        self._mutex = threading.Lock()

    async def check_and_advance(self, scope: str, sequencer: VerifiedSequencer, intent: Intent) -> None:
        await asyncio.to_thread(self._admit, scope, sequencer, intent)

    def _admit(self, scope: str, sequencer: VerifiedSequencer, intent: Intent) -> None:
        from . import postgres

        with self._mutex:
            try:
                postgres.claim(self._conn, scope, sequencer, intent=intent)
            except BaseException:
                self._conn.rollback()
                raise
            postgres.commit(self._conn)


def refusal_body(refusal: FenceError) -> dict[str, Any]:
    """The JSON body of a refusal, in the fenced store's wire form: the kind, its fields and the
    ``message``; kinds without fields carry their text as ``detail``."""
    body: dict[str, Any]
    if isinstance(refusal, Stale):
        body = {
            "kind": refusal.kind,
            "lock": refusal.lock,
            "presented": refusal.presented,
            "accepted": refusal.accepted,
            "holder_session": refusal.holder_session,
        }
    elif isinstance(refusal, TokenReissued):
        body = {
            "kind": refusal.kind,
            "lock": refusal.lock,
            "token": refusal.token,
            "first_session": refusal.first_session,
            "presented_session": refusal.presented_session,
        }
    elif isinstance(refusal, SharedWrite):
        body = {"kind": refusal.kind, "lock": refusal.lock, "token": refusal.token}
    elif isinstance(refusal, WrongLock):
        body = {"kind": refusal.kind, "expected": refusal.expected, "presented": refusal.presented}
    elif refusal.kind == "missing":
        body = {"kind": refusal.kind}
    else:
        # "malformed sequencer: <detail>": the detail alone, as the store sends it.
        body = {"kind": refusal.kind, "detail": refusal.message.split(": ", 1)[-1]}
    body["message"] = refusal.message
    return body


class FenceMiddleware:
    """Admits a request to ``app`` only if its sequencer verifies and ``fence`` accepts it."""

    def __init__(
        self,
        app: ASGIApp,
        verifier: Verifier,
        fence: FenceBackend,
        *,
        scope: Optional[Callable[[Scope, VerifiedSequencer], str]] = None,
        stats: Optional[FenceStats] = None,
    ) -> None:
        self.app = app
        self.verifier = verifier
        self.fence = fence
        self._scope = scope or (lambda _request, sequencer: sequencer.binding)
        #: Accepted and refused requests per lock.
        self.stats = stats if stats is not None else FenceStats()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] not in ("http", "websocket"):
            await self.app(scope, receive, send)  # lifespan
            return
        try:
            await self._admit(scope)
        except FenceError as refusal:
            await _refuse(scope, send, refusal)
            return
        await self.app(scope, receive, send)

    async def _admit(self, request: Scope) -> None:
        try:
            sequencer = self.verifier.verify(_presented(request))
        except FenceError as refusal:
            self.stats.record(None, refusal)
            raise
        try:
            fence_scope = validate_scope(self._scope(request, sequencer))
            await self.fence.check_and_advance(fence_scope, sequencer, _intent(request))
        except FenceError as refusal:
            self.stats.record(sequencer.lock, refusal)
            raise
        self.stats.record(sequencer.lock)


def _intent(request: Scope) -> Intent:
    """``GET`` and ``HEAD`` read; any other method, and a websocket, writes."""
    if request["type"] == "http" and request.get("method") in ("GET", "HEAD"):
        return READ
    return WRITE


def _presented(request: Scope) -> Optional[str]:
    values = [value for name, value in request.get("headers", []) if name.lower() == SEQUENCER_HEADER.encode()]
    if not values:
        return None
    if len(values) > 1:
        raise Malformed("malformed sequencer: more than one Palisade-Sequencer header; send exactly one")
    try:
        text: str = values[0].decode("ascii")
    except UnicodeDecodeError:
        raise Malformed("malformed sequencer: the Palisade-Sequencer header is not ASCII") from None
    return text


async def _refuse(request: Scope, send: Send, refusal: FenceError) -> None:
    if request["type"] == "websocket":
        await send({"type": "websocket.close", "code": 1008, "reason": refusal.kind})
        return
    body = json.dumps(refusal_body(refusal)).encode()
    await send(
        {
            "type": "http.response.start",
            "status": HTTP_STATUS.get(refusal.kind, 500),
            "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())],
        }
    )
    await send({"type": "http.response.body", "body": body})


__all__ = [
    "FenceBackend",
    "FenceMiddleware",
    "MemoryFence",
    "PostgresFence",
    "SEQUENCER_HEADER",
    "refusal_body",
]
