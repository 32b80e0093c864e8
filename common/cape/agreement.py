"""The public inputs of a CAPE plan, agreed among the sites rather than relayed by the curator.

Every site computes a job's plan — its noise scale, Remark 3's weights, its guarantee — from the
spec, the sites, ``S_C`` and every site's row count (:func:`plan_for`). The curator routes all of
it, and the curator may lie: told other sizes, or another ``S_C``, than its peers, a site would
add noise that no longer matches theirs, and its guarantee would not hold (raising one site's
privacy loss factor from 1.875 to 5 at ``S = 5`` only by lying about the others' sizes). So each
site signs its own row count together with everything else the plan derives from
(:func:`plan_statement`), and a site plans only once it has checked every other site's signature
on the same statement (:func:`check_attestations`): all the sites that plan then plan the same.

``S_C`` itself is bounded below by every site (:func:`check_colluders`): by its owner's policy
floor, by the spec's ``S_C`` when the consumer chose one, and otherwise by the paper's default.

Pure: bytes in, bytes out; the signing and the certificate checks are the caller's
(:class:`dpmarket.common.secagg.crypto.Signer`, :class:`dpmarket.common.secagg.crypto.Verifier`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dpmarket.common.cape.capefm import CapeFMPlan
from dpmarket.common.cape.dpgd import CapeTrainingPlan
from dpmarket.common.cape.mean import CapeMeanPlan
from dpmarket.common.cape.privacy import default_colluders
from dpmarket.common.cape.spec import AnyCapeSpec, CapeTrainingSpec
from dpmarket.common.errors import AbortedError, FailedPreconditionError
from dpmarket.common.secagg.crypto import Verifier, encode_fields

__all__ = [
    "SizeAttestation",
    "check_attestations",
    "check_colluders",
    "plan_for",
    "plan_statement",
    "required_colluders",
    "spec_digest",
]

_STATEMENT_LABEL = b"dpmarket/cape/v1/plan-size"
_SPEC_LABEL = "dpmarket/cape/v1/spec"


@dataclass(frozen=True)
class SizeAttestation:
    """One site's signed row count for one plan of a job.

    Attributes
    ----------
    site : str
        The signing site (owner name).
    rows : int
        Its row count ``N_s``.
    signature : bytes
        The site's :class:`~dpmarket.common.secagg.crypto.Signer` signature of
        :func:`plan_statement`.
    """

    site: str
    rows: int
    signature: bytes


def spec_digest(spec: AnyCapeSpec) -> bytes:
    """SHA-256 of a canonical encoding of the spec (32 bytes).

    The encoding is JSON with sorted keys of the spec's type and every field
    (``dataclasses.asdict``; floats by Python's shortest round-tripping ``repr``), so two sites
    holding equal specs get equal digests, and any difference in a bound, epsilon, delta,
    ``S_C``, calibration or hyper-parameter changes it.
    """
    body = {"type": type(spec).__name__, "fields": dataclasses.asdict(spec)}
    text = json.dumps([_SPEC_LABEL, body], sort_keys=True, allow_nan=False)
    return hashlib.sha256(text.encode()).digest()


def plan_statement(
    job_id: str,
    spec: AnyCapeSpec,
    sites: Sequence[str],
    colluders: int,
    first_iteration: int,
    site: str,
    rows: int,
) -> bytes:
    """The bytes a site signs to attest its row count for one plan.

    ``encode_fields(label, job_id, spec_digest(spec), colluders, first_iteration, site, rows,
    *sites)`` (integers as decimal ASCII, strings as UTF-8, the sites in the given order, which
    the plan requires sorted): a signature made for one job, spec, set of sites, ``S_C`` or
    segment of a training is valid for no other.
    """
    return encode_fields(
        _STATEMENT_LABEL,
        job_id.encode(),
        spec_digest(spec),
        str(int(colluders)).encode(),
        str(int(first_iteration)).encode(),
        site.encode(),
        str(int(rows)).encode(),
        *(name.encode() for name in sites),
    )


def required_colluders(spec: AnyCapeSpec, sites: int, floor: int) -> int:
    """The fewest colluders a plan of ``sites`` sites may defend against, for one site.

    Parameters
    ----------
    spec : CapeJobSpec, CapeMeanSpec or CapeTrainingSpec
    sites : int
        ``S``.
    floor : int
        The site's policy floor (``cape.min_colluders``), ``>= 0``.

    Returns
    -------
    int
        ``max(floor, spec.colluders)`` when the consumer chose ``S_C``, else ``max(floor, ceil(S /
        3) - 1)`` (the paper's default, :func:`dpmarket.common.cape.privacy.default_colluders`).
    """
    chosen = spec.colluders if spec.colluders is not None else default_colluders(sites)
    return max(int(floor), int(chosen))


def check_colluders(
    spec: AnyCapeSpec, sites: int, colluders: int, floor: int, *, fixed: int | None = None
) -> None:
    """Raise unless a plan's ``S_C`` is one this site may plan with.

    Parameters
    ----------
    spec : CapeJobSpec, CapeMeanSpec or CapeTrainingSpec
    sites : int
        ``S``.
    colluders : int
        The plan's ``S_C``.
    floor : int
        This site's policy floor.
    fixed : int, optional
        The ``S_C`` a training released with (a re-plan must keep it).

    Raises
    ------
    FailedPreconditionError
        If ``colluders`` is not an integer in ``[required_colluders(...), S - 1]``, differs from
        the spec's explicit ``S_C`` (the consumer's choice is kept when no site's floor is above
        it; otherwise the job was refused when it opened), or from ``fixed``. The message names
        only public values (the floor, the spec, ``S``).
    """
    if isinstance(colluders, bool) or not isinstance(colluders, int):
        raise FailedPreconditionError(f"colluders must be an int, got {colluders!r}")
    if fixed is not None and colluders != fixed:
        raise FailedPreconditionError(
            f"the training released with S_C={fixed} colluders; a new plan must keep it, "
            f"not S_C={colluders}"
        )
    if spec.colluders is not None and colluders != spec.colluders:
        raise FailedPreconditionError(
            f"the job asks for S_C={spec.colluders} colluders, the plan has S_C={colluders}"
        )
    need = required_colluders(spec, sites, floor)
    if colluders < need:
        raise FailedPreconditionError(
            f"the plan defends against S_C={colluders} colluders of {sites} sites, below the "
            f"{need} this owner requires (its floor is {floor}; the default is "
            f"ceil(S / 3) - 1 = {default_colluders(sites)})"
        )
    if colluders > sites - 1:
        raise FailedPreconditionError(
            f"S_C={colluders} colluders need at least {colluders + 1} sites, the plan has {sites}"
        )


def check_attestations(
    job_id: str,
    spec: AnyCapeSpec,
    sites: Sequence[str],
    colluders: int,
    first_iteration: int,
    attestations: Mapping[str, SizeAttestation],
    verifier: Verifier,
) -> list[int]:
    """Check that every site of the plan signed its row count for exactly this plan.

    Parameters
    ----------
    job_id, spec, sites, colluders, first_iteration
        The plan, as this site knows it (its own spec; the sites sorted).
    attestations : mapping of str to SizeAttestation
        Site -> its attestation, as relayed by the curator.
    verifier : Verifier
        Checks a site's signature with the key of its certificate (deployment CA, name = site).

    Returns
    -------
    list of int
        The row counts in the order of ``sites``.

    Raises
    ------
    AbortedError
        If a site has no attestation or one filed under another name, an attestation names a
        site outside the plan, a count is not a positive integer, or a signature does not verify
        for :func:`plan_statement` of this plan (a count altered, or signed for another job,
        spec, set of sites, ``S_C`` or segment).
    """
    names = list(sites)
    strangers = sorted(set(attestations) - set(names))
    missing = sorted(set(names) - set(attestations))
    if strangers or missing:
        raise AbortedError(
            f"the signed row counts do not match the plan's sites: missing {missing}, "
            f"not in the plan {strangers}"
        )
    sizes = []
    for name in names:
        attestation = attestations[name]
        if attestation.site != name:
            raise AbortedError(
                f"the row count filed under {name!r} is signed as {attestation.site!r}"
            )
        rows = attestation.rows
        if isinstance(rows, bool) or not isinstance(rows, int) or rows < 1:
            raise AbortedError(f"the row count of {name!r} is not a positive integer: {rows!r}")
        message = plan_statement(job_id, spec, names, colluders, first_iteration, name, rows)
        try:
            verifier.verify(name, message, attestation.signature)
        except Exception as exc:
            raise AbortedError(
                f"the row count of {name!r} ({rows}) is not signed by {name!r} for this plan: {exc}"
            ) from None
        sizes.append(rows)
    return sizes


def plan_for(
    spec: AnyCapeSpec, sizes: Sequence[int], colluders: int, first_iteration: int = 0
) -> CapeFMPlan | CapeMeanPlan | CapeTrainingPlan:
    """The plan every party computes: ``spec``'s, for these sizes, against ``colluders``.

    Raises
    ------
    ValueError
        As the spec's ``plan`` (sizes, ``S_C`` out of range, a plan that cannot be made).
    """
    if isinstance(spec, CapeTrainingSpec):
        return spec.plan(sizes, first_iteration=first_iteration, colluders=colluders)
    if first_iteration != 0:
        raise ValueError(f"first_iteration is for gradient descent only, got {first_iteration}")
    return dataclasses.replace(spec, colluders=colluders).plan(sizes)
