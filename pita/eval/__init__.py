"""Evaluation: metrics over sampled completions (accuracy, majority vote, reward, KL)."""
