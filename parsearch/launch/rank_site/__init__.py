"""The directory put first on a spawned rank's ``PYTHONPATH`` so that Python imports its
``sitecustomize`` (torch's error file for an uncaught exception, see that module)."""

from pathlib import Path

SITE_DIR = Path(__file__).resolve().parent
