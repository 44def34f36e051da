"""Guided decoding: value models, offsets, the guided sampler."""
