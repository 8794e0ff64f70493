"""`Trainer`: one data-parallel rank's model, optimizer and steps (plain Python; the Ray actor wraps it).

In: the `RunConfig` (model, seed, `train.*`), an `Objective` (the policy loss, injected), this rank and
the world size (the process group must already be initialised when world_size > 1), a torch device.
Out: `train_step(batch)` and `sft_step(samples)` return metrics; `published_weights()` gives the weights to
publish (gathered tensor by tensor), `weight_specs()` / `row_chunks()` this rank's rows of them as it holds
them (`weights.transport=collective`: no gather); `save(dir, extra)` / `load(dir)` write and read checkpoints
(persist.py, checkpoint.py: JSON + safetensors, never a pickle; any world size reads them); `export(dir)` writes the
Hugging Face checkpoint alone.

This is the algorithm, one code path whatever `train.strategy`: the strategy (strategy.py, a member) wraps
or shards the model, says when gradients synchronise and gives tensors back in full; the policy module
(policy.py) turns a micro-batch into the log-probabilities of its model tokens (hidden states against the
LM head in chunks); packing.py lays the micro-batches out (padded or packed).

One RL step (`train_step`) trains one batch in the optimizer steps the objective plans
(`train.mini_batches` × `train.epochs`, each a mini-batch of the batch's samples). With more than one, the
proximal log-probabilities are computed once, with the weights before the first step, and passed to every
step (decoupled PPO). Each step shards its mini-batch over ranks; each rank runs the same number of
micro-batches of at most `train.micro_batch_tokens` tokens (packing.plan), accumulating gradients, every
micro-batch loss weighted by the *mini-batch's* token/sequence totals and multiplied by the world size
(both strategies average gradients over ranks), so N ranks compute the gradient of the same loss as one rank
would; then gradient clipping to `train.grad_clip` and one AdamW step. After the batch: one LR-scheduler
step, version + 1. An SFT step is one such optimizer step on the whole batch. Statistics are summed over
steps and micro-batches and all-reduced, so every rank returns the same metrics.

Precision (`train.precision`): parameters, gradients and AdamW state are float32 (the master weights);
`bf16` computes the forward and backward in bfloat16; log-probabilities, ratios and the loss are float32.

With `train.lora` the model is a PEFT model: the base weights are frozen, the optimizers update only the
adapters, `published_weights()` is the adapter alone (a `LoraAdapter`) and checkpoints are PEFT adapter
directories (adapter_config.json + adapter_model.safetensors; the base is `model.path`).

The KL reference (when the objective uses one) is a frozen copy of the weights at the first RL step — what
RL started from, after any warm start — sharded like the policy and kept in checkpoints, so a resumed run
keeps the same anchor.

With an objective that has a critic (`train.algorithm=ppo`), a `Critic` (critic.py) trains beside the policy on
the same ranks and strategy: before the batch's first step it values every model token and the objective's
GAE turns the values into per-token advantages (they replace the samples' own), and after each optimizer step
of the policy one of the critic follows on the same mini-batch (`time/critic`). It is never published.

Versions: `version` counts train steps (RL batches and SFT steps) applied to the initial weights (version
0) — one published policy per step, however many optimizer steps it made; a `TrainBatch` must carry the
trainer's current version (it is the policy being trained; the step makes version + 1).
Determinism: the same seed, config, batches and world size give bit-identical weights (CPU, gloo). The
process-wide switches (thread count, deterministic algorithms) are the actor's to set (worker.py).
Collectives: under fsdp2 every forward, backward and full-tensor gather is a collective, so every rank must
make the same calls in the same order — which the micro-batch plan and the entry order guarantee.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

from rollart.base.shards import row_range
from rollart.config import RunConfig
from rollart.models import load_tokenizer, resolve_model_path
from rollart.models.lora import ADAPTER_CONFIG, ADAPTER_WEIGHTS, peft_config_json
from rollart.trainer.critic import Critic
from rollart.trainer.objective import Objective
from rollart.trainer.persist import load_checkpoint, save_checkpoint
from rollart.trainer.packing import (Group, MicroBatch, collate, global_totals, pad_rows, padding_counts, plan,
                                     plan_groups, shard)
from rollart.trainer.policy import Entry, InitialAdapter, PolicyModule, build_policy, entries, load_weights
from rollart.trainer.schedule import lr_multiplier
from rollart.trainer.sft_data import conversation_sample
from rollart.trainer.strategy import make_strategy
from rollart.trainer.sums import Sums
from rollart.trainer.tensor_files import TensorReader, TensorSpec, write_safetensors
from rollart.types import LoraAdapter, TrainBatch, TrainSample

LossFn = Callable[[MicroBatch, Sequence[int], bool], torch.Tensor]


class Trainer:
    def __init__(
        self,
        cfg: RunConfig,
        objective: Objective,
        *,
        rank: int = 0,
        world_size: int = 1,
        device: str = "cpu",
        model_path: str | Path | None = None,
    ) -> None:
        train = cfg.train
        torch.manual_seed(cfg.seed)
        self.cfg, self.objective = cfg, objective
        self.rank, self.world_size, self.device = rank, world_size, torch.device(device)
        self.model_path = Path(model_path) if model_path else resolve_model_path(cfg.model, cfg.seed)
        self.tokenizer = load_tokenizer(self.model_path, cfg.model.trust_remote_code)
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        if cfg.model.adapter:
            raise ValueError(f"model.adapter={cfg.model.adapter!r} is for serving and evaluation; to continue a LoRA "
                             "run use resume=true in its run_dir")
        self.lora = train.lora
        self.strategy = make_strategy(train, rank, world_size, self.device)
        self.policy: PolicyModule = build_policy(cfg, self.model_path, self.strategy)
        load_weights(self.policy, self.strategy, {"base": TensorReader.of_checkpoint(self.model_path),
                                                  "adapter": InitialAdapter(cfg.seed)}, self.lora is not None)
        self.model = self.policy.lm  # the Hugging Face (PEFT) model inside, its parameters sharded or not
        self.policy.train()
        self.wrapped = self.strategy.wrap(self.policy)  # what training forwards go through
        self.optimizer = torch.optim.AdamW(self.trainable(), lr=train.lr, weight_decay=train.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_multiplier(train.schedule, train.warmup_steps, train.steps)
        )
        self.sft_optimizer: torch.optim.Optimizer | None = None
        self.ref_policy: PolicyModule | None = None  # the KL anchor, set at the first RL step (or loaded)
        self.critic = None if objective.critic is None else Critic(
            cfg, objective.critic, self.model_path, self.strategy, rank, world_size, self.device,
            lambda samples, group: collate([samples[j] for j in group.indices], self.pad_id, train.packing))
        self.version = 0

    # --- steps -----------------------------------------------------------------------------------
    def train_step(self, batch: TrainBatch) -> dict[str, float]:
        """One RL train step on `batch` (all ranks get the same batch): the objective's planned optimizer
        steps, then version + 1; returns `train/*` metrics (module docstring)."""
        if batch.version != self.version:
            raise ValueError(
                f"TrainBatch.version={batch.version} but the trainer holds version {self.version}: a batch "
                "trains the current policy (the driver's version is out of step with the trainer's)"
            )
        start = time.perf_counter()
        samples = batch.samples
        if global_totals(samples)[0] == 0:
            raise ValueError(f"TrainBatch v{batch.version}: no model tokens to train on in {len(samples)} samples")
        if self.objective.uses_reference and self.ref_policy is None:
            self.ref_policy = self._frozen_copy()  # RL starts from these weights: they are the anchor
        if self.critic is not None:
            self.critic.start(self.policy)  # (before any forward: it reads the policy's own shards)
        steps = self.objective.update_plan(len(samples), f"{self.cfg.seed}/{batch.version}")
        proximal = self._proximal_logprobs(samples, steps) if len(steps) > 1 else None
        critic_s, estimates = time.perf_counter(), None
        if self.critic is not None:  # per-token advantages from the critic's values (GAE), before any update
            estimates = self.critic.estimate(samples)
        critic_s = time.perf_counter() - critic_s
        sums = Sums()
        grad_norms: list[float] = []
        layout = [0, 0, 0]  # token slots the model computed, real tokens it computed, the samples' tokens
        lr = self.optimizer.param_groups[0]["lr"]
        for step in steps:
            mini = [samples[i] for i in step]
            tokens, seqs = global_totals(mini)

            def loss_fn(mb: MicroBatch, rows: Sequence[int], counts: bool) -> torch.Tensor:
                logprobs, entropy = self._logprobs(self.wrapped, mb)
                ref = None
                if self.ref_policy is not None:
                    with torch.no_grad():
                        ref = self._logprobs(self.ref_policy, mb, entropy=False)[0]
                prox = None
                if proximal is not None:
                    prox = pad_rows([proximal[step[r]] for r in rows], logprobs.shape[1]).to(self.device)
                weights = self.objective.token_weights(mb.loss_mask, tokens, seqs)
                fresh = mb.versions == batch.version  # generated by the weights being trained: no staleness
                advantages = mb.advantages
                if estimates is not None:
                    advantages = pad_rows([estimates[step[r]][0] for r in rows], logprobs.shape[1]).to(self.device)
                loss, stats = self.objective(logprobs, mb.behaviour_logprobs, advantages, mb.loss_mask,
                                             weights, prox, ref, fresh)
                if counts:
                    lag = (batch.version - mb.versions).float() * mb.loss_mask
                    sums.add(stats)
                    sums.add({"loss": loss.detach(), "entropy_sum": (entropy * mb.loss_mask).sum(),
                              "lag_sum": lag.sum(), "lag_max": lag.max()})
                return loss

            slots, real = self._accumulate(mini, loss_fn)
            layout[0] += slots
            layout[1] += real
            layout[2] += sum(len(s.token_ids) for s in mini)
            grad_norms.append(self._apply(self.optimizer))
            if self.critic is not None and estimates is not None:
                critic_s += self._critic_step(mini, step, estimates, tokens, sums)
        self.scheduler.step()
        self.version += 1
        s = sums.all_reduce(self.world_size, self.device)
        n = max(float(s.get("tokens", 0.0)), 1.0)  # model tokens summed over the optimizer steps
        metrics = {
            "train/loss": float(s["loss"]) / len(steps),
            **self.objective.summarize(s, len(steps)),
            "train/entropy": float(s["entropy_sum"]) / n,
            "train/grad_norm": sum(grad_norms) / len(grad_norms),
            "train/updates": float(len(steps)),
            "train/lr": lr,
            "train/tokens": float(global_totals(samples)[0]),
            "train/seqs": float(len(samples)),
            "train/padding": 1.0 - layout[1] / max(layout[0], 1),
            "train/prompt_reuse": 1.0 - layout[1] / max(layout[2], 1),  # computed once for several samples
            "train/version_lag_mean": float(s["lag_sum"]) / n,
            "train/version_lag_max": float(s["lag_max"]),
            "train/version": float(self.version),
            "time/train": time.perf_counter() - start,
        }
        if self.critic is not None:
            metrics["time/critic"] = critic_s  # (inside time/train)
        return metrics

    def _critic_step(self, mini: Sequence[TrainSample], step: Sequence[int], estimates: Any, tokens: float,
                     sums: Sums) -> float:
        """One optimizer step of the critic on the mini-batch the policy just took; its duration."""
        assert self.critic is not None
        began = time.perf_counter()

        def loss_fn(mb: MicroBatch, rows: Sequence[int], counts: bool) -> torch.Tensor:
            loss, stats = self.critic.loss_fn(mb, [step[r] for r in rows], estimates, tokens)  # type: ignore[union-attr]
            if counts:
                sums.add(stats)
            return loss

        self._accumulate(mini, loss_fn, self.critic.wrapped)
        self._apply(self.critic.optimizer, self.critic.trainable(), self.critic.objective.grad_clip)
        return time.perf_counter() - began

    def sft_step(self, data: Sequence[TrainSample | Sequence[Mapping[str, str]]]) -> dict[str, float]:
        """One supervised step: token-mean cross-entropy on loss-masked tokens, AdamW at `warm_start.lr`.

        `data` holds `TrainSample`s or chat conversations (lists of {"role", "content"}; the assistant
        messages are trained, see sft_data.py). Advances the version like any weight update.
        """
        start = time.perf_counter()
        samples = [d if isinstance(d, TrainSample) else conversation_sample(self.tokenizer, d, f"sft{i}")
                   for i, d in enumerate(data)]
        if not samples:
            raise ValueError("sft_step: no samples")
        total_tokens, _ = global_totals(samples)
        if total_tokens == 0:
            raise ValueError("sft_step: no loss-masked tokens in the batch")
        if self.sft_optimizer is None:
            self.sft_optimizer = self._sft_optimizer()
        sums = Sums()

        def loss_fn(mb: MicroBatch, rows: Sequence[int], counts: bool) -> torch.Tensor:
            logprobs, _ = self._logprobs(self.wrapped, mb, entropy=False)
            loss = -(logprobs * mb.loss_mask).sum() / total_tokens
            if counts:
                sums.add({"loss": loss.detach()})
            return loss

        lr = self.sft_optimizer.param_groups[0]["lr"]
        self._accumulate(samples, loss_fn)
        grad_norm = self._apply(self.sft_optimizer)
        self.version += 1
        return {
            "sft/loss": float(sums.all_reduce(self.world_size, self.device)["loss"]),
            "sft/grad_norm": grad_norm,
            "sft/lr": lr,
            "sft/tokens": float(total_tokens),
            "train/version": float(self.version),
            "time/sft": time.perf_counter() - start,
        }

    def _sft_optimizer(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.trainable(), lr=self.cfg.train.warm_start.lr,
                                 weight_decay=self.cfg.train.weight_decay)

    def _accumulate(self, samples: Sequence[TrainSample], loss_fn: LossFn, wrapped: Any = None) -> tuple[int, int]:
        """Backward over this rank's micro-batches of `samples` (one optimizer step's worth of gradient);
        returns (token slots computed, real tokens) over every rank's micro-batches.

        `loss_fn(mb, rows, counts)` gets each micro-batch, the indices into `samples` of its rows, and
        whether its statistics count (False for a filler micro-batch, whose loss is also multiplied by 0).
        `wrapped`: the module whose gradients synchronise (the policy's; the critic's for its steps)."""
        train = self.cfg.train
        every = plan(samples, self.world_size, train.micro_batch_tokens, train.packing)
        groups = every[self.rank]
        for i, group in enumerate(groups):
            mb = self._collate(samples, group)
            with self.strategy.sync(wrapped if wrapped is not None else self.wrapped, i == len(groups) - 1):
                loss = loss_fn(mb, group.indices, not group.filler)
                scale = 0.0 if group.filler else float(self.world_size)  # ranks average: the loss is global
                (loss * scale).backward()
        return padding_counts(samples, [g.indices for rank in every for g in rank if not g.filler], train.packing)

    def _collate(self, samples: Sequence[TrainSample], group: Group) -> MicroBatch:
        return collate([samples[j] for j in group.indices], self.pad_id, self.cfg.train.packing).to(self.device)

    def _apply(self, optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor] | None = None,
               clip: float | None = None) -> float:
        """Clip the accumulated gradient, take one optimizer step, clear it; the norm before clipping.

        The norm is summed in float64 (a float32 sum over millions of small gradient entries is off by
        ~1e-5 relative, and differently for whole and sharded tensors); the clip is torch's
        (coefficient max_norm / (norm + 1e-6), at most 1)."""
        grads = [p.grad for p in (self.trainable() if params is None else params) if p.grad is not None]
        grad_norm = math.sqrt(self.strategy.squared_norm(grads))
        coefficient = (self.cfg.train.grad_clip if clip is None else clip) / (grad_norm + 1e-6)
        if coefficient < 1.0:
            for g in grads:
                g.mul_(coefficient)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm

    @torch.no_grad()
    def _proximal_logprobs(self, samples: Sequence[TrainSample], steps: Sequence[Sequence[int]]
                           ) -> dict[int, torch.Tensor]:
        """log π_prox [len − 1] for every sample this rank trains in `steps`, with the current weights (before
        the batch's first step), in eval mode (no dropout: the proximal policy is the network itself)."""
        train = self.cfg.train
        per_rank = [sorted({step[j] for step in steps for j in shard([samples[i] for i in step], self.world_size)[r]})
                    for r in range(self.world_size)]
        out: dict[int, torch.Tensor] = {}
        self.policy.eval()
        try:
            for group in plan_groups(samples, per_rank, train.micro_batch_tokens, train.packing)[self.rank]:
                logprobs, _ = self._logprobs(self.policy, self._collate(samples, group), entropy=False)
                for row, i in enumerate(group.indices):
                    out[i] = logprobs[row, : len(samples[i].token_ids) - 1].cpu()
        finally:
            self.policy.train()
        return out

    def _logprobs(self, module: Any, mb: MicroBatch, entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log π(target) [b, L-1] (float32, with grad; 0 off the model tokens) and the policy
        entropy (no grad) if asked."""
        with self.strategy.compute():
            logp, ent = module(mb.input_ids, mb.select, mb.select_targets, mb.attention_mask, mb.position_ids,
                               mb.cu_seqlens, entropy, mb.branches)
        b, width = mb.label_shape

        def place(values: torch.Tensor) -> torch.Tensor:  # the K selected tokens into the [b, L-1] label layout
            flat = torch.zeros(b * width, dtype=torch.float32, device=values.device)
            return flat.index_copy(0, mb.dest, values.float()).view(b, width)

        return place(logp), (place(ent.detach()) if ent is not None else None)

    def _frozen_copy(self) -> PolicyModule:
        """A gradient-free, eval-mode policy with the current weights, sharded like the policy (the KL reference)."""
        ref = build_policy(self.cfg, self.model_path, self.strategy, trainable=False)
        with torch.no_grad():
            for mine, theirs in zip(entries(ref, self.lora is not None), entries(self.policy, self.lora is not None)):
                self.strategy.local(mine.tensor).copy_(self.strategy.local(theirs.tensor))
        return ref

    # --- weights and checkpoints -----------------------------------------------------------------
    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizers update: all of them, or only the adapters of a LoRA run."""
        return [p for p in self.policy.parameters() if p.requires_grad]

    def full_tensors(self, kinds: Sequence[str] = ("base", "adapter"), policy: PolicyModule | None = None,
                     aliases: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
        """(name, full tensor) for every tensor of `kinds`, by checkpoint name (policy.py), one at a time: a
        collective under fsdp2, so every rank must consume it whole, in step. Tied names come one after
        the other, with the same tensor (`aliases=False`: only the first)."""
        for entry in self._entries(kinds, policy):
            full = self.strategy.full(entry.tensor.detach())
            for name in entry.names if aliases else entry.names[:1]:
                yield name, full

    def _entries(self, kinds: Sequence[str], policy: PolicyModule | None = None) -> list[Entry]:
        return [e for e in entries(policy or self.policy, self.lora is not None) if e.kind in kinds]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """All current weights by checkpoint name, gathered at once (for checks; publishing streams them)."""
        return {k: v.clone() for k, v in self.full_tensors()}

    def weight_specs(self) -> list[tuple[tuple[str, ...], str, tuple[int, ...]]]:
        """(checkpoint names, dtype, full shape) of every base tensor, in `row_chunks` order (tied names together)."""
        return [(e.names, str(e.tensor.dtype).removeprefix("torch."), tuple(e.tensor.shape))
                for e in self._entries(("base",))]

    def row_chunks(self) -> Iterator[torch.Tensor]:
        """This rank's rows of every base tensor, in `weight_specs` order, as it holds them — its FSDP2 shard, or
        that slice of a full copy (`rollart.base.shards.row_range`; a 0-d tensor is rank 0's). Nothing is
        gathered: what a rank sends over the weight group (`weights.transport=collective`)."""
        for e in self._entries(("base",)):
            t = e.tensor.detach()
            if self.strategy.rows(t) is not None:
                yield self.strategy.local(t)
                continue
            full = self.strategy.local(t)
            start, stop = row_range(full.shape[0] if full.dim() else 1, self.rank, self.world_size)
            yield full[start:stop] if full.dim() else (full if start < stop else full.new_empty((0,)))

    def published_weights(self) -> Iterator[tuple[str, torch.Tensor]] | LoraAdapter:
        """What inference needs to serve the current version: all weights one tensor at a time (consume it
        whole, on every rank), or only the adapter (LoRA)."""
        if self.lora is not None:
            return LoraAdapter(config=peft_config_json(self.model), tensors=dict(self.full_tensors(("adapter",))))
        return self.full_tensors(("base",))

    def export(self, directory: str | Path) -> None:
        """Write the Hugging Face checkpoint of the current weights (every rank calls; rank 0 writes): config,
        generation config, tokenizer and model.safetensors — or, under LoRA, the PEFT adapter directory."""
        path = Path(directory)
        kind = "adapter" if self.lora is not None else "base"
        self._write_tensors(path / (ADAPTER_WEIGHTS if self.lora is not None else "model.safetensors"), (kind,))
        if self.rank != 0:
            return
        if self.lora is not None:
            (path / ADAPTER_CONFIG).write_text(json.dumps(peft_config_json(self.model), indent=2))
        else:
            base = self.model
            base.config.architectures = [type(base).__name__]
            base.config.save_pretrained(path)
            generation = self.model_path / "generation_config.json"
            if generation.is_file():
                (path / generation.name).write_text(generation.read_text())
        self.tokenizer.save_pretrained(path)

    def _write_tensors(self, file: Path, kinds: Sequence[str], policy: PolicyModule | None = None) -> None:
        """One safetensors file of the full tensors of `kinds`, streamed: gathered one by one, written by
        rank 0 (tied names once, under their first name — as transformers saves them)."""
        specs = [TensorSpec(e.name, e.tensor.dtype, tuple(e.tensor.shape)) for e in self._entries(kinds, policy)]
        tensors = (t for _, t in self.full_tensors(kinds, policy, aliases=False))
        if self.rank == 0:
            file.parent.mkdir(parents=True, exist_ok=True)
            write_safetensors(file, specs, tensors)
        else:
            for _ in tensors:  # take part in every gather
                pass

    def _named_trainable(self) -> list[tuple[str, torch.Tensor]]:
        return [(e.name, e.tensor) for e in self._entries(("base", "adapter")) if e.tensor.requires_grad]

    def save(self, directory: str | Path, extra_state: Mapping[str, Any] | None) -> None:
        """Write this rank's part of a checkpoint into `directory` (every rank calls, in step; persist.py)."""
        save_checkpoint(self, Path(directory), extra_state)

    def load(self, directory: str | Path) -> dict[str, Any]:
        """Restore weights, optimizer(s), scheduler, version and this rank's RNG from a checkpoint written with
        any number of ranks and either strategy; returns `extra_state` (persist.py)."""
        return load_checkpoint(self, Path(directory))
