"""The hand-out policy of whole-model replicas, on its own (no ranks): work stealing in small
units, and rows that share a prompt prefix kept on one replica."""

from __future__ import annotations

from collections import Counter

from macbatch.engine.distributed.handout import Handout


def test_a_replica_that_finishes_slower_gets_fewer_requests() -> None:
    """Replica 1 finishes one request per tick, replica 0 three: it gets about a third as many,
    and no replica ever holds more than its window."""
    handout = Handout(replicas=2, window=4, unit=2)
    for i in range(120):
        handout.add(f"r{i}", prefix="same")
    held: list[list[str]] = [[], []]
    done = Counter[int]()
    while len(handout) or any(held):
        for replica, request_ids in handout.assign().items():
            held[replica] += request_ids
        assert all(len(h) <= 4 for h in held)
        for replica, speed in ((0, 3), (1, 1)):
            for _ in range(min(speed, len(held[replica]))):
                held[replica].pop(0)
                handout.finished(replica)
                done[replica] += 1
    assert done[0] + done[1] == 120
    assert 2.5 <= done[0] / done[1] <= 3.5, done


def test_rows_that_share_a_prefix_go_to_the_same_replica() -> None:
    """Two groups of rows queued interleaved: each replica keeps to one group while it lasts."""
    handout = Handout(replicas=2, window=100, unit=4)
    for i in range(16):
        handout.add(f"a{i}", prefix="system A")
        handout.add(f"b{i}", prefix="system B")
    given = handout.assign()
    assert {request_id[0] for request_id in given[0]} == {"a"}
    assert {request_id[0] for request_id in given[1]} == {"b"}
    assert len(given[0]) == len(given[1]) == 16


def test_taken_back_requests_are_not_handed_out() -> None:
    handout = Handout(replicas=1, window=10, unit=4)
    for i in range(3):
        handout.add(f"r{i}", prefix=i)
    assert handout.remove("r1") and not handout.remove("r1")
    assert handout.assign() == {0: ["r0", "r2"]}
    assert not handout.remove("r0")  # handed out already: the replica's to abort
