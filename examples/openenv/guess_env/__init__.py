# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Guess Env Environment."""

from .client import GuessEnv
from .models import GuessAction, GuessObservation

__all__ = [
    "GuessAction",
    "GuessObservation",
    "GuessEnv",
]
