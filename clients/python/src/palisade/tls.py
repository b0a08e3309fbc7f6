"""TLS settings of a client: the CA the servers' certificates are checked against and, for mutual
TLS, the client's own certificate and key.

    tls = palisade.Tls.from_files("tls/ca.pem")                                  # server only
    tls = palisade.Tls.from_files("tls/ca.pem", "tls/client.pem", "tls/client.key")  # mutual
    client = palisade.Client(["10.0.0.1:7457", "10.0.0.2:7457"], tls=tls)

The files are the ones ``palisade tls init`` writes (docs/security.md). The server's certificate
must name the host of the endpoint the client dials (a DNS name or an IP address), as with the
Rust and Go clients. The settings are checked when made: a file that is missing, over
:data:`TLS_FILE_BYTES_MAX`, or without a PEM block of the expected kind is refused with
:class:`errors.Misconfigured` naming it, and so is a certificate without its key or a key
without its certificate. The key is never shown (``repr``) and cannot be pickled.
"""

from __future__ import annotations

import os
from typing import Any, Optional, Union

import grpc

from . import errors

#: Largest PEM file a client reads (a CA bundle of a few hundred certificates fits).
TLS_FILE_BYTES_MAX = 1 << 20

_CERTIFICATE = b"CERTIFICATE-----"
_PRIVATE_KEY = b"PRIVATE KEY-----"


def _read(what: str, path: str) -> bytes:
    try:
        with open(path, "rb") as f:
            data = f.read(TLS_FILE_BYTES_MAX + 1)
    except OSError as e:
        raise errors.Misconfigured(f"cannot read the {what} {path}: {e.strerror or e}") from None
    if len(data) > TLS_FILE_BYTES_MAX:
        raise errors.Misconfigured(f"the {what} {path} is over {TLS_FILE_BYTES_MAX} bytes")
    return data


def _check(what: str, where: str, data: Any, marker: bytes, kind: str) -> bytes:
    """``data`` if it is PEM bytes within the limit with a ``kind`` block, else
    :class:`errors.Misconfigured` naming ``what`` (and ``where``, its file)."""
    if not isinstance(data, bytes):
        raise errors.Misconfigured(f"the {what} is PEM bytes, not {type(data).__name__}")
    if len(data) > TLS_FILE_BYTES_MAX:
        raise errors.Misconfigured(f"the {what}{where} is over {TLS_FILE_BYTES_MAX} bytes")
    found = any(line.strip().startswith(b"-----BEGIN ") and line.strip().endswith(marker) for line in data.splitlines())
    if not found:
        raise errors.Misconfigured(f"the {what}{where} has no {kind} PEM block")
    return data


def _pair(cert: Any, key: Any) -> None:
    if (cert is None) != (key is None):
        raise errors.Misconfigured(
            "a client certificate needs its key" if key is None else "a client key needs its certificate"
        )


#: The parts of the settings: name, what a message calls it, the end of its PEM marker, its kind.
_PARTS = (
    ("ca", "TLS CA", _CERTIFICATE, "CERTIFICATE"),
    ("cert", "client certificate", _CERTIFICATE, "CERTIFICATE"),
    ("key", "client key", _PRIVATE_KEY, "PRIVATE KEY"),
)


class Tls:
    """TLS to every endpoint of a client: ``ca``, the PEM certificates that the servers'
    certificates must chain to, and for mutual TLS ``cert`` and ``key``, the client's certificate
    (chain) and private key, both or neither. :meth:`from_files` reads them from files."""

    __slots__ = ("ca", "cert", "_key", "_source")

    def __init__(self, ca: bytes, cert: Optional[bytes] = None, key: Optional[bytes] = None) -> None:
        self._set({"ca": ca, "cert": cert, "key": key}, {})

    def _set(self, pem: dict[str, Any], files: dict[str, str]) -> None:
        """Checks and keeps ``pem`` (by part name), read from ``files`` if given."""
        _pair(pem["cert"], pem["key"])
        for name, what, marker, kind in _PARTS:
            if name == "ca" or pem[name] is not None:
                _check(what, f" {files[name]}" if name in files else "", pem[name], marker, kind)
        self.ca: bytes = pem["ca"]
        self.cert: Optional[bytes] = pem["cert"]
        self._key: Optional[bytes] = pem["key"]
        self._source = " ".join(f"{name}={files[name]}" for name, *_ in _PARTS if name in files)

    @classmethod
    def from_files(
        cls,
        ca: Union[str, "os.PathLike[str]"],
        cert: Union[str, "os.PathLike[str]", None] = None,
        key: Union[str, "os.PathLike[str]", None] = None,
    ) -> "Tls":
        """Reads the CA and, for mutual TLS, the client's certificate and key (both or neither)."""
        _pair(cert, key)
        paths = {"ca": ca, "cert": cert, "key": key}
        for (name, what, *_), path in zip(_PARTS, paths.values()):
            if path is not None and not isinstance(path, (str, os.PathLike)):
                raise errors.Misconfigured(f"the {what} is a file path, not {type(path).__name__}")
        files = {name: os.fspath(path) for name, path in paths.items() if path is not None}
        pem = {name: _read(what, files[name]) if name in files else None for name, what, *_ in _PARTS}
        tls = cls.__new__(cls)
        tls._set(pem, files)
        return tls

    @property
    def mutual(self) -> bool:
        """Whether the client presents a certificate of its own."""
        return self.cert is not None

    def credentials(self) -> grpc.ChannelCredentials:
        """gRPC channel credentials for these settings (for blocking and asyncio channels alike)."""
        return grpc.ssl_channel_credentials(
            root_certificates=self.ca, private_key=self._key, certificate_chain=self.cert
        )

    def __repr__(self) -> str:
        shown = self._source or ("ca, cert, key (in memory)" if self.mutual else "ca (in memory)")
        return f"Tls({shown})"

    def __reduce__(self) -> Any:  # no pickling a private key into a file or another process
        raise TypeError("palisade.Tls holds a private key and cannot be pickled")
