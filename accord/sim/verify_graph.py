"""Dependency graphs over committed transactions, and Elle-style cycle classification.

Nodes ``0 .. n_ops-1`` are operations; nodes from ``n_ops`` on are *virtual*
nodes that only exist to keep the edge count linear:

* **Real time** (``rt``): A must precede B if A was acknowledged before B was
  invoked.  Materialising every such pair is quadratic, so every ``ok``
  operation gets a *completion node*; completion nodes form a chain in
  completion-time order, each op links to its own completion node, and the
  last completion node strictly before B's invocation links to B.  A reaches B
  through the chain exactly when ``A.completed_at < B.invoked_at``, with
  O(n) edges.
* **Fan-out** (``rw`` to a set): "each of these readers precedes each of these
  writers, except itself" is expressed with prefix/suffix hub chains (source i
  reaches targets ``< i`` through the prefix chain and ``> i`` through the
  suffix chain), again linear and without spurious self-loops.

Edges leaving a virtual node carry the kind of the edge that entered the
virtual structure (``rt``) or the neutral ``LINK`` kind (fan-out hubs), so a
path op -> virtual... -> op collapses to a single op -> op edge whose kind is
the kind of its first hop.  Virtual structures are acyclic, so every cycle
contains at least one operation.

Cycle search: iterative Tarjan SCC on the whole graph (valid histories have
only trivial components, so this is the only cost they pay).  Each non-trivial
component is then searched for the *least severe* explanation, in Elle's
order: G0 (ww only), G1c (ww+wr), G-single (ww+wr plus exactly one rw), G2
(any rw), first without real-time edges and then with them.  The reported name
comes from the edges of the cycle actually found, and gets a ``-realtime``
suffix when the cycle uses a real-time edge.  One anomaly is reported per
component, with a shortest cycle (counted in collapsed op -> op edges) so the
explanation stays readable.

G-single needs "some rw edge u -> v plus a non-rw path v -> u"; trying every
rw edge would be quadratic, so candidates are pruned with the condensation of
the non-rw subgraph (see :func:`_g_single_in`) and the BFS work is capped by a
budget.  If the budget runs out the component is still reported, only
possibly under a more severe name (G2).
"""

from __future__ import annotations

import bisect
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence

from accord.sim.verify_report import Collector, CycleEdge

WW = 1
WR = 2
RW = 4
RT = 8
LINK = 16  # edges out of fan-out hubs; they continue the rw edge that entered the hub
ALL = WW | WR | RW | RT | LINK

_KIND_NAMES = {WW: "ww", WR: "wr", RW: "rw", RT: "rt"}
# When an edge carries several kinds, label it with the least severe one the
# search allowed, so the reported cycle is no worse than necessary.
_PREFERENCE = (WW, WR, RT, RW, LINK)

# Direct edges are cheaper than hubs for small fan-outs.
_DIRECT_FANOUT_LIMIT = 64
# Node expansions allowed across all G-single BFS runs of one check.
_G_SINGLE_BUDGET = 2_000_000


class DepGraph:
    """A labelled directed multigraph (kinds as bit masks) with virtual helper nodes."""

    __slots__ = ("edge_counts", "keys", "n_ops", "op_ids", "succ")

    def __init__(self, op_ids: Sequence[int]) -> None:
        self.op_ids: list[int] = list(op_ids)
        self.n_ops = len(self.op_ids)
        self.succ: list[dict[int, int]] = [{} for _ in self.op_ids]
        # (src, dst, kind) -> key of the first dependency that produced the edge
        self.keys: dict[tuple[int, int, int], str] = {}
        self.edge_counts: dict[str, int] = {"ww": 0, "wr": 0, "rw": 0, "rt": 0}

    def add_virtual(self) -> int:
        self.succ.append({})
        return len(self.succ) - 1

    def is_op(self, node: int) -> bool:
        return node < self.n_ops

    def add_edge(self, src: int, dst: int, kind: int, key: str | None = None) -> None:
        if src == dst:
            return  # a transaction trivially "precedes" itself; never a cycle
        edges = self.succ[src]
        old = edges.get(dst, 0)
        if old & kind:
            return
        edges[dst] = old | kind
        if key is not None:
            self.keys[(src, dst, kind)] = key
        if kind in (WW, WR, RW) and self.is_op(src):
            self.edge_counts[_KIND_NAMES[kind]] += 1

    def add_fanout(self, sources: Sequence[int], targets: Sequence[int], key: str) -> None:
        """``rw`` edges from every source to every target other than itself, in O(n) edges."""
        srcs = sorted(set(sources))
        tgts = sorted(set(targets))
        if not srcs or not tgts:
            return
        if len(srcs) * len(tgts) <= _DIRECT_FANOUT_LIMIT:
            for s in srcs:
                for t in tgts:
                    self.add_edge(s, t, RW, key)
            return
        m = len(tgts)
        # prefix[i] reaches tgts[0..i]; suffix[i] reaches tgts[i..m-1]
        prefix = [self.add_virtual() for _ in range(m)]
        suffix = [self.add_virtual() for _ in range(m)]
        for i, t in enumerate(tgts):
            self.add_edge(prefix[i], t, LINK)
            self.add_edge(suffix[i], t, LINK)
            if i > 0:
                self.add_edge(prefix[i], prefix[i - 1], LINK)
            if i + 1 < m:
                self.add_edge(suffix[i], suffix[i + 1], LINK)
        position = {t: i for i, t in enumerate(tgts)}
        for s in srcs:
            at = position.get(s)
            if at is None:
                self.add_edge(s, prefix[m - 1], RW, key)
                continue
            if at > 0:
                self.add_edge(s, prefix[at - 1], RW, key)
            if at + 1 < m:
                self.add_edge(s, suffix[at + 1], RW, key)

    def add_realtime(self, intervals: Sequence[tuple[int, int, int | None]]) -> None:
        """Real-time order for ``(node, invoked_at, completed_at|None)`` via a completion chain."""
        done = sorted(
            ((c, node) for node, _, c in intervals if c is not None),
        )
        if not done:
            return
        times = [c for c, _ in done]
        chain = [self.add_virtual() for _ in done]
        for i, (_, node) in enumerate(done):
            self.add_edge(node, chain[i], RT)
            if i + 1 < len(chain):
                self.add_edge(chain[i], chain[i + 1], RT)
        for node, invoked, _ in intervals:
            # last completion strictly before the invocation
            j = bisect.bisect_left(times, invoked) - 1
            if j >= 0:
                self.add_edge(chain[j], node, RT)
                self.edge_counts["rt"] += 1

    def successors(self, node: int, mask: int) -> list[int]:
        return [v for v, k in self.succ[node].items() if k & mask]


def strongly_connected_components(
    nodes: Iterable[int], successors: Callable[[int], Iterable[int]]
) -> list[list[int]]:
    """Iterative Tarjan: histories are far deeper than Python's recursion limit allows."""
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    result: list[list[int]] = []
    counter = 0
    for root in nodes:
        if root in index:
            continue
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work: list[tuple[int, Iterator[int]]] = [(root, iter(successors(root)))]
        while work:
            v, it = work[-1]
            descended = False
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(successors(w))))
                    descended = True
                    break
                if w in on_stack and index[w] < low[v]:
                    low[v] = index[w]
            if descended:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                if low[v] < low[parent]:
                    low[parent] = low[v]
            if low[v] == index[v]:
                component: list[int] = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                result.append(component)
    return result


Step = tuple[int, int, int]  # (src, kind bit, dst) in raw node space


def _pick_kind(kinds: int) -> int:
    for k in _PREFERENCE:
        if kinds & k:
            return k
    raise AssertionError("edge without kind")


def _bfs_path(
    graph: DepGraph,
    start: int,
    goal: int,
    inside: Callable[[int], bool],
    mask: int,
    budget: list[int],
) -> list[Step] | None:
    """Path start -> goal with the fewest *collapsed* edges, over ``mask`` edges within ``inside``.

    0-1 BFS: a hop leaving an operation costs 1 and a hop leaving a virtual
    node costs 0, so walking the real-time chain counts as the single rt edge
    it stands for (plain BFS would prefer any data path shorter than the
    chain, and report needlessly long cycles).  ``start == goal`` finds a
    cycle.  ``budget[0]`` counts node expansions down; None when there is no
    path or the budget ran out (the caller can tell by the sign).
    """
    parent: dict[int, tuple[int, int]] = {}
    dist: dict[int, int] = {start: 0}
    done: set[int] = set()
    best: tuple[int, int, int] | None = None  # (cost, last hop src, kind)
    queue: deque[tuple[int, int]] = deque([(0, start)])
    while queue:
        du, u = queue.popleft()
        if u in done:
            continue
        if best is not None and du >= best[0]:
            break  # keys pop in nondecreasing order: nothing left can do better
        done.add(u)
        budget[0] -= 1
        if budget[0] < 0:
            return None
        cost = 1 if graph.is_op(u) else 0
        for v, kinds in graph.succ[u].items():
            allowed = kinds & mask
            if not allowed or not inside(v):
                continue
            dv = du + cost
            if v == goal:
                if best is None or dv < best[0]:
                    best = (dv, u, _pick_kind(allowed))
                continue
            if v in done or dv >= dist.get(v, dv + 1):
                continue
            dist[v] = dv
            parent[v] = (u, _pick_kind(allowed))
            if cost:
                queue.append((dv, v))
            else:
                queue.appendleft((dv, v))
    if best is None:
        return None
    _, node, kind = best
    path: list[Step] = [(node, kind, goal)]
    while node != start:
        p, k = parent[node]
        path.append((p, k, node))
        node = p
    path.reverse()
    return path


def _cycle_in(graph: DepGraph, members: set[int], mask: int) -> list[Step] | None:
    """A shortest cycle through some operation, over ``mask`` edges inside ``members``."""
    comps = strongly_connected_components(
        sorted(members), lambda n: [v for v in graph.successors(n, mask) if v in members]
    )
    for comp in comps:
        if len(comp) < 2:
            continue
        root = min(n for n in comp if graph.is_op(n))
        # Going round the component from root and back is a path root -> root;
        # BFS finds the shortest such one.
        path = _bfs_path(graph, root, root, set(comp).__contains__, mask, [10**12])
        if path is not None:
            return path
    return None


def _g_single_in(
    graph: DepGraph, members: set[int], base: int, budget: list[int]
) -> list[Step] | None:
    """A cycle with exactly one rw edge u -> v, closed by a ``base`` path v -> u.

    Trying every rw edge with a BFS is quadratic on large components, so the
    base-edge subgraph is condensed first: Tarjan emits components in reverse
    topological order, so a base path v -> u can only exist when v's
    component index is >= u's, and can only pass through components whose
    index lies between the two.  That prunes almost every rw edge of a
    mostly-valid history (they point "forward" in the base order) and
    bounds each BFS to the slice of the component that could matter.
    """
    # Hubs are only entered through rw edges, so allowing LINK in the BFS can
    # only ever follow the hub this rw edge entered.
    mask = base | LINK
    comps = strongly_connected_components(
        sorted(members), lambda n: [v for v in graph.successors(n, mask) if v in members]
    )
    rank: dict[int, int] = {}
    for i, comp in enumerate(comps):
        for n in comp:
            rank[n] = i
    candidates: list[tuple[int, int, int]] = []  # (rank gap, u, v)
    for u in sorted(members):
        if not graph.is_op(u):
            continue  # rw edges always leave an operation
        for v, kinds in graph.succ[u].items():
            if kinds & RW and v in members and rank[v] >= rank[u]:
                candidates.append((rank[v] - rank[u], u, v))
    candidates.sort()
    for _, u, v in candidates:
        lo, hi = rank[u], rank[v]

        def in_window(n: int, lo: int = lo, hi: int = hi) -> bool:
            at = rank.get(n)
            return at is not None and lo <= at <= hi

        rest = _bfs_path(graph, v, u, in_window, mask, budget)
        if rest is not None:
            return [(u, RW, v), *rest]
        if budget[0] < 0:
            return None
    return None


def _collapse(graph: DepGraph, steps: Sequence[Step]) -> tuple[CycleEdge, ...]:
    """Merge hops through virtual nodes into op -> op edges labelled by their first hop."""
    # rotate so the cycle starts at an operation
    start = next(i for i, (s, _, _) in enumerate(steps) if graph.is_op(s))
    rotated = [*steps[start:], *steps[:start]]
    edges: list[CycleEdge] = []
    src = -1
    kind = 0
    key: str | None = None
    for s, k, d in rotated:
        if graph.is_op(s):
            src, kind = s, k
            key = graph.keys.get((s, d, k))
        if graph.is_op(d):
            edges.append(CycleEdge(graph.op_ids[src], graph.op_ids[d], _KIND_NAMES[kind], key))
    return tuple(edges)


def classify(edges: Sequence[CycleEdge]) -> str:
    """Elle's name for a cycle from the kinds of its edges."""
    kinds = [e.kind for e in edges]
    rw = kinds.count("rw")
    if rw == 0:
        name = "G1c" if "wr" in kinds else "G0"
    elif rw == 1:
        name = "G-single"
    else:
        name = "G2"
    return f"{name}-realtime" if "rt" in kinds else name


def report_cycles(graph: DepGraph, out: Collector) -> int:
    """Find every non-trivial SCC, report one classified cycle each; returns the SCC count."""
    comps = strongly_connected_components(range(len(graph.succ)), lambda n: graph.succ[n].keys())
    budget = [_G_SINGLE_BUDGET]
    found = 0
    for comp in comps:
        if len(comp) < 2:
            continue
        found += 1
        members = set(comp)
        steps = None
        for realtime in (0, RT):
            steps = (
                _cycle_in(graph, members, WW | realtime)
                or _cycle_in(graph, members, WW | WR | realtime)
                or _g_single_in(graph, members, WW | WR | realtime, budget)
                or _cycle_in(graph, members, WW | WR | RW | LINK | realtime)
            )
            if steps:
                break
        if not steps:  # pragma: no cover - an SCC always has a cycle over all its edges
            raise AssertionError("non-trivial SCC without a cycle")
        edges = _collapse(graph, steps)
        name = classify(edges)
        ops = tuple(e.src for e in edges)
        rendered = " ".join(f"{e.src} {e.render()}" for e in edges) + f" {edges[0].src}"
        n_ops = sum(1 for n in comp if graph.is_op(n))
        out.add(
            name,
            f"dependency cycle among {n_ops} ops; e.g. {rendered}",
            ops,
            edges,
        )
    return found
