"""A lock service's key made in the test, for grants a healthy lock service never issues: the
same lock and token signed for two sessions, as a service restored from a backup hands out."""

from __future__ import annotations

import base64

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from palisade.sequencer import SEQUENCER_ACCESS_PREFIX, SEQUENCER_PREFIX, PublicKey, VerifiedSequencer, verify


def _b64url(raw: bytes) -> str:
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode("ascii")


class ServiceKey:
    """Signs sequencers in the lock service's text form; ``public`` verifies them."""

    def __init__(self) -> None:
        self._key = Ed25519PrivateKey.generate()
        self.public = PublicKey(
            self._key.public_key().public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
        )

    def grant(self, lock: str, token: int, session: int, access: str = "") -> VerifiedSequencer:
        """The grant of ``lock`` with ``token`` to ``session``, verified as a resource does: an
        exclusive one (pal2), or with ``access`` ``"s"`` (shared) or ``"p<slot>"`` (a permit) pal3."""
        lock_field = _b64url(lock.encode())
        signed = f"{SEQUENCER_PREFIX}.{self.public.key_id}.{lock_field}.{token}.{session}"
        if access:
            signed = f"{SEQUENCER_ACCESS_PREFIX}.{self.public.key_id}.{lock_field}.{access}.{token}.{session}"
        signature = self._key.sign(signed.encode("ascii"))
        return verify(f"{signed}.{_b64url(signature)}", self.public)
