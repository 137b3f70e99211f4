"""Goldens: the store under golden/, its codec, update review (churn) and unused goldens."""
