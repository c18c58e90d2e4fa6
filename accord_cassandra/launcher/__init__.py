"""Start and stop real Cassandra 5.0 nodes as local JVMs, ccm-style, for tests, demos and CI.

Nothing here ships the Cassandra server, so `fetch` resolves `cassandra-all` and its runtime
dependencies with Maven into a cache outside the repository, and `LocalCluster` runs one
`CassandraDaemon` JVM per node on 127.0.0.x. docs/cassandra-launch.md records the recipe,
where it deviates from the reference and the figures measured on the CI machine.

Modules, each one concern: `spec` (what to launch, errors), `jdk` (which java), `maven` (the
jars), `node_config` (a node's files and command), `process` (ports, pids), `probes` (CQL),
`cluster` (LocalCluster, ExternalCluster), `cli` (``python -m accord_cassandra.launcher``).
"""

from accord_cassandra.launcher.cluster import (
    CassandraHandle,
    ExternalCluster,
    LocalCluster,
    parse_contact_points,
)
from accord_cassandra.launcher.jdk import check_java
from accord_cassandra.launcher.maven import fetch
from accord_cassandra.launcher.probes import driver_cluster
from accord_cassandra.launcher.spec import (
    DEFAULT_VERSION,
    ClusterSpec,
    LauncherError,
    NodeStartError,
    PortBusyError,
)

__all__ = [
    "DEFAULT_VERSION",
    "CassandraHandle",
    "ClusterSpec",
    "ExternalCluster",
    "LauncherError",
    "LocalCluster",
    "NodeStartError",
    "PortBusyError",
    "check_java",
    "driver_cluster",
    "fetch",
    "parse_contact_points",
]
