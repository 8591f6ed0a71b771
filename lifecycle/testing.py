"""Leak assertions and a pytest plugin for users' test suites (being written)."""
