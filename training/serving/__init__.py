"""Serving: the deployments, the base models and versions that can answer for them, and
which version is live. The lowest domain with tables: it imports no other app of the
project, and the traces (`feedback`) and the training, promotion and release code above it
point down at it."""
