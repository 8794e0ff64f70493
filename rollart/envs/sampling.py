"""Sampling parameters of a domain's generations, from the run config.

In: the `RunConfig`, a domain name, the split and the stop token ids of the chat template. Out: the
`SamplingParams` every turn of that domain's episodes uses: `max_new_tokens` from the domain, stop on
the end-of-message/eos tokens, temperature/top-p/top-k from `rollout` for training episodes and
`eval.temperature` for validation ones, unless the task names its own (`Task.temperature`: pass@k's samples).
Callers may override any field (`dataclasses.replace`).
"""

from __future__ import annotations

from rollart.config import RunConfig
from rollart.types import SamplingParams, Split


def domain_sampling(cfg: RunConfig, domain: str, stop_token_ids: tuple[int, ...], split: Split = "train",
                    temperature: float | None = None) -> SamplingParams:
    if domain not in cfg.domains:
        raise KeyError(f"domain {domain!r} is not configured (domains: {sorted(cfg.domains)})")
    domain_cfg, rollout = cfg.domains[domain], cfg.rollout
    if temperature is None:
        temperature = cfg.eval.temperature if split == "val" else rollout.temperature
    return SamplingParams(
        temperature=temperature,
        top_p=rollout.top_p,
        top_k=rollout.top_k,
        max_new_tokens=domain_cfg.max_new_tokens,
        stop_token_ids=tuple(stop_token_ids),
    )
