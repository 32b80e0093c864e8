"""Downstream evaluation of a summary: how well a model trained on it does on the target task."""

from __future__ import annotations

import logging
import warnings

import numpy as np
from sklearn.dummy import DummyClassifier
from sklearn.exceptions import ConvergenceWarning
from sklearn.pipeline import Pipeline, make_pipeline
from sklearn.preprocessing import StandardScaler
from sklearn.svm import LinearSVC

from owner.data import PointSet

__all__ = ["downstream_accuracy"]

_LOGGER = logging.getLogger(__name__)

#: Iteration cap of liblinear; far above what standardized summaries of a few hundred points need.
_MAX_ITER = 100_000


def downstream_accuracy(train: PointSet, test: PointSet, *, seed: int = 0) -> float:
    """Train a linear SVM on a summary and return its accuracy on a labeled test set.

    The model is ``StandardScaler`` (fitted on the training summary only) followed by
    ``LinearSVC`` (liblinear, squared hinge loss, ``C = 1``, ``dual="auto"``), as in the
    summarization paper's Allstate experiment. If the summary holds a single class, no SVM can
    be fitted; a ``DummyClassifier(strategy="most_frequent")`` then predicts that class for every
    test point.

    Parameters
    ----------
    train : PointSet
        The summary ``D_s``: features of shape (p, n_features) and labels of shape (p,).
    test : PointSet
        Held-out target data: features of shape (n_test, n_features) and labels (n_test,).
    seed : int, default 0
        ``random_state`` of ``LinearSVC`` (liblinear shuffles coordinates in the dual solver).

    Returns
    -------
    float
        Fraction of test points classified correctly, in [0, 1].

    Raises
    ------
    ValueError
        If ``train`` or ``test`` has no labels, or their feature counts differ.

    Notes
    -----
    ``max_iter`` is 100,000 so that liblinear converges on summaries of the sizes used here
    (tens to a few thousand points). Should it still stop early, the ``ConvergenceWarning`` is
    caught and reported through this module's logger at WARNING level instead of being raised
    as a warning, and the (approximate) model is evaluated anyway.

    References
    ----------
    Summarization paper, Section 4 (downstream classification on the summary).
    """
    if train.labels is None:
        raise ValueError(f"training set {train.name!r} has no labels; a classifier needs them")
    if test.labels is None:
        raise ValueError(f"test set {test.name!r} has no labels; accuracy needs them")
    if train.n_features != test.n_features:
        raise ValueError(
            f"training set {train.name!r} has {train.n_features} features but test set "
            f"{test.name!r} has {test.n_features}"
        )
    model: Pipeline | DummyClassifier
    if np.unique(train.labels).size < 2:
        model = DummyClassifier(strategy="most_frequent")
        model.fit(train.features, train.labels)
    else:
        model = make_pipeline(
            StandardScaler(),
            LinearSVC(dual="auto", max_iter=_MAX_ITER, random_state=seed),
        )
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ConvergenceWarning)
            model.fit(train.features, train.labels)
        for warning in caught:
            if issubclass(warning.category, ConvergenceWarning):
                _LOGGER.warning(
                    "LinearSVC did not converge on %r (%d points): %s",
                    train.name,
                    train.n_points,
                    warning.message,
                )
            else:
                warnings.warn_explicit(
                    warning.message, warning.category, warning.filename, warning.lineno
                )
    predicted = model.predict(test.features)
    return float(np.mean(predicted == test.labels))
