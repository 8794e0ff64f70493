"""PPO with a critic: GAE against a plain reference loop (observation tokens skipped), the clipped value loss
by hand, and the critic as a trainer role — it learns, it is never published, it resumes bit for bit, and
`train.critic.path` initialises it (or is refused with the reason)."""

import math
import random

import pytest
import torch

from rollart.algo import PolicyObjective, build_train_batch, gae, value_loss
from rollart.config import RunConfig
from rollart.types import Status, Task, Trajectory, Turn


def reference_gae(values, rewards, mask, gamma, lam):
    """Per sequence, over its model tokens only, in plain Python."""
    adv = [[0.0] * len(row) for row in values]
    for b, (v, r, m) in enumerate(zip(values, rewards, mask)):
        steps = [t for t, on in enumerate(m) if on]
        running = 0.0
        for k in reversed(range(len(steps))):
            t = steps[k]
            next_value = v[steps[k + 1]] if k + 1 < len(steps) else 0.0
            running = r[t] + gamma * next_value - v[t] + gamma * lam * running
            adv[b][t] = running
    return adv


@pytest.mark.parametrize("gamma,lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)])
def test_gae_equals_the_reference_loop_and_skips_observation_tokens(gamma, lam):
    rng = random.Random(0)
    for _ in range(20):
        b, t = rng.randint(1, 4), rng.randint(1, 15)
        mask = [[rng.random() < 0.6 for _ in range(t)] for _ in range(b)]
        values = [[rng.uniform(-1, 1) for _ in range(t)] for _ in range(b)]
        rewards = [[rng.uniform(-1, 1) if m else 0.0 for m in row] for row in mask]
        adv, ret = gae(torch.tensor(values, dtype=torch.float64), torch.tensor(rewards, dtype=torch.float64),
                       torch.tensor(mask), gamma, lam)
        expected = reference_gae(values, rewards, mask, gamma, lam)
        for got, want in zip(adv.tolist(), expected):
            assert got == pytest.approx(want, abs=1e-12)
        for row_adv, row_ret, row_v, row_m in zip(adv.tolist(), ret.tolist(), values, mask):
            for a, r, v, m in zip(row_adv, row_ret, row_v, row_m):
                assert r == pytest.approx(a + v if m else 0.0, abs=1e-12)


def test_with_gamma_and_lambda_one_the_advantage_is_the_return_minus_the_value():
    values = torch.tensor([[0.3, 9.0, 0.5, 0.1]])  # 9.0 sits on an observation token: never read
    mask = torch.tensor([[1, 0, 1, 1]])
    rewards = torch.tensor([[0.0, 0.0, 0.0, 2.0]])
    adv, ret = gae(values, rewards, mask, 1.0, 1.0)
    assert adv.tolist()[0] == pytest.approx([2.0 - 0.3, 0.0, 2.0 - 0.5, 2.0 - 0.1])
    assert ret.tolist()[0] == pytest.approx([2.0, 0.0, 2.0, 2.0])


def test_the_value_loss_clips_by_hand():
    values = torch.tensor([[1.0, 0.0, 0.35]], requires_grad=True)
    old = torch.tensor([[0.5, 0.0, 0.3]])
    returns = torch.tensor([[0.0, 0.0, 1.0]])
    mask = torch.tensor([[1, 0, 1]])
    weights = mask / 2
    loss, stats = value_loss(values, old, returns, mask, weights, clip=0.2)
    # token 0: V moved 0.5 > 0.2 → clipped V 0.7; max((1−0)², (0.7−0)²) = 1 (unclipped wins, gradient flows)
    # token 2: V 0.35 within the clip → ½(0.65)²
    assert float(loss.detach()) == pytest.approx(0.5 * (0.5 * 1.0 + 0.5 * 0.65**2))
    loss.backward()
    assert values.grad.tolist()[0] == pytest.approx([0.5 * 1.0, 0.0, 0.5 * (0.35 - 1.0)])
    assert stats["value_clipped"] == 0
    # moving away from the return past the clip: the clipped error is larger, its gradient 0 (PPO's pessimism)
    values2 = torch.tensor([[-0.5]], requires_grad=True)
    loss2, stats2 = value_loss(values2, torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.ones(1, 1),
                               torch.ones(1, 1), clip=0.2)
    loss2.backward()
    assert float(loss2.detach()) == pytest.approx(0.5 * 1.5**2) and values2.grad.item() == pytest.approx(-1.5)
    assert stats2["value_clipped"] == 0
    values3 = torch.tensor([[1.5]], requires_grad=True)
    loss3, stats3 = value_loss(values3, torch.tensor([[0.0]]), torch.tensor([[0.1]]), torch.ones(1, 1),
                               torch.ones(1, 1), clip=0.2)
    loss3.backward()  # V overshot the return: clipped V 0.2 has error 0.01 < 1.96 — the max keeps the unclipped
    assert stats3["value_clipped"] == 0 and values3.grad.item() == pytest.approx(1.4)
    # moving toward the return past the clip: the clipped error is the larger, its branch taken, no gradient
    values4 = torch.tensor([[0.5]], requires_grad=True)
    loss4, stats4 = value_loss(values4, torch.tensor([[0.0]]), torch.tensor([[0.45]]), torch.ones(1, 1),
                               torch.ones(1, 1), clip=0.2)
    loss4.backward()
    assert float(loss4.detach()) == pytest.approx(0.5 * 0.25**2) and values4.grad.item() == 0.0
    assert stats4["value_clipped"] == 1


def trajectories(reward_of=lambda g, i: float(i % 2)):
    out = []
    for g in range(2):
        for i in range(4):
            turns = tuple(Turn(tuple(range(5, 9)), tuple(20 + (7 * i + j + k) % 200 for j in range(3)),
                               (-1.0,) * 3, (0,) * 3) for k in range(2))  # two turns: observation tokens between
            task = Task(f"g{g}/{i}", "math", "math", g, f"g{g}")
            out.append(Trajectory(task.trajectory_id, task, 0, turns=turns).finished(Status.COMPLETED)
                       .scored(reward_of(g, i)))
    return out


def ppo_trainer(tiny_model_path, **train):
    from rollart.trainer import Trainer

    cfg = RunConfig(model={"path": str(tiny_model_path)},
                    train={"algorithm": "ppo", "mini_batches": 2, "epochs": 2, **train})
    return cfg, Trainer(cfg, PolicyObjective.of(cfg))


def critic_state(trainer):
    from rollart.trainer.critic import critic_entries

    return {e.name: e.tensor.detach().clone() for e in critic_entries(trainer.critic.module)}


def test_the_critic_learns_the_returns_and_is_never_published(tiny_model_path):
    cfg, trainer = ppo_trainer(tiny_model_path, **{"critic": {"lr": 1e-2}})
    losses = []
    for v in range(4):
        batch = build_train_batch(trajectories(), v, cfg.train)
        metrics = trainer.train_step(batch)
        losses.append(metrics["train/value_loss"])
        assert metrics["time/critic"] > 0 and metrics["train/updates"] == 4
    assert losses[-1] < losses[0] / 2, losses  # the value model fits the rewards
    published = [name for name, _ in trainer.published_weights()]
    assert published and not any("value_head" in n for n in published)
    assert set(published) <= {n for e in __import__("rollart.trainer.policy", fromlist=["x"]).entries(
        trainer.policy, False) for n in e.names}


def test_the_critic_starts_from_the_policy_decoder_with_a_zero_head(tiny_model_path):
    from rollart.trainer.policy import entries

    cfg, trainer = ppo_trainer(tiny_model_path)
    trainer.critic.start(trainer.policy)
    policy = {n: e.tensor for e in entries(trainer.policy, False) for n in e.names}
    state = critic_state(trainer)
    assert all(float(v.abs().sum()) == 0 for n, v in state.items() if n.startswith("value_head."))
    decoder = {n: v for n, v in state.items() if not n.startswith("value_head.")}
    assert decoder and all(torch.equal(v, policy[n]) for n, v in decoder.items())


def test_a_resumed_critic_continues_bit_for_bit(tiny_model_path, tmp_path):
    cfg, first = ppo_trainer(tiny_model_path)
    first.train_step(build_train_batch(trajectories(), 0, cfg.train))
    first.save(tmp_path / "ckpt", {})
    cfg2, resumed = ppo_trainer(tiny_model_path)
    resumed.load(tmp_path / "ckpt")
    assert all(torch.equal(v, critic_state(first)[n]) for n, v in critic_state(resumed).items())
    batch = build_train_batch(trajectories(lambda g, i: float(g == i % 2)), 1, cfg.train)
    a, b = first.train_step(batch), resumed.train_step(batch)
    assert a["train/value_loss"] == b["train/value_loss"] and a["train/loss"] == b["train/loss"]
    assert all(torch.equal(v, critic_state(first)[n]) for n, v in critic_state(resumed).items())


def test_critic_path_initialises_the_decoder_and_a_foreign_vocabulary_is_refused(tiny_model_path, tmp_path):
    cfg, trainer = ppo_trainer(tiny_model_path, **{"critic": {"path": str(tiny_model_path)}})
    assert trainer.critic.ready  # loaded at construction, not copied at the first step
    import json
    import shutil

    other = tmp_path / "other"
    shutil.copytree(tiny_model_path, other)
    config = json.loads((other / "config.json").read_text())
    config["vocab_size"] += 8
    (other / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="train.critic.path.*vocabulary"):
        ppo_trainer(tiny_model_path, **{"critic": {"path": str(other)}})
    assert math.isfinite(trainer.train_step(build_train_batch(trajectories(), 0, cfg.train))["train/value_loss"])
