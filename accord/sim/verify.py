"""History checkers: is a client-observed history strictly serializable?

Theory of operation
-------------------
Accord promises *strict serializability*: there is one total order of the
committed transactions that (1) explains every value any client read, as if
the transactions ran one at a time in that order, and (2) agrees with real
time -- if A was acknowledged before B was invoked, A comes first.  The
checkers here never see replica state; they work from
:class:`accord.sim.history.History` alone, in the manner of Jepsen's Elle
(Kingsbury & Alvaro, "Elle: Inferring Isolation Anomalies from Experimental
Observations", VLDB 2020):

1. *Which transactions happened.*  ``ok`` transactions did; ``fail`` ones did
   not; an ``info`` (unknown outcome) transaction is treated as committed
   exactly when some read observed one of its writes, and is ignored
   otherwise -- ignoring it can only hide an anomaly, never invent one.
2. *Direct anomalies* visible in single reads: a value no transaction wrote
   (``garbage-read``), a value only an aborted transaction wrote (``G1a``),
   a value a transaction overwrote before committing (``G1b``), a transaction
   not seeing its own writes or seeing a key change under it (``internal``),
   list orders that cannot come from one history (``incompatible-order``).
3. *Dependencies.*  Because workloads write unique values, each read names
   the write it observed.  That yields a dependency graph whose edges are
   constraints every valid total order must respect: ``ww`` (write-write
   version order), ``wr`` (a read saw a write), ``rw`` (a read did *not* see a
   write, so it came first), and ``rt`` (real time).  Real time is encoded
   through a chain of completion events so it costs O(n) edges.
4. *Cycles.*  A total order exists iff the graph is acyclic, so any cycle is
   a proof of violation.  Tarjan's SCC algorithm (iterative) finds the
   cyclic components; each is explained by its least severe cycle, named as
   Elle does: ``G0`` (only ww), ``G1c`` (ww+wr), ``G-single`` (exactly one
   rw), ``G2`` (two or more rw), with ``-realtime`` when the cycle needs a
   real-time edge (the anomaly is invisible to plain serializability).

Every edge is *implied* by the observations, so any reported anomaly is real
(soundness).  Completeness is not promised: anomalies whose evidence was never
observed (a write nobody read, the order of blind register writes) cannot be
seen.

Checkers
--------
:func:`check_list_append`
    Lists with unique appended values: full version orders, hence ww/wr/rw and
    all cycle classes.  Lost updates surface as ``G-single`` (two txns read the
    same prefix and both appended: the later appender's read anti-depends on
    the earlier append, which ww-precedes it).
:func:`check_registers`
    Put/read registers with unique values: wr and real-time edges, plus rw and
    ``lost-update`` from read-modify-write transactions.
:func:`check_bank`
    Conservation of money and non-negative balances on consistent snapshots,
    plus the register check.

Modules: :mod:`~accord.sim.verify_report` (verdict values),
:mod:`~accord.sim.verify_graph` (graph, SCC, cycle classification),
:mod:`~accord.sim.verify_list_append`, :mod:`~accord.sim.verify_registers`.
"""

from __future__ import annotations

from accord.sim.verify_list_append import check_list_append
from accord.sim.verify_registers import check_bank, check_registers
from accord.sim.verify_report import MAX_EXAMPLES, Anomaly, CycleEdge, Verdict

__all__ = [
    "MAX_EXAMPLES",
    "Anomaly",
    "CycleEdge",
    "Verdict",
    "check_bank",
    "check_list_append",
    "check_registers",
]
