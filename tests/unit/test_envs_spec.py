"""Env spec resolution and the adapters: built-ins, gem:<id>, gym:<id>, module.path:Class, bad specs;
`rollart env play`."""

from __future__ import annotations

import asyncio
import textwrap

import pytest

from rollart.envs import BUILTIN_ENVS, AsyncEnv, EnvSpecError, make_env, resolve_env
from rollart.envs.domains.frozenlake import FrozenLakeEnv
from rollart.envs.adapters.gem import GemEnv
from rollart.envs.adapters.gym import GymEnv

USER_ENV = textwrap.dedent(
    '''
    class CountTo:
        """Say the next number; reach `target` to win."""

        def __init__(self, target=3):
            self.target = target

        def reset(self, seed=None):
            self.n = 0
            return "Say 1.", {"reference": {"target": self.target}}

        def step(self, action):
            ok = action.strip().endswith(str(self.n + 1))
            self.n += ok
            done = self.n == self.target
            return f"Now say {self.n + 1}.", float(done), done, False, {} if ok else {"format_error": "wrong"}


    class AsyncCountTo(CountTo):
        async def reset(self, seed=None):
            return CountTo.reset(self, seed)

        async def step(self, action):
            return CountTo.step(self, action)
    '''
)


@pytest.fixture
def user_module(tmp_path, monkeypatch):
    (tmp_path / "my_count_env.py").write_text(USER_ENV)
    monkeypatch.chdir(tmp_path)
    yield "my_count_env"
    import sys

    sys.modules.pop("my_count_env", None)


def test_builtin_names_resolve():
    for name, cls in BUILTIN_ENVS.items():
        if name == "dataset":  # built from a domain's rows (domain_env_factory; tests/unit/test_envs_dataset.py)
            with pytest.raises(EnvSpecError, match="built from a domain's `data`"):
                resolve_env(name)
            continue
        assert isinstance(resolve_env(name)(), cls)
    env = make_env("frozenlake", {"size": 5})
    assert isinstance(env, FrozenLakeEnv) and env.size == 5


def test_unknown_spec_lists_builtins_and_forms():
    with pytest.raises(EnvSpecError) as err:
        resolve_env("frozen_lake")
    message = str(err.value)
    for word in ("frozen_lake", "frozenlake", "sokoban", "math", "code", "gem:<id>", "gym:<id>", "module.path:Class"):
        assert word in message
    with pytest.raises(EnvSpecError, match="cannot import module"):
        resolve_env("no_such_module_xyz:Env")
    with pytest.raises(EnvSpecError, match="rejected options"):
        make_env("frozenlake", {"sise": 4})


def test_gem_adapter_runs_an_episode():
    env = make_env("gem:game:GuessTheNumber-v0-easy")
    assert isinstance(env, GemEnv)
    obs, info = env.reset(seed=1)
    assert "\\boxed" in obs
    target = env.env.unwrapped.game_number
    obs, r, term, trunc, info = env.step(f"\\boxed{{{target}}}")
    assert term and r == 1.0
    with pytest.raises(ValueError, match="GEM could not make"):
        make_env("gem:game:NoSuchGame-v0")


def test_gem_adapter_sokoban_game_steps():
    env = make_env("gem:game:Sokoban-v0-easy")
    obs, _ = env.reset(seed=1)
    assert "#" in obs and "board" in obs  # GEM's board comes in info["suffix"]
    obs, r, term, trunc, info = env.step("\\boxed{up}")
    assert "moved" in obs and "#" in obs and not term


def test_gym_adapter_runs_an_episode_to_the_goal():
    env = make_env("gym:FrozenLake-v1", {"is_slippery": False, "action_names": ["Left", "Down", "Right", "Up"]})
    assert isinstance(env, GymEnv)
    obs, _ = env.reset(seed=0)
    assert "[S]" in obs and "\x1b" not in obs  # the agent's highlighted cell survives, colour codes do not
    total, term = 0.0, False
    for action in ["Right", "Right", "Down", "Down", "Down", "Right"]:
        obs, r, term, trunc, info = env.step(f"\\boxed{{{action}}}")
        total += r
    assert term and total == 1.0
    env.reset(seed=0)
    _, r, term, _, info = env.step("\\boxed{9}")
    assert info["format_error"] and not term
    _, _, _, _, info = env.step("\\boxed{1}")  # indices work too
    assert "format_error" not in info


def test_gym_adapter_refuses_non_discrete_actions():
    with pytest.raises(ValueError, match="Discrete"):
        make_env("gym:Pendulum-v1")


def test_user_class_from_current_directory(user_module):
    env = make_env(f"{user_module}:CountTo", {"target": 2})
    obs, info = env.reset()
    assert info["reference"] == {"target": 2}
    assert env.step("1")[2] is False and env.step("2")[2] is True
    with pytest.raises(EnvSpecError, match="has no attribute"):
        resolve_env(f"{user_module}:Missing")


def test_async_user_env_through_async_facade(user_module):
    async def play():
        env = AsyncEnv(make_env(f"{user_module}:AsyncCountTo", {"target": 1}))
        await env.reset(1)
        return await env.step("1")

    obs, reward, terminated, truncated, info = asyncio.run(play())
    assert terminated and reward == 1.0


def test_async_env_rejects_non_envs_and_bad_returns():
    with pytest.raises(TypeError, match="no reset"):
        AsyncEnv(object())

    class Bad:
        def reset(self, seed=None):
            return "only an observation"

        def step(self, action):
            return ()

    with pytest.raises(TypeError, match="must return"):
        asyncio.run(AsyncEnv(Bad()).reset(0))


def test_cli_play_with_actions_prints_the_episode(capsys, user_module):
    from rollart.cli import main

    assert main(["env", "play", "frozenlake", "--seed", "0", "--policy", "expert"]) == 0
    out = capsys.readouterr().out
    assert "observation 1" in out and "reward 1" in out and "completed" in out
    assert main(["env", "play", "math", "--seed", "2", "--actions", "12"]) == 0
    out = capsys.readouterr().out
    assert "reference: {'answer'" in out and "\\boxed{12}" in out and "completed" in out
    assert main(["env", "play", f"{user_module}:CountTo", "--actions", "\\boxed{1};x", "--raw"]) == 0
    out = capsys.readouterr().out
    assert "format error: wrong" in out and "no more actions" in out
    assert main(["env", "play", "nonsense"]) == 2
    assert "Accepted" in capsys.readouterr().err


def test_cli_list_prints_each_description_whole_with_its_options(capsys):
    import inspect

    from rollart.cli import main
    from rollart.envs.spec import BUILTIN_ENVS

    assert main(["env", "list"]) == 0
    out = " ".join(capsys.readouterr().out.split())  # the lines are wrapped: compare the words
    for name, ctor in BUILTIN_ENVS.items():
        summary = " ".join(inspect.getdoc(ctor).split("\n\n")[0].split())
        assert f"{name} {summary}" in out  # not cut at the docstring's first line
    assert "options: size=4, frozen_prob=0.8, slippery=False" in out


def test_cli_play_says_turn_in_the_singular(capsys):
    from rollart.cli import main

    assert main(["env", "play", "frozenlake", "--seed", "0", "--actions", "Left;Left", "--max-turns", "1"]) == 0
    assert "stopped after 1 turn (--max-turns)" in capsys.readouterr().out


def test_cli_play_with_a_model_runs_the_rollout_path(capsys, tiny_model_path):
    from rollart.cli import main

    # a checkpoint outside a run: the default run's domains, greedy (the val split's eval.temperature)
    assert main(["env", "play", "frozenlake", "--model", str(tiny_model_path), "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert f"== {tiny_model_path} plays its domain frozenlake (frozenlake), seed 1 (val, temperature 0" in out
    assert "-- observation 1" in out and "-- action 1 (" in out and "\n== end: " in out
    assert main(["env", "play", "frozenlake", "--policy", "model"]) == 2  # which model?
    assert "--policy model needs --model" in capsys.readouterr().err


@pytest.mark.parametrize("example, domain", [("reasoning_gym", "arith"), ("openenv", "guess"), ("verifiers", "reverse")])
def test_the_examples_of_the_env_adapters_pass_the_preflight(example, domain, monkeypatch):
    """examples/<adapter>/run.yaml as a user runs it (from its directory): the config loads and the checks that
    run before anything starts pass — the env spec resolves (a verifiers taskset imports), no warm start is asked
    of a kind with no expert."""
    from pathlib import Path

    from rollart.config.loader import load_config
    from rollart.job.preflight import check_config

    here = Path(__file__).resolve().parents[2] / "examples" / example
    monkeypatch.chdir(here)
    monkeypatch.syspath_prepend(str(here))
    cfg = load_config(here / "run.yaml")
    assert list(cfg.domains) == [domain]
    check_config(cfg)
    assert cfg.domains[domain].runs_agent == (example == "verifiers")
