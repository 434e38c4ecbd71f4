"""Server-side strategies, one module per method; the maths they call lives in core/."""
