"""Data loaders that produce swap-dataset samples (see each module)."""
