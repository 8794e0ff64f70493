"""Pool accounting: reservations, fallbacks (counted), refusals naming every pool tried, naming, metrics."""

from __future__ import annotations

import pytest

from rollart.resources.accounts import PoolAccounts, NoRoom, Placement, PoolSpec, pool_metrics
from rollart.resources.names import pool_resource, worker_name


def _accounts() -> PoolAccounts:
    accounts = PoolAccounts()
    accounts.add_pools([
        PoolSpec("h800", "gpu", "cuda", 2, ("h20",)),
        PoolSpec("h20", "gpu", "cuda", 1),
        PoolSpec("env", "cpu", "cpu", 4),
    ])
    return accounts


def test_names_are_defined_once():
    assert pool_resource("gen_prefill") == "pool_gen_prefill"
    assert worker_name("inference", "gen_prefill", 0) == "inference/gen_prefill/0"


def test_reservation_lands_on_the_preferred_pool_with_a_unique_name():
    accounts = _accounts()
    a = accounts.reserve("inference", ["h800", "h20"], 1)
    b = accounts.reserve("inference", ["h800", "h20"], 1)
    assert isinstance(a, Placement) and isinstance(b, Placement)
    assert (a.worker, b.worker) == ("inference/h800/0", "inference/h800/1")
    assert not a.fell_back and a.device == "cuda"
    assert accounts.free("h800") == 0


def test_full_pool_falls_back_and_the_fallback_is_counted():
    accounts = _accounts()
    for _ in range(2):
        accounts.reserve("inference", ["h800", "h20"], 1)
    c = accounts.reserve("inference", ["h800", "h20"], 1)
    assert isinstance(c, Placement) and c.fell_back
    assert (c.pool, c.preferred, c.worker) == ("h20", "h800", "inference/h20/0")
    by_name = {s.name: s for s in accounts.snapshot()}
    assert by_name["h800"].fallbacks_out == 1 and by_name["h20"].fallbacks_in == 1
    assert [p.worker for p in by_name["h20"].holders] == ["inference/h20/0"]
    # counts are cumulative: releasing the worker does not hide that a fallback happened
    accounts.release([c.worker])
    assert {s.name: s for s in accounts.snapshot()}["h20"].fallbacks_in == 1


def test_no_room_names_worker_and_every_pool_tried_with_free_capacity():
    accounts = _accounts()
    for _ in range(3):
        accounts.reserve("inference", ["h800", "h20"], 1)
    refusal = accounts.reserve("inference", ["h800", "h20"], 1)
    assert isinstance(refusal, NoRoom)
    msg = refusal.message()
    assert "cannot place worker inference/h800/2" in msg
    assert "h800: 0 of 2 free" in msg and "h20: 0 of 1 free" in msg
    assert "roles.inference.fallback" in msg


def test_a_pool_the_cluster_lacks_is_reported_as_such():
    accounts = _accounts()
    accounts.add_pools([PoolSpec("reward", "serverless", "", 0)])
    refusal = accounts.reserve("reward", ["reward"], 1)
    assert isinstance(refusal, NoRoom)
    assert "reward: no capacity on this cluster" in refusal.message()


def test_release_frees_slots_and_the_lowest_index_is_reused():
    accounts = _accounts()
    workers = [accounts.reserve("env", ["env"], 1) for _ in range(3)]
    accounts.release([workers[0].worker])
    assert accounts.free("env") == 2
    assert accounts.reserve("env", ["env"], 1).worker == "env/env/0"


def test_fractional_slots_add_up_exactly_to_capacity():
    accounts = _accounts()
    got = [accounts.reserve("env", ["env"], 0.1) for _ in range(40)]
    assert all(isinstance(g, Placement) for g in got)
    assert isinstance(accounts.reserve("env", ["env"], 0.1), NoRoom)


def test_confirm_records_the_node_and_add_pools_keeps_holders():
    accounts = _accounts()
    a = accounts.reserve("trainer", ["h800"], 1)
    accounts.confirm(a.worker, "node-1")
    accounts.add_pools([PoolSpec("h800", "gpu", "cuda", 4, ("h20",))])  # the cluster grew
    status = {s.name: s for s in accounts.snapshot()}["h800"]
    assert status.capacity == 4 and status.free == 3
    assert status.holders[0].node_id == "node-1"


def test_bad_requests_are_refused():
    accounts = _accounts()
    with pytest.raises(ValueError, match="empty pool chain"):
        accounts.reserve("x", [], 1)
    with pytest.raises(ValueError, match="slots must be > 0"):
        accounts.reserve("x", ["env"], 0)


def test_pool_metrics_are_flat_and_complete():
    accounts = _accounts()
    for _ in range(3):
        accounts.reserve("inference", ["h800", "h20"], 1)
    m = pool_metrics(accounts.snapshot())
    assert m["pools/h800/capacity"] == 2 and m["pools/h800/free"] == 0 and m["pools/h800/held"] == 2
    assert m["pools/h20/workers"] == 1 and m["pools/h20/fallbacks_in"] == 1
    assert m["pools/h800/fallbacks_out"] == 1 and m["pools/fallbacks"] == 1
