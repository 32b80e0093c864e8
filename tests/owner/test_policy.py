"""The owner's policy file: defaults, a lossless TOML round trip, and errors that name the key."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from pathlib import Path
from typing import Any

import pytest

from dpmarket.common.market.pricing import PRICE_KEYS
from dpmarket.owner.policy import OwnerPolicy, load_owner_policy

EXAMPLE = Path(__file__).resolve().parents[2] / "deploy" / "policies" / "owner.toml"


def test_defaults() -> None:
    p = OwnerPolicy()
    assert p.as_dict() == {
        "epsilon_total": 10.0,
        "delta_total": 1e-5,
        "window_days": 0.0,
        "points_total": 20000,
        "epsilon_per_session": 2.0,
        "delta_per_session": 1e-6,
        "points_per_session": 1000,
        "points_fraction_per_session": 0.25,
        "rounds_per_point": 1,
        "allow_non_private": False,
        "allow_exact_bids": False,
        "allow_steered_selection": False,
        "allow_reward_disclosure": False,
        "curators": ["curator"],
        "max_sessions": 8,
        "session_idle_timeout_seconds": 600.0,
        "max_rff_dimension": 4096,
        "session_memory_mib": 4096.0,
        "step_seconds": 3600.0,
        "publish_sketches": True,
        "epsilon_per_sketch": 1.0,
        "cape_min_colluders": 1,
        "peers": {},
        "prices": {k: "0.000000" for k in PRICE_KEYS},
    }
    assert p.window_description == "the lifetime"


def test_empty_file_gives_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("")
    assert load_owner_policy(path) == OwnerPolicy()


def test_example_file_documents_the_defaults() -> None:
    assert load_owner_policy(EXAMPLE) == OwnerPolicy()


def test_partial_file_keeps_the_other_defaults(tmp_path: Path) -> None:
    path = tmp_path / "p.toml"
    path.write_text("[budget]\nepsilon = 3\nwindow_days = 30\n[access]\ncurators = ['a', 'b']\n")
    p = load_owner_policy(path)
    assert p == OwnerPolicy(epsilon_total=3.0, window_days=30.0, curators=("a", "b"))
    assert isinstance(p.epsilon_total, float)
    assert p.window_description == "the last 30 days"
    assert p.window_seconds == 30 * 86400


def test_toml_round_trip(tmp_path: Path) -> None:
    p = OwnerPolicy(
        epsilon_total=7.25,
        delta_total=3e-7,
        window_days=0.5,
        points_total=12345,
        epsilon_per_session=0.1,
        delta_per_session=0.0,
        points_per_session=17,
        points_fraction_per_session=0.29,
        rounds_per_point=7,
        allow_non_private=True,
        allow_exact_bids=True,
        allow_steered_selection=True,
        curators=("curator-1", 'we"ird\\name\x01'),
        max_sessions=3,
        session_idle_timeout_seconds=12.5,
        max_rff_dimension=512,
        publish_sketches=False,
        epsilon_per_sketch=0.25,
        cape_min_colluders=0,
        peers=(("owner-b", "AB" * 32), ("owner-a", "sha256:" + ":".join(["0f"] * 32))),
    )
    assert p.peers == (("owner-a", "0f" * 32), ("owner-b", "ab" * 32))
    text = p.to_toml()
    assert OwnerPolicy.from_mapping(tomllib.loads(text)) == p
    path = tmp_path / "p.toml"
    path.write_text(text, encoding="utf-8")
    assert load_owner_policy(path) == p
    assert OwnerPolicy.from_mapping(tomllib.loads(OwnerPolicy().to_toml())) == OwnerPolicy()


def test_notes_are_comments_above_their_keys_and_change_nothing() -> None:
    """A drafted policy says why a key is set (``dpmarket init``); the notes are comments."""
    p = OwnerPolicy(allow_steered_selection=True)
    text = p.to_toml({"allow_steered_selection": "why\nand what it reveals"})
    lines = text.splitlines()
    at = lines.index("allow_steered_selection = true")
    assert lines[at - 2 : at] == ["# why", "# and what it reveals"]
    assert OwnerPolicy.from_mapping(tomllib.loads(text)) == p
    with pytest.raises(ValueError, match="allow_steered"):
        p.to_toml({"allow_steered": "misspelt"})


def test_missing_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"nope\.toml"):
        load_owner_policy(tmp_path / "nope.toml")


def test_invalid_toml_is_named(tmp_path: Path) -> None:
    path = tmp_path / "bad.toml"
    path.write_text("[budget\n")
    with pytest.raises(ValueError, match=r"bad\.toml.*TOML"):
        load_owner_policy(path)


@pytest.mark.parametrize(
    ("text", "key", "allowed"),
    [
        # unknown sections and keys
        ("[budgets]\nepsilon = 1\n", r"\[budgets\]", r"\[budget\]"),
        ("[budget]\neps = 1\n", r"budget\.eps", "epsilon"),
        ("[session]\nwindow_days = 1\n", r"session\.window_days", "epsilon"),
        ("budget = 1\n", r"\[budget\]", "table"),
        # wrong types
        ("[budget]\nepsilon = '1'\n", r"budget\.epsilon", "number"),
        ("[budget]\nepsilon = true\n", r"budget\.epsilon", "number"),
        ("[budget]\npoints = true\n", r"budget\.points", "integer >= 1"),
        ("[budget]\npoints = 100.0\n", r"budget\.points", "integer >= 1"),
        ("[session]\npoints = '10'\n", r"session\.points", "integer >= 1"),
        ("[access]\nallow_non_private = 1\n", r"access\.allow_non_private", "true or false"),
        ("[access]\nallow_exact_bids = 'no'\n", r"access\.allow_exact_bids", "true or false"),
        ("[session]\nrounds_per_point = 1.5\n", r"session\.rounds_per_point", "integer >= 1"),
        ("[session]\nrounds_per_point = 0\n", r"session\.rounds_per_point", "integer >= 1"),
        ("[access]\ncurators = 'curator'\n", r"access\.curators", "list of names"),
        ("[access]\ncurators = [1]\n", r"access\.curators", "non-empty string"),
        ("[limits]\nmax_sessions = 2.5\n", r"limits\.max_sessions", "integer >= 1"),
        # out of range
        ("[budget]\nepsilon = 0\n", r"budget\.epsilon", "finite and > 0"),
        ("[budget]\nepsilon = -1.0\n", r"budget\.epsilon", "finite and > 0"),
        ("[budget]\nepsilon = inf\n", r"budget\.epsilon", "finite and > 0"),
        ("[budget]\nepsilon = nan\n", r"budget\.epsilon", "finite and > 0"),
        ("[budget]\ndelta = 1.0\n", r"budget\.delta", r"\[0, 1\)"),
        ("[budget]\ndelta = -1e-9\n", r"budget\.delta", r"\[0, 1\)"),
        ("[budget]\nwindow_days = -1\n", r"budget\.window_days", ">= 0"),
        ("[budget]\nwindow_days = inf\n", r"budget\.window_days", ">= 0"),
        ("[budget]\npoints = 0\n", r"budget\.points", "integer >= 1"),
        ("[session]\nepsilon = 11\n", r"session\.epsilon", r"<= budget\.epsilon"),
        ("[session]\nepsilon = 0\n", r"session\.epsilon", "finite and > 0"),
        ("[session]\ndelta = 1e-4\n", r"session\.delta", r"<= budget\.delta"),
        ("[session]\ndelta = 1\n", r"session\.delta", r"\[0, 1\)"),
        ("[session]\npoints = 20001\n", r"session\.points", r"<= budget\.points"),
        ("[session]\npoints = -5\n", r"session\.points", "integer >= 1"),
        ("[session]\npoints_fraction = 0\n", r"session\.points_fraction", r"\(0, 1\]"),
        ("[session]\npoints_fraction = 1.5\n", r"session\.points_fraction", r"\(0, 1\]"),
        ("[session]\npoints_fraction = nan\n", r"session\.points_fraction", r"\(0, 1\]"),
        ("[session]\npoints_fraction = '10%'\n", r"session\.points_fraction", "number"),
        ("[access]\ncurators = []\n", r"access\.curators", "at least one"),
        ("[access]\ncurators = ['a', '']\n", r"access\.curators", "non-empty string"),
        ("[access]\ncurators = ['a', 'a']\n", r"access\.curators", "repeat"),
        ("[limits]\nmax_sessions = 0\n", r"limits\.max_sessions", "integer >= 1"),
        (
            "[limits]\nsession_idle_timeout_seconds = 0\n",
            r"limits\.session_idle_timeout_seconds",
            "finite and > 0",
        ),
        ("[limits]\nmax_rff_dimension = 0\n", r"limits\.max_rff_dimension", "integer >= 1"),
        ("[cape]\nmin_colluders = -1\n", r"cape\.min_colluders", "integer >= 0"),
        ("[cape]\nmin_colluders = 1.5\n", r"cape\.min_colluders", "integer >= 0"),
        ("[cape]\nmin_colluders = true\n", r"cape\.min_colluders", "integer >= 0"),
        ("[cape]\ncolluders = 1\n", r"cape\.colluders", "min_colluders"),
        ("peers = 1\n", r"\[peers\]", "table"),
        ("[peers]\nowner-1 = 'abc'\n", r"\[peers\] owner-1", "64 hexadecimal digits"),
        ("[peers]\nowner-1 = 12\n", r"\[peers\] owner-1", "string"),
        (f"[peers]\n'owner 1' = '{'a' * 64}'\n", r"\[peers\]", "not an owner name"),
    ],
)
def test_every_error_names_the_file_and_key(
    tmp_path: Path, text: str, key: str, allowed: str
) -> None:
    path = tmp_path / "policy.toml"
    path.write_text(text)
    with pytest.raises(ValueError, match=r"policy\.toml") as info:
        load_owner_policy(path)
    message = str(info.value)
    assert re.search(key, message), message
    assert re.search(allowed, message), message


@pytest.mark.parametrize(
    ("field", "value", "key"),
    [
        ("epsilon_total", 0.0, "budget.epsilon"),
        ("delta_per_session", 0.5, "session.delta"),
        ("points_total", True, "budget.points"),
        ("curators", (), "access.curators"),
        ("allow_non_private", "yes", "access.allow_non_private"),
        ("allow_exact_bids", 1, "access.allow_exact_bids"),
        ("allow_steered_selection", "yes", "access.allow_steered_selection"),
        ("allow_reward_disclosure", 1, "access.allow_reward_disclosure"),
        ("rounds_per_point", 0, "session.rounds_per_point"),
    ],
)
def test_direct_construction_is_validated(field: str, value: Any, key: str) -> None:
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        dataclasses.replace(OwnerPolicy(), **{field: value})


@pytest.mark.parametrize(
    ("fraction", "points", "rows", "expected"),
    [
        (0.25, 1000, 837, 209),  # the table: a quarter, not all 837 rows
        (0.25, 1000, 10**6, 1000),  # a large table: the session's points bound it
        (0.29, 1000, 100, 29),  # the decimal written, not the binary product (28.999...)
        (0.1, 1000, 9, 0),  # rounded down: a table of 9 rows gives no point at 10 %
        (1.0, 50, 837, 50),
        (1.0, 1000, 837, 837),
    ],
)
def test_a_session_reads_at_most_its_fraction_of_the_table(
    fraction: float, points: int, rows: int, expected: int
) -> None:
    policy = OwnerPolicy(points_per_session=points, points_fraction_per_session=fraction)
    assert policy.session_points(rows) == expected


def test_policy_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        OwnerPolicy().epsilon_total = 1.0  # type: ignore[misc]


def test_the_policy_lives_in_the_data_dir_and_a_differing_one_is_refused(tmp_path: Path) -> None:
    from dpmarket.owner.policy import POLICY_FILE, data_dir_policy

    state = tmp_path / "state"
    policy, source = data_dir_policy(state)
    assert policy == OwnerPolicy() and "built-in defaults" in source
    assert not state.exists()  # reading creates nothing
    strict = tmp_path / "strict.toml"
    strict.write_text("[budget]\nepsilon = 3.0\n", encoding="utf-8")
    policy, source = data_dir_policy(state, strict)
    assert policy.epsilon_total == 3.0 and "installed from" in source
    assert (state / POLICY_FILE).read_text(encoding="utf-8") == strict.read_text(encoding="utf-8")
    assert data_dir_policy(state)[0] == policy  # every later command reads it
    assert data_dir_policy(state, strict)[0] == policy  # the same file again agrees
    loose = tmp_path / "loose.toml"
    loose.write_text("[budget]\nepsilon = 30.0\n", encoding="utf-8")
    with pytest.raises(ValueError, match="differs from the owner's policy"):
        data_dir_policy(state, loose)


def test_the_curators_vocabulary_of_policy_keys_is_the_policy_files() -> None:
    """A curator names an owner's refusal by the keys of :data:`POLICY_KEYS` alone
    (:mod:`dpmarket.curator.disclosure`): the list is exactly the keys a policy file has."""
    from dpmarket.common.policy_keys import POLICY_KEYS
    from dpmarket.owner.policy import _KEY_OF_FIELD

    assert sorted(_KEY_OF_FIELD.values()) == sorted(POLICY_KEYS)
