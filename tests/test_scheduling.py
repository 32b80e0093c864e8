"""The suite's order (tests/scheduling.py): modules longest first, each module's tests together
and in their own order; the seconds recorded per module, as the order reads them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import pytest

from tests import scheduling


@dataclass
class _Item:
    """What the ordering reads of a collected test: its node id and its markers."""

    nodeid: str
    markers: tuple[str, ...] = field(default=())

    def get_closest_marker(self, name: str) -> Any:
        return name if name in self.markers else None


@dataclass
class _Report:
    nodeid: str
    duration: float


def _ordered(items: list[_Item], seconds: dict[str, float]) -> list[str]:
    pytest_items = cast(list[pytest.Item], items)
    scheduling.longest_modules_first(pytest_items, seconds)
    return [item.nodeid for item in items]


def test_modules_go_longest_first_each_with_its_tests_together_in_order() -> None:
    items = [
        _Item("tests/a.py::test_1"),
        _Item("tests/b.py::test_1"),
        _Item("tests/a.py::test_2"),
        _Item("tests/c.py::T::test_1"),
        _Item("tests/b.py::test_2[x]"),
        _Item("tests/c.py::T::test_2"),
    ]
    order = _ordered(items, {"tests/a.py": 1.0, "tests/b.py": 50.0, "tests/c.py": 3.0})
    assert order == [
        "tests/b.py::test_1",
        "tests/b.py::test_2[x]",
        "tests/c.py::T::test_1",
        "tests/c.py::T::test_2",
        "tests/a.py::test_1",
        "tests/a.py::test_2",
    ]


def test_unrecorded_modules_are_placed_by_their_markers() -> None:
    """An unrecorded module with an integration or slow test counts as
    :data:`~tests.scheduling.UNLISTED_HEAVY_SECONDS`; any other goes after every recorded one,
    the unrecorded ones in collection order."""
    heavy = scheduling.UNLISTED_HEAVY_SECONDS
    items = [
        _Item("tests/light_new.py::test"),
        _Item("tests/other_new.py::test"),
        _Item("tests/short.py::test"),
        _Item("tests/integration_new.py::test_a"),
        _Item("tests/integration_new.py::test_b", ("integration",)),
        _Item("tests/slow_new.py::test", ("slow",)),
        _Item("tests/long.py::test"),
    ]
    seconds = {"tests/short.py": heavy / 10, "tests/long.py": heavy * 10}
    modules = [nodeid.split("::")[0] for nodeid in _ordered(items, seconds)]
    assert list(dict.fromkeys(modules)) == [
        "tests/long.py",
        "tests/integration_new.py",
        "tests/slow_new.py",
        "tests/short.py",
        "tests/light_new.py",
        "tests/other_new.py",
    ]


def test_the_record_sums_every_phase_by_module_and_reads_back_longest_first(
    tmp_path: Path,
) -> None:
    path = tmp_path / "out" / "module-seconds.json"
    recorder = scheduling.ModuleSeconds(path)
    for nodeid, duration in [
        ("tests/a.py::test_1", 1.0),  # setup
        ("tests/a.py::test_1", 2.0),  # call
        ("tests/b.py::test[1]", 10.0),
        ("tests/a.py::test_2", 0.5),
    ]:
        recorder.pytest_runtest_logreport(cast(pytest.TestReport, _Report(nodeid, duration)))
    recorder.pytest_sessionfinish()
    assert list(json.loads(path.read_text(encoding="utf-8")).items()) == [
        ("tests/b.py", 10.0),
        ("tests/a.py", 3.5),
    ]
    assert scheduling.recorded_seconds(path) == {"tests/b.py": 10.0, "tests/a.py": 3.5}
    assert scheduling.recorded_seconds(tmp_path / "missing.json") == {}


def test_the_recorded_seconds_name_test_modules() -> None:
    """tests/module_seconds.json: seconds >= 0 per test module path, as the recorder writes."""
    seconds = scheduling.recorded_seconds()
    assert seconds, f"{scheduling.RECORDED} is missing or empty"
    for module, value in seconds.items():
        assert module.startswith("tests/") and module.endswith(".py"), module
        assert value >= 0, (module, value)
