"""The `train` and `weights` sections: the trainer (RL steps, optimizer, loss, parallelism, checkpoints, the
warm start before RL, LoRA) and the weight store that carries each new policy version to inference.

In: `Section` (`base`), the bounds (`bounds`), the algorithms' presets and the critic's section (`algorithm`).
Out: `TrainConfig` with its `WarmStartConfig`, `LoraConfig` (`LORA_TARGETS`, the default modules adapted) and
`CriticConfig`, and `WeightsConfig`. `train.algorithm` sets the settings of its preset before the section is
validated; settings given beside it win (`rollart.config.algorithm`).

Guarantee: every setting is typed and bounded; the settings that cannot work together (offload without fsdp2,
bf16 over low-precision weights or on a device without bf16, more ranks than slots, LoRA on an engine that
cannot serve it) are refused once the whole config is known (`rollart.config.run`).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from rollart.config.algorithm import CriticConfig, apply_preset
from rollart.config.base import Section
from rollart.config.bounds import (
    DAY_S,
    MAX_BATCH,
    MAX_ENTRIES,
    MAX_MB,
    MAX_RETRIES,
    MAX_STEPS,
    MAX_THREADS,
    MAX_WORKERS,
    WEEK_S,
)


TINY_WARM_START_STEPS = 100  # the warm start's default length for the built-in tiny model


class WarmStartConfig(Section):
    """Optional supervised warm start on generated demonstrations, so RL begins from a policy that
    follows each domain's action format."""

    steps: int | None = Field(
        None, ge=0, le=MAX_STEPS, description="supervised steps before RL (0 = none; a resumed run skips them); "
        f"None = {TINY_WARM_START_STEPS} for the built-in tiny model (it learns each domain's action format from "
        "them), 0 for a model.path checkpoint of your own (it already writes its format)"
    )
    lr: float = Field(3e-3, gt=0, le=10, description="learning rate of the warm start")
    batch_size: int = Field(16, ge=1, le=MAX_BATCH, description="demonstrations per step, the trained domains in turn")
    expert_prob: float = Field(
        1.0, ge=0, le=1, description="chance each demonstrated action is the expert's (else a random valid one)"
    )


LORA_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


class LoraConfig(Section):
    """LoRA with PEFT: the base weights stay frozen, low-rank adapters train, and only the adapters travel
    through the weight store to inference (which merges them into its copy of the base)."""

    rank: int = Field(8, ge=1, le=65_536, description="adapter rank r (PEFT's `r`)")
    alpha: float = Field(16.0, gt=0, le=1e6, description="scale numerator: the weight update is (alpha / rank)·B·A")
    dropout: float = Field(0.0, ge=0, lt=1, description="dropout on the adapters' input while training")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LORA_TARGETS), max_length=MAX_ENTRIES, description="names (suffixes) of the "
        "linear modules to adapt, as PEFT's target_modules; the default is every attention and MLP projection of "
        "Qwen/Llama models"
    )


class TrainConfig(Section):
    """The trainer: RL steps, optimizer, the algorithm and its loss, checkpoints, and the warm start before RL."""

    @model_validator(mode="before")
    @classmethod
    def _preset(cls, data: Any) -> Any:
        return apply_preset(data)

    @model_validator(mode="after")
    def _bounds_in_order(self) -> TrainConfig:
        if self.tis_floor >= self.tis_cap:
            raise ValueError(f"train.tis_floor ({self.tis_floor}) must be below train.tis_cap ({self.tis_cap})")
        return self

    steps: int = Field(300, ge=1, le=MAX_STEPS, description="RL steps (train batches) of the run")
    lr: float = Field(3e-4, gt=0, le=10, description="AdamW learning rate (peak, when a schedule is set)")
    workers: int = Field(
        1, ge=1, le=MAX_WORKERS, description="data-parallel trainer ranks (actors), each on a slot of the "
        "trainer's pool"
    )
    strategy: Literal["ddp", "fsdp2"] = Field(
        "fsdp2", description="how ranks hold the model: fsdp2 shards weights, gradients and optimizer state over "
        "the ranks (per decoder layer, torch FSDP2); ddp keeps a full replica on every rank and all-reduces "
        "gradients. Same losses and weights either way (docs/architecture.md, the trainer)"
    )
    precision: Literal["fp32", "bf16"] = Field(
        "fp32", description="compute dtype of forward and backward: bf16 computes in bfloat16 over float32 master "
        "weights, with float32 gradient reduction, optimizer state, log-probabilities and loss (model.dtype must "
        "be float32; a CUDA device needs compute capability ≥ 8.0 — checked when the config loads on a local cluster)"
    )
    activation_checkpointing: bool = Field(
        False, description="recompute each decoder layer's activations in the backward pass instead of keeping "
        "them (less memory, ~a third more compute)"
    )
    offload: bool = Field(
        False, description="keep sharded parameters, gradients and optimizer state in host memory, moved to the "
        "device per layer (FSDP2's CPU offload; train.strategy=fsdp2 only): for GPUs short of memory"
    )
    packing: bool = Field(
        True, description="pack each micro-batch's sequences into one row without padding (positions restart per "
        "sequence, attention never crosses sequences); false = one right-padded row per sequence"
    )
    micro_batch_tokens: int = Field(
        4096, ge=16, le=1 << 30, description="tokens per micro-batch (padded: rows × longest row); gradients "
        "accumulate over micro-batches"
    )
    logprob_chunk_tokens: int = Field(
        512, ge=0, le=1 << 30, description="tokens whose log-probabilities are computed at once against the LM head "
        "(the [tokens × vocabulary] logits exist for one chunk at a time, in the forward and the backward); 0 = "
        "the whole micro-batch at once"
    )
    grad_clip: float = Field(1.0, gt=0, le=1e12, description="clip the global gradient norm to this")
    weight_decay: float = Field(0.0, ge=0, le=10, description="AdamW weight decay")
    warmup_steps: int = Field(0, ge=0, le=MAX_STEPS, description="steps of linear learning-rate warm-up")
    schedule: Literal["constant", "cosine", "linear"] = Field(
        "constant", description="learning-rate schedule after the warm-up"
    )
    algorithm: str = Field(
        "grpo", description="the RL algorithm: grpo, dr_grpo, dapo, gspo, cispo, rloo, reinforce_pp or ppo. It sets "
        "the train.* settings of its preset (docs/training.md); a setting given beside it wins"
    )
    normalize_std: bool = Field(
        True, description="divide advantages by a std: the group's (grpo, dapo, gspo, cispo, rloo), the batch's "
        "(reinforce_pp, ppo)"
    )
    clip_low: float = Field(
        0.2, ge=0, le=1, description="PPO clip below: the ratio may not fall under 1 − clip_low (cispo: the "
        "importance weight's floor; 1 = none)"
    )
    clip_high: float = Field(
        0.28, ge=0, le=100, description="PPO clip above: the ratio may not rise over 1 + clip_high (gspo: of the "
        "sequence ratio; cispo: the importance weight's cap)"
    )
    correction: Literal["none", "token_tis", "token_mis", "seq_tis", "seq_mis"] = Field(
        "token_tis", description="the behaviour correction w of each token, from π_prox/μ (the trainer's over the "
        "engine's probability): token_tis truncates each token's ratio into [tis_floor, tis_cap], token_mis zeroes "
        "tokens whose ratio leaves it, seq_tis/seq_mis do the same with the sequence's ratio (the product over its "
        "tokens); none = weight 1 (ignores staleness and engine mismatch)"
    )
    tis_cap: float = Field(2.0, gt=0, le=1e6, description="upper bound of the behaviour correction's ratio")
    tis_floor: float = Field(
        0.0, ge=0, le=1e6, description="lower bound of the behaviour correction's ratio; > 0 makes it two-sided "
        "(an icepop-style mask with the mis modes); must be below tis_cap"
    )
    mini_batches: int = Field(
        1, ge=1, le=MAX_BATCH, description="optimizer steps per epoch over a batch (PPO mini-batches); > 1 activates "
        "the clip: the proximal policy is the weights before the batch's first step"
    )
    epochs: int = Field(1, ge=1, le=1000, description="passes over each batch (each split into mini_batches steps)")
    kl_coef: float = Field(
        0.0, ge=0, le=1000, description="weight of the KL penalty to the initial weights (> 0 keeps a frozen "
        "reference model)"
    )
    kl_estimator: Literal["k3", "k2", "k1"] = Field(
        "k3", description="the KL penalty's per-token estimator (Schulman): k3 = exp(Δ) − Δ − 1, k2 = Δ²/2, "
        "k1 = −Δ, with Δ = log π_ref − log π_θ"
    )
    # seq_mean: each trajectory weighs the same, so a long multi-turn domain does not drown a short one
    aggregation: Literal["token_mean", "seq_mean", "seq_sum", "seq_sum_norm"] = Field(
        "seq_mean", description="loss average: over all tokens of the batch (token_mean); per trajectory first, so "
        "each trajectory weighs the same (seq_mean); each trajectory's token sum, averaged over trajectories "
        "(seq_sum); or that sum divided by a constant length (seq_sum_norm, Dr.GRPO: train.norm_length)"
    )
    norm_length: int = Field(
        0, ge=0, le=1 << 30, description="seq_sum_norm's constant length; 0 = the longest generation budget of a "
        "trained domain (max_turns × max_new_tokens)"
    )
    dynamic_sampling: bool = Field(
        False, description="drop a complete group whose rewards are all equal (it carries no gradient) and admit a "
        "new one in its place (DAPO); counted in rollout/groups_filtered/<domain>"
    )
    max_filtered_groups: int = Field(
        64, ge=0, le=MAX_BATCH, description="dynamic sampling's bound: after this many groups are dropped while one "
        "batch forms, the rest of that batch is taken unfiltered (logged), so rollout can never spin"
    )
    overlong_buffer: float = Field(
        0.0, ge=0, le=1, description="overlong reward shaping (DAPO): the last fraction of a turn's max_new_tokens "
        "in which a longer response is penalised linearly, down to −overlong_penalty at the limit; 0 = off"
    )
    overlong_penalty: float = Field(1.0, ge=0, le=1e6, description="the shaping's penalty at the length limit")
    overlong_filter: bool = Field(
        False, description="mask the loss of trajectories that were cut (a turn stopped at max_new_tokens, or the "
        "episode TRUNCATED): they still count in their group's advantages but get no gradient"
    )
    critic: CriticConfig = Field(
        default_factory=CriticConfig, description="the value model (train.algorithm=ppo)"
    )
    checkpoint_every: int = Field(
        10, ge=1, le=MAX_STEPS, description="save a checkpoint every N RL steps (and at the end)"
    )
    keep_checkpoints: int = Field(2, ge=1, le=100_000, description="newest checkpoints kept; older ones are deleted")
    threads: int = Field(1, ge=1, le=MAX_THREADS, description="torch threads per trainer worker")
    timeout_s: float = Field(600.0, gt=0, le=WEEK_S, description="bound on one trainer call and on its collectives")
    restarts: int = Field(
        2, ge=0, le=MAX_RETRIES, description="times the trainer ranks are rebuilt after a rank died, each time from the latest "
        "checkpoint (the steps since are replayed) before the run stops with the command that resumes it"
    )
    elastic_generation: bool = Field(
        False, description="while the trainer waits for a batch, its devices run an inference engine on its own "
        "current weights (no weight transfer) and give them back the moment the batch is ready, turns in flight "
        "there going on elsewhere (each rank runs the built-in engine in its own process: inference.engine=builtin; "
        "the cluster twin models the same)"
    )
    warm_start: WarmStartConfig = WarmStartConfig()
    lora: LoraConfig | None = Field(
        None, description="train LoRA adapters (the warm start too) instead of all weights; null = full training"
    )


class WeightsConfig(Section):
    """The weight store that moves each new policy version from the trainer to the inference workers."""

    bucket_mb: float = Field(
        1.0, gt=0, le=MAX_MB, description="size of one weight bucket, in MiB (a larger tensor gets its own)"
    )
    keep_versions: int = Field(2, ge=1, le=1000, description="newest versions the store holds")
    timeout_s: float = Field(60.0, gt=0, le=DAY_S, description="bound on every weight-store call (publish, pull)")
    transport: Literal["store", "collective"] = Field(
        "store", description="store: rank 0 gathers full tensors into the object store, workers pull them (works "
        "across clusters); collective: every trainer rank sends its own shard's rows to the inference workers over "
        "a gloo process group, no process gathering the model — falling back to the store, said in the step's "
        "metrics, if the group cannot form or breaks (a worker replaced, a trainer rebuilt); LoRA adapters always "
        "go through the store"
    )
