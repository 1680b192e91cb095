"""Shared asserts, fixtures and clients for the tests: no test module imports from another."""
