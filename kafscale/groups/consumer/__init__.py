"""Consumer groups of KIP-848's protocol (ConsumerGroupHeartbeat): the broker assigns the partitions, and members
reconcile towards their target assignment one heartbeat at a time (docs/groups.md)."""
