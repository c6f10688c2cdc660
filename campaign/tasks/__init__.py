"""Built-in tasks (real, small, no downloads): digits classification, arithmetic generation."""
