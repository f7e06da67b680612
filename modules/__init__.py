"""Host models, attention variants and task definitions."""
