"""``dpmarket init``: a local deployment written from one's own tables, with a drafted schema
that nobody serves until it is confirmed."""

from __future__ import annotations

import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from click.testing import CliRunner
from cryptography import x509

from dpmarket.common.sketches.marginals import MarginalsMap
from dpmarket.common.sketches.spec import SketchDeclaration
from dpmarket.consumer.explore import Query, choose_source
from dpmarket.curator.sketches import load_declaration
from dpmarket.deploy.cli import main
from dpmarket.deploy.local import (
    ALLOCATION_EPSILON,
    ALLOCATION_FILE,
    CA_DIR,
    DEPLOYMENT_FILE,
    down,
    init_deployment,
    service_pki_dir,
    up,
)
from dpmarket.owner.policy import load_owner_policy
from dpmarket.runtime.identity import Identity, identity_files, key_fingerprint
from dpmarket.runtime.schemas import load_schema


def _tables(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    paths = {}
    for k, name in enumerate(("clinic-a", "clinic-b")):
        frame = pd.DataFrame(
            {
                "age": rng.integers(20 + 30 * k, 50 + 30 * k, 30),
                "bmi": rng.uniform(18, 40, 30).round(1),
                "high": rng.integers(0, 2, 30),
            }
        )
        paths[name] = tmp_path / f"{name}.csv"
        frame.to_csv(paths[name], index=False)
    return paths


def test_init_writes_pki_configs_policies_and_a_draft_schema(tmp_path: Path) -> None:
    root = tmp_path / "clinics"
    result = CliRunner().invoke(
        main,
        ["init", str(root), "--label", "high",
         *(f"--owner={n}={p}" for n, p in _tables(tmp_path).items())],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "is a DRAFT" in result.output and "disclose" in result.output
    lines = result.output.splitlines()
    assert lines[-3].strip().startswith(f"1. $EDITOR {root / 'schema.toml'}")
    assert lines[-2].strip() == f"2. dpmarket up {root}"
    assert (
        lines[-1]
        .strip()
        .startswith(f"3. dpmarket consumer request --config {root / 'consumer.toml'}")
    )

    schema = load_schema(root / "schema.toml")
    assert schema.draft and schema.label == "high" and schema.names == ("age", "bmi", "high")
    assert schema.column("high").type == "binary"
    with pytest.raises(ValueError, match="is a draft"):
        schema.check_confirmed()
    for identity in (
        Identity("curator", "curator"),
        Identity("consumer", "consumer"),
        Identity("owner", "clinic-a"),
        Identity("owner", "clinic-b"),
    ):
        pki_dir = root / service_pki_dir(identity)
        assert all(p.is_file() for p in identity_files(pki_dir, identity))
    owner = tomllib.loads((root / "owner-clinic-a.toml").read_text(encoding="utf-8"))
    curator = tomllib.loads((root / "curator.toml").read_text(encoding="utf-8"))
    assert owner["schema"] == "schema.toml" and owner["data-dir"] == "owners/clinic-a"
    assert curator["owner"][0] == f"clinic-a@127.0.0.1:{owner['port']}"
    assert owner["curator"] == f"127.0.0.1:{curator['port']}"
    assert (root / "owners" / "clinic-a" / "policy.toml").is_file()
    drafted = load_owner_policy(root / "owners" / "clinic-a" / "policy.toml")
    # The tutorial runs the candidates method: every drafted owner serves it (one operator runs
    # the whole deployment, its curator too), and says in the file what that reveals; none
    # trusts the curator with exact bids (the per-round methods), nor serves non-private
    # sessions.
    assert drafted.allow_steered_selection
    assert not drafted.allow_exact_bids and not drafted.allow_non_private
    text = (root / "owners" / "clinic-a" / "policy.toml").read_text()
    assert "allow_exact_bids = false" in text
    lines = text.splitlines()
    above = lines[: lines.index("allow_steered_selection = true")]
    note = " ".join(line for line in above[-9:] if line.startswith("# "))
    assert "a column's largest value" in note and "Set false" in note, note
    # A reward's statement tells each owner its count in the summary: the drafts do not consent,
    # and say in the file what consenting discloses.
    assert not drafted.allow_reward_disclosure
    above = lines[: lines.index("allow_reward_disclosure = false")]
    note = " ".join(line for line in above[-7:] if line.startswith("# "))
    assert "many of its points the summary holds" in note, note
    assert "request --reward" in note and "Set true only" in note, note
    # The catalogue drafts a marginals spec (Gaussian at delta 1e-6, its measurements planned
    # for the smallest owner's 30 rows, drafted as 30), which explore prefers for counts.
    declaration = SketchDeclaration.from_mapping(
        tomllib.loads((root / "sketches.toml").read_text(encoding="utf-8")),
        schema=schema,
    )
    specs = {s.kind: s for s in declaration.draw(np.random.default_rng(0))}
    assert declaration.spec_names()[-1] == "clinics/marginals"
    marginals = specs["marginals"]
    assert isinstance(marginals.feature_map, MarginalsMap)
    assert (marginals.noise, marginals.delta, marginals.feature_map.rows) == ("gaussian", 1e-6, 30)
    assert marginals.feature_map.block_sizes.tolist() == [8, 8, 2]  # high: its two levels
    count = Query("count", where=(("high", 1, 1),))
    assert choose_source(count, list(specs.values()), lambda s: 1.0)[0].kind == "marginals"
    services = tomllib.loads((root / DEPLOYMENT_FILE).read_text(encoding="utf-8"))["service"]
    assert [s["name"] for s in services] == ["clinic-a", "clinic-b", "curator"]
    # Each owner's ledger is created by init, bound to its certificate; the owner's config
    # serves its ledger command (its data directory is found through it).
    result = CliRunner().invoke(
        main, ["owner", "ledger", "verify", "--config", str(root / "owner-clinic-a.toml")]
    )
    assert result.exit_code == 0, result.output
    assert "of owner clinic-a, 0 charges" in result.output
    # A second init into the same folder is refused.
    with pytest.raises(FileExistsError):
        init_deployment(root, _tables(tmp_path))


def test_init_declares_the_allocation_sketch_over_the_features_and_the_curator_reads_it(
    tmp_path: Path,
) -> None:
    """The allocation's declaration sketches the schema's features (the label excluded: an
    owner's summarization points have only those, and the curator refuses a spec of another
    width at start); the curator's configuration loads it and names its RFF spec; the owners'
    policies allow publishing it at its epsilon."""
    root = tmp_path / "clinics"
    init_deployment(root, _tables(tmp_path), label="high")
    curator = tomllib.loads((root / "curator.toml").read_text(encoding="utf-8"))
    assert curator["sketch-spec"] == ["sketches.toml", ALLOCATION_FILE]
    assert curator["allocation-sketch-spec"] == "clinics-allocation/rff"
    schema = (root / "schema.toml").read_text(encoding="utf-8")
    (root / "schema.toml").write_text(schema.replace("draft = true", ""), encoding="utf-8")
    declaration = load_declaration(root / ALLOCATION_FILE)
    assert declaration.spec_names() == ["clinics-allocation/rff"]
    assert declaration.domain.names == ("age", "bmi")  # the features, in order; no label
    assert declaration.epsilon == ALLOCATION_EPSILON
    # Control: the catalogue's other declaration keeps the label (explore's logistic
    # regressions need it), which is why the allocation has its own.
    assert load_declaration(root / "sketches.toml").domain.names == ("age", "bmi", "high")
    for owner in ("clinic-a", "clinic-b"):
        policy = load_owner_policy(root / "owners" / owner / "policy.toml")
        assert policy.publish_sketches and policy.epsilon_per_sketch >= ALLOCATION_EPSILON
    # Without a label every column is a feature.
    bare = init_deployment(tmp_path / "bare", _tables(tmp_path))
    text = (bare.directory / ALLOCATION_FILE).read_text(encoding="utf-8")
    assert 'columns = ["age", "bmi", "high"]' in text


def test_init_keeps_the_ca_key_out_of_every_service_and_pins_the_owners(tmp_path: Path) -> None:
    """The CA's key is in ``ca/`` only, which no service configuration names; every service's
    PKI folder holds the CA certificate and its own key; each owner's policy pins every other
    owner's public key (and only theirs), as the certificates issued say."""
    root = tmp_path / "clinics"
    deployment = init_deployment(root, _tables(tmp_path), label="high")
    assert deployment.ca == root / CA_DIR
    assert sorted(p.name for p in (root / CA_DIR).iterdir()) == ["ca.crt", "ca.key"]
    assert [p for p in root.rglob("ca.key")] == [root / CA_DIR / "ca.key"]
    keys = {p.relative_to(root) for p in root.rglob("*.key")}
    assert keys == {
        Path(CA_DIR) / "ca.key",
        Path("pki/curator-curator/curator-curator.key"),
        Path("pki/consumer-consumer/consumer-consumer.key"),
        Path("pki/owner-clinic-a/owner-clinic-a.key"),
        Path("pki/owner-clinic-b/owner-clinic-b.key"),
    }
    configs = [*deployment.owners.values(), deployment.curator, deployment.consumer]
    for config in configs:
        values = tomllib.loads(config.read_text(encoding="utf-8"))
        pki_dir = root / values["pki-dir"]
        assert pki_dir.parent == root / "pki" and not (pki_dir / "ca.key").exists()
        assert CA_DIR not in Path(values["pki-dir"]).parts
        assert (pki_dir / "ca.crt").read_bytes() == (root / CA_DIR / "ca.crt").read_bytes()
        # Every service's own key only.
        assert len(list(pki_dir.glob("*.key"))) == 1
    pins = {}
    for name in ("clinic-a", "clinic-b"):
        identity = Identity("owner", name)
        cert = identity_files(root / service_pki_dir(identity), identity)[1]
        pins[name] = key_fingerprint(x509.load_pem_x509_certificate(cert.read_bytes()))
    for name, other in (("clinic-a", "clinic-b"), ("clinic-b", "clinic-a")):
        policy = load_owner_policy(root / "owners" / name / "policy.toml")
        assert policy.peer_pins == {other: pins[other]}


def test_init_refuses_tables_with_other_columns_naming_them(tmp_path: Path) -> None:
    tables = _tables(tmp_path)
    pd.read_csv(tables["clinic-b"])[["bmi", "age", "high"]].to_csv(tables["clinic-b"], index=False)
    with pytest.raises(ValueError, match=r"clinic-b\.csv has the columns \['bmi', 'age', 'high'\]"):
        init_deployment(tmp_path / "d", tables)
    pd.read_csv(tables["clinic-a"]).to_csv(tables["clinic-b"])  # with pandas' index column
    with pytest.raises(ValueError, match="has no name and holds 0, 1, 2"):
        init_deployment(tmp_path / "d", tables)
    assert not (tmp_path / "d").exists()


@pytest.mark.integration
def test_up_refuses_a_draft_schema_and_leaves_nothing_running(tmp_path: Path) -> None:
    root = tmp_path / "clinics"
    init_deployment(root, _tables(tmp_path), label="high")
    with pytest.raises(Exception, match="is a draft") as info:
        up(root)
    assert "owners refuse" not in str(info.value)  # the owner's own words, from its log
    assert list((root / "run").iterdir()) == []
    assert down(root) == []
