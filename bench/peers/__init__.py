"""Peer runners for bench/engine.py: each runs in its own subprocess."""
