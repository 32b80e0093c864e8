"""The curator's sketch catalogue: specs drawn once and kept across restarts, declarations and
publications checked against the curator's policy and the spec, one sketch per owner and spec,
and the ``published`` interface the summarizer's allocation reads."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dpmarket.common.errors import (
    AlreadyExistsError,
    FailedPreconditionError,
    InvalidArgumentError,
    NotFoundError,
    PermissionDeniedError,
)
from dpmarket.common.privacy.noise import SeededNoise
from dpmarket.common.sketches.sketch import PrivateSketch
from dpmarket.common.sketches.spec import SketchDeclaration
from dpmarket.curator.policy import CuratorPolicy, policy_from_mapping
from dpmarket.curator.sketches import SketchCatalog, load_declaration
from tests.conftest import sketch_mechanism

ROOT = Path(__file__).resolve().parents[2]
DATA: dict[str, Any] = {
    "name": "toy",
    "mechanism": {"epsilon": 1.0, "epsilon_range": [0.5, 2.0]},
    "columns": [
        {"name": "a", "low": 0, "high": 1},
        {"name": "b", "low": -10, "high": 10},
    ],
    "maps": {
        "rff": {"frequencies": 8, "sigma": 0.5},
        "race": {"hashes": 3, "buckets": 5, "width": 0.25},
        "hist": {"bins": 4},
    },
}
DECLARATION = SketchDeclaration.from_mapping(DATA)


def _records(seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.column_stack([rng.uniform(0, 1, 100), rng.uniform(-10, 10, 100)])


def _sketch(
    catalog: SketchCatalog, spec: str, seed: int = 0, epsilon: float = 1.0
) -> PrivateSketch:
    return sketch_mechanism(catalog.spec(spec), epsilon).release(
        _records(seed), SeededNoise(np.random.default_rng(seed))
    )


def test_specs_are_drawn_once_and_kept_across_restarts(tmp_path: Path) -> None:
    with SketchCatalog(tmp_path, [DECLARATION]) as catalog:  # a CSPRNG draws them
        keys = {s.name: s.key for s in catalog.specs()}
        assert list(keys) == ["toy/rff", "toy/race", "toy/hist"]
    with SketchCatalog(tmp_path, [DECLARATION], seed=1) as catalog:  # a seed changes nothing now
        assert {s.name: s.key for s in catalog.specs()} == keys
    with SketchCatalog(tmp_path) as catalog:  # served without their file
        assert {s.name: s.key for s in catalog.specs()} == keys
    changed = copy.deepcopy(DATA)
    changed["maps"]["rff"]["sigma"] = 0.25
    with pytest.raises(InvalidArgumentError, match="'toy' differs from the one this catalogue"):
        SketchCatalog(tmp_path, [SketchDeclaration.from_mapping(changed)])
    with (
        SketchCatalog(tmp_path) as catalog,
        pytest.raises(NotFoundError, match=r"no sketch spec 'toy/pca'.*toy/rff"),
    ):
        catalog.spec("toy/pca")


def test_declarations_are_bounded_by_the_curators_policy(tmp_path: Path) -> None:
    policy = policy_from_mapping({"requests": {"sketch_rff_frequencies": [1, 4]}})
    with pytest.raises(InvalidArgumentError, match=r"RFF m' = 8 is outside .* \[1, 4\]"):
        SketchCatalog(tmp_path, [DECLARATION], policy=policy)
    policy = policy_from_mapping({"requests": {"sketch_epsilon": [0.5, 1.0]}})
    with pytest.raises(InvalidArgumentError, match=r"highest epsilon = 2 is outside"):
        SketchCatalog(tmp_path, [DECLARATION], policy=policy)
    assert not (tmp_path / "curator.sqlite3").exists() or SketchCatalog(tmp_path).specs() == []


def test_the_shipped_declaration_fits_the_default_policy(tmp_path: Path) -> None:
    declaration = load_declaration(ROOT / "deploy" / "sketches" / "flights.toml")
    CuratorPolicy().check_sketch_declaration(declaration)
    assert declaration.spec_names() == ["flights/rff", "flights/race", "flights/hist"]
    assert list(declaration.domain.names) == ["month", "hour", "distance", "air_time", "delayed"]


def test_a_marginals_map_without_delta_fits_the_default_policy() -> None:
    """A Laplace declaration whose marginals map states no delta gets the default delta, which
    the curator's policy accepts (not a delta of 0, which it refuses for a Gaussian sketch)."""
    declaration = SketchDeclaration.from_mapping(
        {
            "name": "m",
            "columns": [{"name": "k", "low": 0, "high": 2, "levels": [0, 1, 2]}],
            "maps": {"marginals": {"bins": 4}},
        }
    )
    CuratorPolicy().check_sketch_declaration(declaration)


def test_publications_are_checked_and_kept_one_per_owner_and_spec(tmp_path: Path) -> None:
    policy = CuratorPolicy(sketches_per_owner=2)
    with SketchCatalog(tmp_path, [DECLARATION], seed=0, policy=policy, owners=["o1", "o2"]) as c:
        sketch = _sketch(c, "toy/rff")
        entry, again = c.publish("o1", "toy/rff", sketch)
        assert not again and entry.owner == "o1"
        entry2, again = c.publish("o1", "toy/rff", sketch)
        assert again and entry2.published_at == entry.published_at
        with pytest.raises(AlreadyExistsError, match="already published another sketch"):
            c.publish("o1", "toy/rff", _sketch(c, "toy/rff", seed=1))
        with pytest.raises(InvalidArgumentError, match="not the one of spec toy/race"):
            c.publish("o1", "toy/race", sketch)
        with pytest.raises(InvalidArgumentError, match="outside the range spec toy/race"):
            c.publish("o1", "toy/race", _wide_epsilon(c, "toy/race", 3.0))
        with pytest.raises(PermissionDeniedError, match="'o3' is not one of this curator's"):
            c.publish("o3", "toy/race", _sketch(c, "toy/race"))
        c.publish("o1", "toy/hist", _sketch(c, "toy/hist"))
        assert c.status("o1", "toy/race") == (False, 0)
        with pytest.raises(FailedPreconditionError, match=r"sketches.per_owner = 2"):
            c.publish("o1", "toy/race", _sketch(c, "toy/race"))
        assert [e.owner for e in c.sketches("toy/rff")] == ["o1"]


def _wide_epsilon(catalog: SketchCatalog, name: str, epsilon: float) -> PrivateSketch:
    """A sketch under the spec's map at an epsilon the spec does not accept."""
    from dpmarket.common.sketches.sketch import SketchMechanism

    spec = catalog.spec(name)
    mech = SketchMechanism(spec.feature_map, spec.domain, epsilon, "laplace")
    return mech.release(_records(), SeededNoise(np.random.default_rng(0)))


def test_a_publication_outside_the_policys_epsilon_is_refused(tmp_path: Path) -> None:
    policy = policy_from_mapping({"requests": {"sketch_epsilon": [0.5, 2.0]}})
    with SketchCatalog(tmp_path, [DECLARATION], seed=0) as c:
        sketch = _sketch(c, "toy/rff", epsilon=0.5)
    with (
        SketchCatalog(
            tmp_path, policy=policy.with_overrides(ranges={"sketch_epsilon": (0.6, 2.0)})
        ) as c,
        pytest.raises(InvalidArgumentError, match=r"the sketch's epsilon = 0.5 is outside"),
    ):
        c.publish("o1", "toy/rff", sketch)


def test_published_is_the_allocation_interface(tmp_path: Path) -> None:
    with SketchCatalog(tmp_path, [DECLARATION], seed=0) as c:
        assert c.published(["o1", "o2"]) == {}
        rff = {o: _sketch(c, "toy/rff", seed=k) for k, o in enumerate(["o1", "o2", "o3"])}
        for owner, sketch in rff.items():
            c.publish(owner, "toy/rff", sketch)
        c.publish("o1", "toy/hist", _sketch(c, "toy/hist"))
        got = c.published(["o2", "o1", "o9"])
        assert sorted(got) == ["o1", "o2"]
        for owner, sketch in got.items():
            assert sketch.feature_map.kind == "rff"
            assert sketch.noisy_sum.tobytes() == rff[owner].noisy_sum.tobytes()
        with pytest.raises(InvalidArgumentError, match="hist spec, not an RFF one"):
            c.published(["o1"], spec="toy/hist")
    with SketchCatalog(tmp_path) as c:  # the catalogue survives a restart
        assert sorted(c.published(["o1", "o2", "o3"])) == ["o1", "o2", "o3"]
        assert [e.owner for e in c.sketches("toy/hist")] == ["o1"]


def test_a_session_manager_reads_only_an_rff_spec_of_its_catalogue(tmp_path: Path) -> None:
    from dpmarket.curator.sessions import SessionManager

    with pytest.raises(InvalidArgumentError, match="needs a sketch catalogue"):
        SessionManager([], allocation_spec="toy/rff")
    with SketchCatalog(tmp_path, [DECLARATION], seed=0) as c:
        with pytest.raises(InvalidArgumentError, match="'toy/hist' is a hist spec"):
            SessionManager([], sketches=c, allocation_spec="toy/hist")
        with pytest.raises(NotFoundError, match="toy/pca"):
            SessionManager([], sketches=c, allocation_spec="toy/pca")
        assert SessionManager([], sketches=c, allocation_spec="toy/rff").allocation_spec == (
            "toy/rff"
        )


def test_a_declaration_takes_its_columns_from_a_schema_file(tmp_path: Path) -> None:
    (tmp_path / "schema.toml").write_text(
        'label = "b"\n\n[[columns]]\nname = "a"\nlow = 0\nhigh = 1\n\n'
        '[[columns]]\nname = "b"\ntype = "binary"\n\n'
        '[[columns]]\nname = "c"\ntype = "integer"\nlow = -10\nhigh = 10\n',
        encoding="utf-8",
    )
    path = tmp_path / "clinics.toml"
    path.write_text(
        'schema = "schema.toml"\ncolumns = ["a", "c"]\n[maps.hist]\nbins = 4\n', encoding="utf-8"
    )
    declaration = load_declaration(path)
    inline = copy.deepcopy(DATA)
    inline["columns"][1]["name"] = "c"
    inline["maps"] = {"hist": {"bins": 4}}
    expected = SketchDeclaration.from_mapping(inline, default_name="clinics")
    assert declaration.domain == expected.domain
    assert declaration.as_dict()["columns"] == expected.as_dict()["columns"]
    path.write_text('schema = "schema.toml"\n[maps.hist]\nbins = 4\n', encoding="utf-8")
    whole = load_declaration(path)
    assert whole.domain.names == ("a", "b", "c") and whole.domain.level_values(1) is not None
    (tmp_path / "schema.toml").write_text(
        'draft = true\n\n[[columns]]\nname = "a"\nlow = 0\nhigh = 1\n', encoding="utf-8"
    )
    with pytest.raises(InvalidArgumentError, match="is a draft"):
        load_declaration(path)
