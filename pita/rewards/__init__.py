"""Rewards: answer verification for math, reward-model scoring, Bradley-Terry preference sampling."""
