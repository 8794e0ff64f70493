"""Built-in `judge` reward: a language model judges the final answer; score = P(yes) vs P(no).

In: a trajectory (question: `reference["question"]`, else the first observation; answer: the last action;
`reference["answer"]`, when present, is shown to the judge as the reference) and a local Hugging Face
checkpoint (`reward.judge_model`, empty = the run's model, the built-in tiny one by default).
Out: `RewardOutput(p_yes, details={"logp_yes", "logp_no"})` where, under the chat template,
    p_yes = exp(log P("yes" | prompt)) / (exp(log P("yes" | prompt)) + exp(log P("no" | prompt)))
with each log P the sum over the word's tokens (a byte-level BPE may split "yes" into several).

How it is served: on the `serverless` backend the judge runs inside each Ray Serve replica — the replica
is the inference engine (transformers, one forward pass per candidate word, model loaded once per replica
on first use). It uses transformers directly rather than the inference plane's engine: planes do not
import each other, and a judge needs scores of two fixed continuations, not sampling. With the built-in
tiny (randomly initialised) model the score is a mechanism check, not a meaningful judgement.
"""

from __future__ import annotations

import asyncio
import math
import threading
from pathlib import Path
from typing import Any

from rollart.reward.protocol import RewardOutput, final_action
from rollart.types import Trajectory

PROMPT = (
    "Question: {question}\n{reference}Answer: {answer}\n"
    "Is the answer correct? Reply with one word: yes or no."
)


class JudgeReward:
    def __init__(self, model_path: str | Path, dtype: str = "float32", num_threads: int = 1,
                 trust_remote_code: bool = False) -> None:
        self.model_path = Path(model_path)
        self.dtype, self.trust_remote_code = dtype, trust_remote_code
        self.num_threads = num_threads
        self._model: Any = None
        self._tok: Any = None
        self._lock = threading.Lock()  # one forward at a time per process; loading happens once

    def _load(self) -> None:
        from rollart.models import load_model, load_tokenizer

        import torch

        torch.set_num_threads(self.num_threads)
        self._tok = load_tokenizer(self.model_path, self.trust_remote_code)
        self._model = load_model(self.model_path, self.dtype, trust_remote_code=self.trust_remote_code).eval()

    def warm(self) -> None:
        """Load the model now (a replica does this before taking requests)."""
        with self._lock:
            if self._model is None:
                self._load()

    def _logp(self, prompt_ids: list[int], word: str) -> float:
        import torch

        word_ids = self._tok.encode(word, add_special_tokens=False)
        ids = torch.tensor([prompt_ids + word_ids])
        with torch.no_grad():
            logits = self._model(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1]
        logp = torch.log_softmax(logits.float(), dim=-1)
        return float(logp[torch.arange(len(word_ids)), torch.tensor(word_ids)].sum())

    def score_text(self, question: str, answer: str, reference: str = "") -> RewardOutput:
        with self._lock:
            if self._model is None:
                self._load()
            ref = f"Reference answer: {reference}\n" if reference else ""
            messages = [{"role": "user", "content": PROMPT.format(question=question, reference=ref, answer=answer)}]
            prompt_ids = self._tok.apply_chat_template(
                messages, tokenize=True, add_generation_prompt=True, return_dict=False
            )
            logp_yes, logp_no = self._logp(list(prompt_ids), "yes"), self._logp(list(prompt_ids), "no")
        top = max(logp_yes, logp_no)
        p_yes = math.exp(logp_yes - top) / (math.exp(logp_yes - top) + math.exp(logp_no - top))
        return RewardOutput(p_yes, details={"logp_yes": logp_yes, "logp_no": logp_no})

    async def __call__(self, trajectory: Trajectory) -> RewardOutput:
        ref = trajectory.reference
        question = str(ref.get("question") or (trajectory.turns[0].observation if trajectory.turns else ""))
        reference = str(ref.get("answer", "")) if ref.get("answer") is not None else ""
        return await asyncio.to_thread(self.score_text, question, final_action(trajectory), reference)
