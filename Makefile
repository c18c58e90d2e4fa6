# Two entry points a newcomer needs: `make demo` and `make test`.
# Everything else here is what those two depend on.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed

.PHONY: accel cqlsh-session venv constraints demo demo-saga demo-kafka demo-maelstrom porcupine test lint typecheck importlint check cassandra-jars cassandra-up cassandra-down kafka-jars kafka-up kafka-down chromium java-driver soak clean

CONSTRAINTS := constraints.txt
INSTALL_LOG := $(VENV)/install.log

# The tested versions (constraints.txt), quietly: the install's own chatter goes to a log
# that is shown only when the install fails.
$(STAMP): pyproject.toml $(CONSTRAINTS)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@( $(PY) -m pip install -q -c $(CONSTRAINTS) pip && \
	   $(PY) -m pip install -q -c $(CONSTRAINTS) -e '.[sidecar,kafka,console,dev]' ) > $(INSTALL_LOG) 2>&1 \
	  || { cat $(INSTALL_LOG); exit 1; }
	@touch $(STAMP)

venv: $(STAMP)

## After changing dependencies: record the versions of the venv the tests passed in.
constraints: $(STAMP)
	@{ sed -n '1,3p' $(CONSTRAINTS); \
	   $(PY) -m pip freeze --all --exclude-editable | grep -v -i -e '^accord-cassandra' -e '^wheel=='; \
	 } > $(CONSTRAINTS).new && mv $(CONSTRAINTS).new $(CONSTRAINTS)

## The README's cqlsh session: one Cassandra 5.0 node (127.0.60.1; CQLSH_SESSION_IP moves it),
## bank.accounts at RF 1, one sidecar with its CQL endpoint, the issue's transaction typed
## into `accord-cassandra cqlsh`; prints the terminal transcript and stops everything.
cqlsh-session: $(STAMP) cassandra-jars
	$(PY) scripts/cqlsh_session.py

## The main demo, no Cassandra needed: three sidecars on the embedded store running
## concurrent cross-partition bank transfers, then a simulated 5-node cluster under every
## fault with every history verified.
demo: $(STAMP)
	@$(PY) -m accord_cassandra demo --seconds 10
	@$(PY) -m accord.sim --nodes 5 --rf 3 --txns 300 --seeds 3 --faults all

## The saga store demo: a 3-step order saga against a local Cassandra node it starts itself.
demo-saga: $(STAMP) cassandra-jars
	$(PY) -m stacksaga_store demo

## A 3-step saga through a real Kafka broker (KRaft) and a Cassandra node, with a duplicate.
demo-kafka: $(STAMP) cassandra-jars kafka-jars
	$(PY) -m stacksaga_store.kafka demo

## Everything: lint, types, layering contracts, then the whole test suite against a real
## Cassandra and a real Kafka broker (jars fetched once into the cache, nodes and the broker
## started by the tests' own fixtures) and the console in a real headless Chromium.
test: $(STAMP) check cassandra-jars kafka-jars java-driver porcupine chromium
	$(PY) -m pytest $(PYTEST_ARGS)

## The external checker for Maelstrom histories (a Go program built with the module proxy).
porcupine: $(STAMP)
	$(PY) -c 'from maelstrom.porcupine_driver import ensure_binary; print(ensure_binary())'

## Maelstrom-style run of the Accord node: 5 nodes, partitions, both checkers.
demo-maelstrom: $(STAMP) porcupine
	$(PY) -m maelstrom.harness -w txn-list-append --node-count 5 --concurrency 10 --time-limit 25 \
	  --rate 40 --latency 5 --latency-dist exponential --nemesis partition --nemesis-interval 4 --seed 202

check: lint typecheck importlint

## Optional: the simulator's hot modules compiled with mypyc into $(VENV)/accord-accel (accord/
## stays pure and is the default), then checked to simulate byte for byte what the pure
## source does. `python -m bench sim` reports both builds once this exists.
accel: $(STAMP)
	$(PY) -m bench.accel build
	$(PY) -m bench.accel check

lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

typecheck: $(STAMP)
	$(VENV)/bin/mypy

importlint: $(STAMP)
	$(VENV)/bin/lint-imports

cassandra-jars: $(STAMP)
	$(PY) -m accord_cassandra.launcher fetch

cassandra-up: cassandra-jars
	$(PY) -m accord_cassandra.launcher up --nodes 3

cassandra-down: $(STAMP)
	$(PY) -m accord_cassandra.launcher down

## The Java driver and the probe tests/clients runs with it (jars and classes in the cache).
java-driver: $(STAMP)
	$(PY) -c 'from tests.clients.java_driver import probe_classpath; print(probe_classpath())'

kafka-jars: $(STAMP)
	$(PY) -m stacksaga_store.kafka fetch

kafka-up: kafka-jars
	$(PY) -m stacksaga_store.kafka up

kafka-down: $(STAMP)
	$(PY) -m stacksaga_store.kafka down

## Debian's chromium and chromedriver for the console's browser tests, installed with apt
## when missing (an error, not a skip, where that cannot be done).
chromium:
	bash scripts/ensure-chromium.sh

## A longer burn test: 200 seeds x 2000 transactions, every fault.
soak: $(STAMP)
	$(PY) -m accord.sim --nodes 5 --rf 3 --txns 2000 --seeds 200 --faults all

clean:
	rm -rf $(VENV) .pytest_cache .mypy_cache .ruff_cache .hypothesis
