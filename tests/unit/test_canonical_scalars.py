"""schema.CANONICAL_SCALARS, the fast path of check_type and to_driver: whatever it passes
as it is, the general check would have returned unchanged (same value, same type), and what
it does not pass still goes through the general check, so nothing it lets by could have been
refused or rewritten."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from accord_cassandra.driver_values import _driver_value, to_driver
from accord_cassandra.schema import (
    CANONICAL_SCALARS,
    MAX_VALUE_BYTES,
    SchemaError,
    _check,
    check_type,
    parse_type,
)

TYPES = sorted(CANONICAL_SCALARS)


def _uuid_texts() -> st.SearchStrategy[str]:
    # Canonical and not: upper case, braces, URNs, and version/variant nibbles of every kind
    # (a timeuuid must be version 1 of the RFC 4122 variant).
    hexes = st.text("0123456789abcdefABCDEF", min_size=32, max_size=32)
    dashed = hexes.map(lambda h: f"{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:]}")

    def one_upper(u: uuid.UUID, at: int) -> str:
        text = str(u)
        return text[:at] + text[at].upper() + text[at + 1 :]

    return st.one_of(
        st.builds(one_upper, st.uuids(), st.integers(0, 35)),
        st.uuids().map(str),
        st.uuids(version=1).map(str),
        dashed,
        dashed.map(str.lower),
        st.uuids().map(lambda u: "{" + str(u) + "}"),
        st.uuids().map(lambda u: u.urn),
        st.uuids().map(lambda u: u.hex),
    )


VALUES = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**64), max_value=2**64),
    st.sampled_from([2**7, -(2**7) - 1, 2**15, 2**31, -(2**31) - 1, 2**63, -(2**63) - 1]),
    st.floats(allow_nan=True),
    st.text(),
    st.text(st.characters(codec="ascii")),
    st.text(st.characters(categories=["Cs"]), max_size=2),
    st.binary(),
    _uuid_texts(),
    st.tuples(st.integers()),
)


def _general(cql_type: str, value: object) -> object:
    return _check("ks.t.c", parse_type(cql_type), value, True)


@settings(max_examples=3000, deadline=None)
@given(cql_type=st.sampled_from(TYPES), value=VALUES)
def test_a_value_passed_as_it_is_is_what_the_general_check_returns(
    cql_type: str, value: object
) -> None:
    if value is None or not CANONICAL_SCALARS[cql_type](value):
        return
    general = _general(cql_type, value)
    assert general == value and type(general) is type(value), (cql_type, value, general)
    driven = _driver_value(parse_type(cql_type), general)
    assert to_driver(cql_type, value) == driven and type(driven) is type(to_driver(cql_type, value))


@settings(max_examples=3000, deadline=None)
@given(cql_type=st.sampled_from(TYPES), value=VALUES)
def test_check_type_agrees_with_the_general_check(cql_type: str, value: object) -> None:
    try:
        expected: object = _general(cql_type, value) if value is not None else None
    except (SchemaError, UnicodeEncodeError) as error:
        with pytest.raises(type(error)):
            check_type("ks.t.c", cql_type, value, key=True)
        return
    got = check_type("ks.t.c", cql_type, value, key=True)
    assert got == expected and type(got) is type(expected)


@settings(max_examples=2000, deadline=None)
@given(cql_type=st.sampled_from(["uuid", "timeuuid"]), value=_uuid_texts())
def test_uuid_text_passes_as_it_is_only_when_canonical(cql_type: str, value: str) -> None:
    test_check_type_agrees_with_the_general_check.hypothesis.inner_test(cql_type, value)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("cql_type", "value"),
    [
        ("int", 2**31),
        ("int", True),
        ("tinyint", -129),
        ("bigint", 2**63),
        ("text", "x" * (MAX_VALUE_BYTES + 1)),
        ("ascii", "é"),
        ("blob", b"x" * (MAX_VALUE_BYTES + 1)),
        ("boolean", 1),
        ("timestamp", 253_402_300_800_000),
        ("uuid", "not-a-uuid"),
        ("timeuuid", str(uuid.uuid4())),
        # Version 1's nibble, but not the RFC 4122 variant: uuid.UUID gives no version.
        ("timeuuid", "12345678-1234-1678-c234-567812345678"),
    ],
)
def test_what_does_not_fit_is_still_refused(cql_type: str, value: object) -> None:
    assert not CANONICAL_SCALARS[cql_type](value)
    with pytest.raises(SchemaError):
        check_type("ks.t.c", cql_type, value)


@pytest.mark.parametrize(
    ("cql_type", "value", "canonical"),
    [
        ("uuid", "{12345678-1234-5678-1234-567812345678}", "12345678-1234-5678-1234-567812345678"),
        ("uuid", "12345678-1234-5678-1234-56781234567A", "12345678-1234-5678-1234-56781234567a"),
        ("uuid", "A2345678-1234-5678-1234-567812345678", "a2345678-1234-5678-1234-567812345678"),
        ("text", "é" * 10, "é" * 10),
    ],
)
def test_what_is_not_canonical_yet_is_made_canonical(
    cql_type: str, value: object, canonical: object
) -> None:
    assert check_type("ks.t.c", cql_type, value) == canonical
