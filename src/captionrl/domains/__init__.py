"""Data domains: time series and images (loading, validation, rendering, candidate sets)."""
