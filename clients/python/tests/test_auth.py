"""Authentication and authorization: a real `palisade serve --tokens FILE --policy FILE`, tokens
made by `palisade token new` as an operator makes them, and clients that present no token, a
wrong one, or the token of an identity the policy grants some rights to (docs/security.md).
"""

from __future__ import annotations

import asyncio
import pathlib
import pickle
import subprocess
import time
from typing import Any, Iterator

import grpc
import pytest

import palisade
from palisade import _core, aio, errors
from palisade._proto import palisade_pb2 as pb

from .conftest import Server

# alice takes and reads locks under jobs/; bob only reads them; carol may hold one lock at a time
# under quota/; dave takes locks under jobs/ too (another identity, for owned sessions).
POLICY = """\
grant alice lock,read jobs/
grant bob   read      jobs/
grant carol lock,read quota/
quota carol locks=1
grant dave  lock,read jobs/
"""
IDENTITIES = ("alice", "bob", "carol", "dave")
# A well-formed token no token file has.
WRONG_TOKEN = "pst_" + "0" * 64


def new_token(binary: pathlib.Path, name: str) -> tuple[str, str]:
    """`palisade token new NAME`: the token, and the line for the token file."""
    ran = subprocess.run([str(binary), "token", "new", name], capture_output=True, text=True, timeout=30, check=True)
    token, line = ran.stdout.splitlines()[:2]
    assert token.startswith("pst_") and line.startswith(f"{name} ") and token not in line
    return token, line


class Secured:
    def __init__(self, server: Server, tokens: dict[str, str]) -> None:
        self.server = server
        self.endpoint = server.endpoint
        self.tokens = tokens

    def client(self, identity: str | None) -> palisade.Client:
        return palisade.Client([self.endpoint], token=self.tokens[identity] if identity else None)


@pytest.fixture(scope="module")
def secured(palisade_bin: pathlib.Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    directory = tmp_path_factory.mktemp("secured")
    tokens, lines = {}, ["# NAME SHA256HEX"]
    for name in IDENTITIES:
        tokens[name], line = new_token(palisade_bin, name)
        lines.append(line)
    (directory / "tokens").write_text("\n".join(lines) + "\n")
    (directory / "policy").write_text(POLICY)
    server = Server(
        palisade_bin,
        directory / "data",
        "--tokens",
        str(directory / "tokens"),
        "--policy",
        str(directory / "policy"),
        token=tokens["alice"],
    )
    yield Secured(server, tokens)
    server.stop()


def test_without_a_token_every_call_is_refused_as_unauthenticated(secured: Secured, unique: str) -> None:
    with secured.client(None) as anonymous:
        with pytest.raises(palisade.Unauthenticated) as refused:
            anonymous.status("jobs/x")
        assert refused.value.reason == "credential_missing"
        assert refused.value.kind == "unauthenticated"
        assert refused.value.error_class is palisade.ErrorClass.REFUSED
        assert isinstance(refused.value, palisade.Refused) and not refused.value.retryable
        assert refused.value.code is grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(palisade.Unauthenticated):
            anonymous.session(ttl=5)
        with pytest.raises(palisade.Unauthenticated):
            with anonymous.lock(f"jobs/{unique}", wait=0):
                pass


def test_a_wrong_token_is_refused_and_never_shown(secured: Secured) -> None:
    started = time.monotonic()
    with palisade.Client([secured.endpoint], token=WRONG_TOKEN) as forged:
        with pytest.raises(palisade.Unauthenticated) as refused:
            forged.session(ttl=5)
    assert refused.value.reason == "credential_unknown"
    assert WRONG_TOKEN not in str(refused.value) and WRONG_TOKEN not in repr(refused.value)
    # Refused at once: a refusal is final, not retried for the retry budget.
    assert time.monotonic() - started < 2


def test_an_identity_locks_under_its_prefix_and_is_denied_elsewhere_naming_the_right(
    secured: Secured, unique: str
) -> None:
    with secured.client("alice") as alice:
        with alice.lock(f"jobs/{unique}", ttl=5, wait=0) as grant:
            assert grant.token > 0
            holder = alice.status(f"jobs/{unique}").holder
            assert holder is not None and holder.token == grant.token
        with pytest.raises(palisade.PermissionDenied) as denied:
            with alice.lock(f"other/{unique}", ttl=5, wait=0):
                pytest.fail("alice locked a lock outside jobs/")
    error = denied.value
    assert (error.identity, error.right, error.scope) == ("alice", "lock", f"other/{unique}")
    assert error.kind == "permission_denied" and error.code is grpc.StatusCode.PERMISSION_DENIED
    assert isinstance(error, palisade.Refused) and error.error_class is palisade.ErrorClass.REFUSED
    assert '"alice"' in str(error) and "lock" in str(error) and f"other/{unique}" in str(error)
    # alice may not read other/ either: the read right is on jobs/ only.
    with secured.client("alice") as alice, pytest.raises(palisade.PermissionDenied) as denied:
        alice.status(f"other/{unique}")
    assert (denied.value.right, denied.value.scope) == ("read", f"other/{unique}")


def test_a_read_only_identity_reads_but_cannot_lock(secured: Secured, unique: str) -> None:
    with secured.client("bob") as bob:
        assert bob.status(f"jobs/{unique}").holder is None
        assert bob.list_locks(f"jobs/{unique}") == []
        # Opening a session needs only authentication; taking a lock needs the lock right.
        with bob.session(ttl=5) as session:
            with pytest.raises(palisade.PermissionDenied) as denied:
                session.acquire(f"jobs/{unique}", wait=0)
        assert (denied.value.identity, denied.value.right, denied.value.scope) == ("bob", "lock", f"jobs/{unique}")
        assert bob.status(f"jobs/{unique}").holder is None


def test_an_identity_at_its_lock_quota_is_refused_another_until_it_frees_one(secured: Secured, unique: str) -> None:
    with secured.client("carol") as carol, carol.session(ttl=5) as session:
        first = session.acquire(f"quota/{unique}/1", wait=0)
        with pytest.raises(palisade.QuotaReached) as refused:
            session.acquire(f"quota/{unique}/2", wait=0)
        error = refused.value
        assert (error.identity, error.quota, error.quota_max) == ("carol", "locks", 1)
        assert error.code is grpc.StatusCode.RESOURCE_EXHAUSTED
        # Refused (free something first), not NotApplied: it is not retried for the budget.
        assert isinstance(error, palisade.Refused) and not isinstance(error, palisade.NotApplied)
        assert error.error_class is palisade.ErrorClass.REFUSED
        first.release()
        second = session.acquire(f"quota/{unique}/2", wait=0)
        assert second.token > 0


def test_a_session_acts_only_for_the_identity_that_opened_it(secured: Secured, unique: str) -> None:
    with secured.client("alice") as alice, secured.client("dave") as dave:
        with alice.session(ttl=5) as session:
            with pytest.raises(palisade.SessionNotOwned) as refused:
                dave.acquire(session.credential, f"jobs/{unique}", wait=0)
            assert refused.value.session == session.id
            assert refused.value.kind == "session_not_owned"
            assert isinstance(refused.value, palisade.Refused)


def test_the_keepalive_stream_carries_the_token(secured: Secured, unique: str) -> None:
    # Without the token on the stream, every renewal would be refused and the lease run out.
    with secured.client("alice") as alice, alice.session(ttl=1, keepalive_interval=0.1) as session:
        grant = session.acquire(f"jobs/{unique}", wait=0)
        time.sleep(1.5)
        assert not grant.lost.is_set() and session.ended is None
        remaining = session.lease_remaining()
        assert remaining is not None and remaining > 0.5


def test_the_token_comes_from_the_environment_when_none_is_given(
    secured: Secured, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(palisade.AUTH_TOKEN_ENV, secured.tokens["alice"] + "\n")  # a file's newline
    with palisade.Client([secured.endpoint]) as alice:
        with alice.lock(f"jobs/{unique}", ttl=5, wait=0) as grant:
            assert grant.token > 0
        with pytest.raises(palisade.PermissionDenied) as denied:
            alice.status(f"other/{unique}")
        assert denied.value.identity == "alice"
    # An explicit token wins over the environment.
    with palisade.Client([secured.endpoint], token=secured.tokens["bob"]) as bob, bob.session(ttl=5) as session:
        with pytest.raises(palisade.PermissionDenied) as denied:
            session.acquire(f"jobs/{unique}", wait=0)
        assert denied.value.identity == "bob"
    monkeypatch.setenv(palisade.AUTH_TOKEN_ENV, "not a token")
    with pytest.raises(palisade.Misconfigured, match=r"\$PALISADE_AUTH_TOKEN: .*printable ASCII"):
        palisade.Client([secured.endpoint])
    monkeypatch.setenv(palisade.AUTH_TOKEN_ENV, "")
    with pytest.raises(palisade.Misconfigured, match=r"\$PALISADE_AUTH_TOKEN"):
        palisade.Client([secured.endpoint])


def test_the_asyncio_client_sends_the_token_and_raises_the_same_errors(
    secured: Secured, unique: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def main() -> None:
        anonymous = await aio.Client.connect([secured.endpoint])
        try:
            with pytest.raises(palisade.Unauthenticated):
                await anonymous.status(f"jobs/{unique}")
        finally:
            await anonymous.close()

        alice = await aio.Client.connect([secured.endpoint], token=secured.tokens["alice"])
        try:
            session = await alice.session(ttl=1, keepalive_interval=0.1)
            grant = await session.acquire(f"jobs/{unique}", wait=0)
            await asyncio.sleep(1.5)  # the keepalive stream renews with the token
            remaining = session.lease_remaining()
            assert not grant.lost.is_set() and remaining is not None and remaining > 0.5
            with pytest.raises(palisade.PermissionDenied) as denied:
                await session.acquire(f"other/{unique}", wait=0)
            assert (denied.value.identity, denied.value.right) == ("alice", "lock")
            await session.close()
        finally:
            await alice.close()

        monkeypatch.setenv(palisade.AUTH_TOKEN_ENV, secured.tokens["bob"])
        bob = await aio.Client.connect([secured.endpoint])
        try:
            assert (await bob.status(f"jobs/{unique}")).holder is None
        finally:
            await bob.close()

    asyncio.run(main())


# --- without a server -----------------------------------------------------------------------


def test_a_bearer_token_is_checked_as_the_rust_client_checks_it_and_never_shown() -> None:
    token = palisade.BearerToken("pst_abc\n")
    assert token.metadata == (("authorization", "Bearer pst_abc"),)
    assert repr(token) == str(token) == "BearerToken(…)"
    assert token == palisade.BearerToken(" pst_abc")
    with pytest.raises(TypeError):
        pickle.dumps(token)
    for bad in ("", "  \n", "x y", "x" * 257, "tök", "x\x00"):
        with pytest.raises(palisade.Misconfigured) as refused:
            palisade.BearerToken(bad)
        assert bad.strip() == "" or bad not in str(refused.value)
    assert palisade.BearerToken("a" * 256)
    stub = _core.AuthorizedStub(object(), token)
    assert "pst_abc" not in repr(stub)


def test_the_token_is_refused_before_anything_is_sent() -> None:
    # No server at this address: the bad token is named first.
    with pytest.raises(palisade.Misconfigured, match="printable ASCII"):
        palisade.Client(["127.0.0.1:1"], token="two words")


def test_the_authorization_refusals_map_to_their_classes() -> None:
    def error(kind: str, code: grpc.StatusCode, **fields: Any) -> errors.PalisadeError:
        detail = pb.ErrorDetail(kind=kind, **fields)
        return _core.Failure(_core.Failure.CORE, "refused", code, detail).error("the call")

    unauthenticated = error("unauthenticated", grpc.StatusCode.UNAUTHENTICATED, reason="credential_malformed")
    assert type(unauthenticated) is palisade.Unauthenticated and unauthenticated.reason == "credential_malformed"
    secret = error("session_secret_wrong", grpc.StatusCode.UNAUTHENTICATED, session=7)
    assert type(secret) is palisade.Unauthenticated and secret.reason is None
    denied = error("permission_denied", grpc.StatusCode.PERMISSION_DENIED, identity="a", right="admin", scope="*")
    assert type(denied) is palisade.PermissionDenied and (denied.identity, denied.right, denied.scope) == ("a", "admin", "*")
    not_owned = error("session_not_owned", grpc.StatusCode.PERMISSION_DENIED, session=9)
    assert type(not_owned) is palisade.SessionNotOwned and not_owned.session == 9
    quota = error("quota_reached", grpc.StatusCode.RESOURCE_EXHAUSTED, identity="a", quota="sessions", quota_max=3)
    assert type(quota) is palisade.QuotaReached and (quota.identity, quota.quota, quota.quota_max) == ("a", "sessions", 3)
    for refusal in (unauthenticated, denied, not_owned, quota):
        assert refusal.error_class is palisade.ErrorClass.REFUSED and not refusal.retryable
    # A final failure: not retried within the budget.
    assert _core.Retry(10).after(_core.Failure(_core.Failure.CORE, "x", grpc.StatusCode.RESOURCE_EXHAUSTED, pb.ErrorDetail(kind="quota_reached"))).final
