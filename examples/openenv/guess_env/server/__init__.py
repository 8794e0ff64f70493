# Copyright (c) Meta Platforms, Inc. and affiliates.
# All rights reserved.
#
# This source code is licensed under the BSD-style license found in the
# LICENSE file in the root directory of this source tree.

"""Guess Env environment server components."""

from .guess_env_environment import GuessEnvironment

__all__ = ["GuessEnvironment"]
