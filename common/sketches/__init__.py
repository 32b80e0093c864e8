"""Private sketches and M2M (M2M paper): publish once, estimate anything afterwards.

An owner describes its records by a public :class:`Domain` and a public :class:`FeatureMap`
(:class:`RFFMap`, :class:`RACEMap` or :class:`HISTMap`), fixes a :class:`SketchMechanism` (Laplace
or Gaussian noise, epsilon, the budget split, hence the noise scales), charges
:meth:`SketchMechanism.privacy_events` to its ledger and releases a :class:`PrivateSketch`: the
noisy sum of features and the noisy count. A consumer checks what it received
(:meth:`PrivateSketch.validate`), merges owners (:func:`merge_sketches`) and runs as many analyses
as it likes through an :class:`M2MEstimator` (:mod:`dpmarket.common.sketches.tasks`: moments, CDFs,
covariance, counting queries, implicit-M2M logistic regression) at no further privacy cost.

Modules: :mod:`~dpmarket.common.sketches.domain`, :mod:`~dpmarket.common.sketches.feature_maps`,
:mod:`~dpmarket.common.sketches.sketch`, :mod:`~dpmarket.common.sketches.m2m`,
:mod:`~dpmarket.common.sketches.tasks`, and :mod:`~dpmarket.common.sketches.spec` (what a
deployment's catalogue asks every owner to publish: one public map per spec, so that owners'
sketches can be merged and compared). Pure numpy/scipy: no I/O, no gRPC, no logging of data.
"""

from dpmarket.common.sketches.domain import Domain
from dpmarket.common.sketches.feature_maps import (
    DEFAULT_CHUNK_SIZE,
    FEATURE_MAP_KINDS,
    FeatureMap,
    HISTMap,
    OneHotFeatureMap,
    RACEMap,
    RFFMap,
    draw_race,
    draw_rff,
    feature_map_from_parameters,
    histogram_map,
)
from dpmarket.common.sketches.m2m import (
    DEFAULT_LAMBDA_RULE,
    DEFAULT_N_SYNTHETIC,
    LAMBDA_RULES,
    MIN_LAMBDA,
    LambdaRule,
    M2MEstimator,
    Prior,
    SyntheticDesign,
    TargetMoments,
    regularization,
)
from dpmarket.common.sketches.sketch import (
    DEFAULT_NUMERATOR_SHARE,
    MECHANISMS,
    Mechanism,
    PrivateSketch,
    SketchLike,
    SketchMechanism,
    SketchUnion,
    merge_sketches,
    sketch_mmd2,
)
from dpmarket.common.sketches.spec import PublishedSketch, SketchDeclaration, SketchSpec

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "DEFAULT_LAMBDA_RULE",
    "DEFAULT_NUMERATOR_SHARE",
    "DEFAULT_N_SYNTHETIC",
    "FEATURE_MAP_KINDS",
    "LAMBDA_RULES",
    "MECHANISMS",
    "MIN_LAMBDA",
    "Domain",
    "FeatureMap",
    "HISTMap",
    "LambdaRule",
    "M2MEstimator",
    "Mechanism",
    "OneHotFeatureMap",
    "Prior",
    "PrivateSketch",
    "PublishedSketch",
    "RACEMap",
    "RFFMap",
    "SketchDeclaration",
    "SketchLike",
    "SketchMechanism",
    "SketchSpec",
    "SketchUnion",
    "SyntheticDesign",
    "TargetMoments",
    "draw_race",
    "draw_rff",
    "feature_map_from_parameters",
    "histogram_map",
    "merge_sketches",
    "regularization",
    "sketch_mmd2",
]
