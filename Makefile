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

.PHONY: run test test-unit bench lint install system-deps reference-kafka clean

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
# 4.4.0 and 3.9.2 in $(REFLIB)/<version>/. Maven keeps its downloads in ~/.m2, once per machine; a changed pom
# copies both sets afresh from there.
$(REFSTAMP): $(REFPOM) | $(SYSSTAMP)
	rm -rf $(REFLIB)
	mvn -q -B -f $(REFPOM) -P kafka-4.4.0 dependency:copy-dependencies
	mvn -q -B -f $(REFPOM) -P kafka-3.9.2 dependency:copy-dependencies
	touch $@

install: $(STAMP)

system-deps: $(SYSSTAMP)

reference-kafka: $(REFSTAMP)

run: $(STAMP)
	$(BIN)/kafscale serve --listen 127.0.0.1:9092 --data-dir ./data

test: $(STAMP) $(SYSSTAMP) $(JSSTAMP) $(REFSTAMP)
	$(BIN)/ruff check kafscale tests benchmarks
	scripts/pytest-with-backtrace.sh $(BIN)/python -m pytest -q --durations=15 $(PYTEST_ARGS)

# The unit tests alone (tests/unit: no servers, Ray, Spark or sockets), in well under a minute.
test-unit: $(STAMP)
	$(BIN)/python -m pytest -q tests/unit $(PYTEST_ARGS)

bench: $(STAMP) $(SYSSTAMP)
	$(BIN)/pip install --quiet -e ".[test,pipeline,bench]"
	$(BIN)/python -m benchmarks $(BENCH_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check kafscale tests benchmarks
	$(BIN)/lint-imports --no-logo

clean:
	rm -rf $(VENV) .pytest_cache .ruff_cache .hypothesis $(REFLIB)
