"""Run real Cassandra 5.0 nodes as local JVMs, ccm-style (see docs/cassandra-launch.md)."""

from accord_cassandra.launcher.cluster import *  # noqa: F403
from accord_cassandra.launcher.cluster import main as main
