"""The search: which layout to try next (strategies, the Bayesian optimiser, the calibrated
estimate, candidate pruning, warm starts). No store, backend or campaign loop here."""

# The strategies --strategy accepts (parsearch.search.strategy.STRATEGIES, by name); listed
# here so that the command line offers them without importing the optimiser.
STRATEGY_NAMES: tuple[str, ...] = ("default", "cbo-raw", "random")
