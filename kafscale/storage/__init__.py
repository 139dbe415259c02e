"""On-object-store formats and the two storage interfaces (ObjectStore, MetadataStore)."""
