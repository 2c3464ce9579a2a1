"""Helpers every test tier shares (one copy of each, imported from here)."""
