"""Ray actors and process wiring: the controller, the shard actor, the metadata actor, serve, the local Ray head."""
