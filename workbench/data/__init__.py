"""Data: synthetic tasks and files of examples, answer rules, held-out splits, token windows."""
