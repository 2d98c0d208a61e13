"""What the checker computes with: symbolic dims (`dims`), element types and promotion
(`dtypes`) and abstract values (`values`)."""
