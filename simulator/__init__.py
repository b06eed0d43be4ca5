"""Predict the timeline of a schedule under a cost model."""
