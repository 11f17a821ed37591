"""producer package."""
