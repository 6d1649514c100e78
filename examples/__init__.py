"""Bring-your-own-code examples: a custom algorithm, model and dataset (see README.md here)."""
