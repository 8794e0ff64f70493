"""The bucketed, versioned weight store (docs/architecture.md §6, the six-step sync).

The trainer publishes each version's weights in buckets of numpy bytes to the Ray object store through a
`StorePublisher`; a named store actor keeps the refs of the last `weights.keep_versions` versions;
inference workers pull the newest version in the background through a `StoreSubscriber` and swap it in at
the next suspend. The driver builds both ends from one `WeightStore(cfg.weights)`.
"""

from rollart.weights.buckets import Bucket, TensorMeta, pack, unpack
from rollart.weights.client import WeightStore
from rollart.weights.publisher import StorePublisher
from rollart.weights.subscriber import StoreSubscriber
from rollart.weights.timing import PUBLISH, PULL

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
