"""Fuzz: Hypothesis-driven scenarios (run), the mutation gallery, the regression corpus."""
