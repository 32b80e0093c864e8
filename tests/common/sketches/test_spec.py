"""Sketch specifications: declarations parse and name their errors, parameters are drawn from the
injected generator with the per-column scaling, a spec's key identifies its release, and a
sketch is checked against the spec it claims."""

from __future__ import annotations

import copy
from typing import Any

import numpy as np
import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches import draw_race, draw_rff
from dpmarket.common.sketches.feature_maps import HISTMap, RACEMap, RFFMap
from dpmarket.common.sketches.marginals import MarginalsMap
from dpmarket.common.sketches.sketch import SketchMechanism
from dpmarket.common.sketches.spec import (
    DEFAULT_DELTA,
    SketchDeclaration,
    SketchSpec,
    mechanism_label,
)
from tests.conftest import sketch_mechanism

DECLARATION: dict[str, Any] = {
    "name": "toy",
    "description": "three columns",
    "mechanism": {"epsilon": 1.0, "epsilon_range": [0.5, 2.0]},
    "columns": [
        {"name": "a", "low": 0, "high": 1},
        {"name": "b", "low": -10, "high": 10},
        {"name": "y", "low": 0, "high": 1, "levels": [0, 1]},
    ],
    "maps": {
        "rff": {"frequencies": 8, "sigma": 0.5},
        "race": {"hashes": 3, "buckets": 5, "width": 0.25},
        "hist": {"bins": [4, 5, 2]},
    },
}


def _declaration(**changes: Any) -> SketchDeclaration:
    data = copy.deepcopy(DECLARATION)
    for key, value in changes.items():
        section, _, name = key.partition(".")
        if name:
            data[section][name] = value
        else:
            data[section] = value
    return SketchDeclaration.from_mapping(data, source="toy.toml")


def _specs(seed: int = 0) -> dict[str, SketchSpec]:
    return {s.kind: s for s in _declaration().draw(np.random.default_rng(seed))}


def _records(n: int = 200, seed: int = 1) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(0, 1, n), rng.uniform(-10, 10, n), rng.integers(0, 2, n)])


@pytest.mark.parametrize(
    ("changes", "names"),
    [
        ({"colour": 1}, ["toy.toml", "colour"]),
        ({"name": "no spaces"}, ["name", "no spaces"]),
        ({"mechanism.noise": "cauchy"}, ["mechanism.noise", "cauchy"]),
        ({"mechanism.delta": 1e-6}, ["Laplace", "delta"]),
        ({"mechanism.epsilon": 3.0}, ["epsilon_range", "3"]),
        ({"mechanism.numerator_share": 1.0}, ["numerator_share"]),
        ({"columns": []}, ["columns"]),
        ({"columns": [{"name": "a", "low": 1, "high": 0}]}, ["low < high"]),
        ({"columns": [{"name": "a", "high": 1}]}, ["column 'a'", "low"]),
        ({"columns": [{"name": "a", "low": 0, "high": 1}] * 2}, ["repeat"]),
        ({"maps": {}}, ["at least one map"]),
        ({"maps": {"rff": {"frequencies": 8}}}, ["maps.rff", "sigma"]),
        ({"maps": {"rff": {"frequencies": 0, "sigma": 1}}}, ["frequencies", ">= 1"]),
        ({"maps": {"race": {"hashes": 2, "buckets": 1, "width": 1}}}, ["buckets", ">= 2"]),
        ({"maps": {"hist": {"bins": [3, 3]}}}, ["bins", "one per column (3)"]),
        ({"maps": {"rff": {"frequencies": 8, "sigma": 1, "scale": "log"}}}, ["scale", "log"]),
        ({"maps": {"hist": {"bins": 3, "scale": "absolute"}}}, ["maps.hist", "scale"]),
        ({"maps": {"pca": {}}}, ["[maps]", "pca"]),
    ],
)
def test_declaration_errors_name_the_source_and_the_key(
    changes: dict[str, Any], names: list[str]
) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        _declaration(**changes)
    for name in names:
        assert name in str(info.value), (name, str(info.value))


def test_gaussian_declarations_default_their_delta() -> None:
    (spec, *_) = _declaration(mechanism={"noise": "gaussian", "epsilon": 1.0}).draw(
        np.random.default_rng(0)
    )
    assert (spec.noise, spec.delta) == ("gaussian", DEFAULT_DELTA)
    with pytest.raises(InvalidArgumentError, match="delta"):
        _declaration(mechanism={"noise": "gaussian", "epsilon": 1.0, "delta": 0.0})
    spec = _declaration(mechanism={"noise": "gaussian", "epsilon": 1.0, "delta": 1e-6}).draw(
        np.random.default_rng(0)
    )[0]
    assert (spec.noise, spec.delta) == ("gaussian", 1e-6)
    assert spec.mechanism_label == "private sketch (RFF, Gaussian)"


def test_an_absolute_scale_leaves_the_columns_in_their_own_units() -> None:
    maps = {
        "rff": {"frequencies": 8, "sigma": 0.5, "scale": "absolute"},
        "race": {"hashes": 3, "buckets": 5, "width": 0.25, "scale": "absolute"},
    }
    specs = {s.kind: s for s in _declaration(maps=maps).draw(np.random.default_rng(7))}
    rng = np.random.default_rng(7)
    rff = draw_rff(3, 8, 0.5, rng)
    race = draw_race(3, 3, 5, 0.25, rng)
    # The kernel exp(-||x - x'||^2 / (2 sigma^2)) in the columns' units, whatever their widths.
    rff_map, race_map = specs["rff"].feature_map, specs["race"].feature_map
    assert isinstance(rff_map, RFFMap) and isinstance(race_map, RACEMap)
    np.testing.assert_allclose(rff_map.omega, rff.omega, rtol=1e-15)
    np.testing.assert_array_equal(race_map.projections, race.projections)
    # A declaration without the key keeps the parameters (and the key) it always had.
    default = _declaration().maps
    assert all("scale" not in params for _, params in default)
    assert ("rff", {**dict(default)["rff"], "scale": "absolute"}) in _declaration(
        maps={**DECLARATION["maps"], "rff": {**DECLARATION["maps"]["rff"], "scale": "absolute"}}
    ).maps
    assert _specs(seed=7)["rff"].key != specs["rff"].key


def test_draw_scales_each_column_by_its_width_from_the_injected_generator() -> None:
    specs = _specs(seed=7)
    assert [s.name for s in _declaration().draw(np.random.default_rng(7))] == [
        "toy/rff",
        "toy/race",
        "toy/hist",
    ]
    width = np.array([1.0, 20.0, 1.0])
    rng = np.random.default_rng(7)
    rff = draw_rff(3, 8, 1.0, rng)
    race = draw_race(3, 3, 5, 0.25, rng)
    rff_map, race_map, hist_map = (specs[k].feature_map for k in ("rff", "race", "hist"))
    assert isinstance(rff_map, RFFMap) and isinstance(race_map, RACEMap)
    assert isinstance(hist_map, HISTMap)
    np.testing.assert_array_equal(rff_map.omega, rff.omega / (0.5 * width))
    np.testing.assert_array_equal(race_map.projections, race.projections / width)
    np.testing.assert_array_equal(race_map.offsets, race.offsets)
    np.testing.assert_array_equal(hist_map.n_bins, [4, 5, 2])
    # Another generator, other parameters; HIST draws nothing.
    other = _specs(seed=8)
    other_rff = other["rff"].feature_map
    assert isinstance(other_rff, RFFMap) and not np.array_equal(other_rff.omega, rff_map.omega)
    assert other["hist"].key == specs["hist"].key


def test_the_key_names_the_release_not_the_listing() -> None:
    spec = _specs()["rff"]
    renamed = SketchSpec(
        name="other/rff",
        feature_map=spec.feature_map,
        domain=spec.domain,
        noise=spec.noise,
        epsilon=0.7,
        epsilon_range=(0.6, 0.8),
        description="another text",
    )
    assert renamed.key == spec.key
    moved = SketchSpec(
        name="toy/rff",
        feature_map=spec.feature_map,
        domain=spec.domain,
        noise=spec.noise,
        epsilon=1.0,
        epsilon_range=(0.5, 2.0),
        numerator_share=0.9,
    )
    assert moved.key != spec.key
    assert _specs(seed=1)["rff"].key != spec.key


def test_mechanism_scales_come_from_the_map_and_the_owners_epsilon() -> None:
    spec = _specs()["race"]
    mech = sketch_mechanism(spec, 0.5)
    assert mech.sum_scale == pytest.approx(3 / (0.98 * 0.5))  # R / epsilon_num
    assert mech.count_scale == pytest.approx(1 / (0.02 * 0.5))
    with pytest.raises(InvalidArgumentError, match=r"outside the range spec toy/race accepts"):
        spec.mechanism(2.5)
    assert mechanism_label("hist", "laplace") == "private sketch (HIST, Laplace)"


def test_a_sketch_is_checked_against_its_spec() -> None:
    specs = _specs()
    noise = SeededNoise(np.random.default_rng(0))
    sketch = sketch_mechanism(specs["rff"], 1.0).release(_records(), noise)
    specs["rff"].check_sketch(sketch)
    with pytest.raises(InvalidArgumentError, match="feature map is not the one of spec toy/race"):
        specs["race"].check_sketch(sketch)
    other_map = _specs(seed=3)["rff"]
    with pytest.raises(InvalidArgumentError, match="parameters differ"):
        other_map.check_sketch(sketch)
    narrow = SketchSpec(
        name="toy/rff",
        feature_map=specs["rff"].feature_map,
        domain=specs["rff"].domain,
        noise="laplace",
        epsilon=0.5,
        epsilon_range=(0.1, 0.5),
    )
    with pytest.raises(InvalidArgumentError, match=r"epsilon = 1 is outside"):
        narrow.check_sketch(sketch)
    split = SketchMechanism(
        specs["rff"].feature_map, specs["rff"].domain, 1.0, "laplace", numerator_share=0.5
    ).release(_records(), noise)
    with pytest.raises(InvalidArgumentError, match="numerator_share"):
        specs["rff"].check_sketch(split)


def test_a_marginals_map_is_declared_with_its_own_delta() -> None:
    base = {
        "name": "m",
        "columns": [
            {"name": "wage", "low": 1.0, "high": 100.0},
            {"name": "k", "low": 0, "high": 2, "levels": [0, 1, 2]},
        ],
    }
    declaration = SketchDeclaration.from_mapping(
        {
            **base,
            "maps": {
                "marginals": {
                    "bins": 5,
                    "rounds": 2,
                    "measurements": 1,
                    "delta": 1e-7,
                    "cuts": {"wage": [10.0, 20.0]},
                }
            },
        }
    )
    (spec,) = declaration.draw(np.random.default_rng(0))
    assert (spec.name, spec.noise, spec.delta) == ("m/marginals", "gaussian", 1e-7)
    assert isinstance(spec.feature_map, MarginalsMap)
    assert spec.feature_map.block_sizes.tolist() == [3, 3]
    assert spec.mechanism_label == "private sketch (MARGINALS, Gaussian)"
    # Neither the map nor the (Laplace) declaration gives a delta: the default one.
    (spec,) = SketchDeclaration.from_mapping(
        {**base, "maps": {"marginals": {"bins": 5, "rows": 20_000}}}
    ).draw(np.random.default_rng(0))
    assert (spec.noise, spec.delta) == ("gaussian", DEFAULT_DELTA)
    assert isinstance(spec.feature_map, MarginalsMap)
    assert (spec.feature_map.measurements, spec.feature_map.rows) == (0, 20_000)
    with pytest.raises(InvalidArgumentError, match=r"increase strictly"):
        SketchDeclaration.from_mapping(
            {**base, "maps": {"marginals": {"bins": 5, "delta": 1e-6, "cuts": {"wage": [200.0]}}}}
        )
    with pytest.raises(InvalidArgumentError, match=r"unknown key"):
        SketchDeclaration.from_mapping(
            {**base, "maps": {"marginals": {"bins": 5, "delta": 1e-6, "sigma": 1}}}
        )


def test_rff_frequencies_beyond_the_angle_limit_on_the_domain_are_refused() -> None:
    spec = _specs()["rff"]
    fmap = spec.feature_map
    assert isinstance(fmap, RFFMap)
    crafted = RFFMap(fmap.omega * 1e12, fmap.sigma)
    with pytest.raises(InvalidArgumentError, match=r"reaches an angle of .* beyond the limit"):
        SketchSpec(
            name="toy/rff",
            feature_map=crafted,
            domain=spec.domain,
            noise=spec.noise,
            epsilon=1.0,
            epsilon_range=(0.5, 2.0),
        )
