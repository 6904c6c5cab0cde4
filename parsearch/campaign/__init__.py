"""Campaigns: the driver loop, its strategies, and the sessions that start and resume them."""
