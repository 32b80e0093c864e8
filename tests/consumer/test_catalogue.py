"""Which spec a consumer's question reads when it names none: in a deployment made by
``dpmarket init`` the catalogue holds two declarations, the allocation's (features only, read
by the curator's summaries) and the one over every column, and a question means the latter."""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.common.sketches.spec import SketchDeclaration, SketchSpec
from dpmarket.consumer.catalogue import SpecChoiceError, choose_spec

COLUMNS = [
    {"name": "age", "low": 0, "high": 120},
    {"name": "bmi", "low": 10, "high": 70},
    {"name": "high", "low": 0, "high": 1, "levels": [0, 1]},
]


def _specs(
    name: str, columns: list[dict[str, object]], maps: dict[str, object]
) -> list[SketchSpec]:
    declaration = SketchDeclaration.from_mapping({"name": name, "columns": columns, "maps": maps})
    return list(declaration.draw(np.random.default_rng(0)))


class _Catalogue:
    """The part of the curator's catalogue ``choose_spec`` reads."""

    def __init__(self, specs: list[SketchSpec], allocation: str | None) -> None:
        self.specs, self.allocation = specs, allocation

    def sketch_catalogue(self) -> tuple[list[SketchSpec], str | None]:
        return self.specs, self.allocation

    def sketch_spec(self, name: str) -> SketchSpec:
        return next(s for s in self.specs if s.name == name)


SPECS = [
    *_specs("clinics", COLUMNS, {"rff": {"frequencies": 20, "sigma": 0.5}, "hist": {"bins": 5}}),
    *_specs("clinics-allocation", COLUMNS[:2], {"rff": {"frequencies": 20, "sigma": 0.5}}),
]


def test_a_question_naming_no_spec_reads_the_declaration_besides_the_allocations() -> None:
    catalogue = _Catalogue(SPECS, "clinics-allocation/rff")
    assert choose_spec(catalogue, None, kind="rff").name == "clinics/rff"
    assert choose_spec(catalogue, "clinics-allocation/rff", kind="rff").name == (
        "clinics-allocation/rff"
    )  # named, it is read
    # Alone, the allocation's declaration is the only one.
    alone = _Catalogue(
        [s for s in SPECS if s.name.startswith("clinics-")], "clinics-allocation/rff"
    )
    assert choose_spec(alone, None, kind="rff").name == "clinics-allocation/rff"
    # Control: a curator that names no allocation spec leaves two RFF specs to choose from.
    with pytest.raises(SpecChoiceError, match="clinics/rff, clinics-allocation/rff"):
        choose_spec(_Catalogue(SPECS, None), None, kind="rff")
