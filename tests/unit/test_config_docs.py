"""The configuration is documented from the schema itself: every key has a description, `rollart config
explain` prints a key's type, default, allowed values and description, docs/configuration.md is what the
schema generates today, and unknown keys get the same hint from `explain` as from the config loader."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollart.cli import main
from rollart.config.loader import ConfigError, load_config
from rollart.config.explain import (
    REGENERATE,
    configuration_markdown,
    explain,
    find_key,
    schema_keys,
    undescribed_keys,
    unknown_key_hint,
)

ROOT = Path(__file__).resolve().parents[2]


def test_every_config_key_has_a_description():
    assert undescribed_keys() == [], "give these fields a description= in their section's module of rollart/config/"


def test_docs_configuration_md_is_generated_from_the_current_schema():
    path = ROOT / "docs" / "configuration.md"
    assert path.exists(), f"docs/configuration.md is missing; {REGENERATE}"
    assert path.read_text() == configuration_markdown(), f"docs/configuration.md is stale; regenerate: {REGENERATE}"


def test_the_reference_lists_every_leaf_key_once():
    text = configuration_markdown()
    for doc in schema_keys():
        if not doc.section:
            assert text.count(f"| `{doc.key}` |") == 1, doc.key


def test_explain_prints_type_default_allowed_values_and_description(capsys):
    assert main(["config", "explain", "rollout.barrier"]) == 0
    out = capsys.readouterr().out
    assert "type:        str" in out
    assert 'default:     "none"' in out
    assert "allowed:     none | turn | batch" in out
    assert "training still overlaps" in out  # the description, wrapped


def test_explain_reads_bounds_optionals_and_entries_by_any_name():
    alpha = explain("rollout.alpha")
    assert "type:        int" in alpha and "allowed:     ≥ 0" in alpha and "default:     1" in alpha
    assert "int or null" in explain("cluster.num_cpus") and "> 0, ≤ 4096 | null" in explain("cluster.num_cpus")
    # domains.<name>.weight under any entry name; a default entry that differs says so
    assert find_key("domains.anything.weight") == find_key("domains.math.weight")
    assert "in the default entry domains.math: 2.0" in explain("domains.math.weight")
    section = explain("train.lora")
    assert "train.lora.rank" in section and "train.lora.target_modules" in section
    listing = explain()
    assert all(f"{name}.*" in listing for name in ("rollout", "train", "reward", "domains"))


def test_an_unknown_key_gets_one_hint_from_explain_and_from_the_loader(capsys):
    hint = unknown_key_hint(("rollout", "alhpa"))
    assert hint.startswith("did you mean alpha?") and "valid keys here:" in hint and "barrier" in hint
    with pytest.raises(ValueError) as info:
        explain("rollout.alhpa")
    assert hint in str(info.value)
    with pytest.raises(ConfigError) as loaded:
        load_config(None, ["rollout.alhpa=2"])
    assert hint in str(loaded.value)
    assert main(["config", "explain", "rollout.alhpa"]) == 2
    assert "did you mean alpha?" in capsys.readouterr().err
