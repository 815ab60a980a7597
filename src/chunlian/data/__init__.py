"""Corpus reading, cleaning and splitting."""
