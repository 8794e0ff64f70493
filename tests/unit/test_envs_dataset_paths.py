"""verl's data as it is: a column map may name a dotted path into nested columns (`reward_model.ground_truth`), an
exact column name winning; `data.format: verl` maps its own columns; every other column of the row travels with it
by name to the reward; a path to a field no row has is refused before anything starts, naming the fields there are."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from verl_data import verl_rows, write_verl_parquet

from rollart.config import DatasetConfig, DomainConfig, DomainRewardConfig
from rollart.envs.chat import ChatTokens
from rollart.envs.dataset import DataError, load_table, open_dataset_domain
from rollart.envs.dataset.columns import arrow_values, row_value, split_path
from rollart.envs.seeds import VAL_OFFSET
from rollart.models import build_tokenizer


@pytest.fixture(scope="module")
def chat() -> ChatTokens:
    return ChatTokens(build_tokenizer())


def verl_domain(train: Path, validation: Path | None = None, **data) -> DomainConfig:
    return DomainConfig(env="dataset", reward=DomainRewardConfig(fn="exact"), max_new_tokens=16, max_total_tokens=512,
                        data=DatasetConfig(train=str(train), validation=str(validation or ""), format="verl", **data))


def test_verl_format_maps_its_own_columns_and_the_row_carries_the_rest(tmp_path: Path, chat: ChatTokens) -> None:
    train = write_verl_parquet(tmp_path / "train.parquet", 20)
    val = write_verl_parquet(tmp_path / "test.parquet", 5, "test", start=100)
    dom = verl_domain(train, val, columns={"index": "extra_info.index"})
    assert dom.data.columns == {"messages": "prompt", "answer": "reward_model.ground_truth", "index": "extra_info.index"}
    opened = open_dataset_domain("gsm", dom, chat, seed=0)
    env = opened.make_env()
    obs, info = env.reset(VAL_OFFSET + 2)  # validation row 2: index 102
    expected = verl_rows(5, "test", start=100)[2]
    assert obs == expected["prompt"][0]["content"] and info["prompt_messages"] == expected["prompt"]
    ref = info["reference"]
    assert ref["answer"] == expected["reward_model"]["ground_truth"]  # the nested ground truth is the answer
    row = ref["row"]
    assert row["index"] == 102 and row["answer"] == expected["reward_model"]["ground_truth"]
    for column in ("data_source", "prompt", "ability", "reward_model", "extra_info"):  # by their own names
        assert row[column] == expected[column], column
    json.dumps(ref)  # what a remote reward service receives
    # the user's map adds to the layout's; a prompt role of its own replaces the chat
    assert verl_domain(train, columns={"prompt": "extra_info.question"}).data.columns == {
        "answer": "reward_model.ground_truth", "prompt": "extra_info.question"}


def test_a_path_is_checked_against_the_files_types_before_anything_reads_a_row(tmp_path: Path) -> None:
    train = write_verl_parquet(tmp_path / "train.parquet", 4)
    with pytest.raises(DataError, match=r"'reward_model' has no field 'truth' \(its fields: style, ground_truth\)"):
        load_table(str(train), "auto", {"messages": "prompt", "answer": "reward_model.truth"})
    with pytest.raises(DataError, match=r"'ability' holds a string, not an object with field 'x'"):
        load_table(str(train), "auto", {"messages": "prompt", "answer": "ability.x"})
    with pytest.raises(DataError, match=r"no column 'rm.ground_truth' \(data.columns maps answer: rm.ground_truth\)"):
        load_table(str(train), "verl", {"messages": "prompt", "answer": "rm.ground_truth"})


def test_an_exact_column_name_wins_over_a_path_and_rows_without_the_field_are_dropped(tmp_path: Path,
                                                                                         chat: ChatTokens) -> None:
    rows = [{"question": f"q{i}", "reward_model.ground_truth": f"flat{i}",
             "reward_model": {"ground_truth": None if i % 4 == 0 else f"nested{i}"}} for i in range(12)]
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist(rows), str(path))
    assert split_path("reward_model.ground_truth", ["reward_model.ground_truth", "reward_model"]) == (
        "reward_model.ground_truth", ())
    assert split_path("reward_model.ground_truth", ["reward_model"]) == ("reward_model", ("ground_truth",))
    table = pa.Table.from_pylist(rows)
    assert arrow_values(table, "reward_model.ground_truth").to_pylist() == [f"flat{i}" for i in range(12)]
    assert row_value({"reward_model": {"ground_truth": "x"}}, "reward_model.ground_truth") == "x"
    # a nested path whose field is null in some rows: those rows are dropped and counted, named by row
    nested = [{"question": r["question"], "rm": r["reward_model"]} for r in rows]
    pq.write_table(pa.Table.from_pylist(nested), str(path))
    dom = DomainConfig(env="dataset", reward=DomainRewardConfig(fn="exact"), max_new_tokens=16, max_total_tokens=256,
                       data=DatasetConfig(train=str(path), columns={"prompt": "question", "answer": "rm.ground_truth"},
                                          holdout=0.1))
    opened = open_dataset_domain("d", dom, chat, seed=0)
    drops = opened.rows.train.drops.counts | opened.rows.validation.drops.counts
    assert sum(drops.values()) == 3 and "with column 'rm.ground_truth' (answer) empty" in drops
    kept = [opened.rows.train.row(i).values["answer"] for i in range(len(opened.rows.train))]
    assert all(a.startswith("nested") for a in kept)


def test_a_path_into_json_objects_reads_each_rows_field(tmp_path: Path) -> None:
    import datasets

    rows = [{"q": f"q{i}", "meta": {"gold": str(i)} if i % 2 else {"other": [1, 2]}} for i in range(6)]
    features = datasets.Features({"q": datasets.Value("string"), "meta": datasets.Json()})
    saved = tmp_path / "saved"
    datasets.Dataset.from_list(rows, features=features).save_to_disk(str(saved))
    table = load_table(str(saved), "auto", {"prompt": "q", "answer": "meta.gold"})
    from rollart.envs.dataset.rows import _arrow

    assert arrow_values(_arrow(table.dataset), "meta.gold").to_pylist() == [None, "1", None, "3", None, "5"]
