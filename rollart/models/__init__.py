"""Models: the built-in tiny Qwen3-architecture model and tokenizer, loading local checkpoints, and LoRA
adapters in PEFT's format (`rollart.models.lora`).

A shared lower layer (like `resources`): the inference, trainer and env planes all load models and
tokenizers through here, and nothing here imports a plane.
"""

from rollart.models.loading import load_model, load_tokenizer, resolve_model_path
from rollart.models.tiny import build_tiny_model, build_tokenizer, init_tiny_checkpoint

__all__ = [
    "build_tiny_model",
    "build_tokenizer",
    "init_tiny_checkpoint",
    "load_model",
    "load_tokenizer",
    "resolve_model_path",
]
