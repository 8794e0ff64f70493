"""Built-in domains on hand-made cases: winning sequences win, malformed actions are flagged, parsers,
experts, random actions and the train/val seed split."""

from __future__ import annotations

import ast

import pytest

from rollart.config import DomainConfig
from rollart.envs import demonstrations, episode_seed, expert_action, random_action
from rollart.envs.actions import boxed, extract_boxed, extract_code
from rollart.envs.domains.code_env import CodeEnv, code_format_error
from rollart.envs.domains.frozenlake import FrozenLakeEnv, parse_action, shortest_path
from rollart.envs.domains.guess_number import GuessNumberEnv
from rollart.envs.domains.math_env import MathEnv, make_problem
from rollart.envs.domains.sokoban import SokobanEnv, apply_move, solve
from rollart.envs.seeds import SPLIT_SIZE, VAL_OFFSET
from rollart.types import Task


# --- action text ----------------------------------------------------------------------------------
def test_extract_boxed_takes_the_last_closed_box_with_balanced_braces():
    assert extract_boxed("first \\boxed{1} then \\boxed{\\frac{1}{2}}") == "\\frac{1}{2}"
    assert extract_boxed("\\boxed{ Left }") == "Left"
    assert extract_boxed("\\boxed{7} and an open \\boxed{8") == "7"
    assert extract_boxed("no box here") is None
    assert boxed("Up") == "\\boxed{Up}"


def test_extract_code_prefers_fenced_blocks():
    text = "```python\ndef f(x):\n    return {x: 1}\n```"
    assert extract_code(text) == "def f(x):\n    return {x: 1}"
    assert extract_code("\\boxed{def f(x): return x}") == "def f(x): return x"
    assert extract_code("nothing") is None


# --- frozenlake -----------------------------------------------------------------------------------
def test_frozenlake_parser():
    assert parse_action("I go \\boxed{Right}") == 2
    assert parse_action("\\boxed{u}") == 3
    assert parse_action("\\boxed{north}") is None
    assert parse_action("Right") is None


def test_frozenlake_known_map_winning_sequence_wins():
    desc = ["SFFF", "FHFH", "FFFH", "HFFG"]  # gymnasium's classic 4x4 map
    path = shortest_path(desc, 0)
    assert len(path) == 6
    env = FrozenLakeEnv()
    env.reset(seed=0)
    path = shortest_path(env.desc, env.position)
    names = {0: "Left", 1: "Down", 2: "Right", 3: "Up"}
    rewards = []
    for i, a in enumerate(path):
        obs, r, term, trunc, info = env.step(boxed(names[a]))
        rewards.append(r)
        assert term == (i == len(path) - 1)
    assert rewards[-1] == 1.0 and sum(rewards) == 1.0
    assert "P" in obs and "goal" in obs


def test_frozenlake_hole_ends_with_zero_and_malformed_is_flagged():
    env = FrozenLakeEnv()
    env.reset(seed=0)
    obs, r, term, trunc, info = env.step("move right please")
    assert (r, term, trunc) == (0.0, False, False) and info["format_error"]
    assert "Invalid" in obs and "P" in obs  # the map is shown again
    # walk into a hole: find a neighbour hole of the start by search over maps
    for seed in range(50):
        env.reset(seed=seed)
        n = env.size
        for action, name in ((2, "Right"), (1, "Down")):
            r_, c_ = divmod(env.position, n)
            nxt = (r_, c_ + 1) if action == 2 else (r_ + 1, c_)
            if env.desc[nxt[0]][nxt[1]] == "H":
                _, r, term, _, _ = env.step(boxed(name))
                assert term and r == 0.0
                return
    pytest.fail("no map with a hole next to the start in 50 seeds")


def test_frozenlake_maps_vary_with_seed_and_show_every_turn():
    maps = {tuple(FrozenLakeEnv().reset(seed=s)[1]["map"]) for s in range(20)}
    assert len(maps) > 10
    env = FrozenLakeEnv()
    obs0, _ = env.reset(seed=1)
    obs1, *_ = env.step(env.expert_action())
    assert sum(line.strip() != "" and set(line) <= set("SFHGP") for line in obs1.splitlines()) == 4


# --- sokoban --------------------------------------------------------------------------------------
def test_sokoban_hand_made_puzzle_solution_and_blocked_moves():
    walls = frozenset({(r, c) for r in range(5) for c in range(5) if r in (0, 4) or c in (0, 4)})
    goals = frozenset({(2, 3)})
    state = ((2, 1), frozenset({(2, 2)}))
    assert solve(walls, goals, state) == ["right"]
    assert apply_move(walls, ((1, 1), frozenset()), "up") is None  # wall
    pushed_into_wall = ((2, 2), frozenset({(2, 3)}))
    assert apply_move(walls, pushed_into_wall, "right") is None  # box against a wall


def test_sokoban_generated_puzzles_are_solvable_and_the_solution_wins():
    env = SokobanEnv()
    for seed in range(10):
        obs, info = env.reset(seed=seed)
        assert "X" in obs and "P" in obs
        plan = solve(env.walls, env.goals, env.state)
        assert plan is not None and len(plan) == info["optimal_moves"] >= 2
        total = 0.0
        for i, move in enumerate(plan):
            _, r, term, _, _ = env.step(f"\\boxed{{{move}}}")
            total += r
            assert term == (i == len(plan) - 1)
        assert total == 1.0


def test_sokoban_malformed_and_blocked():
    env = SokobanEnv()
    env.reset(seed=4)
    obs, r, term, _, info = env.step("\\boxed{jump}")
    assert info["format_error"] and r == 0.0 and not term
    board_before = env.board()
    for move in ("up", "down", "left", "right"):  # some move is blocked or not; a blocked one keeps the board
        nxt = apply_move(env.walls, env.state, move)
        if nxt is None:
            obs, r, term, _, info = env.step(boxed(move))
            assert env.board() == board_before and "cannot" in obs and "format_error" not in info
            break


# --- math -----------------------------------------------------------------------------------------
def test_math_reference_and_format():
    env = MathEnv()
    obs, info = env.reset(seed=7)
    answer = info["reference"]["answer"]
    question, expected = make_problem(7)
    assert question in obs and answer == expected
    obs, r, term, _, step_info = env.step("the answer is 5")
    assert step_info["format_error"] and not term and r == 0.0
    obs, r, term, _, step_info = env.step(f"so \\boxed{{{answer}}}")
    assert term and r == 0.0  # the env never scores: the reward plane does
    assert step_info["answer"] == answer


def test_math_answers_are_right():
    for seed in range(200):
        question, answer = make_problem(seed)
        if question.startswith("What is "):
            assert eval(question[len("What is ") : -1]) == int(answer)  # noqa: S307 - generated text
        else:
            assert int(answer) >= 0


# --- code -----------------------------------------------------------------------------------------
def test_code_reference_solution_passes_its_hidden_tests():
    env = CodeEnv()
    families = set()
    for seed in range(40):
        obs, info = env.reset(seed=seed)
        ref = info["reference"]
        families.add(obs.split(" ")[1])
        solution = extract_code(env.expert_action())
        namespace: dict = {}
        exec(compile(solution, "<solution>", "exec"), namespace)  # trusted: our own reference code
        for test in ref["tests"]:
            exec(test, namespace)
        assert ref["entry_point"] == "f" and len(ref["tests"]) == 4
    assert len(families) >= 2


def test_code_format_errors():
    assert code_format_error("no code") is not None
    assert "parse" in code_format_error("```python\ndef f(:\n```")
    assert "named f" in code_format_error("```python\ndef g(x):\n    return x\n```")
    assert code_format_error("```python\ndef f(x):\n    return x\n```") is None
    env = CodeEnv()
    env.reset(seed=1)
    _, r, term, _, info = env.step("I don't know")
    assert info["format_error"] and not term
    _, r, term, _, info = env.step(env.random_action())
    assert term and "format_error" not in info
    ast.parse(extract_code(env.random_action()))


# --- GEM game (guess_number) ----------------------------------------------------------------------
def test_guess_number_expert_wins_and_missing_box_is_a_format_error():
    env = GuessNumberEnv()
    obs, info = env.reset(seed=3)
    assert "Guess The Number" in obs and "Enter your next guess" in obs  # GEM's suffix is appended
    obs, r, term, _, info = env.step("five")
    assert info["format_error"] and not term  # not passed to GEM, which would end the episode
    for _ in range(4):
        obs, r, term, trunc, info = env.step(env.expert_action())
        if term:
            break
    assert term and r == 1.0 and "Congratulations" in obs


# --- experts, random actions, splits ----------------------------------------------------------------
@pytest.mark.parametrize("domain", ["frozenlake", "sokoban", "guess_number"])
def test_experts_solve_multi_turn_domains(domain):
    demos = demonstrations(domain, DomainConfig(env=domain, max_turns=12), range(12))
    assert all(d.terminated and d.env_return == 1.0 for d in demos)
    assert all(m["role"] == ("user" if i % 2 == 0 else "assistant") for d in demos for i, m in enumerate(d.messages))


@pytest.mark.parametrize("domain", ["math", "code"])
def test_single_turn_demonstrations_carry_the_reference(domain):
    demos = demonstrations(domain, DomainConfig(env=domain), range(5), split="val")
    for d in demos:
        assert d.terminated and len(d.messages) == 2 and d.reference
    math_demo = demonstrations("math", DomainConfig(env="math"), [11])[0]
    assert math_demo.messages[1]["content"] == boxed(math_demo.reference["answer"])


@pytest.mark.parametrize("spec", ["frozenlake", "sokoban", "math", "code", "guess_number"])
def test_random_actions_are_well_formed(spec):
    from rollart.envs import make_env

    env = make_env(spec)
    env.reset(seed=5)
    for _ in range(3):
        action = random_action(env)
        _, _, term, _, info = env.step(action)
        assert "format_error" not in info
        if term:
            break
    assert expert_action(env)


def test_val_split_uses_a_disjoint_seed_range():
    train = {episode_seed(Task("t", "math", "math", s, "g", "train")) for s in range(1000)}
    val = {episode_seed(Task("t", "math", "math", s, "g", "val")) for s in range(1000)}
    assert not train & val
    assert max(train) < SPLIT_SIZE <= VAL_OFFSET <= min(val) and max(val) < 2**32
    q_train = {make_problem(episode_seed(Task("t", "math", "math", s, "g", "train")))[0] for s in range(50)}
    q_val = {make_problem(episode_seed(Task("t", "math", "math", s, "g", "val")))[0] for s in range(50)}
    assert q_train != q_val


def test_math_ops_option_restricts_arithmetic_and_is_validated():
    env = MathEnv(kinds=["arithmetic"], max_operand=3, ops="+")
    questions = {env.reset(seed)[0] for seed in range(40)}
    assert all(" + " in q and " - " not in q and " * " not in q for q in questions)
    assert len(questions) <= 16  # (0..3) × (0..3)
    with pytest.raises(ValueError, match="ops"):
        MathEnv(ops="/")


def test_demonstrations_mix_expert_and_random_actions_by_expert_prob():
    cfg = DomainConfig(env="math", max_turns=1, options={"kinds": ["arithmetic"], "max_operand": 3, "ops": "+"})
    expert = demonstrations("math", cfg, range(40), expert_prob=1.0)
    assert all(d.messages[-1]["content"] == f"\\boxed{{{d.reference['answer']}}}" for d in expert)
    mixed = demonstrations("math", cfg, range(40), expert_prob=0.0)
    wrong = sum(d.messages[-1]["content"] != f"\\boxed{{{d.reference['answer']}}}" for d in mixed)
    assert wrong >= 20  # random guesses over 0..6 are mostly wrong
    assert all(d.messages[-1]["content"].startswith("\\boxed{") for d in mixed)  # but always well-formed
    with pytest.raises(ValueError, match="expert_prob"):
        demonstrations("math", cfg, [0], expert_prob=1.5)
