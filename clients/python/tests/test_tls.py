"""TLS: real `palisade serve --tls-cert ... --tls-key ...` processes with the files `palisade tls
init` writes, reached by the blocking and the asyncio client; mutual TLS with the client
certificate as the identity a policy grants rights to; a three-node TLS cluster whose leader
hint is followed outside the given endpoints (N14); and the settings refused before anything is
sent (docs/security.md, clients/python/README.md "TLS").
"""

from __future__ import annotations

import asyncio
import pathlib
import pickle
import subprocess
import time
from typing import Iterator

import pytest

import palisade
from palisade import _core, aio, errors

from .conftest import Server, start_cluster, wait_for_leader


@pytest.fixture(scope="module")
def tls_dir(palisade_bin: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """`palisade tls init`: ca.pem, server.pem/key (localhost, 127.0.0.1), client-ca.pem,
    client.pem/key (common name palisade-client)."""
    directory = tmp_path_factory.mktemp("tls")
    subprocess.run([str(palisade_bin), "tls", "init", str(directory)], check=True, capture_output=True, timeout=30)
    return directory


@pytest.fixture(scope="module")
def other_tls(palisade_bin: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> pathlib.Path:
    """Another `palisade tls init`, for 127.0.0.1 only: its CA signed none of `tls_dir`'s
    certificates, and its node certificate does not name localhost."""
    directory = tmp_path_factory.mktemp("other-tls")
    subprocess.run(
        [str(palisade_bin), "tls", "init", str(directory), "--host", "127.0.0.1"],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return directory


def serve_args(tls_dir: pathlib.Path) -> list[str]:
    return ["--tls-cert", str(tls_dir / "server.pem"), "--tls-key", str(tls_dir / "server.key")]


@pytest.fixture(scope="module")
def tls_server(
    palisade_bin: pathlib.Path, tls_dir: pathlib.Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    srv = Server(
        palisade_bin,
        tmp_path_factory.mktemp("tls-server") / "data",
        *serve_args(tls_dir),
        tls=palisade.Tls.from_files(tls_dir / "ca.pem"),
    )
    yield srv
    srv.stop()


def test_a_client_trusting_the_ca_locks_over_tls_and_its_keepalive_holds_the_lease(
    tls_server: Server, tls_dir: pathlib.Path, unique: str
) -> None:
    tls = palisade.Tls.from_files(tls_dir / "ca.pem")
    with palisade.Client([f"https://{tls_server.endpoint}"], tls=tls) as client:
        session = client.session(ttl=1)
        grant = session.acquire(unique)
        assert grant.token > 0
        # Three TTLs: only renewals on the keepalive stream, over TLS too, keep the lease.
        time.sleep(3)
        assert not grant.lost.is_set(), grant.lost_reason
        holder = client.status(unique).holder
        assert holder is not None and holder.token == grant.token
        verified = palisade.verify(grant.sequencer, client.public_keys())
        assert (verified.lock, verified.token) == (unique, grant.token)
        grant.release()
        session.close()
        assert client.status(unique).holder is None
    # `localhost` is in the certificate too: the name dialled is what is checked.
    with palisade.Client([f"localhost:{tls_server.port}"], tls=tls) as by_name:
        assert by_name.status(unique).holder is None


def test_the_asyncio_client_locks_over_tls(
    tls_server: Server, tls_dir: pathlib.Path, other_tls: pathlib.Path, unique: str
) -> None:
    async def run() -> None:
        tls = palisade.Tls.from_files(tls_dir / "ca.pem")
        async with await aio.Client.connect(tls_server.endpoint, tls=tls) as client:
            async with client.lock(unique, ttl=5) as grant:
                status = await client.status(unique)
                assert status.holder is not None and status.holder.token == grant.token
            assert (await client.status(unique)).holder is None
        with pytest.raises(errors.Unreachable, match="CERTIFICATE_VERIFY_FAILED"):
            await aio.Client.connect(
                tls_server.endpoint, tls=palisade.Tls.from_files(other_tls / "ca.pem"), connect_timeout=1
            )

    asyncio.run(run())


def test_a_server_whose_certificate_fails_a_check_is_sent_nothing(
    palisade_bin: pathlib.Path, tls_server: Server, other_tls: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    other = palisade.Tls.from_files(other_tls / "ca.pem")
    # Another CA: the handshake fails, and the client says why, as gRPC reports it.
    with pytest.raises(errors.Unreachable, match="CERTIFICATE_VERIFY_FAILED") as refused:
        palisade.Client([tls_server.endpoint], tls=other, connect_timeout=1)
    assert str(other_tls / "ca.pem") in str(refused.value)
    # A certificate from the CA trusted, but for 127.0.0.1 only: dialled by that address it is
    # accepted, dialled as localhost it is not.
    narrow = Server(palisade_bin, tmp_path / "data", *serve_args(other_tls), tls=other)
    try:
        with palisade.Client([narrow.endpoint], tls=other) as by_address:
            by_address.public_keys()
        with pytest.raises(errors.Unreachable, match="Hostname Verification"):
            palisade.Client([f"localhost:{narrow.port}"], tls=other, connect_timeout=1)
    finally:
        narrow.stop()
    # Plaintext to a TLS server gets no answer.
    with pytest.raises(errors.Unreachable):
        palisade.Client([tls_server.endpoint], connect_timeout=1)


def test_under_mutual_tls_the_client_certificate_is_the_identity_the_policy_grants_rights_to(
    palisade_bin: pathlib.Path, tls_dir: pathlib.Path, tmp_path: pathlib.Path, unique: str
) -> None:
    policy = tmp_path / "policy"
    policy.write_text("grant palisade-client lock,read tls/\n")
    mutual = palisade.Tls.from_files(tls_dir / "ca.pem", tls_dir / "client.pem", tls_dir / "client.key")
    server = Server(
        palisade_bin,
        tmp_path / "data",
        *serve_args(tls_dir),
        "--tls-client-ca",
        str(tls_dir / "client-ca.pem"),
        "--policy",
        str(policy),
        tls=mutual,
    )
    try:
        with palisade.Client([server.endpoint], tls=mutual) as client:
            with client.lock(f"tls/{unique}", ttl=5) as grant:
                assert grant.token > 0
            with pytest.raises(palisade.PermissionDenied) as denied:
                client.status(f"elsewhere/{unique}")
            assert (denied.value.identity, denied.value.right) == ("palisade-client", "read")
        # No client certificate: the server ends the handshake, so no connection is made.
        with pytest.raises(errors.Unreachable):
            palisade.Client([server.endpoint], tls=palisade.Tls.from_files(tls_dir / "ca.pem"), connect_timeout=1)
    finally:
        server.stop()


def test_with_tls_a_leader_hint_outside_the_given_endpoints_is_followed(
    palisade_bin: pathlib.Path, tls_dir: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    tls = palisade.Tls.from_files(tls_dir / "ca.pem")
    nodes = start_cluster(palisade_bin, tmp_path, *serve_args(tls_dir), "--tls-peer-ca", str(tls_dir / "ca.pem"))
    try:
        endpoints = [node.endpoint for node in nodes]
        leader = wait_for_leader(endpoints, tls)
        follower = next(e for e in endpoints if e != leader)
        # Given only a follower, the client goes where the follower's answer says: over TLS the
        # member that named the leader was authenticated, and so is the leader.
        with palisade.Client([follower], tls=tls) as lone:
            with lone.lock("tls/cluster", ttl=5) as grant:
                assert lone.endpoint == leader
                assert grant.token > 0
    finally:
        for node in nodes:
            node.stop()


# --- settings refused before anything is sent ----------------------------------------------


def test_tls_settings_are_checked_when_made(
    tls_dir: pathlib.Path, other_tls: pathlib.Path, tmp_path: pathlib.Path
) -> None:
    ca, cert, key = tls_dir / "ca.pem", tls_dir / "client.pem", tls_dir / "client.key"
    with pytest.raises(errors.Misconfigured, match="cannot read the TLS CA .*missing.pem"):
        palisade.Tls.from_files(tmp_path / "missing.pem")
    with pytest.raises(errors.Misconfigured, match="no CERTIFICATE PEM block"):
        palisade.Tls.from_files(key)
    big = tmp_path / "big.pem"
    big.write_bytes(b"#" * (palisade.TLS_FILE_BYTES_MAX + 1))
    with pytest.raises(errors.Misconfigured, match=f"over {palisade.TLS_FILE_BYTES_MAX} bytes"):
        palisade.Tls.from_files(big)
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n")
    with pytest.raises(errors.Misconfigured, match="garbage.pem holds a certificate that does not parse"):
        palisade.Tls.from_files(garbage)
    with pytest.raises(errors.Misconfigured, match="needs its key"):
        palisade.Tls.from_files(ca, cert)
    with pytest.raises(errors.Misconfigured, match="needs its certificate"):
        palisade.Tls.from_files(ca, key=key)
    # A key that is not the certificate's (another `tls init`'s), and no key at all.
    with pytest.raises(errors.Misconfigured, match="do not load as a pair.*KEY_VALUES_MISMATCH"):
        palisade.Tls.from_files(ca, cert, other_tls / "client.key")
    with pytest.raises(errors.Misconfigured, match="do not load as a pair"):
        palisade.Tls.from_files(ca, cert, cert)
    # An encrypted key is refused, not prompted for.
    encrypted = tmp_path / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(key), "-out", str(encrypted), "-aes256", "-passout", "pass:secret"],
        check=True,
        capture_output=True,
    )
    with pytest.raises(errors.Misconfigured, match="encrypted.key is encrypted"):
        palisade.Tls.from_files(ca, cert, encrypted)
    with pytest.raises(errors.Misconfigured, match="file path, not bytes"):
        palisade.Tls(ca.read_bytes())  # type: ignore[arg-type]
    with pytest.raises(errors.Misconfigured, match="tls is a palisade.Tls"):
        palisade.Client(["127.0.0.1:1"], tls=str(ca))  # type: ignore[arg-type]


def test_the_settings_cannot_be_changed_shown_or_pickled(tls_dir: pathlib.Path) -> None:
    key = (tls_dir / "client.key").read_bytes()
    tls = palisade.Tls.from_files(tls_dir / "ca.pem", tls_dir / "client.pem", tls_dir / "client.key")
    assert tls.mutual and tls.ca == (tls_dir / "ca.pem").read_bytes()
    shown = repr(tls)
    assert "PRIVATE" not in shown and key.decode() not in shown and "client.key" in shown
    with pytest.raises(TypeError, match="cannot be pickled"):
        pickle.dumps(tls)
    # Without a CA, gRPC would trust the public roots: the settings cannot be emptied.
    with pytest.raises(AttributeError, match="cannot be changed"):
        tls.ca = None  # type: ignore[misc, assignment]
    with pytest.raises(AttributeError, match="cannot be changed"):
        tls._ca = b""
    with pytest.raises(AttributeError, match="cannot be changed"):
        del tls._key
    assert tls.credentials() is not None


def test_the_scheme_must_match_the_settings() -> None:
    assert _core.parse_endpoints(["https://10.0.0.1:7457/", "10.0.0.2:7457"], tls=True) == [
        "10.0.0.1:7457",
        "10.0.0.2:7457",
    ]
    with pytest.raises(errors.InvalidEndpoint, match="https:// needs TLS settings"):
        _core.parse_endpoints(["https://10.0.0.1:7457"])
    with pytest.raises(errors.InvalidEndpoint, match="http:// asks for plaintext but TLS is configured"):
        _core.parse_endpoints(["http://10.0.0.1:7457"], tls=True)


def test_with_tls_a_leader_outside_the_list_is_followed_and_its_failure_marks_no_member() -> None:
    """The Rust client's `a_leader_outside_the_list_that_fails_does_not_mark_the_member_that_named_it`."""
    now = [100.0]
    configured = ["10.0.0.1:7457", "10.0.0.2:7457", "10.0.0.3:7457"]
    endpoints = _core.Endpoints(configured, 2, lambda target: target, clock=lambda: now[0], tls=True)

    def failure(kind: str, leader: str | None = None) -> _core.Failure:
        return _core.Failure(kind, "test", leader=leader)

    endpoints.after_failure(0, failure(_core.Failure.UNKNOWN))  # the third fails
    assert endpoints.current().target == "10.0.0.1:7457"
    now[0] += 1
    endpoints.after_failure(1, failure(_core.Failure.NOT_LEADER, "10.0.0.9:7457"))
    assert endpoints.current().target == "10.0.0.9:7457"
    # That leader fails: on to the second, and the first is not marked failed.
    endpoints.after_failure(2, failure(_core.Failure.UNKNOWN))
    assert endpoints.current().target == "10.0.0.2:7457"
    # The second fails: the first has not failed, the third has, so the first.
    endpoints.after_failure(3, failure(_core.Failure.NOT_APPLIED))
    assert endpoints.current().target == "10.0.0.1:7457"

    # gRPC's target forms are not host:port, in a hint or an endpoint.
    for form in ("dns:localhost:7457", "ipv4:127.0.0.1:7457", "unix:sock:7457"):
        assert _core.leader_hint(form) is None
        with pytest.raises(errors.InvalidEndpoint):
            _core.parse_endpoints([form])
    assert _core.leader_hint("[::1]:7457") == "[::1]:7457"
    assert _core.leader_hint("a" * 600 + ":7457") is None

    # Without TLS the same hint is not followed (N14): on to the next configured endpoint.
    plain = _core.Endpoints(configured, 0, lambda target: target, clock=lambda: now[0])
    plain.after_failure(0, failure(_core.Failure.NOT_LEADER, "10.0.0.9:7457"))
    assert plain.current().target == "10.0.0.2:7457"


def test_a_client_follows_at_most_so_many_leaders_outside_its_list() -> None:
    """Each leader followed outside the list keeps a channel until the client closes: the number
    is bounded, and past it a hint is not followed (the configured endpoints still are)."""
    configured = ["10.0.0.1:7457", "10.0.0.2:7457"]
    endpoints = _core.Endpoints(configured, 0, lambda target: target, tls=True)
    generation = 0
    for n in range(_core.OUTSIDE_LEADERS_MAX):
        endpoints.after_failure(generation, _core.Failure(_core.Failure.NOT_LEADER, "test", leader=f"10.1.0.{n}:7457"))
        generation += 1
        assert endpoints.current().target == f"10.1.0.{n}:7457"
    # One more address: not followed, on to the next configured endpoint instead.
    endpoints.after_failure(generation, _core.Failure(_core.Failure.NOT_LEADER, "test", leader="10.2.0.1:7457"))
    generation += 1
    assert endpoints.current().target == "10.0.0.2:7457"
    assert len(endpoints.stubs()) == len(configured) + _core.OUTSIDE_LEADERS_MAX
    # An address already followed still is, and so is a configured one.
    endpoints.after_failure(generation, _core.Failure(_core.Failure.NOT_LEADER, "test", leader="10.1.0.3:7457"))
    generation += 1
    assert endpoints.current().target == "10.1.0.3:7457"
    endpoints.after_failure(generation, _core.Failure(_core.Failure.NOT_LEADER, "test", leader="10.0.0.1:7457"))
    assert endpoints.current().target == "10.0.0.1:7457"
