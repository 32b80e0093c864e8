"""dpmarket deploy: the ``dpmarket`` command, the local launcher, the demos and the PKI tooling.

Importing this package (every ``dpmarket`` command does, first) quiets gRPC's C core unless the
user chose its verbosity: ``GRPC_VERBOSITY`` defaults to ``ERROR``. The core reads the variable
once, when ``grpc`` is first imported, and otherwise logs every failed TLS handshake and
connection retry at INFO on the console (eight lines for a typo in ``--curator``); the project
reports such failures itself, in one line (:func:`dpmarket.runtime.transport.explain_connection`).
``GRPC_VERBOSITY=INFO dpmarket ...`` shows them again.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
