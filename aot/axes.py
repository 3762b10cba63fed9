"""How a family's variants differ (aot/family.py's vocabulary): the Choices
(a named set of values one concept takes, a C++ enum each in the generated
family_args.h), the choices several families share, a family's Axis of one
Choice, and Where, a condition on a variant's axis values."""
from __future__ import annotations

import re
from dataclasses import dataclass


@dataclass(frozen=True)
class Choice:
    """A named set of values one concept takes, shared by every family whose
    variants differ by it (one name per concept): a C++ `enum class` of that
    name in the generated family_args.h, an enumerator per value in this
    order (k + the value in CamelCase: "gpt_oss" -> kGptOss)."""
    name: str  # CamelCase
    values: tuple  # lower-case words, digits and '_' / 'x' ("row", "1x128", "gpt_oss")

    def __post_init__(self):
        if not re.fullmatch(r"[A-Z][A-Za-z0-9]*", self.name):
            raise ValueError(f"choice {self.name!r}: its name must be CamelCase")
        if not self.values or len(set(self.values)) != len(self.values) or not all(
                re.fullmatch(r"[a-z0-9][a-z0-9_]*", v) for v in self.values):
            raise ValueError(f"choice {self.name}: values {self.values} must be distinct "
                             "lower-case words")

    def code(self, value: str) -> int:
        """The value's index: its C++ enumerator's value, and what a kernel
        parameter of this Choice (Param role "choice") carries."""
        return self.values.index(value)

    def enumerator(self, value: str) -> str:
        return "k" + "".join(part[:1].upper() + part[1:] for part in value.split("_"))


# The choices more than one family takes.  A matrix operand [R, C] as the
# product reads it is row-major (element (r, c) at r * ld + c) or
# column-major (at c * ld + r: a transposed view of a row-major [C, R]).
MAJOR = Choice("Major", ("row", "column"))
# How gu's 2I columns hold the gate and up halves: gate columns then up
# columns, or gate, up, gate, ... (gpt-oss).
GATE_UP = Choice("GateUp", ("concatenated", "interleaved"))
# act(gate, up): silu(gate) * up, or gpt-oss's clamped form (kernels/swiglu.py).
# Chosen at run time in every family (a Param of role "choice"): both forms
# share one kernel's code, so the activation does not double the variants.
ACTIVATION = Choice("Activation", ("swiglu", "gpt_oss"))


@dataclass(frozen=True)
class Axis:
    """One way a family's variants differ: a name (a C++ field of the
    family's Axes struct, the key of the manifest's `axes`) and its Choice;
    `only`: the Choice's values the family compiles, where not all (a value
    left out has no kernel: the runtime reports none for it)."""
    name: str  # snake_case
    choice: Choice
    only: tuple = ()

    def __post_init__(self):
        if not set(self.only) <= set(self.choice.values):
            raise ValueError(f"axis {self.name}: {self.only} are not all values of "
                             f"{self.choice.name} {self.choice.values}")

    @property
    def values(self) -> tuple:
        """The values compiled, in the Choice's order."""
        return tuple(v for v in self.choice.values if not self.only or v in self.only)


class Where:
    """A condition on a variant's axis values: each axis named has the value
    given.  Where() holds for every variant."""

    def __init__(self, **values: str):
        self.values = dict(sorted(values.items()))

    def holds(self, values: dict) -> bool:
        return all(values[name] == value for name, value in self.values.items())

    def check(self, family: str, axes: tuple) -> None:
        choices = {axis.name: axis.choice for axis in axes}
        for name, value in self.values.items():
            if name not in choices or value not in choices[name].values:
                raise ValueError(f"family {family}: {self} names no axis value of "
                                 f"{sorted(choices)}")

    def __eq__(self, other) -> bool:
        return isinstance(other, Where) and self.values == other.values

    def __hash__(self) -> int:
        return hash(tuple(self.values.items()))

    def __repr__(self) -> str:
        return "Where(" + ", ".join(f"{n}={v!r}" for n, v in self.values.items()) + ")"


EVERY = Where()
