"""The service runtime every party shares: mTLS identity, per-RPC authorization, channels and
servers, status mapping, durable databases and files, wire conversion of arrays and shared
messages.

The generated protobuf and gRPC modules stay in ``protos/`` (package ``dpmarket.v1``); the
curator, owner and consumer services are built on this package and on them.
"""
