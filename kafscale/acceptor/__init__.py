"""The Kafka-facing side of a shard: TCP listener, request routing, one module per API family."""

from kafscale.acceptor.listener import Listener
from kafscale.acceptor.router import Handler, RequestContext, Router

__all__ = ["Handler", "Listener", "RequestContext", "Router"]
