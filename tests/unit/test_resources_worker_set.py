"""WorkerSet membership logic with a fake placer (no Ray): deaths are handled once, replacements go into
the dead worker's slot, a replacement that cannot be placed is retried at every health check, elastic
growth fills the preferred pool's room, and a shut-down worker set neither replaces nor grows."""

from __future__ import annotations

import threading

from rollart.resources.worker_set import WorkerSet, Member
from rollart.resources.errors import PlacementError
from rollart.resources.health import ActorState
from rollart.resources.accounts import Placement


class FakeActor:
    def __init__(self, n: int) -> None:
        self._actor_id = type("Id", (), {"hex": lambda _self, n=n: f"actor{n:04d}"})()


class FakePlacer:
    def __init__(self, room: float = 0.0) -> None:
        self.made = 0
        self.fail_next = 0
        self.room_left = room
        self.released: list[str] = []
        self.deaths: list[str] = []
        self.replacements: list[str] = []
        self.forgotten = False

    def member(self, slot: int, pool: str = "a") -> Member:
        self.made += 1
        placed = Placement(f"r/{pool}/{slot}", "r", pool, slot, "a", 1.0, "cpu")
        return Member(slot, placed, FakeActor(self.made))

    def spawn(self, slot: int, growing: bool = False) -> Member:
        if self.fail_next:
            self.fail_next -= 1
            raise PlacementError("no room")
        if growing:
            self.room_left -= 1
        return self.member(slot, "a" if growing else "b")

    def release(self, members) -> None:
        self.released += [m.worker for m in members if not m.released]
        for m in members:
            m.released = True

    def record_death(self, member) -> None:
        self.deaths.append(member.worker)

    def record_replacement(self, pool: str) -> None:
        self.replacements.append(pool)

    def room(self, pool: str) -> float:
        return self.room_left

    def submit(self, fn) -> None:
        fn()  # synchronously: the logic, not the threading, is under test

    def forget(self, worker_set) -> None:
        self.forgotten = True


def make(placer: FakePlacer, n: int = 2, **policy) -> tuple[WorkerSet, list]:
    worker_set = WorkerSet("r", [placer.member(i) for i in range(n)], placer, chain=("a", "b"), **policy)
    events: list = []
    lock = threading.Lock()

    def add(e) -> None:
        with lock:
            events.append(e)

    worker_set.on_change(add)
    return worker_set, events


def test_a_death_is_handled_once_and_replaced_in_its_slot_on_the_chain():
    placer = FakePlacer()
    worker_set, events = make(placer, replace_dead=True)
    dead = worker_set.members()[1]
    assert worker_set.report_dead(dead.actor, "SIGKILL") is True
    assert worker_set.report_dead(dead.actor, "again") is False
    worker_set.check({dead.actor_id: ActorState("DEAD", "gone")})  # the health check agrees: nothing new
    assert [(e.kind, e.slot) for e in events] == [("died", 1), ("joined", 1)]
    assert events[0].cause == "SIGKILL" and events[1].pool == "b"  # the fake places replacements on "b"
    assert placer.deaths == ["r/a/1"] and placer.replacements == ["a"] and placer.released == ["r/a/1"]
    assert [m.slot for m in worker_set.members()] == [0, 1] and worker_set.names == ["r/a/0", "r/b/1"]


def test_a_replacement_without_room_is_retried_at_every_health_check():
    placer = FakePlacer()
    worker_set, events = make(placer, replace_dead=True)
    placer.fail_next = 2
    worker_set.report_dead(worker_set.members()[0].actor, "node left")
    assert [e.kind for e in events] == ["died", "unplaced"] and len(worker_set) == 1
    assert events[1].cause == "no room"
    worker_set.check({})
    assert len(worker_set) == 1  # second failure: not announced again
    worker_set.check({})
    assert [e.kind for e in events] == ["died", "unplaced", "joined"] and len(worker_set) == 2
    assert placer.replacements == ["a"]


def test_without_replace_dead_the_death_is_only_reported():
    placer = FakePlacer()
    worker_set, events = make(placer)
    worker_set.check({worker_set.members()[0].actor_id: ActorState("DEAD", "crashed")})
    assert [(e.kind, e.cause) for e in events] == [("died", "crashed")]
    worker_set.check({})
    assert len(worker_set) == 1 and placer.replacements == []


def test_elastic_growth_fills_the_room_of_the_preferred_pool_only_when_elastic():
    placer = FakePlacer(room=2)
    worker_set, events = make(placer, n=1)
    worker_set.grow()
    assert len(worker_set) == 1  # not elastic: nothing
    worker_set.elastic = True
    worker_set.grow()
    assert [(e.kind, e.slot, e.pool) for e in events] == [("joined", 1, "a"), ("joined", 2, "a")]
    assert len(worker_set) == 3 and placer.room_left == 0


def test_a_shut_down_cluster_releases_everyone_and_replaces_no_one():
    placer = FakePlacer()
    worker_set, events = make(placer, replace_dead=True)
    actor = worker_set.members()[0].actor
    worker_set.shutdown()
    worker_set.shutdown()
    assert placer.forgotten and sorted(placer.released) == ["r/a/0", "r/a/1"]
    assert worker_set.report_dead(actor, "late news") is False and events == []


def test_a_call_that_raised_another_actors_death_is_not_the_workers_death():
    """Ray wraps an ActorDiedError raised inside a call (e.g. the weight store the trainer published to died)
    as RayTaskError(ActorDiedError): the worker that ran the call is alive and must not be replaced."""
    import ray

    from rollart.resources.health import is_worker_death

    own = ray.exceptions.ActorDiedError()
    raised_inside = ray.exceptions.RayTaskError("train_step", "traceback", own).as_instanceof_cause()
    assert isinstance(raised_inside, ray.exceptions.RayActorError)  # why a plain isinstance check was wrong
    assert is_worker_death(own) and not is_worker_death(raised_inside)
