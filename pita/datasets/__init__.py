"""Datasets: one registered adapter per dataset (pita/datasets/adapters.py) and the toy tasks."""
