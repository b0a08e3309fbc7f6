"""Following the leader of a real three-node cluster, and riding out a `kill -9` of it."""

import pathlib
import time
from typing import Iterator

import pytest

import palisade

from .conftest import Server, start_cluster, wait_for_leader


@pytest.fixture
def cluster(palisade_bin: pathlib.Path, tmp_path: pathlib.Path) -> Iterator[list[Server]]:
    nodes = start_cluster(palisade_bin, tmp_path)
    yield nodes
    for node in nodes:
        node.stop()


def test_calls_follow_the_leader_and_a_session_survives_its_kill(cluster: list[Server]) -> None:
    endpoints = [node.endpoint for node in cluster]
    leader = wait_for_leader(endpoints)
    followers = [e for e in endpoints if e != leader]

    # A client given a follower first is sent to the leader by the follower's answer.
    with palisade.Client(followers + [leader]) as follower_first:
        assert follower_first.endpoint == followers[0]
        with follower_first.lock("cluster/a", ttl=5) as grant:
            assert follower_first.endpoint == leader, "the follower named the leader and the client went there"
            assert grant.token > 0

    # N14: a client given only a follower is not sent to the leader, an address it was not
    # given (this client has no TLS to prove it a member, and calls carry the token and secrets):
    # the call fails once its budget is spent, naming the leader.
    with palisade.Client(followers[:1], retry_budget=1) as lone:
        with pytest.raises(palisade.PalisadeError, match="the leader is at"):
            lone.status("cluster/a")
        assert lone.endpoint == followers[0]

    # A holder keeps its lock across a kill -9 of the leader: the keepalive moves to the new one.
    with palisade.Client(endpoints) as holder_client:
        session = holder_client.session(5)
        grant = session.acquire("cluster/b")
        next(node for node in cluster if node.endpoint == leader).kill()
        time.sleep(6)  # longer than the ttl: only renewals through the new leader keep it
        assert not grant.lost.is_set(), grant.lost_reason
        assert holder_client.endpoint != leader
        status = holder_client.status("cluster/b")
        assert status.holder is not None and status.holder.token == grant.token
        with palisade.Client(followers) as other:
            with other.session(5) as contender, pytest.raises(palisade.Busy):
                contender.acquire("cluster/b", wait=0)
            grant.release()
            with other.lock("cluster/b", ttl=5, wait=5) as after:
                assert after.token > grant.token, "tokens keep growing across the failover"
        session.close()
