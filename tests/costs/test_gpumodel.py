"""GPU model names, read one way: a trace's codes and a fleet's full names are the same models."""

from __future__ import annotations

import pytest

from costs.model import Params
from costs.trace import gpu_spec
from inventory.gpumodel import model_key, same_model


@pytest.mark.parametrize(("name", "key"), [
    ("Tesla T4", "T4"), ("T4", "T4"), ("NVIDIA A10", "A10"), ("A10", "A10"),
    ("Tesla V100-SXM2-32GB", "V100M32"), ("V100M32", "V100M32"), ("v100m16", "V100M16"),
    ("Tesla P100-PCIE-16GB", "P100M16"), ("P100", "P100"), ("G2", "G2"),
    ("NVIDIA A100-SXM4-80GB", "A100M80"), ("NVIDIA H100 80GB HBM3", "H100M80"), ("Tesla M60", "M60"),
    ("NVIDIA L40S", "L40S"), ("", ""),
])
def test_a_name_reduces_to_its_model_number_and_memory(name: str, key: str):
    assert model_key(name) == key


def test_a_name_without_memory_is_any_memory_of_its_model_and_numbers_are_whole_words():
    assert same_model("P100", "Tesla P100-PCIE-16GB") and same_model("Tesla P100-PCIE-16GB", "P100")
    assert same_model("V100M32", "Tesla V100-SXM2-32GB") and same_model("T4", "Tesla T4")
    assert not same_model("V100M16", "Tesla V100-SXM2-32GB")
    assert not same_model("A10", "NVIDIA A100-SXM4-40GB") and not same_model("T4", "Tesla P4")
    assert not same_model("", "Tesla T4")


def test_the_trace_and_the_parameters_use_the_same_rule():
    assert gpu_spec("V100M32|Tesla T4") == ("T4", "V100M32")
    params = Params(gpu_memory_by_model={"V100M32": 32, "V100": 24, "T4": 16})
    assert params.gpu_memory("Tesla V100-SXM2-32GB") == 32  # the exact model before the family
    assert params.gpu_memory("Tesla V100-SXM2-16GB") == 24
    assert params.gpu_memory("Tesla T4") == 16 and params.gpu_memory("NVIDIA A10") == params.gpu_memory_gib
