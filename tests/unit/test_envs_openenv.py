"""The `openenv` kind without a server: how the model's text becomes the env's action (a JSON object checked
against the server's action schema, one field, or the user's parser), how observations read as text, random
actions that fit the schema, and options refused with what would be valid. Played against real servers in
tests/contracts/test_envs_contract.py (local) and tests/contracts/test_openenv_served.py (local and podman)."""

from __future__ import annotations

import json
import random

import jsonschema
import pytest

from rollart.envs.adapters.openenv import OpenEnvEnv, _describe, _sample
from rollart.envs.spec import EnvSpecError, make_env

SCHEMA = {
    "type": "object", "additionalProperties": False, "required": ["guess"],
    "properties": {
        "metadata": {"type": "object", "additionalProperties": True},
        "guess": {"type": "integer", "minimum": 1, "maximum": 100, "description": "Your guess"},
        "mode": {"enum": ["fast", "slow"]},
    },
}


def env(**options) -> OpenEnvEnv:
    e = OpenEnvEnv(url="http://127.0.0.1:9", **options)
    e.schema = SCHEMA
    return e


def test_the_action_is_the_last_json_object_checked_against_the_schema():
    e = env()
    assert e.parse('{"guess": 3}') == {"guess": 3}
    assert e.parse('I think {"guess": 3} ... no, ```json\n{"guess": 7, "mode": "slow"}\n```') == {"guess": 7,
                                                                                                "mode": "slow"}
    assert e.parse('first {"guess": 1} then {"guess": {"nested": 1}} finally {"guess": 9}') == {"guess": 9}
    for text, problem in (("guess 3", "no JSON object"), ('{"guess": 3', "no JSON object"),
                          ('{"guess": three}', "does not parse"), ('{"guess": 300}', "guess: 300 is greater"),
                          ('{"guess": 3, "extra": 1}', "Additional properties"), ('{"mode": "fast"}', "required"),
                          ("x" * 70_000, "over 65536 characters")):
        with pytest.raises(ValueError, match=problem):
            e.parse(text)


def test_a_field_or_a_user_parser_takes_the_whole_text(tmp_path, monkeypatch):
    e = OpenEnvEnv(url="http://127.0.0.1:9", action_field="message")
    assert e.parse("  hello there \n") == {"message": "hello there"}
    (tmp_path / "my_parser.py").write_text("def parse(text):\n    if 'pass' in text:\n        raise ValueError('no')\n"
                                           "    return {'guess': len(text)}\n")
    monkeypatch.chdir(tmp_path)
    p = OpenEnvEnv(url="http://127.0.0.1:9", parse_action="my_parser:parse")
    p.schema = SCHEMA
    assert p.parse("abc") == {"guess": 3}
    with pytest.raises(ValueError, match="no"):
        p.parse("I pass")


def test_observations_read_as_text_and_the_first_says_how_to_act():
    e = env()
    assert e._text({"feedback": "higher", "reward": 0.0, "done": False, "metadata": {"x": 1}}) == "higher"
    assert e._text({"feedback": "higher", "left": 3, "board": [1, 2]}) == "feedback: higher\nleft: 3\nboard: [1, 2]"
    how = _describe(SCHEMA)
    assert how.startswith("Act with a JSON object:") and '"guess" (integer, required): Your guess' in how
    assert "metadata" not in how


def test_random_actions_fit_the_schema():
    rng = random.Random(0)
    for _ in range(50):
        action = _sample({"type": "object", **SCHEMA}, rng)
        jsonschema.validate(action, SCHEMA)
    assert json.loads(env().random_action())["guess"] in range(1, 101)


def test_options_are_refused_with_what_would_be_valid():
    for options, problem in (({}, "exactly one of options.url"), ({"url": "u", "app": "m:a"}, "exactly one"),
                             ({"url": "ftp://x"}, "http"), ({"app": "not an app"}, "module.path:app"),
                             ({"app": "m:a", "engine": "lxc"}, "podman or docker"),
                             ({"url": "http://h:1", "action_field": "a", "parse_action": "m:f"}, "at most one")):
        with pytest.raises(ValueError, match=problem):
            make_env("openenv", options)
    with pytest.raises(EnvSpecError, match="takes no id"):
        make_env("openenv:http://127.0.0.1:8000")
