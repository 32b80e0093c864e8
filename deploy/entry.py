"""The ``dpmarket`` console script's entry point (pyproject.toml ``[project.scripts]``): the root
group of :mod:`dpmarket.deploy.cli`, which imports each command's module only when it runs."""

from __future__ import annotations

from dpmarket.deploy.cli import main

__all__ = ["main"]
