"""Random number generators: cryptographically seeded for production, seeded for tests."""

from __future__ import annotations

import secrets

import numpy as np


def production_rng() -> np.random.Generator:
    """Return a PCG64 generator seeded with 256 bits from the operating system's CSPRNG.

    Every production noise draw and every random protocol parameter (h1 frequencies, MWEM
    randomness, auction coins) comes from a generator made here; tests pass seeded generators
    instead.

    Returns
    -------
    numpy.random.Generator
    """
    return np.random.default_rng(secrets.randbits(256))


def make_rng(seed: int | None) -> np.random.Generator:
    """Return a generator for ``seed``, or :func:`production_rng` when ``seed`` is ``None``.

    Raises
    ------
    ValueError
        If ``seed`` is negative.
    """
    if seed is None:
        return production_rng()
    if seed < 0:
        raise ValueError(f"seed must be >= 0, got {seed}")
    return np.random.default_rng(seed)
