"""Campaigns: the driver loop, its strategies, and the sessions that start and resume them.

``results(store_path, name=None)`` is the notebook entry point: a campaign's trials as a
pandas DataFrame, readable while the campaign runs.
"""

from parsearch.campaign.query import results

__all__ = ["results"]
