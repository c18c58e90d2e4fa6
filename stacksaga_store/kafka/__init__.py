"""Kafka-driven saga step execution, and the local Kafka brokers its tests and demo run on.

Modules, each one concern: ``jars`` (the broker's jars via Maven), ``broker`` (KRaft brokers as
local JVMs), ``cli`` (``python -m stacksaga_store.kafka``), ``settings`` (``stacksaga.kafka.*``),
``messages`` (the events on the wire), ``worker`` (consumers that run steps under write
protection), ``demo``. docs/kafka.md is the theory of operation.
"""
