"""Each reply its own receive limit on a client channel, refused before it is buffered.

A client that calls another party (the curator its owners, an owner its curator) receives what
that party answers, and the party may be hostile: a reply is read whole before anything can
look at it, so its receive limit is what the party can make the client hold per call.
grpcio (1.85) has no per-call receive limit, but gRPC's service config has a per-method one
(``methodConfig``'s ``maxResponseMessageBytes``, gRPC A6 "client-side service config"): the
channel takes the smaller of it and the channel's ``grpc.max_receive_message_length``, and
refuses a larger message from the length its 5-byte prefix declares, before it reads the
message (``RESOURCE_EXHAUSTED`` "Received message larger than max (X vs. Y)" at the client; a
60 MB reply to a method limited to 64 KiB left a client's RSS within 2 MiB of where it was).

So a client channel carries its methods' limits in its service config (:func:`limit_options`),
each derived from the method's largest legitimate reply; a method whose largest reply depends
on the request's public parameters (how many points, how many values) is called on a channel
whose whole limit is a power of two at least what that request needs (:func:`bucket`), one such
channel per power of two, so that a call is never allowed more than twice its need.

:func:`over_limit` tells a reply refused this way from the server's own statuses, so that the
client can name the party and the limit without the reply's size (the party's data).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

import grpc

from dpmarket.common.errors import UnavailableError

__all__ = [
    "REPLY_SLACK_BYTES",
    "SMALLEST_BUCKET_BYTES",
    "ReplyTooLargeError",
    "bucket",
    "limit_options",
    "over_limit",
    "reply_refused",
]

#: Room for a reply's ids, names, scalars, status and a certificate or signature, bytes (64
#: KiB): the limit of a reply that carries nothing larger, and the slack over every derived one.
REPLY_SLACK_BYTES = 64 << 10
#: The smallest channel limit of a reply whose limit derives from its request (:func:`bucket`).
SMALLEST_BUCKET_BYTES = 1 << 20
#: What gRPC's client says of a reply refused for its size (grpc core's message size check).
_REFUSED_TEXT = "Received message larger than max"


def bucket(need: int, ceiling: int) -> int:
    """The channel limit of a reply that needs ``need`` bytes: the least power of two at least
    ``need`` and :data:`SMALLEST_BUCKET_BYTES`, at most ``ceiling`` (which then binds).

    Parameters
    ----------
    need : int
        The largest legitimate reply of the call, bytes.
    ceiling : int
        The largest limit any call on these channels gets, bytes.
    """
    size = SMALLEST_BUCKET_BYTES
    while size < need and size < ceiling:
        size *= 2
    return min(size, ceiling)


def service_config(limits: Mapping[str, int]) -> str:
    """gRPC service config JSON giving each method of ``limits`` (``"package.Service/Method"``)
    its ``maxResponseMessageBytes`` (bytes)."""
    configs = []
    for full, limit in sorted(limits.items()):
        service, _, method = full.rpartition("/")
        configs.append(
            {"name": [{"service": service, "method": method}], "maxResponseMessageBytes": limit}
        )
    return json.dumps({"methodConfig": configs})


def limit_options(
    options: Sequence[tuple[str, Any]], limits: Mapping[str, int], channel_limit: int
) -> list[tuple[str, Any]]:
    """``options`` with a receive limit of ``channel_limit`` bytes and the per-method limits
    ``limits`` (``"package.Service/Method"`` -> bytes; the smaller of the two binds).

    The name resolver's own service config is turned off (``grpc.service_config_disable_
    resolution``): DNS could otherwise replace these limits with the ones it serves.
    """
    replaced = {"grpc.max_receive_message_length", "grpc.service_config"}
    return [
        *((k, v) for k, v in options if k not in replaced),
        ("grpc.max_receive_message_length", channel_limit),
        ("grpc.service_config", service_config(limits)),
        ("grpc.service_config_disable_resolution", 1),
    ]


def over_limit(error: grpc.RpcError) -> bool:
    """Whether ``error`` is this client's refusal of a reply above its receive limit (rather
    than a status the server sent)."""
    code = getattr(error, "code", None)
    details = getattr(error, "details", None)
    if code is None or details is None:
        return False
    return code() == grpc.StatusCode.RESOURCE_EXHAUSTED and _REFUSED_TEXT in (details() or "")


class ReplyTooLargeError(UnavailableError):
    """A party's reply above its call's limit, refused unread (``UNAVAILABLE``: the party failed
    the step, as one that does not answer; a session or job goes on without it where it can).

    Parameters
    ----------
    peer : str
        The party, as the caller names it (``"owner NAME"``).
    method : str
        The RPC.
    limit : int
        The call's reply limit, bytes.

    Attributes
    ----------
    public : str
        The text without the party's name: the method and the limit, which are the caller's,
        and nothing of the reply (its size is the party's).
    reason : str
        The same in a report's few words: ``"reply over 1.04 MiB to GetOwnerInfo"`` (the
        limit in MiB, 3 significant digits).
    """

    def __init__(self, peer: str, method: str, limit: int) -> None:
        self.public = (
            f"its {method} reply is larger than the {limit} bytes accepted for that call, and "
            "was refused unread (its operator can check that it runs this version of dpmarket)"
        )
        self.reason = f"reply over {limit / (1 << 20):.3g} MiB to {method}"
        super().__init__(f"{peer}: {self.public}")
        self.peer, self.method, self.limit = peer, method, limit


def reply_refused(peer: str, method: str, limit: int) -> ReplyTooLargeError:
    """The error of a call of ``method`` whose reply from ``peer`` (``"owner NAME"``) was refused
    above ``limit`` bytes: it names the party, the method and the limit, nothing of the reply."""
    return ReplyTooLargeError(peer, method, limit)
