"""The search: which layout to try next (strategies, the Bayesian optimiser, the calibrated
estimate, candidate pruning, warm starts). No store, backend or campaign loop here."""
