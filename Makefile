# Two commands on a fresh machine: `make run` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
SYSSTAMP := $(VENV)/.system-deps
KAFKAJS  := tests/clients/kafkajs
JSSTAMP  := $(KAFKAJS)/node_modules/.installed
REFPOM   := tests/reference/pom.xml
REFLIB   := tests/reference/lib
REFSTAMP := $(REFLIB)/.installed
GOCLIENTS  := tests/clients/go
GOSTAMP    := $(GOCLIENTS)/bin/.built
RUSTCLIENT := tests/clients/rust
RUSTSTAMP  := $(RUSTCLIENT)/target/.built
QUIXCLIENT := tests/clients/quix
QUIXSTAMP  := $(QUIXCLIENT)/.venv/.installed
JVMPOM   := tests/jvm/pom.xml
JVMLIB   := tests/jvm/lib
JVMCLIENTS := 4.4.0 3.9.2 3.0.2 2.8.2
JVMSTREAMS := 4.4.0
JVMCONNECT := 4.3.1
SPARKPOM   := tests/spark-kafka/pom.xml
SPARKSTAMP := tests/spark-kafka/lib/.installed

.PHONY: run test test-unit bench lint install system-deps reference-kafka spark-kafka clean go-clients rust-client compat

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e ".[test,pipeline]"
	touch $@

# Debian packages the tests drive (kcat, Java for Spark, Node.js for kafkajs); skipped when already present.
$(SYSSTAMP): scripts/install-system-deps.sh | $(STAMP)
	scripts/install-system-deps.sh
	touch $@

# kafkajs for the security tests, at the version package-lock.json pins.
$(JSSTAMP): $(KAFKAJS)/package.json $(KAFKAJS)/package-lock.json | $(SYSSTAMP)
	npm ci --prefix $(KAFKAJS) --no-audit --no-fund --loglevel=error
	touch $@

# Apache Kafka's jars for the reference broker (kafscale/testing/kafka_reference.py, tests/differential):
# 4.4.0 and 3.9.2 in $(REFLIB)/<version>/; and the Java client that tests/jvm drives, kafka-clients $(JVMCLIENTS)
# in $(JVMLIB)/clients-<version>/, Kafka Streams $(JVMSTREAMS) in $(JVMLIB)/streams-<version>/ and Kafka Connect
# $(JVMCONNECT) in $(JVMLIB)/connect-<version>/ (Kafka's tools run from $(REFLIB)/4.4.0). Maven keeps its downloads
# in ~/.m2, once per machine; a changed pom copies every set afresh from there.
$(REFSTAMP): $(REFPOM) $(JVMPOM) | $(SYSSTAMP)
	rm -rf $(REFLIB) $(JVMLIB)
	mvn -q -B -f $(REFPOM) -P kafka-4.4.0 dependency:copy-dependencies
	mvn -q -B -f $(REFPOM) -P kafka-3.9.2 dependency:copy-dependencies
	for v in $(JVMCLIENTS); do mvn -q -B -f $(JVMPOM) -P clients-$$v dependency:copy-dependencies || exit 1; done
	mvn -q -B -f $(JVMPOM) -P streams-$(JVMSTREAMS) dependency:copy-dependencies
	mvn -q -B -f $(JVMPOM) -P connect-$(JVMCONNECT) dependency:copy-dependencies
	touch $@

# Spark's own Kafka source (spark-sql-kafka-0-10 and the three jars it needs beyond pyspark's), in
# tests/spark-kafka/lib/<version>/ (kafscale/testing/spark_kafka.py gives them to the tests' and the spark_kafka
# benchmark's Spark session). Maven keeps its downloads in ~/.m2, once per machine.
$(SPARKSTAMP): $(SPARKPOM) | $(SYSSTAMP)
	rm -rf tests/spark-kafka/lib
	mvn -q -B -f $(SPARKPOM) dependency:copy-dependencies
	touch $@

# The Go clients of tests/integration/test_go_rust_clients.py, into $(GOCLIENTS)/bin (gitignored): franz-go, sarama
# and kafka-go from the Go module proxy at the versions go.sum pins (the module cache, ~/go/pkg/mod, keeps them once
# per machine), and Debian's sarama 1.22.1 and kafka-go 0.2.1 (scripts/install-system-deps.sh) in GOPATH mode.
$(GOSTAMP): $(GOCLIENTS)/go.mod $(GOCLIENTS)/go.sum $(wildcard $(GOCLIENTS)/cmd/*/*.go $(GOCLIENTS)/internal/*/*.go \
		$(GOCLIENTS)/_debian/*/*.go) | $(SYSSTAMP)
	cd $(GOCLIENTS) && go build -mod=readonly -o bin/ ./cmd/...
	for client in sarama kafkago; do \
		(cd $(GOCLIENTS)/_debian/$$client && GO111MODULE=off GOFLAGS= GOPATH=$(CURDIR)/$(GOCLIENTS)/bin/gopath:/usr/share/gocode \
		 CGO_CFLAGS="-O2 -Wno-deprecated-declarations" go build -o ../../bin/$$client-debian .) || exit 1; \
	done
	touch $@

# rskafka (pure Rust) from crates.io at the versions Cargo.lock pins, into $(RUSTCLIENT)/target (gitignored).
$(RUSTSTAMP): $(RUSTCLIENT)/Cargo.toml $(RUSTCLIENT)/Cargo.lock $(wildcard $(RUSTCLIENT)/src/*.rs) | $(SYSSTAMP)
	cargo build --release --locked --quiet --manifest-path $(RUSTCLIENT)/Cargo.toml
	touch $@

# quixstreams in a virtual environment of its own (it pins an older confluent-kafka than Kafscale's), at the
# versions $(QUIXCLIENT)/requirements.txt pins: the exactly-once app of tests/integration/test_quixstreams.py.
$(QUIXSTAMP): $(QUIXCLIENT)/requirements.txt | $(STAMP)
	test -x $(QUIXCLIENT)/.venv/bin/python || $(PYTHON) -m venv $(QUIXCLIENT)/.venv
	$(QUIXCLIENT)/.venv/bin/pip install --quiet -r $(QUIXCLIENT)/requirements.txt
	touch $@

go-clients: $(GOSTAMP)

rust-client: $(RUSTSTAMP)

# franz-go's own integration tests (pkg/kgo, at the version $(GOCLIENTS)/go.mod pins) against `kafscale serve` and
# against Apache Kafka 4.4.0; prints both pass counts and what fails only on kafscale (docs/compatibility.md).
# Not part of `make test`: it takes long. COMPAT_ARGS, e.g. "--records 20000 --run TestGroupETL".
compat: $(STAMP) $(REFSTAMP) $(GOSTAMP)
	$(BIN)/python scripts/franz_go_compat.py $(COMPAT_ARGS)

install: $(STAMP)

system-deps: $(SYSSTAMP)

reference-kafka: $(REFSTAMP)

spark-kafka: $(SPARKSTAMP)

run: $(STAMP)
	$(BIN)/kafscale serve --listen 127.0.0.1:9092 --data-dir ./data

# Two pytest-xdist workers: tests that share one expensive server, or run Ray clusters, stay together on one worker
# (tests/conftest.py, xdist_group); everything else spreads over both. TEST_WORKERS=0 runs in one process.
TEST_WORKERS ?= 2
test: $(STAMP) $(SYSSTAMP) $(JSSTAMP) $(REFSTAMP) $(SPARKSTAMP) $(GOSTAMP) $(RUSTSTAMP) $(QUIXSTAMP)
	$(BIN)/ruff check kafscale tests benchmarks
	scripts/pytest-with-backtrace.sh $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=15 \
		$(PYTEST_ARGS)

# The unit tests alone (tests/unit: no servers, Ray, Spark or sockets), in well under a minute.
test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

bench: $(STAMP) $(SYSSTAMP) $(REFSTAMP) $(SPARKSTAMP)
	$(BIN)/pip install --quiet -e ".[test,pipeline,bench]"
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check kafscale tests benchmarks
	$(BIN)/lint-imports --no-logo

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis $(REFLIB) $(JVMLIB) tests/spark-kafka/lib tests/jvm/build $(GOCLIENTS)/bin $(RUSTCLIENT)/target $(QUIXCLIENT)/.venv
