"""What the cluster agrees on, in the metadata store: keys, topics and their configs, placement."""
