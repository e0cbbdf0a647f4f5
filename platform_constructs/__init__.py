"""Reusable L3 constructs of the training platform, one concern each."""
