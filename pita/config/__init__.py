"""Typed configuration (Hydra structured configs) and its validation."""
