"""What a run saves and continues from, in each format, written atomically (docs/layout.md)."""
