"""The campaign loop: sessions that start and resume a campaign, the driver, its lease,
signals and progress. The search it drives lives in :mod:`parsearch.search`."""

# Trials a new campaign finishes unless told otherwise; here, not in the session module, so
# that the command line can say so without importing the loop.
DEFAULT_BUDGET = 50
