"""The env contract every env spec rollart ships or adapts must meet: GEM's shapes, text observations,
seeded determinism, well-formed random actions, an idempotent-enough close."""

from __future__ import annotations

import json

import pytest

from rollart.envs import BUILTIN_ENVS, random_action
from rollart.envs import make_env as make_spec_env

SPECS = [
    *BUILTIN_ENVS,
    "gem:game:GuessTheNumber-v0-easy",
    "gem:game:Sokoban-v0-easy",
    "gem:game:Minesweeper-v0-easy",
    "gym:FrozenLake-v1",
    "gym:CliffWalking-v1",
]


@pytest.fixture(scope="module", autouse=True)
def dataset_rows(tmp_path_factory):
    """The dataset env is built from a domain's rows, not from a name: a small GSM8K-style file."""
    from rollart.config import DatasetConfig, DomainConfig
    from rollart.envs.chat import ChatTokens
    from rollart.envs.dataset import open_dataset_domain
    from rollart.models import build_tokenizer

    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("".join(json.dumps({"q": f"What is {i} + {i}?", "a": f"{i} + {i} = {2 * i}\n#### {2 * i}"}) + "\n"
                            for i in range(20)))
    cfg = DomainConfig(env="dataset", reward="math", data=DatasetConfig(train=str(path), columns={"prompt": "q",
                                                                                                "answer": "a"}))
    DATASET["factory"] = open_dataset_domain("rows", cfg, ChatTokens(build_tokenizer()), seed=0).make_env


DATASET: dict = {}


def make_env(spec: str):
    return DATASET["factory"]() if spec == "dataset" else make_spec_env(spec)


def episode(spec: str, seed: int, steps: int = 3) -> list:
    env = make_env(spec)
    obs, info = env.reset(seed=seed)
    assert isinstance(obs, str) and obs and isinstance(info, dict)
    trace = [obs]
    for _ in range(steps):
        out = env.step(random_action(env))
        assert isinstance(out, tuple) and len(out) == 5
        obs, reward, terminated, truncated, info = out
        assert isinstance(obs, str) and isinstance(reward, (int, float))
        assert isinstance(terminated, bool) and isinstance(truncated, bool) and isinstance(info, dict)
        assert "format_error" not in info  # a random action is well formed
        trace.append((obs, float(reward), terminated, truncated))
        if terminated or truncated:
            break
    close = getattr(env, "close", None)
    if callable(close):
        close()
    return trace


@pytest.mark.parametrize("spec", SPECS)
def test_shapes_and_seeded_determinism(spec):
    assert episode(spec, 11) == episode(spec, 11)


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.startswith("gym:")])  # gym maps are fixed
def test_seeds_give_different_episodes(spec):
    first_obs = {episode(spec, seed, steps=0)[0] for seed in range(8)}
    assert len(first_obs) > 1


@pytest.mark.parametrize("spec", SPECS)
def test_malformed_action_is_reported_not_raised(spec):
    env = make_env(spec)
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step("I am not sure what to do.")
    assert info.get("format_error") and isinstance(obs, str) and obs
