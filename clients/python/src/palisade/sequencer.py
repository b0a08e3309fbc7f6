"""Sequencers: the signed, lock-scoped tokens a resource checks, verified offline.

The text form of an exclusive grant is ``pal2.<key id>.<lock b64url>.<token>.<session>.<ed25519 sig
b64url>``; a shared grant (a reader of a read-write lock's phase) or a semaphore's permit is
``pal3.<key id>.<lock b64url>.<access>.<token>.<session>.<sig>``, the access ``s`` (shared) or
``p<k>`` (the permit in slot k < ``PERMITS_MAX``), the session >= 1. At most 512 printable ASCII
bytes, every field with exactly one accepted encoding (as the Rust crate ``palisade-sequencer``
parses it). The signature covers every byte before the last dot. The key
id, 16 lowercase hex digits, is the first 8 bytes of the SHA-256 of the 32-byte public key: a
resource that trusts several keys during a rotation (a :class:`KeySet`) checks the signature
with that key alone, and refuses a sequencer naming a key outside the set.

Only :func:`verify` (or :meth:`KeySet.verify`) makes a :class:`VerifiedSequencer`, and the fence
helpers take nothing else: a resource cannot forget to check the signature.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import hashlib
import unicodedata
from typing import Iterable, Literal, Optional, Union

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

SEQUENCER_PREFIX = "pal2"
#: The version of a shared grant's or a permit's text (``SEQUENCER_PREFIX`` is an exclusive one's).
SEQUENCER_ACCESS_PREFIX = "pal3"
#: A semaphore's slots are below this.
PERMITS_MAX = 4096
#: Joins a lock and a slot in a permit's fence binding (U+001F: no lock name holds it).
SLOT_SEPARATOR = "\x1f"
SEQUENCER_BYTES_MAX = 512
PUBLIC_KEY_PREFIX = "ed25519:"
KEY_ID_HEX_DIGITS = 16
SIGNATURE_BYTES = 64
#: The largest token the service grants (``i64::MAX``: it fits a SQL ``bigint``).
TOKEN_MAX = (1 << 63) - 1
SESSION_MAX = (1 << 64) - 1
LOCK_NAME_BYTES_MAX = 256
#: The longest fence binding: a lock name, U+001F and a slot of up to four digits.
BINDING_BYTES_MAX = LOCK_NAME_BYTES_MAX + 1 + 4
#: Most keys a :class:`KeySet` holds, and the longest text it parses.
KEY_SET_KEYS_MAX = 16
KEY_SET_TEXT_BYTES_MAX = 16 * 1024

# Encodings of the Ed25519 points of small order, which verify forged signatures: refused as
# keys, as ed25519-dalek's `is_weak` does.
_SMALL_ORDER_POINTS = {
    bytes.fromhex(h)
    for h in (
        "0100000000000000000000000000000000000000000000000000000000000000",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "0000000000000000000000000000000000000000000000000000000000000000",
        "0000000000000000000000000000000000000000000000000000000000000080",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac037a",
        "c7176a703d4dd84fba3c0b760d10670f2a2053fa2c39ccc64ec7fd7792ac03fa",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc05",
        "26e8958fc2b227b045c3f489f2ef98f0d5dfac05d3c63339b13802886d53fc85",
        "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
        "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
        "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
        "0100000000000000000000000000000000000000000000000000000000000080",
        "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff",
    )
}


class SequencerError(ValueError):
    """A sequencer or key that is not accepted. ``kind`` is ``"malformed"`` or ``"forged"``."""

    kind = "malformed"


class Malformed(SequencerError):
    """The text is not a sequencer (or not a public key, or not a key set)."""

    kind = "malformed"


class Forged(SequencerError):
    """The signature does not verify, or names a key the resource does not trust."""

    kind = "forged"


def _b64url_decode(text: str) -> Optional[bytes]:
    """Unpadded base64url with exactly one accepted encoding (no padding, canonical last bits)."""
    if not text or any(c not in _B64URL for c in text) or len(text) % 4 == 1:
        return None
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None
    if base64.urlsafe_b64encode(raw).rstrip(b"=").decode() != text:
        return None
    return raw


def _b64url_encode(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


_B64URL = set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")


def _decimal(text: str, what: str, maximum: int) -> int:
    if not text or not text.isascii() or not text.isdigit():
        raise Malformed(f"the {what} is not a decimal number")
    if len(text) > 1 and text.startswith("0"):
        raise Malformed(f"the {what} has a leading zero")
    value = int(text)
    if value > maximum:
        raise Malformed(f"the {what} is above {maximum}")
    return value


@dataclasses.dataclass(frozen=True)
class PublicKey:
    """An Ed25519 public key of the lock service, printed as ``ed25519:<64 hex digits>``."""

    raw: bytes

    @staticmethod
    def parse(text: str) -> "PublicKey":
        if not isinstance(text, str) or not text.startswith(PUBLIC_KEY_PREFIX):
            raise Malformed(f"a public key starts with {PUBLIC_KEY_PREFIX!r}")
        digits = text[len(PUBLIC_KEY_PREFIX) :]
        if len(digits) != 64 or not digits.isascii():
            raise Malformed(f"a public key has 64 hex digits after {PUBLIC_KEY_PREFIX!r}, found {len(digits)}")
        try:
            raw = bytes.fromhex(digits)
        except ValueError:
            raise Malformed("a public key's digits must be hexadecimal") from None
        if raw in _SMALL_ORDER_POINTS:
            raise Malformed("not a valid Ed25519 public key (a point of small order)")
        try:
            Ed25519PublicKey.from_public_bytes(raw)
        except ValueError:
            raise Malformed("not a valid Ed25519 public key") from None
        return PublicKey(raw)

    @property
    def key_id(self) -> str:
        """16 lowercase hex digits: the first 8 bytes of the SHA-256 of the key."""
        return hashlib.sha256(self.raw).digest()[:8].hex()

    @property
    def fingerprint(self) -> str:
        return "SHA256:" + hashlib.sha256(self.raw).hexdigest()

    def verify_signature(self, message: bytes, signature: bytes) -> bool:
        try:
            Ed25519PublicKey.from_public_bytes(self.raw).verify(signature, message)
        except InvalidSignature:
            return False
        return True

    def __str__(self) -> str:
        return PUBLIC_KEY_PREFIX + self.raw.hex()


class KeySet:
    """One to 16 public keys a resource trusts, each with a distinct key id.

    Text form: keys separated by commas or white space; a line whose first non-blank character
    is ``#`` is a comment (so ``palisade pubkey``'s output, an environment variable and a file
    all work).
    """

    def __init__(self, keys: Iterable[PublicKey]) -> None:
        chosen: list[PublicKey] = []
        for key in keys:
            if key in chosen:
                continue
            if len(chosen) == KEY_SET_KEYS_MAX:
                raise Malformed(f"a key set holds at most {KEY_SET_KEYS_MAX} keys")
            for other in chosen:
                if other.key_id == key.key_id:
                    raise Malformed(f"keys {other} and {key} share the key id {key.key_id}")
            chosen.append(key)
        if not chosen:
            raise Malformed("a key set needs at least one public key")
        self.keys: tuple[PublicKey, ...] = tuple(chosen)

    @staticmethod
    def parse(text: str) -> "KeySet":
        if not isinstance(text, str):
            raise Malformed("a key set is text")
        if len(text.encode()) > KEY_SET_TEXT_BYTES_MAX:
            raise Malformed(f"a key set's text is at most {KEY_SET_TEXT_BYTES_MAX} bytes")
        keys: list[PublicKey] = []
        for line in text.splitlines():
            if line.lstrip().startswith("#"):
                continue
            for item in line.replace(",", " ").split():
                if len(keys) == KEY_SET_KEYS_MAX:
                    raise Malformed(f"a key set holds at most {KEY_SET_KEYS_MAX} keys")
                keys.append(PublicKey.parse(item))
        return KeySet(keys)

    @staticmethod
    def of(keys: Union["KeySet", PublicKey, str, Iterable[str]]) -> "KeySet":
        """A key set from a :class:`KeySet`, a :class:`PublicKey`, its text form, or key texts."""
        if isinstance(keys, KeySet):
            return keys
        if isinstance(keys, PublicKey):
            return KeySet([keys])
        if isinstance(keys, str):
            return KeySet.parse(keys)
        return KeySet(PublicKey.parse(k) if isinstance(k, str) else k for k in keys)

    def get(self, key_id: str) -> Optional[PublicKey]:
        for key in self.keys:
            if key.key_id == key_id:
                return key
        return None

    def verify(self, text: Optional[str]) -> "VerifiedSequencer":
        return verify(text, self)

    def __str__(self) -> str:
        return ",".join(str(key) for key in self.keys)


AccessKind = Literal["exclusive", "shared", "slot"]


@dataclasses.dataclass(frozen=True)
class Access:
    """How a grant holds its lock: ``kind`` is ``"exclusive"`` (a mutex, a read-write lock's
    writer), ``"shared"`` (a reader of a shared phase, whose readers share its token) or
    ``"slot"`` (a semaphore's permit, ``slot`` < ``PERMITS_MAX``; ``None`` for the others)."""

    kind: AccessKind = "exclusive"
    slot: Optional[int] = None

    def __post_init__(self) -> None:
        if (self.kind == "slot") != (self.slot is not None) or self.kind not in ("exclusive", "shared", "slot"):
            raise ValueError(f"not an access: {self.kind!r} with slot {self.slot!r}")
        if self.slot is not None and not 0 <= self.slot < PERMITS_MAX:
            raise ValueError(f"slot {self.slot} is outside 0..{PERMITS_MAX}")

    @staticmethod
    def parse(text: str) -> "Access":
        """pal3's access field: ``s``, or ``p`` and a slot in decimal with no leading zero."""
        if text == "s":
            return SHARED
        if not text.startswith("p"):
            raise Malformed(f"the access is {text[:16]!r}, expected 's' (shared) or 'p<slot>' (a permit)")
        return Access("slot", _decimal(text[1:], "slot", PERMITS_MAX - 1))

    def __str__(self) -> str:
        return f"slot {self.slot}" if self.kind == "slot" else self.kind


EXCLUSIVE = Access("exclusive")
SHARED = Access("shared")


def binding(lock: str, access: Access) -> str:
    """What a fence binds a scope to for a grant of ``lock``: the lock for exclusive and shared
    grants, the lock, U+001F and the slot for a permit (so no lock's binding equals a slot's)."""
    return f"{lock}{SLOT_SEPARATOR}{access.slot}" if access.kind == "slot" else lock


def display_binding(binding: str) -> str:
    """A binding as messages show it: the lock, or ``L (slot k)`` for a permit's."""
    lock, separator, slot = binding.partition(SLOT_SEPARATOR)
    return f"{lock} (slot {slot})" if separator else binding


@dataclasses.dataclass(frozen=True)
class Sequencer:
    """A parsed (not yet verified) sequencer."""

    text: str
    key_id: str
    lock: str
    token: int
    session: int
    signature: bytes
    access: Access = EXCLUSIVE

    @property
    def binding(self) -> str:
        return binding(self.lock, self.access)

    @staticmethod
    def parse(text: str) -> "Sequencer":
        if not isinstance(text, str) or not text:
            raise Malformed("the sequencer is empty")
        if len(text) > SEQUENCER_BYTES_MAX:
            raise Malformed(f"the sequencer is {len(text)} bytes, the limit is {SEQUENCER_BYTES_MAX}")
        for position, char in enumerate(text):
            if not "\x21" <= char <= "\x7e":
                raise Malformed(f"the sequencer has a byte that is not printable ASCII at {position}")
        fields = text.split(".")
        version = fields[0]
        if version not in (SEQUENCER_PREFIX, SEQUENCER_ACCESS_PREFIX):
            raise Malformed(
                f"the sequencer's version is {version[:16]!r}, expected {SEQUENCER_PREFIX!r} or {SEQUENCER_ACCESS_PREFIX!r}"
            )
        want = 6 if version == SEQUENCER_PREFIX else 7
        if len(fields) != want:
            raise Malformed(f"a {version} sequencer has {want} fields separated by '.', found {len(fields)}")
        access = EXCLUSIVE
        if version == SEQUENCER_ACCESS_PREFIX:
            access = Access.parse(fields.pop(3))  # the rest is laid out as pal2's
        _, key_id, lock_field, token_field, session_field, signature_field = fields
        if len(key_id) != KEY_ID_HEX_DIGITS or any(c not in "0123456789abcdef" for c in key_id):
            raise Malformed(f"the key id is {KEY_ID_HEX_DIGITS} lowercase hex digits")
        raw_lock = _b64url_decode(lock_field)
        if raw_lock is None:
            raise Malformed("the lock name is not canonical unpadded base64url")
        try:
            lock = raw_lock.decode("utf-8")
        except UnicodeDecodeError:
            raise Malformed("the lock name is not UTF-8") from None
        if not lock or len(raw_lock) > LOCK_NAME_BYTES_MAX or any(
            unicodedata.category(c) == "Cc" for c in lock
        ):
            raise Malformed("the lock name is empty, too long or has a control character")
        token = _decimal(token_field, "token", TOKEN_MAX)
        if token == 0:
            raise Malformed("the token is 0")
        session = _decimal(session_field, "session", SESSION_MAX)
        if session == 0 and access.kind != "exclusive":
            raise Malformed(f"the session of a {SEQUENCER_ACCESS_PREFIX} sequencer is 0; the service issues sessions from 1")
        signature = _b64url_decode(signature_field)
        if signature is None:
            raise Malformed("the signature is not canonical unpadded base64url")
        if len(signature) != SIGNATURE_BYTES:
            raise Malformed(f"the signature is {len(signature)} bytes, expected {SIGNATURE_BYTES}")
        return Sequencer(text, key_id, lock, token, session, signature, access)

    def verify(self, keys: Union[KeySet, PublicKey, str]) -> "VerifiedSequencer":
        keys = KeySet.of(keys)
        key = keys.get(self.key_id)
        if key is None:
            trusted = ", ".join(k.key_id for k in keys.keys)
            raise Forged(f"the sequencer names key {self.key_id}, which is not trusted here (trusted: {trusted})")
        signed = self.text[: len(self.text) - len(self.text.rsplit(".", 1)[1]) - 1].encode()
        if not key.verify_signature(signed, self.signature):
            raise Forged("the sequencer's signature does not verify")
        return VerifiedSequencer(self)

    def __str__(self) -> str:
        return self.text


@dataclasses.dataclass(frozen=True)
class VerifiedSequencer:
    """A sequencer whose signature verified with a trusted key: what the fence helpers take."""

    sequencer: Sequencer

    @property
    def lock(self) -> str:
        return self.sequencer.lock

    @property
    def token(self) -> int:
        return self.sequencer.token

    @property
    def session(self) -> int:
        return self.sequencer.session

    @property
    def key_id(self) -> str:
        return self.sequencer.key_id

    @property
    def access(self) -> Access:
        return self.sequencer.access

    @property
    def binding(self) -> str:
        """What a fence binds a scope to: the lock, or the lock and slot of a permit."""
        return self.sequencer.binding

    @property
    def text(self) -> str:
        return self.sequencer.text

    def __str__(self) -> str:
        return self.sequencer.text


def verify(text: Optional[str], keys: Union[KeySet, PublicKey, str]) -> VerifiedSequencer:
    """Parses ``text`` and verifies it with ``keys`` (a :class:`KeySet`, a :class:`PublicKey`, or
    the text form, as ``palisade pubkey`` prints it). Raises :class:`Malformed` or
    :class:`Forged`; a missing sequencer (``None`` or blank) is :class:`Malformed` too, though the
    fence helpers report it as ``missing``."""
    if text is None or not text.strip():
        raise Malformed("no sequencer presented")
    return Sequencer.parse(text.strip()).verify(keys)
