"""`rollart data preview DOMAIN`: the first prompts exactly as a rollout sends them, the prompt-length
histogram, rows dropped and why (file, row, column); a domain that is not a dataset domain exits 2."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollart.cli import main


@pytest.fixture
def run_file(tmp_path: Path, tiny_model_path: Path) -> Path:
    rows = [{"question": f"Ana has {i} pens and gets 2 more. How many pens?", "answer": f"#### {i + 2}"} for i in range(30)]
    rows[4]["answer"] = ""
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run.yaml"
    run.write_text(f"""
model: {{path: {tiny_model_path}}}
run_dir: {tmp_path / 'run'}
domains:
  frozenlake: null
  gsm:
    env: dataset
    data: {{train: {tmp_path / 'train.jsonl'}, columns: {{prompt: question, answer: answer}},
            prompt_format: "{{prompt}} Put it in \\\\boxed{{{{}}}}."}}
    system_prompt: Be exact.
    reward: math
    max_turns: 1
""")
    return run


def test_preview_shows_prompts_as_the_model_sees_them_a_histogram_and_the_drops(run_file: Path, tmp_path: Path,
                                                                                 capsys) -> None:
    out_json = tmp_path / "preview.json"
    assert main(["data", "preview", "gsm", str(run_file), "--show", "2", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "<|im_start|>system\nBe exact.<|im_end|>\n<|im_start|>user\nAna has" in out
    assert "Put it in \\boxed{}.<|im_end|>\n<|im_start|>assistant\n" in out
    assert f"dropped from train: 1 rows with column 'answer' (answer) empty\n    {tmp_path / 'train.jsonl'} row 4 column 'answer'" in out
    assert "first-prompt tokens of 27 training rows (budget 2000)" in out and "█" in out
    data = json.loads(out_json.read_text())
    assert len(data["prompts"]) == 2 and len(data["lengths"]) == 27 and sum(c for _, _, c in data["histogram"]) == 27
    assert "no validation file: 2 of 30 train rows" in data["report"]


def test_preview_of_a_domain_that_is_not_a_dataset_exits_2(run_file: Path, capsys) -> None:
    assert main(["data", "preview", "math", str(run_file)]) == 2
    assert "'math' is not a dataset domain of this config (its dataset domains: ['gsm']" in capsys.readouterr().err


def test_preview_shows_what_a_row_holds_without_obeying_it(tmp_path: Path, tiny_model_path: Path, capsys) -> None:
    """The issue: `rollart data preview` printed dataset text raw — OSC 52 (writes the clipboard), window
    title and colour sequences reached the terminal; `rollart samples` escapes them."""
    escape = "\x1b]52;c;cm0gLXJmIH4=\x07\x1b]0;pwned\x07\x1b[31mred\x1b[0m\u202e"
    rows = [{"question": f"{escape} Ana has {i} pens. How many?", "answer": f"#### {i} {escape}"} for i in range(10)]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = tmp_path / "run.yaml"
    run.write_text(f"""
model: {{path: {tiny_model_path}}}
run_dir: {tmp_path / 'run'}
domains:
  frozenlake: null
  math: null
  gsm:
    env: dataset
    data: {{train: {tmp_path / 'train.jsonl'}, columns: {{prompt: question, answer: answer}}}}
    reward: math
    max_turns: 1
""")
    assert main(["data", "preview", "gsm", str(run), "--show", "2"]) == 0
    out = capsys.readouterr().out
    assert "\\x1b]52;c;cm0gLXJmIH4=\\x07" in out and "\\u202e" in out  # shown as escapes
    assert not any(c in out for c in "\x1b\x07\u202e")


def test_invalid_utf8_in_a_row_names_the_file_row_and_column(tmp_path: Path, tiny_model_path: Path, capsys) -> None:
    """The issue: a JSONL row with invalid UTF-8 ended `rollart data preview` with a pyarrow traceback (exit 1)."""
    good = "".join(json.dumps({"question": f"Ana has {i} pens.", "answer": f"#### {i}"}) + "\n" for i in range(6))
    (tmp_path / "train.jsonl").write_bytes(good.encode() + b'{"question": "caf\xe9 \xff", "answer": "#### 1"}\n')
    run = tmp_path / "run.yaml"
    run.write_text(f"""
model: {{path: {tiny_model_path}}}
run_dir: {tmp_path / 'run'}
domains:
  frozenlake: null
  math: null
  gsm:
    env: dataset
    data: {{train: {tmp_path / 'train.jsonl'}, columns: {{prompt: question, answer: answer}}}}
    reward: math
    max_turns: 1
""")
    assert main(["data", "preview", "gsm", str(run)]) == 2
    err = capsys.readouterr().err
    assert f"{tmp_path / 'train.jsonl'} row 6 column 'question': not valid UTF-8 text" in err
