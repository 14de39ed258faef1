"""Model families, one file each, and the registry that picks one by architecture name."""
