"""The launcher's config generation, ring math, checks and CLI errors; no Java, no Cassandra."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from accord_cassandra.launcher import (
    ClusterSpec,
    ExternalCluster,
    LauncherError,
    LocalCluster,
    PortBusyError,
    jdk,
    maven,
    process,
)
from accord_cassandra.launcher import node_config as node_files
from accord_cassandra.launcher.cluster import STATE_FILE, parse_contact_points
from accord_cassandra.launcher.spec import ring_tokens

THREE_NODE_TOKENS = [-9223372036854775808, -3074457345618258603, 3074457345618258602]


@pytest.fixture
def lib_dir(tmp_path: Path) -> Path:
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "jamm-0.4.0.jar").write_bytes(b"")
    return lib


@pytest.fixture
def listener() -> Iterator[tuple[str, int]]:
    """A listening socket on a loopback address no Cassandra of the tests uses."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.77.7", 0))
        sock.listen()
        yield sock.getsockname()


def test_ring_tokens_are_balanced_like_ccm() -> None:
    assert ring_tokens(1) == [-(2**63)]
    assert ring_tokens(3) == THREE_NODE_TOKENS
    tokens = ring_tokens(5)
    gaps = {b - a for a, b in itertools.pairwise(tokens)}
    assert gaps == {2**64 // 5}
    assert all(-(2**63) <= t < 2**63 for t in tokens)


def test_ring_tokens_reject_an_empty_ring() -> None:
    with pytest.raises(ValueError, match="at least one node"):
        ring_tokens(0)


def test_spec_places_node_i_on_first_ip_plus_i_minus_1() -> None:
    spec = ClusterSpec(nodes=3, first_ip="127.0.0.1")
    assert spec.ips == ["127.0.0.1", "127.0.0.2", "127.0.0.3"]
    assert [spec.token(i) for i in spec.indexes] == THREE_NODE_TOKENS
    with pytest.raises(LauncherError, match="no node 4"):
        spec.ip(4)


@pytest.mark.parametrize("first_ip", ["10.0.0.1", "192.168.1.10", "127.255.255.255"])
def test_spec_refuses_addresses_outside_loopback(first_ip: str) -> None:
    with pytest.raises(LauncherError, match=r"127\.0\.0\.0/8"):
        ClusterSpec(nodes=3, first_ip=first_ip)


@pytest.mark.parametrize("version", ["4.1.5", "5.1.0", "5.0", "latest"])
def test_only_cassandra_5_0_is_accepted(version: str) -> None:
    with pytest.raises(LauncherError, match=r"not 5\.0\.x"):
        ClusterSpec(version=version)


def test_node_config_has_the_minimal_fast_keys(tmp_path: Path) -> None:
    spec = ClusterSpec(nodes=3)
    config = node_files.node_config(spec, 2, tmp_path / "node2")
    assert config["listen_address"] == config["rpc_address"] == "127.0.0.2"
    assert config["initial_token"] == str(THREE_NODE_TOKENS[1])
    assert config["num_tokens"] == 1
    assert config["paxos_variant"] == "v2"
    assert config["auto_bootstrap"] is False
    assert config["seed_provider"][0]["parameters"] == [{"seeds": "127.0.0.1:7000"}]
    assert config["partitioner"] == "org.apache.cassandra.dht.Murmur3Partitioner"
    assert config["commitlog_sync"] == "periodic"
    assert min(config[k] for k in ("concurrent_reads", "concurrent_writes")) >= 2
    assert config["data_file_directories"] == [str(tmp_path / "node2" / "data")]
    assert "allocate_tokens_for_local_replication_factor" not in config


def test_written_files_parse_and_match(tmp_path: Path, lib_dir: Path) -> None:
    spec = ClusterSpec(nodes=3, heap_mb=300)
    directory = node_files.write_node_files(spec, 3, tmp_path / "base", lib_dir, 17)
    written = yaml.safe_load((directory / "conf" / "cassandra.yaml").read_text())
    assert written == node_files.node_config(spec, 3, directory)
    for sub in ("data", "commitlog", "hints", "saved_caches", "logs", "tmp", "triggers"):
        assert (directory / sub).is_dir()
    argfile = (directory / "conf" / "jvm.args").read_text().splitlines()
    assert "-Xmx300m" in argfile
    assert "-Xms300m" in argfile
    assert f"-javaagent:{lib_dir / 'jamm-0.4.0.jar'}" in argfile
    assert "--add-opens java.base/java.io=ALL-UNNAMED" in argfile
    assert f"-Dcassandra.config={(directory / 'conf' / 'cassandra.yaml').as_uri()}" in argfile


def test_extra_config_and_jvm_options_reach_only_their_node(tmp_path: Path, lib_dir: Path) -> None:
    spec = ClusterSpec(
        nodes=3,
        extra_config={
            2: {"broadcast_address": "127.0.89.2", "endpoint_snitch": "GossipingPropertyFileSnitch"}
        },
        extra_jvm_options={2: ["-Dcassandra-rackdc.properties=file:///r/2", "-Xmx512m"]},
    )
    directory = node_files.write_node_files(spec, 2, tmp_path / "base", lib_dir, 17)
    written = yaml.safe_load((directory / "conf" / "cassandra.yaml").read_text())
    assert written["broadcast_address"] == "127.0.89.2"
    assert written["endpoint_snitch"] == "GossipingPropertyFileSnitch"
    assert written["listen_address"] == "127.0.0.2"
    argfile = (directory / "conf" / "jvm.args").read_text().splitlines()
    # After the launcher's own -Xmx, so the JVM takes the extra one.
    assert argfile[-2:] == ["-Dcassandra-rackdc.properties=file:///r/2", "-Xmx512m"]
    assert argfile.index(f"-Xmx{spec.heap_mb}m") < len(argfile) - 2
    other = node_files.node_config(spec, 1, tmp_path / "node1")
    assert "broadcast_address" not in other
    assert other["endpoint_snitch"] == "SimpleSnitch"
    assert not any("rackdc" in o for o in node_files.node_jvm_options(spec, 1, tmp_path, lib_dir))


def test_password_auth_turns_on_the_authenticator_and_the_probes_log_in(
    tmp_path: Path, lib_dir: Path
) -> None:
    spec = ClusterSpec(nodes=1, password_auth=True)
    assert node_files.node_config(spec, 1, tmp_path)["authenticator"] == "PasswordAuthenticator"
    options = node_files.node_jvm_options(spec, 1, tmp_path, lib_dir)
    assert "-Dcassandra.superuser_setup_delay_ms=0" in options
    assert spec.credentials == ("cassandra", "cassandra")
    assert ClusterSpec.from_state(json.loads(json.dumps(spec.to_state()))) == spec
    plain = ClusterSpec(nodes=1)
    assert "authenticator" not in node_files.node_config(plain, 1, tmp_path)
    assert plain.credentials is None
    # Through extra_config the probes could not log in: the field is the way.
    with pytest.raises(LauncherError, match="authenticator"):
        ClusterSpec(extra_config={1: {"authenticator": "PasswordAuthenticator"}})


def test_extras_are_copied_so_later_changes_do_not_leak_in() -> None:
    config = {"broadcast_address": "127.0.89.1"}
    options = ["-Da=1"]
    spec = ClusterSpec(extra_config={1: config}, extra_jvm_options={1: options})
    config["broadcast_address"] = "127.0.89.9"
    options.append("-Db=2")
    assert spec.extra_config == {1: {"broadcast_address": "127.0.89.1"}}
    assert spec.extra_jvm_options == {1: ("-Da=1",)}


@pytest.mark.parametrize(
    ("extras", "message"),
    [
        ({"extra_config": {1: {"listen_address": "127.0.0.9"}}}, "sets listen_address"),
        ({"extra_config": {1: {"native_transport_port": 1}}}, "sets native_transport_port"),
        ({"extra_config": {4: {"x": 1}}}, "names node 4; this 3-node cluster has nodes 1..3"),
        ({"extra_config": {0: {"x": 1}}}, "names node 0"),
        ({"extra_config": {"1": {"x": 1}}}, "names node '1'"),
        ({"extra_config": {1: {"x": object()}}}, "extra_config for node 1: .*not JSON"),
        ({"extra_jvm_options": {1: "-Da=1"}}, "must be a list of strings"),
        ({"extra_jvm_options": {1: ["-Da=1", 2]}}, "must be a list of strings"),
        ({"extra_jvm_options": {5: ["-Da=1"]}}, "extra_jvm_options names node 5"),
    ],
)
def test_bad_extras_are_refused_by_name(extras: dict[str, Any], message: str) -> None:
    with pytest.raises(LauncherError, match=message):
        ClusterSpec(nodes=3, **extras)


def test_extras_survive_the_state_file(tmp_path: Path) -> None:
    spec = ClusterSpec(
        nodes=3,
        extra_config={3: {"broadcast_address": "127.0.89.3", "seed_provider": [{"a": [1]}]}},
        extra_jvm_options={1: ["-Da=1"]},
    )
    state = {"spec": spec.to_state(), "pids": {}}
    (tmp_path / STATE_FILE).write_text(json.dumps(state))
    attached = LocalCluster.attach(tmp_path)
    assert attached.spec == spec
    assert node_files.node_config(attached.spec, 3, tmp_path)["broadcast_address"] == "127.0.89.3"


def test_a_state_file_from_before_the_extras_still_attaches(tmp_path: Path) -> None:
    old_spec = {
        "nodes": 1,
        "first_ip": "127.0.0.1",
        "storage_port": 7000,
        "native_port": 9042,
        "heap_mb": 256,
        "cluster_name": "accord_test",
        "version": "5.0.6",
    }
    (tmp_path / STATE_FILE).write_text(json.dumps({"spec": old_spec, "pids": {"1": 1}}))
    attached = LocalCluster.attach(tmp_path)
    assert attached.spec == ClusterSpec(heap_mb=256)
    assert attached.node_pid(1) == 1


def test_a_damaged_state_file_is_a_launcher_error(tmp_path: Path) -> None:
    (tmp_path / STATE_FILE).write_text(json.dumps({"spec": {"nodes": 1}}))
    with pytest.raises(LauncherError, match="unreadable launcher state"):
        LocalCluster.attach(tmp_path)


def test_logback_logs_info_to_file_and_warn_to_console(tmp_path: Path) -> None:
    root = ET.fromstring(node_files.logback_config(tmp_path))
    assert root.find("./appender[@name='FILE']/file").text == str(tmp_path / "logs" / "system.log")
    assert root.find("./appender[@name='CONSOLE']/filter/level").text == "WARN"
    assert root.find("./root").get("level") == "INFO"


def test_security_manager_flag_only_after_java_17(tmp_path: Path, lib_dir: Path) -> None:
    spec = ClusterSpec()
    flag = "-Djava.security.manager=allow"
    assert flag not in node_files.node_jvm_options(spec, 1, tmp_path, lib_dir, 17)
    assert flag in node_files.node_jvm_options(spec, 1, tmp_path, lib_dir, 21)


def test_missing_jamm_jar_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(LauncherError, match="no jamm jar"):
        node_files.node_jvm_options(ClusterSpec(), 1, tmp_path, tmp_path)


def test_argfile_quotes_only_paths_that_need_it() -> None:
    text = node_files.argfile_text(["--add-opens a/b=ALL-UNNAMED", "-Dx=/p q/r", '-Dy=a"b'])
    assert text.splitlines() == ["--add-opens a/b=ALL-UNNAMED", '"-Dx=/p q/r"', '"-Dy=a\\"b"']


@pytest.mark.parametrize(
    ("output", "major"),
    [
        ('openjdk version "17.0.15" 2025-04-15', 17),
        ('java version "1.8.0_392"', 8),
        ('openjdk version "21" 2023-09-19', 21),
        ('openjdk version "25-ea" 2025-09-16', 25),
    ],
)
def test_java_major_is_parsed(output: str, major: int) -> None:
    assert jdk.parse_java_major(output) == major


def test_unreadable_java_version_is_an_error() -> None:
    with pytest.raises(LauncherError, match="cannot read the Java version"):
        jdk.parse_java_major("command not found")


@pytest.mark.parametrize(("major", "message"), [(24, "Security Manager"), (11, "too old")])
def test_unsupported_java_is_refused(major: int, message: str) -> None:
    with pytest.raises(LauncherError, match=message):
        jdk.check_java_major(major)


def test_java_17_is_accepted() -> None:
    jdk.check_java_major(17)


def _write_marker(home: Path, version: str, jars: list[str]) -> None:
    (home / "lib").mkdir(parents=True)
    for jar in jars:
        (home / "lib" / jar).write_bytes(b"")
    marker = {"version": version, "jars": jars}
    (home / maven.MARKER_FILE).write_text(json.dumps(marker))


def test_fetch_marker_is_trusted_only_for_its_version_and_jars(tmp_path: Path) -> None:
    jars = ["cassandra-all-5.0.6.jar", "jamm-0.4.0.jar"]
    _write_marker(tmp_path, "5.0.6", jars)
    assert maven.is_fetched(tmp_path, "5.0.6")
    assert not maven.is_fetched(tmp_path, "5.0.5")
    (tmp_path / "lib" / "jamm-0.4.0.jar").unlink()
    assert not maven.is_fetched(tmp_path, "5.0.6")


def test_fetch_reuses_a_complete_cache_without_maven(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(maven.ENV_CACHE, str(tmp_path))
    monkeypatch.setenv("PATH", "/nonexistent")
    _write_marker(tmp_path / "cassandra-5.0.6", "5.0.6", ["cassandra-all-5.0.6.jar"])
    assert maven.fetch("5.0.6") == tmp_path / "cassandra-5.0.6" / "lib"


def test_busy_port_is_named(listener: tuple[str, int], tmp_path: Path) -> None:
    ip, port = listener
    cluster = LocalCluster(ClusterSpec(nodes=1, first_ip=ip, native_port=port), tmp_path)
    with pytest.raises(PortBusyError, match=f"{ip}:{port}") as caught:
        cluster.start()
    assert f"{ip}:7000" not in str(caught.value)
    assert not (tmp_path / STATE_FILE).exists()


def test_ports_nobody_holds_are_not_reported() -> None:
    assert process.busy_ports([("127.0.77.8", 7000), ("127.0.77.8", 9042)]) == []


def _cli(*args: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, maven.ENV_CACHE: str(tmp_path / "cache")}
    command = [sys.executable, "-m", "accord_cassandra.launcher", *args]
    return subprocess.run(command, capture_output=True, text=True, env=env, check=False)


def test_cli_up_fails_clearly_when_a_port_is_busy(tmp_path: Path) -> None:
    ip = "127.0.77.9"
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((ip, 9042))
        sock.listen()
        result = _cli(
            "up", "--nodes", "1", "--first-ip", ip, "--base-dir", str(tmp_path), tmp_path=tmp_path
        )
    assert result.returncode == 1
    assert f"port already in use: {ip}:9042" in result.stderr


def test_cli_down_without_state_is_a_no_op(tmp_path: Path) -> None:
    result = _cli("down", "--base-dir", str(tmp_path / "none"), tmp_path=tmp_path)
    assert result.returncode == 0
    assert "nothing to stop" in result.stdout


def test_cli_status_without_state_is_an_error(tmp_path: Path) -> None:
    result = _cli("status", "--base-dir", str(tmp_path / "none"), tmp_path=tmp_path)
    assert result.returncode == 1
    assert "no launcher state" in result.stderr


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1", (["127.0.0.1"], 9042)),
        ("127.0.0.1, 127.0.0.2,127.0.0.3", (["127.0.0.1", "127.0.0.2", "127.0.0.3"], 9042)),
        ("127.0.0.5:19042,127.0.0.6:19042", (["127.0.0.5", "127.0.0.6"], 19042)),
    ],
)
def test_contact_points_are_parsed(text: str, expected: tuple[list[str], int]) -> None:
    assert parse_contact_points(text) == expected


@pytest.mark.parametrize("text", ["", "127.0.0.1:1,127.0.0.2:2"])
def test_bad_contact_points_are_refused(text: str) -> None:
    with pytest.raises(LauncherError):
        parse_contact_points(text)


def test_external_cluster_refuses_non_loopback_and_node_control() -> None:
    with pytest.raises(LauncherError, match="outside"):
        ExternalCluster(["10.1.2.3"])
    external = ExternalCluster(["127.0.0.1"])
    with pytest.raises(LauncherError, match="started by this launcher"):
        external.stop_node(1)


def test_a_foreign_pid_is_never_taken_for_a_node(tmp_path: Path) -> None:
    assert not process.pid_is_node(os.getpid(), tmp_path)


def _fake_tool(bin_dir: Path, name: str, script: str) -> None:
    bin_dir.mkdir(exist_ok=True)
    tool = bin_dir / name
    tool.write_text(f"#!/bin/sh\nPATH=/usr/bin:/bin\n{script}\n")
    tool.chmod(0o755)


@pytest.fixture
def fake_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A PATH holding only the fake tools a test writes, an empty cache, no other JDKs."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setattr(jdk, "JVM_ROOTS", (tmp_path / "jvm",))
    monkeypatch.setenv(maven.ENV_CACHE, str(tmp_path / "cache"))
    _fake_tool(bin_dir, "java", "echo 'openjdk version \"17.0.15\" 2025-04-15' >&2")
    return bin_dir


def test_maven_failure_shows_its_last_lines(fake_path: Path) -> None:
    _fake_tool(
        fake_path, "mvn", "echo 'Downloading something'; echo '[ERROR] no route' >&2; exit 1"
    )
    with pytest.raises(LauncherError, match=r"exit 1\)[\s\S]*\[ERROR\] no route"):
        maven.fetch("5.0.6")
    assert not maven.is_fetched(maven.version_home("5.0.6"), "5.0.6")


def test_maven_success_is_recorded_once(fake_path: Path) -> None:
    script = "for a; do case $a in -DoutputDirectory=*) d=${a#*=};; esac; done\n"
    script += 'mkdir -p "$d" && touch "$d/cassandra-all-5.0.6.jar" "$d/jamm-0.4.0.jar"'
    _fake_tool(fake_path, "mvn", script)
    lib = maven.fetch("5.0.6")
    assert sorted(p.name for p in lib.iterdir()) == ["cassandra-all-5.0.6.jar", "jamm-0.4.0.jar"]
    _fake_tool(fake_path, "mvn", "exit 1")
    assert maven.fetch("5.0.6") == lib


# A fake mvn that keeps its arguments and pom beside the output folder, then makes the jar of
# each <dependency> of the pom (its artifactId-version.jar), as copy-dependencies would.
_RECORDING_MVN = r"""
for a; do
  case $a in -DoutputDirectory=*) d=${a#*=};; esac
  [ "$prev" = -f ] && pom=$a; prev=$a
done
mkdir -p "$d" && printf '%s\n' "$@" > "$d.args" && cp "$pom" "$d.pom"
sed -n 's:.*<artifactId>\(.*\)</artifactId>.*:\1:p' "$pom" | tail -n +2 > "$d.a"
sed -n 's:.*<version>\(.*\)</version>.*:\1:p' "$pom" | tail -n +2 > "$d.v"
paste -d- "$d.a" "$d.v" | while read -r jar; do touch "$d/$jar.jar"; done
"""


def test_resolve_writes_one_pom_for_every_coordinate_and_runs_maven_once(
    fake_path: Path, tmp_path: Path
) -> None:
    _fake_tool(fake_path, "mvn", _RECORDING_MVN)
    coordinates = ["org.example:core-lib:1.2.3", "org.example.log:binding:2.0"]
    home = tmp_path / "deps"
    lib = maven.resolve(coordinates, home)
    assert lib == home / "lib"
    assert sorted(p.name for p in lib.iterdir()) == ["binding-2.0.jar", "core-lib-1.2.3.jar"]
    args = (home / "lib.partial.args").read_text().split("\n")
    assert args[:4] == ["-B", "-q", "-f", str(home / "pom.xml")]
    assert f"{maven.MAVEN_DEPENDENCY_PLUGIN}:copy-dependencies" in args
    assert f"-DoutputDirectory={home / 'lib.partial'}" in args
    assert "-DincludeScope=runtime" in args
    deps = ET.fromstring((home / "lib.partial.pom").read_text()).findall(
        ".//{http://maven.apache.org/POM/4.0.0}dependency"
    )
    assert [[child.text for child in dep] for dep in deps] == [
        ["org.example", "core-lib", "1.2.3"],
        ["org.example.log", "binding", "2.0"],
    ]
    marker = maven.read_marker(home)
    assert marker is not None
    assert marker["version"] == "1.2.3"
    assert marker["coordinates"] == coordinates
    # Found again without Maven; other coordinates in the same folder are resolved anew.
    _fake_tool(fake_path, "mvn", "exit 1")
    assert maven.resolve(coordinates, home) == lib
    with pytest.raises(LauncherError, match=r"could not resolve org\.example:core-lib:1\.2\.3 "):
        maven.resolve(coordinates[:1], home)
    assert maven.resolve(coordinates, home) == lib, "a failed run keeps the previous jars"


def test_a_cache_from_before_coordinates_were_recorded_is_still_used(
    fake_path: Path, tmp_path: Path
) -> None:
    _write_marker(tmp_path / "old", "4.1.1", ["kafka_2.13-4.1.1.jar", "log4j-core-2.24.3.jar"])
    lib = maven.resolve(["org.apache.kafka:kafka_2.13:4.1.1"], tmp_path / "old")
    assert lib == tmp_path / "old" / "lib"


def test_resolve_names_a_requested_jar_maven_did_not_copy(fake_path: Path, tmp_path: Path) -> None:
    script = "for a; do case $a in -DoutputDirectory=*) d=${a#*=};; esac; done\n"
    script += 'mkdir -p "$d" && touch "$d/core-lib-1.2.3.jar"'
    _fake_tool(fake_path, "mvn", script)
    with pytest.raises(LauncherError, match=r"lacks binding-2\.0\.jar"):
        maven.resolve(["org.example:core-lib:1.2.3", "org.example:binding:2.0"], tmp_path / "d")
    assert maven.read_marker(tmp_path / "d") is None


@pytest.mark.parametrize(
    "coordinates",
    [[], "org.example:core:1", ["org.example:core"], ["org.example:core:1:jar"], ["a b:c:1"]],
)
def test_bad_coordinates_are_named_before_maven_runs(
    fake_path: Path, tmp_path: Path, coordinates: list[str]
) -> None:
    _fake_tool(fake_path, "mvn", "exit 1")
    with pytest.raises(LauncherError, match="Maven coordinate"):
        maven.resolve(coordinates, tmp_path / "d")
    assert not (tmp_path / "d").exists()


def test_the_kafka_jars_are_resolved_the_same_way_and_fail_as_kafka_errors(
    fake_path: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from stacksaga_store.kafka import jars
    from stacksaga_store.kafka.errors import KafkaLauncherError

    monkeypatch.setenv(jars.ENV_CACHE, str(tmp_path / "kafka"))
    _fake_tool(fake_path, "mvn", "echo '[ERROR] offline' >&2; exit 1")
    with pytest.raises(
        KafkaLauncherError, match=r"kafka_2\.13:4\.1\.1, [\s\S]*exit 1\)[\s\S]*offline"
    ):
        jars.fetch("4.1.1")
    (fake_path / "java").unlink()  # the launcher's own Java check speaks as the Kafka launcher
    with pytest.raises(KafkaLauncherError, match="`java` not found"):
        jars.fetch("4.1.1")
    _fake_tool(fake_path, "java", "echo 'openjdk version \"17.0.15\" 2025-04-15' >&2")
    _fake_tool(fake_path, "mvn", _RECORDING_MVN)
    lib = jars.fetch("4.1.1")
    assert lib == tmp_path / "kafka" / "kafka-4.1.1" / "lib"
    assert sorted(p.name for p in lib.iterdir()) == [
        "kafka_2.13-4.1.1.jar",
        f"log4j-core-{jars.LOG4J_VERSION}.jar",
        f"log4j-slf4j-impl-{jars.LOG4J_VERSION}.jar",
    ]


def test_missing_maven_is_named(fake_path: Path) -> None:
    with pytest.raises(LauncherError, match="`mvn` not found"):
        maven.fetch("5.0.6")


def test_java_24_is_refused_before_maven_runs(fake_path: Path) -> None:
    _fake_tool(fake_path, "java", "echo 'openjdk version \"24.0.1\" 2025-04-15' >&2")
    with pytest.raises(LauncherError, match=r"Java 24 cannot run Cassandra 5\.0"):
        maven.fetch("5.0.6")


def test_missing_java_is_named(fake_path: Path) -> None:
    (fake_path / "java").unlink()
    with pytest.raises(LauncherError, match="`java` not found"):
        jdk.check_java()


def test_a_jdk_17_beside_a_too_new_java_is_used(fake_path: Path) -> None:
    _fake_tool(fake_path, "java", "echo 'openjdk version \"25\" 2025-09-16' >&2")
    jdk17 = fake_path.parent / "jvm" / "openjdk-17" / "bin"
    jdk17.mkdir(parents=True)
    _fake_tool(jdk17, "java", "echo 'openjdk version \"17.0.15\" 2025-04-15' >&2")
    assert jdk.check_java() == (str(jdk17 / "java"), 17)
