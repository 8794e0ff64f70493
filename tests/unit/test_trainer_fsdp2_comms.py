"""FSDP2's in-place collectives for gloo give gloo's own results bit for bit (2 ranks, plain processes):
the all-gather for every dtype FSDP2 gathers in (signed zeros, NaNs and all), the reduce-scatter for the ops
FSDP2 reduces with."""

from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def _rank(rank: int, out: str) -> None:
    from rollart.trainer.fsdp2 import InPlaceAllGather, InPlaceReduceScatter

    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2)
    group = dist.group.WORLD
    checks = {}
    g = torch.Generator().manual_seed(rank)
    for dtype in (torch.float32, torch.bfloat16, torch.uint8):
        n = 1001
        shard = (torch.randn(n, generator=g) * 100).to(dtype)
        if dtype != torch.uint8:
            shard[:3] = torch.tensor([-0.0, float("nan"), float("-inf")])
        expected = torch.empty(2 * n, dtype=dtype)
        dist.all_gather_single(expected, shard.clone())
        output = torch.full((2 * n,), 7, dtype=dtype)  # stale bytes FSDP2's buffer may hold
        slot = output.narrow(0, rank * n, n)
        slot.copy_(shard)  # FSDP2 copies the shard into its slot before the call
        InPlaceAllGather()(output, slot, group)
        as_bytes = lambda t: t.view(torch.uint8)  # noqa: E731
        checks[f"all_gather {dtype}"] = torch.equal(as_bytes(output), as_bytes(expected))
        other = InPlaceAllGather()
        away = torch.full((2 * n,), 7, dtype=dtype)
        work = other(away, shard.clone(), group, async_op=True)  # a shard that is not in its slot yet
        work.wait()
        checks[f"all_gather {dtype} (shard elsewhere, async)"] = torch.equal(as_bytes(away), as_bytes(expected))
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        grads = torch.randn(2 * 999, generator=g)
        expected = torch.empty(999)
        dist.reduce_scatter_single(output=expected, input=grads.clone(), op=op)
        output = torch.empty(999)
        InPlaceReduceScatter()(output, grads.clone(), group, op)
        checks[f"reduce_scatter {op}"] = torch.equal(output, expected)
    (Path(out) / f"rank{rank}.json").write_text(json.dumps(checks))
    dist.destroy_process_group()


def test_in_place_collectives_equal_gloos_own(tmp_path: Path) -> None:
    mp.start_processes(_rank, args=(str(tmp_path),), nprocs=2, join=True, start_method="spawn")
    for rank in (0, 1):
        checks = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert len(checks) == 8 and all(checks.values()), checks
