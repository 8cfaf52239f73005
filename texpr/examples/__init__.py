"""Example programs (the digits CNN)."""
