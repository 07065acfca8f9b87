"""The checks around each collective, inside the ranks: recorded, compared across ranks, traced."""
