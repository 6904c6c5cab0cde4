"""The command trainer: a user's training program started from a template filled with the
trial's layout, its metrics parsed from the log (see docs/guide/trainers.md, "Bringing your own
trainer")."""
