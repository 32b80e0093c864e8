"""The CAPE and secure-aggregation messages: every valid domain object crosses the wire exactly
(floats bit for bit, -0.0 and subnormals included), and every ``*_from_proto`` refuses malformed
input with :class:`~dpmarket.common.errors.InvalidArgumentError`.

Each round trip goes through the serialized bytes, as a message does between two services.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np
import pytest
from google.protobuf.message import Message
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from dpmarket.common.cape.agreement import SizeAttestation
from dpmarket.common.cape.spec import (
    INTERCEPT,
    MAX_MAGNITUDE,
    CapeJobSpec,
    CapeMeanSpec,
    CapeTrainingSpec,
)
from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.secagg.fixedpoint import MAX_MODULUS_BITS, MAX_RESOLUTION_BITS, FixedPoint
from dpmarket.common.secagg.protocol import (
    ROUND_ID_BYTES,
    KeyAdvertisement,
    RoundParams,
    SecAggAggregator,
    SecAggError,
    UnmaskResponse,
)
from dpmarket.common.secagg.shamir import PRIME, Share
from dpmarket.common.validation import PARAMETER_FLOOR
from dpmarket.runtime import cape_messages as msg
from dpmarket.v1 import array_pb2, cape_pb2, secure_aggregation_pb2

M = TypeVar("M", bound=Message)

#: Modest and deadline-free: the file runs in a few seconds on a shared machine.
FAST = settings(max_examples=25, deadline=None)


def wire(message: M) -> M:
    """The message as the peer parses it from the bytes on the wire."""
    return type(message).FromString(message.SerializeToString())


def exact(value: Any) -> Any:
    """A comparable image of ``value`` that tells floats apart bit for bit (-0.0 from 0.0) and
    keeps the types of dataclasses, arrays and containers."""
    if isinstance(value, float):
        return ("float", value.hex())
    if isinstance(value, bool | int | str | bytes | None):
        return (type(value).__name__, value)
    if isinstance(value, np.ndarray):
        return ("ndarray", value.dtype.str, value.shape, value.tobytes())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        fields = [(f.name, exact(getattr(value, f.name))) for f in dataclasses.fields(value)]
        return (type(value).__name__, fields)
    if isinstance(value, dict):
        return ("dict", sorted((exact(k), exact(v)) for k, v in value.items()))
    if isinstance(value, tuple | list):
        return (type(value).__name__, [exact(v) for v in value])
    raise TypeError(f"no exact image of {type(value).__name__}")


# ----------------------------------------------------------------------------------- strategies
names = st.text(st.characters(codec="utf-8"), min_size=1, max_size=12).filter(
    lambda s: s != INTERCEPT
)
#: Finite floats of every magnitude: -0.0, subnormals (5e-324), the largest (1.797e308).
finite = st.floats(allow_nan=False, allow_infinity=False)
positive = st.floats(min_value=0.0, exclude_min=True, allow_infinity=False)
#: The numbers a spec may hold (bounds, clip, learning rate): 0 (either sign) or of magnitude
#: within [PARAMETER_FLOOR, MAX_MAGNITUDE] (dpmarket.common.cape.spec).
_magnitudes = st.floats(min_value=PARAMETER_FLOOR, max_value=MAX_MAGNITUDE)
spec_numbers = st.sampled_from([0.0, -0.0]) | _magnitudes | _magnitudes.map(lambda x: -x)
spec_positive = _magnitudes
deltas = st.floats(min_value=0.0, max_value=1.0, exclude_min=True, exclude_max=True)
#: S_C: None (the default, unset on the wire) or any count, 0 included (set on the wire).
colluders = st.none() | st.integers(0, 2**62)
calibrations = st.sampled_from(["exact", "theorem1"])


@st.composite
def bounds(draw: st.DrawFn) -> tuple[float, float]:
    a, b = draw(spec_numbers), draw(spec_numbers)
    if a == b:  # 0.0 == -0.0 too
        if a == 0:
            b = PARAMETER_FLOOR
        else:  # one step away from 0, so |b| stays at least PARAMETER_FLOOR (-1e-20 included)
            b = math.nextafter(a, math.copysign(math.inf, a))
            if abs(b) > MAX_MAGNITUDE:
                b = math.nextafter(a, 0.0)
    return (a, b) if a < b else (b, a)


@st.composite
def columns(draw: st.DrawFn, size: int, *reserved: str) -> tuple[tuple[str, float, float], ...]:
    distinct = st.lists(names, min_size=size, max_size=size, unique=True)
    taken = draw(distinct.filter(lambda ns: not set(ns) & set(reserved)))
    return tuple((name, *draw(bounds())) for name in taken)


@st.composite
def job_specs(draw: st.DrawFn) -> CapeJobSpec:
    cols = draw(st.integers(2, 6).flatmap(lambda k: columns(k)))
    return CapeJobSpec(
        task=draw(st.sampled_from(["linear", "logistic"])),
        features=cols[:-1],
        target=cols[-1],
        epsilon=draw(positive),
        delta=draw(deltas),
        colluders=draw(colluders),
        calibration=draw(calibrations),
        fit_intercept=draw(st.booleans()),
    )


@st.composite
def mean_specs(draw: st.DrawFn) -> CapeMeanSpec:
    return CapeMeanSpec(
        draw(st.integers(1, 5).flatmap(lambda k: columns(k))),
        draw(positive),
        draw(deltas),
        draw(colluders),
        draw(calibrations),
    )


@st.composite
def training_specs(draw: st.DrawFn) -> CapeTrainingSpec:
    target = draw(names)
    return CapeTrainingSpec(
        features=draw(st.integers(1, 5).flatmap(lambda k: columns(k, target))),
        target=target,
        epsilon=draw(positive),
        delta=draw(deltas),
        iterations=draw(st.integers(1, 2**62)),
        learning_rate=draw(spec_positive),
        hidden=draw(st.integers(1, 2**62)),
        clip=draw(spec_positive),
        colluders=draw(colluders),
    )


#: Sparse (SecAgg+) graphs meeting the 2^-40 target: (sites, colluders, allowance, neighbours),
#: from dpmarket.common.secagg.graph.min_neighbours (too slow to search per example).
SPARSE = [(5, 0, 1, 3), (8, 1, 1, 5), (10, 2, 1, 7), (12, 4, 1, 9), (20, 5, 1, 8)]


@st.composite
def rounds(draw: st.DrawFn) -> tuple[str, RoundParams]:
    sparse = draw(st.booleans())
    if sparse:
        n, c, allowance, k = draw(st.sampled_from(SPARSE))
        threshold = 0
    else:
        n = draw(st.integers(2, 12))
        c = draw(st.integers(0, n - 1))
        threshold = draw(st.integers(max(2, (n + c) // 2 + 1), n))
        allowance = k = 0
    sites = draw(st.lists(names, min_size=n, max_size=n, unique=True))
    resolution = draw(
        st.integers(1, min(MAX_RESOLUTION_BITS, MAX_MODULUS_BITS - (n - 1).bit_length()))
    )
    params = RoundParams(
        round_id=draw(st.binary(min_size=ROUND_ID_BYTES, max_size=64)),
        sites=tuple(sites),
        threshold=threshold,
        vector_length=draw(st.integers(1, 2**40)),
        fixed_point=FixedPoint(draw(positive), resolution, n),
        colluders=c,
        neighbours=k,
        allowance=allowance,
    )
    return draw(st.text(max_size=64)), params


keys = st.binary(min_size=32, max_size=32)
advertisements = st.builds(
    KeyAdvertisement,
    site=names,
    c_public=keys,
    s_public=keys,
    signature=st.binary(min_size=64, max_size=72),  # P-256 ECDSA (DER) or Ed25519
    commitment=st.just(b"") | keys,
)
certificates = st.binary(min_size=1, max_size=1200)
shares = st.builds(Share, x=st.integers(1, 2**32 - 1), y=st.integers(0, PRIME - 1) | st.just(0))
share_maps = st.dictionaries(names, shares, max_size=6)
attestations = st.builds(
    SizeAttestation,
    site=names,
    rows=st.integers(1, 2**62),
    signature=st.binary(min_size=64, max_size=72),
)


# --------------------------------------------------------------------------- specs round trip
@FAST
@given(st.one_of(job_specs(), mean_specs()))
def test_one_release_specs_round_trip(spec: CapeJobSpec | CapeMeanSpec) -> None:
    back = msg.spec_from_proto(wire(msg.spec_to_proto(spec)))
    assert exact(back) == exact(spec)


@FAST
@given(training_specs())
def test_training_specs_round_trip(spec: CapeTrainingSpec) -> None:
    back = msg.training_from_proto(wire(msg.training_to_proto(spec)))
    assert exact(back) == exact(spec)


@FAST
@given(st.one_of(job_specs(), mean_specs(), training_specs()))
def test_any_job_round_trips_in_its_open_request(
    spec: CapeJobSpec | CapeMeanSpec | CapeTrainingSpec,
) -> None:
    request = cape_pb2.OpenCapeJobRequest(job_id="job")
    msg.job_to_proto(request, spec)
    assert request.WhichOneof("job") == ("training" if spec.task == "train" else "spec")
    assert exact(msg.job_from_proto(wire(request))) == exact(spec)


def test_edge_values_cross_exactly() -> None:
    # The extremes a spec's bounds may hold (0 or a magnitude within [PARAMETER_FLOOR,
    # MAX_MAGNITUDE]); epsilon may be any positive float.
    tiny, huge = PARAMETER_FLOOR, MAX_MAGNITUDE
    spec = CapeJobSpec(
        "linear",
        (("a", -0.0, tiny), ("b", -huge, huge)),
        ("y", -tiny, 0.0),
        epsilon=5e-324,
        delta=math.nextafter(1.0, 0.0),
        colluders=2**62,
    )
    assert exact(msg.spec_from_proto(wire(msg.spec_to_proto(spec)))) == exact(spec)
    assert math.copysign(1.0, msg.spec_from_proto(msg.spec_to_proto(spec)).features[0][1]) == -1


@pytest.mark.parametrize(
    "spec",
    [
        CapeMeanSpec((("a", 0.0, 1.0),), 1.0, 1e-6, colluders=0),
        CapeJobSpec("linear", (("a", 0.0, 1.0),), ("y", 0.0, 1.0), 1.0, 1e-6, colluders=0),
        CapeTrainingSpec((("a", 0.0, 1.0),), "y", 1.0, 1e-6, 1, 0.1, 2, 1.0, colluders=0),
    ],
)
def test_an_explicit_zero_colluders_crosses_the_wire_as_zero_and_none_as_unset(
    spec: CapeMeanSpec | CapeJobSpec | CapeTrainingSpec,
) -> None:
    """S_C = 0 (``--colluders 0``) is a valid ask, not the default: it is set on the wire and
    comes back 0; the default (``None``) is unset and comes back ``None``, as an old sender's
    unset field does."""
    request = cape_pb2.OpenCapeJobRequest()
    msg.job_to_proto(request, spec)
    sent = request.training if isinstance(spec, CapeTrainingSpec) else request.spec
    assert sent.HasField("colluders") and sent.colluders == 0
    assert msg.job_from_proto(wire(request)).colluders == 0

    default = cape_pb2.OpenCapeJobRequest()
    msg.job_to_proto(default, dataclasses.replace(spec, colluders=None))
    unset = default.training if isinstance(spec, CapeTrainingSpec) else default.spec
    assert not unset.HasField("colluders")
    assert msg.job_from_proto(wire(default)).colluders is None
    # The explicit 0 costs two bytes on the wire: the encodings differ, so a receiver can tell.
    assert request.SerializeToString() != default.SerializeToString()


# ------------------------------------------------------------------------ specs: malformed
def _apply(message: Message, changes: dict[str, Any]) -> None:
    """Set fields (a submessage by copy; ``None`` clears the field)."""
    for field, value in changes.items():
        if value is None:
            message.ClearField(field)
        elif isinstance(value, Message):
            getattr(message, field).CopyFrom(value)
        else:
            setattr(message, field, value)


def _regression(**changes: Any) -> cape_pb2.CapeSpec:
    message = msg.spec_to_proto(
        CapeJobSpec("linear", (("a", 0.0, 1.0), ("b", -1.0, 1.0)), ("y", 0.0, 2.0), 1.0, 1e-6)
    )
    _apply(message, changes)
    return message


def _mean(**changes: Any) -> cape_pb2.CapeSpec:
    message = msg.spec_to_proto(CapeMeanSpec((("a", 0.0, 1.0), ("b", -1.0, 1.0)), 1.0, 1e-6))
    _apply(message, changes)
    return message


def _bound(column: str, low: float, high: float) -> cape_pb2.ColumnBound:
    return cape_pb2.ColumnBound(column=column, low=low, high=high)


def _features(*bounds: cape_pb2.ColumnBound) -> Callable[[Any], None]:
    def set_features(message: Any) -> None:
        del message.features[:]
        message.features.extend(bounds)

    return set_features


NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (_regression(task=cape_pb2.CAPE_TASK_UNSPECIFIED), "task must be"),
        (_regression(task=99), "task must be"),
        (_regression(calibration=99), "unknown calibration"),
        (_regression(colluders=-1), "colluders must be >= 0"),
        (_regression(epsilon=0.0), "epsilon"),
        (_regression(epsilon=NAN), "epsilon"),
        (_regression(epsilon=INF), "epsilon"),
        (_regression(epsilon=-1.0), "epsilon"),
        (_regression(delta=0.0), "delta"),
        (_regression(delta=1.0), "delta"),
        (_regression(delta=NAN), "delta"),
        (_regression(target=None), "named"),  # missing target
        (_regression(target=cape_pb2.ColumnBound(column="y")), "low < high"),  # missing bounds
        (_regression(target=_bound("", 0.0, 1.0)), "named"),
        (_regression(target=_bound("a", 0.0, 1.0)), "distinct"),
        (_regression(target=_bound("y", 1.0, 1.0)), "low < high"),
        (_regression(target=_bound("y", 0.0, NAN)), "low < high"),
        (_regression(target=_bound(INTERCEPT, 0.0, 1.0)), "distinct"),
        (_mean(target=_bound("y", 0.0, 1.0)), "no target"),
        (_mean(target=_bound("", 0.0, 1.0)), "no target"),
        (_mean(fit_intercept=True), "no intercept"),
        (_mean(delta=-0.5), "delta"),
    ],
)
def test_a_malformed_spec_is_invalid_argument(message: cape_pb2.CapeSpec, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        msg.spec_from_proto(wire(message))


@pytest.mark.parametrize("make", [_regression, _mean])
@pytest.mark.parametrize(
    ("features", "match"),
    [
        ((), "at least one"),
        ((_bound("", 0.0, 1.0),), "named"),
        ((_bound("a", 0.0, 1.0), _bound("a", 0.0, 2.0)), "distinct"),
        ((_bound("a", 1.0, 0.0),), "low < high"),
        ((_bound("a", -INF, 0.0),), "low < high"),
        ((_bound("a", 0.0, NAN),), "low < high"),
        ((_bound(INTERCEPT, 0.0, 1.0),), "distinct"),
    ],
)
def test_malformed_columns_are_invalid_argument(
    make: Callable[..., cape_pb2.CapeSpec], features: tuple[cape_pb2.ColumnBound, ...], match: str
) -> None:
    message = make()
    _features(*features)(message)
    with pytest.raises(InvalidArgumentError, match=match):
        msg.spec_from_proto(wire(message))


def _training(**changes: Any) -> cape_pb2.CapeTrainingSpec:
    spec = CapeTrainingSpec((("a", 0.0, 1.0),), "y", 1.0, 1e-6, 10, 0.5, 4, 1.0, colluders=1)
    message = msg.training_to_proto(spec)
    for field, value in changes.items():
        if callable(value):
            value(message)
        else:
            setattr(message, field, value)
    return message


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (_training(colluders=-1), "colluders must be >= 0"),
        (_training(iterations=0), "iterations"),
        (_training(iterations=-3), "iterations"),
        (_training(hidden_units=0), "hidden"),
        (_training(learning_rate=0.0), "learning_rate"),
        (_training(learning_rate=NAN), "learning_rate"),
        (_training(learning_rate=-1.0), "learning_rate"),
        (_training(clip_norm=0.0), "clip"),
        (_training(clip_norm=INF), "clip"),
        (_training(epsilon=0.0), "epsilon"),
        (_training(delta=1.0), "delta"),
        (_training(target=""), "named"),
        (_training(target="a"), "distinct"),
        (_training(features=_features()), "at least one"),
        (_training(features=_features(_bound("b", 2.0, 2.0))), "low < high"),
    ],
)
def test_a_malformed_training_spec_is_invalid_argument(
    message: cape_pb2.CapeTrainingSpec, match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        msg.training_from_proto(wire(message))
    request = cape_pb2.OpenCapeJobRequest(training=message)
    with pytest.raises(InvalidArgumentError, match=match):
        msg.job_from_proto(wire(request))


def test_an_open_request_without_a_job_is_invalid_argument() -> None:
    with pytest.raises(InvalidArgumentError, match="carries no job"):
        msg.job_from_proto(cape_pb2.OpenCapeJobRequest(job_id="job", consumer="consumer:c"))


# ------------------------------------------------------------------------------------ vectors
@FAST
@given(hnp.arrays(np.float64, st.integers(0, 40), elements=finite))
def test_vectors_round_trip_bit_for_bit(values: np.ndarray) -> None:
    back = msg.vector_from_proto(wire(msg.vector_to_proto(values)), "release", values.shape[0])
    assert back.dtype == np.float64 and back.tobytes() == values.tobytes()
    assert msg.vector_from_proto(msg.vector_to_proto(values), "release").tobytes() == (
        values.tobytes()
    )


def test_edge_vector_values_cross_exactly() -> None:
    values = np.array(
        [-0.0, 0.0, 5e-324, -5e-324, 2.2250738585072014e-308, 1.7976931348623157e308, -1.5e308]
    )
    back = msg.vector_from_proto(wire(msg.vector_to_proto(values)), "v", 7)
    assert back.tobytes() == values.tobytes() and np.signbit(back[0])


def _array(dtype: Any, shape: list[int], data: bytes) -> array_pb2.Array:
    return array_pb2.Array(dtype=dtype, shape=shape, data=data)


F64 = array_pb2.DTYPE_FLOAT64
THREE = np.array([1.0, 2.0, 3.0]).tobytes()


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (msg.vector_to_proto(np.zeros(2)), "must have 3 values, got 2"),
        (msg.vector_to_proto(np.zeros(4)), "must have 3 values, got 4"),
        (msg.vector_to_proto(np.array([1.0, np.nan, 0.0])), "NaN or inf"),
        (msg.vector_to_proto(np.array([1.0, -np.inf, 0.0])), "NaN or inf"),
        (_array(F64, [3], THREE[:-1]), "bytes do not hold"),
        (_array(F64, [3], THREE + b"\0"), "bytes do not hold"),
        (_array(F64, [], THREE[:8]), "1-D"),
        (_array(F64, [1, 3], THREE), "1-D"),
        (_array(F64, [-3], THREE), "negative"),
        (_array(F64, [3], b""), "bytes do not hold"),  # data missing
        (_array(array_pb2.DTYPE_UNSPECIFIED, [3], THREE), "float64"),  # dtype missing
        (_array(array_pb2.DTYPE_INT64, [3], np.arange(3).tobytes()), "float64"),
        (_array(array_pb2.DTYPE_FLOAT32, [3], np.ones(3, np.float32).tobytes()), "float64"),
        (_array(77, [3], THREE), "float64 array, got dtype 77"),
    ],
)
def test_a_malformed_vector_is_invalid_argument(message: array_pb2.Array, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        msg.vector_from_proto(wire(message), "release", 3)


# ------------------------------------------------------------------------- secure aggregation
@FAST
@given(rounds())
def test_rounds_round_trip(job_and_params: tuple[str, RoundParams]) -> None:
    job_id, params = job_and_params
    back_job, back = msg.round_from_proto(wire(msg.round_to_proto(job_id, params)))
    assert back_job == job_id
    assert exact(back) == exact(params) and back.digest == params.digest


def _round(**changes: Any) -> secure_aggregation_pb2.SecureAggregationRound:
    params = RoundParams(bytes(range(32)), ("a", "b", "c"), 2, 4, FixedPoint(1.0, 20, 3))
    message = msg.round_to_proto("job", params)
    for field, value in changes.items():
        if isinstance(value, list):
            del getattr(message, field)[:]
            getattr(message, field).extend(value)
        else:
            setattr(message, field, value)
    return message


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (_round(round_id=b""), "round_id"),  # missing
        (_round(round_id=bytes(ROUND_ID_BYTES - 1)), "round_id"),
        (_round(sites=[]), "sites must be"),
        (_round(sites=["a", "a", "b"]), "duplicate site"),
        (_round(sites=["a", "", "b"]), "non-empty"),
        (_round(threshold=0), "threshold"),
        (_round(threshold=1), "threshold"),
        (_round(threshold=4), "threshold"),
        (_round(colluders=-1), "colluders"),
        (_round(colluders=3), "colluders"),
        (_round(colluders=2), "threshold"),  # 2 t > n + S_C fails at t = 2
        (_round(vector_length=0), "vector_length"),
        (_round(vector_length=-5), "vector_length"),
        (_round(clip=0.0), "clip"),
        (_round(clip=NAN), "clip"),
        (_round(clip=-INF), "clip"),
        (_round(resolution_bits=0), "resolution_bits"),
        (_round(resolution_bits=MAX_RESOLUTION_BITS + 1), "resolution_bits"),
        (_round(neighbours=-1), "neighbours"),
        (_round(allowance=-1), "allowance"),
        (_round(allowance=1), "no dropout allowance"),
        (_round(neighbours=2, threshold=0), r"neighbours must lie in \[1, 1\]"),
    ],
)
def test_a_malformed_round_is_invalid_argument(
    message: secure_aggregation_pb2.SecureAggregationRound, match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        msg.round_from_proto(wire(message))


def test_a_round_whose_encoding_the_wire_cannot_carry_is_refused() -> None:
    """``fixed_point.sites`` does not travel (the receiver takes ``len(sites)``): parameters
    with more headroom would arrive with another digest, so the sender refuses them."""
    params = RoundParams(bytes(32), ("a", "b", "c"), 2, 4, FixedPoint(1.0, 20, 5))
    with pytest.raises(InvalidArgumentError, match=r"fixed_point\.sites=5"):
        msg.round_to_proto("job", params)


@FAST
@given(st.lists(st.tuples(advertisements, certificates), max_size=6, unique_by=lambda p: p[0].site))
def test_advertisements_round_trip(pairs: list[tuple[KeyAdvertisement, bytes]]) -> None:
    messages = [wire(msg.advertisement_to_proto(ad, cert)) for ad, cert in pairs]
    for (ad, cert), message in zip(pairs, messages, strict=True):
        assert exact(msg.advertisement_from_proto(message)) == exact((ad, cert))
    ads, certs = msg.advertisements_from_proto(messages)
    assert exact(ads) == exact({ad.site: ad for ad, _ in pairs})
    assert certs == {ad.site: cert for ad, cert in pairs}


def test_advertisements_with_a_site_twice_are_invalid_argument() -> None:
    first = KeyAdvertisement("a", bytes(32), bytes(range(32)), b"s" * 64)
    second = dataclasses.replace(first, c_public=b"\1" * 32)
    messages = [msg.advertisement_to_proto(ad, b"pem") for ad in (first, second)]
    with pytest.raises(InvalidArgumentError, match="two key advertisements of 'a'"):
        msg.advertisements_from_proto(messages)


def test_a_malformed_advertisement_passes_the_wire_and_the_aggregator_refuses_it() -> None:
    """The wire converts field for field; the protocol checks the keys (its documented place):
    a 31-byte key or a missing one reaches it unchanged and fails the round."""
    params = RoundParams(bytes(32), ("a", "b"), 2, 1, FixedPoint(1.0, 8, 2))
    other = KeyAdvertisement("b", b"\2" * 32, b"\3" * 32, b"s" * 64)
    good = KeyAdvertisement("a", bytes(32), bytes(range(32)), b"s" * 64)
    accepted = SecAggAggregator(params).collect_advertisements({"a": good, "b": other})
    assert set(accepted) == {"a", "b"}  # the control: well-formed keys pass
    for bad in (
        dataclasses.replace(good, c_public=bytes(31)),
        dataclasses.replace(good, s_public=b""),
    ):
        ad, _ = msg.advertisement_from_proto(wire(msg.advertisement_to_proto(bad, b"")))
        assert ad == bad
        with pytest.raises(SecAggError, match="bad or repeated key"):
            SecAggAggregator(params).collect_advertisements({"a": ad, "b": other})


@FAST
@given(st.dictionaries(names, keys | st.binary(max_size=40), max_size=6))
def test_nonces_round_trip(nonces: dict[str, bytes]) -> None:
    messages = [wire(m) for m in msg.nonces_to_proto(nonces)]
    assert [m.site for m in messages] == sorted(nonces)
    assert msg.nonces_from_proto(messages) == nonces


def test_a_site_nonce_twice_is_invalid_argument() -> None:
    messages = msg.nonces_to_proto({"a": bytes(32)}) * 2
    with pytest.raises(InvalidArgumentError, match="two graph nonces of 'a'"):
        msg.nonces_from_proto(messages)


@FAST
@given(
    names,
    st.dictionaries(names, st.binary(min_size=32, max_size=32), max_size=6),
    st.lists(st.tuples(names, names, st.binary(max_size=32)), max_size=4),
)
def test_tags_round_trip_from_and_to_a_site(
    me: str, tags: dict[str, bytes], others: list[tuple[str, str, bytes]]
) -> None:
    foreign = [(s, r, t) for s, r, t in others if me not in (s, r)]  # ignored by both readers
    sent = wire_all(msg.tags_to_proto([(me, r, t) for r, t in tags.items()] + foreign))
    assert msg.tags_from_proto(sent, sender=me) == tags
    received = wire_all(msg.tags_to_proto(foreign + [(s, me, t) for s, t in tags.items()]))
    assert msg.tags_from_proto(received, recipient=me) == tags


def wire_all(messages: list[M]) -> list[M]:
    return [wire(m) for m in messages]


def test_malformed_tags_are_invalid_argument() -> None:
    tags = msg.tags_to_proto([("a", "b", b"t" * 32), ("a", "b", b"u" * 32)])
    with pytest.raises(InvalidArgumentError, match="two tags between 'b'"):
        msg.tags_from_proto(tags, sender="a")
    with pytest.raises(InvalidArgumentError, match="two tags between 'a'"):
        msg.tags_from_proto(tags, recipient="b")
    for either in ({}, {"sender": "a", "recipient": "b"}):
        with pytest.raises(InvalidArgumentError, match="the sender or the recipient"):
            msg.tags_from_proto(tags, **either)


@FAST
@given(st.lists(st.tuples(names, names, st.binary(max_size=200)), max_size=6))
def test_ciphertexts_keep_their_triples_in_order(triples: list[tuple[str, str, bytes]]) -> None:
    """Only the sender's side is here: each receiver reads its ciphertexts inline
    (``dpmarket.owner.cape_service``, ``dpmarket.curator.owners``)."""
    messages = wire_all(msg.ciphertexts_to_proto(triples))
    assert [(m.sender, m.recipient, m.ciphertext) for m in messages] == triples


@FAST
@given(share_maps)
def test_shares_round_trip(shares: dict[str, Share]) -> None:
    messages = wire_all(msg.shares_to_proto(shares))
    assert [m.owner for m in messages] == sorted(shares)
    assert msg.shares_from_proto(messages) == shares


def test_edge_shares_round_trip() -> None:
    shares = {"zero": Share(1, 0), "top": Share(2**32 - 1, PRIME - 1), "one": Share(7, 1)}
    messages = msg.shares_to_proto(shares)
    assert [len(m.y) for m in messages] == [1, 66, 1]  # sorted: one, top, zero
    assert msg.shares_from_proto(wire_all(messages)) == shares


def _share(owner: str = "a", x: int = 1, y: bytes = b"\x05") -> secure_aggregation_pb2.ShamirShare:
    return secure_aggregation_pb2.ShamirShare(owner=owner, x=x, y=y)


@pytest.mark.parametrize(
    ("messages", "match"),
    [
        ([_share(x=0)], "x must lie in"),  # missing x
        ([_share(x=-1)], "x must lie in"),
        ([_share(x=2**32)], "x must lie in"),
        ([_share(y=b"")], "y of 0 bytes"),  # missing y
        ([_share(y=PRIME.to_bytes(66, "big"))], "y must lie in"),
        ([_share(y=b"\xff" * 66)], "y must lie in"),
        ([_share(y=b"\0" * 67)], "y of 67 bytes"),
        ([_share(owner="")], "names no owner"),
        ([_share(), _share(x=2)], "two Shamir shares of 'a'"),
    ],
)
def test_malformed_shares_are_invalid_argument(
    messages: list[secure_aggregation_pb2.ShamirShare], match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        msg.shares_from_proto(wire_all(messages))
    response = secure_aggregation_pb2.UnmaskResponse(key_shares=messages)
    with pytest.raises(InvalidArgumentError, match=match):
        msg.unmask_from_proto(wire(response))


@FAST
@given(st.dictionaries(names, st.binary(min_size=64, max_size=72), max_size=6))
def test_survivor_signatures_round_trip(signatures: dict[str, bytes]) -> None:
    messages = wire_all(msg.signatures_to_proto(signatures))
    assert [m.site for m in messages] == sorted(signatures)
    assert msg.signatures_from_proto(messages) == signatures


def test_a_site_signing_twice_is_invalid_argument() -> None:
    messages = msg.signatures_to_proto({"a": b"s" * 64}) * 2
    with pytest.raises(InvalidArgumentError, match=r"two signatures .* by 'a'"):
        msg.signatures_from_proto(messages)


@FAST
@given(st.lists(st.tuples(attestations, certificates), max_size=6, unique_by=lambda p: p[0].site))
def test_attestations_round_trip(pairs: list[tuple[SizeAttestation, bytes]]) -> None:
    messages = [wire(msg.attestation_to_proto(a, cert)) for a, cert in pairs]
    for (attestation, cert), message in zip(pairs, messages, strict=True):
        assert exact(msg.attestation_from_proto(message)) == exact((attestation, cert))
    got, certs = msg.attestations_from_proto(messages)
    assert exact(got) == exact({a.site: a for a, _ in pairs})
    assert certs == {a.site: cert for a, cert in pairs}


def test_a_site_attesting_twice_is_invalid_argument() -> None:
    message = msg.attestation_to_proto(SizeAttestation("a", 10, b"s" * 64), b"pem")
    with pytest.raises(InvalidArgumentError, match="two row counts of 'a'"):
        msg.attestations_from_proto([message, message])


@FAST
@given(share_maps, share_maps)
def test_unmask_responses_round_trip(survived: dict[str, Share], dropped: dict[str, Share]) -> None:
    dropped = {f"lost-{k}": v for k, v in dropped.items()}  # the two sets are disjoint
    response = UnmaskResponse(self_mask_shares=survived, key_shares=dropped)
    assert msg.unmask_from_proto(wire(msg.unmask_to_proto(response))) == response


@FAST
@given(hnp.arrays(np.uint64, st.integers(0, 40), elements=st.integers(0, 2**63 - 1)))
def test_masked_inputs_round_trip(values: np.ndarray) -> None:
    back = msg.masked_from_proto(wire(msg.masked_to_proto(values)), values.shape[0])
    assert back.dtype == np.uint64 and back.tobytes() == values.tobytes()


def test_edge_masked_values_round_trip() -> None:
    values = np.array([0, 1, 2**62, 2**63 - 1], dtype=np.uint64)
    assert msg.masked_from_proto(wire(msg.masked_to_proto(values)), 4).tobytes() == (
        values.tobytes()
    )


I64 = array_pb2.DTYPE_INT64
FOUR = np.arange(4, dtype=np.int64).tobytes()


@pytest.mark.parametrize(
    ("message", "match"),
    [
        (msg.masked_to_proto(np.zeros(3, np.uint64)), "must be 4 values"),
        (msg.masked_to_proto(np.zeros(5, np.uint64)), "must be 4 values"),
        (msg.masked_to_proto(np.array([0, 1, 2**63, 3], np.uint64)), r"in \[0, 2\^63\)"),
        (_array(I64, [4], np.array([0, -1, 2, 3], np.int64).tobytes()), r"in \[0, 2\^63\)"),
        (_array(I64, [4], FOUR[:-1]), "bytes do not hold"),
        (_array(I64, [2, 2], FOUR), "1-D"),
        (_array(I64, [4], b""), "bytes do not hold"),  # data missing
        (_array(array_pb2.DTYPE_UNSPECIFIED, [4], FOUR), "int64"),  # dtype missing
        (
            _array(F64, [4], np.array([0.5, 1.5, 2.5, 3.5]).tobytes()),
            "int64 array, got dtype DTYPE_FLOAT64",
        ),
        (_array(array_pb2.DTYPE_FLOAT32, [4], np.ones(4, np.float32).tobytes()), "int64"),
    ],
)
def test_a_malformed_masked_input_is_invalid_argument(message: array_pb2.Array, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match):
        msg.masked_from_proto(wire(message), 4)
