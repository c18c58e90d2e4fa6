"""Per-message encode/decode cost of the accord codec: the msgspec fast path against the walk.

``python -m bench.codec``: CPU microseconds per call (best of seven rounds) for Commit,
PreAcceptOk and Apply in an Envelope, as a sidecar sends them. The walk is what the codec
did before msgspec (``accord.codec.walk``, still its reference and its error reporter).
"""

from __future__ import annotations

import time
import timeit
from collections.abc import Callable

from accord import codec
from accord.codec import walk
from accord.messages import Apply, Commit, Envelope, PreAcceptOk
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


def main() -> None:
    heads = ("walk enc", "fast enc", "walk dec", "fast dec")
    print(f"{'message':12} {'bytes':>6} " + " ".join(f"{head:>10}" for head in heads))
    for name, message in samples().items():
        data = codec.encode_message(message)
        assert data == walk.encode_message(message), name
        assert codec.decode_message(data) == walk.decode_message(data) == message, name
        figures = [
            per_call(lambda m=message: walk.encode_message(m)),
            per_call(lambda m=message: codec.encode_message(m)),
            per_call(lambda d=data: walk.decode_message(d)),
            per_call(lambda d=data: codec.decode_message(d)),
        ]
        print(f"{name:12} {len(data):6} " + " ".join(f"{f:8.2f}µs" for f in figures))


if __name__ == "__main__":
    main()
