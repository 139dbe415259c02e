"""The deployment files (issue 20): `deploy/ray-cluster.yaml`, its local variant and the KubeRay manifest.

The Ray cluster configs go through the steps `ray up` itself runs before it touches a cloud: `prepare_config`
(merge with the provider's defaults, as `ray up` does first) and `validate_config` (Ray's JSON schema,
ray/autoscaler/ray-schema.json, plus its own cross-checks). The provider's `bootstrap_config` and the
resource autodetection are left out: for AWS they call AWS. The `kafscale serve` command in each file is
parsed by the real `kafscale` command line and loaded into a BrokerConfig, so a renamed or mistyped flag fails
here rather than on a freshly launched head node. Offline and fast: no Ray, no AWS, no sockets.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

from kafscale import config as kafscale_config
from kafscale.cli import build_parser

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
AWS = DEPLOY / "ray-cluster.yaml"
LOCAL = DEPLOY / "ray-cluster.local.yaml"
KUBERAY = DEPLOY / "kuberay" / "kafscale-raycluster.yaml"
RAY_CONFIGS = [AWS, LOCAL]

# Tokens that end a command's arguments in a shell line.
_SHELL_ENDS = {";", "&&", "||", "|", "&", ">", ">>", "<", "2>&1"}
_AUTH_DISABLED = re.compile(r"RAY_AUTH_MODE\W{0,3}disabled", re.IGNORECASE)


def _load(path: Path) -> dict[str, Any]:
    return yaml.safe_load(path.read_text())


def _kafscale_args(line: str, subcommand: str) -> list[str] | None:
    """The arguments of `kafscale <subcommand> ...` in a shell line, or None if the line has no such command."""
    tokens = shlex.split(line)
    for i, token in enumerate(tokens[:-1]):
        if Path(token).name == "kafscale" and tokens[i + 1] == subcommand:
            args = []
            for arg in tokens[i + 2:]:
                if arg in _SHELL_ENDS or arg.startswith((">", "2>")) or arg.endswith(";"):
                    break
                args.append(arg)
            return args
    return None


def _serve_config(line: str) -> kafscale_config.BrokerConfig:
    args = _kafscale_args(line, "serve")
    assert args is not None, f"no `kafscale serve` in {line!r}"
    try:
        parsed = build_parser().parse_args(["serve", *args])
    except SystemExit:  # argparse has printed which flag it did not know
        pytest.fail(f"`kafscale serve` rejects the arguments {args}")
    return kafscale_config.load(parsed, environ={})


def _serve_line(commands: list[str]) -> tuple[int, str]:
    found = [(i, c) for i, c in enumerate(commands) if _kafscale_args(c, "serve") is not None]
    assert len(found) == 1, f"expected one `kafscale serve` among {commands}"
    return found[0]


def _all_commands(cfg: dict[str, Any]) -> list[str]:
    keys = ("initialization_commands", "setup_commands", "head_setup_commands", "worker_setup_commands",
            "head_start_ray_commands", "worker_start_ray_commands")
    return [c for key in keys for c in cfg.get(key) or []]


# ---------------------------------------------------------------------------------------------------------------
# Ray's own validation


@pytest.mark.parametrize("path", RAY_CONFIGS, ids=lambda p: p.name)
def test_ray_accepts_the_cluster_config(path: Path) -> None:
    prepared = prepare_config(_load(path))
    validate_config(prepared)  # raises jsonschema.ValidationError / ValueError if Ray rejects it
    assert prepared["head_node_type"] in prepared["available_node_types"]


def test_ray_validation_is_not_a_no_op() -> None:
    """The same validation rejects a config with a field Ray does not know, so the test above means something."""
    broken = _load(AWS)
    broken["head_start_commands"] = broken.pop("head_start_ray_commands")
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(broken))


# ---------------------------------------------------------------------------------------------------------------
# The head starts Ray, then the broker


@pytest.mark.parametrize("path", RAY_CONFIGS, ids=lambda p: p.name)
def test_head_starts_ray_then_serves_detached(path: Path) -> None:
    commands = _load(path)["head_start_ray_commands"]
    starts = [i for i, c in enumerate(commands) if "ray start --head" in c]
    assert len(starts) == 1, commands
    assert "--autoscaling-config=~/ray_bootstrap_config.yaml" in commands[starts[0]], "the head would launch no workers"
    index, line = _serve_line(commands)
    assert index > starts[0], "kafscale serve must run after Ray is up"
    served = _serve_config(line)
    assert served.ray_address, "serve must join the Ray cluster, not start its own"
    assert served.detach, "serve must return once the cluster serves, leaving it running"
    assert served.s3_bucket, "multi-node needs S3"
    assert served.etcd_endpoint_list(), "multi-node needs etcd"
    assert all(e.startswith("http") for e in served.etcd_endpoint_list())
    assert served.shards_per_node >= 1 or served.autoscale
    assert served.listen_host_port()[1] == 9092


# vCPUs of the instance types the AWS example names (add a row when it names another).
_VCPUS = {"m6i.large": 2, "m6i.xlarge": 4, "m6i.2xlarge": 8, "m6i.4xlarge": 16}


def _shards_per_node(cfg: dict[str, Any], served: kafscale_config.BrokerConfig) -> int:
    """How many shard port slots a node of the AWS example uses."""
    if not served.autoscale:
        return served.shards_per_node
    types = {t["node_config"]["InstanceType"] for t in cfg["available_node_types"].values()}
    assert len(types) == 1, f"one instance type, so every node has the same port range: {types}"
    (kind,) = types
    assert kind in _VCPUS, f"add {kind}'s vCPUs to _VCPUS"
    return int(_VCPUS[kind] // served.shard_cpus)


def test_aws_cluster_serves_every_node_on_the_kafka_port_range() -> None:
    cfg = _load(AWS)
    served = _serve_config(_serve_line(cfg["head_start_ray_commands"])[1])
    assert served.ray_address == "auto"
    assert served.listen_host_port() == ("0.0.0.0", 9092)
    assert not served.s3_endpoint, "the AWS example talks to AWS S3"
    rules = cfg["provider"]["security_group"]["IpPermissions"]
    kafka = [r for r in rules if r.get("FromPort") == 9092]
    assert len(kafka) == 1, rules
    assert kafka[0]["IpProtocol"] == "tcp"
    assert kafka[0]["ToPort"] == 9092 + _shards_per_node(cfg, served) - 1, "one port per shard slot on every node"
    assert kafka[0]["IpRanges"], "the Kafka ports must be opened to somewhere"


def test_aws_workers_join_the_head_and_their_count_matches_the_shards() -> None:
    cfg = _load(AWS)
    served = _serve_config(_serve_line(cfg["head_start_ray_commands"])[1])
    head_port = re.search(r"ray start --head.*--port=(\d+)", " ".join(cfg["head_start_ray_commands"]))
    assert head_port is not None
    assert any(f"--address=$RAY_HEAD_IP:{head_port.group(1)}" in c for c in cfg["worker_start_ray_commands"])
    workers = 0
    for name, node_type in cfg["available_node_types"].items():
        if name == cfg["head_node_type"]:
            continue
        workers += node_type["max_workers"]
        assert "IamInstanceProfile" in node_type["node_config"], f"{name}: its shards need S3 credentials"
        if not served.autoscale:
            # Shards reserve no CPU, so Ray sees a broker node as idle and would remove workers above min_workers.
            assert node_type["min_workers"] == node_type["max_workers"], name
        else:
            assert node_type["min_workers"] <= node_type["max_workers"], name
    assert workers <= cfg["max_workers"]
    if served.autoscale:
        # Shards reserve CPUs (else Ray would see busy nodes as idle), and --max-shards is what the head and every
        # worker fit: 0 (the alive nodes' room) would never want a node that is not there yet, more could never run.
        assert served.shard_cpus > 0
        assert served.max_shards == (1 + workers) * _shards_per_node(cfg, served), served.max_shards
        assert served.min_shards <= _shards_per_node(cfg, served), "the idle minimum fits on the head alone"


def test_aws_nodes_install_the_package() -> None:
    cfg = _load(AWS)
    setup = " ".join(cfg["setup_commands"])
    assert "pip install" in setup and "kafscale" in setup
    assert "ray[default]==" in setup, "every node must run the same Ray version"


def test_local_variant_stays_on_loopback() -> None:
    cfg = _load(LOCAL)
    assert cfg["provider"]["type"] == "local"
    assert cfg["provider"]["head_ip"] == "127.0.0.1"
    served = _serve_config(_serve_line(cfg["head_start_ray_commands"])[1])
    assert served.listen_host_port()[0] == "127.0.0.1"
    assert served.s3_endpoint.startswith("http://127.0.0.1:")
    assert all(e.startswith("http://127.0.0.1:") for e in served.etcd_endpoint_list())
    for command in _all_commands(cfg):
        assert "0.0.0.0" not in command, command
        if "ray start" in command:
            # Ray takes the external interface unless both of these are given.
            assert "--node-ip-address=127.0.0.1" in command, command
            assert "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0" in command, command
            assert "--dashboard-host=127.0.0.1" in command, command
        assert not re.search(r"(^|[\s;&|])ray stop\b", command), "ray stop ends every Ray process of the user"


# ---------------------------------------------------------------------------------------------------------------
# Ray's token authentication stays on


@pytest.mark.parametrize("path", [*RAY_CONFIGS, KUBERAY], ids=lambda p: p.name)
def test_nothing_disables_ray_token_auth(path: Path) -> None:
    for number, line in enumerate(path.read_text().splitlines(), 1):
        assert not _AUTH_DISABLED.search(line), f"{path.name}:{number}: {line.strip()}"


@pytest.mark.parametrize("path", RAY_CONFIGS, ids=lambda p: p.name)
def test_every_ray_process_and_driver_runs_in_token_mode(path: Path) -> None:
    cfg = _load(path)
    for command in cfg["head_start_ray_commands"] + cfg["worker_start_ray_commands"]:
        if "ray start" in command or _kafscale_args(command, "serve") is not None:
            assert "RAY_AUTH_MODE=token" in command, command
    assert any("get-auth-token --generate" in c for c in cfg["head_setup_commands"]), "the head needs a token"


def test_aws_workers_get_the_heads_token() -> None:
    cfg = _load(AWS)
    assert "~/.ray/auth_token" in cfg["cluster_synced_files"]


# ---------------------------------------------------------------------------------------------------------------
# KubeRay


def _kuberay() -> tuple[dict[str, Any], list[dict[str, Any]]]:
    docs = [d for d in yaml.safe_load_all(KUBERAY.read_text()) if d]
    clusters = [d for d in docs if d.get("kind") == "RayCluster"]
    assert len(clusters) == 1
    return clusters[0], docs


def _container_ports(template: dict[str, Any]) -> set[int]:
    return {p["containerPort"] for c in template["spec"]["containers"] for p in c.get("ports", [])}


def test_kuberay_manifest_starts_the_broker_on_the_head() -> None:
    cluster, _ = _kuberay()
    assert cluster["apiVersion"] == "ray.io/v1"
    assert cluster["spec"]["authOptions"]["mode"] == "token"
    assert cluster["spec"]["rayVersion"] == _ray_version_installed()
    head = cluster["spec"]["headGroupSpec"]["template"]
    (container,) = head["spec"]["containers"]
    hook = container["lifecycle"]["postStart"]["exec"]["command"]
    served = _serve_config(hook[-1])
    assert served.ray_address == "auto"
    assert served.detach
    assert served.listen_host_port() == ("0.0.0.0", 9092)
    assert served.s3_bucket and served.etcd_endpoint_list()
    stop = container["lifecycle"]["preStop"]["exec"]["command"][-1]
    assert _kafscale_args(stop, "cluster") == ["stop", "--ray-address", "auto"]
    slots = set(range(9092, 9092 + served.shards_per_node))
    assert slots <= _container_ports(head), "the head pod runs shards too"
    for group in cluster["spec"]["workerGroupSpecs"]:
        assert slots <= _container_ports(group["template"]), group["groupName"]
        for container in group["template"]["spec"]["containers"]:
            assert container["image"] == head["spec"]["containers"][0]["image"]


def test_kuberay_bootstrap_service_selects_the_clusters_pods() -> None:
    cluster, docs = _kuberay()
    services = [d for d in docs if d.get("kind") == "Service"]
    assert len(services) == 1
    spec = services[0]["spec"]
    assert spec["selector"] == {"ray.io/cluster": cluster["metadata"]["name"]}
    assert [p["port"] for p in spec["ports"]] == [9092]


def _ray_version_installed() -> str:
    import ray

    return ray.__version__


def test_configs_pin_the_installed_ray_version() -> None:
    """Nodes, laptop and image must run one Ray version; the files name the one this checkout is tested with."""
    version = _ray_version_installed()
    for path in RAY_CONFIGS:
        setup = " ".join(_all_commands(_load(path)))
        assert f"ray[default]=={version}" in setup, path.name
    assert f"rayproject/ray:{version}-" in (DEPLOY / "kuberay" / "Dockerfile").read_text()

