"""One module per Kafka API family; each registers its handler(s) on a Router."""
