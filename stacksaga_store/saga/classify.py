"""Which step failures retry and which compensate (seed: "connection / timeout / database
transients" retry; business errors compensate).

A classifier is ``Callable[[Exception], bool | None]``: True retries (the saga pauses and the
recovery engine re-invokes the step later, same idempotency key), False compensates (forward)
or freezes (compensation), None defers. The order is the step's ``classify``, then the saga's,
then :func:`default_retryable`, so a user classifier overrides the default for the errors it
answers and leaves the rest to it.

:func:`default_retryable`:

* :class:`~stacksaga_store.errors.StepError`: its own ``retryable`` (RetryableStepError yes,
  NonRetryableStepError no);
* retry: ``TimeoutError`` (``asyncio.TimeoutError`` and ``socket.timeout`` are the same class),
  ``ConnectionError``, ``socket.gaierror``, an ``OSError`` whose errno is a network one
  (:data:`NETWORK_ERRNOS`), and the cassandra-driver's transients: ``NoHostAvailable``,
  ``OperationTimedOut``, ``WriteTimeout``/``ReadTimeout`` (``cassandra.Timeout``),
  ``Unavailable``, ``ConnectionException`` (and its ``ConnectionShutdown``), coordinator
  overload and bootstrap;
* everything else is a business error: compensate (StackSagaError's rule for exceptions that
  are not a StepError). A ``FileNotFoundError`` is an ``OSError`` too, but not a transient.
"""

from __future__ import annotations

import errno
import logging
import socket
from collections.abc import Callable

from cassandra import OperationTimedOut, Timeout, Unavailable
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException
from cassandra.protocol import IsBootstrappingErrorMessage, OverloadedErrorMessage

from stacksaga_store.errors import StepError

__all__ = ["NETWORK_ERRNOS", "ErrorClassifier", "default_retryable", "is_retryable"]

logger = logging.getLogger(__name__)

ErrorClassifier = Callable[[Exception], "bool | None"]

NETWORK_ERRNOS = frozenset(
    {
        errno.ECONNREFUSED,
        errno.ECONNRESET,
        errno.ECONNABORTED,
        errno.EPIPE,
        errno.ETIMEDOUT,
        errno.EHOSTUNREACH,
        errno.EHOSTDOWN,
        errno.ENETUNREACH,
        errno.ENETDOWN,
        errno.ENETRESET,
        errno.EADDRNOTAVAIL,
    }
)

_TRANSIENTS: tuple[type[BaseException], ...] = (
    TimeoutError,
    ConnectionError,
    socket.gaierror,
    NoHostAvailable,
    OperationTimedOut,
    Timeout,  # WriteTimeout, ReadTimeout
    Unavailable,
    ConnectionException,
    OverloadedErrorMessage,
    IsBootstrappingErrorMessage,
)


def default_retryable(error: Exception) -> bool:
    """The seed's rule (module docstring)."""
    if isinstance(error, StepError):
        return error.retryable
    if isinstance(error, _TRANSIENTS):
        return True
    return isinstance(error, OSError) and error.errno in NETWORK_ERRNOS


def is_retryable(error: Exception, *classifiers: ErrorClassifier | None) -> bool:
    """The first classifier's answer that is not None, else :func:`default_retryable`.

    A classifier that raises or answers something other than a bool or None is a bug in user
    code: it is logged and skipped, so the failure is still recorded.
    """
    for classify in classifiers:
        if classify is None:
            continue
        try:
            answer = classify(error)
        except Exception:
            logger.exception("error classifier %r raised on %r; ignored", classify, error)
            continue
        if answer is None:
            continue
        if isinstance(answer, bool):
            return answer
        logger.error("error classifier %r answered %r (not bool/None); ignored", classify, answer)
    return default_retryable(error)
