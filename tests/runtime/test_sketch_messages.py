"""The catalogue's messages: sketches and specs cross the wire exactly, and a receiver refuses
whatever does not match its own public parameters."""

from __future__ import annotations

import numpy as np
import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.sketch import PrivateSketch, SketchMechanism
from dpmarket.common.sketches.spec import PublishedSketch, SketchDeclaration, SketchSpec
from dpmarket.runtime import sketch_messages as msg
from dpmarket.v1 import sketch_pb2
from tests.conftest import sketch_mechanism

DECLARATION = SketchDeclaration.from_mapping(
    {
        "name": "wire",
        "mechanism": {"noise": "gaussian", "epsilon": 1.0, "delta": 1e-6},
        "columns": [
            {"name": "a", "low": -1, "high": 1},
            {"name": "y", "low": 0, "high": 1, "levels": [0, 1]},
        ],
        "maps": {
            "rff": {"frequencies": 6, "sigma": 0.3},
            "race": {"hashes": 2, "buckets": 4, "width": 0.5},
            "hist": {"bins": 3},
        },
    }
)


@pytest.fixture(scope="module")
def specs() -> list[SketchSpec]:
    return list(DECLARATION.draw(np.random.default_rng(0)))


def _records() -> np.ndarray:
    rng = np.random.default_rng(2)
    return np.column_stack([rng.uniform(-1, 1, 50), rng.integers(0, 2, 50)])


def test_specs_and_sketches_round_trip_bit_for_bit(specs: list[SketchSpec]) -> None:
    for spec in specs:
        back = msg.spec_from_bytes(msg.spec_bytes(spec))
        assert back.key == spec.key and back.name == spec.name
        assert back.feature_map == spec.feature_map and back.domain == spec.domain
        sketch = sketch_mechanism(spec).release(_records(), SeededNoise(np.random.default_rng(3)))
        again = msg.sketch_from_bytes(msg.sketch_bytes(sketch))
        assert isinstance(again, PrivateSketch)
        assert again.noisy_sum.tobytes() == sketch.noisy_sum.tobytes()
        assert again.noisy_count == sketch.noisy_count
        assert again.mechanism.sum_scale == sketch.mechanism.sum_scale
        spec.check_sketch(again)
        entry = PublishedSketch("owner-0", spec.name, 1.7e9 + 0.25, sketch)
        read = msg.published_from_proto(msg.published_to_proto(entry))
        assert (read.owner, read.spec) == ("owner-0", spec.name)
        assert read.published_at == pytest.approx(1.7e9 + 0.25, abs=1e-6)


def test_a_receiver_recomputes_the_scales_and_the_key(specs: list[SketchSpec]) -> None:
    spec = specs[0]
    sketch = sketch_mechanism(spec).release(_records(), SeededNoise(np.random.default_rng(3)))
    message = msg.sketch_to_proto(sketch)
    message.mechanism.sum_scale *= 0.5  # a sender claiming less noise than epsilon implies
    with pytest.raises(InvalidArgumentError, match="sum_scale"):
        msg.sketch_from_proto(message)
    message = msg.sketch_to_proto(sketch)
    message.noisy_sum.data = message.noisy_sum.data[:-8]
    with pytest.raises(InvalidArgumentError, match="noisy_sum"):
        msg.sketch_from_proto(message)
    message = msg.sketch_to_proto(sketch)
    message.mechanism.feature_map.ClearField("rff")
    with pytest.raises(InvalidArgumentError, match="feature map is missing"):
        msg.sketch_from_proto(message)
    tampered = msg.spec_to_proto(spec)
    tampered.domain.columns[0].high = 2.0
    with pytest.raises(InvalidArgumentError, match="key received"):
        msg.spec_from_proto(tampered)


def test_only_private_sketches_travel(specs: list[SketchSpec]) -> None:
    spec = specs[2]
    exact = SketchMechanism(spec.feature_map, spec.domain, np.inf, "none").release(_records())
    with pytest.raises(InvalidArgumentError, match="only private sketches travel"):
        msg.sketch_to_proto(exact)
    message = msg.sketch_to_proto(
        sketch_mechanism(spec).release(_records(), SeededNoise(np.random.default_rng(1)))
    )
    message.mechanism.noise = sketch_pb2.SKETCH_NOISE_UNSPECIFIED
    with pytest.raises(InvalidArgumentError, match="noise is missing"):
        msg.sketch_from_proto(message)


def test_a_marginals_sketch_crosses_the_wire_exactly() -> None:
    from dpmarket.common.sketches.domain import Domain
    from dpmarket.common.sketches.marginals import (
        MarginalsMechanism,
        MarginalsSketch,
        marginals_map,
    )

    domain = Domain(
        np.zeros(2), np.array([1.0, 2.0]), names=("a", "k"), levels=(None, np.arange(3.0))
    )
    # Derived selection settings (measurements and rounds 0) and declared rows cross too.
    mech = MarginalsMechanism(marginals_map(domain, 4, rows=200), domain, 1.0, 1e-6)
    rng = np.random.default_rng(0)
    x = np.column_stack([rng.random(200), rng.integers(0, 3, 200)]).astype(float)
    sketch = mech.release(x, rng=rng)
    back = msg.sketch_from_bytes(msg.sketch_bytes(sketch))
    assert isinstance(back, MarginalsSketch)
    assert back.mechanism.feature_map == sketch.mechanism.feature_map
    assert back.mechanism.feature_map.rows == 200 and back.mechanism.measurements == 1
    assert [m.clique for m in back.measurements] == [m.clique for m in sketch.measurements]
    for a, b in zip(back.measurements, sketch.measurements, strict=True):
        assert a.values.tobytes() == b.values.tobytes() and a.sigma == b.sigma
    assert back.selections == sketch.selections
    # A receiver refuses a release that spends more than its (epsilon, delta).
    message = msg.sketch_to_proto(sketch)
    message.marginals.measurements[0].sigma /= 3
    with pytest.raises(InvalidArgumentError, match="spends rho"):
        msg.sketch_from_proto(message)


def test_a_domain_s_integer_columns_cross_the_wire() -> None:
    """Which columns hold whole numbers crosses with the domain (a consumer reads a histogram's
    bins by it); a domain without any reads back without any. The two compare equal: the mark
    changes nothing a sketch holds, so a sketch published without it still matches its spec."""
    from dpmarket.common.sketches.domain import Domain

    ints = Domain(np.zeros(2), np.array([10.0, 1.0]), names=("k", "x"), integers=(True, False))
    back = msg.domain_from_proto(msg.domain_to_proto(ints))
    assert back == ints and back.is_integer(0) and not back.is_integer(1)
    plain = Domain(np.zeros(2), np.array([10.0, 1.0]), names=("k", "x"))
    again = msg.domain_from_proto(msg.domain_to_proto(plain))
    assert again == plain and not again.integers and again == ints
