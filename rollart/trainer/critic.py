"""The critic: a value model trained on the trainer's ranks beside the policy (PPO with GAE), never published.

In: the `RunConfig` (model, `train.*`), the objective's `CriticObjective` (GAE and the value loss, from the algo
plane; rollart/trainer/objective.py), the policy's checkpoint path, the trainer's parallelism strategy, rank
and world size. Out: `Critic` — `start(policy)` (the weights, at the first RL step), `estimate(samples)` (per
sample: per-token advantages, returns and the values they came from), `loss_fn(...)` (the value loss of one
micro-batch, for the trainer's micro-batch loop), `save(dir)` / `load(dir, state)`.

The model: the policy's decoder architecture (a Hugging Face base model, no LM head) and a linear value head
on its final hidden states, read at the same positions as the policy's log-probabilities — the state before
each model token. Its weights: `train.critic.path`'s decoder (a causal-LM checkpoint with the policy's
vocabulary) or, without one, a copy of the policy's decoder taken when RL starts (after the warm start, like
the KL reference); the head starts at 0 (every value 0). It is sharded like the policy (`strategy.shard`: FSDP2
per decoder layer), has its own AdamW (`train.critic.lr`, `train.weight_decay`, no schedule) and gradient
clip (`train.critic.grad_clip`), and is never in `published_weights`: inference never sees it.

`estimate`: every rank computes the values of its shard of the batch (no grad, eval mode), the ranks exchange
them (`all_gather_object`: a few floats per token), and every rank then runs GAE over every sample — the
reward at its last model token — and whitens the advantages over the batch's model tokens (population std,
`CriticObjective.whiten`), so every rank holds the same advantages. Values are those of the critic before
this batch's updates (V_old of the value clip).

Checkpoints: `critic.safetensors` (rank 0 writes the full tensors, gathered one by one, under the causal LM's
names plus `value_head.*`) and `critic_optimizer/` (each rank's rows), its param groups in the trainer state.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from torch import Tensor, nn

from rollart.config import RunConfig
from rollart.trainer import checkpoint as ckpt
from rollart.trainer.attention import packing_problem
from rollart.trainer.attention import register as register_attention
from rollart.trainer.objective import CriticObjective
from rollart.trainer.packing import MicroBatch, pad_rows, plan_groups, shard
from rollart.trainer.policy import Entry, decoder_hidden, decoder_layers, entries, recompute_buffers
from rollart.trainer.tensor_files import TensorReader, TensorSpec, write_safetensors
from rollart.types import TrainSample

log = logging.getLogger("rollart.trainer")
CRITIC_FILE = "critic.safetensors"
HEAD = "value_head."


class ValueModule(nn.Module):
    """Root module: decoder → hidden states at the selected positions → one value each."""

    def __init__(self, decoder: nn.Module) -> None:
        super().__init__()
        self.decoder = decoder
        self.value_head = nn.Linear(decoder.config.hidden_size, 1)

    def forward(self, input_ids: Tensor, select: Tensor, attention_mask: Tensor | None = None,
                position_ids: Tensor | None = None, cu_seqlens: Tensor | None = None,
                branches: Tensor | None = None) -> Tensor:
        hidden = decoder_hidden(self.decoder, input_ids, attention_mask, position_ids, cu_seqlens, branches)
        selected = hidden.reshape(-1, hidden.shape[-1]).index_select(0, select)
        # sum over the one output: a new tensor (a view as the root's output would trip FSDP2's backward hook)
        return self.value_head(selected.to(self.value_head.weight.dtype)).sum(dim=-1).float()


def critic_entries(module: ValueModule) -> list[Entry]:
    """Every parameter under its checkpoint name: the decoder's as in the causal LM (`model.…`), the head's
    as `value_head.…`."""
    prefix = f"{module.decoder.base_model_prefix}."
    out = []
    for fqn, p in module.named_parameters():
        name = prefix + fqn.removeprefix("decoder.") if fqn.startswith("decoder.") else fqn
        out.append(Entry((name,), p, "base"))
    return out


def build_critic(cfg: RunConfig, model_path: str | Path, policy_path: str | Path, strategy: Any) -> ValueModule:
    """An empty critic, sharded by `strategy`, on its device; its decoder the architecture of `model_path`."""
    from transformers import AutoConfig, AutoModel

    remote = cfg.model.trust_remote_code
    config = AutoConfig.from_pretrained(str(model_path), local_files_only=True, trust_remote_code=remote)
    policy_vocab = AutoConfig.from_pretrained(str(policy_path), local_files_only=True,
                                              trust_remote_code=remote).vocab_size
    if config.vocab_size != policy_vocab:
        raise ValueError(f"train.critic.path={str(model_path)!r}: its vocabulary has {config.vocab_size} tokens, the "
                         f"policy's {policy_vocab}; the critic reads the policy's token ids, so they must match")
    with torch.device("meta"):
        decoder = AutoModel.from_config(config, dtype=getattr(torch, cfg.model.dtype),
                                        attn_implementation=register_attention(), trust_remote_code=remote)
        if cfg.train.packing and (problem := packing_problem(decoder.config, type(decoder))):
            raise ValueError(f"train.packing (the critic, {model_path}): {problem}")
        module = ValueModule(decoder)
    if cfg.train.activation_checkpointing:
        decoder.activation_checkpointing_enable(every_n_layers=1)
    strategy.shard(module, decoder_layers(decoder))
    module.to_empty(device=strategy.param_device)
    recompute_buffers(module, strategy.param_device)
    return module


class Critic:
    def __init__(self, cfg: RunConfig, objective: CriticObjective, policy_path: Path, strategy: Any, rank: int,
                 world_size: int, device: torch.device, collate: Callable[[Sequence[TrainSample], Any], MicroBatch]
                 ) -> None:
        self.cfg, self.objective, self.strategy = cfg, objective, strategy
        self.rank, self.world_size, self.device, self.collate = rank, world_size, device, collate
        if cfg.train.lora is not None:
            raise ValueError("train.lora with a critic (train.algorithm=ppo) is not supported yet: the critic is a "
                             "full copy of the decoder; use train.lora=null or a critic-free algorithm")
        source = Path(objective.path) if objective.path else policy_path
        self.module = build_critic(cfg, source, policy_path, strategy)
        self.module.train()
        self.wrapped = strategy.wrap(self.module)
        self.optimizer = torch.optim.AdamW(self.module.parameters(), lr=objective.lr,
                                           weight_decay=cfg.train.weight_decay)
        self.ready = False
        if objective.path:
            self._fill(TensorReader.of_checkpoint(source))
            self.ready = True

    # --- weights ---------------------------------------------------------------------------------------
    def _fill(self, reader: TensorReader, head: bool = False) -> None:
        """Every decoder tensor from `reader` (this rank's rows); the head from it too, or zeros."""
        with torch.no_grad():
            for entry in critic_entries(self.module):
                local = self.strategy.local(entry.tensor)
                if entry.name.startswith(HEAD) and not head:
                    local.zero_()
                    continue
                rows = self.strategy.rows(entry.tensor)
                local.copy_(reader.read(entry.name, tuple(entry.tensor.shape), rows).to(local.dtype))

    def start(self, policy: nn.Module) -> None:
        """At the first RL step: without `train.critic.path`, the decoder becomes a copy of the policy's (its
        weights after the warm start) and the head 0. Every rank's own shards: no communication."""
        if self.ready:
            return
        self.strategy.release(policy)  # its sharded parameters (a forward without a backward leaves the root whole)
        theirs = {name: e.tensor for e in entries(policy, lora=False) for name in e.names}
        with torch.no_grad():
            for entry in critic_entries(self.module):
                local = self.strategy.local(entry.tensor)
                if entry.name.startswith(HEAD):
                    local.zero_()
                else:
                    local.copy_(self.strategy.local(theirs[entry.name]))
        self.ready = True

    # --- values, advantages, the loss --------------------------------------------------------------------
    def _values(self, module: Any, mb: MicroBatch) -> Tensor:
        """V at every predicted model token [b, L-1] (0 elsewhere)."""
        with self.strategy.compute():
            values = module(mb.input_ids, mb.select, mb.attention_mask, mb.position_ids, mb.cu_seqlens,
                            mb.branches)
        b, width = mb.label_shape
        flat = torch.zeros(b * width, dtype=torch.float32, device=values.device)
        return flat.index_copy(0, mb.dest, values).view(b, width)

    @torch.no_grad()
    def estimate(self, samples: Sequence[TrainSample]) -> list[tuple[Tensor, Tensor, Tensor]]:
        """Per sample (advantages, returns, values), each [len − 1], the same on every rank (module docstring)."""
        train = self.cfg.train
        mine: dict[int, Tensor] = {}
        self.module.eval()
        try:
            for group in plan_groups(samples, shard(samples, self.world_size), train.micro_batch_tokens,
                                     train.packing)[self.rank]:
                values = self._values(self.module, self.collate(samples, group).to(self.device))
                if not group.filler:
                    for row, i in enumerate(group.indices):
                        mine[i] = values[row, : len(samples[i].token_ids) - 1].cpu()
        finally:
            self.module.train()
        every = dict(mine)
        if self.world_size > 1:
            gathered: list[dict[int, list[float]]] = [{} for _ in range(self.world_size)]
            dist.all_gather_object(gathered, {i: v.tolist() for i, v in mine.items()})
            every = {i: torch.tensor(v, dtype=torch.float32) for part in gathered for i, v in part.items()}
        out = []
        for i, sample in enumerate(samples):
            mask = torch.tensor(sample.loss_mask[1:], dtype=torch.float32)
            rewards = torch.zeros_like(mask)
            if mask.any():
                rewards[int(mask.nonzero().max())] = sample.reward
            adv, ret = self.objective.advantages(every[i][None], rewards[None], mask[None])
            out.append((adv[0], ret[0], every[i]))
        if self.objective.whiten:
            out = self._whiten(samples, out)
        return out

    @staticmethod
    def _whiten(samples: Sequence[TrainSample], rows: list[tuple[Tensor, Tensor, Tensor]]
                ) -> list[tuple[Tensor, Tensor, Tensor]]:
        masks = [torch.tensor(s.loss_mask[1:], dtype=torch.bool) for s in samples]
        flat = torch.cat([adv[m] for (adv, _, _), m in zip(rows, masks)]).to(torch.float64)
        if flat.numel() < 2:
            return rows
        mean, std = flat.mean(), flat.std(unbiased=False)
        return [(torch.where(m, ((adv.to(torch.float64) - mean) / (std + 1e-8)).float(), torch.zeros_like(adv)), ret,
                 values) for (adv, ret, values), m in zip(rows, masks)]

    def loss_fn(self, mb: MicroBatch, rows: Sequence[int], estimates: Sequence[tuple[Tensor, Tensor, Tensor]],
                tokens: float) -> tuple[Tensor, dict[str, Tensor]]:
        """The value loss of one micro-batch (its samples `rows` of the batch), token-averaged over its
        mini-batch's `tokens`."""
        values = self._values(self.wrapped, mb)
        width = values.shape[1]
        old = pad_rows([estimates[r][2] for r in rows], width).to(values.device)
        returns = pad_rows([estimates[r][1] for r in rows], width).to(values.device)
        weights = mb.loss_mask / max(tokens, 1.0)
        return self.objective.loss(values, old, returns, mb.loss_mask, weights)

    def trainable(self) -> list[nn.Parameter]:
        return [p for p in self.module.parameters() if p.requires_grad]

    # --- checkpoints ---------------------------------------------------------------------------------
    def save(self, path: Path) -> dict[str, Any]:
        """Write the critic's weights and this rank's optimizer rows into checkpoint `path` (every rank calls, in
        step); returns what goes into the trainer state."""
        named = [(e.name, e.tensor) for e in critic_entries(self.module)]
        specs = [TensorSpec(name, t.dtype, tuple(t.shape)) for name, t in named]
        tensors = (self.strategy.full(t.detach()) for _, t in named)
        if self.rank == 0:
            write_safetensors(path / CRITIC_FILE, specs, tensors)
        else:
            for _ in tensors:  # take part in every gather
                pass
        ckpt.save_optimizer_shard(path / ckpt.CRITIC_OPTIMIZER, self.rank, named, self.optimizer, self.strategy)
        return {ckpt.CRITIC_OPTIMIZER: ckpt.param_groups(self.optimizer, named)}

    def load(self, path: Path, state: Mapping[str, Any]) -> None:
        """Restore weights and optimizer from checkpoint `path` (written with any number of ranks); a checkpoint
        without a critic leaves it to be started at the next RL step."""
        if not (path / CRITIC_FILE).is_file() or state.get(ckpt.CRITIC_OPTIMIZER) is None:
            log.warning("%s holds no critic (written by another train.algorithm?): the critic starts again from the "
                        "policy's decoder at the next RL step", path)
            return
        self._fill(TensorReader.of_files([path / CRITIC_FILE]), head=True)
        named = [(e.name, e.tensor) for e in critic_entries(self.module)]
        ckpt.load_optimizer(path / ckpt.CRITIC_OPTIMIZER, state[ckpt.CRITIC_OPTIMIZER], named, self.optimizer,
                            self.strategy)
        self.ready = True
