"""Results: collect evaluation results of a run into a table, CSV and JSON."""
