"""Data generation sharded across devices: ParallelDataGenerator and the collection recipes."""
