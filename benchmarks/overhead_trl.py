"""The TRL arm of `rollart bench overhead`: the same single-turn math job through TRL's `GRPOTrainer`.

In: a `RunConfig` of the math-only job (its model path the shared warm-started base), the work directory.
Out: `run_trl(cfg, out_dir)` → the RL-loop wall time (`trainer.train()`), this process's CPU seconds over
it, the prompts' token check, and the trained model saved to `out_dir` (a Hugging Face checkpoint rollart's
evaluation scores like its own).

Matched to rollart's arm: the warm-started model and its tokenizer; the problems, in the order rollart's
scheduler draws their groups (seed `run seed × 1,000,003 + sequence`, the math env's own reset); the prompt
ids — the chat template's rendering of the env's observation, checked token for token against rollart's
`ChatTokens.initial` for every prompt (a mismatch raises); groups of `rollout.group_size`, batches of
`rollout.batch_size`, `train.steps` optimizer steps; sampling (temperature, top-p, top-k, `max_new_tokens`,
the same stop ids); the reward (`rollart.reward.math_reward.verify_answer`, math-verify, on the response);
GRPO with group-normalised advantages (std), per-sequence token-mean aggregation (TRL's `grpo` loss = rollart's
`seq_mean`), clip 0.2/0.28, no KL, AdamW at `train.lr` with no weight decay, a constant schedule, gradient
clipping at `train.grad_clip`, float32 on CPU, activation checkpointing as `train.activation_checkpointing` (off:
TRL's own default is on).
Not matched (the benchmark's notes say so): TRL is synchronous and on-policy (generate, then train, one
process); rollart trains batch n while rollout of n + 1 goes on (α = 1), so its samples may be one version
stale, corrected by truncated importance weights against the behaviour log-probs its engine recorded. TRL
generates with `transformers.generate` (padded batch of 36) in the trainer's process; rollart with its
own engine in another process. Thread counts: TRL's process uses torch's default (every core); rollart's
parts use their configured threads.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from rollart.config import RunConfig


def problems(cfg: RunConfig, domain: str, count: int) -> list[dict[str, Any]]:
    """The first `count` problems rollart's scheduler gives `domain` (one per group), as TRL rows: the
    observation as a chat prompt and the reference answer."""
    from rollart.envs.domains.math_env import MathEnv
    from rollart.envs.seeds import episode_seed
    from rollart.types import Task

    env = MathEnv(**cfg.domains[domain].options)
    rows = []
    for seq in range(count):
        seed = cfg.seed * 1_000_003 + seq  # the scheduler's group seeds of a non-dataset domain
        task = Task(f"g{seq:06d}/0", domain, cfg.domains[domain].env, seed, f"g{seq:06d}")
        observation, info = env.reset(episode_seed(task))
        rows.append({"prompt": [{"role": "user", "content": observation}],
                     "answer": str(info["reference"]["answer"])})
    return rows


def math_reward(completions: list[Any], answer: list[str], **_: Any) -> list[float]:
    """TRL's reward signature: rollart's `math` check of each completion against its row's answer."""
    from rollart.reward.math_reward import verify_answer

    texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
    return [1.0 if verify_answer(gold, text, 5)["correct"] else 0.0 for gold, text in zip(answer, texts)]


def run_trl(cfg: RunConfig, out_dir: Path, domain: str = "math") -> dict[str, Any]:
    import psutil
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    try:
        from trl import GRPOConfig, GRPOTrainer
    except ImportError as exc:
        raise RuntimeError(f"rollart bench overhead runs TRL's GRPOTrainer beside rollart: install it with "
                           f"`pip install trl==1.16.0` (the dev extra has it) — {exc}") from exc

    from rollart.envs.chat import ChatTokens
    from rollart.models import load_tokenizer

    base = Path(cfg.model.path)
    tokenizer = load_tokenizer(base)
    chat = ChatTokens(tokenizer)
    rollout, train, dom = cfg.rollout, cfg.train, cfg.domains[domain]
    groups_per_batch = rollout.batch_size // rollout.group_size
    rows = problems(cfg, domain, groups_per_batch * train.steps)
    for i, row in enumerate(rows):  # prompts token for token: TRL renders them itself, rollart with ChatTokens
        theirs = tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                               return_dict=True)["input_ids"]
        ours = chat.initial(row["prompt"][0]["content"])
        if list(theirs) != ours:
            raise AssertionError(f"prompt {i}: TRL's ids {list(theirs)[:20]}… differ from rollart's {ours[:20]}…")
    args = GRPOConfig(
        output_dir=str(out_dir / "trl-work"), per_device_train_batch_size=rollout.batch_size,
        num_generations=rollout.group_size, gradient_accumulation_steps=1, num_iterations=1,
        max_steps=train.steps, max_completion_length=dom.max_new_tokens, temperature=rollout.temperature,
        top_p=rollout.top_p, top_k=rollout.top_k, learning_rate=train.lr, lr_scheduler_type="constant",
        warmup_steps=0, weight_decay=train.weight_decay, max_grad_norm=train.grad_clip, beta=train.kl_coef,
        epsilon=train.clip_low, epsilon_high=train.clip_high, loss_type="grpo",
        scale_rewards="group" if train.normalize_std else "none", shuffle_dataset=False, use_vllm=False,
        use_cpu=True, bf16=False, fp16=False, seed=cfg.seed, logging_steps=max(1, train.steps // 10),
        save_strategy="no", report_to=[], disable_tqdm=True, log_completions=False,
        gradient_checkpointing=train.activation_checkpointing,  # (TRL's default is on; rollart's is off)
        generation_kwargs={"eos_token_id": list(chat.stop_token_ids)},
    )
    torch.set_num_threads(os.cpu_count() or 1)  # torch's default, every core (said, not assumed)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    trainer = GRPOTrainer(model=model, reward_funcs=math_reward, args=args, train_dataset=Dataset.from_list(rows),
                          processing_class=tokenizer)
    me = psutil.Process(os.getpid())
    cpu0, t0 = me.cpu_times(), time.perf_counter()
    trainer.train()
    wall = time.perf_counter() - t0
    cpu1 = me.cpu_times()
    out = out_dir / "trl-model"
    trainer.save_model(str(out))
    tokenizer.save_pretrained(str(out))
    rewards = [h["reward"] for h in trainer.state.log_history if "reward" in h]
    lengths = [h["completions/mean_length"] for h in trainer.state.log_history if "completions/mean_length" in h]
    return {"rl_wall_s": wall, "cpu_s": (cpu1.user + cpu1.system) - (cpu0.user + cpu0.system),
            "torch_threads": torch.get_num_threads(), "prompts_checked": len(rows), "model": out,
            "train_reward_first": rewards[0] if rewards else None, "train_reward_last": rewards[-1] if rewards else None,
            "completion_tokens": round(sum(lengths) / len(lengths), 2) if lengths else None}
