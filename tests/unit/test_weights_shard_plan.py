"""The plan of a collective weight transfer: each sender's rows are FSDP2's chunks, every byte of the model is
sent by exactly one sender, buckets stay within their size unless one piece alone is larger, and the specs read
back from the shared store are checked field by field."""

import json

import pytest

from rollart.base.shards import row_range
from rollart.weights.shard_plan import TensorSpec, bucket_sizes, plan_buckets, specs_from_json, specs_to_json

SPECS = [TensorSpec(("embed", "head"), "float32", (37, 8)), TensorSpec(("norm",), "bfloat16", (16,)),
         TensorSpec(("scale",), "float32", ()), TensorSpec(("one",), "float32", (1, 5)),
         TensorSpec(("big",), "float32", (64, 64))]


def test_rows_are_fsdp2_chunks_and_cover_every_row_once() -> None:
    assert [row_range(37, r, 2) for r in range(2)] == [(0, 19), (19, 37)]
    assert [row_range(1, r, 3) for r in range(3)] == [(0, 1), (1, 1), (1, 1)]
    with pytest.raises(ValueError):
        row_range(4, 2, 2)


@pytest.mark.parametrize("world", [1, 2, 3, 5])
def test_every_byte_is_sent_once_in_bounded_buckets(world: int) -> None:
    bucket = 256
    sent = {i: 0 for i in range(len(SPECS))}
    for rank in range(world):
        for b in plan_buckets(SPECS, rank, world, bucket):
            assert sum(p.nbytes for p in b) <= bucket or len(b) == 1  # only a lone piece may be larger
            offset = 0
            for p in b:
                assert p.offset == offset and p.nbytes == (p.stop - p.start) * SPECS[p.tensor].row_bytes
                offset += p.nbytes
                sent[p.tensor] += p.nbytes
    assert sent == {i: s.nbytes for i, s in enumerate(SPECS)}
    assert bucket_sizes(plan_buckets(SPECS, 0, world, bucket))  # rank 0 always has something (the 0-d tensor)


def test_specs_round_trip_and_bad_specs_are_refused() -> None:
    assert specs_from_json(specs_to_json(SPECS)) == SPECS
    good = json.loads(specs_to_json(SPECS[:1]))[0]
    bad = [
        ("not json", "not JSON"),
        (json.dumps({"a": 1}), "a list"),
        (json.dumps([{**good, "extra": 1}]), "exactly names, dtype and shape"),
        (json.dumps([{**good, "dtype": "object"}]), "dtype 'object' is not one of"),
        (json.dumps([{**good, "shape": [-1]}]), "non-negative ints"),
        (json.dumps([{**good, "shape": [True]}]), "non-negative ints"),
        (json.dumps([{**good, "names": []}]), "non-empty list"),
        (json.dumps([{**good, "shape": [2**30, 2**30]}]), "bytes in all"),
    ]
    for text, message in bad:
        with pytest.raises(ValueError, match=message):
            specs_from_json(text)
