"""The bucketed, versioned weight store (docs/architecture.md §6, the six-step sync).

The trainer publishes each version's weights in buckets of numpy bytes to the Ray object store through a
`StorePublisher`; a named store actor keeps the refs of the last `weights.keep_versions` versions;
inference workers pull the newest version in the background through a `StoreSubscriber` and swap it in at
the next suspend. The driver builds both ends from one `WeightStore(cfg.weights)`. The Ray-bound names are
imported on first use: the buckets and the collective path (collective.py) import without Ray.
"""

from typing import TYPE_CHECKING, Any

from rollart.weights.buckets import Bucket, TensorMeta, pack, unpack
from rollart.weights.timing import PUBLISH, PULL

if TYPE_CHECKING:
    from rollart.weights.client import WeightStore
    from rollart.weights.publisher import StorePublisher
    from rollart.weights.subscriber import StoreSubscriber

__all__ = [
    "PUBLISH",
    "PULL",
    "Bucket",
    "StorePublisher",
    "StoreSubscriber",
    "TensorMeta",
    "WeightStore",
    "pack",
    "unpack",
]

_RAY_BOUND = {"WeightStore": "client", "StorePublisher": "publisher", "StoreSubscriber": "subscriber"}


def __getattr__(name: str) -> Any:
    """The Ray-bound names, imported when first asked for."""
    if name in _RAY_BOUND:
        import importlib

        return getattr(importlib.import_module(f"rollart.weights.{_RAY_BOUND[name]}"), name)
    raise AttributeError(f"module 'rollart.weights' has no attribute {name!r}")
