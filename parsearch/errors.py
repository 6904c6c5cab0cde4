"""One exception hierarchy, so the CLI can print any of them without a traceback.

Messages name the file, the field and what would have been valid: the user reading one
should be able to fix the input without opening our source.
"""

from __future__ import annotations


class ParsearchError(Exception):
    """Base of every error parsearch raises on purpose."""

    exit_code = 1


class SpaceError(ParsearchError):
    """A search-space file (or the objects built from it) is malformed or impossible."""

    exit_code = 2

    def __init__(self, message: str, *, source: str | None = None, field: str | None = None):
        self.source = source
        self.field = field
        where = ", ".join(part for part in (source, f"field '{field}'" if field else None) if part)
        super().__init__(f"{where}: {message}" if where else message)


class UsageError(ParsearchError):
    """A command-line option (or a setting stored from one) has a value that cannot work."""

    exit_code = 2


class LayoutError(ParsearchError):
    """A parallel layout breaks a divisibility rule for its model and allocation."""

    exit_code = 2


class StoreError(ParsearchError):
    """The results store cannot be opened, read or written."""


class StoreFullError(StoreError):
    """The store could not be written for want of space: a full filesystem, or a file size
    limit (``ulimit -f``). Everything committed before is intact; freeing space and
    ``parsearch resume`` continue the campaign."""


class StoreUnavailableError(StoreError):
    """The store could not be reached for now: a lost server connection, a file that stayed
    locked or failed with an I/O error past its busy timeout. Nothing of the failed
    statement was written, and trying again later may succeed: the campaign driver keeps its
    results and retries (:mod:`parsearch.campaign.outage`)."""


class CampaignLockedError(StoreError):
    """Another live driver holds the campaign's lease.

    Its own exit code (75, ``EX_TEMPFAIL``: try again later) lets a job script tell "a
    killed driver's lease has not gone stale yet" from a real failure.
    """

    exit_code = 75


class BackendError(ParsearchError):
    """A dispatch backend cannot start or lost its workers."""


class BackendOptionError(BackendError):
    """A ``--backend-opt`` (or ``--slots``) value the backend cannot use: bad input."""

    exit_code = 2


class TrainerError(ParsearchError):
    """A trainer was configured in a way that cannot run."""

    exit_code = 2


class TrackingError(ParsearchError):
    """A tracker cannot be set up: its package is missing or its target is unusable."""

    exit_code = 2
