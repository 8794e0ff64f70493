"""`load_tokenizer` gives what `AutoTokenizer.from_pretrained` gives: for the checkpoints it loads with the generic
`TokenizersBackend` class directly (the tiny model's: no torch import, what keeps `rollart data preview` fast) the
same class, and prompts rendered and tokenised byte for byte as a rollout's — on the gsm_tiny recipe's rows, with
the tiny model's ChatML template and with Qwen3's real Jinja template (tests/fixtures); every other checkpoint
goes through AutoTokenizer itself."""

from __future__ import annotations

import importlib.util
import json
import random
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import AutoTokenizer, TokenizersBackend

from rollart.envs.chat import ChatTokens
from rollart.models import build_tokenizer, load_tokenizer
from rollart.models.loading import GENERIC_TOKENIZER_MODEL_TYPES

ROOT = Path(__file__).parents[2]
QWEN3_TEMPLATE = (ROOT / "tests" / "fixtures" / "qwen3_chat_template.jinja").read_text()
SYSTEM = "Answer with the number in \\boxed{}."  # a system prompt, as a domain's `system_prompt` sets one


def recipe_questions(n: int) -> list[str]:
    """`n` questions as examples/gsm_tiny/make_data.py writes them."""
    spec = importlib.util.spec_from_file_location("gsm_make_data", ROOT / "examples" / "gsm_tiny" / "make_data.py")
    make_data = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_data)  # type: ignore[union-attr]
    rng = random.Random(0)
    return [make_data.problem(rng, 3, "+-")["question"] for _ in range(n)]


def checkpoint(tmp_path: Path, template: str | None = None, model_type: str = "qwen3", **tokenizer_extra) -> Path:
    """A tokenizer saved as the tiny model saves it, beside a config.json of `model_type`."""
    tok = build_tokenizer(1024)
    if template is not None:
        tok.chat_template = template
        tok.add_tokens(["<think>", "</think>"])
    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": model_type}))
    if tokenizer_extra:
        config = json.loads((tmp_path / "tokenizer_config.json").read_text())
        (tmp_path / "tokenizer_config.json").write_text(json.dumps({**config, **tokenizer_extra}))
    return tmp_path


def assert_same_prompts(path: Path, questions: list[str], **chat_kwargs) -> None:
    ours, auto = load_tokenizer(path), AutoTokenizer.from_pretrained(str(path), local_files_only=True)
    assert type(ours) is type(auto)
    a, b = ChatTokens(ours, SYSTEM, **chat_kwargs), ChatTokens(auto, SYSTEM, **chat_kwargs)
    assert (a.message_close, a.stop_token_ids) == (b.message_close, b.stop_token_ids)
    for q in questions:
        rendered = a.render([{"role": "user", "content": q}], generation_prompt=True)
        assert rendered == b.render([{"role": "user", "content": q}], generation_prompt=True)
        assert a.initial(q) == b.initial(q) == auto.encode(rendered, add_special_tokens=False)
        assert ours.decode(a.initial(q)) == rendered
    assert a.follow_up(questions[1], a.assistant_ids("\\boxed{3}")) == b.follow_up(questions[1], b.assistant_ids("\\boxed{3}"))


def test_the_tiny_models_tokenizer_renders_the_recipes_prompts_as_autotokenizer_does(tmp_path: Path) -> None:
    path = checkpoint(tmp_path)
    assert "<|im_start|>system\n" + SYSTEM in load_tokenizer(path).apply_chat_template(
        [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "x"}], tokenize=False)
    assert_same_prompts(path, recipe_questions(300))


@pytest.mark.parametrize("thinking", [None, False, True])
def test_qwen3s_template_renders_as_autotokenizer_does(tmp_path: Path, thinking: bool | None) -> None:
    assert_same_prompts(checkpoint(tmp_path, QWEN3_TEMPLATE), recipe_questions(100), thinking=thinking)


@pytest.mark.parametrize("model_type, extra", [("qwen2", {}),  # AutoTokenizer picks Qwen2Tokenizer for it
                                               ("qwen3", {"auto_map": {"AutoTokenizer": ["x.Tok", None]}}),
                                               ("qwen3", {"tokenizer_class": "Qwen2Tokenizer"})])
def test_any_other_checkpoint_is_loaded_by_autotokenizer(tmp_path: Path, model_type: str, extra: dict,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    path = checkpoint(tmp_path, model_type=model_type, **extra)
    expected = type(AutoTokenizer.from_pretrained(str(path), local_files_only=True))
    calls, original = [], AutoTokenizer.from_pretrained
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", lambda *a, **k: calls.append(a) or original(*a, **k))
    assert type(load_tokenizer(path)) is expected and calls == [(str(path),)]


def test_the_generic_model_types_are_those_autotokenizer_loads_generically(tmp_path: Path) -> None:
    for model_type in GENERIC_TOKENIZER_MODEL_TYPES:  # a transformers upgrade that changes its choice fails here
        path = checkpoint(tmp_path / model_type, model_type=model_type)
        assert type(AutoTokenizer.from_pretrained(str(path), local_files_only=True)) is TokenizersBackend


def test_loading_the_tiny_models_tokenizer_does_not_import_torch(tmp_path: Path) -> None:
    path = checkpoint(tmp_path)
    code = ("import sys; from rollart.models import load_tokenizer; load_tokenizer(sys.argv[1]); "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    out = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr[-2000:]
