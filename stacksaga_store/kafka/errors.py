"""Errors of the Kafka launcher and the Kafka step workers."""

from __future__ import annotations

from stacksaga_store.errors import StackSagaError

__all__ = ["BrokerStartError", "KafkaAuthError", "KafkaLauncherError", "PortBusyError"]


class KafkaLauncherError(StackSagaError, RuntimeError):
    """Anything the broker launcher cannot do; the message says what to fix."""


class PortBusyError(KafkaLauncherError):
    """A port a broker needs is already taken on its loopback address."""


class BrokerStartError(KafkaLauncherError):
    """A broker did not come up; the message carries the tail of its log."""


class KafkaAuthError(StackSagaError):
    """The broker refused the client's SASL credentials (``stacksaga.kafka.sasl-*``)."""
