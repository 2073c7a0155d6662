"""The folders are the layers: ``ppmix.inference`` is the public face of three of them, each name loading on first
use from the folder that holds it."""

from __future__ import annotations

import pytest

import ppmix.inference

#: the folders behind ppmix.inference, one per layer (lint-imports checks the order)
LAYERS = ("ppmix.algorithms.", "ppmix.engines.", "ppmix.optimizers.")


@pytest.mark.parametrize("name", ppmix.inference.__all__)
def test_every_public_inference_name_loads_from_its_layer(name):
    value = getattr(ppmix.inference, name)
    assert value.__module__.startswith(LAYERS), f"{name} comes from {value.__module__}"
