"""Fitted marginals models on disk, so that a one-shot ``dpmarket consumer explore`` refits nothing.

A sketch's graphical model and its bootstrap refits
(:meth:`dpmarket.consumer.explore.MarginalsExplorer.models`) are kept in the consumer's data
directory (``DATA_DIR/explore-models/``), one ``.npz`` file per cache key (spec, sketch content
digest, bootstrap size, seed): every model's :meth:`~dpmarket.common.sketches.marginals.
MarginalsModel.state` (its total, its ``mbi`` potentials and marginals and its calibrated beliefs,
as float64 tables). Nothing is pickled: the file holds arrays and one JSON header, read with
``allow_pickle=False``. A loaded model is rebuilt from the same tables (nothing refitted or
compiled), so its answers are the fitted model's bit for bit. A
file that cannot be read, or whose header is not the key's, is ignored (the caller refits and
overwrites it). The folder keeps the :data:`KEEP` most recently written files.

The models are post-processing of public releases: the folder holds nothing the catalogue does
not give the consumer.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from dpmarket.common.sketches.marginals import MarginalsMap, MarginalsModel, Measurement

__all__ = ["FOLDER", "KEEP", "MAX_BYTES", "load", "path_of", "save"]

logger = logging.getLogger(__name__)

#: The folder under the consumer's data directory.
FOLDER = "explore-models"
#: Files kept (the oldest written are deleted beyond it).
KEEP = 16
#: A sketch's models larger than this (bytes of float64 tables) are not written.
MAX_BYTES = 256 << 20
#: Written: format 3 keeps each model's junction-tree edges (a kept model is then read without
#: importing ``mbi``: :meth:`MarginalsModel.from_state`); a format 2 file is still read, and
#: written again in format 3.
_FORMAT = 3
_READ_FORMATS = (2, 3)
_PARTS = ("potentials", "marginals", "beliefs")

Fitted = tuple[MarginalsModel, list[MarginalsModel]]


def path_of(folder: Path, key: Sequence[Any]) -> Path:
    """The file of ``key`` in ``folder``."""
    name = hashlib.sha256(json.dumps(list(key)).encode()).hexdigest()[:32]
    return folder / f"{name}.npz"


def save(folder: Path, key: Sequence[Any], fitted: Fitted) -> None:
    """Write a sketch's model and bootstrap models under ``key`` (atomically, by a rename;
    best effort: an error is logged, never raised; nothing is written above :data:`MAX_BYTES`)."""
    models = [fitted[0], *fitted[1]]
    arrays: dict[str, NDArray[Any]] = {}
    layout: list[dict[str, Any]] = []
    for i, model in enumerate(models):
        state = model.state()
        entry: dict[str, Any] = {"total": state["total"], "edges": state["edges"]}
        for part in _PARTS:
            entry[part] = []
            for c, (clique, attributes, table) in enumerate(state[part]):
                arrays[f"m{i}_{part}_{c}"] = table
                entry[part].append([list(clique), list(attributes)])
        layout.append(entry)
    if sum(a.nbytes for a in arrays.values()) > MAX_BYTES:
        return
    header = {"format": _FORMAT, "key": list(key), "models": layout}
    arrays["header"] = np.array(json.dumps(header))
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as fh:
                np.savez(fh, **arrays)  # type: ignore[arg-type]  # (numpy types **kwds as its allow_pickle)
            os.replace(tmp, path_of(folder, key))
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        kept = sorted(folder.glob("*.npz"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[KEEP:]:
            old.unlink(missing_ok=True)
    except OSError as exc:
        logger.warning("explore models not kept in %s: %s", folder, exc)


def load(
    folder: Path, key: Sequence[Any], feature_map: MarginalsMap, measurements: Sequence[Measurement]
) -> Fitted | None:
    """The models :func:`save` wrote under ``key``, or None (absent, unreadable or another
    key's)."""
    path = path_of(folder, key)
    if not path.exists():
        return None
    try:
        with np.load(path, allow_pickle=False) as data:
            header = json.loads(str(data["header"]))
            if header.get("format") not in _READ_FORMATS or header.get("key") != list(key):
                return None
            models = []
            for i, entry in enumerate(header["models"]):
                state: dict[str, Any] = {"total": float(entry["total"])}
                if "edges" in entry:
                    state["edges"] = [(int(a), int(b)) for a, b in entry["edges"]]
                for part in _PARTS:
                    state[part] = [
                        (tuple(clique), tuple(attributes), data[f"m{i}_{part}_{c}"])
                        for c, (clique, attributes) in enumerate(entry[part])
                    ]
                models.append(MarginalsModel.from_state(feature_map, measurements, state))
    except (
        OSError,
        EOFError,
        zipfile.BadZipFile,
        ValueError,
        KeyError,
        IndexError,
        TypeError,
    ) as exc:
        logger.warning("ignoring %s (refitting): %s", path, exc)
        return None
    if not models:
        return None
    if header["format"] != _FORMAT:  # rewritten with what the next read needs
        save(folder, key, (models[0], models[1:]))
    return models[0], models[1:]
