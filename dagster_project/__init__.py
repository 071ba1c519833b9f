"""Dagster pipeline that builds a token-exact DFlash drafter training set by self-distillation."""
