"""dpmarket: a differentially private data marketplace.

Every module installs under this one name: the versioned protobuf API (``dpmarket.v1``), the pure
kernels (``dpmarket.common``), the service runtime (``dpmarket.runtime``), the parties
(``dpmarket.curator``, ``dpmarket.owner``, ``dpmarket.consumer``), the deployment tools
(``dpmarket.deploy``) and the papers' reproductions (``dpmarket.experiments``). In the repository
the subpackages are the top-level folders of the same names, linked here.
"""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("dpmarket")
except PackageNotFoundError:  # a source tree on sys.path without an installed distribution
    __version__ = "0+unknown"

__all__ = ["__version__"]
