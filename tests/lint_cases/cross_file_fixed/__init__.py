"""A package whose collective hides two calls away, in another module."""
