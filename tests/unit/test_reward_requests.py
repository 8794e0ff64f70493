"""The reward service's handler, in-process: every malformed request is a JSON 4xx naming the field (a
fuzzer sends a few thousand), idempotency keys cannot collide across runs, attempts, evaluations or jobs,
and a key reused with another payload is a 409 that no client retries."""

from __future__ import annotations

import asyncio
import copy
import json
import random
from typing import Any

import httpx

from rollart.config import DomainConfig, RewardConfig, RunConfig
from rollart.reward import tokens
from rollart.reward.client import HttpRewardClient
from rollart.reward.handler import RewardHandler
from rollart.reward.claims import SharedClaimBook
from rollart.reward.protocol import RewardInputError, to_payload
from rollart.reward.router import RewardRouter
from rollart.types import Status, Task, Trajectory, Turn

SECRET = "service-secret"
SCORED: list[str] = []


def echo_reward(trajectory: Trajectory) -> float:
    """The action as a number (so each payload has its own answer); needs reference['k']."""
    if "k" not in trajectory.reference:
        raise RewardInputError("reference['k'] is missing")
    try:
        value = float(trajectory.turns[-1].action)
    except ValueError:
        raise RewardInputError(f"action {trajectory.turns[-1].action!r} is not a number") from None
    SCORED.append(trajectory.trajectory_id)
    return value


def config() -> RunConfig:
    cfg = RunConfig(domains={"d": DomainConfig(env="math", reward=f"{__name__}:echo_reward")})
    cfg.reward = RewardConfig(retries=3, backoff_s=0.001, backoff_max_s=0.002, timeout_s=5.0)
    return cfg


def make_traj(tid: str = "g000000/0", action: str = "1", domain: str = "d") -> Trajectory:
    return Trajectory(tid, Task(tid, domain, "math", 7, "g000000"), 3,
                      (Turn((), (), (), (), observation="obs", action=action, reward=0.5),),
                      status=Status.COMPLETED, env_return=1.0, reference={"k": "v"})


def handler() -> RewardHandler:
    return RewardHandler(config(), SharedClaimBook(2**20, 3600, 30), token=SECRET, replica="r")


async def send(h: RewardHandler, body: bytes, headers: dict[str, str] | None = None) -> tuple[int, dict[str, Any]]:
    async def stream():
        yield body

    base = {"authorization": f"Bearer {SECRET}", "content-length": str(len(body))}
    return await h.handle({**base, **(headers or {})}, stream())


# --- the fuzzer -------------------------------------------------------------------------------------------

VALID = to_payload(make_traj(), "d")
# field path → values of a wrong type or out of range for it (each makes the payload malformed)
WRONG = {
    ("v",): [2, "1", True, None, 1.0],
    ("trajectory_id",): ["", 5, None, ["a"], "x" * 600, True],
    ("domain",): [5, None, {"a": 1}, "x" * 300],
    ("fn",): [5, ["math"], {"x": 1}, "x" * 600],
    ("task",): ["abc", 5, [], None],
    ("task", "seed"): ["abc", "1", 1.5, True, [1], {"a": 1}, 2**64, -(2**64)],
    ("task", "split"): ["test", 1, None],
    ("task", "task_id"): [1, ["a"]],
    ("task", "env"): [1, {}],
    ("task", "group_id"): [1, []],
    ("start_version",): [[1], "1", -1, 1.0, True, 2**63, None],
    ("status",): ["weird", 1, True, []],
    ("status_reason",): [1, None, []],
    ("env_return",): ["1.0", True, None, [1.0], "nan"],
    ("reference",): [[1], "x", 5, True],
    ("turns",): [{}, "a", 5, None, [1], [[]], ["x"]],
    ("turns", 0, "action"): [5, None, [], {"a": 1}],
    ("turns", 0, "observation"): [5, [], True],
    ("turns", 0, "reward"): ["1", True, None, []],
    ("turns", 0, "format_ok"): [1, "yes", None],
    ("turns", 0, "finish_reason"): ["eos", 1, None],
}
REQUIRED = [("v",), ("trajectory_id",), ("domain",), ("task",), ("turns",), ("turns", 0, "action")]
RAW_BODIES = [
    b"", b"not json", b"{", b"[" * 100_000 + b"]" * 100_000, b'{"v": 1' + b"," * 10, b"\xff\xfe\x00garbage",
    b'{"v": 1, "trajectory_id": "a", "task": {"seed": ' + b"9" * 5000 + b"}}", b"null", b"[]", b'"a string"', b"3.5",
    b'{"v": NaN}', b'{"v": Infinity}',
]


def _set(payload: dict, path: tuple, value: Any) -> None:
    target = payload
    for part in path[:-1]:
        target = target[part]
    target[path[-1]] = value


def _delete(payload: dict, path: tuple) -> None:
    target = payload
    for part in path[:-1]:
        target = target[part]
    del target[path[-1]]


def malformed_requests(n: int, seed: int = 0):
    """(body bytes, extra headers, field the answer must name or None) — every one malformed."""
    rng = random.Random(seed)
    fields = list(WRONG)
    for i in range(n):
        roll = rng.random()
        payload = copy.deepcopy(VALID)
        headers: dict[str, str] = {}
        if roll < 0.55:  # one field of a wrong type or out of range, maybe among other valid changes
            path = rng.choice(fields)
            _set(payload, path, copy.deepcopy(rng.choice(WRONG[path])))
            if isinstance(payload.get("turns"), list) and payload["turns"] and isinstance(payload["turns"][0], dict) \
                    and path[0] != "turns" and rng.random() < 0.3:
                payload["turns"] = payload["turns"] * rng.randint(1, 5)  # longer, still valid, trajectories
            field = ".".join(str(p) for p in path).replace(".0.", "[0].")
            yield json.dumps(payload).encode(), headers, field
        elif roll < 0.65:  # a required field missing
            path = rng.choice(REQUIRED)
            _delete(payload, path)
            yield json.dumps(payload).encode(), headers, ".".join(str(p) for p in path).replace(".0.", "[0].")
        elif roll < 0.72:  # an unknown field, at the top or nested
            where = rng.choice([payload, payload["task"], payload["turns"][0]])
            where[f"extra_{i}"] = rng.choice([1, "x", None, [1]])
            yield json.dumps(payload).encode(), headers, f"extra_{i}"
        elif roll < 0.82:  # not JSON, not an object, too deep, too big a number
            yield rng.choice(RAW_BODIES), headers, None
        elif roll < 0.9:  # deep nesting inside the reference (valid JSON, within the limits: must be fine) …
            depth = rng.randint(1, 50)
            nested: Any = 1
            for _ in range(depth):
                nested = {"a": nested}
            payload["reference"] = {"k": "v", "deep": nested}
            payload["turns"][0]["action"] = "x"  # … but the reward cannot score this action
            yield json.dumps(payload).encode(), headers, None
        else:  # malformed headers with a valid body
            headers = rng.choice([
                {"idempotency-key": ""}, {"idempotency-key": "a b"}, {"idempotency-key": "k" * 257},
                {"idempotency-key": "ключ"}, {"idempotency-key": "a\x00b"}, {"content-length": "abc"},
                {"content-length": "-5"}, {"content-length": "9" * 40}, {"authorization": "Bearer nope"},
                {"authorization": ""}, {"authorization": "Basic " + SECRET},
                {"authorization": "Bearer " + tokens.issue(SECRET, "job")[:-1] + "0"},
            ])
            field = {"idempotency-key": "Idempotency-Key", "content-length": "Content-Length",
                     "authorization": "Authorization"}[next(iter(headers))]
            yield json.dumps(payload).encode(), headers, field


def test_fuzzed_malformed_requests_all_get_a_json_4xx_naming_the_field():
    h = handler()
    SCORED.clear()

    async def run_all():
        out = []
        for body, headers, field in malformed_requests(3000):
            status, answer = await send(h, body, headers)
            out.append((body, headers, field, status, answer))
        return out

    results = asyncio.run(run_all())
    assert len(results) == 3000
    for body, headers, field, status, answer in results:
        case = (body[:120], headers, status, answer)
        assert 400 <= status < 500, case
        assert isinstance(answer["error"], str) and answer["error"] and isinstance(answer["code"], str), case
        json.dumps(answer)  # JSON-able
        if field is not None:
            assert field in answer["error"] or field == answer.get("field"), case
    statuses = {status for *_, status, _ in results}
    assert {400, 401, 422} <= statuses
    assert SCORED == []  # nothing malformed was ever scored


def test_the_issues_examples():
    h = handler()
    cases = {"seed": ("task", "seed", "abc"), "start_version": ("start_version", None, [1])}

    async def run_all():
        out = {}
        for name, (a, b, value) in cases.items():
            payload = copy.deepcopy(VALID)
            if b:
                payload[a][b] = value
            else:
                payload[a] = value
            out[name] = await send(h, json.dumps(payload).encode())
        big = json.dumps(VALID).replace('"seed": 7', '"seed": ' + "9" * 5000).encode()
        out["5000-digit seed"] = await send(h, big)
        deep = b'{"v": 1, "reference": ' + b'{"a": ' * 5000 + b"1" + b"}" * 5001
        out["deep nesting"] = await send(h, deep)
        return out

    out = asyncio.run(run_all())
    assert out["seed"][0] == 422 and out["seed"][1]["field"] == "task.seed"
    assert out["start_version"][0] == 422 and out["start_version"][1]["field"] == "start_version"
    assert out["5000-digit seed"][0] == 400 and "4300" in out["5000-digit seed"][1]["error"]
    assert out["deep nesting"][0] == 400


# --- keys that cannot collide ------------------------------------------------------------------------------


def client_for(h: RewardHandler, run_key: str, token: str = SECRET) -> HttpRewardClient:
    async def endpoint(request):
        from starlette.responses import JSONResponse

        status, body = await h.handle(request.headers, request.stream())
        return JSONResponse(body, status_code=status)

    from starlette.applications import Starlette
    from starlette.routing import Route

    app = Starlette(routes=[Route("/reward", endpoint, methods=["POST"])])
    return HttpRewardClient("http://reward.test/reward", config().reward, token=token,
                            transport=httpx.ASGITransport(app=app), run_key=run_key, seed=0)


def test_same_trajectory_id_in_two_runs_a_resume_and_two_jobs_never_replays():
    h = handler()
    SCORED.clear()
    job_a, job_b = tokens.issue(SECRET, "job-a"), tokens.issue(SECRET, "job-b")
    clients = {
        "run 1": client_for(h, "run1/0"),
        "run 2": client_for(h, "run2/0"),
        "run 1 resumed": client_for(h, "run1/1"),
        "job a": client_for(h, "same/0", job_a),
        "job b": client_for(h, "same/0", job_b),  # the same run key: the token keeps them apart
    }

    async def run_all():
        return {name: await c.score(make_traj(action=str(i)), "d") for i, (name, c) in enumerate(clients.items())}

    results = asyncio.run(run_all())
    assert {n: r.reward for n, r in results.items()} == {n: float(i) for i, n in enumerate(clients)}
    assert all(r.ok and r.details["replayed"] is False for r in results.values())
    assert len(SCORED) == 5


def test_evaluations_get_their_own_run_ids():
    router = RewardRouter(config())
    first, second = router.for_run("eval-run-1"), router.for_run("eval-run-2")
    assert first.run_key != second.run_key != router.run_key
    key = router.http or HttpRewardClient("http://x", config().reward, run_key=router.run_key)
    traj = make_traj("eval/first/d/0")
    assert key.idempotency_key(traj, first.run_key) != key.idempotency_key(traj, second.run_key)


def test_same_key_other_payload_is_409_and_not_retried_same_payload_replays():
    h = handler()
    SCORED.clear()
    client = client_for(h, "run/0")

    async def run_all():
        first = await client.score(make_traj(action="1"), "d")
        again = await client.score(make_traj(action="1"), "d")
        forged = await client.score(make_traj(action="2"), "d")  # same run key and trajectory id
        return first, again, forged

    first, again, forged = asyncio.run(run_all())
    assert first.ok and first.reward == 1.0 and again.ok and again.details["replayed"] is True
    assert not forged.ok and forged.attempts == 1 and "HTTP 409" in forged.error and "Idempotency-Key" in forged.error
    assert SCORED == ["g000000/0"]
    assert h.claims.stats()["conflicts"] == 1


def test_a_job_cannot_reach_another_jobs_answers():
    h = handler()
    body = json.dumps(to_payload(make_traj(action="3"), "d")).encode()
    victim, other = tokens.issue(SECRET, "victim"), tokens.issue(SECRET, "other")

    async def run_all():
        mine = await send(h, body, {"authorization": f"Bearer {victim}", "idempotency-key": "k/0/t"})
        # the other job sends the victim's key with a different payload: its own scoring, no 409, no replay
        other_body = json.dumps(to_payload(make_traj(action="4"), "d")).encode()
        theirs = await send(h, other_body, {"authorization": f"Bearer {other}", "idempotency-key": "k/0/t"})
        replay = await send(h, body, {"authorization": f"Bearer {victim}", "idempotency-key": "k/0/t"})
        forged = await send(h, body, {"authorization": f"Bearer rj1.victim.{'0' * 32}", "idempotency-key": "k/0/t"})
        return mine, theirs, replay, forged

    mine, theirs, replay, forged = asyncio.run(run_all())
    assert mine[0] == theirs[0] == replay[0] == 200
    assert (mine[1]["reward"], theirs[1]["reward"], replay[1]["reward"]) == (3.0, 4.0, 3.0)
    assert theirs[1]["replayed"] is False and replay[1]["replayed"] is True
    assert forged[0] == 401 and forged[1]["field"] == "Authorization"


def test_bad_reference_is_422_and_not_retried():
    h = handler()
    client = client_for(h, "run/0")
    traj = Trajectory("t", Task("t", "d", "math", 0, "g"), 0, (Turn((), (), (), (), action="1"),))  # no 'k'
    res = asyncio.run(client.score(traj, "d"))
    assert not res.ok and res.attempts == 1 and "HTTP 422" in res.error and "reference['k']" in res.error
    assert res.fault is not None and res.fault.where == "reward"  # raised by the function itself: its domain's


def boom_reward(trajectory: Trajectory) -> float:
    return 1 / 0


def test_a_function_that_raises_on_the_service_is_a_fault_with_its_traceback_the_client_keeps():
    cfg = config()
    cfg.domains = {**cfg.domains, "boom": DomainConfig(env="math", reward=f"{__name__}:boom_reward")}
    h = RewardHandler(cfg, SharedClaimBook(2**20, 3600, 30), token=SECRET, replica="r")
    status, body = asyncio.run(send(h, json.dumps(to_payload(make_traj(domain="boom"), "boom")).encode()))
    assert status == 500 and body["code"] == "reward_failed"
    assert body["fault"]["error"] == "ZeroDivisionError: division by zero"
    assert "boom_reward" in body["fault"]["traceback"]
    client = client_for(h, "run/0")
    res = asyncio.run(client.score(make_traj("t2", domain="boom"), "boom"))
    assert not res.ok and res.attempts == 4 and res.fault is not None  # retried (a 500), then the fault stands
    assert res.fault.error == "ZeroDivisionError: division by zero" and "boom_reward" in res.fault.traceback
