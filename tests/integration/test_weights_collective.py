"""Weights over a weight group (`weights.transport=collective`, gloo, plain processes): every trainer rank sends its
own rows, each receiver gets the whole model bit for bit, versions in order; a member that cannot join makes
the run fall back to the store, said in the store; a plan the receivers do not share is refused."""

import json
import multiprocessing as mp
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rollart.resources.nodes import loopback_interface
from rollart.weights.collective import WeightGroupServer
from weight_group_members import odd_tensors, plain_sender, receiver, trainer_sender

TIMEOUT_S = 60.0


def server(senders: int, receivers: int, bucket_bytes: int = 64) -> WeightGroupServer:
    return WeightGroupServer("127.0.0.1", senders, receivers, bucket_bytes, TIMEOUT_S, loopback_interface() or "")


def run_all(processes: list[mp.Process], timeout_s: float = 120.0) -> None:
    for p in processes:
        p.start()
    for p in processes:
        p.join(timeout_s)
    alive = [p for p in processes if p.is_alive()]
    for p in alive:
        p.kill()
    assert not alive, "a member hung"
    assert [p.exitcode for p in processes] == [0] * len(processes)


@pytest.mark.parametrize("senders", [2, 3])
def test_every_receiver_gets_the_whole_model_bit_for_bit_from_the_rows(tmp_path: Path, senders: int) -> None:
    group = server(senders, 2)
    ctx = mp.get_context("spawn")
    run_all([ctx.Process(target=plain_sender, args=(r, senders, group.spec, str(tmp_path), 2)) for r in range(senders)]
            + [ctx.Process(target=receiver, args=(i, group.spec, str(tmp_path), [0, 1])) for i in range(2)])
    for version in (0, 1):
        want = odd_tensors(version)
        for i in range(2):
            got = load_file(str(tmp_path / f"r{i}-v{version}.safetensors"))
            assert set(got) == set(want) | {"tied.weight"}
            for name, t in want.items():
                assert got[name].dtype == t.dtype and torch.equal(got[name], t), (version, i, name)
            assert torch.equal(got["tied.weight"], want["embed.weight"])
            assert json.loads((tmp_path / f"r{i}-v{version}-tied.json").read_text()) == ["embed.weight"]  # one tensor
    sent = [json.loads((tmp_path / f"sender{r}-v1.json").read_text()) for r in range(senders)]
    total = sum(t.nbytes for t in odd_tensors(1).values())
    assert sum(m["weights/publish_mb"] for m in sent) * 2**20 == pytest.approx(total)  # each row sent once
    assert sum(m["weights/wire_mb"] for m in sent) * 2**20 == pytest.approx(2 * total)  # to each of 2 receivers
    assert group.fallback_reason() == ""


def test_fsdp2_and_ddp_ranks_send_their_rows_and_nothing_is_gathered(tmp_path: Path, tiny_model_path) -> None:  # noqa: ANN001
    ctx = mp.get_context("spawn")
    for strategy in ("fsdp2", "ddp"):
        out = tmp_path / strategy
        out.mkdir()
        group = server(2, 1, bucket_bytes=256 * 1024)
        init = str(out / "pg")
        run_all([ctx.Process(target=trainer_sender, args=(r, 2, group.spec, str(tiny_model_path), strategy, str(out),
                                                          init)) for r in range(2)]
                + [ctx.Process(target=receiver, args=(0, group.spec, str(out), [0, 1]))], timeout_s=300)
        for version in (0, 1):
            trained = load_file(str(out / f"v{version}.safetensors"))
            got = load_file(str(out / f"r0-v{version}.safetensors"))
            assert set(got) == set(trained), strategy
            for name, t in trained.items():
                assert torch.equal(got[name], t), (strategy, version, name)
        before, after = (load_file(str(out / f"v{v}.safetensors")) for v in (0, 1))
        assert any(not torch.equal(before[k], after[k]) for k in before)  # the step changed what was sent
        sent = [json.loads((out / f"sender{r}.json").read_text())[1] for r in range(2)]
        full = sum(t.nbytes for t in after.values() if t.data_ptr()) / 2**20
        # each rank sent about half the model (its rows), never all of it
        assert all(m["weights/publish_mb"] < 0.6 * full for m in sent), (strategy, sent, full)


def test_a_receiver_too_many_falls_back_and_says_why(tmp_path: Path) -> None:
    group = server(1, 1)
    ctx = mp.get_context("spawn")
    run_all([ctx.Process(target=plain_sender, args=(0, 1, group.spec, str(tmp_path), 1)),
             ctx.Process(target=receiver, args=(0, group.spec, str(tmp_path), [0]))])
    late = ctx.Process(target=receiver, args=(1, group.spec, str(tmp_path), [0]))
    run_all([late])
    assert "joined after the weight group formed" in (tmp_path / "r1-fallback.txt").read_text()
    assert "joined after the weight group formed" in group.fallback_reason()


def test_a_sender_whose_receivers_never_come_falls_back(tmp_path: Path) -> None:
    group = WeightGroupServer("127.0.0.1", 1, 1, 64, 3.0, loopback_interface() or "")
    from rollart.weights.collective import CollectiveFailed, CollectivePublisher
    from weight_group_members import NoStore

    publisher = CollectivePublisher(group.spec, NoStore())
    t = torch.ones(4, 4)
    with pytest.raises(CollectiveFailed, match="forming the weight group"):
        publisher.publish_rows(0, 0, 1, [(("w",), "float32", (4, 4))], [t])
    assert "could not form its weight group" in group.fallback_reason()
    assert publisher.fell_back()


@pytest.mark.ray
def test_trainer_ranks_send_their_rows_and_fall_back_to_the_store_when_a_worker_goes(ray_local, tiny_model_path,  # noqa: ANN001
                                                                                      tmp_path: Path) -> None:
    """Two fsdp2 ranks (Ray actors) publish over the weight group to a subscriber here: each version arrives bit for
    bit; once the subscriber is gone the ranks agree to fall back, and the store carries the next version."""
    import asyncio
    import uuid

    from rollart.algo import PolicyObjective
    from rollart.config import WeightsConfig
    from rollart.trainer import TrainerRanks
    from rollart.weights import WeightStore
    from trainer_helpers import connect, synthetic_batch, trainer_config

    cfg = trainer_config(tiny_model_path, tmp_path / "run", workers=2, micro_batch_tokens=64)
    store = WeightStore(WeightsConfig(transport="collective", timeout_s=30), name=f"ws-{uuid.uuid4().hex[:8]}")
    store.collective(2, 1, "127.0.0.1", loopback_interface() or "")
    sub = store.subscriber()
    try:
        assert asyncio.run(sub.latest_version()) == -1  # (starts receiving: the ranks' first publish waits for it)
        with TrainerRanks(cfg, connect(cfg), PolicyObjective.of(cfg), store.publisher()) as group:
            v0 = asyncio.run(sub.pull(0))
            before = group.weights()
            metrics = group.train_step(synthetic_batch(version=0, n=8))
            v1 = asyncio.run(sub.pull(1))
            after = group.weights()
            assert "weights/collective_fallback" not in metrics and metrics["weights/publish_mb"] > 0
            for name, t in before.items():
                assert torch.equal(v0[name], t) and torch.equal(v1[name], after[name]), name
            assert store.latest_version() == -1  # nothing went through the store
            sub.close()  # the worker goes: its groups close
            metrics = group.train_step(synthetic_batch(version=1, n=8))
            assert metrics["weights/collective_fallback"] == 1.0
            assert store.latest_version() == 2 and store.fallback_reason()
            fallback = asyncio.run(store.subscriber().pull(2))
            for name, t in group.weights().items():
                assert torch.equal(fallback[name], t), name
    finally:
        store.close()


@pytest.mark.ray
def test_a_worker_that_starts_after_the_trainer_takes_the_first_versions_from_the_store_then_the_group(
        ray_local, tiny_model_path, tmp_path: Path) -> None:  # noqa: ANN001
    """As in a run whose trainer shares a pool with the inference workers (they start after it): the ranks do not
    wait out the group's timeout on a receiver that is not there — version 0 goes through the store, nothing
    falls back, and once the worker has come the next version goes over the group, bit for bit."""
    import asyncio
    import uuid

    from rollart.algo import PolicyObjective
    from rollart.config import WeightsConfig
    from rollart.trainer import TrainerRanks
    from rollart.weights import WeightStore
    from testutil import wait_until
    from trainer_helpers import connect, synthetic_batch, trainer_config

    cfg = trainer_config(tiny_model_path, tmp_path / "run", workers=2, micro_batch_tokens=64)
    store = WeightStore(WeightsConfig(transport="collective", timeout_s=30), name=f"ws-{uuid.uuid4().hex[:8]}")
    store.collective(2, 1, "127.0.0.1", loopback_interface() or "")
    publisher = store.publisher()
    sub = store.subscriber()
    try:
        with TrainerRanks(cfg, connect(cfg), PolicyObjective.of(cfg), publisher) as group:
            assert store.latest_version() == 0 and store.fallback_reason() == ""  # pending, not fallen back
            assert asyncio.run(sub.latest_version()) == 0  # the store's (and the worker counts itself in)
            v0 = asyncio.run(sub.pull(0))
            for name, t in group.weights().items():
                assert torch.equal(v0[name], t), name
            wait_until(publisher.receivers_joined, "the worker to count itself in the weight group", timeout_s=30)
            metrics = group.train_step(synthetic_batch(version=0, n=8))
            assert not {"weights/collective_pending", "weights/collective_fallback"} & set(metrics), metrics
            assert metrics["weights/publish_mb"] > 0
            v1 = asyncio.run(sub.pull(1))
            assert asyncio.run(sub.latest_version()) == 1
            for name, t in group.weights().items():
                assert torch.equal(v1[name], t), name
            assert store.latest_version() == 0 and store.fallback_reason() == ""  # v1 went over the group
    finally:
        sub.close()
        store.close()
