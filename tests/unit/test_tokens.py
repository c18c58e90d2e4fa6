"""Routing keys and the Murmur3 token, checked against fixed vectors (no Cassandra needed).

tests/integration/test_tokens_cassandra.py checks the same functions against `token(pk)`.
"""

from __future__ import annotations

import struct
import uuid

import pytest

from accord_cassandra import tokens


def test_known_vector_with_a_high_tail_byte() -> None:
    # Cassandra's `SELECT token(k)` for UTF-8 'ключ'; mmh3 gives -693430156023627069 here.
    assert tokens.murmur3_token(tokens.text_key("ключ")) == 1182936647932017555


def test_single_column_keys_are_the_serialized_value() -> None:
    assert tokens.text_key("é") == b"\xc3\xa9"
    assert tokens.blob_key(bytearray(b"\x00\xff")) == b"\x00\xff"
    assert tokens.int_key(-1) == b"\xff\xff\xff\xff"
    assert tokens.bigint_key(1) == b"\x00" * 7 + b"\x01"
    value = uuid.UUID("12345678-1234-5678-1234-567812345678")
    assert tokens.uuid_key(value) == value.bytes


def test_out_of_range_ints_are_refused() -> None:
    with pytest.raises(struct.error):
        tokens.int_key(2**31)


def test_composite_key_is_length_bytes_zero_per_component() -> None:
    key = tokens.composite_key([b"ab", b"\x00\x00\x00\x07"])
    assert key == b"\x00\x02ab\x00" + b"\x00\x04\x00\x00\x00\x07\x00"


def test_composite_component_over_64k_is_refused() -> None:
    with pytest.raises(ValueError, match="limited"):
        tokens.composite_key([b"x" * 0x10000])


def test_tokens_stay_in_the_ring_and_never_hit_the_minimum() -> None:
    for i in range(2000):
        token = tokens.murmur3_token(str(i).encode())
        assert tokens.MIN_TOKEN < token <= tokens.MAX_TOKEN
