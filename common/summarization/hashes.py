"""The less-trusted curator's summary: h1 hashes whose frequencies only the owners know.

Summarization paper, Appendix F (``002_…``): instead of the summary's raw points, the curator
and the consumer receive only their random Fourier features ``h1(x) = sqrt(2/d) cos(W x + b)``,
which suffice to train kernel models (a linear model on ``h1`` is a model in the RBF kernel's
feature space). Theorem 9 shows that the joint law of ``h1(x_1), ..., h1(x_q)`` over the random
``(W, b)`` depends only on the pairwise distances ``||x_u - x_v||``: a receiver learns the
points' geometry up to rigid motions, nothing more.

Who may know ``(W, b)``
-----------------------
Theorem 9 is a statement about a receiver that does **not** know ``(W, b)``: with them, ``h1`` is a
system of ``d >= n`` known cosines and ``x`` is recovered from ``h1(x)`` (or from ``h1`` of a few
known points by regression). The session's own h1 (:mod:`dpmarket.common.summarization.rff`) is
drawn by the curator and sent to every owner, so it cannot serve. In the hashes mode:

* **The owners draw and know the hash map; the curator and the consumer never do.** The owners
  agree on a 32-byte secret among themselves (:mod:`dpmarket.owner.hash_keys`: each owner advertises
  an X25519 key signed with its identity key; the owner with the smallest name draws the secret and
  sends it to every other owner encrypted under their pairwise Diffie-Hellman key with AES-GCM,
  signed; the curator relays ciphertexts and signed public keys only, and cannot substitute a key
  without a signature it cannot forge). Every owner derives ``(W, b)`` from the secret
  (:func:`hash_parameters`: AES-256 counter-mode keystream, deterministic on every machine), never
  sends it, and releases only ``h1`` of its proposed points.
* **What the curator and consumer learn** is ``h1`` of the summary points under an unknown,
  fresh ``(W, b)``: by Theorem 9, the pairwise distances among the summary points (their
  Gram matrix in the kernel), and the points' labels. Not learned: any absolute position, any
  distance to a point they know (D_v included), so they cannot place the summary points by
  multilateration. The curator therefore cannot re-rank candidates against D_v as the raw
  method does: in the hashes mode the owners' local greedy proposals are the summary (the
  allocation splits exactly p points).
* **Applying a model to new points.** A linear model ``f(x) = beta . h1(x)`` trained on the
  hashes must be applied to the consumer's new points through ``h1`` of *them*, which only an
  owner can compute. The consumer sends its new points to one owner (which learns them: the
  consumer's new points, not D_v, nor the summary) identified by the session's public key id
  (:func:`hash_key_id`); the owner returns ``h1`` of them to the consumer only. Returning the
  hashes of points the consumer chose is itself a known-plaintext oracle for ``(W, b)``
  (``d`` unknown frequencies, each fitted from a few known ``(x, h1(x))`` pairs), so the
  deployment-grade variant returns the model's predictions instead (the consumer sends
  ``beta`` fixed at training time); the in-process evaluation computes ``h1`` of the test
  points at an owner, as that owner would, to score the model.
* **Collusion.** A curator colluding with one owner learns ``(W, b)`` and Theorem 9 gives
  nothing; the owners' raw-point charges still hold (every hash is charged as the raw point
  it describes, :meth:`dpmarket.owner.protocol.Owner.propose_hashes`).

Pure: numpy and the ``cryptography`` primitives of :mod:`dpmarket.common.secagg.crypto`; no I/O.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray

from dpmarket.common.secagg.crypto import encode_fields, prg_words
from dpmarket.common.summarization.rff import RFFParams, random_fourier_features
from dpmarket.common.validation import check_positive_int

__all__ = [
    "SECRET_BYTES",
    "HashAdvert",
    "hash_key_id",
    "hash_parameters",
    "hash_points",
    "leader_of",
]

#: Length of the owners' shared secret.
SECRET_BYTES = 32
_LABEL = b"dpmarket hash map v1"
_KEY_ID_LABEL = b"dpmarket hash key id v1"


@dataclass(frozen=True)
class HashAdvert:
    """One owner's signed X25519 public key for a session's hash-key agreement
    (:mod:`dpmarket.owner.hash_keys`): the owner's name, the raw 32-byte key, its identity
    signature."""

    owner: str
    public_key: bytes
    signature: bytes


def leader_of(adverts: Mapping[str, HashAdvert]) -> str:
    """The owner that draws the secret: the smallest name among the advertisements (every
    owner and the relaying curator compute the same one)."""
    if not adverts:
        raise ValueError("a hash-key agreement needs at least one owner")
    return min(adverts)


def _uniforms(words: NDArray[np.uint64]) -> NDArray[np.float64]:
    """Map 64-bit words to (0, 1): the top 53 bits plus one half, times 2^-53."""
    return ((words >> np.uint64(11)).astype(np.float64) + 0.5) * 2.0**-53


def hash_parameters(secret: bytes, n_features: int, d: int, gamma: float) -> RFFParams:
    """The hash map ``(W, b)`` every owner derives from the owners' shared secret.

    ``W`` (d x n) has i.i.d. ``N(0, 2 gamma)`` entries and ``b`` (d,) i.i.d. ``Uniform[0, 2 pi)``
    entries, the law of h1 (Algorithm 1), so ``h1(x) . h1(y)`` estimates
    ``exp(-gamma ||x - y||^2)``. The randomness is the AES-256 counter-mode keystream
    (:func:`dpmarket.common.secagg.crypto.prg_words`) under ``SHA-256(label || n || d || gamma ||
    secret)``: words become uniforms on (0, 1) (53 bits), pairs of uniforms become normals by
    Box-Muller. Every owner, on any machine and library version, derives the same map, and the
    map of another ``(n, d, gamma)`` is unrelated.

    Parameters
    ----------
    secret : bytes
        The owners' 32-byte shared secret (:data:`SECRET_BYTES`).
    n_features : int
        n, the points' dimension, >= 1.
    d : int
        The hash dimension, >= 1.
    gamma : float
        RBF kernel parameter, a finite number > 0.

    Returns
    -------
    RFFParams

    Raises
    ------
    ValueError
        If the secret is not 32 bytes or an argument is out of range.

    Notes
    -----
    Whoever knows ``secret`` knows the map; it never leaves the owners (module docstring).
    """
    if len(secret) != SECRET_BYTES:
        raise ValueError(f"the secret must be {SECRET_BYTES} bytes, got {len(secret)}")
    n = check_positive_int(n_features, "n_features")
    d = check_positive_int(d, "d")
    if not (math.isfinite(gamma) and gamma > 0):
        raise ValueError(f"gamma must be a finite number > 0, got {gamma}")
    seed = hashlib.sha256(
        encode_fields(_LABEL, str(n).encode(), str(d).encode(), repr(float(gamma)).encode(), secret)
    ).digest()
    pairs = (d * n + 1) // 2
    u = _uniforms(prg_words(seed, 2 * pairs + d))
    u1, u2, u3 = u[:pairs], u[pairs : 2 * pairs], u[2 * pairs :]
    radius = np.sqrt(-2.0 * np.log(u1))
    normals = np.concatenate([radius * np.cos(2 * np.pi * u2), radius * np.sin(2 * np.pi * u2)])
    omega = normals[: d * n].reshape(d, n) * math.sqrt(2.0 * gamma)
    return RFFParams(omega=omega, phase=2.0 * np.pi * u3, gamma=float(gamma))


def hash_points(points: ArrayLike, params: RFFParams) -> NDArray[np.float64]:
    """``h1`` of points under the owners' hash map: shape (q, d), float64."""
    return np.asarray(random_fourier_features(points, params, dtype=np.float64))


def hash_key_id(secret: bytes) -> str:
    """A public name of the owners' secret (hex SHA-256 of a label and the secret, 32 digits):
    the consumer names the map its model needs by it, and it reveals nothing of the secret."""
    return hashlib.sha256(encode_fields(_KEY_ID_LABEL, secret)).hexdigest()[:32]
