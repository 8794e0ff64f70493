"""Dataset domains (`env: dataset`): every file format reads the same rows; column-map and file errors name the
file, row and column; filters drop and count; the holdout is fixed; rows are shuffled per epoch with no repeat;
a row becomes an episode whose reference the rewards read; a tool-use episode seeded by a row."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rollart.config import DatasetConfig, DomainConfig, DomainRewardConfig, RunConfig
from rollart.envs.chat import ChatTokens
from rollart.envs.dataset import DataError, DatasetEnv, load_table, open_dataset_domain
from rollart.envs.dataset.rows import final_answer
from rollart.envs.expert import expert_action
from rollart.envs.seeds import VAL_OFFSET
from rollart.models import build_tokenizer

ROWS = [{"question": f"Ana has {i} apples and gets 1 more. How many apples?", "answer": f"{i} + 1 = {i + 1}\n#### {i + 1}",
         "level": i % 3} for i in range(40)]
COLUMNS = {"prompt": "question", "answer": "answer", "level": "level"}


@pytest.fixture(scope="module")
def chat() -> ChatTokens:
    return ChatTokens(build_tokenizer())


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def domain(train: str, validation: str = "", *, fn: str = "math", **data) -> DomainConfig:
    return DomainConfig(env="dataset", reward=DomainRewardConfig(fn=fn), max_new_tokens=16, max_total_tokens=256,
                        data=DatasetConfig(train=train, validation=validation, columns=data.pop("columns", COLUMNS),
                                           **data))


def test_every_format_reads_the_same_rows(tmp_path: Path) -> None:
    import datasets

    table = pa.Table.from_pylist(ROWS)
    files = {"jsonl": write_jsonl(tmp_path / "rows.jsonl", ROWS), "parquet": tmp_path / "rows.parquet",
             "csv": tmp_path / "rows.csv", "arrow": tmp_path / "rows.arrow", "feather": tmp_path / "ipc.arrow",
             "disk": tmp_path / "saved", "dict": tmp_path / "saved_dict"}
    pq.write_table(table, files["parquet"])
    datasets.Dataset.from_list(ROWS).to_csv(str(files["csv"]), index=False)
    with pa.OSFile(str(files["arrow"]), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)  # the stream format datasets writes
    with pa.OSFile(str(files["feather"]), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)  # an Arrow IPC file, as pyarrow and feather write it
    datasets.Dataset.from_list(ROWS).save_to_disk(str(files["disk"]))
    datasets.DatasetDict({"train": datasets.Dataset.from_list(ROWS)}).save_to_disk(str(files["dict"]))
    for kind, path in files.items():
        loaded = load_table(str(path), "auto", COLUMNS)
        assert len(loaded) == len(ROWS), kind
        assert loaded.dataset[7] == {"question": ROWS[7]["question"], "answer": ROWS[7]["answer"], "level": 7 % 3}, kind
        assert loaded.dataset.cache_files or kind in ("feather",), f"{kind}: not memory-mapped from a file"


def test_file_and_column_errors_name_the_file_row_and_column(tmp_path: Path) -> None:
    good = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    with pytest.raises(DataError, match=r"rows.jsonl: no column 'prompt_text' \(data.columns maps prompt: prompt_text\); "
                                        r"its columns are \['question', 'answer', 'level'\]"):
        load_table(str(good), "auto", {"prompt": "prompt_text"})
    with pytest.raises(DataError, match="missing.jsonl: no such file or directory"):
        load_table(str(tmp_path / "missing.jsonl"), "auto", COLUMNS)
    (tmp_path / "rows.txt").write_text("hello")
    with pytest.raises(DataError, match=r"rows.txt: unknown format '.txt'; name a file ending in .jsonl"):
        load_table(str(tmp_path / "rows.txt"), "auto", COLUMNS)
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(ROWS[0]) + "\n" + json.dumps(ROWS[1]) + "\n" + '{"question": "x", "answer": \n')
    with pytest.raises(DataError, match=r"bad.jsonl row 2 \(line 3\): not valid JSON"):
        load_table(str(bad), "auto", COLUMNS)
    (tmp_path / "empty.parquet").write_bytes(b"")
    pq.write_table(pa.Table.from_pylist(ROWS).slice(0, 0), tmp_path / "empty.parquet")
    with pytest.raises(DataError, match=r"empty.parquet: no rows \(an empty split\)"):
        load_table(str(tmp_path / "empty.parquet"), "auto", COLUMNS)
    pq.write_table(pa.table({"question": ["q"], "answer": [b"\x00"]}), tmp_path / "binary.parquet")
    with pytest.raises(DataError, match="column 'answer' has type .*binary.* which a row cannot carry"):
        load_table(str(tmp_path / "binary.parquet"), "auto", {"prompt": "question", "answer": "answer"})


def test_a_hub_id_that_cannot_be_loaded_offline_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(DataError, match=r"hub dataset 'no-such-org/no-such-set' split 'train' cannot be loaded "
                                        r"\(HF_HUB_OFFLINE set: only datasets already in the cache"):
        load_table("no-such-org/no-such-set", "auto", COLUMNS)


def test_config_refuses_what_it_can_see(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="map exactly one of `prompt`"):
        DatasetConfig(train="x.jsonl", columns={"answer": "a"})
    with pytest.raises(ValueError, match=r"prompt_format: fields \['hint'\] are not mapped roles"):
        DatasetConfig(train="x.jsonl", columns={"prompt": "q"}, prompt_format="{prompt} {hint}")
    with pytest.raises(ValueError, match="reward fn 'math' reads the row's 'answer'"):
        domain("x.jsonl", columns={"prompt": "question"})
    with pytest.raises(ValueError, match="`env: dataset` and `data` go together"):
        DomainConfig(env="dataset")


def test_preflight_names_the_domain_key_and_the_missing_column(tmp_path: Path) -> None:
    from rollart.config.loader import ConfigError
    from rollart.job.preflight import check_config

    train = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    cfg = RunConfig(run_dir=str(tmp_path / "run"),
                    domains={"gsm": domain(str(train), columns={"prompt": "question", "answer": "solution"})})
    with pytest.raises(ConfigError, match=r"domains.gsm.data.train: .*rows.jsonl: no column 'solution'"):
        check_config(cfg)
    check_config(cfg, local=False)  # rollart sim: no rows needed


def test_filters_drop_and_count_with_the_row_named(tmp_path: Path, chat: ChatTokens) -> None:
    rows = [dict(r) for r in ROWS]
    rows[3]["answer"] = ""
    rows[5]["answer"] = None
    rows[8]["answer"] = "it is 9 ####  "
    rows[11]["question"] = "word " * 400  # past the 240-token prompt budget (256 - 16)
    train = write_jsonl(tmp_path / "rows.jsonl", rows)
    val = write_jsonl(tmp_path / "val.jsonl", ROWS[:5])
    d = open_dataset_domain("gsm", domain(str(train), str(val)), chat, seed=0)
    drops = d.rows.train.drops
    assert drops.counts == {"with column 'answer' (answer) empty": 2,
                            "with nothing after '####' in column 'answer' (answer)": 1,
                            "with a first prompt longer than 240 tokens": 1}
    assert drops.examples["with column 'answer' (answer) empty"] == [f"{train} row 3 column 'answer'",
                                                                     f"{train} row 5 column 'answer'"]
    assert drops.examples["with a first prompt longer than 240 tokens"][0].startswith(f"{train} row 11 column 'question': ")
    assert len(d.rows.train) == 36 and len(d.rows.validation) == 5
    assert "36 training rows" in d.report() and "2 with column 'answer' (answer) empty" in d.report()
    every_row = {d.rows.train.row(i).index for i in range(len(d.rows.train))}
    assert not every_row & {3, 5, 8, 11}


def test_the_length_filter_is_exact_where_it_tokenises(tmp_path: Path, chat: ChatTokens) -> None:
    """Rows just over and just under the budget: the byte bound passes none, the exact count decides."""
    rows = [{"question": "ab " * n, "answer": "1"} for n in range(20, 60)]
    train = write_jsonl(tmp_path / "rows.jsonl", rows)
    cfg = domain(str(train), columns={"prompt": "question", "answer": "answer"}, max_prompt_tokens=100, holdout=0.3)
    d = open_dataset_domain("x", cfg, chat, seed=0)
    lengths = chat.count([r["question"] for r in rows])
    kept = {r.index for r in (d.rows.train.row(i) for i in range(len(d.rows.train)))} | {
        r.index for r in (d.rows.validation.row(i) for i in range(len(d.rows.validation)))}
    assert kept == {i for i, n in enumerate(lengths) if n <= 100} and 0 < len(kept) < len(rows)


def test_no_row_left_is_an_error_naming_the_domain(tmp_path: Path, chat: ChatTokens) -> None:
    rows = [{"question": "q", "answer": ""}] * 4
    train = write_jsonl(tmp_path / "rows.jsonl", rows)
    with pytest.raises(DataError, match=r"domain 'gsm': no train row is left after the filters \(\d read from .*"
                                        r"dropped: \d with column 'answer' \(answer\) empty"):
        open_dataset_domain("gsm", domain(str(train), columns={"prompt": "question", "answer": "answer"}), chat, 0)


def test_the_holdout_is_fixed_disjoint_and_said(tmp_path: Path, chat: ChatTokens) -> None:
    train = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    a = open_dataset_domain("gsm", domain(str(train), holdout=0.1), chat, seed=0)
    b = open_dataset_domain("gsm", domain(str(train), holdout=0.1), chat, seed=7)  # another run seed
    held = [a.rows.validation.row(i).index for i in range(len(a.rows.validation))]
    assert held == [b.rows.validation.row(i).index for i in range(len(b.rows.validation))] and len(held) == 4
    trained = {a.rows.train.row(i).index for i in range(len(a.rows.train))}
    assert not trained & set(held) and len(trained) == 36
    assert "no validation file: 4 of 40 train rows (10%, holdout_seed 0) held out for validation" in a.report()
    c = open_dataset_domain("gsm", domain(str(train), holdout=0.1, holdout_seed=1), chat, seed=0)
    assert held != [c.rows.validation.row(i).index for i in range(len(c.rows.validation))]


def test_rows_are_shuffled_per_epoch_with_the_run_seed_and_never_repeat_within_one(tmp_path: Path,
                                                                                   chat: ChatTokens) -> None:
    train = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    val = write_jsonl(tmp_path / "val.jsonl", ROWS[:3])
    d = open_dataset_domain("gsm", domain(str(train), str(val)), chat, seed=0)
    n = len(d.rows.train)
    draws = [d.rows.draw(k) for k in range(3 * n)]
    for epoch in range(3):
        rows = [r.index for r, e in draws[epoch * n : (epoch + 1) * n]]
        assert sorted(rows) == list(range(n)) and {e for _, e in draws[epoch * n : (epoch + 1) * n]} == {epoch}
    assert [r.index for r, _ in draws[:n]] != list(range(n))  # shuffled
    assert [r.index for r, _ in draws[:n]] != [r.index for r, _ in draws[n : 2 * n]]  # a new order each epoch
    again = open_dataset_domain("gsm", domain(str(train), str(val)), chat, seed=0)
    assert [again.rows.draw(k)[0].index for k in range(n + 5)] == [r.index for r, _ in draws[: n + 5]]
    other = open_dataset_domain("gsm", domain(str(train), str(val)), chat, seed=1)
    assert [other.rows.draw(k)[0].index for k in range(n)] != [r.index for r, _ in draws[:n]]


def test_a_row_becomes_an_episode_with_the_reference_the_rewards_read(tmp_path: Path, chat: ChatTokens) -> None:
    train = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    val = write_jsonl(tmp_path / "val.jsonl", ROWS[:3])
    d = open_dataset_domain("gsm", domain(str(train), str(val), prompt_format="{prompt} Answer in \\boxed{{}}."),
                            chat, seed=0)
    env = d.make_env()
    assert isinstance(env, DatasetEnv)
    obs, info = env.reset(5)  # the domain's sixth group
    row, epoch = d.rows.draw(5)
    assert obs == f"{ROWS[row.index]['question']} Answer in \\boxed{{}}." and epoch == 0
    ref = info["reference"]
    assert ref["answer"] == str(row.index + 1) and ref["solution"] == ROWS[row.index]["answer"]
    # every column by its name, the mapped roles by theirs (what a reward function may ask for)
    assert ref["row"] == {"question": ROWS[row.index]["question"], "prompt": ROWS[row.index]["question"],
                          "answer": ROWS[row.index]["answer"], "level": row.index % 3}
    assert ref["source"] == f"{train} row {row.index}" and info["metrics"] == {"row": row.index, "epoch": 0}
    assert expert_action(env) == f"\\boxed{{{row.index + 1}}}"
    assert env.step("\\boxed{3}")[2] is True  # one answer ends the episode
    obs, info = env.reset(VAL_OFFSET + 2)  # validation row 2
    assert obs.startswith(ROWS[2]["question"]) and "epoch" not in info["metrics"]
    json.dumps(info["reference"])  # what a remote reward service receives


def test_a_messages_column_is_the_first_prompt(tmp_path: Path, chat: ChatTokens) -> None:
    rows = [{"chat": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Say {i}."}],
             "answer": str(i)} for i in range(6)]
    train = write_jsonl(tmp_path / "chats.jsonl", rows)
    d = open_dataset_domain("chat", domain(str(train), columns={"messages": "chat", "answer": "answer"}), chat, 0)
    obs, info = d.make_env().reset(0)
    assert info["prompt_messages"][0] == {"role": "system", "content": "Be brief."} and obs.startswith("Say ")
    ids = chat.initial_messages(info["prompt_messages"])
    assert chat.tokenizer.decode(ids).startswith("<|im_start|>system\nBe brief.<|im_end|>")


def test_a_row_seeds_a_multi_turn_tool_use_episode(tmp_path: Path, chat: ChatTokens) -> None:
    rows = [{"question": "What is the capital of the country Ana lives in?", "answer": "Lima",
             "tools": [{"name": "country_of", "description": "the country a person lives in", "results": {"Ana": "Peru"}},
                       {"name": "capital_of", "description": "a country's capital", "results": {"Peru": "Lima"}}]}] * 4
    train = write_jsonl(tmp_path / "tools.jsonl", rows)
    cfg = domain(str(train), fn="exact", episode="tool_lookup", columns={"prompt": "question", "answer": "answer",
                                                                         "tools": "tools"})
    env = open_dataset_domain("tools", cfg, chat, 0).make_env()
    obs, info = env.reset(0)
    assert "- country_of(argument): the country a person lives in" in obs and info["reference"]["answer"] == "Lima"
    assert "Lima" not in obs  # the answer stays hidden
    actions, observations = [], []
    for _ in range(3):
        actions.append(expert_action(env))
        o, _, done, _, _ = env.step(actions[-1])
        observations.append(o)
        if done:
            break
    assert actions == ["\\boxed{country_of(Ana)}", "\\boxed{capital_of(Peru)}", "\\boxed{Lima}"] and done
    assert observations[:2] == ["country_of(Ana) = Peru", "capital_of(Peru) = Lima"]
    assert env.step("no box")[4]["format_error"]


def test_final_answer_reads_gsm8k() -> None:
    assert final_answer("She has 3 + 4 = 7.\n#### 7") == "7" and final_answer(" 42 ") == "42"
    assert final_answer(12) == "12" and final_answer("a #### b #### 1,000") == "1,000"


def test_an_env_worker_plays_dataset_rows_under_the_domains_system_prompt(tmp_path: Path, tiny_model_path) -> None:
    """The env plane end to end without Ray: EnvWorker → EnvManager → DatasetEnv, with an LLM that answers
    the row's answer; the first prompt is the system prompt and the row, the trajectory carries the row."""
    import asyncio

    from rollart.config.loader import load_config
    from rollart.envs import EnvWorker
    from rollart.models import load_tokenizer
    from rollart.types import GenerationRequest, GenerationResult, Status, Task

    tok = load_tokenizer(tiny_model_path)
    train = write_jsonl(tmp_path / "rows.jsonl", ROWS)
    cfg = load_config(None, [f"model.path={tiny_model_path}", "domains.frozenlake=null", "domains.math=null",
                             "domains.gsm.env=dataset", f"domains.gsm.data.train={train}",
                             "domains.gsm.data.columns.prompt=question", "domains.gsm.data.columns.answer=answer",
                             "domains.gsm.reward=math", "domains.gsm.max_turns=1",
                             "domains.gsm.system_prompt=Answer in \\boxed{}."])

    class Answers:
        prompts: list[tuple[int, ...]] = []

        async def generate(self, request: GenerationRequest) -> GenerationResult:
            self.prompts.append(request.prompt_token_ids)
            text = tok.decode(list(request.prompt_token_ids))
            n = int(text.split("Ana has ")[1].split(" ")[0]) + 1
            ids = tok.encode(f"\\boxed{{{n}}}", add_special_tokens=False) + [tok.convert_tokens_to_ids("<|im_end|>")]
            return GenerationResult(request.request_id, request.trajectory_id, tuple(ids), (0.0,) * len(ids),
                                    (0,) * len(ids), "stop", len(request.prompt_token_ids))

        async def abort(self, trajectory_id: str) -> None:
            pass

    llm = Answers()
    worker = EnvWorker(cfg, llm, model_path=tiny_model_path)

    async def play():
        return await asyncio.gather(*(worker.run(Task(f"t{k}", "gsm", "dataset", k, f"g{k}"), 0) for k in range(3)))

    trajectories = asyncio.run(play())
    rows = open_dataset_domain("gsm", cfg.domains["gsm"], worker.chats["gsm"], cfg.seed).rows
    for k, traj in enumerate(trajectories):
        row, _ = rows.draw(k)
        assert traj.status is Status.COMPLETED and traj.metrics["data/epoch"] == 0 and traj.metrics["data/row"] == row.index
        assert traj.reference["answer"] == str(row.index + 1) and traj.turns[0].action == f"\\boxed{{{row.index + 1}}}"
        assert tok.decode(list(traj.turns[0].prompt_token_ids)) == (
            "<|im_start|>system\nAnswer in \\boxed{}.<|im_end|>\n<|im_start|>user\n"
            f"{ROWS[row.index]['question']}<|im_end|>\n<|im_start|>assistant\n")


def test_a_prompt_format_may_index_a_list_column(tmp_path: Path, chat: ChatTokens) -> None:
    """MBPP-style rows: the first of the hidden tests shown in the prompt (`{tests[0]}`), all of them scored."""
    rows = [{"text": f"Write a function f{i} that adds {i}.", "test_list": [f"assert f{i}(1) == {i + 1}",
                                                                          f"assert f{i}(2) == {i + 2}"]} for i in range(8)]
    train = write_jsonl(tmp_path / "mbpp.jsonl", rows)
    cfg = domain(str(train), fn="code", columns={"prompt": "text", "tests": "test_list"},
                 prompt_format="{prompt} It must pass: {tests[0]}", holdout=0.25)
    d = open_dataset_domain("code", cfg, chat, seed=0)
    obs, info = d.make_env().reset(0)
    row = d.rows.draw(0)[0]
    assert obs == f"Write a function f{row.index} that adds {row.index}. It must pass: assert f{row.index}(1) == {row.index + 1}"
    assert info["reference"]["tests"] == rows[row.index]["test_list"] and info["reference"]["language"] == "python"
    with pytest.raises(ValueError, match=r"fields \['hint'\] are not mapped roles"):
        DatasetConfig(train="x.jsonl", columns={"prompt": "q"}, prompt_format="{prompt} {hint[0]}")


def test_preflight_refuses_a_dataset_with_no_row_left_and_a_thinking_switch_the_template_lacks(tmp_path: Path) -> None:
    from rollart.config.loader import ConfigError
    from rollart.job.preflight import check_config

    train = write_jsonl(tmp_path / "rows.jsonl", [{"question": "word " * 400, "answer": "1", "level": 0}] * 4)
    cfg = RunConfig(run_dir=str(tmp_path / "run"), domains={"gsm": domain(str(train))})
    with pytest.raises(ConfigError, match=r"domains.gsm.data: domain 'gsm': no train row is left after the filters "
                                          r"\(4 read .* dropped: 3 with a first prompt longer than 240 tokens"):
        check_config(cfg)
    fine = write_jsonl(tmp_path / "fine.jsonl", ROWS)
    thinking = domain(str(fine)).model_copy(update={"thinking": False})
    with pytest.raises(ConfigError, match=r"domains.gsm.thinking: thinking=False: this model's chat template has no "
                                          r"thinking switch"):
        check_config(RunConfig(run_dir=str(tmp_path / "run"), domains={"gsm": thinking}))
