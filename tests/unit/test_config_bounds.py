"""Every count, size and time of the config has an upper bound a real cluster would not exceed, shown by
`rollart config explain`; `domains: {}` is an error, not a silent keep of the defaults."""

from __future__ import annotations

import types
import typing

import annotated_types
import pytest
from pydantic import BaseModel

from rollart.config import RunConfig
from rollart.config.loader import ConfigError, load_config
from rollart.config.explain import explain, find_key

FREE = {"options"}  # an env's own keyword arguments: the env bounds them


def _kinds(annotation) -> list:
    """The annotation's types, an Optional unwrapped."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return [a for a in typing.get_args(annotation) if a is not type(None)]
    return [annotation]


def _fields(model: type[BaseModel], prefix: str = ""):
    for name, field in model.model_fields.items():
        inner = _kinds(field.annotation)
        sub = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), None)
        if typing.get_origin(inner[0]) is dict:
            value = typing.get_args(inner[0])[1]
            yield f"{prefix}{name}", field
            if isinstance(value, type) and issubclass(value, BaseModel):
                yield from _fields(value, f"{prefix}{name}.<name>.")
        elif sub is not None:
            yield from _fields(sub, f"{prefix}{name}.")
        else:
            yield f"{prefix}{name}", field


def _has(field, *kinds) -> bool:
    return any(isinstance(m, kinds) for m in field.metadata)


def test_every_number_list_and_mapping_has_an_upper_bound():
    unbounded = []
    for key, field in _fields(RunConfig):
        kinds = _kinds(field.annotation)
        origin = {typing.get_origin(a) for a in kinds}
        if key.rsplit(".", 1)[-1] in FREE:
            continue
        if set(kinds) & {int, float}:
            if not _has(field, annotated_types.Le, annotated_types.Lt):
                unbounded.append(key)
        elif origin & {list, dict} and not _has(field, annotated_types.MaxLen):
            unbounded.append(key)
    assert not unbounded, f"keys without an upper bound: {unbounded}"


def test_the_bound_is_shown_by_config_explain():
    assert "≤ 1000000" in explain("rollout.batch_size")
    assert find_key("train.steps").allowed == "≥ 1, ≤ 10000000"


@pytest.mark.parametrize("override, key", [
    ("rollout.batch_size=4000000000", "rollout.batch_size"),  # 2.77 M asyncio tasks and 7.85 GB on main
    ("train.steps=1.0e+26", "train.steps"),
    ("reward.timeout_s=1.0e+300", "reward.timeout_s"),  # a timeout asyncio/threading cannot even wait for
    ("domains.math.max_new_tokens=100000000000", "domains.math.max_new_tokens"),
])
def test_absurd_sizes_are_refused_at_config_time(override, key):
    with pytest.raises(ConfigError, match=f"'{key}'"):
        load_config(None, [override])


def test_empty_domains_is_an_error_that_says_how_to_replace_the_defaults(tmp_path):
    run = tmp_path / "run.yaml"
    run.write_text("domains: {}\n")
    with pytest.raises(ConfigError) as info:
        load_config(run)
    assert f"'domains' = {{}} (from {run} line 1)" in str(info.value)
    assert "frozenlake: null, math: null" in str(info.value)
    with pytest.raises(ConfigError, match="'pools' = {}"):
        load_config(None, ["pools={}"])
    assert set(load_config(None, ["domains.math=null"]).domains) == {"frozenlake"}  # removing one still works


def test_the_defaults_are_within_their_bounds():
    RunConfig.model_validate(RunConfig().model_dump())
