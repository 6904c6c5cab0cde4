"""Launching a trial's ranks: start (spawn or fork), watch, time out and kill processes, and
read what they left behind. Knows no trainer kind, backend, campaign or store."""
