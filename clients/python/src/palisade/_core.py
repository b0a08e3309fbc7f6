"""What the blocking client and the asyncio client share: endpoints, failures, retries, ids.

This mirrors the Rust client (``crates/client``) rule for rule, so a Python program and a Rust
program behave alike against a cluster:

- **Endpoints.** Every attempt goes to the current endpoint. After a failure,
  :meth:`Endpoints.after_failure` picks the next: an ``UNAVAILABLE`` naming the leader
  (``palisade-leader-addr``) makes the leader current if it is one of the configured endpoints,
  or, with TLS, anywhere (the hint came over a connection authenticated to a member, and the
  new connection sends nothing before its server shows a certificate from the CA). Without TLS
  nothing would prove an address outside the list a member, and every call carries the bearer
  token and session secrets, so such a hint, like any other retryable failure, moves to the
  next configured endpoint, wrapping around; a refusal moves nothing. A failure seen on an
  endpoint that is no longer current moves nothing (another call already moved).
- **Retries.** A failure that applied nothing is retried, at once after a leader hint (at most
  :data:`RETRIES_AT_ONCE_MAX` in a row), else after a pause (50 ms doubling to 1 s, jittered),
  within a time budget. An attempt whose outcome is unknown is retried only as the same request:
  one request id (acquire, release) or open key (open session), which the service deduplicates;
  if the budget ends after an unknown outcome, the call is reported unknown, never failed.
- **Ids.** Request ids are 64 random bits from the OS, compared by the service only with the
  same session's last few ids; open keys are 16 random bytes from the OS, with no fallback,
  because the service compares them with every client's.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import random
import threading
import time
import unicodedata
from typing import TYPE_CHECKING, Any, Callable, Generic, Optional, TypeVar

import grpc

from . import _keepalive, errors
from ._proto import palisade_pb2 as pb

if TYPE_CHECKING:
    from .client import SessionCredential
    from .tls import Tls
    from .sequencer import Access

_log = logging.getLogger("palisade")

#: Longest part of a gRPC error's details a message quotes.
ERROR_DETAIL_SHOWN_MAX = 300
#: Most endpoints one client takes: a cluster has at most 9 members.
ENDPOINTS_MAX = 16
#: Longest endpoint text, in bytes (a member address is at most 255 bytes).
ENDPOINT_BYTES_MAX = 512
#: Longest lock name, in bytes of UTF-8 (the service's ``LOCK_NAME_BYTES_MAX``).
LOCK_NAME_BYTES_MAX = 256
#: Longest value a grant carries, in bytes of UTF-8 (the service's ``GRANT_VALUE_BYTES_MAX``).
GRANT_VALUE_BYTES_MAX = 1024
#: Session TTLs the service accepts, in seconds.
SESSION_TTL_MIN_S = 1.0
SESSION_TTL_MAX_S = 86_400.0
#: Longest wait the service accepts, in seconds.
WAIT_MAX_S = 86_400.0
#: Largest gRPC message either side accepts (the proto crate's ``MESSAGE_BYTES_MAX``).
MESSAGE_BYTES_MAX = 64 * 1024
#: The length of a session secret, in bytes.
SESSION_SECRET_BYTES = 32
#: The length of an open key drawn by this client, in bytes.
OPEN_KEY_BYTES = 16
#: HTTP/2 pings on every connection, and how long one may go unanswered, in milliseconds: a
#: member that freezes with its sockets open fails the calls in flight within about two seconds.
KEEPALIVE_PING_INTERVAL_MS = 1000
KEEPALIVE_PING_TIMEOUT_MS = 1000
#: Pauses between attempts, in seconds.
BACKOFF_INITIAL_S = 0.05
BACKOFF_MAX_S = 1.0
#: Most attempts in a row made at once after leader hints.
RETRIES_AT_ONCE_MAX = 3
#: Most pages ``list_locks`` follows before deciding the server misbehaves.
LIST_PAGES_MAX = 100_000
#: Metadata a member that is not the leader sends with UNAVAILABLE.
LEADER_ADDR_HEADER = "palisade-leader-addr"
STATUS_DETAILS_HEADER = "grpc-status-details-bin"
ERROR_DETAIL_TYPE = "type.googleapis.com/palisade.v1.ErrorDetail"

#: Environment variable holding the bearer token (the Rust client's ``AUTH_TOKEN_ENV``). Not
#: ``PALISADE_TOKEN``: that is the fencing token ``palisade lock`` gives its command.
AUTH_TOKEN_ENV = "PALISADE_AUTH_TOKEN"
#: Longest bearer token, in bytes (the server's limit too).
BEARER_TOKEN_BYTES_MAX = 256

#: Options of every channel the client makes.
CHANNEL_OPTIONS = [
    ("grpc.keepalive_time_ms", KEEPALIVE_PING_INTERVAL_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_PING_TIMEOUT_MS),
    # Without this, gRPC waits a minute for any ping's answer, whatever the keepalive timeout.
    ("grpc.http2.ping_timeout_ms", KEEPALIVE_PING_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
    ("grpc.max_send_message_length", MESSAGE_BYTES_MAX),
    ("grpc.max_receive_message_length", MESSAGE_BYTES_MAX),
    # One connection per channel, re-established by gRPC after it breaks.
    ("grpc.enable_retries", 0),
]


#: How long the call that asks gRPC why a first connection failed may take.
WHY_UNREACHABLE_TIMEOUT_S = 0.5
_CONNECT_FAILED = "failed to connect to all addresses; last error: "


def why_unreachable(error: grpc.RpcError) -> Optional[str]:
    """gRPC's reason why a channel has no connection (``Connection refused``, ``Tls handshake
    failed ... CERTIFICATE_VERIFY_FAILED``, ...), from the error of a call made on it after
    :func:`grpc.channel_ready_future` timed out; ``None`` if the server answered that call after
    all (any other status), so that the channel is connected."""
    call: Any = error
    if call.code() not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.CANCELLED):
        return None
    details = str(call.details() or call.code().name)
    if details.startswith(_CONNECT_FAILED):
        details = details[len(_CONNECT_FAILED) :]
    return details[:ERROR_DETAIL_SHOWN_MAX]


def unreachable(targets: list[str], failures: list[str], tls: Optional["Tls"]) -> errors.Unreachable:
    """The error of a client that no endpoint accepted a connection for."""
    why = "is `palisade serve` running there?"
    if tls is not None:
        why = (
            "is `palisade serve` running there with TLS, and does its certificate chain to the CA "
            f"of {tls!r} and name the host dialled?"
        )
    return errors.Unreachable(
        f"cannot connect to the lock service at {','.join(targets)}: {'; '.join(failures)}; {why}"
    )


# --- endpoints ------------------------------------------------------------------------------


def parse_endpoints(endpoints: Any, tls: bool = False) -> list[str]:
    """``host:port`` targets from a list of endpoints or a comma-separated string.

    A scheme is accepted and dropped if it is the one the client speaks: ``https://`` with
    ``tls``, ``http://`` without. Refuses an empty list or entry, more than
    :data:`ENDPOINTS_MAX` entries, an entry without a host or a valid port, and the other scheme.
    """
    if isinstance(endpoints, str):
        entries = endpoints.split(",")
    else:
        try:
            entries = list(endpoints)
        except TypeError:
            raise errors.InvalidEndpoint(
                f"endpoints must be a list of host:port strings, not {type(endpoints).__name__}"
            ) from None
    if not entries:
        raise errors.InvalidEndpoint("no endpoint given; expected e.g. ['127.0.0.1:7457']")
    if len(entries) > ENDPOINTS_MAX:
        raise errors.InvalidEndpoint(
            f"{len(entries)} endpoints given, at most {ENDPOINTS_MAX} are allowed"
        )
    targets = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, str):
            raise errors.InvalidEndpoint(f"endpoint {index + 1} is {entry!r}, not a host:port string")
        targets.append(_parse_endpoint(entry, index, len(entries), tls))
    return targets


def _parse_endpoint(entry: str, index: int, count: int, tls: bool) -> str:
    text = entry.strip()
    where = f"endpoint {index + 1} of {count}" if count > 1 else "endpoint"
    if not text:
        raise errors.InvalidEndpoint(
            "no endpoint given" if count == 1 else f"{where} is empty; separate endpoints with single commas"
        )
    if len(text.encode()) > ENDPOINT_BYTES_MAX:
        raise errors.InvalidEndpoint(f"{where} is over {ENDPOINT_BYTES_MAX} bytes")
    if text.startswith("https://"):
        if not tls:
            raise errors.InvalidEndpoint(
                f"{where} {text!r}: https:// needs TLS settings (tls=palisade.Tls.from_files(...)): "
                "the CA to check the server's certificate with"
            )
        text = text[len("https://") :].rstrip("/")
    elif text.startswith("http://"):
        if tls:
            raise errors.InvalidEndpoint(
                f"{where} {text!r}: http:// asks for plaintext but TLS is configured; "
                "use https:// or leave the scheme out"
            )
        text = text[len("http://") :].rstrip("/")
    target = _host_port(text)
    if target is None:
        raise errors.InvalidEndpoint(f"{where} {entry!r} is not host:port (e.g. 127.0.0.1:7457)")
    return target


def _host_port(text: str) -> Optional[str]:
    """``text`` if it is ``host:port`` with a port in 1..=65535, else ``None``."""
    if not text or any(c in text for c in "/@,?#") or any(c.isspace() for c in text):
        return None
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 1 <= int(port) <= 65535:
        return None
    if host.startswith("[") != host.endswith("]"):
        return None
    if ":" in host and not host.startswith("["):
        return None  # an IPv6 address is bracketed; anything else with a colon is a gRPC target form
    if any(unicodedata.category(c) == "Cc" for c in text):
        return None
    return f"{host}:{int(port)}"


# --- the bearer token -----------------------------------------------------------------------


class BearerToken:
    """A bearer token, sent as ``authorization: Bearer <token>`` with every call: what a lock
    service with a token file (``palisade serve --tokens``) authenticates the client by.

    1 to 256 printable ASCII characters without spaces, after surrounding white space (a file's
    final newline) is dropped, as the Rust client's ``BearerToken::new`` checks. Neither ``repr``
    nor ``str`` shows it.
    """

    __slots__ = ("_metadata",)

    def __init__(self, token: str) -> None:
        if not isinstance(token, str):
            raise errors.Misconfigured(f"a bearer token is a str, not {type(token).__name__}")
        token = token.strip()
        size = len(token.encode("utf-8", "surrogatepass"))
        if not token or size > BEARER_TOKEN_BYTES_MAX:
            raise errors.Misconfigured(
                f"a bearer token is 1 to {BEARER_TOKEN_BYTES_MAX} characters, not {size}"
            )
        if not all("\x21" <= c <= "\x7e" for c in token):
            raise errors.Misconfigured("a bearer token is printable ASCII without spaces")
        self._metadata: tuple[tuple[str, str], ...] = (("authorization", f"Bearer {token}"),)

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        """The gRPC metadata that carries the token."""
        return self._metadata

    def __repr__(self) -> str:
        return "BearerToken(…)"

    __str__ = __repr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, BearerToken) and other._metadata == self._metadata

    def __hash__(self) -> int:
        return hash(self._metadata)

    def __reduce__(self) -> Any:  # no pickling a secret into a file or another process by accident
        raise TypeError("a BearerToken is not picklable")


def bearer_token(token: Any) -> Optional[BearerToken]:
    """The token a client sends: ``token`` if given (a ``str`` or a :class:`BearerToken`), else
    ``$PALISADE_AUTH_TOKEN`` if it is set, else none (as the Rust client's ``from_env``). A set
    but invalid variable is refused (:class:`errors.Misconfigured`), not ignored."""
    if isinstance(token, BearerToken):
        return token
    if token is not None:
        return BearerToken(token)
    value = os.environ.get(AUTH_TOKEN_ENV)
    if value is None:
        return None
    try:
        return BearerToken(value)
    except errors.Misconfigured as error:
        raise errors.Misconfigured(f"${AUTH_TOKEN_ENV}: {error.message}") from None


class AuthorizedStub:
    """A ``LocksStub`` whose every method sends the bearer token's metadata (the Rust client's
    ``Bearer`` interceptor): unary calls and the keepalive stream alike."""

    __slots__ = ("_stub", "_metadata")

    def __init__(self, stub: Any, token: Optional[BearerToken]) -> None:
        self._stub = stub
        self._metadata = token.metadata if token is not None else None

    def __getattr__(self, method: str) -> Any:
        call = getattr(self._stub, method)
        metadata = self._metadata
        if metadata is None:
            return call

        def with_token(*args: Any, **kwargs: Any) -> Any:
            kwargs["metadata"] = tuple(kwargs.get("metadata") or ()) + metadata
            return call(*args, **kwargs)

        return with_token

    def __repr__(self) -> str:
        return f"AuthorizedStub({self._stub!r}, token={'set' if self._metadata else 'none'})"


T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Current(Generic[T]):
    """The endpoint in use: its target, a stub on its channel, and a generation bumped at every
    switch so that a failure seen on an endpoint no longer current moves nothing."""

    target: str
    stub: T
    generation: int
    index: int


#: Most leaders outside the configured endpoints a client with TLS follows over its life: each
#: keeps a channel until the client is closed. Beyond it, a hint to yet another address is not
#: followed (the members' addresses have changed many times: give the client the current ones).
OUTSIDE_LEADERS_MAX = ENDPOINTS_MAX

#: How long an endpoint whose attempt failed is passed over while another has not failed since
#: (seconds), as in the Rust client.
FAILED_ENDPOINT_PASSED_OVER_FOR = 10.0


class Endpoints(Generic[T]):
    """The endpoints a client was given, and the one it sends to now (thread-safe).

    After a failure that is not an answer about the request, the next attempt goes to the next
    configured endpoint in order, passing over those whose own attempt failed within
    :data:`FAILED_ENDPOINT_PASSED_OVER_FOR` while one has not (so that members lost for good,
    still in the list, do not cost a connection timeout at every failover); when all have, to
    the one that failed longest ago."""

    def __init__(
        self,
        targets: list[str],
        first: int,
        make_stub: Callable[[str], T],
        clock: Callable[[], float] = time.monotonic,
        tls: bool = False,
    ) -> None:
        self._make_stub = make_stub
        self._tls = tls
        self._stubs: dict[str, T] = {}
        self.configured = list(targets)
        self._clock = clock
        self._failed_at: list[float | None] = [None] * len(targets)
        self._mutex = threading.Lock()
        self._current = Current(targets[first], self._stub(targets[first]), 0, first)

    def _next_after(self, current: Current[T]) -> int:
        """The configured endpoint to try after ``current``, whose attempt just failed. A leader
        followed outside the list keeps the place of the member that named it, which answered
        and is not marked failed."""
        now = self._clock()
        failed = current.index
        if self.configured[failed] == current.target:
            self._failed_at[failed] = now
        count = len(self.configured)
        order = [(failed + step) % count for step in range(1, count + 1)]
        for index in order:
            at = self._failed_at[index]
            if at is None or now - at >= FAILED_ENDPOINT_PASSED_OVER_FOR:
                return index
        return min(order, key=lambda index: self._failed_at[index] or 0.0)

    def _stub(self, target: str) -> T:
        stub = self._stubs.get(target)
        if stub is None:
            stub = self._make_stub(target)
            self._stubs[target] = stub
        return stub

    def _outside(self) -> int:
        """How many leaders outside the configured endpoints have a stub (a channel)."""
        return sum(1 for target in self._stubs if target not in self.configured)

    def current(self) -> Current[T]:
        with self._mutex:
            return self._current

    def after_failure(self, used: int, failure: "Failure") -> None:
        """Moves on after an attempt sent to generation ``used`` failed with ``failure``."""
        with self._mutex:
            current = self._current
            if current.generation != used:
                return  # another call already moved on from that endpoint
            leader = failure.leader
            if failure.kind == Failure.NOT_LEADER and leader != current.target and leader in self.configured:
                index = self.configured.index(leader)
                target = leader
            elif (
                failure.kind == Failure.NOT_LEADER
                and leader is not None
                and leader != current.target
                and self._tls
                and (leader in self._stubs or self._outside() < OUTSIDE_LEADERS_MAX)
            ):
                # Outside the list, followed only with TLS; the place in the list is kept, so
                # that a failure there goes on to the configured endpoint after it.
                index = current.index
                target = leader
            elif failure.kind in (Failure.NOT_LEADER, Failure.NOT_APPLIED, Failure.UNKNOWN):
                if failure.kind == Failure.NOT_LEADER and leader != current.target:
                    if self._tls:
                        _log.warning(
                            "not following the leader hint to %s: this client already followed %d leaders "
                            "outside its configured endpoints; give it the members' current addresses",
                            leader,
                            OUTSIDE_LEADERS_MAX,
                        )
                    else:
                        # Without TLS nothing proves an address outside the list is a member, and
                        # every call carries the bearer token and session secrets (N14).
                        _log.warning(
                            "not following the leader hint to %s, which is not among the configured endpoints "
                            "(nothing proves it is a member): give the client every member's address",
                            leader,
                        )
                index = self._next_after(current)
                target = self.configured[index]
            else:
                return  # an answer about the request itself: the member spoke for the cluster
            if target == current.target and index == current.index:
                return  # one endpoint: nowhere else to go
            self._current = Current(target, self._stub(target), current.generation + 1, index)

    def stubs(self) -> list[T]:
        with self._mutex:
            return list(self._stubs.values())


# --- failures -------------------------------------------------------------------------------


@dataclasses.dataclass
class Failure:
    """What a failed attempt means, before it is named for one operation."""

    CORE = "core"  # the lock table refused, with an ErrorDetail: nothing changed
    NOT_APPLIED = "not_applied"  # retrying may succeed
    NOT_LEADER = "not_leader"  # not applied; `leader` is where to go
    UNKNOWN = "unknown"  # may or may not have been applied
    REJECTED = "rejected"  # any other status: final

    kind: str
    message: str
    code: Optional[grpc.StatusCode] = None
    detail: Optional[pb.ErrorDetail] = None  # set for CORE
    leader: Optional[str] = None

    @property
    def final(self) -> bool:
        return self.kind in (Failure.CORE, Failure.REJECTED)

    def error(self, what: str) -> errors.PalisadeError:
        """The exception for this failure of ``what`` (e.g. ``"acquire of lock 'a'"``)."""
        if self.kind == Failure.CORE and self.detail is not None:
            cls = errors.class_for_kind(self.detail.kind) or _class_for_code(self.code)
            return cls(f"{what}: {self.message}", code=self.code, detail=self.detail)
        if self.kind in (Failure.NOT_APPLIED, Failure.NOT_LEADER):
            return errors.NotApplied(
                f"the lock service is unavailable, {what} was not applied ({self.message}); retry later",
                code=self.code,
            )
        if self.kind == Failure.UNKNOWN:
            return errors.OutcomeUnknown(
                f"{what} has an unknown outcome ({self.message}); it may have taken effect",
                code=self.code,
            )
        cls = _class_for_code(self.code)
        if cls in (errors.NotApplied, errors.OutcomeUnknown):
            cls = errors.Refused
        return cls(f"{what} was refused ({_code_name(self.code)}): {self.message}", code=self.code)


def _class_for_code(code: Optional[grpc.StatusCode]) -> type[errors.PalisadeError]:
    return errors.class_for_code(code) if code is not None else errors.ProtocolError


def _code_name(code: Optional[grpc.StatusCode]) -> str:
    return code.name if code is not None else "no status"


# Local transport failures whose request may have been sent: the connection broke mid-call.
_BROKEN_CONNECTION = (
    "socket closed",
    "connection reset",
    "broken pipe",
    "goaway",
    "keepalive",
    "ping timeout",
    "stream removed",
    "end of tcp stream",
    "eof",
)


def failure_from_status(
    code: grpc.StatusCode, details: Optional[str], trailing: Any
) -> Failure:
    """Classifies a status (from the server, or made locally by gRPC) as the Rust client does."""
    message = details or code.name
    metadata = _metadata_dict(trailing)
    detail = error_detail(metadata.get(STATUS_DETAILS_HEADER))
    if detail is not None:
        return Failure(Failure.CORE, message, code, detail)
    if code is grpc.StatusCode.UNAVAILABLE:
        leader = leader_hint(metadata.get(LEADER_ADDR_HEADER))
        if leader is not None:
            return Failure(
                Failure.NOT_LEADER, f"{message} (the leader is at {leader})", code, leader=leader
            )
        lowered = message.lower()
        if "failed to connect" in lowered or "connection refused" in lowered:
            return Failure(Failure.NOT_APPLIED, message, code)
        if any(marker in lowered for marker in _BROKEN_CONNECTION):
            return Failure(Failure.UNKNOWN, message, code)
        return Failure(Failure.NOT_APPLIED, message, code)
    if code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return Failure(Failure.NOT_APPLIED, message, code)
    if code in (
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.ABORTED,
    ):
        return Failure(Failure.UNKNOWN, message, code)
    return Failure(Failure.REJECTED, message, code)


def failure_from_rpc_error(error: grpc.RpcError) -> Failure:
    """Classifies a failed call of the blocking API."""
    # The stubs give every RpcError a call's methods; at run time only a call's error has them.
    try:
        code = error.code()
        details = error.details()
        trailing = error.trailing_metadata()
    except Exception:  # not a call's error: the outcome cannot be told
        return Failure(Failure.UNKNOWN, str(error))
    return failure_from_status(code, details, trailing)


def _metadata_dict(metadata: Any) -> dict[str, Any]:
    if not metadata:
        return {}
    try:
        return {key: value for key, value in metadata}
    except (TypeError, ValueError):
        return {}


def error_detail(raw: Any) -> Optional[pb.ErrorDetail]:
    """The ``ErrorDetail`` inside a ``grpc-status-details-bin`` value, if there is one."""
    if not isinstance(raw, (bytes, bytearray)):
        return None
    from google.rpc import status_pb2  # from googleapis-common-protos, grpcio-status's dependency

    status = status_pb2.Status()
    try:
        status.ParseFromString(bytes(raw))
    except Exception:
        return None
    for any_detail in status.details:
        if any_detail.type_url == ERROR_DETAIL_TYPE:
            detail = pb.ErrorDetail()
            try:
                detail.ParseFromString(any_detail.value)
            except Exception:
                return None
            return detail
    return None


def leader_hint(value: Any) -> Optional[str]:
    """The ``host:port`` a member names as the leader, or ``None`` if it names none usable."""
    if isinstance(value, bytes):
        try:
            value = value.decode("ascii")
        except UnicodeDecodeError:
            return None
    if not isinstance(value, str) or len(value) > ENDPOINT_BYTES_MAX:
        return None
    return _host_port(value.strip())


# --- retries --------------------------------------------------------------------------------


class Backoff:
    """Exponential backoff with jitter within a time budget, and a few attempts at once."""

    def __init__(self, budget_s: float) -> None:
        self._budget_s = budget_s
        self.reset()

    def reset(self) -> None:
        self._next = BACKOFF_INITIAL_S
        self._give_up_at = time.monotonic() + self._budget_s
        self._at_once_left = RETRIES_AT_ONCE_MAX

    def at_once(self) -> bool:
        """True if the next attempt may go at once (counted)."""
        if self._at_once_left == 0 or time.monotonic() >= self._give_up_at:
            return False
        self._at_once_left -= 1
        return True

    def next_delay(self) -> Optional[float]:
        """The pause before the next attempt, or ``None`` when the budget is spent."""
        now = time.monotonic()
        if now >= self._give_up_at:
            return None
        delay = min(self._next * (0.5 + random.random() / 2), self._give_up_at - now)
        self._next = min(self._next * 2, BACKOFF_MAX_S)
        self._at_once_left = RETRIES_AT_ONCE_MAX
        return delay


class Retry:
    """The bookkeeping of one call's retries: what to do after each failed attempt."""

    AT_ONCE = "at_once"

    def __init__(self, budget_s: float) -> None:
        self.backoff = Backoff(budget_s)
        self._earlier_unknown: Optional[Failure] = None

    def after(self, failure: Failure) -> Any:
        """``Retry.AT_ONCE``, a pause in seconds, or the ``Failure`` to report."""
        if failure.final:
            return failure
        if failure.kind == Failure.NOT_LEADER and self.backoff.at_once():
            return Retry.AT_ONCE
        delay = self.backoff.next_delay()
        if delay is None:
            earlier = self._earlier_unknown
            if earlier is not None and failure.kind in (Failure.NOT_APPLIED, Failure.NOT_LEADER):
                return Failure(Failure.UNKNOWN, f"{earlier.message}; then {failure.message}", failure.code)
            return failure
        if failure.kind == Failure.UNKNOWN:
            self._earlier_unknown = failure
        return delay


# --- ids and checks -------------------------------------------------------------------------

_fallback_counter = itertools.count()


def request_id() -> int:
    """A fresh 64-bit request id for an acquire or a release.

    The service compares it only with the same session's last few ids, so without OS randomness
    a mix of the clock, a counter and the process id is enough (as in the Rust client).
    """
    try:
        return int.from_bytes(os.urandom(8), "little")
    except NotImplementedError:
        nanos = time.time_ns() & 0xFFFF_FFFF_FFFF_FFFF
        count = next(_fallback_counter)

        def rotate(x: int, n: int) -> int:
            return ((x << n) | (x >> (64 - n))) & 0xFFFF_FFFF_FFFF_FFFF

        return nanos ^ rotate(count & 0xFFFF_FFFF_FFFF_FFFF, 48) ^ rotate(os.getpid(), 32)


def open_key() -> bytes:
    """A fresh open key from the OS's secure random source; no fallback (it is compared with
    every client's keys, and whoever presents it is handed the session)."""
    key = os.urandom(OPEN_KEY_BYTES)
    if len(set(key)) == 1:  # the service refuses a key of one repeated byte
        key = os.urandom(OPEN_KEY_BYTES)
    return key


def validate_lock_name(lock: Any) -> str:
    """``lock`` if the service would accept it as a name, else :class:`errors.InvalidArgument`."""
    if not isinstance(lock, str):
        raise errors.InvalidArgument(f"a lock name is a str, not {type(lock).__name__}")
    shown = repr(lock[:64]) + ("…" if len(lock) > 64 else "")
    if not lock:
        raise errors.InvalidArgument("invalid lock name '': lock name is empty")
    size = len(lock.encode("utf-8", "surrogatepass"))
    if size > LOCK_NAME_BYTES_MAX:
        raise errors.InvalidArgument(
            f"invalid lock name {shown}: lock name is {size} bytes, the limit is {LOCK_NAME_BYTES_MAX}"
        )
    if any(unicodedata.category(c) == "Cc" for c in lock):
        raise errors.InvalidArgument(f"invalid lock name {shown}: lock name contains a control character")
    return lock


def wire_value(value: Any) -> str:
    """A grant's value as the wire spells it: ``""`` for ``None`` (no value), else ``value`` if
    the service would accept it (1 to 1024 bytes of UTF-8 without control characters, as the
    service's ``validate_grant_value``), else :class:`errors.InvalidArgument`."""
    if value is None:
        return ""
    if not isinstance(value, str):
        raise errors.InvalidArgument(f"a value is a str (or None for none), not {type(value).__name__}")
    if not value:
        raise errors.InvalidArgument("invalid value: value is empty (send no value instead)")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise errors.InvalidArgument("invalid value: value is not valid UTF-8 (it holds a lone surrogate)") from None
    if size > GRANT_VALUE_BYTES_MAX:
        raise errors.InvalidArgument(f"invalid value: value is {size} bytes, the limit is {GRANT_VALUE_BYTES_MAX}")
    if any(unicodedata.category(c) == "Cc" for c in value):
        raise errors.InvalidArgument(
            "invalid value: value contains a control character (encode binary values, in base64 say)"
        )
    return value


def ttl_ms(ttl: Any) -> int:
    """A session TTL in seconds as milliseconds, refused outside what the service accepts."""
    if isinstance(ttl, bool) or not isinstance(ttl, (int, float)):
        raise errors.InvalidArgument(f"ttl is in seconds (a number), not {ttl!r}")
    if not SESSION_TTL_MIN_S <= ttl <= SESSION_TTL_MAX_S:
        raise errors.InvalidArgument(
            f"session ttl {ttl} s is outside the allowed range {SESSION_TTL_MIN_S:g}..={SESSION_TTL_MAX_S:g} s"
        )
    return int(round(ttl * 1000))


def wait_seconds(wait: Any) -> Optional[float]:
    """``None`` (wait until granted), ``0`` (try only) or a wait in seconds, checked."""
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or wait != wait:
        raise errors.InvalidArgument(f"wait is None (forever) or seconds (a number), not {wait!r}")
    if not 0 <= wait <= WAIT_MAX_S:
        raise errors.InvalidArgument(f"wait {wait} s is outside 0..={WAIT_MAX_S:g} s")
    return float(wait)


@dataclasses.dataclass(frozen=True)
class WaitWindow:
    """An acquire's wait as its retried attempts send it: each attempt asks the server to wait
    only for what is left of the caller's ``wait``, and bounds the call by that plus the request
    timeout. ``deadline`` is on the monotonic clock; ``None`` waits until granted."""

    deadline: Optional[float]

    @staticmethod
    def start(wait: Any) -> "WaitWindow":
        """Checks ``wait`` (see :func:`wait_seconds`) and starts its clock now."""
        wait_s = wait_seconds(wait)
        return WaitWindow(None if wait_s is None else time.monotonic() + wait_s)

    def attempt(self, request_timeout: float) -> tuple[dict[str, Any], Optional[float]]:
        """The request's ``wait_ms`` and ``wait_forever`` fields for an attempt made now, and the
        attempt's timeout. A wait forever has no deadline of its own: a dead connection is found
        by HTTP/2 keepalive, and a lost session by the session's keepalive."""
        if self.deadline is None:
            return {"wait_ms": 0, "wait_forever": True}, None
        remaining = max(0.0, self.deadline - time.monotonic())
        return {"wait_ms": int(remaining * 1000), "wait_forever": False}, remaining + request_timeout


class AcquireAttempts:
    """An acquire's request as its retried attempts send it (calling the object gives the next
    attempt's request and timeout): its arguments checked before anything is sent, one random
    request id for every attempt, so a retry cannot grant twice, and each attempt's wait what is
    left of the caller's ``wait`` (:class:`WaitWindow`, whose clock starts now)."""

    def __init__(
        self,
        credential: SessionCredential,
        lock: str,
        request_timeout: float,
        *,
        wait: Any,
        value: Any,
        shared: bool,
        permits: Optional[int],
    ) -> None:
        self.lock = validate_lock_name(lock)
        value = wire_value(value)
        shared, permits = acquire_mode(shared, permits)
        self._fields: dict[str, Any] = dict(
            session=credential.id,
            lock=lock,
            session_secret=credential.secret,
            value=value,
            shared=shared,
            permits=permits,
        )
        self._window = WaitWindow.start(wait)
        self._request_timeout = request_timeout
        self.request_id = request_id()

    def __call__(self) -> tuple[pb.AcquireRequest, Optional[float]]:
        wait_fields, timeout = self._window.attempt(self._request_timeout)
        return pb.AcquireRequest(request_id=self.request_id, **self._fields, **wait_fields), timeout

    def after_release(self, release: str) -> Callable[[], tuple[pb.ReleaseThenAcquireRequest, Optional[float]]]:
        """The attempts of a handoff: ``release`` given up first, then this acquire, in one
        ``ReleaseThenAcquire``. The release draws a request id of its own (never the acquire's),
        sent by every attempt too, so a retry neither releases twice nor gives up the grant an
        earlier attempt took."""
        validate_lock_name(release)
        release_id = request_id()
        while release_id == self.request_id:
            release_id = request_id()

        def attempt() -> tuple[pb.ReleaseThenAcquireRequest, Optional[float]]:
            acquire, timeout = self()
            message = pb.ReleaseThenAcquireRequest(acquire=acquire, release=release, release_request_id=release_id)
            return message, timeout

        return attempt


def keep_alive_request(session: int, secret: bytes) -> pb.KeepAliveRequest:
    return pb.KeepAliveRequest(session=session, session_secret=secret)


def check_open(response: pb.OpenSessionResponse) -> tuple[int, bytes, float]:
    """The session id, secret and TTL (s) of an open's answer, checked."""
    if response.session == 0 or response.ttl_ms == 0:
        raise errors.ProtocolError(
            f"the lock service opened session {response.session} with ttl {response.ttl_ms} ms"
        )
    if len(response.session_secret) != SESSION_SECRET_BYTES:
        raise errors.ProtocolError(
            f"session {response.session} came with a secret of {len(response.session_secret)} bytes "
            f"instead of {SESSION_SECRET_BYTES} (a server from before session secrets sends none: "
            "upgrade every member before its clients)"
        )
    return response.session, bytes(response.session_secret), response.ttl_ms / 1000


def acquire_mode(shared: bool, permits: Optional[int]) -> tuple[bool, int]:
    """The wire's ``(shared, permits)`` of an acquire, checked before anything is sent: a reader
    (``shared``), one permit of a semaphore of ``permits`` (1 to ``PERMITS_MAX``), or neither."""
    from .sequencer import PERMITS_MAX

    if permits is None:
        return bool(shared), 0
    if shared:
        raise errors.InvalidArgument(
            "an acquire is shared or a permit of a semaphore, not both: a semaphore's permits are exclusive"
        )
    if isinstance(permits, bool) or not isinstance(permits, int) or not 1 <= permits <= PERMITS_MAX:
        raise errors.InvalidArgument(f"a semaphore has 1 to {PERMITS_MAX} permits, not {permits!r}")
    return False, permits


def access_of(message: Any) -> "Access":
    """The ``access`` field of a response, a holder or a watch event (absent: exclusive)."""
    from .sequencer import EXCLUSIVE, SHARED, Access

    if not message.HasField("access"):
        return EXCLUSIVE
    access = message.access
    if access.HasField("slot"):
        if access.shared:
            raise errors.ProtocolError("the lock service sent an access both shared and a slot")
        try:
            return Access("slot", access.slot)
        except ValueError as error:
            raise errors.ProtocolError(f"the lock service sent {error}") from None
    return SHARED if access.shared else EXCLUSIVE


def check_grant(response: pb.AcquireResponse, session: int, lock: str) -> "Access":
    """Checks an acquire's answer against the request and its own sequencer; returns how the
    grant holds the lock."""
    from .sequencer import Sequencer, SequencerError

    def protocol(what: str) -> errors.ProtocolError:
        return errors.ProtocolError(
            f"the lock service answered the acquire with an invalid response ({what}); "
            "the lock may be held by this session: close the session"
        )

    if response.lock != lock or response.session != session:
        raise protocol(
            f"asked for lock {lock!r} in session {session}, granted lock {response.lock!r} in session {response.session}"
        )
    if response.token == 0:
        raise protocol(f"lock {lock!r} granted with token 0")
    try:
        parsed = Sequencer.parse(response.sequencer)
    except SequencerError as error:
        raise protocol(f"grant of lock {lock!r}: {error}") from None
    access = access_of(response)
    if (parsed.lock, parsed.token, parsed.session, parsed.access) != (lock, response.token, session, access):
        raise protocol(
            f"grant of lock {lock!r} with token {response.token} in session {session} ({access}) came with a "
            f"sequencer for lock {parsed.lock!r}, token {parsed.token}, session {parsed.session} ({parsed.access})"
        )
    return access


def released_token(response: Any, field: str, lock: str) -> Optional[int]:
    """The token of the grant a release of ``lock`` ended (the answer's optional ``field``), or
    ``None`` if it withdrew a wait."""
    if not response.HasField(field):
        return None
    token: int = getattr(response, field)
    if token == 0:
        raise errors.ProtocolError(f"release of lock {lock!r} reported token 0")
    return token


def check_handoff(
    response: pb.ReleaseThenAcquireResponse, session: int, release: str, lock: str
) -> tuple[Optional[int], "Access"]:
    """Checks a ``ReleaseThenAcquire``'s answer: the released grant's token (``None`` if a wait
    was withdrawn), and the new grant as :func:`check_grant` checks an acquire's."""
    if not response.HasField("grant"):
        raise errors.ProtocolError(
            f"the lock service answered a release of lock {release!r} then an acquire of lock {lock!r} "
            "with no grant; the lock may be held by this session: close the session"
        )
    access = check_grant(response.grant, session, lock)
    return released_token(response, "released_token", release), access


def check_released(what: str, lock: str, token: int, released: Optional[int]) -> None:
    """Refuses the answer to ``what`` (``"release of"``, ``"handoff from"``) of the grant
    ``token`` of ``lock`` unless it ended that very grant (``released``)."""
    if released != token:
        raise errors.ProtocolError(
            f"{what} lock {lock!r} with token {token} ended "
            + ("a wait instead" if released is None else f"token {released}")
        )


@dataclasses.dataclass(frozen=True)
class LockPart:
    """One lock of a multi-lock (``acquire_all``), and how to hold it: exclusive (the default),
    ``shared``, or one permit of the semaphore ``lock`` of ``permits`` permits. A plain name
    stands for an exclusive part."""

    lock: str
    shared: bool = False
    permits: Optional[int] = None


#: The most locks one multi-lock names (the service's ``MULTI_LOCKS_MAX``).
MULTI_LOCKS_MAX = 32


def acquire_parts(parts: Any) -> list[pb.AcquirePart]:
    """The wire's parts of a multi-lock, each a name or a :class:`LockPart`, checked as far as
    they can be before anything is sent (the service refuses a repeated or held lock)."""
    if isinstance(parts, (str, bytes)) or not hasattr(parts, "__iter__"):
        raise errors.InvalidArgument("a multi-lock takes a list of lock names or LockParts")
    wire = []
    for part in parts:
        if isinstance(part, str):
            part = LockPart(part)
        if not isinstance(part, LockPart):
            raise errors.InvalidArgument(f"a multi-lock's part is a lock name or a LockPart, not {part!r}")
        shared, permits = acquire_mode(part.shared, part.permits)
        wire.append(pb.AcquirePart(lock=validate_lock_name(part.lock), shared=shared, permits=permits))
        if len(wire) > MULTI_LOCKS_MAX:
            raise errors.InvalidArgument(f"a multi-lock takes 1 to {MULTI_LOCKS_MAX} locks, not more")
    if not wire:
        raise errors.InvalidArgument(f"a multi-lock takes 1 to {MULTI_LOCKS_MAX} locks, not 0")
    return wire


def check_grants(response: pb.AcquireAllResponse, session: int, locks: list[str]) -> list["Access"]:
    """Checks a multi-lock's answer: one grant per lock asked for, in order, each as
    :func:`check_grant` checks one; returns how each grant holds its lock."""
    if response.session != session or len(response.grants) != len(locks):
        raise errors.ProtocolError(
            f"the lock service answered a multi-lock of {len(locks)} locks in session {session} with "
            f"{len(response.grants)} grants in session {response.session}; the locks may be held by this "
            "session: close the session"
        )
    return [check_grant(grant, session, lock) for grant, lock in zip(response.grants, locks)]


# --- the keepalive engine's drivers ---------------------------------------------------------


def monotonic_ms() -> int:
    """The keepalive engine's clock: integer milliseconds, rounded down (so a send time is never
    later than the send)."""
    return int(time.monotonic() * 1000)


def keepalive_engine(ttl_s: float, interval_s: Optional[float], first_sent_at: float) -> _keepalive.Keepalive:
    """The engine of a session granted ``ttl_s`` by an open sent at ``first_sent_at`` (monotonic
    seconds), its backoff jittered from a fresh seed."""
    return _keepalive.Keepalive(
        round(ttl_s * 1000),
        None if interval_s is None else round(interval_s * 1000),
        int(first_sent_at * 1000),
        random.getrandbits(53),
    )


def session_gone(failure: Failure) -> bool:
    """True when a failure says the session does not exist any more."""
    if failure.kind == Failure.CORE and failure.detail is not None:
        return failure.detail.kind == "session_not_found"
    return failure.code is grpc.StatusCode.NOT_FOUND


def stream_event(
    kind: str, payload: Any, session: int, endpoints: "Endpoints[Any]", generation: int
) -> Optional[_keepalive.Event]:
    """What a message of a keepalive stream to the endpoint of ``generation`` tells the engine:
    ``opened`` (the headers came), ``ack`` (``None`` for another session's, which is dropped), or
    the stream's end (``payload`` the :class:`Failure`). After a failure other than a refusal or
    a session gone, the client moves on from the endpoint as every call does."""
    if kind == "opened":
        return _keepalive.StreamOpened()
    if kind == "ack":
        return _keepalive.Ack(payload.ttl_remaining_ms) if payload.session == session else None
    failure: Failure = payload
    if session_gone(failure):
        return _keepalive.SessionGone()
    if failure.code is grpc.StatusCode.RESOURCE_EXHAUSTED:
        return _keepalive.StreamRefused()
    _log.debug("keepalive stream of session %d failed: %s", session, failure.message)
    endpoints.after_failure(generation, failure)
    return _keepalive.StreamBroken(failure.kind == Failure.NOT_LEADER)
