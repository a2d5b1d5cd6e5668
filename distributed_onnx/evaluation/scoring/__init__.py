"""Metrics and baselines: mergeable sums over (window, lead) pairs, seasonal naive (pure numpy)."""
