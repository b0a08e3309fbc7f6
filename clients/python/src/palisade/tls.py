"""TLS settings of a client: the CA the servers' certificates are checked against and, for mutual
TLS, the client's own certificate and key.

    tls = palisade.Tls.from_files("tls/ca.pem")                                      # server only
    tls = palisade.Tls.from_files("tls/ca.pem", "tls/client.pem", "tls/client.key")  # mutual
    client = palisade.Client(["10.0.0.1:7457", "10.0.0.2:7457"], tls=tls)

The files are the ones ``palisade tls init`` writes (docs/security.md). The server's certificate
must name the host of the endpoint the client dials (a DNS name or an IP address), as with the
Rust and Go clients. Everything is checked when the settings are made, as the Rust client checks
its files, so that nothing is left to the first handshake: a file that is missing or over
:data:`TLS_FILE_BYTES_MAX`, a CA file without a certificate that parses, a certificate without
its key or a key without its certificate, a key that does not belong to its certificate, and an
encrypted key (gRPC cannot decrypt one) are refused with :class:`errors.Misconfigured` naming the
file. The settings cannot be changed once made, the key is never shown (``repr``) and they cannot
be pickled.
"""

from __future__ import annotations

import os
import ssl
from typing import Any, NoReturn, Optional, Union

import grpc

from . import errors

#: Largest PEM file a client reads (a CA bundle of a few hundred certificates fits).
TLS_FILE_BYTES_MAX = 1 << 20

Path = Union[str, "os.PathLike[str]"]


class _Encrypted(Exception):
    """OpenSSL asked for the key's password."""


def _ask_password() -> NoReturn:
    raise _Encrypted  # never prompt on a terminal, as OpenSSL would without a callback


def _path(what: str, path: Any) -> str:
    if not isinstance(path, (str, os.PathLike)):
        raise errors.Misconfigured(f"the {what} is a file path, not {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):
        raise errors.Misconfigured(f"the {what} is a file path, not {type(text).__name__}")
    return text


def _size(what: str, path: str) -> None:
    """Refuses a file that cannot be read or is over the limit, without reading it."""
    try:
        size = os.stat(path).st_size
        if not os.access(path, os.R_OK):
            raise PermissionError(13, "Permission denied")
    except OSError as e:
        raise errors.Misconfigured(f"cannot read the {what} {path}: {e.strerror or e}") from None
    if size > TLS_FILE_BYTES_MAX:
        raise errors.Misconfigured(f"the {what} {path} is over {TLS_FILE_BYTES_MAX} bytes")


def _read(what: str, path: str) -> bytes:
    _size(what, path)
    try:
        with open(path, "rb") as f:
            data = f.read(TLS_FILE_BYTES_MAX + 1)
    except OSError as e:
        raise errors.Misconfigured(f"cannot read the {what} {path}: {e.strerror or e}") from None
    if len(data) > TLS_FILE_BYTES_MAX:
        raise errors.Misconfigured(f"the {what} {path} is over {TLS_FILE_BYTES_MAX} bytes")
    return data


def _check_ca(path: str, pem: bytes) -> None:
    try:
        text = pem.decode("ascii")
    except UnicodeDecodeError:
        raise errors.Misconfigured(f"the TLS CA {path} is not PEM text") from None
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise errors.Misconfigured(f"the TLS CA {path} has no CERTIFICATE PEM block")
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=text)
    except ssl.SSLError as e:
        raise errors.Misconfigured(f"the TLS CA {path} holds a certificate that does not parse: {e}") from None


def _check_pair(cert: str, key: str) -> None:
    """The certificate and key parse, the key is not encrypted, and it belongs to the
    certificate. OpenSSL reads the key; this process holds none of its bytes if it is refused."""
    _size("client certificate", cert)
    _size("client key", key)
    try:
        ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(cert, key, password=_ask_password)
    except _Encrypted:
        raise errors.Misconfigured(f"the client key {key} is encrypted; gRPC needs it unencrypted") from None
    except ssl.SSLError as e:
        raise errors.Misconfigured(
            f"the client certificate {cert} and key {key} do not load as a pair ({e.reason or e}): "
            "a certificate PEM block, and the private key that belongs to it"
        ) from None


class Tls:
    """TLS to every endpoint of a client: ``ca``, the file of PEM certificates the servers'
    certificates must chain to, and for mutual TLS ``cert`` and ``key``, the client's certificate
    (chain) and its private key, both or neither. ``Tls.from_files`` is the same call."""

    __slots__ = ("_ca", "_cert", "_key", "_source")
    _ca: bytes
    _cert: Optional[bytes]
    _key: Optional[bytes]
    _source: str

    def __init__(self, ca: Path, cert: Optional[Path] = None, key: Optional[Path] = None) -> None:
        if (cert is None) != (key is None):
            raise errors.Misconfigured(
                "a client certificate needs its key" if key is None else "a client key needs its certificate"
            )
        ca_path = _path("TLS CA", ca)
        ca_pem = _read("TLS CA", ca_path)
        _check_ca(ca_path, ca_pem)
        source = f"ca={ca_path}"
        cert_pem = key_pem = None
        if cert is not None and key is not None:
            cert_path, key_path = _path("client certificate", cert), _path("client key", key)
            _check_pair(cert_path, key_path)
            cert_pem, key_pem = _read("client certificate", cert_path), _read("client key", key_path)
            source += f" cert={cert_path} key={key_path}"
        object.__setattr__(self, "_ca", ca_pem)
        object.__setattr__(self, "_cert", cert_pem)
        object.__setattr__(self, "_key", key_pem)
        object.__setattr__(self, "_source", source)

    @classmethod
    def from_files(cls, ca: Path, cert: Optional[Path] = None, key: Optional[Path] = None) -> "Tls":
        """Reads and checks the CA and, for mutual TLS, the client's certificate and key."""
        return cls(ca, cert, key)

    @property
    def ca(self) -> bytes:
        """The CA certificates, PEM."""
        return self._ca

    @property
    def cert(self) -> Optional[bytes]:
        """The client's certificate (chain), PEM, for mutual TLS."""
        return self._cert

    @property
    def mutual(self) -> bool:
        """Whether the client presents a certificate of its own."""
        return self._cert is not None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials for these settings (for blocking and asyncio channels alike)."""
        return grpc.ssl_channel_credentials(
            root_certificates=self._ca, private_key=self._key, certificate_chain=self._cert
        )

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise AttributeError(f"palisade.Tls cannot be changed; make another (setting {name})")

    def __delattr__(self, name: str) -> NoReturn:
        raise AttributeError(f"palisade.Tls cannot be changed; make another (deleting {name})")

    def __repr__(self) -> str:
        return f"Tls({self._source})"

    def __reduce__(self) -> Any:  # no pickling a private key into a file or another process
        raise TypeError("palisade.Tls holds a private key and cannot be pickled")
