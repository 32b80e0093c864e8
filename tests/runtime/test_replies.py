"""The reply limits' arithmetic and service config (:mod:`dpmarket.runtime.replies`); their
effect on real channels is tested in tests/curator/test_reply_limits.py."""

from __future__ import annotations

import json

from dpmarket.runtime.replies import (
    SMALLEST_BUCKET_BYTES,
    ReplyTooLargeError,
    bucket,
    limit_options,
    service_config,
)

MIB = 1 << 20


def test_a_bucket_is_the_least_power_of_two_at_least_the_need_within_the_ceiling() -> None:
    assert bucket(1, 64 * MIB) == SMALLEST_BUCKET_BYTES == MIB
    assert bucket(MIB, 64 * MIB) == MIB
    assert bucket(MIB + 1, 64 * MIB) == 2 * MIB
    assert bucket(33 * MIB, 64 * MIB) == 64 * MIB
    assert bucket(10**12, 64 * MIB) == 64 * MIB  # the ceiling binds


def test_the_options_carry_each_method_s_limit_and_replace_the_channel_s() -> None:
    limits = {"dpmarket.v1.OwnerService/GetOwnerInfo": 1000}
    options = limit_options([("grpc.max_receive_message_length", 5), ("a", 1)], limits, 7)
    found = dict(options)
    assert found["grpc.max_receive_message_length"] == 7 and found["a"] == 1
    assert [k for k, _ in options].count("grpc.max_receive_message_length") == 1
    assert found["grpc.service_config_disable_resolution"] == 1
    config = json.loads(found["grpc.service_config"])
    assert config == json.loads(service_config(limits))
    assert config["methodConfig"] == [
        {
            "name": [{"service": "dpmarket.v1.OwnerService", "method": "GetOwnerInfo"}],
            "maxResponseMessageBytes": 1000,
        }
    ]


def test_a_refused_reply_names_the_party_method_and_limit_only() -> None:
    error = ReplyTooLargeError("owner a", "GetOwnerInfo", 1000)
    assert str(error).startswith("owner a: its GetOwnerInfo reply is larger than the 1000 bytes")
    assert error.public.startswith("its GetOwnerInfo reply") and "owner a" not in error.public
