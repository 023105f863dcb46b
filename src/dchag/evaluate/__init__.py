"""Scoring forecasts and reconstructions: metrics, file handling, model evaluation."""
