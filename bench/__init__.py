"""Benchmarks: they print JSON and a short table, and assert nothing about time."""
