"""Writes of the batches app: files, batches, and running their lines."""
