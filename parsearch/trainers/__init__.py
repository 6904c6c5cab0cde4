"""Trainers other than the built-in benchmark: the command trainer and its log parsers.

:mod:`parsearch.trainers.command` runs a user's training program from a template filled with
the trial's layout; :mod:`parsearch.trainers.parsers` reads Megatron-LM, Megatron-DeepSpeed,
torchtitan, JSON or user-patterned logs; :mod:`parsearch.trainers.failures` recognises
out-of-memory failures. Importing this package starts nothing and imports no torch.
"""
