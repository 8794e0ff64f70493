"""Reading Ray's tables: capacity per pool, the nodes holding it, missing pools and the hint to declare
them; the CUDA/CPU request of a worker; the rows `rollart pools` prints."""

from __future__ import annotations

from rollart.cli.commands.pools import COLUMNS, pool_rows
from rollart.config.loader import load_config
from rollart.resources.accounts import NodeShare, PoolStatus
from rollart.resources.nodes import cluster_capacity, declare_hint, missing_pools, pool_nodes

NODES = [
    {"NodeID": "aaaa1111", "Alive": True, "NodeManagerAddress": "10.0.0.1",
     "Resources": {"CPU": 8, "pool_h800": 8}},
    {"NodeID": "bbbb2222", "Alive": True, "NodeManagerAddress": "10.0.0.2",
     "Resources": {"CPU": 8, "pool_h20": 4, "pool_env": 16}},
    {"NodeID": "cccc3333", "Alive": False, "NodeManagerAddress": "10.0.0.3", "Resources": {"pool_h800": 8}},
]


def test_pool_nodes_lists_alive_holders_only():
    held = pool_nodes(["h800", "h20", "train"], NODES)
    assert held["h800"] == (NodeShare("aaaa1111", "10.0.0.1", 8.0),)
    assert held["h20"] == (NodeShare("bbbb2222", "10.0.0.2", 4.0),)
    assert held["train"] == ()


def test_missing_pools_and_the_ray_start_hint():
    cfg = load_config(None, ["pools.h800.kind=gpu", "pools.h800.capacity=8"])
    totals = {"CPU": 16, "pool_h800": 8, "pool_env": 16}
    assert cluster_capacity("h800", totals) == 8 and cluster_capacity("train", totals) == 0
    missing = missing_pools(cfg.pools, totals)
    assert missing == ["train", "gen_prefill", "gen_decode", "reward"]
    hint = declare_hint(cfg.pools, ["train", "reward"], "10.0.0.1:6379")
    assert hint == "ray start --address=10.0.0.1:6379 --resources='{\"pool_train\": 1, \"pool_reward\": 2}'"


def test_worker_resource_request_per_pool_kind():
    from rollart.resources.placement import ray_request  # imports Ray, but starts nothing

    cfg = load_config(None, ["pools.h800.kind=gpu", "pools.h800.device=cuda", "pools.gpu_cpu.kind=gpu"])
    assert ray_request(cfg.pools["env"], "env", 1, 0, None) == {"pool_env": 1.0}
    assert ray_request(cfg.pools["h800"], "h800", 1, 0, None) == {"pool_h800": 1.0, "GPU": 1.0}
    # a gpu-kind pool whose device is cpu (a stand-in on a CPU machine) asks for no GPU
    assert ray_request(cfg.pools["gpu_cpu"], "gpu_cpu", 0.5, 1, None) == {"pool_gpu_cpu": 0.5, "CPU": 1.0}
    assert ray_request(cfg.pools["h800"], "h800", 1, 0, 0.5) == {"pool_h800": 1.0, "GPU": 0.5}


def test_pools_table_rows():
    status = PoolStatus(
        name="gen_prefill", kind="cpu", device="cpu", capacity=2, free=1, fallback=("gen_decode",),
        holders=(), fallbacks_in=0, fallbacks_out=3, nodes=(NodeShare("aaaa1111ffff", "127.0.0.1", 2),),
    )
    (row,) = pool_rows([status])
    assert len(row) == len(COLUMNS)
    assert row == ("gen_prefill", "cpu", "cpu", "2", "1", "gen_decode", "0/3", "127.0.0.1 (aaaa1111) ×2")
