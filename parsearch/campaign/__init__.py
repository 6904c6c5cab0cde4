"""The campaign loop: sessions that start and resume a campaign, the driver, its lease,
signals and progress. The search it drives lives in :mod:`parsearch.search`."""
