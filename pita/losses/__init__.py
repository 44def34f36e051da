"""Losses: value-model training losses (BCE, MSE, histogram MLE, Bradley–Terry) as pure functions."""
