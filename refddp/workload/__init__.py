"""What is trained: built-in and user models, datasets and loaders, objectives (docs/layout.md)."""
