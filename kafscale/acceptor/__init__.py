"""The acceptor: the Kafka-facing side of a shard. It accepts connections, parses requests and dispatches them
to one handler module per Kafka API, over the typed Broker interface."""

from kafscale.acceptor.listener import Listener
from kafscale.acceptor.router import Handler, RequestContext, Router

__all__ = ["Handler", "Listener", "RequestContext", "Router"]
