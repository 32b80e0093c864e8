"""Tests of dpmarket.consumer.cape_report: the curator's CAPE report read into typed fields, its
document given back unchanged (what ``--json`` prints), a malformed one refused; and the typed
model of an exploration (dpmarket.consumer.catalogue), printed with the keys it had."""

from __future__ import annotations

import json
import math
from typing import Any

import pytest

from dpmarket.common.errors import InvalidArgumentError
from dpmarket.common.privacy.ledger import SessionSpend
from dpmarket.consumer.cape_report import CapeMeanReport, CapeReport, CapeTrainingReport
from dpmarket.consumer.catalogue import GraphicalModel, M2MModel


def _common() -> dict[str, Any]:
    return {
        "task": "mean",
        "sites": ["owner-0", "owner-1", "owner-2"],
        "sizes": {"owner-0": 100, "owner-1": 120, "owner-2": 90},
        "noise_round_sites": ["owner-0", "owner-1", "owner-2"],
        "dropped": {},
        "noise_rounds": 1,
        "secure_aggregation": {"graph": "complete"},
        "epsilon": 1.0,
        "delta_target": 1e-6,
        "colluders": 0,
        "default_colluders": 0,
        "calibration": "exact",
        "delta_exact": 9.5e-7,
        "delta_theorem1": None,
        "kappa": 0.5,
        "sigma_z": 1.25,
        "owner_spend": {
            "owner-0": {
                "epsilon": 1.0,
                "delta": 1e-6,
                "points": 0,
                "non_private": False,
                "unknown": "",
            },
            "owner-1": {
                "epsilon": 0.0,
                "delta": 0.0,
                "points": 0,
                "non_private": False,
                "unknown": "owner unreachable",
            },
            "owner-2": {
                "epsilon": math.inf,
                "delta": 0.0,
                "points": 3,
                "non_private": True,
                "unknown": "",
            },
        },
        "seconds": {"open": 0.1, "total": 1.5},
    }


def _mean_document() -> dict[str, Any]:
    estimate = {
        "label": "x",
        "value": 0.5,
        "standard_error": 0.01,
        "interval": [0.48, 0.52],
        "level": 0.95,
        "method": "exact",
        "covers": "the mean of the records clamped into the bounds",
        "flags": [],
    }
    return {
        **_common(),
        "lost_at_release": [],
        "columns": ["x"],
        "aggregator_noise_std": 0.01,
        "site_noise_std": [0.02, 0.02, 0.02],
        "baseline_noise_std": {"pooled": 0.005, "conv": 0.03, "local": 0.05},
        "estimates": [estimate],
    }


def test_a_mean_report_reads_typed_and_gives_its_document_back() -> None:
    document = json.loads(json.dumps(_mean_document()))  # as the wire carries it
    report = CapeMeanReport.from_json(document)
    assert report.sites == ("owner-0", "owner-1", "owner-2")
    assert report.sizes["owner-1"] == 120 and report.noise_rounds == 1
    assert (report.epsilon, report.delta_exact, report.delta_theorem1) == (1.0, 9.5e-7, None)
    assert report.owner_spend["owner-0"] == SessionSpend(1.0, 1e-6, 0)
    assert report.owner_spend["owner-1"] == SessionSpend.unknown_because("owner unreachable")
    assert report.owner_spend["owner-2"].epsilon == math.inf
    assert report.aggregator_noise_std == 0.01 and report.baseline_noise_std["pooled"] == 0.005
    assert [e.label for e in report.estimates] == ["x"]
    assert report.seconds["total"] == 1.5
    # Every key the curator sent, those no field covers included, in --json's output.
    assert report.to_json() == document
    without = report.to_json(estimates=False)
    assert "estimates" not in without and without == {
        k: v for k, v in document.items() if k != "estimates"
    }
    assert CapeMeanReport.from_json(report.to_json()) == report


def test_a_training_report_reads_its_iterations() -> None:
    document = {
        **_common(),
        "task": "train",
        "segments": [{"sites": ["owner-0", "owner-1"], "iterations": [1, 4]}],
        "lost_at_release": {"owner-2": 3},
        "iterations": 4,
        "noise_std_per_iteration": [0.1, 0.1, 0.1, 0.12],
    }
    report = CapeTrainingReport.from_json(document)
    assert report.iterations == 4 and report.lost_at_release == {"owner-2": 3}
    assert report.noise_std_per_iteration[-1] == 0.12
    assert report.segments[0]["sites"] == ["owner-0", "owner-1"]
    assert report.to_json() == document


@pytest.mark.parametrize(
    ("key", "value"),
    [("sites", None), ("epsilon", "many"), ("owner_spend", {"owner-0": {"eps": 1}}), ("task", ...)],
)
def test_a_malformed_report_is_refused_naming_what(key: str, value: Any) -> None:
    document = _mean_document()
    if value is ...:
        del document[key]
    else:
        document[key] = value
    with pytest.raises(InvalidArgumentError, match="the curator's CAPE report is malformed"):
        CapeMeanReport.from_json(document)
    CapeMeanReport.from_json(_mean_document())  # the control: the same document, well formed


def test_the_common_fields_do_not_need_a_kinds_fields() -> None:
    assert CapeReport.from_json(_common()).colluders == 0
    with pytest.raises(InvalidArgumentError, match="lost_at_release"):
        CapeMeanReport.from_json(_common())


def test_an_explorations_model_prints_the_keys_it_had() -> None:
    m2m = M2MModel(n_synthetic=2000, seed=3, lambda_rule="theorem", lam=0.25, intercept=False)
    assert m2m.to_json() == {
        "m2m": {
            "n_synthetic": 2000,
            "seed": 3,
            "lambda_rule": "theorem",
            "lambda": 0.25,
            "intercept": False,
        }
    }
    assert GraphicalModel(bootstrap=32, seed=1).to_json() == {
        "graphical_model": {"bootstrap": 32, "seed": 1}
    }
