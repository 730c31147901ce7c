"""kvpool."""
