"""Primitives of secure aggregation: key agreement, AEAD, the mask generator, signatures."""

from __future__ import annotations

import os

import numpy as np
import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from dpmarket.common.errors import AbortedError
from dpmarket.common.secagg.crypto import (
    MASK_BLOCK_WORDS,
    NONCE_BYTES,
    TAG_BYTES,
    EcdsaSigner,
    EcdsaVerifier,
    MaskAccumulator,
    SecAggError,
    decrypt,
    encode_fields,
    encrypt,
    generate_private_key,
    mask_vector,
    prg_words,
    private_key_bytes,
    private_key_from_bytes,
    public_key_bytes,
    shared_key,
)


def test_secagg_error_is_a_value_error_and_an_abort() -> None:
    assert issubclass(SecAggError, ValueError)
    assert issubclass(SecAggError, AbortedError)


def test_shared_key_agrees_and_depends_on_info() -> None:
    a, b, c = generate_private_key(), generate_private_key(), generate_private_key()
    k_ab = shared_key(a, public_key_bytes(b), info=b"round 1")
    assert len(k_ab) == 32
    assert k_ab == shared_key(b, public_key_bytes(a), info=b"round 1")
    assert k_ab != shared_key(a, public_key_bytes(b), info=b"round 2")
    assert k_ab != shared_key(a, public_key_bytes(c), info=b"round 1")


def test_shared_key_refuses_bad_public_keys() -> None:
    a = generate_private_key()
    with pytest.raises(SecAggError, match="32 bytes"):
        shared_key(a, bytes(31), info=b"")
    with pytest.raises(SecAggError, match="key agreement failed"):
        shared_key(a, bytes(32), info=b"")  # a low-order point: the X25519 output is all zeros


def test_private_keys_come_from_the_injected_source_and_round_trip() -> None:
    fixed = generate_private_key(lambda n: b"\x11" * n)
    assert private_key_bytes(fixed) == b"\x11" * 32
    again = private_key_from_bytes(private_key_bytes(fixed))
    assert public_key_bytes(again) == public_key_bytes(fixed)
    assert private_key_bytes(generate_private_key()) != private_key_bytes(generate_private_key())
    with pytest.raises(SecAggError, match="32 bytes"):
        private_key_from_bytes(bytes(31))


def test_aead_round_trip_and_tampering_is_detected() -> None:
    key = os.urandom(32)
    ciphertext = encrypt(key, b"two shares", b"round|a|b")
    assert len(ciphertext) == NONCE_BYTES + len(b"two shares") + TAG_BYTES
    assert decrypt(key, ciphertext, b"round|a|b") == b"two shares"
    # Flip one bit in the nonce, the body and the tag in turn.
    for position in (0, NONCE_BYTES + 1, len(ciphertext) - 1):
        altered = bytearray(ciphertext)
        altered[position] ^= 0x01
        with pytest.raises(SecAggError, match="failed authentication"):
            decrypt(key, bytes(altered), b"round|a|b")
    with pytest.raises(SecAggError, match="failed authentication"):
        decrypt(key, ciphertext, b"round|b|a")  # misaddressed
    with pytest.raises(SecAggError, match="failed authentication"):
        decrypt(os.urandom(32), ciphertext, b"round|a|b")
    with pytest.raises(SecAggError, match="shorter than nonce and tag"):
        decrypt(key, ciphertext[:20], b"round|a|b")


def test_prg_is_aes256_counter_mode_from_block_two_little_endian() -> None:
    """Known answer by an independent construction: AES-256 of the counter blocks
    0^96 || 2, 0^96 || 3, ... (GCM's counter mode with the zero nonce)."""
    seed = bytes(range(32))
    words = prg_words(seed, 6)  # 48 bytes: 3 blocks
    ecb = Cipher(algorithms.AES(seed), modes.ECB()).encryptor()
    blocks = b"".join(ecb.update(bytes(12) + (i + 2).to_bytes(4, "big")) for i in range(3))
    expected = [int.from_bytes(blocks[8 * i : 8 * i + 8], "little") for i in range(6)]
    assert words.dtype == np.uint64
    assert words.tolist() == expected
    # A longer expansion starts with the shorter one (one keystream per key).
    np.testing.assert_array_equal(prg_words(seed, 100_001)[:6], words)


@pytest.mark.parametrize("length", [0, 5, MASK_BLOCK_WORDS, 2 * MASK_BLOCK_WORDS + 7])
def test_mask_accumulator_adds_and_subtracts_whole_expansions(length: int) -> None:
    """Block by block, every mask's words are prg_words' (its stream continues across blocks)."""
    adds, subtracts = [os.urandom(32) for _ in range(3)], [os.urandom(32) for _ in range(2)]
    start = np.arange(length, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    total = start.copy()
    MaskAccumulator(length).apply(total, add=adds, subtract=subtracts)
    expected = start.copy()
    for seed in adds:
        expected += prg_words(seed, length)
    for seed in subtracts:
        expected -= prg_words(seed, length)
    np.testing.assert_array_equal(total, expected)
    one = start.copy()
    MaskAccumulator(length).add(one, adds[0])
    MaskAccumulator(length).subtract(one, adds[0])
    np.testing.assert_array_equal(one, start)


def test_mask_accumulator_rejects_bad_arguments_and_leaves_the_vector() -> None:
    total = np.arange(10, dtype=np.uint64)
    with pytest.raises(ValueError, match="seed must be 32 bytes"):
        MaskAccumulator(10).apply(total, add=[os.urandom(32)], subtract=[bytes(16)])
    np.testing.assert_array_equal(total, np.arange(10, dtype=np.uint64))
    with pytest.raises(ValueError, match="uint64 vector of 10 entries"):
        MaskAccumulator(10).add(np.zeros(9, dtype=np.uint64), os.urandom(32))


def test_mask_vector_keeps_the_low_bits() -> None:
    seed = os.urandom(32)
    masks = mask_vector(seed, 10_000, 13)
    assert masks.dtype == np.uint64 and masks.shape == (10_000,)
    assert int(masks.max()) < 2**13
    np.testing.assert_array_equal(masks, prg_words(seed, 10_000) & np.uint64(2**13 - 1))
    np.testing.assert_array_equal(mask_vector(seed, 10_000, 13), masks)  # deterministic
    other = mask_vector(os.urandom(32), 10_000, 13)
    assert np.mean(other == masks) < 0.01  # 2^-13 expected
    assert mask_vector(seed, 0, 13).shape == (0,)
    assert int(mask_vector(seed, 1000, 64).max()) >= 2**60  # all 64 bits are used


@pytest.mark.parametrize(
    ("seed", "length", "bits", "message"),
    [
        (bytes(16), 10, 8, "seed must be 32 bytes"),
        (bytes(32), -1, 8, "length must lie in"),
        (bytes(32), 10, 0, "modulus_bits must lie in"),
        (bytes(32), 10, 65, "modulus_bits must lie in"),
    ],
)
def test_mask_vector_rejects_bad_arguments(
    seed: bytes, length: int, bits: int, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        mask_vector(seed, length, bits)


def test_encode_fields_is_unambiguous() -> None:
    assert encode_fields(b"ab", b"c") != encode_fields(b"a", b"bc")
    assert encode_fields(b"ab", b"") != encode_fields(b"ab")
    assert encode_fields(b"xy") == b"\x00\x00\x00\x02xy"


def test_ecdsa_signer_and_verifier() -> None:
    alice, bob = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    verifier = EcdsaVerifier({"alice": alice.public_key(), "bob": bob.public_key()})
    signature = EcdsaSigner(alice).sign(b"keys")
    verifier.verify("alice", b"keys", signature)
    with pytest.raises(SecAggError, match="signature of site 'bob' does not verify"):
        verifier.verify("bob", b"keys", signature)
    with pytest.raises(SecAggError, match="signature of site 'alice' does not verify"):
        verifier.verify("alice", b"other keys", signature)
    with pytest.raises(SecAggError, match="no identity key"):
        verifier.verify("carol", b"keys", signature)
    with pytest.raises(ValueError, match="P-256"):
        EcdsaSigner(ec.generate_private_key(ec.SECP384R1()))
