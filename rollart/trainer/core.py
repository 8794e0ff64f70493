"""`Trainer`: one data-parallel rank's model, optimizer and steps (plain Python; the Ray actor wraps it).

In: the `RunConfig` (model, seed, `train.*`), an `Objective` (the policy loss, injected), this rank and
the world size (the process group must already be initialised when world_size > 1), a torch device.
Out: `train_step(batch)` and `sft_step(samples)` return metrics; `state_dict()` gives the weights to
publish; `save(dir, extra)` / `load(dir)` write and read checkpoints (checkpoint.py: JSON +
safetensors, never a pickle).

One RL step (`train_step`) trains one batch in the optimizer steps the objective plans
(`train.mini_batches` × `train.epochs`, each a mini-batch of the batch's samples). With more than one, the
proximal log-probabilities are computed once, with the weights before the first step, and passed to every
step (decoupled PPO). Each step shards its mini-batch over ranks (packing.shard); each rank runs
micro-batches of at most `train.micro_batch_tokens` padded tokens, accumulating gradients (DDP `no_sync` on
all but the last), every micro-batch loss weighted by the *mini-batch's* token/sequence totals and
multiplied by the world size (DDP averages gradients), so N ranks compute the gradient of the same loss as
one rank would; then gradient clipping to `train.grad_clip` and one AdamW step. After the batch: one
LR-scheduler step, version + 1. An SFT step is one such optimizer step on the whole batch. Statistics are
summed over steps and micro-batches and all-reduced, so every rank returns the same metrics.

With `train.lora` the model is a PEFT model: the base weights are frozen, the optimizers update only the
adapters, `published_weights()` is the adapter alone (a `LoraAdapter`) and checkpoints are PEFT adapter
directories (adapter_config.json + adapter_model.safetensors; the base is `model.path`).

The KL reference (when the objective uses one) is a frozen copy of the weights at the first RL step — what
RL started from, after any warm start — kept in checkpoints so a resumed run keeps the same anchor.

Versions: `version` counts train steps (RL batches and SFT steps) applied to the initial weights (version
0) — one published policy per step, however many optimizer steps it made; a `TrainBatch` must carry the
trainer's current version (it is the policy being trained; the step makes version + 1).
Determinism: the same seed, config, batches and world size give bit-identical weights (CPU, gloo). The
process-wide switches (thread count, deterministic algorithms) are the actor's to set (worker.py).
"""

from __future__ import annotations

import copy
import logging
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import safetensors.torch
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from rollart.config import RunConfig
from rollart.models import load_model, load_tokenizer, resolve_model_path
from rollart.models.lora import adapter_of, attach_lora, load_adapter_state, set_adapter_state
from rollart.trainer import checkpoint as ckpt
from rollart.trainer.objective import Objective
from rollart.trainer.packing import MicroBatch, collate, global_totals, micro_batches, pad_rows, shard
from rollart.trainer.schedule import lr_multiplier
from rollart.trainer.sft_data import conversation_sample
from rollart.types import LoraAdapter, TrainBatch, TrainSample

log = logging.getLogger("rollart.trainer")
_SUM_KEYS = ("loss", "tokens", "clipped", "iw_sum", "iw_truncated", "approx_kl_sum", "behaviour_kl_sum",
             "ref_kl_sum", "pg_loss", "kl_loss", "entropy_sum", "lag_sum")
_MAX_KEYS = ("iw_max", "ratio_max", "lag_max")


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
        self.model = load_model(self.model_path, cfg.model.dtype, device, trust_remote_code=cfg.model.trust_remote_code)
        self.lora = train.lora
        if self.lora is not None:  # frozen base, trainable adapters (PEFT)
            self.model = attach_lora(self.model, self.lora)
        self.model.train()
        self.ref_model: torch.nn.Module | None = None  # the KL anchor, set at the first RL step (or loaded)
        self.ddp = None
        if world_size > 1:
            self.ddp = DistributedDataParallel(
                self.model, device_ids=[self.device.index or 0] if self.device.type == "cuda" else None
            )
        self.optimizer = torch.optim.AdamW(self.trainable(), lr=train.lr, weight_decay=train.weight_decay)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lr_multiplier(train.schedule, train.warmup_steps, train.steps)
        )
        self.sft_optimizer: torch.optim.Optimizer | None = None
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
        if self.objective.uses_reference and self.ref_model is None:
            self.ref_model = _frozen_copy(self.model)  # RL starts from these weights: they are the anchor
        plan = self.objective.update_plan(len(samples), f"{self.cfg.seed}/{batch.version}")
        proximal = self._proximal_logprobs(samples, plan) if len(plan) > 1 else None
        sums = dict.fromkeys(_SUM_KEYS, 0.0) | dict.fromkeys(_MAX_KEYS, 0.0)
        grad_norms: list[float] = []
        lr = self.optimizer.param_groups[0]["lr"]
        for step in plan:
            mini = [samples[i] for i in step]
            tokens, seqs = global_totals(mini)

            def loss_fn(mb: MicroBatch, rows: Sequence[int]) -> torch.Tensor:
                logprobs, entropy = self._logprobs(self.ddp or self.model, mb)
                ref = self._logprobs(self.ref_model, mb, entropy=False)[0] if self.ref_model is not None else None
                prox = None
                if proximal is not None:
                    prox = pad_rows([proximal[step[r]] for r in rows], logprobs.shape[1]).to(self.device)
                weights = self.objective.token_weights(mb.loss_mask, tokens, seqs)
                loss, stats = self.objective(logprobs, mb.behaviour_logprobs, mb.advantages, mb.loss_mask,
                                             weights, prox, ref)
                lag = (batch.version - mb.versions).float() * mb.loss_mask
                for k, v in stats.items():
                    sums[k] = max(sums[k], float(v)) if k in _MAX_KEYS else sums[k] + float(v)
                sums["loss"] += float(loss.detach())
                sums["entropy_sum"] += float((entropy * mb.loss_mask).sum())
                sums["lag_sum"] += float(lag.sum())
                sums["lag_max"] = max(sums["lag_max"], float(lag.max()))
                return loss

            self._accumulate(mini, loss_fn)
            grad_norms.append(self._apply(self.optimizer))
        self.scheduler.step()
        self.version += 1
        s = self._all_reduce(sums)
        n = max(s["tokens"], 1.0)  # model tokens summed over the optimizer steps
        metrics = {
            "train/loss": s["loss"] / len(plan),
            "train/pg_loss": s["pg_loss"] / len(plan),
            "train/clip_frac": s["clipped"] / n,
            "train/ratio_max": s["ratio_max"],
            "train/iw_mean": s["iw_sum"] / n,
            "train/iw_max": s["iw_max"],
            "train/iw_truncated_frac": s["iw_truncated"] / n,
            "train/approx_kl": s["approx_kl_sum"] / n,
            "train/behaviour_kl": s["behaviour_kl_sum"] / n,
            "train/entropy": s["entropy_sum"] / n,
            "train/grad_norm": sum(grad_norms) / len(grad_norms),
            "train/updates": float(len(plan)),
            "train/lr": lr,
            "train/tokens": float(global_totals(samples)[0]),
            "train/seqs": float(len(samples)),
            "train/version_lag_mean": s["lag_sum"] / n,
            "train/version_lag_max": s["lag_max"],
            "train/version": float(self.version),
            "time/train": time.perf_counter() - start,
        }
        if self.ref_model is not None:
            metrics["train/ref_kl"] = s["ref_kl_sum"] / n
            metrics["train/kl_loss"] = s["kl_loss"] / len(plan)
        return metrics

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
            self.sft_optimizer = torch.optim.AdamW(self.trainable(), lr=self.cfg.train.warm_start.lr,
                                                   weight_decay=self.cfg.train.weight_decay)
        sums = {"loss": 0.0}

        def loss_fn(mb: MicroBatch, rows: Sequence[int]) -> torch.Tensor:
            logprobs, _ = self._logprobs(self.ddp or self.model, mb, entropy=False)
            loss = -(logprobs * mb.loss_mask).sum() / total_tokens
            sums["loss"] += float(loss.detach())
            return loss

        lr = self.sft_optimizer.param_groups[0]["lr"]
        self._accumulate(samples, loss_fn)
        grad_norm = self._apply(self.sft_optimizer)
        self.version += 1
        return {
            "sft/loss": self._all_reduce(sums)["loss"],
            "sft/grad_norm": grad_norm,
            "sft/lr": lr,
            "sft/tokens": float(total_tokens),
            "train/version": float(self.version),
            "time/sft": time.perf_counter() - start,
        }

    def _accumulate(self, samples: Sequence[TrainSample],
                    loss_fn: Callable[[MicroBatch, Sequence[int]], torch.Tensor]) -> None:
        """Backward over this rank's micro-batches of `samples` (one optimizer step's worth of gradient).

        `loss_fn(mb, rows)` gets each micro-batch and the indices into `samples` of its rows."""
        mine = shard(samples, self.world_size)[self.rank]
        groups = micro_batches(samples, mine, self.cfg.train.micro_batch_tokens)
        for i, group in enumerate(groups):
            mb = collate([samples[j] for j in group], self.pad_id).to(self.device)
            sync = self.ddp is None or i == len(groups) - 1
            with nullcontext() if sync else self.ddp.no_sync():
                (loss_fn(mb, group) * self.world_size).backward()  # DDP averages over ranks; the loss is global

    def _apply(self, optimizer: torch.optim.Optimizer) -> float:
        """Clip the accumulated gradient, take one optimizer step, clear it; the norm before clipping."""
        grad_norm = float(torch.nn.utils.clip_grad_norm_(self.trainable(), self.cfg.train.grad_clip))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return grad_norm

    @torch.no_grad()
    def _proximal_logprobs(self, samples: Sequence[TrainSample], plan: Sequence[Sequence[int]]) -> dict[int, torch.Tensor]:
        """log π_prox [len − 1] for every sample this rank trains in `plan`, with the current weights (before
        the batch's first step), in eval mode (no dropout: the proximal policy is the network itself)."""
        mine = sorted({step[j] for step in plan
                       for j in shard([samples[i] for i in step], self.world_size)[self.rank]})
        out: dict[int, torch.Tensor] = {}
        self.model.eval()
        try:
            for group in micro_batches(samples, mine, self.cfg.train.micro_batch_tokens):
                mb = collate([samples[i] for i in group], self.pad_id).to(self.device)
                logprobs, _ = self._logprobs(self.model, mb, entropy=False)
                for row, i in enumerate(group):
                    out[i] = logprobs[row, : len(samples[i].token_ids) - 1].cpu()
        finally:
            self.model.train()
        return out

    def _logprobs(self, model: Any, mb: MicroBatch, entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Per-token log π(target) [b, L-1] (float32, with grad) and the policy entropy (no grad) if asked."""
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask, use_cache=False).logits
        logp = torch.log_softmax(logits[:, :-1].float(), dim=-1)
        token_logp = logp.gather(-1, mb.targets.unsqueeze(-1)).squeeze(-1)
        if not entropy:
            return token_logp, None
        with torch.no_grad():
            ent = -(logp.exp() * logp).sum(-1)
        return token_logp, ent

    def _all_reduce(self, sums: dict[str, float]) -> dict[str, float]:
        if self.world_size == 1:
            return sums
        keys = sorted(sums)
        add = torch.tensor([sums[k] if k not in _MAX_KEYS else 0.0 for k in keys], dtype=torch.float64)
        top = torch.tensor([sums[k] if k in _MAX_KEYS else float("-inf") for k in keys], dtype=torch.float64)
        if self.device.type == "cuda":
            add, top = add.to(self.device), top.to(self.device)
        dist.all_reduce(add, op=dist.ReduceOp.SUM)
        dist.all_reduce(top, op=dist.ReduceOp.MAX)
        return {k: float(top[i]) if k in _MAX_KEYS else float(add[i]) for i, k in enumerate(keys)}

    # --- weights and checkpoints -----------------------------------------------------------------
    def trainable(self) -> list[torch.nn.Parameter]:
        """The parameters the optimizers update: all of them, or only the adapters of a LoRA run."""
        return [p for p in self.model.parameters() if p.requires_grad]

    def state_dict(self) -> dict[str, torch.Tensor]:
        """The current weights by Hugging Face parameter name (tied names share one tensor); a LoRA run's
        names are PEFT's (base layers and adapters)."""
        return {k: v.detach() for k, v in self.model.state_dict().items()}

    def published_weights(self) -> dict[str, torch.Tensor] | LoraAdapter:
        """What inference needs to serve the current version: all weights, or only the adapter (LoRA)."""
        return adapter_of(self.model) if self.lora is not None else self.state_dict()

    def save(self, directory: str | Path, extra_state: Mapping[str, Any] | None) -> None:
        """Write this rank's part of a checkpoint into `directory` (rank 0: everything but other ranks' RNG)."""
        path = Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        ckpt.save_rng(path, self.rank)
        if self.rank != 0:
            return
        self.model.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        ckpt.save_extra(path, dict(extra_state or {}))
        if self.ref_model is not None:  # a LoRA run's reference differs from the base by its adapter only
            if self.lora is not None:
                safetensors.torch.save_file(dict(adapter_of(self.ref_model).tensors), str(path / ckpt.REFERENCE_FILE))
            else:
                safetensors.torch.save_model(self.ref_model, str(path / ckpt.REFERENCE_FILE))
        ckpt.save_trainer_state(path, {
            "version": self.version,
            "world_size": self.world_size,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "sft_optimizer": self.sft_optimizer.state_dict() if self.sft_optimizer else None,
        })

    def load(self, directory: str | Path) -> dict[str, Any]:
        """Restore weights, optimizer(s), scheduler, version and this rank's RNG; returns `extra_state`."""
        path = Path(directory)
        ckpt.check_checkpoint_files(path)
        state = ckpt.load_trainer_state(path, self.device)
        if self.lora is not None:  # a PEFT adapter directory: the base is model.path, unchanged
            load_adapter_state(self.model, path)
        else:
            loaded = load_model(path, self.cfg.model.dtype, str(self.device),
                                trust_remote_code=self.cfg.model.trust_remote_code)
            with torch.no_grad():
                self.model.load_state_dict(loaded.state_dict())
            del loaded
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state["sft_optimizer"] is not None:
            self.sft_optimizer = torch.optim.AdamW(self.trainable(), lr=self.cfg.train.warm_start.lr)
            self.sft_optimizer.load_state_dict(state["sft_optimizer"])
        self.version = int(state["version"])
        if self.objective.uses_reference and not (path / ckpt.REFERENCE_FILE).is_file():
            log.warning("%s holds no KL reference (written with kl_coef=0?): the reference becomes the weights "
                        "at the next RL step, not the ones this run started RL from", path)
        if (path / ckpt.REFERENCE_FILE).is_file():
            self.ref_model = _frozen_copy(self.model)
            if self.lora is not None:
                set_adapter_state(self.ref_model, safetensors.torch.load_file(str(path / ckpt.REFERENCE_FILE)))
            else:
                safetensors.torch.load_model(self.ref_model, str(path / ckpt.REFERENCE_FILE), device=str(self.device))
        ckpt.load_rng(path, self.rank)  # a rank the checkpoint did not have keeps its seeded RNG
        return ckpt.load_extra(path)


def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
    """An independent, gradient-free, eval-mode copy of `model` (the KL reference)."""
    return copy.deepcopy(model).eval().requires_grad_(False)
