"""Bucket packing: bit-identical round trip, size bound, tied tensors stored once, bf16 kept."""

import pytest
import torch

from rollart.weights import pack, unpack


def test_round_trip_is_bit_identical_and_buckets_are_bounded():
    g = torch.Generator().manual_seed(0)
    tensors = {f"w{i}": torch.randn(64, 16, generator=g) for i in range(10)}  # 4 KiB each
    tensors["big"] = torch.randn(64, 64, generator=g)  # 16 KiB > bucket
    tensors["bf16"] = torch.randn(5, 3, generator=g).to(torch.bfloat16)
    tensors["scalar"] = torch.tensor(3.25)
    buckets, metas = pack(tensors, bucket_bytes=10 * 1024)
    assert [m.name for m in metas] == list(tensors)
    assert all(b.nbytes <= 10 * 1024 or len(b.arrays) == 1 for b in buckets)
    assert len(buckets) >= 5
    out = unpack(buckets, metas)
    for name, t in tensors.items():
        assert out[name].dtype == t.dtype and out[name].shape == t.shape
        assert torch.equal(out[name].reshape(-1).view(torch.uint8), t.reshape(-1).view(torch.uint8))
    out["w0"].add_(1.0)  # owned and writable: the source is untouched
    assert not torch.equal(out["w0"], tensors["w0"])


def test_tied_tensors_are_stored_once_and_come_back_tied():
    emb = torch.randn(8, 4)
    tensors = {"model.embed_tokens.weight": emb, "lm_head.weight": emb, "norm": torch.ones(4)}
    buckets, metas = pack(tensors, bucket_bytes=1 << 20)
    assert sum(b.nbytes for b in buckets) == emb.nbytes + 16
    out = unpack(buckets, metas)
    assert out["lm_head.weight"] is out["model.embed_tokens.weight"]
    assert torch.equal(out["lm_head.weight"], emb)


def test_bad_input_is_named():
    with pytest.raises(TypeError, match="'x'"):
        pack({"x": [1, 2]}, 1024)
    with pytest.raises(ValueError, match="bucket size"):
        pack({}, 0)


def test_streamed_tensors_are_never_held_more_than_two_buckets_at_a_time():
    """A sharded trainer gathers each full tensor just before it is packed: the buckets go out as they fill,
    so the gathered tensors alive at once never exceed two buckets (and a tied name right after its tensor
    is still stored once, even across the gather)."""
    import weakref

    bucket, alive, peak, made = 16 * 1024, {}, [0], {}

    def gathered():
        g = torch.Generator().manual_seed(1)
        for i in range(40):
            t = torch.randn(16, 32 if i % 3 else 64, generator=g)  # 2 KiB or 4 KiB, like gathered shards
            alive[id(t)] = t.nbytes
            weakref.finalize(t, alive.pop, id(t))
            peak[0] = max(peak[0], sum(alive.values()))
            made[f"w{i}"] = t.clone()
            yield f"w{i}", t
            if i == 7:
                yield "tied", t

    from rollart.weights.buckets import Bucket, iter_buckets

    buckets, metas = [], []
    for b, names in iter_buckets(gathered(), bucket):
        buckets.append(Bucket(tuple(a.copy() for a in b.arrays)))  # what the object store keeps: its own copy
        metas += names
        del b
    assert len(buckets) > 4 and peak[0] <= 2 * bucket
    out = unpack(buckets, metas)
    assert all(torch.equal(out[n], t) for n, t in made.items()) and out["tied"] is out["w7"]
