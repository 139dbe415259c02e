"""Consumer groups: the state machine, one coordinator per group, the registry of a shard's groups, offsets."""
