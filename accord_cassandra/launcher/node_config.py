"""One node's folder: cassandra.yaml, logback.xml and the JVM options, and the command that
starts it."""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from accord_cassandra.launcher.jdk import SUPPORTED_JAVA
from accord_cassandra.launcher.spec import ClusterSpec, LauncherError

MAIN_CLASS = "org.apache.cassandra.service.CassandraDaemon"

# Union of apache/cassandra conf/jvm17-server.options and the list other Java 17 launchers
# use; without java.io / java.nio.charset opens the daemon or jamm fails at run time.
JVM17_MODULE_OPTIONS = (
    "-Djdk.attach.allowAttachSelf=true",
    *(
        f"--add-exports {m}=ALL-UNNAMED"
        for m in (
            "java.base/jdk.internal.misc",
            "java.base/jdk.internal.ref",
            "java.base/sun.nio.ch",
            "java.management.rmi/com.sun.jmx.remote.internal.rmi",
            "java.rmi/sun.rmi.registry",
            "java.rmi/sun.rmi.server",
            "java.sql/java.sql",
            "java.base/java.lang.ref",
            "jdk.unsupported/sun.misc",
        )
    ),
    *(
        f"--add-opens {m}=ALL-UNNAMED"
        for m in (
            "java.base/java.lang.module",
            "java.base/jdk.internal.loader",
            "java.base/jdk.internal.ref",
            "java.base/jdk.internal.reflect",
            "java.base/jdk.internal.math",
            "java.base/jdk.internal.module",
            "java.base/jdk.internal.util.jar",
            "jdk.management/com.sun.management.internal",
            "java.base/sun.nio.ch",
            "java.base/java.io",
            "java.base/java.nio",
            "java.base/java.lang",
            "java.base/java.lang.reflect",
            "java.base/java.util",
            "java.base/java.util.concurrent",
            "java.base/java.util.concurrent.atomic",
            "java.base/java.math",
            "java.base/java.net",
            "java.base/java.nio.charset",
        )
    ),
    "-Dio.netty.tryReflectionSetAccessible=true",
    "-Dio.netty.allocator.useCacheForAllThreads=true",
    "-Dio.netty.allocator.maxOrder=11",
)

LOGBACK_TEMPLATE = """\
<configuration scan="false">
  <appender name="FILE" class="ch.qos.logback.core.FileAppender">
    <file>{log_file}</file>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <appender name="CONSOLE" class="ch.qos.logback.core.ConsoleAppender">
    <filter class="ch.qos.logback.classic.filter.ThresholdFilter"><level>WARN</level></filter>
    <encoder><pattern>%-5level [%thread] %date{{ISO8601}} %F:%L - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO">
    <appender-ref ref="FILE"/>
    <appender-ref ref="CONSOLE"/>
  </root>
</configuration>
"""


def node_dir(base_dir: Path, index: int) -> Path:
    return base_dir / f"node{index}"


def node_config(spec: ClusterSpec, index: int, directory: Path) -> dict[str, Any]:
    """cassandra.yaml for one node: only the mandatory keys plus what makes tests fast, then
    the spec's extra_config for the node."""
    ip = spec.ip(index)
    seeds = f"{spec.ip(1)}:{spec.storage_port}"
    config: dict[str, Any] = {
        "cluster_name": spec.cluster_name,
        # One token per node and no token allocation: the stock num_tokens 16 with
        # allocate_tokens_for_local_replication_factor makes a first boot wait RING_DELAY.
        "num_tokens": 1,
        "initial_token": str(spec.token(index)),
        "partitioner": "org.apache.cassandra.dht.Murmur3Partitioner",
        "endpoint_snitch": "SimpleSnitch",
        "seed_provider": [
            {
                "class_name": "org.apache.cassandra.locator.SimpleSeedProvider",
                "parameters": [{"seeds": seeds}],
            }
        ],
        "listen_address": ip,
        "rpc_address": ip,
        "storage_port": spec.storage_port,
        "native_transport_port": spec.native_port,
        "start_native_transport": True,
        "auto_bootstrap": False,
        "data_file_directories": [str(directory / "data")],
        "commitlog_directory": str(directory / "commitlog"),
        "saved_caches_directory": str(directory / "saved_caches"),
        "hints_directory": str(directory / "hints"),
        "commitlog_sync": "periodic",
        "commitlog_sync_period": "10000ms",
        "auto_snapshot": False,
        "concurrent_reads": 4,
        "concurrent_writes": 4,
        "concurrent_counter_writes": 2,
        "concurrent_compactors": 1,
        "memtable_flush_writers": 1,
        "memtable_heap_space": "64MiB",
        "key_cache_size": "16MiB",
        # The sidecars compare Accord against LWT; v2 is the 2-round-trip Paxos.
        "paxos_variant": "v2",
        "write_request_timeout": "5000ms",
        "read_request_timeout": "5000ms",
    }
    if spec.password_auth:
        config["authenticator"] = "PasswordAuthenticator"
    config.update(spec.extra_config.get(index, {}))
    return config


def yaml_text(config: dict[str, Any]) -> str:
    # JSON values are valid YAML flow nodes, so no YAML library (or its stubs) is needed.
    return "".join(f"{key}: {json.dumps(value)}\n" for key, value in config.items())


def logback_config(directory: Path) -> str:
    # Without a logback.xml Cassandra logs everything at DEBUG to the console.
    return LOGBACK_TEMPLATE.format(log_file=directory / "logs" / "system.log")


def find_jamm(lib_dir: Path) -> Path:
    jars = sorted(lib_dir.glob("jamm-*.jar"))
    if not jars:
        raise LauncherError(f"no jamm jar in {lib_dir}; run `fetch` again")
    return jars[-1]


def node_jvm_options(
    spec: ClusterSpec,
    index: int,
    directory: Path,
    lib_dir: Path,
    java_major: int = SUPPORTED_JAVA,
) -> list[str]:
    """Every JVM option for one node; they go into an @argfile so the command line stays short."""
    heap = f"{spec.heap_mb}m"
    options = [
        *JVM17_MODULE_OPTIONS,
        f"-Xms{heap}",
        f"-Xmx{heap}",
        "-Xss256k",
        "-XX:+UseG1GC",
        "-XX:+ExitOnOutOfMemoryError",
        "-ea",
        "-da:net.openhft...",
        "-Djava.net.preferIPv4Stack=true",
        "-Dchronicle.analytics.disable=true",
        f"-javaagent:{find_jamm(lib_dir)}",
        f"-Dcassandra.config={(directory / 'conf' / 'cassandra.yaml').as_uri()}",
        f"-Dcassandra.storagedir={directory}",
        f"-Dcassandra.logdir={directory / 'logs'}",
        f"-Dlogback.configurationFile={directory / 'conf' / 'logback.xml'}",
        # Without it the daemon closes stdout/stderr once started, losing late errors.
        "-Dcassandra-foreground=yes",
        f"-Dcassandra.triggers_dir={directory / 'triggers'}",
        "-Dcassandra.skip_wait_for_gossip_to_settle=0",
        # No fsync of system tables: test data is thrown away.
        "-Dcassandra.unsafesystem=true",
        # The memtable's per-row heap overhead is estimated once at start-up by filling a
        # skip list with this many keys and measuring it deeply (100,000 stock): 3-6 s of CPU
        # per start on 2 cores. 100 is Cassandra's own test setting; the figure only sizes
        # memtable accounting (when to flush).
        "-Dcassandra.memtable_row_overhead_computation_step=100",
        f"-Djava.io.tmpdir={directory / 'tmp'}",
        # Peers get the shutdown announcement over loopback in well under a millisecond; the
        # default 2 s wait only slows every stop.
        "-Dcassandra.shutdown_announce_in_ms=500",
    ]
    if spec.password_auth:
        # The default superuser is created after this delay (10 s stock); until then no one
        # can log in, and the start-up probe waits on a login.
        options.append("-Dcassandra.superuser_setup_delay_ms=0")
    if java_major > SUPPORTED_JAVA:
        options.append("-Djava.security.manager=allow")
    options.extend(spec.extra_jvm_options.get(index, ()))
    return options


def argfile_text(options: Sequence[str]) -> str:
    return "".join(_argfile_token(o) + "\n" for o in options)


def _argfile_token(option: str) -> str:
    # Options such as "--add-opens a=b" are two tokens on purpose; only paths may need quoting.
    if option.startswith("--add-") or not re.search(r'[\s"\\]', option):
        return option
    escaped = option.replace("\\", "\\\\").replace('"', '\\"')
    return f'"{escaped}"'


def write_node_files(
    spec: ClusterSpec, index: int, base_dir: Path, lib_dir: Path, java_major: int
) -> Path:
    """Create the node's folders and config; returns the node folder."""
    directory = node_dir(base_dir, index)
    for sub in ("conf", "logs", "data", "commitlog", "saved_caches", "hints", "triggers", "tmp"):
        (directory / sub).mkdir(parents=True, exist_ok=True)
    conf = directory / "conf"
    (conf / "cassandra.yaml").write_text(yaml_text(node_config(spec, index, directory)))
    (conf / "logback.xml").write_text(logback_config(directory))
    options = node_jvm_options(spec, index, directory, lib_dir, java_major)
    (conf / "jvm.args").write_text(argfile_text(options))
    return directory


def node_command(java: str, directory: Path, lib_dir: Path) -> list[str]:
    return [java, f"@{directory / 'conf' / 'jvm.args'}", "-cp", f"{lib_dir}/*", MAIN_CLASS]
