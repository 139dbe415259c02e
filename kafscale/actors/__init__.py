"""Ray actors: broker shards, partition owners, group coordinators, the controller and storage actors."""
