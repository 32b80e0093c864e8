"""Shamir sharing over GF(2^521 - 1): known answers, every t-subset, secrecy of t - 1 shares."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dpmarket.common.secagg.shamir import (
    PRIME,
    SHARE_BYTES,
    Share,
    combine_shares,
    interpolate,
    split_secret,
)


def scripted(values: list[int]) -> Callable[[int], int]:
    """A ``randbelow`` that returns ``values`` in order (the polynomial's coefficients)."""
    it: Iterator[int] = iter(values)

    def randbelow(bound: int) -> int:
        assert bound == PRIME
        return next(it)

    return randbelow


def test_prime_is_the_mersenne_prime_2_521_minus_1() -> None:
    assert PRIME == 2**521 - 1
    assert pow(3, PRIME - 1, PRIME) == 1  # Fermat witness; 2^521 - 1 is a known Mersenne prime


def test_known_answer_small_polynomial() -> None:
    # f(x) = 5 + 7 x + 3 x^2, computed by hand: f(1..5) = 15, 31, 53, 81, 115.
    shares = split_secret(b"\x05", n=5, t=3, randbelow=scripted([7, 3]))
    assert shares == [Share(1, 15), Share(2, 31), Share(3, 53), Share(4, 81), Share(5, 115)]
    # Lagrange at 0 from x = 1, 2, 3 by hand: weights 3, -3, 1 -> 45 - 93 + 53 = 5.
    assert 3 * 15 - 3 * 31 + 53 == 5
    assert combine_shares(shares[:3], 1) == b"\x05"
    assert combine_shares([shares[4], shares[1], shares[3]], 1) == b"\x05"
    # The polynomial is recovered everywhere, not just at 0.
    assert interpolate(shares[2:], 6) == 5 + 7 * 6 + 3 * 36


def test_known_answer_wraps_modulo_p() -> None:
    # f(x) = 1 + (p - 1) x = 1 - x (mod p): f(1) = 0, f(2) = p - 1, f(3) = p - 2.
    shares = split_secret(b"\x01", n=3, t=2, randbelow=scripted([PRIME - 1]))
    assert shares == [Share(1, 0), Share(2, PRIME - 1), Share(3, PRIME - 2)]
    for pair in itertools.combinations(shares, 2):
        assert combine_shares(list(pair), 1) == b"\x01"


@pytest.mark.parametrize("secret", [bytes(32), b"\x00\x00\x07" + bytes(range(29)), b"\xff" * 64])
def test_every_subset_of_at_least_t_shares_reconstructs(secret: bytes) -> None:
    shares = split_secret(secret, n=5, t=3)
    for size in (3, 4, 5):
        for subset in itertools.combinations(shares, size):
            assert combine_shares(list(subset), len(secret)) == secret


def test_t_minus_one_shares_are_consistent_with_every_candidate_secret() -> None:
    """Any 2 shares of a 3-of-5 sharing extend to a valid sharing of any other secret.

    For each candidate, the unique degree-2 polynomial through ``(0, candidate)`` and the two
    shares is built here with an independent Lagrange evaluation; its values at the other
    holders' points complete a sharing from which :func:`combine_shares` returns the candidate.
    So the two shares alone cannot tell which secret was shared.
    """
    secret = bytes(range(32))
    shares = split_secret(secret, n=5, t=3)
    candidates = [secret, bytes(32), b"\xff" * 32, bytes(reversed(range(32)))]

    def lagrange(points: list[tuple[int, int]], at: int) -> int:
        total = 0
        for i, (xi, yi) in enumerate(points):
            term = yi
            for j, (xj, _) in enumerate(points):
                if j != i:
                    term = term * (at - xj) * pow(xi - xj, -1, PRIME) % PRIME
            total += term
        return total % PRIME

    for known in itertools.combinations(shares, 2):
        for candidate in candidates:
            points = [(0, int.from_bytes(candidate, "big"))] + [(s.x, s.y) for s in known]
            others = [
                Share(x, lagrange(points, x)) for x in range(1, 6) if x not in {s.x for s in known}
            ]
            completed = [*known, *others]
            assert combine_shares(completed[:3], 32) == candidate
            assert combine_shares(others, 32) == candidate  # even from the 3 invented shares


def test_fewer_than_t_shares_do_not_give_the_secret() -> None:
    # f(x) = 0 + (p - 99) x + 12345 x^2: the line through f(1), f(2) meets x = 0 at
    # 2 f(1) - f(2) = -2 * 12345 = p - 24690, far above any 32-byte value.
    shares = split_secret(bytes(32), n=5, t=3, randbelow=scripted([PRIME - 99, 12345]))
    assert interpolate(shares[:2], 0) == PRIME - 24690
    with pytest.raises(ValueError, match="does not fit in 32 bytes"):
        combine_shares(shares[:2], 32)


def test_duplicate_x_is_rejected() -> None:
    shares = split_secret(b"secret", n=3, t=2)
    with pytest.raises(ValueError, match="duplicate share x=2"):
        combine_shares([shares[1], shares[1]], 6)


@pytest.mark.parametrize(
    ("secret", "n", "t", "message"),
    [
        (b"", 3, 2, "1 to 64 bytes"),
        (bytes(65), 3, 2, "1 to 64 bytes"),
        (b"s", 3, 0, "t must be >= 1"),
        (b"s", 2, 3, "t=3 <= n"),
    ],
)
def test_split_rejects_bad_arguments(secret: bytes, n: int, t: int, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        split_secret(secret, n, t)


def test_share_serialization_round_trip_and_bounds() -> None:
    share = Share(7, PRIME - 1)
    data = share.to_bytes()
    assert len(data) == SHARE_BYTES == 70
    assert Share.from_bytes(data) == share
    with pytest.raises(ValueError, match="70 bytes"):
        Share.from_bytes(data[:-1])
    with pytest.raises(ValueError, match="share x"):
        Share(0, 1)  # x = 0 would be the secret itself
    with pytest.raises(ValueError, match="share y"):
        Share(1, PRIME)


@settings(max_examples=60, deadline=None)
@given(
    secret=st.binary(min_size=1, max_size=64),
    n=st.integers(min_value=1, max_value=8),
    data=st.data(),
)
def test_round_trip_property(secret: bytes, n: int, data: st.DataObject) -> None:
    t = data.draw(st.integers(min_value=1, max_value=n))
    shares = split_secret(secret, n, t)
    subset = data.draw(st.permutations(shares))[:t]
    assert combine_shares(subset, len(secret)) == secret
