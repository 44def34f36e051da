"""Algorithms: each turns its config into jobs and implements the work of those jobs."""
