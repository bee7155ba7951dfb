"""Helpers shared by the test files (imported as ``tests.helpers.<module>``)."""
