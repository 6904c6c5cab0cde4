"""The built-in benchmark trainer (a GPT-style model trained with torch's own TP, PP, DP).

Importing this package is light; torch is imported by the rank processes it starts.
"""
