#!/usr/bin/env bash
# Installs the Debian packages the test suite drives, only those that are missing.
set -euo pipefail
need=()
command -v kcat >/dev/null 2>&1 || need+=(kcat)
# Java 17 or later runs Spark and the reference Apache Kafka broker (Kafka 4 needs 17); Maven fetches Kafka's jars
# (tests/reference/pom.xml, kafscale/testing/kafka_reference.py)
java_major() { java -version 2>&1 | sed -n 's/.* version "\([0-9]*\).*/\1/p' | head -n 1; }
if ! command -v java >/dev/null 2>&1 || [ "$(java_major)" -lt 17 ] 2>/dev/null; then
    need+=(openjdk-17-jre-headless)
fi
command -v mvn >/dev/null 2>&1 || need+=(maven)
# javac compiles tests/jvm's driver against each Java client version (tests/jvm/harness.py)
command -v javac >/dev/null 2>&1 || need+=(openjdk-17-jdk-headless)
# Node.js and npm run kafkajs (tests/integration/test_security_clients.py)
command -v node >/dev/null 2>&1 || need+=(nodejs)
command -v npm >/dev/null 2>&1 || need+=(npm)
# `ip` makes the network namespaces that give test hosts their own addresses (tests/cluster/test_partition.py)
command -v ip >/dev/null 2>&1 || need+=(iproute2)
# `ray up` of deploy/ray-cluster.local.yaml (tests/cluster/test_ray_up.py): rsync for its file mounts, and sshd,
# which the test runs per connection as ssh's ProxyCommand, not as a service (openssh-server brings ssh along;
# outside a container, installing it also starts and enables the ssh service)
test -x /usr/sbin/sshd || need+=(openssh-server)
command -v rsync >/dev/null 2>&1 || need+=(rsync)
# gdb prints the native backtrace if the test process itself crashes (scripts/pytest-with-backtrace.sh)
command -v gdb >/dev/null 2>&1 || need+=(gdb)
# Debian's old Go clients, built in GOPATH mode from /usr/share/gocode as the old-protocol cases of
# tests/integration/test_go_rust_clients.py: sarama 1.22.1 and kafka-go 0.2.1 (their dependencies come along,
# libzstd-dev for sarama's cgo zstd among them)
test -d /usr/share/gocode/src/github.com/Shopify/sarama || need+=(golang-github-shopify-sarama-dev)
test -d /usr/share/gocode/src/github.com/segmentio/kafka-go || need+=(golang-github-segmentio-kafka-go-dev)
# Chromium, which Playwright drives headless for the console's browser tests (tests/integration/test_console_browser.py;
# no browser download: kafscale/testing/browser.py finds this one)
command -v chromium >/dev/null 2>&1 || need+=(chromium)
if [ ${#need[@]} -eq 0 ]; then
    exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then SUDO="sudo"; else
        echo "missing Debian packages: ${need[*]} (run as root or install them)" >&2; exit 1
    fi
fi
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}"
