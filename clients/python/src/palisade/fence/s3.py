"""A fence for objects in S3-compatible storage: the accepted token is stored with the object, and
every fenced write is a conditional ``PUT`` on the ETag the fence read.

The same layout as the Rust adapter ``palisade_fence::s3``, so a Rust writer and a Python writer
fence the same objects. The body of a fenced object starts with one JSON line, the *envelope*
(``{"palisade_fence":1,"lock":…,"token":…,"session":…,"data":true}``), followed by the data;
the token and session are also copied into the user metadata (``x-amz-meta-palisade-token``,
``x-amz-meta-palisade-session``). The body is authoritative because an S3 ETag hashes the bytes
only: a token kept in metadata alone would let a claim keep the ETag, and a superseded holder's
``If-Match`` would still succeed.

**The pattern.** :meth:`S3Fence.put` reads the envelope and ETag, runs :func:`check`, and writes
with ``If-Match: <etag>`` (``If-None-Match: *`` where there is no object); a ``412``, ``409`` or
``404`` means the object changed, and the fence reads and checks again, at most
:data:`S3_ATTEMPTS_MAX` times. :meth:`S3Fence.read` is the claim: it advances the stored token
(rewriting the object under the same condition) and returns the data it advanced. Claim, then
read, then write. :meth:`S3Fence.update` is a read-modify-write in one conditional ``PUT``.
:meth:`S3Fence.delete` leaves a tombstone that keeps the token.

Keep large data out of the fenced object: write it under a unique name, unfenced, and fence only
the small manifest or pointer that names it (the commit point).

Requests are path-style and signed with AWS Signature Version 4 by this module (the standard
library only: ``http.client``, ``hmac``, ``hashlib``). Plain HTTP and HTTPS endpoints both work.
A ``PUT`` whose answer was lost is :class:`OutcomeUnknown`; a request refused before anything was
applied is :class:`Storage`.
"""

from __future__ import annotations

import dataclasses
import datetime
import hashlib
import hmac
import http.client
import json
import urllib.parse
from typing import Callable, Optional

from . import (
    READ,
    WRITE,
    Corrupt,
    FenceState,
    InvalidRequest,
    InvalidScope,
    OutcomeUnknown,
    Storage,
    check,
    precheck,
    stored_state,
)
from ..sequencer import BINDING_BYTES_MAX, VerifiedSequencer

#: Longest object key, in bytes (S3's own limit).
S3_KEY_BYTES_MAX = 1024
#: Default limit on the data of one fenced object.
S3_OBJECT_BYTES_MAX_DEFAULT = 16 << 20
#: How often one fenced request reads again after the object changed under it.
S3_ATTEMPTS_MAX = 8
#: Longest envelope line, newline included.
S3_ENVELOPE_BYTES_MAX = 1024
#: Seconds one HTTP request may take.
S3_REQUEST_TIMEOUT = 30.0
#: The longest lock name the lock service issues, in bytes.


@dataclasses.dataclass(frozen=True)
class S3Config:
    """Where the bucket is and how to sign for it."""

    endpoint: str
    bucket: str
    access_key: str
    secret_key: str = dataclasses.field(repr=False)
    region: str = "us-east-1"


@dataclasses.dataclass(frozen=True)
class S3Object:
    """A fenced object as stored: ``data`` is ``None`` for a tombstone or a claim of a new key."""

    data: Optional[bytes]
    state: FenceState
    etag: str


def envelope(state: FenceState, data: Optional[bytes]) -> bytes:
    """The body of a fenced object: the envelope line, then the data (as the Rust adapter)."""
    line = json.dumps(
        {
            "palisade_fence": 1,
            "lock": state.lock,
            "token": state.token_max,
            "session": state.holder_session,
            "data": data is not None,
        },
        separators=(",", ":"),
        ensure_ascii=False,
    )
    return line.encode() + b"\n" + (data or b"")


def open_envelope(key: str, body: bytes) -> tuple[FenceState, Optional[bytes]]:
    """Splits a stored body into its state and data; anything else is :class:`Corrupt`."""
    newline = body.find(b"\n", 0, S3_ENVELOPE_BYTES_MAX)
    prefix = f"fence state of scope {key!r} is corrupt: "
    if newline < 0:
        raise Corrupt(prefix + "the object has no fence envelope line: it was not written through the fence")
    try:
        line = json.loads(body[:newline])
    except ValueError as error:
        raise Corrupt(prefix + f"the first line is not a fence envelope ({error})") from None
    fields = {"palisade_fence": int, "lock": str, "token": int, "session": int, "data": bool}
    if (
        not isinstance(line, dict)
        or set(line) != set(fields)
        or not all(isinstance(line[name], kind) for name, kind in fields.items())
    ):
        raise Corrupt(prefix + f"the first line is not a fence envelope: {body[:newline][:200]!r}")
    if line["palisade_fence"] != 1:
        raise Corrupt(prefix + f"envelope version {line['palisade_fence']} is unknown")
    if not 0 < len(line["lock"].encode()) <= BINDING_BYTES_MAX:
        raise Corrupt(prefix + "the envelope's lock name (binding) is empty or too long")
    rest = body[newline + 1 :]
    if not line["data"] and rest:
        raise Corrupt(prefix + "a data-less envelope is followed by data")
    if not 0 <= line["session"] <= 0xFFFF_FFFF_FFFF_FFFF:
        raise Corrupt(prefix + f"stored session {line['session']} is out of range")
    state = stored_state(key, line["lock"], line["token"], line["session"])
    return state, (rest if line["data"] else None)


def validate_key(key: object) -> str:
    """An object key: 1..=:data:`S3_KEY_BYTES_MAX` bytes, no control characters."""
    if not isinstance(key, str) or not key:
        raise InvalidScope("invalid fence scope: object key is empty" if key == "" else "an object key is a str")
    size = len(key.encode("utf-8", "surrogatepass"))
    if size > S3_KEY_BYTES_MAX:
        raise InvalidScope(f"invalid fence scope: object key is {size} bytes, the limit is {S3_KEY_BYTES_MAX}")
    if any(ord(char) < 0x20 or 0x7F <= ord(char) < 0xA0 for char in key):
        raise InvalidScope("invalid fence scope: object key holds a control character")
    return key


class S3Fence:
    """Fences writes to the objects of one bucket, per key."""

    def __init__(
        self,
        config: S3Config,
        *,
        expect_lock: Optional[str] = None,
        object_bytes_max: int = S3_OBJECT_BYTES_MAX_DEFAULT,
        timeout: float = S3_REQUEST_TIMEOUT,
    ) -> None:
        parsed = urllib.parse.urlsplit(config.endpoint)
        if parsed.scheme not in ("http", "https") or not parsed.netloc or parsed.path.strip("/"):
            raise ValueError(f"an S3 endpoint is http(s)://host[:port], not {config.endpoint!r}")
        self._config = config
        self._https = parsed.scheme == "https"
        self._host = parsed.netloc
        self._expect_lock = expect_lock
        self._object_bytes_max = object_bytes_max
        self._timeout = timeout

    @property
    def config(self) -> S3Config:
        return self._config

    def put(self, key: str, sequencer: VerifiedSequencer, data: bytes) -> FenceState:
        """Writes ``data`` if ``sequencer`` is accepted, advancing the stored token in the same
        conditional ``PUT``. On any error nothing was written, except :class:`OutcomeUnknown`."""
        if len(data) > self._object_bytes_max:
            raise InvalidRequest(
                f"invalid fenced request: the data is {len(data)} bytes, the limit of a fenced object is "
                f"{self._object_bytes_max}; write large data under a unique name and fence only the manifest"
            )
        data = bytes(data)
        return self._apply(key, sequencer, lambda _: data)[0]

    def update(
        self, key: str, sequencer: VerifiedSequencer, change: Callable[[Optional[bytes]], bytes]
    ) -> tuple[FenceState, bytes]:
        """A read-modify-write in one conditional ``PUT``: writes ``change(current data)`` under
        ``If-Match`` on the ETag of the data ``change`` saw; if the object changed meanwhile, reads
        and calls ``change`` again (at most :data:`S3_ATTEMPTS_MAX` times)."""
        state, data = self._apply(key, sequencer, change)
        return state, data or b""

    def delete(self, key: str, sequencer: VerifiedSequencer) -> FenceState:
        """Deletes the data if ``sequencer`` is accepted, leaving a tombstone that keeps the token."""
        return self._apply(key, sequencer, lambda _: None)[0]

    def read(self, key: str, sequencer: VerifiedSequencer) -> S3Object:
        """The claim and the read: advances the stored token to ``sequencer``'s and returns the
        data it advanced. Once it returns, no older grant can write ``key``. Any grant may read, a
        shared one (a reader of a read-write lock) included; :meth:`put`, :meth:`update` and
        :meth:`delete` refuse a shared grant (:class:`~palisade.fence.SharedWrite`)."""
        validate_key(key)
        precheck(self._expect_lock, sequencer, READ)
        for _ in range(S3_ATTEMPTS_MAX):
            current = self.get(key)
            next_state = check(current.state if current else None, self._expect_lock, sequencer, READ)
            if current is not None and current.state == next_state:
                return current
            data = current.data if current else None
            etag = self._put(key, next_state, envelope(next_state, data), current.etag if current else None)
            if etag is not None:
                return S3Object(data, next_state, etag)
        raise self._kept_changing(key)

    def get(self, key: str) -> Optional[S3Object]:
        """The object as stored, without a claim, or ``None``. Not ordered against writers."""
        validate_key(key)
        status, headers, body = self._request("GET", key, b"", {})
        if status == 404:
            return None
        if not 200 <= status < 300:
            raise Storage(f"fence storage error: GET {key!r} refused with {status}: {body[:300]!r}")
        limit = self._object_bytes_max + S3_ENVELOPE_BYTES_MAX
        if len(body) > limit:
            raise Corrupt(
                f"fence state of scope {key!r} is corrupt: the object is {len(body)} bytes, more than the limit of {limit}"
            )
        state, data = open_envelope(key, body)
        return S3Object(data, state, self._etag(key, headers))

    def fence_state(self, key: str) -> Optional[FenceState]:
        """The fence state stored at ``key``, if any."""
        current = self.get(key)
        return current.state if current else None

    def _apply(
        self, key: str, sequencer: VerifiedSequencer, new_data: Callable[[Optional[bytes]], Optional[bytes]]
    ) -> tuple[FenceState, Optional[bytes]]:
        validate_key(key)
        precheck(self._expect_lock, sequencer, WRITE)
        for _ in range(S3_ATTEMPTS_MAX):
            current = self.get(key)
            next_state = check(current.state if current else None, self._expect_lock, sequencer, WRITE)
            data = new_data(current.data if current else None)
            if data is not None and len(data) > self._object_bytes_max:
                raise InvalidRequest(
                    f"invalid fenced request: the data is {len(data)} bytes, the limit of a fenced object is "
                    f"{self._object_bytes_max}; write large data under a unique name and fence only the manifest"
                )
            if self._put(key, next_state, envelope(next_state, data), current.etag if current else None) is not None:
                return next_state, data
        raise self._kept_changing(key)

    def _put(self, key: str, state: FenceState, body: bytes, if_match: Optional[str]) -> Optional[str]:
        """One conditional PUT: the new ETag, or ``None`` when the condition failed."""
        headers = {
            "x-amz-meta-palisade-token": str(state.token_max),
            "x-amz-meta-palisade-session": str(state.holder_session),
        }
        if if_match is None:
            headers["if-none-match"] = "*"
        else:
            headers["if-match"] = if_match
        status, response_headers, answer = self._request("PUT", key, body, headers, sent_matters=True)
        if 200 <= status < 300:
            return self._etag(key, response_headers)
        if status in (409, 412) or (status == 404 and if_match is not None):
            return None
        if status >= 500 and status != 503:
            raise OutcomeUnknown(
                f"outcome unknown: PUT {key!r} answered {status}: {answer[:300]!r}; the write may or may not "
                "have been applied, read it back under a claim before retrying"
            )
        raise Storage(f"fence storage error: PUT {key!r} refused with {status}: {answer[:300]!r}")

    def _request(
        self, method: str, key: str, body: bytes, headers: dict[str, str], sent_matters: bool = False
    ) -> tuple[int, dict[str, str], bytes]:
        path = "/" + _uri_encode(self._config.bucket, False) + "/" + _uri_encode(key, True)
        signed = _sign_v4(self._config, method, path, self._host, headers, body, datetime.datetime.now(datetime.timezone.utc))
        conn_class = http.client.HTTPSConnection if self._https else http.client.HTTPConnection
        connection = conn_class(self._host, timeout=self._timeout)
        try:
            try:
                connection.connect()
            except OSError as error:
                raise Storage(f"fence storage error: {method} {key!r} could not connect: {error}") from None
            try:
                connection.request(method, path, body=body, headers={**headers, **signed})
                response = connection.getresponse()
                answer = response.read(self._object_bytes_max + S3_ENVELOPE_BYTES_MAX + 1)
            except (OSError, http.client.HTTPException) as error:
                if sent_matters:
                    raise OutcomeUnknown(
                        f"outcome unknown: {method} {key!r} got no answer: {error}; the write may or may not "
                        "have been applied, read it back under a claim before retrying"
                    ) from None
                raise Storage(f"fence storage error: {method} {key!r} failed: {error}") from None
            return response.status, {name.lower(): value for name, value in response.getheaders()}, answer
        finally:
            connection.close()

    @staticmethod
    def _etag(key: str, headers: dict[str, str]) -> str:
        etag = headers.get("etag")
        if not etag:
            raise Storage(f"fence storage error: the server answered for {key!r} without an ETag")
        return etag

    @staticmethod
    def _kept_changing(key: str) -> Storage:
        return Storage(
            f"fence storage error: object {key!r} changed under each of {S3_ATTEMPTS_MAX} attempts "
            "(other writers race for it); nothing was written, try again"
        )


def _uri_encode(text: str, keep_slash: bool) -> str:
    return urllib.parse.quote(text, safe="/~" if keep_slash else "~")


def _hmac(key: bytes, message: str) -> bytes:
    return hmac.new(key, message.encode(), hashlib.sha256).digest()


def _sign_v4(
    config: S3Config,
    method: str,
    path: str,
    host: str,
    headers: dict[str, str],
    body: bytes,
    now: datetime.datetime,
) -> dict[str, str]:
    """AWS Signature Version 4 over every header sent (no query string)."""
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    date = amz_date[:8]
    payload = hashlib.sha256(body).hexdigest()
    signed = {"host": host, "x-amz-content-sha256": payload, "x-amz-date": amz_date}
    signed.update({name.lower(): value.strip() for name, value in headers.items()})
    names = sorted(signed)
    canonical = "\n".join(
        [method, path, "", "".join(f"{name}:{signed[name]}\n" for name in names), ";".join(names), payload]
    )
    scope = f"{date}/{config.region}/s3/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(("AWS4" + config.secret_key).encode(), date)
    for part in (config.region, "s3", "aws4_request"):
        key = _hmac(key, part)
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return {
        "authorization": (
            f"AWS4-HMAC-SHA256 Credential={config.access_key}/{scope}, "
            f"SignedHeaders={';'.join(names)}, Signature={signature}"
        ),
        "x-amz-content-sha256": payload,
        "x-amz-date": amz_date,
    }
