"""Each method's configuration: only the fields it reads, each documented, checked and named."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from dpmarket.common.summarization.methods import (
    METHOD_CONFIGS,
    METHODS,
    PARAMETER_NAMES,
    CandidatesConfig,
    GreedyConfig,
    H2Fields,
    HashesConfig,
    PrivateConfig,
    RoundsConfig,
    SummarizationConfig,
    UniformConfig,
    config_from_fields,
    config_from_json,
    method_config,
    param_info,
)
from dpmarket.v1 import curator_pb2

#: What each method reads beyond p, d and gamma (the issue's list of the flat configuration's
#: fields, split by the code that reads them).
OWN_FIELDS = {
    "uniform": set(),
    "greedy": set(),
    "private": {
        "epsilon_validation",
        "iterations_initial",
        "iterations_subsequent",
        "epsilon_first_epoch",
        "epsilon_summary",
        "quantization_step",
        "auction",
        "epsilon_auction",
        "delta_owners",
        "delta_validation",
    },
    "rounds": {
        "epsilon_validation",
        "iterations_initial",
        "iterations_subsequent",
        "epsilon_first_epoch",
        "epsilon_summary",
        "quantization_step",
        "auction",
        "epsilon_validation_total",
        "epsilon_owners_total",
        "delta",
        "validation_release",
        "summary_release",
        "pool_scoring",
        "auction_share",
    },
    "candidates": {
        "epsilon_validation_total",
        "epsilon_owners_total",
        "delta",
        "allocation",
        "relevance_score",
        "relevance_norm_weight",
        "allocation_share",
        "embedding_prior",
        "shrinkage",
        "shrinkage_metric",
        "shrinkage_strength",
        "relevance_threshold",
        "candidate_even_share",
        "read_cap",
        "mass_cap",
        "candidate_multiple",
        "candidate_fraction",
        "embedding_rerank",
    },
}
OWN_FIELDS["hashes"] = OWN_FIELDS["candidates"] - {
    "candidate_multiple",
    "candidate_fraction",
    "embedding_rerank",
}


@pytest.mark.parametrize("name", sorted(METHOD_CONFIGS))
def test_each_method_holds_only_what_it_reads(name: str) -> None:
    cls = METHOD_CONFIGS[name]
    names = {f.name for f in dataclasses.fields(cls)}
    assert names == {"summary_size", "rff_dimension", "gamma"} | OWN_FIELDS[name]
    assert cls.name == name
    assert cls.method == ("candidates" if name == "hashes" else name)


def test_every_field_is_documented_with_its_unit_and_source() -> None:
    for cls in METHOD_CONFIGS.values():
        for f in dataclasses.fields(cls):
            info = param_info(f)
            assert info.help.endswith("."), (cls.name, f.name)
            assert info.unit and info.source, (cls.name, f.name)
            # The generated documentation names the field, its unit and its source.
            assert f"{f.name} :" in (cls.__doc__ or ""), (cls.name, f.name)
            assert info.source in (cls.__doc__ or "")


def test_the_wire_carries_every_field_but_the_summary_size() -> None:
    """``SummarizationParams`` has a field of the same name for each (the curator's convert
    module maps them once)."""
    wire = set(curator_pb2.SummarizationParams.DESCRIPTOR.fields_by_name)
    assert set(PARAMETER_NAMES) == wire
    assert set(METHODS) == set(METHOD_CONFIGS) - {"hashes"}


def test_the_base_and_the_shared_parts_are_not_configurations() -> None:
    with pytest.raises(TypeError, match="UniformConfig"):
        SummarizationConfig(summary_size=3)
    with pytest.raises(TypeError, match="shared part"):
        H2Fields(summary_size=3)


@pytest.mark.parametrize(
    ("cls", "changes", "message"),
    [
        (UniformConfig, {"summary_size": 0}, "summary_size must be an integer >= 1, got 0"),
        (PrivateConfig, {"quantization_step": 0.3}, "quantization_step must be in (0, 1]"),
        (PrivateConfig, {"delta_owners": 0.9}, "delta_owners must lie in (0, 0.367"),
        (RoundsConfig, {"summary_release": "both"}, "summary_release must be one of"),
        (RoundsConfig, {"auction_share": 0.0}, "auction_share must lie in (0, 1], got 0.0"),
        (CandidatesConfig, {"candidate_multiple": 0.5}, "candidate_multiple must be a finite"),
        (CandidatesConfig, {"allocation_share": 1.0}, "allocation_share must lie in (0, 1), or"),
        (HashesConfig, {"shrinkage": -1.0}, "shrinkage must be a finite number > 0, got -1.0"),
    ],
)
def test_a_value_out_of_range_is_refused_naming_the_field(
    cls: type[SummarizationConfig], changes: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError) as info:
        cls(**{"summary_size": 5, **changes})  # type: ignore[arg-type]
    assert message in str(info.value)


def test_a_field_another_method_reads_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="the uniform method does not read delta_owners"):
        method_config("uniform", summary_size=5, delta_owners=1e-4)
    with pytest.raises(TypeError):
        GreedyConfig(summary_size=5, auction="pure")  # type: ignore[call-arg]
    with pytest.raises(ValueError, match="method must be one of"):
        method_config("fastest", summary_size=5)


@pytest.mark.parametrize("name", sorted(METHOD_CONFIGS))
def test_a_configuration_survives_json(name: str) -> None:
    config = method_config(name, summary_size=7, gamma=0.25)
    again = config_from_json(json.loads(json.dumps(config.to_json())))
    assert again == config and type(again) is type(config)


def test_the_flat_form_before_the_typed_methods_still_reads() -> None:
    """A stored configuration of every field of every method (the curator's durable sessions
    before this release) gives the method's own configuration; the hashes mode was a form of
    the candidates method."""
    flat = {f: method_config_default(f) for f in PARAMETER_NAMES}
    flat.update(summary_size=9, method="private", delta_owners=1e-4)
    private = config_from_json(flat)
    assert private == PrivateConfig(summary_size=9, delta_owners=1e-4)
    hashes = config_from_json({**flat, "method": "candidates", "summary_form": "hashes"})
    assert hashes == HashesConfig(summary_size=9)
    with pytest.raises(ValueError, match="summary_form 'hashes' is a mode of the candidates"):
        config_from_fields("rounds", {"summary_size": 2, "summary_form": "hashes"})


def method_config_default(name: str) -> object:
    for cls in METHOD_CONFIGS.values():
        for f in dataclasses.fields(cls):
            if f.name == name:
                return f.default
    raise KeyError(name)


def test_the_private_methods_derived_parameters() -> None:
    """Table 1: T_init = floor(d^1.5) = 1656, eta = 1/d, epsilon_summary / sqrt(p T_subs)."""
    config = PrivateConfig(summary_size=20)
    assert config.t_init == math.floor(140**1.5) == 1656
    assert config.eta == pytest.approx(1 / 140)
    assert config.epsilon_per_later_iteration == pytest.approx(0.01 / math.sqrt(20 * 5))
    assert config.ledger_deltas() == (0.01, 1e-6)
    assert RoundsConfig(summary_size=2, delta=1e-7).ledger_deltas() == (1e-7, 1e-7)
