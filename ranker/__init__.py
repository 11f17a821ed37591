"""ranker package."""
