"""Router: domain → pool routing follows the config, sticky per trajectory, least-loaded for new ones."""

from __future__ import annotations

import pytest

from rollart.config import RunConfig
from rollart.inference.router import Router


def _router() -> Router:
    cfg = RunConfig()  # frozenlake → gen_prefill, math → gen_decode
    return Router({"gen_prefill": 2, "gen_decode": 3}, {d: c.pool for d, c in cfg.domains.items()})


def test_domain_routing_follows_config():
    r = _router()
    assert all(r.route("frozenlake", f"fl{i}")[0] == "gen_prefill" for i in range(6))
    assert all(r.route("math", f"m{i}")[0] == "gen_decode" for i in range(6))
    with pytest.raises(ValueError, match="'sokoban' is not a configured domain"):
        r.route("sokoban", "x")


def test_domain_on_a_pool_without_workers_is_rejected():
    with pytest.raises(ValueError, match="domain 'math' generates on pool 'gen_decode'.*no inference workers"):
        Router({"gen_prefill": 1}, {"math": "gen_decode"})


def test_sticky_per_trajectory():
    r = _router()
    first = r.route("math", "t1")
    r.started(first)  # make that worker the most loaded: the sticky trajectory must still go there
    r.started(first)
    assert r.route("math", "t1") == first
    r.forget("t1")
    assert r.route("math", "t1") != first


def test_least_loaded_for_new_trajectories_and_even_spread_when_idle():
    r = _router()
    keys = [r.route("math", f"t{i}") for i in range(3)]
    assert sorted(k[1] for k in keys) == [0, 1, 2]  # idle: spread by trajectories assigned
    r.started(("gen_decode", 0))
    r.started(("gen_decode", 1))
    assert r.route("math", "new") == ("gen_decode", 2)
    r.finished(("gen_decode", 0))
    assert r.in_flight()[("gen_decode", 0)] == 0 and r.in_flight()[("gen_decode", 1)] == 1


def test_sticky_map_is_bounded():
    r = Router({"p": 2}, {"d": "p"}, max_sticky=3)
    for i in range(5):
        r.route("d", f"t{i}")
    assert r.worker_of("t0") is None and r.worker_of("t4") is not None


def test_a_removed_worker_gets_nothing_and_its_trajectories_are_routed_anew():
    r = _router()
    first = r.route("math", "t1")
    r.started(first)
    r.remove(first)
    r.finished(first)  # its request ends after it left: nothing to give back, no error
    again = r.route("math", "t1")
    assert again != first and again[0] == "gen_decode" and first not in r.in_flight()
    assert all(r.route("math", f"n{i}") != first for i in range(6))


def test_a_pool_without_workers_falls_back_and_a_joining_worker_takes_over():
    r = Router({"a": 1, "b": 1}, {"d": "a"}, pool_fallbacks={"a": ["b"]})
    assert r.route("d", "t1") == ("a", 0)
    r.remove(("a", 0))
    assert r.route("d", "t1") == ("b", 0) and r.route("d", "t2") == ("b", 0)  # the fallback pool
    joined = r.add("a")
    assert joined == ("a", 1)  # keys are never reused
    assert r.route("d", "t1") == ("a", 1) and r.route("d", "t3") == ("a", 1)  # back on its own pool
    r.remove(("a", 1))
    r.remove(("b", 0))
    assert r.route("d", "t1") is None  # nowhere to go: the caller waits for a worker
    assert Router({"a": 1, "b": 1}, {"d": "a"}).route("d", "x") == ("a", 0)  # no fallback given: none used


def test_heap_routing_picks_what_a_scan_would() -> None:
    """The O(log n) choice equals the plain rule (min in flight, then assigned, then index) at every step,
    while workers die and join."""
    import random

    rng = random.Random(5)
    r = Router({"p": 7, "q": 3}, {"d": "p", "e": "q"})
    live: list[tuple[str, int]] = []
    for i in range(3000):
        if live and rng.random() < 0.45:
            r.finished(live.pop(rng.randrange(len(live))))
            continue
        pool = rng.choice("pq")
        if rng.random() < 0.03 and len(r.workers(pool)) > 1:
            r.remove(rng.choice(r.workers(pool)))  # its requests still finish later: no count to give back
        elif rng.random() < 0.03:
            r.add(pool)
        domain = {"p": "d", "q": "e"}[pool]
        in_flight, assigned = r.in_flight(), r.assigned()
        expect = min(r.workers(pool), key=lambda k: (in_flight[k], assigned[k], k[1]))
        key = r.route(domain, f"t{i}")
        assert key == expect
        r.started(key)
        live.append(key)


def test_the_proxy_remembers_as_many_trajectories_as_the_config_says():
    from rollart.config import InferenceConfig
    from rollart.inference.proxy import LLMProxy

    proxy = LLMProxy({"p": [object(), object()]}, {"d": "p"}, InferenceConfig(sticky_trajectories=100_000))
    for i in range(70_000):  # more than the old fixed bound (65,536): none forgotten
        proxy._router.route("d", f"t{i}")
    assert proxy._router.worker_of("t0") is not None
