"""The registry: registration, lookup errors and building with options."""

from __future__ import annotations

import pytest

from candor.errors import CandorError
from candor.registry import Registry


def test_register_get_build_and_errors():
    reg: Registry[type] = Registry("widget")

    @reg.register("pair")
    class Pair:
        def __init__(self, a: int = 1, b: int = 2) -> None:
            self.total = a + b

    assert reg.get("pair") is Pair and "pair" in reg and reg.names() == ["pair"]
    assert reg.build("pair", a=5).total == 7
    with pytest.raises(CandorError, match=r"unknown widget 'nope'; known: pair"):
        reg.get("nope")
    with pytest.raises(CandorError, match=r"widget 'pair': bad options \['c'\]"):
        reg.build("pair", c=3)
    with pytest.raises(ValueError, match="registered twice"):
        reg.register("pair")(Pair)
