"""The env contract every env spec rollart ships or adapts must meet: GEM's shapes, text observations,
seeded determinism, well-formed random actions, an idempotent-enough close. The `remote` kind meets it
over HTTP: `remote:<domain>` below is an env server (rollart/envs/serving/server.py) serving that built-in domain
on 127.0.0.1, reached by `remote:<its url>` exactly as a run would. The `dataset` kind is built from a domain's
rows, not from a name: here a small GSM8K-style file. The `openenv` kind plays examples/openenv/guess_env (made
from OpenEnv's own template) through a server rollart starts itself (options.app)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from rollart.config import EnvServerConfig, EnvsConfig
from rollart.envs import BUILTIN_ENVS, make_env, random_action, resolve_env
from rollart.envs.serving.server import EnvServer

REMOTE = ["remote:frozenlake", "remote:math", "remote:code"]
SPECS = [
    *BUILTIN_ENVS,
    "gem:game:GuessTheNumber-v0-easy",
    "gem:game:Sokoban-v0-easy",
    "gem:game:Minesweeper-v0-easy",
    "gym:FrozenLake-v1",
    "gym:CliffWalking-v1",
    "reasoning_gym:basic_arithmetic",
    "reasoning_gym:word_ladder",  # a finite dataset: its last tenth is held out for validation
    *REMOTE,
    "openenv",
]
TOKEN = "contract-test-token"
OPTIONS = {"openenv": {"app": "guess_env.server.app:app"}}
OPENENV_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "openenv"


@pytest.fixture(scope="module", autouse=True)
def env_servers():
    """One env server per remote domain, and the token the remote envs read."""
    previous = os.environ.get("ROLLART_ENV_TOKEN")
    os.environ["ROLLART_ENV_TOKEN"] = TOKEN
    python_path = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(OPENENV_EXAMPLE), python_path) if p)
    servers = {}
    for spec in REMOTE:
        domain = spec.split(":", 1)[1]
        servers[spec] = EnvServer(domain, domain, resolve_env(domain), EnvServerConfig(port=0), EnvsConfig(),
                                  token=TOKEN).start()
    yield servers
    for server in servers.values():
        server.stop()
    if previous is None:
        os.environ.pop("ROLLART_ENV_TOKEN", None)
    else:
        os.environ["ROLLART_ENV_TOKEN"] = previous
    if python_path is None:
        os.environ.pop("PYTHONPATH", None)
    else:
        os.environ["PYTHONPATH"] = python_path


@pytest.fixture(scope="module")
def dataset_env(tmp_path_factory):
    from rollart.config import DatasetConfig, DomainConfig
    from rollart.envs.chat import ChatTokens
    from rollart.envs.dataset import open_dataset_domain
    from rollart.models import build_tokenizer

    path = tmp_path_factory.mktemp("rows") / "rows.jsonl"
    path.write_text("".join(json.dumps({"q": f"What is {i} + {i}?", "a": f"{i} + {i} = {2 * i}\n#### {2 * i}"}) + "\n"
                            for i in range(20)))
    cfg = DomainConfig(env="dataset", reward="math", data=DatasetConfig(train=str(path), columns={"prompt": "q",
                                                                                                "answer": "a"}))
    return open_dataset_domain("rows", cfg, ChatTokens(build_tokenizer()), seed=0).make_env


@pytest.fixture(scope="module")
def servers(env_servers, dataset_env):
    return {**env_servers, "dataset": dataset_env}


def build(spec: str, servers: dict) -> object:
    if spec == "dataset":
        return servers["dataset"]()
    return make_env(f"remote:{servers[spec].url}" if spec in servers else spec, OPTIONS.get(spec))


def episode(spec: str, seed: int, servers: dict, steps: int = 3) -> list:
    env = build(spec, servers)
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
def test_shapes_and_seeded_determinism(spec, servers):
    assert episode(spec, 11, servers) == episode(spec, 11, servers)


@pytest.mark.parametrize("spec", [s for s in SPECS if not s.startswith("gym:")])  # gym maps are fixed
def test_seeds_give_different_episodes(spec, servers):
    first_obs = {episode(spec, seed, servers, steps=0)[0] for seed in range(8)}
    assert len(first_obs) > 1


@pytest.mark.parametrize("spec", SPECS)
def test_malformed_action_is_reported_not_raised(spec, servers):
    env = build(spec, servers)
    env.reset(seed=1)
    obs, reward, terminated, truncated, info = env.step("I am not sure what to do.")
    assert info.get("format_error") and isinstance(obs, str) and obs
