"""Per-message encode/decode cost of the accord codec: the msgspec fast path against the walk.

``python -m bench.codec``: CPU microseconds per call (best of seven rounds) for Commit,
PreAcceptOk and Apply in an Envelope, as a sidecar sends them. The walk is what the codec
did before msgspec (``accord.codec.walk``, still its reference and its error reporter).
"""

from __future__ import annotations

import functools
import time
import timeit
from collections.abc import Callable
from typing import Any

import msgspec

from accord import codec
from accord.codec import walk
from accord.messages import Apply, Commit, Envelope, PreAccept, PreAcceptOk
from accord.primitives import (
    BinOp,
    Const,
    Deps,
    Put,
    ReadOf,
    Route,
    Timestamp,
    Txn,
    TxnResult,
    Update,
    WriteOp,
    sim_key,
)

KEY = sim_key("k0")
ROUTE = Route(KEY, (KEY,))


def samples() -> dict[str, Envelope]:
    keys = [sim_key(f"k{i}") for i in range(3)]
    ts = [Timestamp(1, 1_700_000_000_000_000 + i, 1, i % 5) for i in range(12)]
    deps = Deps({key: ts[i * 4 : i * 4 + 4] for i, key in enumerate(keys)})
    txn = Txn(
        tuple(keys),
        Update(tuple(Put(k, BinOp("+", ReadOf(k, 0), Const(1))) for k in keys)),
    )
    route = Route(keys[0], tuple(keys))
    writes = tuple(WriteOp(k, 7) for k in keys)
    result = TxnResult(tuple((k, 6) for k in keys), True)
    at = ts[-1]
    return {
        "Commit": Envelope(1, 2, Commit(5, ts[0], at, deps, stable=True, read=True)),
        "PreAcceptOk": Envelope(2, 1, PreAcceptOk(5, ts[0], at, deps)),
        "Apply": Envelope(1, 2, Apply(5, ts[0], txn, route, at, deps, writes, result)),
    }


def per_call(call: Callable[[], object]) -> float:
    # CPU time, not wall time: the figure must not count time the machine gave to others.
    number = 2000
    timer = timeit.Timer(call, timer=time.process_time)
    return min(timer.repeat(number=number, repeat=7)) / number * 1e6


def first_sight(name: str, build: Callable[[int], Envelope]) -> None:
    """Each transaction seen once: neither cache can help (the walk does the txn's part)."""
    fresh = [build(n) for n in range(4000)]
    data = [codec.encode_message(m) for m in fresh]
    assert data == [walk.encode_message(m) for m in fresh]
    others = [build(n) for n in range(4000, 8000)]
    figures = []
    for encode, decode in (
        (walk.encode_message, walk.decode_message),
        (codec.encode_message, codec.decode_message),
    ):
        start = time.process_time()
        for message in others:
            encode(message)
        figures.append((time.process_time() - start) / 4000 * 1e6)
        start = time.process_time()
        for item in data:
            decode(item)
        figures.append((time.process_time() - start) / 4000 * 1e6)
    walk_enc, walk_dec, fast_enc, fast_dec = figures
    print(
        f"{name + ' once':12} {len(data[0]):6} "
        + " ".join(f"{f:8.2f}µs" for f in (walk_enc, fast_enc, walk_dec, fast_dec))
    )


def main() -> None:
    heads = ("walk enc", "fast enc", "walk dec", "fast dec")
    print(f"{'message':12} {'bytes':>6} " + " ".join(f"{head:>10}" for head in heads))
    for name, message in samples().items():
        data = codec.encode_message(message)
        assert data == walk.encode_message(message), name
        assert codec.decode_message(data) == walk.decode_message(data) == message, name
        figures = [
            per_call(functools.partial(walk.encode_message, message)),
            per_call(functools.partial(codec.encode_message, message)),
            per_call(functools.partial(walk.decode_message, data)),
            per_call(functools.partial(codec.decode_message, data)),
        ]
        print(f"{name:12} {len(data):6} " + " ".join(f"{f:8.2f}µs" for f in figures))
    base = samples()["Apply"].body
    assert isinstance(base, Apply)
    for name, cls in (("PreAccept", PreAccept), ("Apply", Apply)):

        def build(n: int, cls: type[Any] = cls) -> Envelope:
            txn = Txn((KEY,), Update((Put(KEY, BinOp("+", ReadOf(KEY, 0), Const(n))),)))
            if cls is PreAccept:
                return Envelope(1, 2, PreAccept(n, base.txn_id, txn, ROUTE))
            return Envelope(1, 2, msgspec.structs.replace(base, txn=txn, route=ROUTE))

        first_sight(name, build)


if __name__ == "__main__":
    main()
