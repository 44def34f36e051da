"""Orchestration: devices, jobs, the job graph, scheduling, backends, run state, paths and logs.

Nothing in this package knows about algorithms, models or datasets; it is tested with
synthetic jobs alone.
"""
