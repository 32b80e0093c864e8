"""The suite's order: its longest modules first, so that pytest-xdist's workers end together.

``make test`` hands each worker whole modules (``--dist loadfile``: a module's fixtures start
once), one after the other in collection order (``--no-loadscope-reorder``). xdist's own order,
the modules with the most tests first, ran the modules with few but long tests last (the
tutorial's module, one 95 s test, was unit 149 of 172 and started at 89 % of a full run): one
worker was still running them when the other had nothing left. In the order of their measured
seconds, longest first, the modules at the end are short ones and the workers' last tests end
within seconds of each other (longest-processing-time-first scheduling).

The seconds per module (every test's setup, call and teardown) are what a CI run measured,
recorded in ``tests/module_seconds.json``. ``make test`` measures them again on every run into
``out/module-seconds.json`` (``--record-module-seconds``); copy that file over the recorded one
when modules were added or have grown. A module the file does not list is placed by its markers:
one with a ``slow`` or ``integration`` test with the recorded modules of
:data:`UNLISTED_HEAVY_SECONDS`, any other after every recorded one. The order changes no test's
outcome: modules share nothing but session fixtures, which are built on first use.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path

import pytest

RECORDED = Path(__file__).with_name("module_seconds.json")
#: Seconds assumed for a module the record lacks that has a ``slow`` or ``integration`` test
#: (a module that starts processes takes 5-20 s; the median recorded integration module's).
UNLISTED_HEAVY_SECONDS = 10.0
#: Seconds assumed for any other module the record lacks (after every recorded module).
UNLISTED_SECONDS = 0.0


def _module(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def recorded_seconds(path: Path = RECORDED) -> dict[str, float]:
    """The recorded seconds per module path (``tests/...py``); empty when no file is there."""
    if not path.exists():
        return {}
    return {str(k): float(v) for k, v in json.loads(path.read_text(encoding="utf-8")).items()}


def longest_modules_first(items: list[pytest.Item], seconds: Mapping[str, float]) -> None:
    """Reorder ``items`` in place: modules by decreasing ``seconds`` (ties and unlisted light
    modules in collection order), each module's tests together and in their own order."""
    first: dict[str, int] = {}
    heavy: set[str] = set()
    for index, item in enumerate(items):
        module = _module(item.nodeid)
        first.setdefault(module, index)
        if item.get_closest_marker("slow") or item.get_closest_marker("integration"):
            heavy.add(module)

    def weight(module: str) -> float:
        if module in seconds:
            return seconds[module]
        return UNLISTED_HEAVY_SECONDS if module in heavy else UNLISTED_SECONDS

    items.sort(key=lambda item: (-weight(m := _module(item.nodeid)), first[m]))


class ModuleSeconds:
    """Sums every test report's duration by module, where the reports arrive (the controller
    under xdist), and writes them as JSON at the session's end, longest first."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: defaultdict[str, float] = defaultdict(float)

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[_module(report.nodeid)] += report.duration

    def pytest_sessionfinish(self) -> None:
        ranked = sorted(self.seconds.items(), key=lambda kv: -kv[1])
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = json.dumps({k: round(v, 1) for k, v in ranked}, indent=1)
        self.path.write_text(text + "\n", encoding="utf-8")


def register_recorder(config: pytest.Config, option: str | None) -> None:
    """Register a :class:`ModuleSeconds` writing to ``option`` (nothing when it is None, and
    nothing on an xdist worker: the controller receives every report)."""
    if option and not hasattr(config, "workerinput"):
        config.pluginmanager.register(ModuleSeconds(Path(option)), "module-seconds")
