"""Conversion of the CAPE and secure-aggregation messages that several services share.

:class:`~dpmarket.common.cape.spec.CapeJobSpec` and :class:`~dpmarket.common.cape.spec.CapeMeanSpec`
travel consumer -> curator -> owners as ``CapeSpec``,
:class:`~dpmarket.common.cape.spec.CapeTrainingSpec` as ``CapeTrainingSpec``; the secure-aggregation
messages travel between the curator and the owners in both directions. One module converts them for
every service (as :mod:`dpmarket.runtime.arrays` does for arrays).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.cape.agreement import SizeAttestation
from dpmarket.common.cape.spec import AnyCapeSpec, CapeJobSpec, CapeMeanSpec, CapeTrainingSpec
from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.secagg.fixedpoint import FixedPoint
from dpmarket.common.secagg.protocol import KeyAdvertisement, RoundParams, UnmaskResponse
from dpmarket.common.secagg.shamir import PRIME, Share
from dpmarket.runtime.arrays import array_from_proto, array_to_proto
from dpmarket.v1 import array_pb2, cape_pb2, secure_aggregation_pb2

_TASKS = {
    cape_pb2.CAPE_TASK_LINEAR_REGRESSION: "linear",
    cape_pb2.CAPE_TASK_LOGISTIC_REGRESSION: "logistic",
}
_TASKS_TO_PROTO = {v: k for k, v in _TASKS.items()}
_CALIBRATIONS = {
    cape_pb2.CAPE_CALIBRATION_UNSPECIFIED: "exact",
    cape_pb2.CAPE_CALIBRATION_EXACT: "exact",
    cape_pb2.CAPE_CALIBRATION_THEOREM1: "theorem1",
}
_CALIBRATIONS_TO_PROTO = {
    "exact": cape_pb2.CAPE_CALIBRATION_EXACT,
    "theorem1": cape_pb2.CAPE_CALIBRATION_THEOREM1,
}
#: Bytes of a share's y (a field element of GF(2^521 - 1)) at most.
_ELEMENT_BYTES = (PRIME.bit_length() + 7) // 8


def _colluders_from_proto(message: cape_pb2.CapeSpec | cape_pb2.CapeTrainingSpec) -> int | None:
    """The S_C a spec message asks: its ``colluders`` if set (0 included), else ``None``.

    ``colluders`` has explicit presence (``optional``): unset means the default
    (ceil(S / 3) - 1, raised to the owners' floors), a set 0 means no colluders. A sender built
    before the field was ``optional`` never sets a 0, so its unset still means the default.

    Raises
    ------
    InvalidArgumentError
        If it is set and negative.
    """
    if not message.HasField("colluders"):
        return None
    if message.colluders < 0:
        raise InvalidArgumentError(
            f"colluders must be >= 0, got {message.colluders}: leave it unset for the default"
        )
    return int(message.colluders)


def _colluders_to_proto(
    message: cape_pb2.CapeSpec | cape_pb2.CapeTrainingSpec, colluders: int | None
) -> None:
    """Set ``colluders`` of a spec message from a spec's S_C (left unset for ``None``)."""
    if colluders is not None:
        message.colluders = colluders


def spec_to_proto(spec: CapeJobSpec | CapeMeanSpec) -> cape_pb2.CapeSpec:
    """CapeJobSpec or CapeMeanSpec -> CapeSpec."""
    features = [cape_pb2.ColumnBound(column=c, low=lo, high=hi) for c, lo, hi in spec.features]
    if isinstance(spec, CapeMeanSpec):
        message = cape_pb2.CapeSpec(
            task=cape_pb2.CAPE_TASK_MEAN,
            features=features,
            epsilon=spec.epsilon,
            delta=spec.delta,
            calibration=_CALIBRATIONS_TO_PROTO[spec.calibration],
        )
    else:
        column, low, high = spec.target
        message = cape_pb2.CapeSpec(
            task=_TASKS_TO_PROTO[spec.task],
            features=features,
            target=cape_pb2.ColumnBound(column=column, low=low, high=high),
            epsilon=spec.epsilon,
            delta=spec.delta,
            calibration=_CALIBRATIONS_TO_PROTO[spec.calibration],
            fit_intercept=spec.fit_intercept,
        )
    _colluders_to_proto(message, spec.colluders)
    return message


def spec_from_proto(message: cape_pb2.CapeSpec) -> CapeJobSpec | CapeMeanSpec:
    """CapeSpec -> CapeJobSpec (capeFM) or CapeMeanSpec (``CAPE_TASK_MEAN``).

    Raises
    ------
    InvalidArgumentError
        For an unknown task or calibration, a mean with a target or an intercept, or a malformed
        spec (columns, bounds, epsilon, delta).

    Notes
    -----
    An unset ``colluders`` comes back as ``None`` (the default), a set one as its value (0 too).
    """
    calibration = _CALIBRATIONS.get(message.calibration)
    if calibration is None:
        raise InvalidArgumentError(f"unknown calibration {message.calibration}")
    colluders = _colluders_from_proto(message)
    features = tuple((f.column, f.low, f.high) for f in message.features)
    try:
        if message.task == cape_pb2.CAPE_TASK_MEAN:
            if message.HasField("target"):
                raise InvalidArgumentError(
                    f"the mean takes no target, got target column {message.target.column!r}: "
                    "leave the target unset"
                )
            if message.fit_intercept:
                raise InvalidArgumentError(
                    "the mean takes no intercept: leave fit_intercept unset (capeFM only)"
                )
            return CapeMeanSpec(features, message.epsilon, message.delta, colluders, calibration)
        task = _TASKS.get(message.task)
        if task is None:
            raise InvalidArgumentError(
                f"task must be LINEAR_REGRESSION, LOGISTIC_REGRESSION or MEAN, got {message.task}"
            )
        return CapeJobSpec(
            task=task,  # type: ignore[arg-type]
            features=features,
            target=(message.target.column, message.target.low, message.target.high),
            epsilon=message.epsilon,
            delta=message.delta,
            colluders=colluders,
            calibration=calibration,
            fit_intercept=message.fit_intercept,
        )
    except InvalidArgumentError:
        raise
    except ValueError as exc:
        raise InvalidArgumentError(f"CAPE spec: {exc}") from exc


def training_to_proto(spec: CapeTrainingSpec) -> cape_pb2.CapeTrainingSpec:
    """CapeTrainingSpec -> its message."""
    message = cape_pb2.CapeTrainingSpec(
        features=[cape_pb2.ColumnBound(column=c, low=lo, high=hi) for c, lo, hi in spec.features],
        target=spec.target,
        epsilon=spec.epsilon,
        delta=spec.delta,
        iterations=spec.iterations,
        learning_rate=spec.learning_rate,
        hidden_units=spec.hidden,
        clip_norm=spec.clip,
    )
    _colluders_to_proto(message, spec.colluders)
    return message


def training_from_proto(message: cape_pb2.CapeTrainingSpec) -> CapeTrainingSpec:
    """CapeTrainingSpec message -> CapeTrainingSpec.

    Raises
    ------
    InvalidArgumentError
        For a malformed spec (columns, bounds, epsilon, delta, a hyper-parameter not > 0).
    """
    colluders = _colluders_from_proto(message)
    try:
        return CapeTrainingSpec(
            features=tuple((f.column, f.low, f.high) for f in message.features),
            target=message.target,
            epsilon=message.epsilon,
            delta=message.delta,
            iterations=int(message.iterations),
            learning_rate=message.learning_rate,
            hidden=int(message.hidden_units),
            clip=message.clip_norm,
            colluders=colluders,
        )
    except ValueError as exc:
        raise InvalidArgumentError(f"CAPE training spec: {exc}") from exc


def job_to_proto(request: cape_pb2.OpenCapeJobRequest, spec: AnyCapeSpec) -> None:
    """Set the ``job`` of an OpenCapeJobRequest from any CAPE spec."""
    if isinstance(spec, CapeTrainingSpec):
        request.training.CopyFrom(training_to_proto(spec))
    else:
        request.spec.CopyFrom(spec_to_proto(spec))


def job_from_proto(request: cape_pb2.OpenCapeJobRequest) -> AnyCapeSpec:
    """The spec of an OpenCapeJobRequest; InvalidArgumentError if it has none or is malformed."""
    which = request.WhichOneof("job")
    if which == "training":
        return training_from_proto(request.training)
    if which == "spec":
        return spec_from_proto(request.spec)
    raise InvalidArgumentError("OpenCapeJobRequest carries no job (spec or training)")


def _dtype_name(value: array_pb2.Dtype.ValueType) -> str:
    """An Array's dtype for an error message (its number if it is not a known one)."""
    try:
        return array_pb2.Dtype.Name(value)
    except ValueError:
        return str(value)


def vector_to_proto(values: NDArray[np.floating]) -> array_pb2.Array:
    """A float64 vector -> Array."""
    return array_to_proto(np.asarray(values, dtype=np.float64))


def vector_from_proto(
    message: array_pb2.Array, name: str, length: int | None = None
) -> NDArray[np.float64]:
    """Array -> a finite float64 vector (of ``length`` if given).

    Raises
    ------
    InvalidArgumentError
        If it is malformed, not float64 on the wire (an int64 or float32 array would be converted,
        not read exactly), of the wrong length or not finite.
    """
    if message.dtype != array_pb2.DTYPE_FLOAT64:
        raise InvalidArgumentError(
            f"{name} must be a float64 array, got dtype {_dtype_name(message.dtype)}"
        )
    try:
        out = array_from_proto(message, name, ndim=1, dtype=np.float64)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc
    if length is not None and out.shape[0] != length:
        raise InvalidArgumentError(f"{name} must have {length} values, got {out.shape[0]}")
    if not np.isfinite(out).all():
        raise InvalidArgumentError(f"{name} holds NaN or inf")
    return out


# ------------------------------------------------------------------------- secure aggregation
def round_to_proto(
    job_id: str, params: RoundParams
) -> secure_aggregation_pb2.SecureAggregationRound:
    """RoundParams (and its job) -> SecureAggregationRound.

    Raises
    ------
    InvalidArgumentError
        If ``fixed_point.sites`` is not the number of sites: the message does not carry it (a
        receiver takes ``len(sites)``), so such parameters would arrive changed, with another
        :attr:`~dpmarket.common.secagg.protocol.RoundParams.digest`.
    """
    fp = params.fixed_point
    if fp.sites != len(params.sites):
        raise InvalidArgumentError(
            f"fixed_point.sites={fp.sites} differs from the round's {len(params.sites)} sites: "
            "the wire carries only the sites; build the FixedPoint with sites=len(sites)"
        )
    return secure_aggregation_pb2.SecureAggregationRound(
        job_id=job_id,
        round_id=params.round_id,
        sites=list(params.sites),
        threshold=params.threshold,
        vector_length=params.vector_length,
        clip=fp.clip,
        resolution_bits=fp.resolution_bits,
        colluders=params.colluders,
        neighbours=params.neighbours,
        allowance=params.allowance,
        ring=params.ring,
    )


def round_from_proto(
    message: secure_aggregation_pb2.SecureAggregationRound,
) -> tuple[str, RoundParams]:
    """SecureAggregationRound -> (job id, RoundParams).

    Raises
    ------
    InvalidArgumentError
        If a parameter is out of range (short round id, bad threshold, fixed point).
    """
    try:
        fixed_point = FixedPoint(
            clip=message.clip,
            resolution_bits=int(message.resolution_bits),
            sites=len(message.sites),
        )
        params = RoundParams(
            round_id=bytes(message.round_id),
            sites=tuple(message.sites),
            threshold=int(message.threshold),
            vector_length=int(message.vector_length),
            fixed_point=fixed_point,
            colluders=int(message.colluders),
            neighbours=int(message.neighbours),
            allowance=int(message.allowance),
            ring=int(message.ring),
        )
    except ValueError as exc:
        raise InvalidArgumentError(f"secure-aggregation round: {exc}") from exc
    return message.job_id, params


def advertisement_to_proto(
    ad: KeyAdvertisement, certificate: bytes
) -> secure_aggregation_pb2.KeyAdvertisement:
    """KeyAdvertisement and the site's certificate -> KeyAdvertisement message."""
    return secure_aggregation_pb2.KeyAdvertisement(
        site=ad.site,
        c_public=ad.c_public,
        s_public=ad.s_public,
        signature=ad.signature,
        certificate=certificate,
        commitment=ad.commitment,
    )


def advertisement_from_proto(
    message: secure_aggregation_pb2.KeyAdvertisement,
) -> tuple[KeyAdvertisement, bytes]:
    """KeyAdvertisement message -> (KeyAdvertisement, certificate PEM), field for field.

    The keys, signature, commitment and certificate are checked by the protocol that uses them
    (:class:`~dpmarket.common.secagg.protocol.SecAggSite` aborts the round on a bad one), not here.
    """
    return (
        KeyAdvertisement(
            site=message.site,
            c_public=bytes(message.c_public),
            s_public=bytes(message.s_public),
            signature=bytes(message.signature),
            commitment=bytes(message.commitment),
        ),
        bytes(message.certificate),
    )


def advertisements_from_proto(
    messages: Iterable[secure_aggregation_pb2.KeyAdvertisement],
) -> tuple[dict[str, KeyAdvertisement], dict[str, bytes]]:
    """KeyAdvertisement messages -> (site -> advertisement, site -> certificate PEM).

    Raises
    ------
    InvalidArgumentError
        If a site appears twice.
    """
    ads: dict[str, KeyAdvertisement] = {}
    certificates: dict[str, bytes] = {}
    for message in messages:
        ad, certificate = advertisement_from_proto(message)
        if ad.site in ads:
            raise InvalidArgumentError(f"two key advertisements of {ad.site!r}")
        ads[ad.site], certificates[ad.site] = ad, certificate
    return ads, certificates


def nonces_to_proto(nonces: Mapping[str, bytes]) -> list[secure_aggregation_pb2.SiteNonce]:
    """Site -> revealed graph nonce -> SiteNonce messages, sorted by site."""
    return [secure_aggregation_pb2.SiteNonce(site=s, nonce=n) for s, n in sorted(nonces.items())]


def nonces_from_proto(messages: Iterable[secure_aggregation_pb2.SiteNonce]) -> dict[str, bytes]:
    """SiteNonce messages -> site -> nonce.

    Raises
    ------
    InvalidArgumentError
        If a site appears twice.
    """
    out: dict[str, bytes] = {}
    for message in messages:
        if message.site in out:
            raise InvalidArgumentError(f"two graph nonces of {message.site!r}")
        out[message.site] = bytes(message.nonce)
    return out


def tags_to_proto(
    triples: Iterable[tuple[str, str, bytes]],
) -> list[secure_aggregation_pb2.PairTag]:
    """(sender, recipient, tag) triples -> PairTag messages."""
    return [secure_aggregation_pb2.PairTag(sender=s, recipient=r, tag=t) for s, r, t in triples]


def tags_from_proto(
    messages: Iterable[secure_aggregation_pb2.PairTag], *, sender: str = "", recipient: str = ""
) -> dict[str, bytes]:
    """PairTag messages from ``sender`` (keyed by recipient) or to ``recipient`` (keyed by
    sender); tags of another sender or recipient are ignored.

    Raises
    ------
    InvalidArgumentError
        If neither or both of ``sender`` and ``recipient`` are given, or a key appears twice.
    """
    if bool(sender) == bool(recipient):
        raise InvalidArgumentError("give the sender or the recipient of the tags")
    out: dict[str, bytes] = {}
    for message in messages:
        if (sender and message.sender != sender) or (recipient and message.recipient != recipient):
            continue
        key = message.recipient if sender else message.sender
        if key in out:
            raise InvalidArgumentError(f"two tags between {key!r} and this site")
        out[key] = bytes(message.tag)
    return out


def ciphertexts_to_proto(
    pairs: Iterable[tuple[str, str, bytes]],
) -> list[secure_aggregation_pb2.SiteCiphertext]:
    """(sender, recipient, ciphertext) triples -> SiteCiphertext messages."""
    return [
        secure_aggregation_pb2.SiteCiphertext(sender=s, recipient=r, ciphertext=c)
        for s, r, c in pairs
    ]


def shares_to_proto(shares: dict[str, Share]) -> list[secure_aggregation_pb2.ShamirShare]:
    """owner -> Share -> ShamirShare messages (y as big-endian bytes)."""
    return [
        secure_aggregation_pb2.ShamirShare(
            owner=owner, x=share.x, y=share.y.to_bytes((share.y.bit_length() + 7) // 8 or 1, "big")
        )
        for owner, share in sorted(shares.items())
    ]


def shares_from_proto(messages: Iterable[secure_aggregation_pb2.ShamirShare]) -> dict[str, Share]:
    """ShamirShare messages -> owner -> Share.

    Raises
    ------
    InvalidArgumentError
        If an owner is unnamed or appears twice, ``y`` is missing (empty) or longer than a field
        element (66 bytes), or ``x`` or ``y`` is out of range (:class:`Share`).
    """
    out: dict[str, Share] = {}
    for m in messages:
        if not m.owner:
            raise InvalidArgumentError("a Shamir share names no owner")
        if m.owner in out:
            raise InvalidArgumentError(f"two Shamir shares of {m.owner!r}")
        if not 1 <= len(m.y) <= _ELEMENT_BYTES:
            raise InvalidArgumentError(
                f"the share of {m.owner!r} has a y of {len(m.y)} bytes, not 1 to {_ELEMENT_BYTES}"
            )
        try:
            out[m.owner] = Share(x=int(m.x), y=int.from_bytes(m.y, "big"))
        except ValueError as exc:
            raise InvalidArgumentError(f"the share of {m.owner!r}: {exc}") from exc
    return out


def signatures_to_proto(
    signatures: Mapping[str, bytes],
) -> list[secure_aggregation_pb2.SurvivorSignature]:
    """Signer -> signature of the survivor list -> SurvivorSignature messages, sorted by site."""
    return [
        secure_aggregation_pb2.SurvivorSignature(site=site, signature=signature)
        for site, signature in sorted(signatures.items())
    ]


def signatures_from_proto(
    messages: Iterable[secure_aggregation_pb2.SurvivorSignature],
) -> dict[str, bytes]:
    """SurvivorSignature messages -> signer -> signature.

    Raises
    ------
    InvalidArgumentError
        If a site signs twice.
    """
    out: dict[str, bytes] = {}
    for message in messages:
        if message.site in out:
            raise InvalidArgumentError(f"two signatures of the survivor list by {message.site!r}")
        out[message.site] = bytes(message.signature)
    return out


def attestation_to_proto(
    attestation: SizeAttestation, certificate: bytes
) -> cape_pb2.SiteAttestation:
    """SizeAttestation and the site's certificate -> SiteAttestation."""
    return cape_pb2.SiteAttestation(
        site=attestation.site,
        rows=attestation.rows,
        signature=attestation.signature,
        certificate=certificate,
    )


def attestation_from_proto(message: cape_pb2.SiteAttestation) -> tuple[SizeAttestation, bytes]:
    """SiteAttestation -> (SizeAttestation, certificate PEM)."""
    return (
        SizeAttestation(
            site=message.site, rows=int(message.rows), signature=bytes(message.signature)
        ),
        bytes(message.certificate),
    )


def attestations_from_proto(
    messages: Iterable[cape_pb2.SiteAttestation],
) -> tuple[dict[str, SizeAttestation], dict[str, bytes]]:
    """SiteAttestation messages -> (site -> attestation, site -> certificate).

    Raises
    ------
    InvalidArgumentError
        If a site appears twice.
    """
    attestations: dict[str, SizeAttestation] = {}
    certificates: dict[str, bytes] = {}
    for message in messages:
        attestation, certificate = attestation_from_proto(message)
        if attestation.site in attestations:
            raise InvalidArgumentError(f"two row counts of {attestation.site!r}")
        attestations[attestation.site], certificates[attestation.site] = attestation, certificate
    return attestations, certificates


def unmask_to_proto(response: UnmaskResponse) -> secure_aggregation_pb2.UnmaskResponse:
    """UnmaskResponse -> its message."""
    return secure_aggregation_pb2.UnmaskResponse(
        self_mask_shares=shares_to_proto(response.self_mask_shares),
        key_shares=shares_to_proto(response.key_shares),
    )


def unmask_from_proto(message: secure_aggregation_pb2.UnmaskResponse) -> UnmaskResponse:
    """UnmaskResponse message -> UnmaskResponse.

    Raises
    ------
    InvalidArgumentError
        If a share is malformed (:func:`shares_from_proto`). Which shares a response must hold
        is checked by the aggregator
        (:meth:`~dpmarket.common.secagg.protocol.SecAggAggregator.finish`).
    """
    return UnmaskResponse(
        self_mask_shares=shares_from_proto(message.self_mask_shares),
        key_shares=shares_from_proto(message.key_shares),
    )


def masked_to_proto(masked: NDArray[np.uint64]) -> array_pb2.Array:
    """A masked input (values mod 2^k, k <= 63) -> an int64 Array."""
    return array_to_proto(np.asarray(masked, dtype=np.uint64).astype(np.int64))


def masked_from_proto(message: array_pb2.Array, length: int) -> NDArray[np.uint64]:
    """An int64 Array -> a masked input.

    Raises
    ------
    InvalidArgumentError
        If it is malformed, not int64 on the wire (a float array would be truncated), not of
        ``length`` values, or negative.
    """
    if message.dtype != array_pb2.DTYPE_INT64:
        raise InvalidArgumentError(
            f"a masked input must be an int64 array, got dtype {_dtype_name(message.dtype)}"
        )
    try:
        values = array_from_proto(message, "masked", ndim=1, dtype=np.int64)
    except ValueError as exc:
        raise InvalidArgumentError(str(exc)) from exc
    if values.shape[0] != length or (values < 0).any():
        raise InvalidArgumentError(f"a masked input must be {length} values in [0, 2^63)")
    return values.astype(np.uint64)
